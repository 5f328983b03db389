"""RecordBatch v2: ours against kafka-python's independent implementation, and corruption checks."""

from __future__ import annotations

import gc
import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch as KafkaBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaBuilder

from headwater.wire.errors import CorruptBatch
from headwater.wire.records import (
    NO_HEADERS,
    BatchBuilder,
    build_batch,
    decode_columns,
    decode_records,
    inspect_batch,
    read_records,
    split_batch,
    stamp_base_offset,
    validate_records,
)

keys = st.one_of(st.none(), st.binary(max_size=20))
values = st.one_of(st.none(), st.binary(max_size=200))
headers = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=3
)
records = st.lists(st.tuples(keys, values, headers), min_size=1, max_size=20)


@settings(max_examples=60)
@given(records, st.integers(0, 2**40))
def test_kafka_python_reads_our_batches(items: list, base_offset: int) -> None:
    batch = build_batch(items, base_offset=base_offset, timestamp=1_700_000_000_000)
    theirs = KafkaBatch(batch)
    assert theirs.validate_crc()
    decoded = list(theirs)
    assert [(r.key, r.value, list(r.headers)) for r in decoded] == [
        (k, v, list(h)) for k, v, h in items
    ]
    assert [r.offset for r in decoded] == list(range(base_offset, base_offset + len(items)))
    assert all(r.timestamp == 1_700_000_000_000 for r in decoded)


@settings(max_examples=60)
@given(records)
def test_we_read_kafka_python_batches(items: list) -> None:
    builder = KafkaBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for i, (key, value, hdrs) in enumerate(items):
        builder.append(i, timestamp=1_600_000_000_000 + i, key=key, value=value, headers=hdrs)
    batch = bytes(builder.build())
    info = validate_records(batch)
    assert info.record_count == len(items)
    ours = read_records(batch)
    assert [(r.key, r.value, list(r.headers)) for r in ours] == [
        (k, v, list(h)) for k, v, h in items
    ]
    assert [r.timestamp for r in ours] == [1_600_000_000_000 + i for i in range(len(items))]


@settings(max_examples=60)
@given(records, st.integers(0, 2**40))
def test_columns_decode_what_kafka_python_wrote(items: list, base_offset: int) -> None:
    """decode_columns (the Spark reader's decode) appends, after what the lists held, exactly the
    records kafka-python's own codec encoded: timestamps, keys, values, and the headers of those
    that have some, by index."""
    builder = KafkaBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for i, (key, value, hdrs) in enumerate(items):
        builder.append(i, timestamp=1_600_000_000_000 + i, key=key, value=value, headers=hdrs)
    batch = bytearray(builder.build())
    stamp_base_offset(batch, base_offset)
    timestamps, found_keys, found_values = [7], [b"before"], [None]
    found_headers: list = [(0, (("h", b"v"),))]
    count = decode_columns(bytes(batch), timestamps, found_keys, found_values, found_headers)
    assert count == len(items)
    assert timestamps == [7, *(1_600_000_000_000 + i for i in range(len(items)))]
    assert found_keys == [b"before", *(k for k, _, _ in items)]
    assert found_values == [None, *(v for _, v, _ in items)]
    assert found_headers == [(0, (("h", b"v"),))] + [
        (1 + i, tuple(h)) for i, (_, _, h) in enumerate(items) if h
    ]


def test_a_batch_that_does_not_decode_leaves_the_columns_as_they_were() -> None:
    batch = bytearray(build_batch([(b"k", b"v", [("h", b"x")])] * 3, base_offset=10))
    # the header claims a fourth record (count and last offset delta, the CRC made valid): the
    # codec fails after three were appended
    struct.pack_into(">i", batch, 57, 4)
    struct.pack_into(">i", batch, 23, 3)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    columns: tuple[list, list, list, list] = ([1], [b"a"], [b"b"], [])
    with pytest.raises(CorruptBatch, match="does not decode"):
        decode_columns(bytes(batch), *columns)
    assert columns == ([1], [b"a"], [b"b"], [])


def test_stamping_the_base_offset_keeps_the_crc_valid() -> None:
    batch = bytearray(build_batch([(None, b"a", []), (None, b"b", [])]))
    stamp_base_offset(batch, 12345)
    info = inspect_batch(bytes(batch))
    assert info.base_offset == 12345
    assert [r.offset for r in read_records(bytes(batch))] == [12345, 12346]
    assert KafkaBatch(bytes(batch)).validate_crc()


@given(st.data())
def test_any_single_byte_flip_after_the_crc_is_detected(data: st.DataObject) -> None:
    batch = build_batch([(b"k", b"value", [("h", b"1")])] * 3)
    position = data.draw(st.integers(21, len(batch) - 1))
    corrupted = bytearray(batch)
    corrupted[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptBatch):
        inspect_batch(bytes(corrupted))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b[:40], "shorter than its 61-byte header"),
        (lambda b: b[:-1], "length field"),
        (lambda b: b[:16] + b"\x01" + b[17:], "magic 1"),
        (lambda b: b + b"\x00", "length field"),
    ],
    ids=["short", "truncated", "magic", "trailing"],
)
def test_malformed_batches(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    batch = build_batch([(None, b"x" * 10, [])] * 2)
    with pytest.raises(CorruptBatch, match=message):
        inspect_batch(mutate(batch))


def _recrc(batch: bytearray) -> bytes:
    import crc32c

    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def test_valid_crc_over_records_that_do_not_decode_is_refused() -> None:
    batch = bytearray(build_batch([(None, b"x" * 10, [])] * 2))
    struct.pack_into(">i", batch, 57, 5)  # header claims 5 records, 2 are there
    struct.pack_into(">i", batch, 23, 4)
    with pytest.raises(CorruptBatch):
        validate_records(_recrc(batch))
    garbage = bytearray(build_batch([(None, b"x" * 10, [])]))
    garbage[61:] = b"\xff" * (len(garbage) - 61)
    with pytest.raises(CorruptBatch):
        validate_records(_recrc(garbage))


def test_control_batches_are_refused() -> None:
    batch = bytearray(build_batch([(None, b"x", [])]))
    struct.pack_into(">h", batch, 21, 0x20)
    with pytest.raises(CorruptBatch, match="control"):
        inspect_batch(_recrc(batch))


@given(records, st.data())
def test_split_keeps_every_record_once(items: list, data: st.DataObject) -> None:
    if len(items) < 2:
        return
    batch = build_batch(items, base_offset=100)
    at = data.draw(st.integers(1, len(items) - 1))
    head, tail = split_batch(batch, at)
    assert read_records(head) + read_records(tail) == read_records(batch)
    assert inspect_batch(tail).base_offset == 100 + at


def test_builder_counts_and_sizes() -> None:
    builder = BatchBuilder()
    assert builder.append(None, b"a") == 0
    assert builder.append(b"k", b"b") == 1
    before = builder.size()
    builder.append(None, b"c" * 100)
    assert builder.size() > before + 100
    assert inspect_batch(builder.build()).record_count == 3
    with pytest.raises(ValueError):
        BatchBuilder().build()


def test_documented_batch_vector() -> None:
    """The RecordBatch example in docs/PROTOCOL.md, byte for byte."""
    batch = build_batch([(b"k", b"hello", [("h", b"1")])], timestamp=1_700_000_000_000)
    assert batch.hex() == (
        "0000000000000000"  # base offset
        "00000042"  # batch length: 66
        "ffffffff"  # partition leader epoch
        "02"  # magic
        "5393d5ad"  # CRC-32C
        "0000"  # attributes
        "00000000"  # last offset delta
        "0000018bcfe56800"  # first timestamp
        "0000018bcfe56800"  # max timestamp
        "ffffffffffffffff"  # producer id
        "ffff"  # producer epoch
        "ffffffff"  # base sequence
        "00000001"  # record count
        "20"  # record length 16 (zigzag varint)
        "00"  # attributes
        "00"  # timestamp delta 0
        "00"  # offset delta 0
        "02"
        "6b"  # key length 1, "k"
        "0a"
        "68656c6c6f"  # value length 5, "hello"
        "02"  # header count 1
        "02"
        "68"  # header key length 1, "h"
        "02"
        "31"  # header value length 1, "1"
    )


def test_decoding_leaves_one_object_per_record_for_the_collector() -> None:
    """A consumer builds a message per record. The codec's own record object and its empty
    headers list, kept until the whole batch was built, were two more objects per record that the
    garbage collector counted: three times as many young collections, and the full collections
    that follow them. Built one at a time, with a shared empty headers tuple, a batch of N records
    leaves N objects and triggers about N / threshold young collections."""
    count, threshold = 7_000, 700
    batch = build_batch([(None, b"v", [])] * 6_999 + [(b"k", b"v", [("h", b"1")])])
    young_collections = 0

    def counted(phase: str, info: dict[str, int]) -> None:
        nonlocal young_collections
        if phase == "start" and info["generation"] == 0:
            young_collections += 1

    saved = gc.get_threshold()
    gc.collect()
    gc.set_threshold(threshold, *saved[1:])
    gc.callbacks.append(counted)
    try:
        built = decode_records(batch, lambda *fields: list(fields))
    finally:
        gc.callbacks.remove(counted)
        gc.set_threshold(*saved)
    assert len(built) == count
    assert all(fields[4] is NO_HEADERS for fields in built[:-1])
    assert built[-1][4] == (("h", b"1"),)
    assert young_collections <= count // threshold + 1, young_collections
