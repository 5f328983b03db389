"""Transaction markers (Kafka's control batches) and the header fields transactions read.

A transaction ends, in each partition it wrote, with a marker: a record batch whose attributes
have the control bit (5) and the transactional bit (4) set, stamped with the producer's id and
epoch, holding one record whose key says COMMIT or ABORT and whose value carries the
coordinator's epoch. Its layout is Kafka's, byte for byte, so a Kafka client skips it as it
skips a Kafka broker's, and every reader of the log (WAL, object store, snapshots) carries it like
any batch. Only the broker writes markers (`records.inspect_batch` refuses a control batch from
a client).

    key:   version int16 (0), type int16 (0 ABORT, 1 COMMIT)
    value: version int16 (0), coordinator epoch int32

`peek` reads what a transaction needs from a stored batch's header without decoding it (the
broker never needs the records of a transactional batch, only its producer and its range), and
`marker_type` the one record of a control batch.

Pure bytes in, bytes out: no I/O.
"""

from __future__ import annotations

import enum
import struct
import time
from dataclasses import dataclass
from typing import Final

import crc32c

from headwater.wire.errors import CorruptBatch
from headwater.wire.records import BATCH_HEADER, BATCH_HEADER_SIZE, CONTROL_FLAG, TRANSACTIONAL_FLAG

_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")
_CRC_START: Final = 21
_ATTRIBUTES = struct.Struct(">h")
_ATTRIBUTES_AT: Final = 21


class Marker(enum.IntEnum):
    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """What a transaction reads of a stored batch: its producer, its offsets, its flags."""

    base_offset: int
    next_offset: int  # one past its last offset
    producer_id: int
    producer_epoch: int
    transactional: bool
    control: bool


def peek(batch: bytes | memoryview) -> BatchHeader:
    """The header fields of a stored (already checked) batch."""
    header = BATCH_HEADER.unpack_from(batch, 0)
    attributes = header[5]
    return BatchHeader(
        base_offset=header[0],
        next_offset=header[0] + header[6] + 1,
        producer_id=header[9],
        producer_epoch=header[10],
        transactional=bool(attributes & TRANSACTIONAL_FLAG),
        control=bool(attributes & CONTROL_FLAG),
    )


def is_transactional(batch: bytes | memoryview) -> bool:
    """True for a transactional batch or a marker: the two a partition's transactions follow.
    One short read, for the append path of every batch."""
    return bool(_ATTRIBUTES.unpack_from(batch, _ATTRIBUTES_AT)[0] & TRANSACTIONAL_FLAG)


def _varint(value: int) -> bytes:
    """A zigzag varint, as records encode their lengths and deltas."""
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = zigzag & 0x7F
        zigzag >>= 7
        if zigzag:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def build_marker(
    producer_id: int,
    producer_epoch: int,
    marker: Marker,
    coordinator_epoch: int = 0,
    timestamp: int | None = None,
) -> bytes:
    """A control batch of one record ending `producer_id`'s transaction with `marker` (base
    offset 0: the log stamps the offset it gets)."""
    if timestamp is None:
        timestamp = int(time.time() * 1000)
    key = _KEY.pack(0, int(marker))
    value = _VALUE.pack(0, coordinator_epoch)
    body = b"".join(
        (
            b"\x00",  # record attributes
            _varint(0),  # timestamp delta
            _varint(0),  # offset delta
            _varint(len(key)),
            key,
            _varint(len(value)),
            value,
            _varint(0),  # headers
        )
    )
    record = _varint(len(body)) + body
    header = bytearray(BATCH_HEADER_SIZE)
    BATCH_HEADER.pack_into(
        header,
        0,
        0,  # base offset
        BATCH_HEADER_SIZE - 12 + len(record),  # batch length: the bytes after it
        -1,  # partition leader epoch
        2,  # magic
        0,  # crc, below
        CONTROL_FLAG | TRANSACTIONAL_FLAG,
        0,  # last offset delta
        timestamp,
        timestamp,
        producer_id,
        producer_epoch,
        -1,  # base sequence: markers take none
        1,  # record count
    )
    batch = bytes(header) + record
    crc = crc32c.crc32c(memoryview(batch)[_CRC_START:])
    struct.pack_into(">I", header, 17, crc)
    return bytes(header) + record


def marker_type(batch: bytes | memoryview) -> Marker:
    """COMMIT or ABORT, from a control batch's one record (`CorruptBatch` if it holds none)."""
    position = BATCH_HEADER_SIZE
    try:
        _length, position = _read_varint(batch, position)
        position += 1  # record attributes
        _, position = _read_varint(batch, position)  # timestamp delta
        _, position = _read_varint(batch, position)  # offset delta
        key_length, position = _read_varint(batch, position)
        if key_length < _KEY.size:
            raise CorruptBatch(f"a control record's key of {key_length} bytes")
        _version, kind = _KEY.unpack_from(batch, position)
    except (IndexError, struct.error) as exc:
        raise CorruptBatch(f"a control batch does not decode: {exc}") from None
    if kind not in (Marker.ABORT, Marker.COMMIT):
        raise CorruptBatch(f"a control record of unknown type {kind}")
    return Marker(kind)


def _read_varint(data: bytes | memoryview, position: int) -> tuple[int, int]:
    result = 0
    shift = 0
    for _ in range(10):
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), position
        shift += 7
    raise CorruptBatch("a varint of more than 10 bytes")
