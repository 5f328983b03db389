"""The per-partition tail committer over a real `CloudTail` (local object store), its owner's
standing flipped by hand as the coordinator flips it: a lease renewal confirmed after its deadline
(LAPSED, then HELD again, no loss) must not leave a hole in the partition's tail, and a lapse that
ends in a fence must not acknowledge what the new owner may not count."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import headwater
from headwater.server.cluster.coordinator_state import Standing
from headwater.server.cluster.tail_commit import TailCommitter
from headwater.storage.cloud_tail import Chunk, CloudTail
from headwater.storage.objectstore import LocalObjectStore
from headwater.wire.records import build_batch, stamp_base_offset

EPOCH = 7


def stamped(value: bytes, base: int) -> bytes:
    batch = bytearray(build_batch([(None, value, ())]))
    stamp_base_offset(batch, base)
    return bytes(batch)


class Owner:
    """The coordinator's answers for partition t/0, set by the test."""

    def __init__(self) -> None:
        self.standing = Standing.HELD

    def standing_of(self, topic: str, partition: int) -> Standing:
        return self.standing


async def stored(tail: CloudTail, count: int) -> list[Chunk]:
    """The partition's chunks once `count` are in the store (the PUT ends before the answer,
    which the test holds back: nothing to await but the store itself)."""
    for _ in range(500):
        chunks = (await tail.state("t", 0)).chunks
        if len(chunks) >= count:
            return sorted(chunks)
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} chunks not stored in 5 s")


def committer_for(tail: CloudTail, owner: Owner) -> TailCommitter:
    return TailCommitter(
        tail,
        0.001,
        owner.standing_of,
        lambda topic, partition: EPOCH,
        lambda topic, partition: headwater.NotOwner("owner=none"),
    )


async def test_a_late_lease_renewal_leaves_no_hole_in_the_tail(tmp_path: Path) -> None:
    """Chunk [1, 2) is due while the lease's deadline has passed (the renewal is late, nothing is
    lost); the renewal arrives, then [2, 3) is added. All three are acknowledged, and the tail
    resolves to one contiguous run: a take-over reads every acknowledged offset."""
    tail = CloudTail(LocalObjectStore(tmp_path / "store"))
    owner = Owner()
    committer = committer_for(tail, owner)
    await tail.mark_epoch("t", 0, EPOCH, 0)
    await asyncio.wait_for(committer.add("t", 0, 0, stamped(b"a", 0), 1), 10)
    owner.standing = Standing.LAPSED
    during = committer.add("t", 0, 1, stamped(b"b", 1), 1)
    await stored(tail, 2)
    assert not during.done(), "acknowledged while the lease was not confirmed"
    owner.standing = Standing.HELD  # the renewal, confirmed late
    await asyncio.wait_for(during, 10)
    await asyncio.wait_for(committer.add("t", 0, 2, stamped(b"c", 2), 1), 10)
    end, run = (await tail.state("t", 0)).resolve()
    assert end == 3
    assert [(c.first, c.end) for c in run] == [(0, 1), (1, 2), (2, 3)]


async def test_a_lapse_that_ends_in_a_fence_answers_not_owner(tmp_path: Path) -> None:
    """The watchdog fences (the partition is lost: `reset`) while a stored chunk's answer waits
    on the lapse: its producer hears NOT_OWNER and retries at the new owner."""
    tail = CloudTail(LocalObjectStore(tmp_path / "store"))
    owner = Owner()
    committer = committer_for(tail, owner)
    await tail.mark_epoch("t", 0, EPOCH, 0)
    owner.standing = Standing.LAPSED
    waiting = committer.add("t", 0, 0, stamped(b"a", 0), 1)
    assert await stored(tail, 1) == [Chunk(0, 1, EPOCH)]
    assert not waiting.done()
    owner.standing = Standing.GONE
    committer.reset("t", 0)
    with pytest.raises(headwater.NotOwner):
        await asyncio.wait_for(waiting, 10)
