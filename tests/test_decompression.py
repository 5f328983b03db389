"""Inflating compressed batches under a cap (wire/records.py `inflate`), codec by codec.

Batches come from kafka-python's independent builder and codecs (xerial snappy included), so the
capped inflation is checked against what other Kafka clients send.
"""

from __future__ import annotations

import struct

import crc32c
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaBuilder

from headwater.wire.errors import CorruptBatch, DecompressedTooLarge
from headwater.wire.records import Compression, inflate, read_records, validate_records

CODECS = [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]


def kafka_batch(codec: Compression, values: list[bytes]) -> bytes:
    builder = KafkaBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000, key=b"k", value=value, headers=[])
    return bytes(builder.build())


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_within_the_cap_every_record_reads(codec: Compression) -> None:
    values = [bytes([i % 251]) * 1000 for i in range(300)]
    batch = kafka_batch(codec, values)
    assert [r.value for r in read_records(batch, max_decompressed=1 << 20)] == values
    assert validate_records(batch, 1 << 20).record_count == 300


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_past_the_cap_is_decompressed_too_large(codec: Compression) -> None:
    batch = kafka_batch(codec, [bytes(4 << 20)])  # one 4 MiB record of zeros
    assert len(batch) < 1 << 20
    with pytest.raises(DecompressedTooLarge, match="1048576-byte limit"):
        validate_records(batch, 1 << 20)
    with pytest.raises(DecompressedTooLarge):
        read_records(batch, max_decompressed=1 << 20)
    assert len(read_records(batch, max_decompressed=8 << 20)) == 1


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_garbage_payload_is_corrupt_not_a_crash(codec: Compression) -> None:
    batch = bytearray(kafka_batch(codec, [b"v" * 100]))
    batch[61:] = b"\x07" * (len(batch) - 61)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    with pytest.raises(CorruptBatch):
        validate_records(bytes(batch))


def test_uncompressed_batches_are_not_copied() -> None:
    batch = kafka_batch(Compression.NONE, [b"v"])
    assert inflate(batch) is batch
