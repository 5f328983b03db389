"""The per-broker tail's committer and etcd index on their own (`cluster.tail_layout = "broker"`):
a real etcd, a local object store, no broker.

- one window holds two partitions; the claim of one of them was taken by another owner before
  the window's transaction: that partition's producer gets NOT_OWNER and nothing is named for it,
  the other's is answered and named, both in the one object;
- a take-over's new token fences a window of the previous token whose object is stored but not
  named yet;
- the shared objects' collection deletes only objects old enough that no entry named in two passes;
- a slice read in place keeps its position in the uploads' record.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aetcd
import pytest

import headwater
from headwater.server.cluster import shared_tail
from headwater.server.cluster.layout import Layout
from headwater.server.cluster.shared_commit import SharedCommitter
from headwater.server.cluster.shared_tail import SharedTail
from headwater.server.topics.topic import stamped_batch
from headwater.storage.objectstore import LocalObjectStore
from headwater.storage.uploader import UploadedSegment
from headwater.wire.records import build_batch
from tests.support.etcd_support import EtcdServer

LAYOUT = Layout("/t")


@dataclass
class Rig:
    etcd: aetcd.Client
    store: LocalObjectStore
    tail: SharedTail
    committer: SharedCommitter
    epochs: dict[tuple[str, int], int]


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    server = EtcdServer(tmp_path / "etcd").start()
    try:
        async with aetcd.Client(host="127.0.0.1", port=server.client_port) as etcd:

            async def call(operation: Any) -> Any:
                return await operation(etcd)

            epochs: dict[tuple[str, int], int] = {}
            for partition in (0, 1):
                key = LAYOUT.owner("t", partition)
                await etcd.put(key, b"b1")
                epochs["t", partition] = (await etcd.get(key)).create_revision
            store = LocalObjectStore(tmp_path / "objects")
            tail = SharedTail(store, call, LAYOUT)
            committer = SharedCommitter(
                tail,
                "b1",
                0.005,
                lambda topic, partition: epochs.get((topic, partition)),
                lambda topic, partition: headwater.NotOwner(f"{topic}/{partition}"),
            )
            for partition in (0, 1):
                await tail.prepare("t", partition, epochs["t", partition])
            yield Rig(etcd, store, tail, committer, epochs)
            await committer.close()
    finally:
        server.kill()


def batch(base: int, value: bytes) -> bytes:
    return stamped_batch(build_batch([(None, value, ())]), base)


async def test_a_window_names_the_partitions_still_claimed_and_fails_the_others(rig: Rig) -> None:
    # another owner took partition 1's claim (its take-over wrote its token)
    await rig.etcd.put(LAYOUT.tail_claim("t", 1), b"999-theirs")
    stored = batch(0, b"a")
    kept = rig.committer.add("t", 0, 0, stored, 1)
    moved = rig.committer.add("t", 1, 0, batch(0, b"b"), 1)
    await asyncio.wait_for(kept, 10)
    with pytest.raises(headwater.NotOwner):
        await asyncio.wait_for(moved, 10)
    named = await rig.tail.state("t", 0)
    assert [(c.first, c.end) for c in named.chunks] == [(0, 1)]
    assert await rig.tail.read("t", 0, named.chunks[0]) == [stored]
    assert (await rig.tail.state("t", 1)).chunks == []
    assert rig.committer.chunks == 1  # one object for the window, both slices in it
    objects = await rig.store.list("shared/")
    assert len(objects) == 1 and objects[0].size == 2 * len(stored)


async def test_a_new_token_fences_a_stored_window_not_named_yet(rig: Rig) -> None:
    """The window's PUT completes, then a take-over (same epoch, after a loss: only the token
    differs) writes its token before the window's transaction: nothing is named."""
    stored = asyncio.Event()
    go = asyncio.Event()
    put = rig.store.put

    async def held_put(key: str, data: bytes) -> None:
        await put(key, data)
        stored.set()
        await go.wait()

    rig.store.put = held_put  # type: ignore[method-assign]
    answer = rig.committer.add("t", 0, 0, batch(0, b"a"), 1)
    await asyncio.wait_for(stored.wait(), 10)
    await rig.tail.prepare("t", 0, rig.epochs["t", 0])
    go.set()
    with pytest.raises(headwater.NotOwner):
        await asyncio.wait_for(answer, 10)
    assert (await rig.tail.state("t", 0)).chunks == []


async def test_shared_objects_go_only_when_old_and_unnamed_twice(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    await asyncio.wait_for(rig.committer.add("t", 0, 0, batch(0, b"a"), 1), 10)
    named = (await rig.store.list("shared/"))[0].key
    orphan = shared_tail.shared_name("b1", 99)
    await rig.store.put(orphan, b"slices nobody named")
    assert await rig.tail.collect_objects() == 0  # both younger than RETIRE_AFTER
    monkeypatch.setattr(shared_tail, "RETIRE_AFTER", -1.0)
    assert await rig.tail.collect_objects() == 0  # unnamed once: kept for one more pass
    assert await rig.tail.collect_objects() == 1
    assert [o.key for o in await rig.store.list("shared/")] == [named]


def test_a_slice_read_in_place_keeps_its_position_in_the_uploads_record() -> None:
    """A take-over records the slices it reads in place (`Uploader.replace`, persisted): the
    record must keep where the slice starts in its shared object, and old records still read."""
    piece = UploadedSegment(5, 9, 120, "shared/b1/x", 6, indexed=False, position=4096)
    assert UploadedSegment.decode(6, piece.encode()) == piece
    whole = UploadedSegment(5, 9, 120, "orders/0/tail/y", 6, indexed=False)
    assert whole.encode() == b"9,120,5,0,orders/0/tail/y"  # as before slices
    assert UploadedSegment.decode(6, whole.encode()) == whole
