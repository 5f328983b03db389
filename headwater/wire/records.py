"""Kafka RecordBatch v2, byte for byte: the one place that knows the record format.

Building and reading records is delegated to aiokafka's Cython record codec (pinned in
pyproject.toml), so no per-record work runs in Python bytecode. The broker itself never needs the
records: `inspect_batch` checks a batch's header and CRC-32C, `stamp_base_offset` writes the offset
the broker assigned into the first 8 bytes (outside the CRC, as Kafka designed it), and the batch
travels on as opaque bytes. `split_batch` re-encodes the only time a batch must be cut: when a
consumer has credit for fewer records than the batch holds.

Compressed batches are inflated by headwater/wire/compression.py (under a size cap) and then read
by aiokafka's codec as uncompressed ones.

Header layout (61 bytes, big-endian): baseOffset int64, batchLength int32, partitionLeaderEpoch
int32, magic int8 (=2), crc uint32 (CRC-32C of everything after it), attributes int16,
lastOffsetDelta int32, firstTimestamp int64, maxTimestamp int64, producerId int64, producerEpoch
int16, baseSequence int32, recordCount int32.
"""

from __future__ import annotations

import struct
import time
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Final, Protocol, TypeVar

import crc32c
from aiokafka.errors import CorruptRecordException, UnsupportedCodecError
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from headwater.wire.compression import HEADER_SIZE, inflate
from headwater.wire.compression import Compression as Compression  # re-exported
from headwater.wire.compression import is_compressed as is_compressed  # re-exported
from headwater.wire.errors import CorruptBatch, RecordTooLarge
from headwater.wire.limits import MAX_BATCH_SIZE, MAX_DECOMPRESSED_BATCH

BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_HEADER_SIZE: Final = BATCH_HEADER.size  # 61
assert BATCH_HEADER_SIZE == HEADER_SIZE
_LENGTH_FIELD_END: Final = 12  # batchLength counts the bytes after baseOffset and itself
_CRC_START: Final = 21
_BASE_OFFSET = struct.Struct(">q")
_NO_SIZE_LIMIT: Final = 1 << 62
TRANSACTIONAL_FLAG: Final = 0x10  # attributes bit 4
CONTROL_FLAG: Final = 0x20  # attributes bit 5: a transaction marker, written by the broker only


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
    producer_epoch: int = -1
    transactional: bool = False  # attributes bit 4: part of a transaction (docs/TRANSACTIONS.md)


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
        transactional: bool = False,
    ) -> None:
        self._builder = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=compression,
            is_transactional=int(transactional),
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
        # positional: the C encoder's keyword handling cost a tenth of a producer's `send`
        self._builder.append(
            position, timestamp, key, value, headers if type(headers) is list else list(headers)
        )
        self.count = position + 1
        return position

    def extend(
        self,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[list[tuple[str, bytes | None]]] | None,
        timestamp: int,
        start: int,
        fill: int,
        space: int,
        overhead: int,
    ) -> tuple[int, int]:
        """Append `values[start:]` (with their keys and headers, all at `timestamp`) until the
        estimated bytes reach `fill` or the next record would pass `space`; a record is estimated
        as `overhead` + its key, value and header bytes. Returns (index after the last record
        appended, estimated bytes added). One call per batch: the loop calls the C encoder
        directly, with none of `append`'s per-record keyword handling."""
        append = self._builder.append
        position = self.count
        used = 0
        index = start
        stop = len(values)
        if keys is None and headers is None:
            # Values only: where the batch ends is found in C (running sizes, bisect), so the
            # loop below does nothing per record but call the encoder.
            no_headers: list[tuple[str, bytes | None]] = []
            # At most this many records can reach `fill`: each is estimated at `overhead` or more.
            window = min(fill, space) // overhead + 1 if overhead > 0 else len(values)
            chunk = values[start : start + window]
            try:
                running = [0, *accumulate(map(len, chunk))]  # type: ignore[arg-type]  # None: TypeError below
            except TypeError:  # a None value (a tombstone) counts as empty
                running = [0, *accumulate(len(v) if v is not None else 0 for v in chunk)]

            def estimate(k: int) -> int:
                return running[k] + overhead * k

            candidates = range(len(chunk) + 1)
            fits = bisect_right(candidates, space, key=estimate) - 1  # within `space`
            count = min(fits, bisect_left(candidates, fill, key=estimate))  # up to `fill`
            for offset_delta, value in enumerate(chunk[:count], position):
                append(offset_delta, timestamp, None, value, no_headers)
            position += count
            index = start + count
            used = estimate(count)
        else:
            while index < stop:
                value = values[index]
                key = keys[index] if keys is not None else None
                record_headers = headers[index] if headers is not None else []
                size = (
                    overhead
                    + (len(value) if value is not None else 0)
                    + (len(key) if key is not None else 0)
                    + sum(len(k) + len(v or b"") for k, v in record_headers)
                )
                if used + size > space:
                    break
                append(position, timestamp, key, value, record_headers)
                position += 1
                index += 1
                used += size
                if used >= fill:
                    break
        self.count = position
        return index, used

    def extend_columns(
        self, keys: Sequence[bytes | None], values: Sequence[bytes | None], timestamp: int
    ) -> None:
        """Append records `keys[i]`/`values[i]`, no headers, all at `timestamp`, with no size
        limit and no tuple per record (a map set's batch)."""
        append = self._builder.append
        no_headers: list[tuple[str, bytes | None]] = []
        for offset_delta, (key, value) in enumerate(zip(keys, values, strict=True), self.count):
            append(offset_delta, timestamp, key, value, no_headers)
        self.count += len(keys)

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
    listed = list(records)
    builder.extend(
        [value for _, value, _ in listed],
        [key for key, _, _ in listed],
        [list(headers) for _, _, headers in listed],
        timestamp,
        0,
        _NO_SIZE_LIMIT,
        _NO_SIZE_LIMIT,
        0,
    )
    return builder.build(base_offset)


def inspect_batch(batch: bytes | bytearray | memoryview, control: bool = False) -> BatchInfo:
    """Check a batch's framing and CRC without decoding its records; raise `CorruptBatch`.
    A control batch (a transaction marker) is refused unless `control` (a reader of what the
    server stored: a FETCH's raw answer)."""
    size = len(batch)
    if size < BATCH_HEADER_SIZE:
        raise CorruptBatch(f"record batch of {size} bytes is shorter than its 61-byte header")
    if size > MAX_BATCH_SIZE:
        raise RecordTooLarge(
            f"record batch of {size} bytes exceeds the {MAX_BATCH_SIZE}-byte limit"
        )
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
        producer_epoch,
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
    if attributes & CONTROL_FLAG and not control:
        raise CorruptBatch("control batches are written by the broker only")
    if attributes & TRANSACTIONAL_FLAG and producer_id < 0:
        raise CorruptBatch("a transactional record batch without a producer id")
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
        producer_epoch,
        bool(attributes & TRANSACTIONAL_FLAG),
    )


def stamp_base_offset(batch: bytearray, base_offset: int) -> None:
    _BASE_OFFSET.pack_into(batch, 0, base_offset)


def read_base_offset(batch: bytes | bytearray | memoryview) -> int:
    offset: int = _BASE_OFFSET.unpack_from(batch, 0)[0]
    return offset


_MAX_OFFSET_DELTA: Final = (1 << 31) - 1


def gap_batch(base_offset: int, next_offset: int) -> bytes:
    """A batch of no records spanning `base_offset` up to `next_offset` (at most 2**31 offsets
    of it): what a Kafka broker leaves where compaction removed every record of a batch, and what
    a Kafka client steps over to its end. Headwater answers one for offsets no batch holds (the
    ones a restart skipped to its offset lease), so a reader whose position is there moves on to
    the end instead of asking for it again and again."""
    delta = min(next_offset - base_offset, _MAX_OFFSET_DELTA) - 1
    if delta < 0:
        raise ValueError(f"an empty range: {base_offset}..{next_offset}")
    header = bytearray(BATCH_HEADER_SIZE)
    BATCH_HEADER.pack_into(
        header, 0, base_offset, BATCH_HEADER_SIZE - _LENGTH_FIELD_END, -1, 2, 0, 0, delta,
        -1, -1, -1, -1, -1, 0,
    )  # fmt: skip
    struct.pack_into(">I", header, 17, crc32c.crc32c(memoryview(header)[_CRC_START:]))
    return bytes(header)


# A record's headers as `decode_records` hands them over: (name, value) pairs in a tuple, as a
# `Record` holds them. A record without headers gets NO_HEADERS, one shared empty tuple: the
# codec's own empty list per record was a second object per message for the consumer's garbage
# collector to track (and walk, while the message was kept).
Headers = tuple[tuple[str, bytes | None], ...]
NO_HEADERS: Headers = ()


class RawRecord(Protocol):
    """A record as the C codec decodes it (aiokafka's DefaultRecord), read-only."""

    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]]: ...


def decode_batch(
    batch: bytes, max_decompressed: int = MAX_DECOMPRESSED_BATCH, info: BatchInfo | None = None
) -> list[RawRecord]:
    """Every record as the C codec's own object, decoded in one C loop (no Python per record).

    Raises `CorruptBatch` if the batch does not check, `DecompressedTooLarge` if it inflates past
    `max_decompressed` bytes. `info`: what `inspect_batch` said of this batch already.
    """
    plain, info = _inflated(batch, max_decompressed, info)
    try:
        records: list[RawRecord] = list(DefaultRecordBatch(plain))
    except _DECODE_ERRORS as exc:
        raise CorruptBatch(f"record batch does not decode: {exc}") from None
    _check_count(info, len(records))
    return records


def decode_records(
    batch: bytes,
    build: Callable[[int, int, bytes | None, bytes | None, Headers], T],
    max_decompressed: int = MAX_DECOMPRESSED_BATCH,
    info: BatchInfo | None = None,
) -> list[T]:
    """Decode every record as `build(offset, timestamp, key, value, headers)`, in C but for `build`.

    The caller's own type is built directly from the codec's records, with no intermediate object
    of ours per record: on a consumer, record decoding is the hot path. Records are built one at a
    time, so each codec record (and its headers list, replaced by NO_HEADERS when empty) is freed
    before the next is decoded: a batch leaves one object per record for the garbage collector,
    not three (a consumer taking 1M messages ran 11 full collections instead of 30, and spent a
    fifth less CPU). Raises as `decode_batch`.
    """
    plain, info = _inflated(batch, max_decompressed, info)
    built: list[T] = []
    append = built.append
    # `build` runs inside the try: it must be a plain constructor, whose errors (none expected)
    # would be reported as a corrupt batch
    try:
        for r in DefaultRecordBatch(plain):
            headers = r.headers
            headers = tuple(headers) if headers else NO_HEADERS
            append(build(r.offset, r.timestamp, r.key, r.value, headers))
    except _DECODE_ERRORS as exc:
        raise CorruptBatch(f"record batch does not decode: {exc}") from None
    _check_count(info, len(built))
    return built


def decode_columns(
    batch: bytes,
    timestamps: list[int],
    keys: list[bytes | None],
    values: list[bytes | None],
    headers: list[tuple[int, Headers]],
    max_decompressed: int = MAX_DECOMPRESSED_BATCH,
) -> int:
    """Append every record's timestamp, key and value to the three lists, and `(index in keys,
    headers)` to `headers` for each record that has any; returns how many records were appended.

    For columnar readers (Arrow): no object of ours per record, three list appends and a test
    of the codec's headers list, so a batch costs little more than the C decode. The records'
    offsets are the batch's base offset plus 0, 1, ... (checked at both ends, as `read_records`
    checks). Raises as `decode_batch`, and then leaves the lists as they were.
    """
    plain, info = _inflated(batch, max_decompressed, None)
    start, held = len(keys), len(headers)
    add_timestamp, add_key, add_value = timestamps.append, keys.append, values.append
    first = last = -1
    try:
        for record in DefaultRecordBatch(plain):
            add_timestamp(record.timestamp)
            add_key(record.key)
            add_value(record.value)
            found = record.headers
            if found:
                headers.append((len(keys) - 1, tuple(found)))
            last = record.offset
            if first < 0:
                first = last
        count = len(keys) - start
        _check_count(info, count)
        if count and (first != info.base_offset or last != first + count - 1):
            raise CorruptBatch("record offset deltas are not 0, 1, 2, ...")
    except _DECODE_ERRORS as exc:
        _truncate(start, held, timestamps, keys, values, headers)
        raise CorruptBatch(f"record batch does not decode: {exc}") from None
    except CorruptBatch:
        _truncate(start, held, timestamps, keys, values, headers)
        raise
    return count


def _truncate(start: int, held: int, *columns: list[Any]) -> None:
    *lists, headers = columns
    for column in lists:
        del column[start:]
    del headers[held:]


def _inflated(
    batch: bytes, max_decompressed: int, info: BatchInfo | None
) -> tuple[bytes | memoryview, BatchInfo]:
    """The batch as an uncompressed one (`compression.inflate`), with its checked header."""
    if info is None:
        info = inspect_batch(batch)
    return inflate(batch, max_decompressed, info.compression), info


def _check_count(info: BatchInfo, decoded: int) -> None:
    if decoded != info.record_count:
        raise CorruptBatch(
            f"record batch header says {info.record_count} records, {decoded} decode"
        )


def record_of(
    offset: int,
    timestamp: int,
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
) -> Record:
    """The default `build` of `decode_records`: a `Record` (read_records, Client.fetch)."""
    return Record(offset, timestamp, key, value, tuple(headers))


def read_records(batch: bytes, max_decompressed: int = MAX_DECOMPRESSED_BATCH) -> list[Record]:
    """Decode every record as a `Record`, checking that offsets run base, base+1, ..."""
    records = decode_records(batch, record_of, max_decompressed)
    base = records[0].offset if records else 0
    if base != read_base_offset(batch) or any(r.offset != base + i for i, r in enumerate(records)):
        raise CorruptBatch("record offset deltas are not 0, 1, 2, ...")
    return records


def validate_records(batch: bytes, max_decompressed: int = MAX_DECOMPRESSED_BATCH) -> BatchInfo:
    """Header and CRC checks, then a decode of every record: what the broker accepts.

    Decoding costs ~0.2 us per record in aiokafka's C codec; it is what keeps a producer from
    storing a batch with a valid CRC that no consumer can read. A compressed batch is inflated
    under `max_decompressed` first (`DecompressedTooLarge` past it).
    """
    info = inspect_batch(batch)
    plain = inflate(batch, max_decompressed, info.compression)
    try:
        # The codec stops after the header's record count and refuses leftover bytes; the
        # deque drains it in C, keeping only the last record (no Python per record).
        last = deque(DefaultRecordBatch(plain), maxlen=1)
    except _DECODE_ERRORS as exc:
        raise CorruptBatch(f"record batch does not decode: {exc}") from None
    last_offset = last[0].offset if last else -1
    if last_offset != info.base_offset + info.record_count - 1:
        raise CorruptBatch(
            f"record batch header says {info.record_count} records, the last decodes "
            f"with offset {last_offset}"
        )
    return info


def split_batch(batch: bytes, count: int) -> tuple[bytes, bytes]:
    """Cut a valid batch after `count` records, keeping offsets, timestamps and codec.

    The codec's own record objects go straight back into the builder: a consumer with less
    credit than a batch holds costs no object of ours per record."""
    info = inspect_batch(batch)
    if not 0 < count < info.record_count:
        raise ValueError(f"cannot split a batch of {info.record_count} records at {count}")
    records = decode_batch(batch, info=info)
    base = info.base_offset
    if [r.offset for r in records] != list(range(base, base + len(records))):
        raise CorruptBatch("record offset deltas are not 0, 1, 2, ...")
    compression = Compression(info.compression)
    return (
        rebuild_batch(records[:count], compression),
        rebuild_batch(records[count:], compression),
    )


def rebuild_batch(
    records: Sequence[Record | RawRecord], compression: Compression = Compression.NONE
) -> bytes:
    """Encode decoded records again as one batch, keeping their offsets and timestamps."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=_NO_SIZE_LIMIT,
    )
    append = builder.append
    for position, record in enumerate(records):
        append(position, record.timestamp, record.key, record.value, list(record.headers))
    batch = builder.build()
    _BASE_OFFSET.pack_into(batch, 0, records[0].offset)
    return bytes(batch)
