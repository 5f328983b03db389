"""The cloud tail's rules (storage.cloud_tail): which chunks count after changes of owner, where a
new owner's log starts, and which chunks an uploaded segment lets go. Real files: the local object
store backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from headwater.storage.cloud_tail import Chunk, CloudTail, TailState, split_batches
from headwater.storage.objectstore import LocalObjectStore
from headwater.wire.records import build_batch, inspect_batch, stamp_base_offset


def test_a_late_chunk_of_a_fenced_owner_does_not_count() -> None:
    # epoch 5 wrote up to 30; epoch 9 took over at 30; epoch 5's PUT of [30, 34) landed after
    state = TailState(
        chunks=[Chunk(10, 20, 5), Chunk(20, 30, 5), Chunk(30, 34, 5), Chunk(30, 32, 9)],
        markers={5: 10, 9: 30},
    )
    end, run = state.resolve()
    assert end == 32
    assert run == [Chunk(10, 20, 5), Chunk(20, 30, 5), Chunk(30, 32, 9)]


def test_a_new_owner_with_nothing_written_yet_ends_at_its_marker() -> None:
    state = TailState(chunks=[Chunk(0, 7, 3)], markers={3: 0, 8: 7})
    assert state.resolve() == (7, [Chunk(0, 7, 3)])
    assert TailState([], {}).resolve() == (0, [])


def test_the_run_starts_after_the_last_gap() -> None:
    # [10, 20) was collected (an uploaded segment holds it): below 20 is in segments
    state = TailState(chunks=[Chunk(0, 10, 1), Chunk(20, 25, 1), Chunk(25, 30, 1)], markers={1: 0})
    end, run = state.resolve()
    assert (end, [c.first for c in run]) == (30, [20, 25])


def test_chunks_below_the_manifests_segments_are_not_in_the_run() -> None:
    # segments named up to 25; [20, 30) straddles their end: the new log starts at 20
    state = TailState(chunks=[Chunk(0, 10, 1), Chunk(10, 20, 1), Chunk(20, 30, 1)], markers={1: 0})
    end, run = state.resolve(25)
    assert (end, run) == (30, [Chunk(20, 30, 1)])
    # everything collected but the newest chunk, which ends where the segments end
    assert TailState([Chunk(20, 30, 1)], {1: 0}).resolve(30) == (30, [])
    # a chunk missing above the segments' end: the run starts past the gap (a loss, logged)
    assert TailState([Chunk(40, 50, 1)], {1: 0}).resolve(30) == (50, [Chunk(40, 50, 1)])


def test_a_chunk_outside_its_epoch_is_ignored() -> None:
    # written before its own marker (impossible for a correct owner): never trusted
    state = TailState(chunks=[Chunk(0, 5, 2), Chunk(5, 9, 4)], markers={2: 0, 4: 9})
    assert state.resolve() == (9, [Chunk(0, 5, 2)])


def batches_from(first: int, count: int) -> bytes:
    data = b""
    for offset in range(first, first + count):
        batch = bytearray(build_batch([(None, f"v{offset}".encode(), ())]))
        stamp_base_offset(batch, offset)
        data += bytes(batch)
    return data


def test_split_batches_gives_each_batch_and_refuses_a_cut_chunk() -> None:
    data = batches_from(4, 3)
    batches = split_batches(data)
    assert [inspect_batch(b).base_offset for b in batches] == [4, 5, 6]
    with pytest.raises(ValueError):
        split_batches(data[:-1])


async def test_markers_chunks_and_collection_in_an_object_store(tmp_path: Path) -> None:
    tail = CloudTail(LocalObjectStore(tmp_path / "objects"))
    await tail.mark_epoch("t", 0, 7, 0)
    await tail.mark_epoch("t", 0, 7, 0)  # the same take-over again: the same start
    with pytest.raises(ValueError):
        await tail.mark_epoch("t", 0, 7, 3)  # a marker never moves
    for first in (0, 2, 4):
        await tail.put("t", 0, Chunk(first, first + 2, 7), batches_from(first, 2))
    state = await tail.state("t", 0)
    assert state.markers == {7: 0}
    assert state.resolve()[0] == 6
    assert [inspect_batch(b).base_offset for b in await tail.read("t", 0, Chunk(2, 4, 7))] == [2, 3]
    # a manifest names segments up to 6: every chunk below goes, except the newest
    assert await tail.collect("t", 0, 6) == 2
    state = await tail.state("t", 0)
    assert state.chunks == [Chunk(4, 6, 7)]
    assert state.resolve() == (6, [Chunk(4, 6, 7)])


def _stamped(offset: int, value: bytes) -> bytes:
    batch = bytearray(build_batch([(None, value, [])]))
    stamp_base_offset(batch, offset)
    return bytes(batch)
