"""The Kafka codec without a server: every served request and response declaration matches Kafka's
published JSON schema of the same version (the copy kafka-python 3 ships, independent of
aiokafka's hand-written one), requests decode to what aiokafka encodes, and hostile bodies
(array counts past the bytes left, truncated fields, bytes left over) are refused before any
loop over their elements."""

from __future__ import annotations

import json
import re
import struct
import time
from pathlib import Path
from typing import Any

import kafka.protocol.schemas as kafka_schemas
import pytest
from aiokafka.protocol.fetch import FetchRequest_v4
from aiokafka.protocol.metadata import MetadataRequest_v1
from aiokafka.protocol.produce import ProduceRequest_v3
from aiokafka.protocol.types import (
    Array,
    Boolean,
    Bytes,
    CompactArray,
    CompactBytes,
    CompactString,
    Float64,
    Int8,
    Int16,
    Int32,
    Int64,
    Schema,
    String,
    TaggedFields,
)

from headwater.server.kafka import codec
from headwater.server.kafka.apis import API_VERSIONS, SERVED

RESOURCES = Path(kafka_schemas.__file__).parent / "resources"
_PRIMITIVES = {
    Int8: "int8",
    Int16: "int16",
    Int32: "int32",
    Int64: "int64",
    Float64: "float64",
    Boolean: "bool",
    Bytes: "bytes",
    CompactBytes: "bytes",
}


def _in(spec: str, version: int) -> bool:
    if spec == "none":
        return False
    if spec.endswith("+"):
        return version >= int(spec[:-1])
    low, _, high = spec.partition("-")
    return int(low) <= version <= int(high or low)


def _ours(field: Any, flexible: bool) -> Any:
    """An aiokafka field as ("int32" | "string" | ("[]", inner) | [fields...]); compactness
    checked against `flexible` on the way."""
    if isinstance(field, Schema):
        names = list(zip(field.names, field.fields, strict=True))
        if flexible:
            assert names and names[-1][1] is TaggedFields, "a flexible struct ends in tags"
            names = names[:-1]
        out: list[Any] = []
        for _, f in names:
            if isinstance(f, Schema):  # a struct inside a struct: its fields, on the wire
                out.extend(_ours(f, flexible))
            else:
                out.append(_ours(f, flexible))
        return out
    if isinstance(field, Array):
        assert isinstance(field, CompactArray) == flexible
        return ("[]", _ours(field.array_of, flexible))
    if isinstance(field, String):
        assert isinstance(field, CompactString) == flexible
        return "string"
    if field in (Bytes, CompactBytes):
        assert (field is CompactBytes) == flexible
    return _PRIMITIVES[field]


def _published(fields: list[dict[str, Any]], version: int) -> list[Any]:
    """Kafka's JSON fields present at `version`, tagged ones left out (they travel in the tags)."""
    out: list[Any] = []
    for field in fields:
        if not _in(field["versions"], version) or "tag" in field:
            continue
        kind = field["type"]
        inner = kind[2:] if kind.startswith("[]") else kind
        if "fields" in field:
            shape: Any = _published(field["fields"], version)
            if len(shape) == 1:  # a struct of one field is that field on the wire
                shape = shape[0]
        else:
            shape = {"records": "bytes", "uint16": "int16"}.get(inner, inner)
        out.append(("[]", shape) if kind.startswith("[]") else shape)
    return out


def _json(name: str) -> dict[str, Any]:
    text = (RESOURCES / f"{name}.json").read_text()
    return dict(json.loads(re.sub(r"//.*", "", text)))


_FILES = {
    8: "OffsetCommit",
    9: "OffsetFetch",
    10: "FindCoordinator",
    11: "JoinGroup",
    12: "Heartbeat",
    13: "LeaveGroup",
    14: "SyncGroup",
    15: "DescribeGroups",
    16: "ListGroups",
    22: "InitProducerId",
    32: "DescribeConfigs",
    33: "AlterConfigs",
    44: "IncrementalAlterConfigs",
    37: "CreatePartitions",
    17: "SaslHandshake",
    36: "SaslAuthenticate",
    0: "Produce",
    1: "Fetch",
    2: "ListOffsets",
    3: "Metadata",
    18: "ApiVersions",
    19: "CreateTopics",
    20: "DeleteTopics",
}


@pytest.mark.parametrize(
    ("key", "version"),
    [(a.key, v) for a in SERVED.values() for v in range(a.min_version, a.max_version + 1)],
)
def test_every_served_version_is_kafkas_published_schema(key: int, version: int) -> None:
    api = SERVED[key]
    for kind, ours in (("Request", api.requests[version]), ("Response", api.responses[version])):
        published = _json(f"{_FILES[key]}{kind}")
        flexible = _in(published["flexibleVersions"], version)
        assert api.flexible(version) == flexible
        assert _ours(ours, flexible) == _published(published["fields"], version), (kind, version)


def test_requests_decode_to_what_aiokafka_encodes() -> None:
    produce = ProduceRequest_v3(None, -1, 30000, [("t", [(0, b"batch"), (1, None)])])
    fields = codec.decode_body(
        codec.Reader(produce.encode()), SERVED[0].requests[3], SERVED[0].nullable
    )
    assert fields == {
        "transactional_id": None,
        "required_acks": -1,
        "timeout": 30000,
        "topics": [
            {
                "topic": "t",
                "partitions": [
                    {"partition": 0, "messages": b"batch"},
                    {"partition": 1, "messages": None},
                ],
            }
        ],
    }
    fetch = FetchRequest_v4(-1, 500, 1, 1024, 0, [("t", [(0, 7, 100)])])
    decoded = codec.decode_body(codec.Reader(fetch.encode()), SERVED[1].requests[4])
    assert decoded["topics"][0]["partitions"] == [{"partition": 0, "offset": 7, "max_bytes": 100}]


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
    fields = codec.decode_body(reader, SERVED[API_VERSIONS].requests[3])
    assert fields["client_software_name"] == "rdkf"
    assert fields["client_software_version"] == "2.0"


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
        codec.decode_body(codec.Reader(body), MetadataRequest_v1.SCHEMA)


def test_a_huge_count_is_refused_before_any_element_is_read() -> None:
    """Two billion Produce partitions in a 60-byte body: refused from the count alone, at once."""
    body = struct.pack(">hii", 1, 30000, 1) + b"\x00\x01t" + struct.pack(">i", 2**31 - 1)
    body = struct.pack(">h", -1) + body + bytes(40)
    started = time.perf_counter()
    with pytest.raises(codec.MalformedKafka, match="cannot fit"):
        codec.decode_body(codec.Reader(body), SERVED[0].requests[3])
    assert time.perf_counter() - started < 0.01


def test_a_compact_count_and_tagged_fields_are_bounded_too() -> None:
    schema = SERVED[API_VERSIONS].responses[3]
    huge = b"\x00\x00" + b"\xff\xff\xff\xff\x07" + bytes(10)  # a compact array of 2^31-2
    with pytest.raises(codec.MalformedKafka, match="cannot fit"):
        codec.decode_body(codec.Reader(huge), schema)
    with pytest.raises(codec.MalformedKafka, match="tagged fields"):
        codec.Reader(b"\xff\xff\xff\x0f" + bytes(8)).tagged()
    with pytest.raises(codec.MalformedKafka, match="longer than 5"):
        codec.Reader(b"\xff" * 8).uvarint()


def test_responses_take_each_versions_own_fields() -> None:
    """One set of values, two versions: v0 has no throttle time, v1 adds it at the end."""
    values = {"error_code": 0, "api_versions": [{"api_key": 0, "min_version": 3, "max_version": 8}]}
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
    assert len(codec.decode_body(codec.Reader(one), SERVED[1].requests[4])["topics"]) == 1


def test_a_null_reads_as_empty_unless_the_api_declares_it_nullable() -> None:
    """Metadata v1's null topics means every topic; the same null in a Fetch is no topics."""
    null = struct.pack(">i", -1)
    metadata = codec.decode_body(codec.Reader(null), SERVED[3].requests[1], SERVED[3].nullable)
    assert metadata == {"topics": None}
    fetch = struct.pack(">iiiib", -1, 0, 0, 1024, 0) + null
    decoded = codec.decode_body(codec.Reader(fetch), SERVED[1].requests[4], SERVED[1].nullable)
    assert decoded["topics"] == []
