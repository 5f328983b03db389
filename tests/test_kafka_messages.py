"""The typed Kafka messages without a server: the classes are what tools/kafka_messages.py writes
from Kafka's published JSON specs, every served API round-trips at every served version through
our codec and the byte encoding of two stock clients (kafka-python 3's encoders and decoders, and
aiokafka's hand-written schemas where it declares the version), and handlers take and return the
typed classes without a socket."""

from __future__ import annotations

import asyncio
import importlib
import io
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from headwater.server.kafka import codec
from headwater.server.kafka.apis import (
    SERVED,
    SHARE_ACKNOWLEDGE,
    SHARE_FETCH,
    SHARE_GROUP_DESCRIBE,
    SHARE_GROUP_HEARTBEAT,
)
from headwater.server.kafka.group_handlers import GroupHandlers
from headwater.server.kafka.groups import Coordinator
from headwater.server.kafka.handlers import (
    Throttled,
    _fetch_partitions,
    closes_after,
    produce_bytes,
    throttled,
)
from headwater.server.kafka.kafka_errors import NOT_COORDINATOR, SASL_AUTHENTICATION_FAILED
from headwater.server.kafka.kafka_nodes import SingleNode
from headwater.server.kafka.messages import fetch, groups, produce, sasl
from headwater.server.kafka.messages.declare import Field, Message, Struct
from headwater.server.kafka.messages.metadata import ApiVersionsResponse

ROOT = Path(__file__).resolve().parent.parent
SHARE_APIS = (SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE)
# ConsumerGroupHeartbeat, ConsumerGroupDescribe and the share group APIs
KAFKA_PYTHON_LACKS = {68, 69, *SHARE_APIS}
_INTS = {"int8": 7, "int16": 1_000, "uint16": 60_000, "int32": 100_000, "int64": 2**40}
_CASES = [
    (api.key, version, kind)
    for api in SERVED.values()
    for version in range(api.min_version, api.max_version + 1)
    for kind in ("request", "response")
]


def _layout(key: int, version: int, kind: str) -> codec.Layout[Any]:
    api = SERVED[key]
    return api.requests[version] if kind == "request" else api.responses[version]


def _one(field: Field, version: int, n: int) -> Any:
    kind = field.type
    if isinstance(kind, type):
        return sample(kind, version, n)
    if kind in _INTS:
        return _INTS[kind] + n % 100
    if kind == "bool":
        return n % 2 == 0
    if kind == "float64":
        return 1.5 + n
    if kind == "string":
        return f"s{n}-é"
    if kind == "uuid":
        return bytes([n % 256, *range(1, 16)])
    return bytes([n % 256, 1, 2, 3])  # bytes, records


def sample(cls: type[Struct], version: int, n: int = 0) -> Any:
    """A `cls` with a value other than its default in every field of `version`, two elements in
    every array."""
    values: dict[str, Any] = {}
    for i, field in enumerate(cls.FIELDS):
        if field.within(version):
            m = n * 10 + i
            values[field.name] = (
                [_one(field, version, m), _one(field, version, m + 1)]
                if field.array
                else _one(field, version, m)
            )
    return cls(**values)


def _kafka_python(message: type[Message]) -> Any:
    """kafka-python 3's class of the same message (written from the same JSON specs by other
    code: an independent encoder and decoder); None for the share group APIs, which it lacks
    (their bytes are checked against librdkafka's in tests/test_kafka_share_groups.py)."""
    for package in ("producer", "consumer", "metadata", "admin"):
        module = importlib.import_module(f"kafka.protocol.{package}")
        found = getattr(module, message.__name__, None)
        if found is not None:
            return found
    return importlib.import_module("kafka.protocol.sasl").__dict__.get(message.__name__)


# fields kafka-python names otherwise than the spec does
def _theirs(cls: type[Struct], value: Any, version: int) -> Any:
    """kafka-python's decoded `value` read through our declarations: the same shape as ours."""
    values: dict[str, Any] = {}
    for field in cls.FIELDS:
        if not field.within(version):
            continue
        if field.name.endswith("authorized_operations") and not hasattr(value, field.name):
            # kafka-python decodes Metadata's bitfield into a set of the bits set, renamed
            got = sum(1 << bit for bit in value.authorized_operations)
        else:
            got = getattr(value, field.name)
        kind = field.type
        if isinstance(kind, type):
            got = [_theirs(kind, item, version) for item in got]
        elif isinstance(got, bytearray | memoryview):
            got = bytes(got)
        elif isinstance(got, uuid.UUID):
            got = got.bytes
        elif field.array:
            got = list(got)
        values[field.name] = got
    return cls(**values)


@pytest.mark.parametrize(("key", "version", "kind"), _CASES)
def test_every_served_message_round_trips_through_kafka_pythons_codec(
    key: int, version: int, kind: str
) -> None:
    layout = _layout(key, version, kind)
    ours = sample(layout.message, version)
    if isinstance(ours, ApiVersionsResponse):  # an error is answered in v0's layout (KIP-511)
        ours = replace(ours, error_code=0)
    body = codec.encode(layout, ours)
    assert codec.decode_body(codec.Reader(body), layout) == ours
    stock = _kafka_python(layout.message)
    if stock is None:  # checked against hand-laid bytes and stock clients instead
        assert layout.message.API_KEY in KAFKA_PYTHON_LACKS  # (test_kafka_consumer_protocol.py,
        # test_kafka_share_groups.py)
        return
    decoded = stock.decode(body, version=version)
    assert _theirs(layout.message, decoded, version) == ours
    decoded._header = None  # what kafka-python decoded has no header slot set
    assert bytes(decoded.encode(version=version)) == body


def _aiokafka(key: int, version: int, kind: str) -> Any:
    """aiokafka's hand-written schema of the version, None where it declares none."""
    from aiokafka.protocol import (
        admin,
        api,
        commit,
        coordination,
        fetch,
        group,
        metadata,
        offset,
        produce,
        transaction,
    )

    modules = (admin, commit, coordination, fetch, group, metadata, offset, produce, transaction)
    wanted = "Request" if kind == "request" else "Response"
    for module in modules:
        for name, value in vars(module).items():
            if (
                name.endswith(f"{wanted}_v{version}")
                and isinstance(value, type)
                and issubclass(value, api.RequestStruct if kind == "request" else api.Response)
                and key == value.API_KEY
            ):
                return value.SCHEMA
    return None


# aiokafka declares every served version but ApiVersions v3 and IncrementalAlterConfigs v0; those
# are checked against kafka-python's decoder above, not here (no case is skipped)
_AIOKAFKA_CASES = [case for case in _CASES if _aiokafka(*case) is not None]


def test_aiokafka_lacks_only_the_versions_it_is_known_to_lack() -> None:
    missing = sorted(
        {(key, version) for key, version, kind in _CASES}
        - {(key, version) for key, version, _ in _AIOKAFKA_CASES}
    )
    # aiokafka declares JoinGroup v5 and SyncGroup v3 (static membership) but not the versions
    # between, nor Heartbeat and LeaveGroup past v1; of the transaction APIs only v0 (it never
    # sends another), and neither DescribeTransactions nor ListTransactions; Metadata to v5;
    # ListGroups to v2; none
    # of KIP-848's nor the share group APIs
    assert missing == sorted(
        [
            *[(3, v) for v in range(6, 13)],  # Metadata past v5 (topic ids from v10)
            (11, 3),
            (11, 4),
            (12, 2),
            (12, 3),
            (13, 2),
            (13, 3),
            (14, 2),
            *[(16, v) for v in range(3, 6)],  # ListGroups past v2 (state, then type filters)
            (18, 3),
            *[(22, v) for v in range(1, 5)],
            *[(key, v) for key in (24, 25, 26, 28) for v in range(1, 4)],
            (44, 0),
            (65, 0),
            (66, 0),
            (66, 1),
            (68, 0),
            (68, 1),
            (69, 0),
            *[(key, 1) for key in SHARE_APIS],
        ]
    )


@pytest.mark.parametrize(("key", "version", "kind"), _AIOKAFKA_CASES)
def test_aiokafkas_schemas_read_and_write_the_same_bytes(key: int, version: int, kind: str) -> None:
    schema = _aiokafka(key, version, kind)
    assert schema is not None
    layout = _layout(key, version, kind)
    body = codec.encode(layout, sample(layout.message, version))
    assert schema.encode(schema.decode(io.BytesIO(body))) == body


def test_fields_a_version_lacks_decode_to_kafkas_defaults() -> None:
    """Fetch v4 has no session, leader epoch or partition log start: Kafka's defaults."""
    layout = SERVED[fetch.FetchRequest.API_KEY].requests[4]
    body = codec.encode(
        layout,
        fetch.FetchRequest(
            max_wait_ms=500,
            min_bytes=1,
            max_bytes=1024,
            topics=[fetch.FetchTopic("t", [fetch.FetchPartition(0, fetch_offset=7)])],
        ),
    )
    decoded = codec.decode_body(codec.Reader(body), layout)
    assert (decoded.session_id, decoded.session_epoch, decoded.rack_id) == (0, -1, "")
    assert decoded.topics[0].partitions[0].current_leader_epoch == -1
    assert decoded.topics[0].partitions[0].log_start_offset == -1


def test_records_are_the_frames_bytes_and_encoded_once() -> None:
    records = bytes(range(256)) * 64
    layout = SERVED[produce.ProduceRequest.API_KEY].requests[3]
    request = produce.ProduceRequest(
        acks=1,
        topic_data=[produce.TopicProduceData("t", [produce.PartitionProduceData(0, records)])],
    )
    decoded = codec.decode_body(codec.Reader(codec.encode(layout, request)), layout)
    assert type(decoded.topic_data[0].partition_data[0].records) is bytes
    assert produce_bytes(decoded) == len(records)
    response = fetch.FetchResponse(
        responses=[
            fetch.FetchableTopicResponse(
                "t",
                [fetch.PartitionData(0, records=memoryview(records))],  # type: ignore[arg-type]
            )
        ]
    )
    frame = codec.encode_response(9, SERVED[1].responses[11], response)
    assert frame.endswith(records) and codec.frame_size(frame) == len(frame) - 4


def test_the_generated_modules_are_what_the_specs_say() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from tools import kafka_messages
    finally:
        sys.path.remove(str(ROOT))
    assert kafka_messages.main(["--check"]) == 0, "run: python -m tools.kafka_messages"


def test_a_fetch_names_each_partition_once_with_its_later_offset() -> None:
    topics = [
        fetch.FetchTopic("a", [fetch.FetchPartition(0, fetch_offset=1, partition_max_bytes=10)]),
        fetch.FetchTopic("b", [fetch.FetchPartition(1, fetch_offset=2, partition_max_bytes=0)]),
        fetch.FetchTopic("a", [fetch.FetchPartition(0, fetch_offset=5, partition_max_bytes=20)]),
    ]
    assert _fetch_partitions(topics) == [("a", 0, 5, 20), ("b", 1, 2, 1)]


def test_a_throttled_produce_and_a_failed_sasl_are_typed_too() -> None:
    request = produce.ProduceRequest(acks=1)
    assert throttled(request, 0.5) == Throttled(request, 0.5)
    assert closes_after(sasl.SaslAuthenticateResponse(error_code=SASL_AUTHENTICATION_FAILED))
    assert not closes_after(sasl.SaslAuthenticateResponse(error_code=0))
    assert not closes_after(None)


class _Session:
    client_id = "unit"
    peer = "127.0.0.1:5555"
    raw_sasl = False
    produce_tail = None
    peercert = None
    auth = None
    consumers: dict[int, Any] = {}


def test_the_group_handlers_take_and_return_typed_messages() -> None:
    """FindCoordinator, JoinGroup, SyncGroup and Heartbeat through `GroupHandlers`, no socket:
    a consumer joins, leads, assigns itself and heartbeats; each answer encodes at every
    version and kafka-python reads it back."""
    session: Any = _Session()

    async def run() -> list[Message]:
        handlers = GroupHandlers(
            Coordinator(),
            None,  # type: ignore[arg-type]  # no offsets asked
            SingleNode("127.0.0.1", 9092),
            lambda *_: True,
            None,  # type: ignore[arg-type]  # no native request made
        )
        found = await handlers.find_coordinator(session, 1, groups.FindCoordinatorRequest("g"))
        request = groups.JoinGroupRequest(
            group_id="g",
            session_timeout_ms=10_000,
            rebalance_timeout_ms=100,
            protocol_type="consumer",
            protocols=[groups.JoinGroupRequestProtocol("range", b"meta")],
        )
        joined = await handlers.join_group(session, 2, request)
        synced = await handlers.sync_group(
            session,
            1,
            groups.SyncGroupRequest(
                "g",
                joined.generation_id,
                joined.member_id,
                assignments=[groups.SyncGroupRequestAssignment(joined.member_id, b"mine")],
            ),
        )
        beat = await handlers.heartbeat(
            session, 1, groups.HeartbeatRequest("g", joined.generation_id, joined.member_id)
        )
        stranger = await handlers.heartbeat(session, 1, groups.HeartbeatRequest("g", 99, "x"))
        return [found, joined, synced, beat, stranger]

    found, joined, synced, beat, stranger = asyncio.run(run())
    assert isinstance(found, groups.FindCoordinatorResponse)
    assert (found.error_code, found.node_id, found.host, found.port) == (0, 0, "127.0.0.1", 9092)
    assert isinstance(joined, groups.JoinGroupResponse) and joined.error_code == 0
    assert joined.leader == joined.member_id and joined.protocol_name == "range"
    assert [(m.member_id, m.metadata) for m in joined.members] == [(joined.member_id, b"meta")]
    assert synced == groups.SyncGroupResponse(error_code=0, assignment=b"mine")
    assert beat == groups.HeartbeatResponse(error_code=0)
    assert isinstance(stranger, groups.HeartbeatResponse) and stranger.error_code not in (
        0,
        NOT_COORDINATOR,
    )
    for response in (found, joined, synced, beat):
        api = SERVED[response.API_KEY]
        for version in range(api.min_version, api.max_version + 1):
            frame = codec.encode_response(1, api.responses[version], response)
            stock = _kafka_python(type(response)).decode(frame[8:], version=version)
            assert stock.error_code == 0


def test_each_handler_takes_the_request_class_the_codec_decodes_for_its_key() -> None:
    """The handler table is keyed by API key, where mypy cannot follow the request's class: each
    handler's annotations name its API's request and response classes."""
    from types import SimpleNamespace
    from typing import get_args, get_type_hints

    from headwater.server.kafka.handlers import KafkaHandlers

    async def build() -> KafkaHandlers:
        broker: Any = SimpleNamespace(catalog=None, transactions=None)
        return KafkaHandlers(broker, "127.0.0.1", 9092, None, 0)

    handlers = asyncio.run(build())
    assert set(handlers.handlers) == set(SERVED)
    for key, handler in handlers.handlers.items():
        hints = get_type_hints(handler)
        api = SERVED[key]
        request = api.requests[api.min_version].message
        response = api.responses[api.min_version].message
        assert request in (hints["request"], *get_args(hints["request"])), api.name
        assert response in (hints["return"], *get_args(hints["return"])), api.name
