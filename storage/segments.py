"""WAL segment files: naming, scanning, recovery, and the sparse index.

A segment is a file of record batches exactly as they travel on the wire (base offset stamped),
named by the offset of its first record: `00000000000000001234.log`. Each batch carries its own
length and CRC-32C, so a segment can always be re-read and checked from its first byte: that is
how recovery finds the end of the good data after a crash (`scan_segment` stops at the first
incomplete or corrupt batch, and the caller truncates there).

The sparse index (`.index`, written when a segment is sealed) holds one entry per
`INDEX_INTERVAL_BYTES` of log: `offset int64, position int64, max_timestamp int64`, where
`max_timestamp` is the greatest timestamp at or before that position. A read seeks to the last
entry at or below the wanted offset and scans forward from there. A missing or damaged index is
rebuilt by scanning.
"""

from __future__ import annotations

import itertools
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from wire.errors import CorruptBatch
from wire.records import BATCH_HEADER, BATCH_HEADER_SIZE, inspect_batch

LOG_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".index"
INDEX_INTERVAL_BYTES: Final = 4096
INDEX_ENTRY = struct.Struct(">qqq")
_LENGTH_PREFIX: Final = 12  # baseOffset int64 + batchLength int32
_SCAN_CHUNK: Final = 1 << 20


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}{LOG_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    stem, suffix = name[: -len(LOG_SUFFIX)], name[-len(LOG_SUFFIX) :]
    if suffix != LOG_SUFFIX or len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem)


@dataclass(frozen=True, slots=True)
class IndexEntry:
    offset: int
    position: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class BatchLocation:
    base_offset: int
    next_offset: int
    position: int
    size: int
    max_timestamp: int
    producer_id: int = -1
    base_sequence: int = -1


@dataclass(frozen=True, slots=True)
class ScanResult:
    batches: list[BatchLocation]
    valid_size: int  # bytes of good batches from the start; anything after is torn or corrupt
    file_size: int
    problem: str | None  # why the scan stopped early, if it did


def batch_location(batch: bytes | memoryview, position: int) -> BatchLocation:
    header = BATCH_HEADER.unpack_from(batch, 0)
    base_offset, max_timestamp, record_count = header[0], header[8], header[12]
    return BatchLocation(
        base_offset,
        base_offset + record_count,
        position,
        len(batch),
        max_timestamp,
        producer_id=header[9],
        base_sequence=header[11],
    )


def scan_segment(path: Path) -> ScanResult:
    """Read a segment from the start, checking every batch's length and CRC."""
    batches: list[BatchLocation] = []
    file_size = path.stat().st_size
    position = 0
    problem: str | None = None
    expected_offset: int | None = None
    with path.open("rb") as file:
        buffer = b""
        buffer_start = 0
        while True:
            relative = position - buffer_start
            if len(buffer) - relative < _LENGTH_PREFIX:
                buffer = buffer[relative:] + file.read(_SCAN_CHUNK)
                buffer_start = position
                relative = 0
                if len(buffer) < _LENGTH_PREFIX:
                    if buffer:
                        problem = f"incomplete batch header at byte {position}"
                    break
            (length,) = struct.unpack_from(">i", buffer, relative + 8)
            total = _LENGTH_PREFIX + length
            if length < BATCH_HEADER_SIZE - _LENGTH_PREFIX:
                problem = f"impossible batch length {length} at byte {position}"
                break
            while len(buffer) - relative < total:
                more = file.read(max(_SCAN_CHUNK, total))
                if not more:
                    break
                buffer = buffer[relative:] + more
                buffer_start = position
                relative = 0
            if len(buffer) - relative < total:
                problem = f"incomplete batch at byte {position}"
                break
            view = memoryview(buffer)[relative : relative + total]
            try:
                inspect_batch(view)
            except CorruptBatch as exc:
                problem = f"corrupt batch at byte {position}: {exc.message}"
                break
            location = batch_location(view, position)
            if expected_offset is not None and location.base_offset != expected_offset:
                problem = (
                    f"batch at byte {position} starts at offset {location.base_offset}, "
                    f"expected {expected_offset}"
                )
                break
            expected_offset = location.next_offset
            batches.append(location)
            position += total
    return ScanResult(batches, position, file_size, problem)


def build_index(batches: list[BatchLocation]) -> list[IndexEntry]:
    entries: list[IndexEntry] = []
    last_position = -INDEX_INTERVAL_BYTES
    max_timestamp = -1
    for batch in batches:
        if batch.position - last_position >= INDEX_INTERVAL_BYTES:
            entries.append(IndexEntry(batch.base_offset, batch.position, max_timestamp))
            last_position = batch.position
        max_timestamp = max(max_timestamp, batch.max_timestamp)
    return entries


def write_index(path: Path, entries: list[IndexEntry]) -> None:
    data = b"".join(INDEX_ENTRY.pack(e.offset, e.position, e.max_timestamp) for e in entries)
    temporary = path.with_suffix(".index.tmp")
    with temporary.open("wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def read_index(path: Path, log_size: int) -> list[IndexEntry] | None:
    """The index, or None if it is missing or does not fit the log (then rebuild it)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) % INDEX_ENTRY.size:
        return None
    entries = [IndexEntry(*fields) for fields in INDEX_ENTRY.iter_unpack(data)]
    if any(e.position >= log_size for e in entries) or any(
        b.offset <= a.offset or b.position <= a.position for a, b in itertools.pairwise(entries)
    ):
        return None
    return entries
