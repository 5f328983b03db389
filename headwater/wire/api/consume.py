"""Consuming: SUBSCRIBE, FLOW, ACK, ACK_RANGES, NACK, SEEK, UNSUBSCRIBE, DELETE_SUBSCRIPTION,
FETCH, OFFSET_FOR_TIME, and the CONSUMER_CLOSED and MESSAGES_DROPPED pushes. DELIVER is in
`wire.api.produce`, beside PRODUCE, because both carry a record batch through unchanged.

FLOW and ACK are batched per event-loop turn by the client, so construct's cost is paid once per
turn, not per message; but a request's worst case must stay far under a millisecond per
thousand elements, which construct's interpreted parse is not (10,000 acks took 250 ms), so
SUBSCRIBE, ACK, ACK_RANGES and NACK are decoded by struct fast paths (`Reader`), equal to their
schemas (tests/test_wire_roundtrip.py). Every array's count is checked against its `wire.limits`
maximum before its elements are read.

FETCH's answer carries up to MAX_FETCH_BYTES of record batches as one bytes field: struct encodes
and decodes it around the batches (the construct schema would copy megabytes through its
interpreted build), equal to the schema (tested). FETCH is at version 1 (`isolation` added); a
version 0 request, without it, reads as `FetchIsolation.COMMITTED`.
"""

from __future__ import annotations

import struct
from itertools import starmap
from typing import Final

from construct import Flag, Int8sb, Int16sb, Int32sb, Int64sb

from headwater.wire import messages as m
from headwater.wire.api.base import (
    EMPTY_RESPONSE,
    I32,
    OK,
    Api,
    BoundedArray,
    Bytes,
    BytesTuple,
    NullableBytes,
    PushApi,
    Reader,
    String,
    message,
    older_message,
)
from headwater.wire.frames import Flags, frame_prefix
from headwater.wire.limits import (
    MAX_ACK_RANGES_PER_REQUEST,
    MAX_ACKS_PER_REQUEST,
    MAX_SUBSCRIBE_PARTITIONS,
    MAX_SUBSCRIPTION_KEYS,
)

ACK_ENTRY = message(m.AckEntry, "partition" / Int32sb, "offset" / Int64sb)
ACK_RANGE = message(m.AckRange, "partition" / Int32sb, "first_offset" / Int64sb, "count" / Int32sb)
ACK_ENTRIES = BoundedArray(MAX_ACKS_PER_REQUEST, "acks", ACK_ENTRY)  # for older imports (codec)
SUBSCRIPTION_SETTINGS = message(
    m.SubscriptionSettings,
    "start" / Int8sb,
    "start_value" / Int64sb,
    "ack_timeout_ms" / Int32sb,
    "max_deliveries" / Int32sb,
    "backoff" / Int8sb,
    "backoff_initial_ms" / Int32sb,
    "backoff_max_ms" / Int32sb,
    "committed_only" / Flag,
    "durable" / Int8sb,
    "keys" / BytesTuple(BoundedArray(MAX_SUBSCRIPTION_KEYS, "SUBSCRIBE settings.keys", Bytes)),
    "key_prefix" / NullableBytes,
)

_I8 = struct.Struct(">b")
_I32 = struct.Struct(">i")
_I32_I8 = struct.Struct(">ib")
_I32_I32 = struct.Struct(">ii")
_ACK_ENTRY = struct.Struct(">iq")
_ACK_RANGE = struct.Struct(">iqi")
# start, start_value, ack_timeout_ms, max_deliveries, backoff, backoff_initial_ms,
# backoff_max_ms, committed_only, durable
_SETTINGS_FIXED = struct.Struct(">bqiibiiBb")


def decode_subscribe_request(body: bytes) -> m.Request:
    """The fast path for SUBSCRIBE: equivalent to its schema (tested)."""
    reader = Reader(body, "SUBSCRIBE")
    topic = reader.string()
    subscription = reader.string()
    (sub_type,) = reader.fixed(_I8)
    consumer_name = reader.string()
    priority, initial_credits = reader.fixed(_I32_I32)
    fixed = reader.fixed(_SETTINGS_FIXED)
    count = reader.count(MAX_SUBSCRIPTION_KEYS, "settings.keys", 4)
    keys = tuple(reader.blob() for _ in range(count))
    key_prefix = reader.nullable_bytes()
    count = reader.count(MAX_SUBSCRIBE_PARTITIONS, "partitions", 4)
    partitions = struct.unpack_from(f">{count}i", body, reader.position)
    reader.position += 4 * count
    reader.end()
    start, start_value, ack_timeout, max_deliveries, backoff, initial, most, committed, durable = (
        fixed
    )
    settings = m.SubscriptionSettings(
        start,
        start_value,
        ack_timeout,
        max_deliveries,
        backoff,
        initial,
        most,
        committed != 0,
        durable,
        keys,
        key_prefix,
    )
    return m.SubscribeRequest(
        topic,
        subscription,
        sub_type,
        consumer_name,
        priority,
        initial_credits,
        settings,
        partitions,
    )


def _ack_entries(reader: Reader) -> tuple[m.AckEntry, ...]:
    count = reader.count(MAX_ACKS_PER_REQUEST, "acks", _ACK_ENTRY.size)
    start = reader.position
    reader.position += count * _ACK_ENTRY.size
    reader.end()
    return tuple(starmap(m.AckEntry, _ACK_ENTRY.iter_unpack(reader.body[start:])))


_FETCH_HEAD = struct.Struct(">qqi")  # start_offset, end_offset, records length
_FETCH_TAIL = struct.Struct(">q")  # next_offset


def encode_fetch_response(correlation_id: int, response: m.FetchResponse) -> bytes:
    """The fast path for FETCH's answer: equal to its schema (tested)."""
    records = response.records
    head = OK + _FETCH_HEAD.pack(response.start_offset, response.end_offset, len(records))
    tail = _FETCH_TAIL.pack(response.next_offset)
    size = len(head) + len(records) + len(tail)
    prefix = frame_prefix(m.ApiKey.FETCH, 0, correlation_id, Flags.RESPONSE, size)
    return b"".join((prefix, head, records, tail))  # one copy of the batches


def decode_fetch_response(body: bytes) -> m.Response | None:
    """The fast path for FETCH's answer (the body after the error code), or None for the schema
    to name what is wrong with it."""
    if len(body) < _FETCH_HEAD.size:
        return None
    start, end, length = _FETCH_HEAD.unpack_from(body, 0)
    records_end = _FETCH_HEAD.size + length
    if length < 0 or len(body) != records_end + _FETCH_TAIL.size:
        return None
    (following,) = _FETCH_TAIL.unpack_from(body, records_end)
    return m.FetchResponse(start, end, body[_FETCH_HEAD.size : records_end], following)


def _ack_entries_bytes(acks: tuple[m.AckEntry, ...] | list[m.AckEntry]) -> bytes:
    pack = _ACK_ENTRY.pack
    return I32.pack(len(acks)) + b"".join([pack(a.partition, a.offset) for a in acks])


def encode_ack_request(request: m.AckRequest, correlation_id: int, flags: int = 0) -> bytes:
    """The fast path for ACK's encoding: equal to its schema (tested). A consumer acking message
    by message sends one entry per message; construct built each at 30,000 instructions."""
    body = _I32_I8.pack(request.consumer_id, request.kind) + _ack_entries_bytes(request.acks)
    return frame_prefix(m.ApiKey.ACK, 0, correlation_id, flags, len(body)) + body


def encode_nack_request(request: m.NackRequest, correlation_id: int, flags: int = 0) -> bytes:
    """The fast path for NACK's encoding: equal to its schema (tested)."""
    body = _I32_I32.pack(request.consumer_id, request.delay_ms) + _ack_entries_bytes(request.acks)
    return frame_prefix(m.ApiKey.NACK, 0, correlation_id, flags, len(body)) + body


def decode_ack_request(body: bytes) -> m.Request:
    """The fast path for ACK: equivalent to its schema (tested)."""
    reader = Reader(body, "ACK")
    consumer_id, kind = reader.fixed(_I32_I8)
    return m.AckRequest(consumer_id, _ack_entries(reader), kind)


def encode_ack_ranges_request(
    request: m.AckRangesRequest, correlation_id: int, flags: int = 0
) -> bytes:
    """The fast path for ACK_RANGES' encoding: equal to its schema (tested)."""
    pack = _ACK_RANGE.pack
    ranges = request.ranges
    body = b"".join(
        [
            _I32_I32.pack(request.consumer_id, len(ranges)),
            *[pack(r.partition, r.first_offset, r.count) for r in ranges],
        ]
    )
    return frame_prefix(m.ApiKey.ACK_RANGES, 0, correlation_id, flags, len(body)) + body


def decode_ack_ranges_request(body: bytes) -> m.Request:
    """The fast path for ACK_RANGES: equivalent to its schema (tested)."""
    reader = Reader(body, "ACK_RANGES")
    (consumer_id,) = reader.fixed(I32)
    count = reader.count(MAX_ACK_RANGES_PER_REQUEST, "ranges", _ACK_RANGE.size)
    start = reader.position
    reader.position += count * _ACK_RANGE.size
    reader.end()
    ranges = tuple(starmap(m.AckRange, _ACK_RANGE.iter_unpack(body[start : reader.position])))
    return m.AckRangesRequest(consumer_id, ranges)


def decode_nack_request(body: bytes) -> m.Request:
    """The fast path for NACK: equivalent to its schema (tested)."""
    reader = Reader(body, "NACK")
    consumer_id, delay_ms = reader.fixed(_I32_I32)
    return m.NackRequest(consumer_id, _ack_entries(reader), delay_ms)


APIS: Final = (
    Api(
        m.ApiKey.SUBSCRIBE,
        message(
            m.SubscribeRequest,
            "topic" / String,
            "subscription" / String,
            "sub_type" / Int8sb,
            "consumer_name" / String,
            "priority" / Int32sb,
            "initial_credits" / Int32sb,
            "settings" / SUBSCRIPTION_SETTINGS,
            "partitions" / BoundedArray(MAX_SUBSCRIBE_PARTITIONS, "SUBSCRIBE partitions", Int32sb),
        ),
        message(m.SubscribeResponse, "consumer_id" / Int32sb),
        decode_request=decode_subscribe_request,
    ),
    Api(
        m.ApiKey.FLOW,
        message(m.FlowRequest, "consumer_id" / Int32sb, "credits" / Int32sb),
        EMPTY_RESPONSE,
    ),
    Api(
        m.ApiKey.ACK,
        message(
            m.AckRequest,
            "consumer_id" / Int32sb,
            "kind" / Int8sb,
            "acks" / BoundedArray(MAX_ACKS_PER_REQUEST, "ACK acks", ACK_ENTRY),
        ),
        EMPTY_RESPONSE,
        encode_request=encode_ack_request,
        decode_request=decode_ack_request,
    ),
    Api(
        m.ApiKey.ACK_RANGES,
        message(
            m.AckRangesRequest,
            "consumer_id" / Int32sb,
            "ranges" / BoundedArray(MAX_ACK_RANGES_PER_REQUEST, "ACK_RANGES ranges", ACK_RANGE),
        ),
        EMPTY_RESPONSE,
        encode_request=encode_ack_ranges_request,
        decode_request=decode_ack_ranges_request,
    ),
    Api(
        m.ApiKey.NACK,
        message(
            m.NackRequest,
            "consumer_id" / Int32sb,
            "delay_ms" / Int32sb,
            "acks" / BoundedArray(MAX_ACKS_PER_REQUEST, "NACK acks", ACK_ENTRY),
        ),
        EMPTY_RESPONSE,
        encode_request=encode_nack_request,
        decode_request=decode_nack_request,
    ),
    Api(
        m.ApiKey.SEEK,
        message(
            m.SeekRequest,
            "topic" / String,
            "subscription" / String,
            "start" / Int8sb,
            "start_value" / Int64sb,
        ),
        EMPTY_RESPONSE,
    ),
    Api(
        m.ApiKey.DELETE_SUBSCRIPTION,
        message(m.DeleteSubscriptionRequest, "topic" / String, "subscription" / String),
        EMPTY_RESPONSE,
    ),
    Api(
        m.ApiKey.OFFSET_FOR_TIME,
        message(
            m.OffsetForTimeRequest,
            "topic" / String,
            "partition" / Int32sb,
            "timestamp" / Int64sb,
        ),
        message(m.OffsetForTimeResponse, "offset" / Int64sb),
    ),
    Api(
        m.ApiKey.FETCH,
        message(
            m.FetchRequest,
            "topic" / String,
            "partition" / Int32sb,
            "offset" / Int64sb,
            "max_bytes" / Int32sb,
            "max_wait_ms" / Int32sb,
            "isolation" / Int8sb,
        ),
        message(
            m.FetchResponse,
            "start_offset" / Int64sb,
            "end_offset" / Int64sb,
            "records" / Bytes,
            "next_offset" / Int64sb,
        ),
        encode_response=encode_fetch_response,
        decode_response=decode_fetch_response,
        version=1,
        older=(
            older_message(
                m.FetchRequest,
                "topic" / String,
                "partition" / Int32sb,
                "offset" / Int64sb,
                "max_bytes" / Int32sb,
                "max_wait_ms" / Int32sb,
            ),
        ),
    ),
    Api(
        m.ApiKey.UNSUBSCRIBE,
        message(m.UnsubscribeRequest, "consumer_id" / Int32sb),
        EMPTY_RESPONSE,
    ),
)

PUSHES: Final = (
    PushApi(
        m.ApiKey.CONSUMER_CLOSED,
        message(m.ConsumerClosed, "error_code" / Int16sb, "message" / String),
    ),
    PushApi(m.ApiKey.MESSAGES_DROPPED, message(m.MessagesDropped, "count" / Int64sb)),
)
