"""The Kafka codec without a server: requests decode to their typed classes from what aiokafka
encodes, and hostile bodies (array counts past the bytes left, truncated fields, bytes left over)
are refused before any loop over their elements. tests/test_kafka_messages.py round-trips every
served message against the stock clients' encodings."""

from __future__ import annotations

import re
import struct
import time
from pathlib import Path

import pytest
from aiokafka.protocol.fetch import FetchRequest_v4
from aiokafka.protocol.produce import ProduceRequest_v3

from headwater.server.kafka import codec
from headwater.server.kafka.apis import API_VERSIONS, SERVED
from headwater.server.kafka.messages.fetch import FetchPartition, FetchTopic
from headwater.server.kafka.messages.metadata import ApiVersion, ApiVersionsResponse
from headwater.server.kafka.messages.produce import (
    PartitionProduceData,
    ProduceRequest,
    TopicProduceData,
)


def test_requests_decode_to_what_aiokafka_encodes() -> None:
    produce = ProduceRequest_v3(None, -1, 30000, [("t", [(0, b"batch"), (1, None)])])
    request = codec.decode_body(codec.Reader(produce.encode()), SERVED[0].requests[3])
    assert request == ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=30000,
        topic_data=[
            TopicProduceData("t", [PartitionProduceData(0, b"batch"), PartitionProduceData(1)])
        ],
    )
    fetch = FetchRequest_v4(-1, 500, 1, 1024, 0, [("t", [(0, 7, 100)])])
    decoded = codec.decode_body(codec.Reader(fetch.encode()), SERVED[1].requests[4])
    assert decoded.topics == [
        FetchTopic("t", [FetchPartition(0, fetch_offset=7, partition_max_bytes=100)])
    ]


def test_a_flexible_api_versions_request_and_its_header_decode() -> None:
    body = struct.pack(">hhih", API_VERSIONS, 3, 9, 3) + b"kcx" + b"\x00"  # header v2
    body += b"\x05rdkf" + b"\x042.0" + b"\x00"  # compact strings (length + 1), no tags
    header, reader = codec.read_header(body, True)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        18,
        3,
        9,
        "kcx",
    )
    request = codec.decode_body(reader, SERVED[API_VERSIONS].requests[3])
    assert request.client_software_name == "rdkf"
    assert request.client_software_version == "2.0"


@pytest.mark.parametrize(
    "body",
    [
        # Metadata v1: 2^31-1 topics announced, 4 bytes follow
        struct.pack(">i", 2**31 - 1) + b"\x00\x01ab",
        # one more topic than the bytes left can hold at 2 bytes each (an empty name)
        struct.pack(">i", 3) + b"\x00\x00\x00\x00",
        # a count below -1
        struct.pack(">i", -7),
        # a name longer than the body
        struct.pack(">i", 1) + b"\x7f\xffab",
        # truncated inside the count
        b"\x00\x00",
        # a whole topic, then bytes the schema does not have
        struct.pack(">i", 1) + b"\x00\x01a" + b"\xff",
        # not UTF-8
        struct.pack(">i", 1) + b"\x00\x02\xff\xfe",
    ],
)
def test_hostile_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(codec.MalformedKafka):
        codec.decode_body(codec.Reader(body), SERVED[3].requests[1])


def test_a_huge_count_is_refused_before_any_element_is_read() -> None:
    """Two billion Produce partitions in a 60-byte body: refused from the count alone, at once."""
    body = struct.pack(">hii", 1, 30000, 1) + b"\x00\x01t" + struct.pack(">i", 2**31 - 1)
    body = struct.pack(">h", -1) + body + bytes(40)
    started = time.perf_counter()
    with pytest.raises(codec.MalformedKafka, match="cannot fit"):
        codec.decode_body(codec.Reader(body), SERVED[0].requests[3])
    assert time.perf_counter() - started < 0.01


def test_a_compact_count_and_tagged_fields_are_bounded_too() -> None:
    layout = SERVED[API_VERSIONS].responses[3]
    huge = b"\x00\x00" + b"\xff\xff\xff\xff\x07" + bytes(10)  # a compact array of 2^31-2
    with pytest.raises(codec.MalformedKafka, match="cannot fit"):
        codec.decode_body(codec.Reader(huge), layout)
    with pytest.raises(codec.MalformedKafka, match="tagged fields"):
        codec.Reader(b"\xff\xff\xff\x0f" + bytes(8)).tagged()
    with pytest.raises(codec.MalformedKafka, match="longer than 5"):
        codec.Reader(b"\xff" * 8).uvarint()


def test_responses_take_each_versions_own_fields() -> None:
    """One set of values, two versions: v0 has no throttle time, v1 adds it at the end."""
    values = ApiVersionsResponse(error_code=0, api_keys=[ApiVersion(0, 3, 8)])
    v0 = codec.encode_response(5, SERVED[API_VERSIONS].responses[0], values)
    v1 = codec.encode_response(5, SERVED[API_VERSIONS].responses[1], values)
    assert v0[4:] == struct.pack(">ihi", 5, 0, 1) + struct.pack(">hhh", 0, 3, 8)
    assert v1[4:] == v0[4:] + struct.pack(">i", 0)
    assert struct.unpack(">i", v1[:4])[0] == len(v1) - 4


def test_docs_kafka_md_lists_every_api_and_version_served() -> None:
    """docs/KAFKA.md's table of APIs is the listener's: same keys, same version ranges."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "KAFKA.md").read_text()
    listed = {
        (int(key), versions.strip())
        for name, key, versions in re.findall(r"^\| (\w+) \| (\d+) \| ([\d-]+) \|", text, re.M)
    }
    served = {
        (
            a.key,
            f"{a.min_version}-{a.max_version}"
            if a.min_version != a.max_version
            else str(a.min_version),
        )
        for a in SERVED.values()
    }
    assert listed == served


def test_the_elements_of_one_request_are_bounded_in_all() -> None:
    """Each array fits its bytes, but together they announce more partitions than a request
    may carry: refused before the handlers see them."""
    partitions = struct.pack(">i", 30_000) + bytes(30_000 * 16)  # (partition, offset, max_bytes)
    topic = b"\x00\x01t" + partitions
    body = struct.pack(">iiiib", -1, 0, 0, 1024, 0) + struct.pack(">i", 2) + topic + topic
    with pytest.raises(codec.MalformedKafka, match="array elements"):
        codec.decode_body(codec.Reader(body), SERVED[1].requests[4])
    one = struct.pack(">iiiib", -1, 0, 0, 1024, 0) + struct.pack(">i", 1) + topic
    assert len(codec.decode_body(codec.Reader(one), SERVED[1].requests[4]).topics) == 1


def test_a_null_reads_as_empty_unless_the_api_declares_it_nullable() -> None:
    """Metadata v1's null topics means every topic; the same null in a Fetch is no topics."""
    null = struct.pack(">i", -1)
    metadata = codec.decode_body(codec.Reader(null), SERVED[3].requests[1])
    assert metadata.topics is None
    fetch = struct.pack(">iiiib", -1, 0, 0, 1024, 0) + null
    decoded = codec.decode_body(codec.Reader(fetch), SERVED[1].requests[4])
    assert decoded.topics == ()


def test_librdkafkas_every_topic_metadata_request_with_its_three_extra_bytes_decodes() -> None:
    """librdkafka asks for every topic at Metadata v9+ with a 4-byte space for the topics'
    count holding a 1-byte null: 3 zero bytes follow, which Kafka's broker ignores (and so do
    we, for Metadata alone); the same bytes after another flexible request are an error."""
    metadata = SERVED[3].requests[12]
    body = b"\x00" + b"\x00\x00\x00" + b"\x01\x00\x00"  # null topics, the 3 bytes, the rest
    decoded = codec.decode_body(codec.Reader(body), metadata)
    assert decoded.topics is None and not decoded.allow_auto_topic_creation
    heartbeat = SERVED[76].requests[1]
    valid = codec.encode(heartbeat, heartbeat.message(group_id="g", member_id="m"))
    with pytest.raises(codec.MalformedKafka, match="bytes left"):
        codec.decode_body(codec.Reader(valid + b"\x00\x00\x00"), heartbeat)
