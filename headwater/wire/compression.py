"""Compressed record batches: the codec bits, and inflating under a size cap.

Compressed batches are inflated here, not by aiokafka (whose codec inflates whatever a batch
holds): `inflate` writes into a buffer of at most `max_decompressed` bytes and stops as soon as the
output would pass it, so a compression bomb costs at most the cap in memory and time before it is
refused with `DecompressedTooLarge`. Snappy (xerial framing) declares each block's size up front,
which is checked before anything is inflated. The result is the batch as an uncompressed one, for
headwater/wire/records.py to read with aiokafka's codec. Buffers past 1 MiB are anonymous memory
maps, so only the pages actually written cost memory.
"""

from __future__ import annotations

import enum
import mmap
import struct
from typing import Final

import cramjam

from headwater.wire.errors import CorruptBatch, DecompressedTooLarge
from headwater.wire.limits import MAX_DECOMPRESSED_BATCH

HEADER_SIZE: Final = 61  # RecordBatch v2's header (headwater/wire/records.py lays it out)
SIZE_PREFIX = struct.Struct(">i")
_ATTRIBUTES_LOW_BYTE: Final = 22  # attributes is the int16 at 21; the codec is its low 3 bits
_CODEC_MASK: Final = 0x07
# First inflate attempt: this many times the compressed size (most data compresses less), so a
# small batch does not pay for a buffer as large as the cap; a miss retries at the cap.
_FIRST_GUESS_RATIO: Final = 8
_MIN_GUESS: Final = 64 * 1024
_MMAP_FROM: Final = 1024 * 1024
# cramjam's message when the output buffer is full (Rust's io::ErrorKind::WriteZero)
_BUFFER_FULL = "write whole buffer"
_XERIAL_HEADER: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE: Final = 16


class Compression(enum.IntEnum):
    """Kafka's codec ids, the low 3 bits of the batch attributes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


def is_compressed(batch: bytes | bytearray | memoryview) -> bool:
    """Whether the batch's codec bits are set (no other check: `inspect_batch` does those)."""
    return len(batch) > _ATTRIBUTES_LOW_BYTE and bool(batch[_ATTRIBUTES_LOW_BYTE] & _CODEC_MASK)


_RECORD_COUNT = struct.Struct(">i")
_RECORD_COUNT_AT: Final = 57


def declared_records(batch: bytes | bytearray | memoryview) -> int:
    """The record count the batch's header declares (no other check), 0 if it is too short."""
    if len(batch) < _RECORD_COUNT_AT + _RECORD_COUNT.size:
        return 0
    count: int = _RECORD_COUNT.unpack_from(batch, _RECORD_COUNT_AT)[0]
    return count


def inflate(
    batch: bytes, max_decompressed: int = MAX_DECOMPRESSED_BATCH, compression: int | None = None
) -> bytes | memoryview:
    """The batch as an uncompressed one: its header, codec bits cleared, then its records inflated.

    The CRC is left as it was (it covers the compressed bytes); the result is for reading only.
    Raises `DecompressedTooLarge` as soon as the records would pass `max_decompressed` bytes.
    """
    codec = batch[_ATTRIBUTES_LOW_BYTE] & _CODEC_MASK if compression is None else compression
    if codec == Compression.NONE:
        return batch
    payload = memoryview(batch)[HEADER_SIZE:]
    if codec == Compression.SNAPPY:
        return _inflate_snappy(batch, payload, max_decompressed)
    guess = min(max_decompressed, max(_MIN_GUESS, len(payload) * _FIRST_GUESS_RATIO))
    inflated = _inflate_into(batch, payload, codec, guess)
    if inflated is None and guess < max_decompressed:
        inflated = _inflate_into(batch, payload, codec, max_decompressed)
    if inflated is None:
        raise DecompressedTooLarge(
            f"{Compression(codec).name.lower()} record batch of {len(batch)} bytes inflates past "
            f"the {max_decompressed}-byte limit"
        )
    return inflated


def _buffer(batch: bytes, size: int) -> bytearray | mmap.mmap:
    buffer: bytearray | mmap.mmap = (
        bytearray(HEADER_SIZE + size) if size <= _MMAP_FROM else mmap.mmap(-1, HEADER_SIZE + size)
    )
    buffer[:HEADER_SIZE] = batch[:HEADER_SIZE]
    buffer[_ATTRIBUTES_LOW_BYTE] &= ~_CODEC_MASK & 0xFF
    return buffer


def _inflate_into(batch: bytes, payload: memoryview, codec: int, size: int) -> memoryview | None:
    """Inflate into a buffer of `size` bytes; None if the records do not fit."""
    buffer = _buffer(batch, size)
    module = {Compression.GZIP: cramjam.gzip, Compression.LZ4: cramjam.lz4}.get(
        Compression(codec), cramjam.zstd
    )
    try:
        written: int = module.decompress_into(
            payload,
            memoryview(buffer)[HEADER_SIZE:],
        )
    except cramjam.DecompressionError as exc:
        if _BUFFER_FULL in str(exc):
            return None
        raise CorruptBatch(f"record batch does not decompress: {exc}") from None
    return memoryview(buffer)[: HEADER_SIZE + written]


def _inflate_snappy(batch: bytes, payload: memoryview, limit: int) -> memoryview:
    """Kafka's snappy: raw snappy, or xerial blocks; every block states its inflated size."""
    blocks: list[memoryview] = []
    if bytes(payload[: len(_XERIAL_HEADER)]) == _XERIAL_HEADER and len(payload) > 16:
        position = _XERIAL_HEADER_SIZE
        while position < len(payload):
            if position + 4 > len(payload):
                raise CorruptBatch("snappy block size is truncated")
            (size,) = SIZE_PREFIX.unpack_from(payload, position)
            position += 4
            if size < 0 or position + size > len(payload):
                raise CorruptBatch(f"snappy block of {size} bytes overruns the batch")
            blocks.append(payload[position : position + size])
            position += size
    else:
        blocks.append(payload)
    total = 0
    sizes = []
    try:
        for block in blocks:
            sizes.append(cramjam.snappy.decompress_raw_len(block))
            total += sizes[-1]
            if total > limit:
                raise DecompressedTooLarge(
                    f"snappy record batch of {len(batch)} bytes inflates past the "
                    f"{limit}-byte limit"
                )
        buffer = _buffer(batch, total)
        view = memoryview(buffer)
        position = HEADER_SIZE
        for block, size in zip(blocks, sizes, strict=True):
            cramjam.snappy.decompress_raw_into(
                block,
                view[position : position + size],
            )
            position += size
    except cramjam.DecompressionError as exc:
        raise CorruptBatch(f"record batch does not decompress: {exc}") from None
    return view
