"""Attacks on the cluster's data path at the object store, on real files (the local object store
backend): a chunk failing across a loss of its partition, a segment uploaded as its partition
moved (the manifest refuses to name it), and the purge of a deleted topic racing its
re-creation. The same attacks on real processes are in tests/test_cluster_attack.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import headwater
from headwater.server.cluster.coordinator_state import Standing
from headwater.server.cluster.tail_commit import TailCommitter
from headwater.storage.cloud_tail import Chunk, CloudTail
from headwater.storage.objectstore import LocalObjectStore
from headwater.storage.partition_manifest import ManifestFenced, PartitionManifests, SegmentEntry
from headwater.wire.records import build_batch, stamp_base_offset


def stamped(values: list[bytes], base: int) -> bytes:
    batch = bytearray(build_batch([(None, v, ()) for v in values]))
    stamp_base_offset(batch, base)
    return bytes(batch)


async def test_a_chunk_failing_when_its_partition_was_lost_is_not_stored_after_a_reacquire(
    tmp_path: Path,
) -> None:
    """An etcd outage fences the owner while its chunk's PUT is being retried; etcd comes back
    with the lease alive and the partition is served again (same epoch), its log rebuilt, and a
    new batch takes the same offset. The old chunk (its producer was answered NOT_OWNER) must not
    land after that: it would give the new, acknowledged batch's offsets to other messages."""
    store = LocalObjectStore(tmp_path / "store")
    tail = CloudTail(store)
    committer = TailCommitter(
        tail,
        0.001,
        lambda topic, partition: Standing.HELD,
        lambda topic, partition: 7,
        lambda topic, partition: headwater.NotOwner("owner=none"),
    )
    await tail.mark_epoch("t", 0, 7, 0)
    # the first chunk's PUT fails while a directory sits where its object goes
    blocker = tmp_path / "store" / Chunk(0, 1, 7).name("t", 0)
    blocker.mkdir(parents=True)
    old = committer.add("t", 0, 0, stamped([b"old"], 0), 1)
    deadline = time.monotonic() + 10
    while committer.failures == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert committer.failures > 0
    committer.reset("t", 0)  # fenced
    # etcd back within the PUT's retry delay, the lease alive: served again, the log rebuilt at
    # 0 (a take-over waits for the partition's PUT in flight first)
    await asyncio.wait_for(committer.settle("t", 0), 10)
    with pytest.raises(headwater.NotOwner):
        await old
    new = committer.add("t", 0, 0, stamped([b"new-1", b"new-2"], 0), 2)
    blocker.rmdir()
    await asyncio.wait_for(new, 10)
    await asyncio.wait_for(committer.settle("t", 0), 10)
    end, run = (await tail.state("t", 0)).resolve()
    assert end == 2
    assert run == [Chunk(0, 2, 7)]
    assert not (tmp_path / "store" / Chunk(0, 1, 7).name("t", 0)).exists()


async def test_a_segment_uploaded_as_its_partition_moved_is_not_named_nor_collected(
    tmp_path: Path,
) -> None:
    """Epoch 5 owned the partition up to 100; its upload of the segment [0, 100) ended after
    epoch 9 had claimed the manifest and stored (and acknowledged) [100, 105) and [105, 108).
    Epoch 5 may not name the segment (the claim fenced it), so it deletes no chunk: epoch 9
    listed the tail after its claim and reads [0, 100) from chunks epoch 5 must leave alone."""
    store = LocalObjectStore(tmp_path / "store")
    tail, manifests = CloudTail(store), PartitionManifests(store)
    old = await manifests.claim("t", 0, 5)
    await tail.mark_epoch("t", 0, 5, 0)
    for first, end, epoch in ((0, 50, 5), (50, 100, 5)):
        await tail.put("t", 0, Chunk(first, end, epoch), stamped([b"a"] * (end - first), first))
    claimed = await manifests.claim("t", 0, 9)
    await tail.mark_epoch("t", 0, 9, 100)
    for first, end in ((100, 105), (105, 108)):
        await tail.put("t", 0, Chunk(first, end, 9), stamped([b"b"] * (end - first), first))
    with pytest.raises(ManifestFenced):
        await manifests.add("t", 0, 5, SegmentEntry(0, 100, 0, "t/0/seg-5", 1000), old)
    end, run = (await tail.state("t", 0)).resolve(claimed.end)
    assert end == 108
    assert [c.first for c in run] == [0, 50, 100, 105]
    assert (await manifests.latest("t", 0)).segments == ()


async def test_the_purge_of_a_deleted_topic_spares_a_recreated_ones_tail(tmp_path: Path) -> None:
    """The deleting broker purges the tail after the delete; a topic re-created under the name
    meanwhile (epochs above the delete's revision) has already written its marker and chunks
    under the same prefix, and must keep them."""
    tail = CloudTail(LocalObjectStore(tmp_path / "store"))
    await tail.mark_epoch("t", 0, 5, 0)
    await tail.put("t", 0, Chunk(0, 3, 5), stamped([b"old"] * 3, 0))
    await tail.put("t", 0, Chunk(3, 4, 5), stamped([b"old"], 3))
    await tail.mark_epoch("t", 0, 21, 0)  # re-created: the delete happened at revision 17
    await tail.put("t", 0, Chunk(0, 2, 21), stamped([b"new"] * 2, 0))
    assert await tail.purge("t", 17) == 3
    state = await tail.state("t", 0)
    assert state.markers == {21: 0}
    assert state.resolve() == (2, [Chunk(0, 2, 21)])
    assert (await tail.state("t", 0)).since(21).resolve() == (2, [Chunk(0, 2, 21)])
