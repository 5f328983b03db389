"""WAL segment files: naming, checking and scanning batches, resynchronising past damage, index.

A segment is a file of record batches exactly as they travel on the wire (base offset stamped),
named by the offset of its first record: `00000000000000001234.log`. Each batch carries its own
length and CRC-32C, so a segment can always be re-read and checked from its first byte.

`scan_segment` reads a whole segment and tells damage apart by where it is:

- a bad batch followed by good ones is a *hole* (corruption: a flipped byte, a bad sector). The
  scan resynchronises by looking forward for the next position that holds a plausible batch: magic
  byte 2, a sane length, a valid CRC, and a base offset not below the last good batch's end. What
  follows a hole is kept; the hole itself is left in place for the caller to quarantine.
- bad bytes with no good batch after them are the *tail*: torn by a write that never finished
  (`torn`: the last header claims more bytes than the file holds), or corrupt.

Offsets must increase along a segment; they need not be contiguous (a quarantined hole leaves a
gap). The sparse index (`.index`, written when a segment is sealed) holds one entry per
`INDEX_INTERVAL_BYTES` of log: `offset int64, position int64, max_timestamp int64`, where
`max_timestamp` is the greatest timestamp at or before that position. A read seeks to the last
entry at or below the wanted offset and scans forward from there. A missing or damaged index is
rebuilt by scanning; it is never a reason to cut a segment. In memory an index is a
`SparseIndex`: three arrays of int64, 24 bytes an entry. A sealed segment keeps its index for as
long as it is on the local disk (262,144 entries per GiB of log), and as `IndexEntry` objects
those took about 150 bytes each: a 30-minute soak's server RSS grew by tens of MB until local
retention began removing segments (docs/BENCHMARKS.md).

Every batch is checked by `check_stored`: `records.inspect_batch`'s checks, and a transaction
marker (a control batch, which only the broker writes and `inspect_batch` refuses from clients)
is a valid stored batch when its framing, CRC and one control record are.
"""

from __future__ import annotations

import bisect
import itertools
import mmap
import struct
import sys
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import crc32c

from headwater.storage.fileio import write_file_durably
from headwater.wire.errors import CorruptBatch
from headwater.wire.limits import MAX_BATCH_SIZE
from headwater.wire.markers import marker_type
from headwater.wire.records import (
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    CONTROL_FLAG,
    BatchInfo,
    inspect_batch,
)

LOG_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".index"
INDEX_INTERVAL_BYTES: Final = 4096
INDEX_ENTRY = struct.Struct(">qqq")
LENGTH_PREFIX: Final = 12  # baseOffset int64 + batchLength int32
_MAGIC_POSITION: Final = 16
_MAGIC: Final = b"\x02"
_CRC_START: Final = 21  # the CRC covers the batch from its attributes on
_ATTRIBUTES_LOW: Final = 22  # the attributes' low byte (int16 at 21)


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


class SparseIndex:
    """A segment's sparse index: entries in offset order, kept as three int64 arrays."""

    __slots__ = ("max_timestamps", "offsets", "positions")

    def __init__(self, entries: Iterable[IndexEntry] = ()) -> None:
        self.offsets = array("q")
        self.positions = array("q")
        self.max_timestamps = array("q")
        for entry in entries:
            self.append(entry.offset, entry.position, entry.max_timestamp)

    @classmethod
    def decode(cls, data: bytes) -> SparseIndex:
        """From the `.index` file's bytes (INDEX_ENTRY after INDEX_ENTRY); ValueError when they
        are not whole entries."""
        if len(data) % INDEX_ENTRY.size:
            raise ValueError(f"{len(data)} bytes are not whole index entries")
        flat = array("q", data)
        if sys.byteorder == "little":  # the file is big-endian
            flat.byteswap()
        index = cls()
        index.offsets, index.positions, index.max_timestamps = flat[0::3], flat[1::3], flat[2::3]
        return index

    def encode(self) -> bytes:
        flat = array("q", bytes(8 * 3 * len(self)))
        flat[0::3], flat[1::3], flat[2::3] = self.offsets, self.positions, self.max_timestamps
        if sys.byteorder == "little":
            flat.byteswap()
        return flat.tobytes()

    def append(self, offset: int, position: int, max_timestamp: int) -> None:
        self.offsets.append(offset)
        self.positions.append(position)
        self.max_timestamps.append(max_timestamp)

    def copy(self) -> SparseIndex:
        index = SparseIndex()
        index.offsets, index.positions = self.offsets[:], self.positions[:]
        index.max_timestamps = self.max_timestamps[:]
        return index

    def start_of(self, offset: int) -> int:
        """The byte position a read of `offset` starts at: the last entry at or below it (0 when
        there is none)."""
        entry = bisect.bisect_right(self.offsets, offset) - 1
        return self.positions[entry] if entry >= 0 else 0

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, entry: int) -> IndexEntry:
        return IndexEntry(self.offsets[entry], self.positions[entry], self.max_timestamps[entry])

    def __iter__(self) -> Iterator[IndexEntry]:
        return map(IndexEntry, self.offsets, self.positions, self.max_timestamps)


@dataclass(frozen=True, slots=True)
class BatchLocation:
    base_offset: int
    next_offset: int
    position: int
    size: int
    max_timestamp: int
    producer_id: int = -1
    base_sequence: int = -1
    producer_epoch: int = -1
    attributes: int = 0  # the batch's (transactional, control: `wire.markers`)


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes [position, position + length) of `path` hold no valid batch."""

    path: Path
    position: int
    length: int
    reason: str


@dataclass(frozen=True, slots=True)
class SegmentScan:
    batches: list[BatchLocation]
    holes: list[Damage]  # corrupt ranges with good batches after them
    tail: Damage | None  # bad bytes at the end, with nothing good after them
    torn: bool  # the tail is one batch whose header claims more bytes than the file holds
    tail_claims: int | None  # the offset after the tail batch, if its header is plausible
    file_size: int

    @property
    def valid_size(self) -> int:
        return self.tail.position if self.tail is not None else self.file_size

    @property
    def problem(self) -> str | None:
        damage = self.holes[0] if self.holes else self.tail
        return None if damage is None else f"{damage.reason} at byte {damage.position}"


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
        producer_epoch=header[10],
        attributes=header[5],
    )


def batch_length(buffer: bytes | mmap.mmap | memoryview, position: int, end: int) -> int | None:
    """The total length of the batch whose header starts at `position`, if the header is
    plausible (magic 2, a length between the header size and the batch limit); else None."""
    if end - position < BATCH_HEADER_SIZE:
        return None
    if buffer[position + _MAGIC_POSITION] != 2:
        return None
    length: int = struct.unpack_from(">i", buffer, position + 8)[0]
    total = LENGTH_PREFIX + length
    if not BATCH_HEADER_SIZE <= total <= MAX_BATCH_SIZE:
        return None
    return total


def check_stored(batch: bytes | memoryview) -> BatchInfo:
    """`inspect_batch` of a batch the log holds; a transaction marker is one too. Raises
    `CorruptBatch`."""
    try:
        return inspect_batch(batch)
    except CorruptBatch:
        if len(batch) < BATCH_HEADER_SIZE or not batch[_ATTRIBUTES_LOW] & CONTROL_FLAG:
            raise
    (base, length, _, magic, crc, _, delta, first, last, producer, epoch, sequence, count) = (
        BATCH_HEADER.unpack_from(batch, 0)
    )
    if (
        magic != 2
        or length != len(batch) - LENGTH_PREFIX
        or (count, delta) != (1, 0)
        or producer < 0
        or crc32c.crc32c(memoryview(batch)[_CRC_START:]) != crc
    ):
        raise CorruptBatch("a damaged transaction marker (framing, CRC or producer)")
    marker_type(batch)  # its one record says COMMIT or ABORT
    return BatchInfo(base, 1, 0, first, last, producer, sequence, epoch, transactional=True)


def check_batch(
    buffer: bytes | mmap.mmap, position: int, end: int, min_offset: int
) -> BatchLocation | None:
    """The batch at `position` if it is whole, valid (CRC) and starts at or above `min_offset`."""
    total = batch_length(buffer, position, end)
    if total is None or position + total > end:
        return None
    data = buffer[position : position + total]
    try:
        info = check_stored(data)
    except CorruptBatch:
        return None
    if info.base_offset < min_offset:
        return None
    return batch_location(data, position)


def find_batch(buffer: bytes | mmap.mmap, start: int, end: int, min_offset: int) -> int | None:
    """The first position at or after `start` where a valid batch begins (resynchronisation)."""
    search = start + _MAGIC_POSITION
    while True:
        found = buffer.find(_MAGIC, search, end)
        if found < 0:
            return None
        candidate = found - _MAGIC_POSITION
        if check_batch(buffer, candidate, end, min_offset) is not None:
            return candidate
        search = found + 1


@dataclass(frozen=True, slots=True)
class Walked:
    """One step of `walk_batches`: a valid batch, or (`batch` None) a damaged range."""

    position: int
    length: int
    batch: BatchLocation | None
    reason: str = ""


def walk_batches(data: bytes | memoryview, min_offset: int = 0) -> Iterator[Walked]:
    """Every valid batch of `data` (a segment, or an object holding one), and every damaged
    range between and after them, in order. Damage is got past the way the server's readers
    get past it (`find_batch`), so a bad length field costs its batch, not the rest of the
    segment. For readers of whole segments away from the server (the Spark WAL source)."""
    buffer = bytes(data)
    size = len(buffer)
    position = 0
    while position < size:
        found = check_batch(buffer, position, size, min_offset)
        if found is not None:
            yield Walked(position, found.size, found)
            position += found.size
            min_offset = found.next_offset
            continue
        resume = find_batch(buffer, position + 1, size, min_offset)
        end = size if resume is None else resume
        yield Walked(position, end - position, None, _diagnose(buffer, position, size))
        position = end


def scan_segment(path: Path, base_offset: int | None = None) -> SegmentScan:
    """Read a segment from the start, checking every batch; see the module docstring."""
    if base_offset is None:
        base_offset = parse_segment_name(path.name) or 0
    with path.open("rb") as file:
        size = file.seek(0, 2)
        if size == 0:
            return SegmentScan([], [], None, False, None, 0)
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _scan(path, data, size, base_offset)


def _scan(path: Path, data: mmap.mmap, size: int, base_offset: int) -> SegmentScan:
    batches: list[BatchLocation] = []
    holes: list[Damage] = []
    position = 0
    min_offset = base_offset
    while position < size:
        found = check_batch(data, position, size, min_offset)
        if found is not None:
            batches.append(found)
            position += found.size
            min_offset = found.next_offset
            continue
        resume = find_batch(data, position + 1, size, min_offset)
        if resume is None:
            break
        holes.append(Damage(path, position, resume - position, _diagnose(data, position, size)))
        position = resume
    if position >= size:
        return SegmentScan(batches, holes, None, False, None, size)
    total = batch_length(data, position, size)
    torn = (total is not None and position + total > size) or size - position < BATCH_HEADER_SIZE
    claims = None
    if size - position >= BATCH_HEADER_SIZE and data[position + _MAGIC_POSITION] == 2:
        header = BATCH_HEADER.unpack_from(data, position)
        if header[0] >= min_offset and header[12] >= 1:
            claims = header[0] + header[12]
    tail = Damage(path, position, size - position, _diagnose(data, position, size))
    return SegmentScan(batches, holes, tail, torn, claims, size)


def _diagnose(data: bytes | mmap.mmap, position: int, end: int) -> str:
    total = batch_length(data, position, end)
    if end - position < BATCH_HEADER_SIZE:
        return "incomplete batch header"
    if total is None:
        return "impossible batch header (magic or length)"
    if position + total > end:
        return "incomplete batch"
    return "corrupt batch (CRC, framing or offset)"


def build_index(batches: list[BatchLocation]) -> SparseIndex:
    entries = SparseIndex()
    last_position = -INDEX_INTERVAL_BYTES
    max_timestamp = -1
    for batch in batches:
        if batch.position - last_position >= INDEX_INTERVAL_BYTES:
            entries.append(batch.base_offset, batch.position, max_timestamp)
            last_position = batch.position
        max_timestamp = max(max_timestamp, batch.max_timestamp)
    return entries


def write_index(path: Path, index: SparseIndex) -> None:
    write_file_durably(path, index.encode())


def read_index(path: Path, log_size: int) -> SparseIndex | None:
    """The index, or None if it is missing or does not fit the log (then rebuild it)."""
    try:
        index = SparseIndex.decode(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    positions, offsets = index.positions, index.offsets
    if positions and (max(positions) >= log_size or min(positions) < 0):
        return None
    if any(b <= a for a, b in itertools.pairwise(offsets)) or any(
        b <= a for a, b in itertools.pairwise(positions)
    ):
        return None
    return index
