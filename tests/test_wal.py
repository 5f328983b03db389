"""The partition WAL on real files: append, read, roll, group commit, recovery from torn tails."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from headwater.storage.segments import (
    INDEX_ENTRY,
    IndexEntry,
    SparseIndex,
    read_index,
    scan_segment,
    segment_name,
)
from headwater.storage.wal import FsyncPolicy, LogConfig, PartitionLog
from headwater.wire.records import build_batch, read_records


def batch(*values: bytes) -> bytes:
    return build_batch([(None, v, []) for v in values])


async def read_all(log: PartitionLog, start: int = 0) -> list[tuple[int, bytes | None]]:
    out: list[tuple[int, bytes | None]] = []
    offset = start
    while offset < log.next_offset:
        batches = await log.read(offset)
        if not batches:  # a gap up to the end (offsets skipped after a recovery cut)
            break
        for data in batches:
            for record in read_records(data):
                if record.offset >= offset:
                    out.append((record.offset, record.value))
            offset = read_records(data)[-1].offset + 1
    return out


async def test_append_read_and_reopen_continue_offsets(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, LogConfig(fsync=FsyncPolicy.ALWAYS))
    log.start()
    base, seq = log.append(batch(b"a", b"b"), 2)
    await log.wait_durable(seq)
    assert base == 0
    assert log.append(batch(b"c"), 1)[0] == 2
    assert await read_all(log) == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert await read_all(log, 1) == [(1, b"b"), (2, b"c")]
    await log.close()
    reopened = PartitionLog.open(tmp_path, LogConfig())
    assert reopened.next_offset == 3
    assert reopened.append(batch(b"d"), 1)[0] == 3
    assert await read_all(reopened) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
    await reopened.close()


async def test_rolling_by_size_seals_segments_with_indexes(tmp_path: Path) -> None:
    sealed = []
    log = PartitionLog.open(tmp_path, LogConfig(segment_bytes=2000), on_sealed=sealed.append)
    log.start()
    for i in range(100):
        log.append(batch(b"x" * 100, str(i).encode()), 2)
    await log.close()
    segments = sorted(p.name for p in tmp_path.glob("*.log"))
    assert len(segments) > 5
    assert len(sealed) == len(segments) - 1
    assert all((tmp_path / s).with_suffix(".index").exists() for s in segments[:-1])
    assert [s.base_offset for s in sealed] == [int(s[:20]) for s in segments[:-1]]
    reopened = PartitionLog.open(tmp_path, LogConfig(segment_bytes=2000))
    records = await read_all(reopened)
    assert [o for o, _ in records] == list(range(200))
    assert await read_all(reopened, 151) == records[151:]
    await reopened.close()


async def test_close_with_seal_active_seals_everything(tmp_path: Path) -> None:
    sealed = []
    log = PartitionLog.open(tmp_path, LogConfig(), on_sealed=sealed.append)
    log.start()
    log.append(batch(b"a"), 1)
    await log.close(seal_active=True)
    assert [(s.base_offset, s.next_offset) for s in sealed] == [(0, 1)]


async def test_group_commit_one_fsync_for_concurrent_appends(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, LogConfig(fsync=FsyncPolicy.ALWAYS))
    log.start()
    sequences = [log.append(batch(str(i).encode()), 1)[1] for i in range(50)]
    await asyncio.wait_for(asyncio.gather(*(log.wait_durable(s) for s in sequences)), 10)
    assert log.syncer.durable_sequence >= 50
    await log.close()


@pytest.mark.parametrize("damage", ["truncate", "corrupt", "garbage"])
async def test_torn_or_corrupt_tail_is_cut_at_the_last_good_batch(
    tmp_path: Path, damage: str
) -> None:
    """The damaged last batch is cut (and copied to quarantine), but its offset was handed out
    before the clean close, so appends continue above it: offset 9 is never given twice."""
    log = PartitionLog.open(tmp_path, LogConfig())
    log.start()
    for i in range(10):
        log.append(batch(f"v{i}".encode()), 1)
    await log.close()
    path = tmp_path / segment_name(0)
    data = bytearray(path.read_bytes())
    good_size = len(data) if damage == "garbage" else len(data) - len(batch(b"v9"))
    if damage == "truncate":
        data = data[:-5]
    elif damage == "corrupt":
        data[-3] ^= 0xFF
    else:
        data += os.urandom(40)
    path.write_bytes(bytes(data))
    reopened = PartitionLog.open(tmp_path, LogConfig())
    kept = 10 if damage == "garbage" else 9
    assert reopened.next_offset == 10
    assert [v for _, v in await read_all(reopened)] == [f"v{i}".encode() for i in range(kept)]
    assert path.stat().st_size == good_size
    assert len(list((tmp_path / "quarantine").iterdir())) == 1
    reopened.start()
    assert reopened.append(batch(b"next"), 1)[0] == 10
    assert [o for o, _ in await read_all(reopened)] == [*range(kept), 10]
    await reopened.close()
    assert scan_segment(path).problem is None


async def test_a_linked_last_segment_gets_its_own_file_before_recovery_cuts_or_extends_it(
    tmp_path: Path,
) -> None:
    """A local object store on the same file system stores a sealed segment as a hard link. If
    that segment is the last one after a crash, recovery cuts its tail and appends go on in it:
    on the shared file, the object would change with it."""
    directory = tmp_path / "wal"
    log = PartitionLog.open(directory, LogConfig(fsync=FsyncPolicy.ALWAYS))
    log.start()
    await log.wait_durable(log.append(batch(b"a", b"b"), 2)[1])
    await log.close()
    segment = directory / segment_name(0)
    with segment.open("ab") as file:
        file.write(b"\x00\x00\x00\x01torn")  # a write the crash tore
    stored = tmp_path / "objects" / "00000000000000000000.log"
    stored.parent.mkdir()
    os.link(segment, stored)
    object_bytes = stored.read_bytes()
    reopened = PartitionLog.open(directory, LogConfig(fsync=FsyncPolicy.ALWAYS))
    reopened.start()
    await reopened.wait_durable(reopened.append(batch(b"c"), 1)[1])
    assert await read_all(reopened) == [(0, b"a"), (1, b"b"), (2, b"c")]
    await reopened.close()
    assert stored.read_bytes() == object_bytes
    assert stored.stat().st_nlink == 1 and segment.stat().st_ino != stored.stat().st_ino


async def test_timestamp_lookup(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, LogConfig())
    for i in range(5):
        log.append(build_batch([(None, b"x", [])], timestamp=1000 * (i + 1)), 1)
    assert await log.offset_for_timestamp(2500) == 2
    assert await log.offset_for_timestamp(0) == 0
    assert await log.offset_for_timestamp(10**12) == 5
    await log.close()


async def test_retention_deletes_only_sealed_segments(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, LogConfig(segment_bytes=500))
    log.start()
    for _i in range(20):
        log.append(batch(b"y" * 100), 1)
    await log.close()
    log = PartitionLog.open(tmp_path, LogConfig(segment_bytes=500))
    sealed = log.sealed_segments()
    assert sealed
    assert log.delete_segment(sealed[0].base_offset)
    assert not log.delete_segment(log.next_offset)  # the active segment stays
    assert log.start_offset == sealed[0].next_offset
    assert await log.read(0) == []
    await log.close()


@pytest.mark.parametrize("policy", list(FsyncPolicy))
async def test_close_returns_under_every_policy(tmp_path: Path, policy: FsyncPolicy) -> None:
    log = PartitionLog.open(tmp_path, LogConfig(fsync=policy))
    log.start()
    log.append(batch(b"a"), 1)
    await asyncio.wait_for(log.close(), 5)  # a topic deleted without sealing its segment


def test_the_sparse_index_keeps_the_file_format_and_finds_where_a_read_starts(
    tmp_path: Path,
) -> None:
    """Three int64 arrays in memory, the same big-endian triples on disk as IndexEntry packing
    wrote (indexes written before the arrays still read); a read of an offset starts at the last
    entry at or below it."""
    entries = [IndexEntry(10 + 7 * k, 4096 * k + k, 1_790_000_000_000 + k) for k in range(1000)]
    index = SparseIndex(entries)
    assert len(index) == 1000 and list(index) == entries and index[-1] == entries[-1]
    on_disk = b"".join(INDEX_ENTRY.pack(e.offset, e.position, e.max_timestamp) for e in entries)
    assert index.encode() == on_disk
    assert list(SparseIndex.decode(on_disk)) == entries
    for offset in (0, 9, 10, 11, 16, 17, 500, 10 + 7 * 999, 10**12):
        below = [e for e in entries if e.offset <= offset]
        assert index.start_of(offset) == (below[-1].position if below else 0)
    assert SparseIndex().start_of(5) == 0 and SparseIndex().encode() == b""
    with pytest.raises(ValueError, match="not whole index entries"):
        SparseIndex.decode(on_disk[:-1])
    # a file that does not fit its log is rebuilt rather than trusted
    path = tmp_path / "x.index"
    path.write_bytes(on_disk)
    assert list(read_index(path, log_size=4096 * 1000) or []) == entries
    assert read_index(path, log_size=4096 * 998) is None  # positions past the log's end
    path.write_bytes(on_disk[24:48] + on_disk[:24])
    assert read_index(path, log_size=4096 * 1000) is None  # offsets not rising
    path.write_bytes(on_disk[:-5])
    assert read_index(path, log_size=4096 * 1000) is None
