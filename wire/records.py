"""Kafka RecordBatch v2, byte for byte: the one place that knows the record format.

Building and reading records is delegated to aiokafka's Cython record codec (pinned in
pyproject.toml), so no per-record work runs in Python bytecode. The broker itself never needs the
records: `inspect_batch` checks a batch's header and CRC-32C, `stamp_base_offset` writes the offset
the broker assigned into the first 8 bytes (outside the CRC, as Kafka designed it), and the batch
travels on as opaque bytes. `split_batch` re-encodes the only time a batch must be cut: when a
consumer has credit for fewer records than the batch holds.

Header layout (61 bytes, big-endian): baseOffset int64, batchLength int32, partitionLeaderEpoch
int32, magic int8 (=2), crc uint32 (CRC-32C of everything after it), attributes int16,
lastOffsetDelta int32, firstTimestamp int64, maxTimestamp int64, producerId int64, producerEpoch
int16, baseSequence int32, recordCount int32.
"""

from __future__ import annotations

import enum
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

import crc32c
from aiokafka.errors import CorruptRecordException, UnsupportedCodecError
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from wire.errors import CorruptBatch
from wire.limits import MAX_BATCH_SIZE

BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_HEADER_SIZE: Final = BATCH_HEADER.size  # 61
_LENGTH_FIELD_END: Final = 12  # batchLength counts the bytes after baseOffset and itself
_CRC_START: Final = 21
_BASE_OFFSET = struct.Struct(">q")
_NO_SIZE_LIMIT: Final = 1 << 62


class Compression(enum.IntEnum):
    """Kafka's codec ids, the low 3 bits of the batch attributes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int  # milliseconds since the epoch
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True, slots=True)
class BatchInfo:
    base_offset: int
    record_count: int
    compression: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    base_sequence: int


RecordInput = tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]
T = TypeVar("T")
_DECODE_ERRORS = (
    CorruptRecordException,
    UnsupportedCodecError,
    ValueError,
    IndexError,
    struct.error,
)


class BatchBuilder:
    """Accumulates records into one batch, encoding each as it is appended (in C)."""

    def __init__(
        self,
        compression: Compression = Compression.NONE,
        producer_id: int = -1,
        producer_epoch: int = -1,
        base_sequence: int = -1,
    ) -> None:
        self._builder = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=compression,
            is_transactional=0,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            batch_size=_NO_SIZE_LIMIT,
        )
        self.count = 0

    def append(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] = (),
        timestamp: int | None = None,
    ) -> int:
        """Add a record; returns its position (offset delta) in the batch."""
        if timestamp is None:
            timestamp = int(time.time() * 1000)
        position = self.count
        self._builder.append(
            position, timestamp=timestamp, key=key, value=value, headers=list(headers)
        )
        self.count += 1
        return position

    def size(self) -> int:
        """Bytes so far (before compression)."""
        size: int = self._builder.size()
        return size

    def build(self, base_offset: int = 0) -> bytes:
        if self.count == 0:
            raise ValueError("a record batch holds at least one record")
        batch = self._builder.build()
        if base_offset:
            _BASE_OFFSET.pack_into(batch, 0, base_offset)
        return bytes(batch)


def build_batch(
    records: Iterable[RecordInput],
    *,
    base_offset: int = 0,
    timestamp: int | None = None,
    compression: Compression = Compression.NONE,
) -> bytes:
    """Encode (key, value, headers) records as one batch; offsets run 0..n-1 from `base_offset`."""
    builder = BatchBuilder(compression)
    if timestamp is None:
        timestamp = int(time.time() * 1000)
    for key, value, headers in records:
        builder.append(key, value, headers, timestamp)
    return builder.build(base_offset)


def inspect_batch(batch: bytes | bytearray | memoryview) -> BatchInfo:
    """Check a batch's framing and CRC without decoding its records; raise `CorruptBatch`."""
    size = len(batch)
    if size < BATCH_HEADER_SIZE:
        raise CorruptBatch(f"record batch of {size} bytes is shorter than its 61-byte header")
    if size > MAX_BATCH_SIZE:
        raise CorruptBatch(f"record batch of {size} bytes exceeds the {MAX_BATCH_SIZE}-byte limit")
    (
        base_offset,
        length,
        _leader_epoch,
        magic,
        crc,
        attributes,
        last_offset_delta,
        first_timestamp,
        max_timestamp,
        producer_id,
        _producer_epoch,
        base_sequence,
        record_count,
    ) = BATCH_HEADER.unpack_from(batch, 0)
    if magic != 2:
        raise CorruptBatch(f"record batch magic {magic} is not supported (only 2)")
    if length != size - _LENGTH_FIELD_END:
        raise CorruptBatch(
            f"record batch length field says {length} bytes, "
            f"the frame holds {size - _LENGTH_FIELD_END}"
        )
    actual = crc32c.crc32c(memoryview(batch)[_CRC_START:])
    if actual != crc:
        raise CorruptBatch(
            f"record batch CRC-32C mismatch: header {crc:#010x}, computed {actual:#010x}"
        )
    if record_count < 1 or last_offset_delta != record_count - 1:
        raise CorruptBatch(
            f"record batch holds {record_count} records with last offset delta {last_offset_delta}"
        )
    if attributes & 0x20:
        raise CorruptBatch("control batches are written by the broker only")
    compression = attributes & 0x07
    if compression not in Compression.__members__.values():
        raise CorruptBatch(f"unknown compression codec {compression}")
    return BatchInfo(
        base_offset,
        record_count,
        compression,
        first_timestamp,
        max_timestamp,
        producer_id,
        base_sequence,
    )


def stamp_base_offset(batch: bytearray, base_offset: int) -> None:
    _BASE_OFFSET.pack_into(batch, 0, base_offset)


def read_base_offset(batch: bytes | bytearray | memoryview) -> int:
    offset: int = _BASE_OFFSET.unpack_from(batch, 0)[0]
    return offset


def decode_records(
    batch: bytes,
    build: Callable[[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]], T],
) -> list[T]:
    """Decode every record as `build(offset, timestamp, key, value, headers)`, in C but for `build`.

    The caller's own type is built directly, with no intermediate object per record: on a
    consumer, record decoding is the hot path. Raises `CorruptBatch` if the batch does not check.
    """
    info = inspect_batch(batch)
    try:
        records = [
            build(r.offset, r.timestamp, r.key, r.value, r.headers)
            for r in DefaultRecordBatch(batch)
        ]
    except _DECODE_ERRORS as exc:
        raise CorruptBatch(f"record batch does not decode: {exc}") from None
    if len(records) != info.record_count:
        raise CorruptBatch(
            f"record batch header says {info.record_count} records, {len(records)} decode"
        )
    return records


def _record(
    offset: int,
    timestamp: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]],
) -> Record:
    return Record(offset, timestamp, key, value, tuple(headers))


def read_records(batch: bytes) -> list[Record]:
    """Decode every record as a `Record`, checking that offsets run base, base+1, ..."""
    records = decode_records(batch, _record)
    base = records[0].offset if records else 0
    if base != read_base_offset(batch) or any(r.offset != base + i for i, r in enumerate(records)):
        raise CorruptBatch("record offset deltas are not 0, 1, 2, ...")
    return records


def validate_records(batch: bytes) -> BatchInfo:
    """Header and CRC checks, then a decode of every record: what the broker accepts.

    Decoding costs ~0.2 us per record in aiokafka's C codec; it is what keeps a producer from
    storing a batch with a valid CRC that no consumer can read.
    """
    info = inspect_batch(batch)
    count = 0
    last_offset = -1
    try:
        for record in DefaultRecordBatch(batch):
            count += 1
            last_offset = record.offset
    except (
        CorruptRecordException,
        UnsupportedCodecError,
        ValueError,
        IndexError,
        struct.error,
    ) as exc:
        raise CorruptBatch(f"record batch does not decode: {exc}") from None
    if count != info.record_count or last_offset != info.base_offset + count - 1:
        raise CorruptBatch(
            f"record batch header says {info.record_count} records, {count} decode "
            f"with last offset {last_offset}"
        )
    return info


def split_batch(batch: bytes, count: int) -> tuple[bytes, bytes]:
    """Cut a valid batch after `count` records, keeping offsets, timestamps and codec."""
    info = inspect_batch(batch)
    if not 0 < count < info.record_count:
        raise ValueError(f"cannot split a batch of {info.record_count} records at {count}")
    records = read_records(batch)
    compression = Compression(info.compression)
    return (
        rebuild_batch(records[:count], compression),
        rebuild_batch(records[count:], compression),
    )


def rebuild_batch(records: Sequence[Record], compression: Compression = Compression.NONE) -> bytes:
    """Encode decoded records again as one batch, keeping their offsets and timestamps."""
    builder = BatchBuilder(compression)
    for record in records:
        builder.append(record.key, record.value, record.headers, record.timestamp)
    return builder.build(records[0].offset)
