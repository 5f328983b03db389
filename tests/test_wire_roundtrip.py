"""Every message survives encode -> decode; the struct fast paths agree with construct."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headwater.wire import messages as m
from headwater.wire.api.produce import (
    decode_produce_request,
    delivery_prefix,
    produce_request_parts,
)
from headwater.wire.errors import HeadwaterError, MalformedFrame, UnsupportedVersion
from headwater.wire.frames import Frame, FrameDecoder
from headwater.wire.protocol import (
    PUSH_SCHEMAS,
    SCHEMAS,
    SUPPORTED_VERSIONS,
    decode_push,
    decode_request,
    decode_response,
    encode_push,
    encode_request,
    encode_response,
)

names = st.text(min_size=0, max_size=40)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
i8 = st.integers(-128, 127)
i16 = st.integers(-(2**15), 2**15 - 1)

configs = st.lists(st.builds(m.ConfigEntry, names, names), max_size=3).map(tuple)
acks = st.lists(st.builds(m.AckEntry, i32, i64), max_size=5).map(tuple)
ack_ranges = st.lists(st.builds(m.AckRange, i32, i64, i32), max_size=5).map(tuple)
byte_keys = st.lists(st.binary(max_size=10), max_size=3).map(tuple)
nullable = st.one_of(st.none(), st.binary(max_size=20))
settings = st.builds(
    m.SubscriptionSettings, i8, i64, i32, i32, i8, i32, i32, st.booleans(), i8, byte_keys, nullable
)
map_entries = st.lists(
    st.builds(m.MapEntry, st.binary(max_size=10), st.booleans(), i64, i32, i64, nullable),
    max_size=3,
).map(tuple)
requests = st.one_of(
    st.builds(m.ProduceRequest, names, i32, st.binary(max_size=200), i8),
    st.just(m.InitProducerIdRequest()),
    st.builds(m.MapGetRequest, names, byte_keys),
    st.builds(
        m.MapSetRequest,
        names,
        st.lists(st.builds(m.MapWrite, st.binary(max_size=10), nullable, i64), max_size=3).map(
            tuple
        ),
    ),
    st.builds(m.MapScanRequest, names, st.binary(max_size=10), i32, st.binary(max_size=10)),
    st.builds(m.MapSizeRequest, names),
    st.builds(m.SubscribeRequest, names, names, i8, names, i32, i32, settings),
    st.builds(m.FlowRequest, i32, i32),
    st.builds(m.AckRequest, i32, acks, i8),
    st.builds(m.AckRangesRequest, i32, ack_ranges),
    st.builds(m.NackRequest, i32, acks, i32),
    st.builds(m.SeekRequest, names, names, i8, i64),
    st.builds(m.DeleteSubscriptionRequest, names, names),
    st.builds(m.UnsubscribeRequest, i32),
    st.builds(m.FetchRequest, names, i32, i64, i32, i32, i8),
    st.builds(m.InitTransactionsRequest, names, i32, i64, i16),
    st.builds(
        m.AddPartitionsToTxnRequest, names, i64, i16, names, st.lists(i32, max_size=5).map(tuple)
    ),
    st.builds(m.AddAcksToTxnRequest, names, i64, i16, names, names, ack_ranges, acks),
    st.builds(m.EndTxnRequest, names, i64, i16, st.booleans()),
    st.builds(m.CreateTopicRequest, names, i32, i8, configs),
    st.builds(m.DeleteTopicRequest, names),
    st.just(m.ListTopicsRequest()),
    st.builds(m.DescribeTopicRequest, names),
    st.just(m.ApiVersionsRequest()),
    st.builds(m.AlterTopicConfigsRequest, names, configs),
    st.builds(m.ListSubscriptionsRequest, names),
    st.just(m.ServerInfoRequest()),
)
topic_infos = st.builds(m.TopicInfo, names, i32, i8, configs)
consumer_infos = st.builds(m.ConsumerInfo, i32, names, i32, i32, st.booleans())
subscription_infos = st.builds(
    m.SubscriptionInfo,
    names,
    i8,
    i64,
    i64,
    i64,
    st.lists(consumer_infos, max_size=3).map(tuple),
    i64,
    i64,
)
partition_infos = st.builds(m.PartitionInfo, i32, i64, i64, i64, i64, i32, i64, i64, i64)
subscription_details = st.builds(
    m.SubscriptionDetail,
    names, names, i8, i8, i32, i64, i64, i64, i64, i64, i64, i64,
    st.lists(
        st.builds(m.SubscriptionPartition, i32, i64, i64, i64, i64, i64, i64, i64, i64),
        max_size=3,
    ).map(tuple),
)  # fmt: skip
responses = st.one_of(
    st.tuples(st.just(m.ApiKey.PRODUCE), st.builds(m.ProduceResponse, i32, i64)),
    st.tuples(st.just(m.ApiKey.SUBSCRIBE), st.builds(m.SubscribeResponse, i32)),
    st.tuples(
        st.just(m.ApiKey.FETCH),
        st.builds(m.FetchResponse, i64, i64, st.binary(max_size=200), i64),
    ),
    st.tuples(st.just(m.ApiKey.INIT_TRANSACTIONS), st.builds(m.InitProducerIdResponse, i64, i16)),
    st.tuples(st.just(m.ApiKey.END_TXN), st.just(m.EmptyResponse())),
    st.tuples(st.just(m.ApiKey.INIT_PRODUCER_ID), st.builds(m.InitProducerIdResponse, i64, i16)),
    st.tuples(st.just(m.ApiKey.MAP_GET), st.builds(m.MapGetResponse, map_entries)),
    st.tuples(
        st.just(m.ApiKey.MAP_SET),
        st.builds(m.MapSetResponse, st.lists(i64, max_size=3).map(tuple)),
    ),
    st.tuples(
        st.just(m.ApiKey.MAP_SCAN),
        st.builds(m.MapScanResponse, map_entries, st.binary(max_size=10)),
    ),
    st.tuples(st.just(m.ApiKey.MAP_SIZE), st.builds(m.MapSizeResponse, i64)),
    st.tuples(st.just(m.ApiKey.FLOW), st.just(m.EmptyResponse())),
    st.tuples(
        st.just(m.ApiKey.LIST_TOPICS),
        st.builds(m.ListTopicsResponse, st.lists(topic_infos, max_size=4).map(tuple)),
    ),
    st.tuples(
        st.just(m.ApiKey.DESCRIBE_TOPIC),
        st.builds(
            m.DescribeTopicResponse,
            topic_infos,
            st.lists(i64, max_size=4).map(tuple),
            st.lists(i64, max_size=4).map(tuple),
            i64,
            i64,
            st.lists(subscription_infos, max_size=3).map(tuple),
            st.lists(partition_infos, max_size=3).map(tuple),
        ),
    ),
    st.tuples(
        st.just(m.ApiKey.ALTER_TOPIC_CONFIGS), st.builds(m.AlterTopicConfigsResponse, topic_infos)
    ),
    st.tuples(
        st.just(m.ApiKey.LIST_SUBSCRIPTIONS),
        st.builds(
            m.ListSubscriptionsResponse, st.lists(subscription_details, max_size=3).map(tuple)
        ),
    ),
    st.tuples(
        st.just(m.ApiKey.SERVER_INFO),
        st.builds(m.ServerInfoResponse, names, i64, i64, i32, i32, i32, names, i64),
    ),
    st.tuples(
        st.just(m.ApiKey.API_VERSIONS),
        st.builds(
            m.ApiVersionsResponse,
            st.lists(st.builds(m.ApiVersionRange, i16, i16, i16), max_size=4).map(tuple),
        ),
    ),
)


def _one_frame(data: bytes) -> Frame:
    (frame,) = FrameDecoder().feed(data)
    assert isinstance(frame, Frame)
    return frame


@given(requests, i32)
def test_request_round_trip(request: m.Request, correlation_id: int) -> None:
    frame = _one_frame(encode_request(request, correlation_id))
    assert frame.header.correlation_id == correlation_id
    assert decode_request(frame.header, frame.body) == request


@given(responses, i32)
def test_response_round_trip(pair: tuple[int, Any], correlation_id: int) -> None:
    api_key, response = pair
    frame = _one_frame(encode_response(api_key, correlation_id, response))
    assert frame.header.is_response
    assert decode_response(frame.header, frame.body) == response


@given(st.builds(m.Delivery, i32, i32, st.binary(max_size=100)), i32)
def test_delivery_fast_path_matches_schema(delivery: m.Delivery, consumer_id: int) -> None:
    fast = (
        delivery_prefix(
            consumer_id, delivery.partition, len(delivery.batch), delivery.delivery_count
        )
        + delivery.batch
    )
    assert fast == encode_push(consumer_id, delivery)
    frame = _one_frame(fast)
    assert decode_push(frame.header, frame.body) == delivery
    assert PUSH_SCHEMAS[m.ApiKey.DELIVER].parse(frame.body) == delivery


@given(st.builds(m.ProduceRequest, names, i32, st.binary(max_size=100), i8))
def test_produce_fast_path_matches_schema(request: m.ProduceRequest) -> None:
    schema = SCHEMAS[m.ApiKey.PRODUCE][0]
    prefix, batch = produce_request_parts(request, 1)
    body = (prefix + batch)[14:]
    assert body == schema.build(request)
    assert decode_produce_request(body) == schema.parse(body) == request


@given(st.binary(max_size=64))
def test_produce_fast_path_rejects_what_the_schema_rejects(body: bytes) -> None:
    schema = SCHEMAS[m.ApiKey.PRODUCE][0]
    try:
        expected: Any = schema.parse(body)
    except Exception:
        expected = None
    try:
        actual: Any = decode_produce_request(body)
    except HeadwaterError:
        actual = None
    assert actual == expected


@given(st.builds(m.MapGetRequest, names, byte_keys))
def test_map_get_fast_path_matches_schema(request: m.MapGetRequest) -> None:
    from headwater.wire.api.maps import decode_map_get_request, encode_map_get_request

    schema = SCHEMAS[m.ApiKey.MAP_GET][0]
    body = schema.build(request)
    assert encode_map_get_request(request, 5)[14:] == body
    assert decode_map_get_request(body) == schema.parse(body) == request


@given(st.binary(max_size=64))
def test_map_get_fast_path_rejects_what_the_schema_rejects(body: bytes) -> None:
    from headwater.wire.api.maps import decode_map_get_request

    schema = SCHEMAS[m.ApiKey.MAP_GET][0]
    try:
        expected: Any = schema.parse(body)
        if len(schema.build(expected)) != len(body):
            expected = None  # construct ignores trailing bytes; the fast path refuses them
    except Exception:
        expected = None
    try:
        actual: Any = decode_map_get_request(body)
    except HeadwaterError:
        actual = None
    assert actual == expected


@given(st.builds(m.MapGetResponse, map_entries), i32)
def test_map_get_response_fast_path_matches_schema(response: m.MapGetResponse, cid: int) -> None:
    from headwater.wire.api.maps import encode_map_get_response

    schema = SCHEMAS[m.ApiKey.MAP_GET][1]
    fast = encode_map_get_response(cid, response)
    assert fast[16:] == schema.build(response)
    frame = _one_frame(fast)
    assert decode_response(frame.header, frame.body) == response


map_writes = st.lists(st.builds(m.MapWrite, st.binary(max_size=10), nullable, i64), max_size=3).map(
    tuple
)


@given(st.builds(m.MapSetRequest, names, map_writes))
def test_map_set_fast_path_matches_schema(request: m.MapSetRequest) -> None:
    from headwater.wire.api.maps import decode_map_set_request, encode_map_set_request

    schema = SCHEMAS[m.ApiKey.MAP_SET][0]
    body = schema.build(request)
    assert encode_map_set_request(request, 3)[14:] == body
    assert decode_map_set_request(body) == schema.parse(body) == request


def test_the_map_set_decoder_reads_columns_and_they_stand_for_the_writes() -> None:
    """The server's decoder builds no `MapWrite` per write: `writes` is a `WriteColumns`, which
    the map handler reads as columns, and which is to everything else the tuple of writes."""
    from headwater.wire.api.maps import WriteColumns, decode_map_set_request

    writes = (m.MapWrite(b"a", b"1", -1), m.MapWrite(b"b", None, 7), m.MapWrite(b"c", b"", -2))
    request = m.MapSetRequest("t", writes)
    decoded = decode_map_set_request(SCHEMAS[m.ApiKey.MAP_SET][0].build(request))
    columns = decoded.writes
    assert type(decoded) is m.MapSetRequest and isinstance(columns, WriteColumns)
    assert (columns.keys, columns.values, columns.expected) == (
        (b"a", b"b", b"c"),
        (b"1", None, b""),
        (-1, 7, -2),
    )
    assert decoded == request and request == decoded and hash(decoded) == hash(request)
    assert list(columns) == list(writes) and columns[1] == writes[1] and columns[1:] == writes[1:]
    assert len(columns) == 3 and repr(decoded) == repr(request)


@given(st.binary(max_size=64))
def test_map_set_fast_path_rejects_what_the_schema_rejects(body: bytes) -> None:
    from headwater.wire.api.maps import decode_map_set_request

    schema = SCHEMAS[m.ApiKey.MAP_SET][0]
    try:
        expected: Any = schema.parse(body)
        if len(schema.build(expected)) != len(body):
            expected = None
    except Exception:
        expected = None
    try:
        actual: Any = decode_map_set_request(body)
    except HeadwaterError:
        actual = None
    assert actual == expected


@given(st.builds(m.MapSetResponse, st.lists(i64, max_size=4).map(tuple)), i32)
def test_map_set_response_fast_path_matches_schema(response: m.MapSetResponse, cid: int) -> None:
    from headwater.wire.api.maps import encode_map_set_response

    assert encode_map_set_response(cid, response)[16:] == SCHEMAS[m.ApiKey.MAP_SET][1].build(
        response
    )


@given(
    st.one_of(
        st.builds(m.SubscribeRequest, names, names, i8, names, i32, i32, settings),
        st.builds(
            m.SubscribeRequest,
            names,
            names,
            i8,
            names,
            i32,
            i32,
            settings,
            st.lists(i32, max_size=5).map(tuple),
        ),
        st.builds(m.AckRequest, i32, acks, i8),
        st.builds(m.AckRangesRequest, i32, ack_ranges),
        st.builds(m.NackRequest, i32, acks, i32),
    )
)
def test_consume_fast_paths_match_their_schemas(request: m.Request) -> None:
    from headwater.wire.protocol import APIS, REQUEST_API_KEYS

    api = APIS[REQUEST_API_KEYS[type(request)]]
    body = api.request.build(request)
    assert api.decode_request is not None
    assert api.decode_request(body) == api.request.parse(body) == request
    if api.encode_request is not None:  # ACK, ACK_RANGES, NACK: a consumer's per-message acks
        frame = _one_frame(api.encode_request(request, 7, 0))
        assert (frame.header.api_key, frame.header.correlation_id) == (api.key, 7)
        assert frame.body == body


@given(
    st.sampled_from([m.ApiKey.SUBSCRIBE, m.ApiKey.ACK, m.ApiKey.ACK_RANGES, m.ApiKey.NACK]),
    st.binary(max_size=96),
)
def test_consume_fast_paths_reject_what_their_schemas_reject(key: int, body: bytes) -> None:
    from headwater.wire.api.base import parse_request
    from headwater.wire.protocol import APIS

    api = APIS[key]
    assert api.decode_request is not None
    try:
        expected: Any = parse_request(api.request, body, "request")
    except HeadwaterError:
        expected = None
    try:
        actual: Any = api.decode_request(body)
    except HeadwaterError:
        actual = None
    assert actual == expected


@given(st.builds(m.FetchResponse, i64, i64, st.binary(max_size=200), i64), i32)
def test_fetch_response_fast_paths_match_the_schema(
    response: m.FetchResponse, correlation_id: int
) -> None:
    from headwater.wire.api.consume import decode_fetch_response, encode_fetch_response

    schema = SCHEMAS[m.ApiKey.FETCH][1]
    body = schema.build(response)
    assert encode_fetch_response(correlation_id, response)[16:] == body
    assert decode_fetch_response(body) == schema.parse(body) == response
    assert decode_fetch_response(body[:-1]) is None  # cut short: the schema names the error


def test_trailing_bytes_after_a_request_are_refused() -> None:
    for request in (
        m.CreateTopicRequest("t"),
        m.MapGetRequest("t", (b"k",)),
        m.SubscribeRequest("t", "s", 0, "c"),
        m.AckRequest(1, (m.AckEntry(0, 1),)),
        m.AckRangesRequest(1, (m.AckRange(0, 1, 5),)),
        m.LookupRequest(("t",)),
    ):
        frame = _one_frame(encode_request(request, 1))
        assert decode_request(frame.header, frame.body) == request
        data = bytearray(encode_request(request, 1) + b"\x00")
        data[0:4] = (len(data) - 4).to_bytes(4, "big")
        padded = _one_frame(bytes(data))
        try:
            decode_request(padded.header, padded.body)
        except MalformedFrame as exc:
            assert "after the" in exc.message, exc.message
        else:
            raise AssertionError(f"{type(request).__name__} with a trailing byte was accepted")


@given(st.builds(m.FetchRequest, names, i32, i64, i32, i32), i32)
def test_a_version_0_fetch_decodes_as_a_committed_read(
    request: m.FetchRequest, correlation_id: int
) -> None:
    """FETCH is at version 1 (`isolation` added at its end): the version 0 layout, without it,
    still decodes, as isolation 0 (COMMITTED); a version past 1 is UNSUPPORTED_VERSION."""
    assert SUPPORTED_VERSIONS[m.ApiKey.FETCH] == (0, 1)
    current = _one_frame(encode_request(request, correlation_id))
    assert current.header.api_version == 1
    version_0 = current.body[:-1]  # the layout without its last field
    header = replace(current.header, api_version=0)
    assert decode_request(header, version_0) == replace(
        request, isolation=m.FetchIsolation.COMMITTED
    )
    with pytest.raises(MalformedFrame):  # each version's layout, exactly
        decode_request(header, current.body)
    with pytest.raises(UnsupportedVersion):
        decode_request(replace(current.header, api_version=2), current.body)


def test_server_info_fields_added_at_the_end_keep_both_sides_working() -> None:
    """SERVER_INFO grows at its end (issue 41: the open-files limit and the partitions it
    allows): a client that knows fewer fields reads a newer answer, ignoring the bytes after
    them, and this client reads an older server's shorter answer with 0 for the new fields."""
    from construct import Struct

    from headwater.wire.api import admin

    api = next(a for a in admin.APIS if a.key == m.ApiKey.SERVER_INFO)
    fields = api.response.subcon.subcons
    names = [f.name for f in fields]
    assert names[-2:] == ["open_files_limit", "partitions_allowed"]
    older = Struct(*fields[:-2])  # the layout before them
    info = m.ServerInfoResponse("1.0", 1, 2, 3, 4, 5, "/d", 6, 7, 8, 9, (), 1024, 384)
    body = api.response.build(info)
    assert len(body) == len(older.build(older.parse(body))) + 16
    assert older.parse(body).data_dir == "/d"  # the old client's parse
    short = older.build(older.parse(body))  # an older server's answer
    assert api.response.parse(short) == m.ServerInfoResponse(
        "1.0", 1, 2, 3, 4, 5, "/d", 6, 7, 8, 9, (), 0, 0
    )
    assert api.response.parse(body) == info
