"""Recovery of a partition's WAL directory on open: what is on disk, and where offsets continue.

Every segment is found by name. A sealed segment (any but the last) with a valid `.index` is
trusted as is (its batches are checked when read); one whose index is missing or damaged is
scanned and the index rebuilt. The last segment is always scanned. A scan (`segments.scan_segment`)
keeps every valid batch and reports holes (bad bytes followed by good batches) and a bad tail.

- Holes are corruption: the bytes are copied to `<partition dir>/quarantine/` and left in place
  (readers resynchronise past them); nothing after them is dropped.
- A bad tail of the last segment is copied to quarantine too, then cut off: the log must end on a
  whole batch before anything is appended after it. A sealed segment is never cut. The last
  segment gets a file of its own first if it has other links (a local object store's, which
  must not change with it).

Where offsets continue is decided with the offset lease (`storage.offsets`): never below the end of
the good data, and, after any stop but a clean close, at or above the lease, which is above every
offset ever handed out (see `next_offset_after`).
When that is above the end of the data, the old active segment is sealed and a new one starts at
the new offset: the gap stays visible in the segment names, and no offset is given twice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import structlog

from headwater.storage.fileio import FileOps, copy_durably
from headwater.storage.logstate import Segment
from headwater.storage.offsets import MAX_LEASE_BLOCK, Lease, read_lease
from headwater.storage.reader import read_range
from headwater.storage.segments import (
    INDEX_INTERVAL_BYTES,
    INDEX_SUFFIX,
    BatchLocation,
    Damage,
    SegmentScan,
    SparseIndex,
    build_index,
    parse_segment_name,
    read_index,
    scan_segment,
    segment_name,
    write_index,
)

log = structlog.get_logger(__name__)

QUARANTINE_DIR: Final = "quarantine"


@dataclass(slots=True)
class Recovered:
    segments: list[Segment]
    next_offset: int  # where appends continue
    data_end: int  # the offset after the last good batch found on disk
    recovered: list[BatchLocation] = field(default_factory=list)  # the last segment's batches
    quarantined: list[Damage] = field(default_factory=list)
    cut_bytes: int = 0


def quarantine(directory: Path, damage: Damage) -> bool:
    """Copy a damaged range aside (once); returns whether this call made the copy."""
    target_dir = directory / QUARANTINE_DIR
    target = target_dir / f"{damage.path.name}.{damage.position}-{damage.length}.bad"
    if target.exists():
        return False
    try:
        target_dir.mkdir(exist_ok=True)
        data = read_range(damage.path, damage.position, damage.length)
        temporary = target.with_name(f".{target.name}.tmp")
        temporary.write_bytes(data)
        os.replace(temporary, target)
    except OSError as exc:
        log.error("wal.quarantine_failed", file=str(damage.path), error=str(exc))
        return False
    log.error(
        "wal.quarantined",
        file=str(damage.path),
        position=damage.position,
        length=damage.length,
        reason=damage.reason,
        copy=str(target),
    )
    return True


def recover(directory: Path, ops: FileOps, start_offset: int) -> Recovered:
    directory.mkdir(parents=True, exist_ok=True)
    found = sorted(
        (base, directory / name)
        for name in os.listdir(directory)
        if (base := parse_segment_name(name)) is not None
    )
    segments: list[Segment] = []
    quarantined: list[Damage] = []
    last_scan: SegmentScan | None = None
    cut = 0
    for position, (base, path) in enumerate(found):
        size = path.stat().st_size
        if position < len(found) - 1:
            next_base = found[position + 1][0]
            index = read_index(path.with_suffix(INDEX_SUFFIX), size)
            if index is None:
                scan = scan_segment(path, base)
                quarantined.extend(_quarantine_all(directory, scan, include_tail=True))
                index = build_index(scan.batches)
                _write_index_or_warn(path.with_suffix(INDEX_SUFFIX), index)
                log.warning("wal.index_rebuilt", segment=str(path), entries=len(index))
            segments.append(Segment(base, path, next_base, size, index, 0.0, sealed=True))
            continue
        _unshare(ops, directory, path)
        last_scan = scan_segment(path, base)
        quarantined.extend(_quarantine_all(directory, last_scan, include_tail=True))
        if last_scan.tail is not None:
            cut = last_scan.tail.length
            _cut(ops, path, last_scan.tail.position)
            log.warning(
                "wal.tail_cut",
                segment=str(path),
                position=last_scan.tail.position,
                dropped_bytes=cut,
                reason=last_scan.tail.reason,
                torn=last_scan.torn,
            )
        segments.append(_active_from_scan(base, path, last_scan))
    if not segments:
        path = directory / segment_name(start_offset)
        path.touch()
        ops.fsync_directory(directory)
        segments.append(
            Segment(start_offset, path, start_offset, 0, SparseIndex(), 0.0, sealed=False)
        )
    data_end = segments[-1].next_offset
    next_offset = next_offset_after(data_end, read_lease(directory), last_scan)
    if next_offset > data_end:
        log.warning(
            "wal.offsets_skipped",
            directory=str(directory),
            data_end=data_end,
            next_offset=next_offset,
            reason="offsets up to the lease may have been handed out before the restart",
        )
        _start_new_segment(directory, ops, segments, next_offset)
    recovered = last_scan.batches if last_scan is not None else []
    return Recovered(segments, next_offset, data_end, recovered, quarantined, cut)


def next_offset_after(data_end: int, lease: Lease | None, scan: SegmentScan | None) -> int:
    """Where appends continue after a restart; never an offset someone may have seen.

    - a clean close wrote the exact next offset: continue there (above data lost since, if any);
    - any other stop (kill -9 on the same boot, a power cut, an OS crash): continue at the lease.
      It is written before an offset is handed out, so it is above every offset that ever was,
      whatever the tail looks like now. Reading the tail to tell "never handed out" from "handed
      out, then damaged" is what failed before: a tail cut below a whole batch header leaves no
      claimed end, and recovery gave acknowledged offsets again. A torn batch's claimed end is
      below the lease (the lease covered it before its write began), so the lease covers it too.
    - no lease (a log from before leases): after the data, or what a torn header claims.
    """
    tail = scan.tail if scan is not None else None
    claims = scan.tail_claims if scan is not None else None
    if lease is None:
        if tail is not None and claims is not None:
            return max(data_end, min(claims, data_end + MAX_LEASE_BLOCK))
        return data_end
    return max(data_end, lease.reserved)


def _quarantine_all(directory: Path, scan: SegmentScan, include_tail: bool) -> list[Damage]:
    damage = list(scan.holes)
    if include_tail and scan.tail is not None:
        damage.append(scan.tail)
    for each in damage:
        quarantine(directory, each)
    return damage


def _unshare(ops: FileOps, directory: Path, path: Path) -> None:
    """Give the last segment a file of its own if it has other links: it is appended to, maybe
    cut, from here on. A sealed segment stored in a local object store on this file system is
    the object too (a hard link, storage/objectstore.py), and one can be last after a crash that
    lost the name of the segment rolled to. The object must keep the bytes it was stored with."""
    if path.stat().st_nlink <= 1:
        return
    private = path.with_name(f".{path.name}.unshared.tmp")
    private.unlink(missing_ok=True)  # a crash during an earlier attempt
    copy_durably(path, private)
    os.replace(private, path)
    ops.fsync_directory(directory)
    log.warning("wal.segment_unshared", segment=str(path))


def _cut(ops: FileOps, path: Path, length: int) -> None:
    fd = ops.open_append(path)
    try:
        ops.truncate(fd, length)
        ops.fsync(fd, path)
    finally:
        ops.close(fd)


def _active_from_scan(base: int, path: Path, scan: SegmentScan) -> Segment:
    batches: list[BatchLocation] = scan.batches
    next_offset = batches[-1].next_offset if batches else base
    segment = Segment(base, path, next_offset, scan.valid_size, build_index(batches), 0.0, False)
    segment.last_index_position = (
        segment.index[-1].position if segment.index else -INDEX_INTERVAL_BYTES
    )
    segment.max_timestamp = max((b.max_timestamp for b in batches), default=-1)
    segment.recovered = batches
    return segment


def _start_new_segment(
    directory: Path, ops: FileOps, segments: list[Segment], next_offset: int
) -> None:
    old = segments[-1]
    if old.size == 0:
        old.path.unlink()
        segments.pop()
    else:
        old.sealed = True
        old.next_offset = next_offset
        _write_index_or_warn(old.index_path, old.index)
    path = directory / segment_name(next_offset)
    fd = ops.open_append(path, create=True)
    ops.close(fd)
    ops.fsync_directory(directory)
    segments.append(Segment(next_offset, path, next_offset, 0, SparseIndex(), 0.0, sealed=False))


def _write_index_or_warn(path: Path, index: SparseIndex) -> None:
    try:
        write_index(path, index)
    except OSError as exc:  # the index is a cache: a later open rebuilds it
        log.warning("wal.index_write_failed", index=str(path), error=str(exc))
