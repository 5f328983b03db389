"""Bytes <-> messages: `construct` declares every body; `struct` serves the hot paths.

`SCHEMAS` maps each API key to the construct `Struct` of its request body and of its successful
response body. `DataclassAdapter` turns parsed containers into the frozen dataclasses of
`wire.messages` and back, so the declarations are the only description of the layout.

A response body starts with `error_code int16`. When it is not 0 the rest is the error message
(uint16 length + UTF-8) instead of the API's response.

Produce requests, produce responses and deliveries are encoded and decoded with `struct` directly:
construct's interpreted parse costs ~20 us per frame, which would dominate a hot path that is
otherwise a CRC check and a copy (measured in docs/PROTOCOL.md). Tests run a corpus through both
forms and require the same result.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any, Final

from construct import (
    Adapter,
    Construct,
    ConstructError,
    Flag,
    GreedyBytes,
    Int8sb,
    Int16sb,
    Int16ub,
    Int32sb,
    Int64sb,
    PascalString,
    Prefixed,
    PrefixedArray,
    Struct,
)
from construct import Bytes as Bytes_

from wire import messages as m
from wire.errors import (
    HeadwaterError,
    MalformedFrame,
    UnsupportedApi,
    UnsupportedVersion,
    error_for_code,
)
from wire.frames import Flags, FrameHeader, encode_frame, frame_prefix


class DataclassAdapter(Adapter):  # type: ignore[misc]
    """Parses into a frozen dataclass (lists become tuples) and builds from one."""

    def __init__(self, cls: type, subcon: Construct) -> None:
        super().__init__(subcon)
        self.cls = cls
        self.fields = [f.name for f in dataclasses.fields(cls)]
        declared = {sc.name for sc in subcon.subcons}
        if declared != set(self.fields):
            raise TypeError(f"{cls.__name__}: schema fields {declared} != {set(self.fields)}")

    def _decode(self, obj: Any, context: Any, path: Any) -> Any:
        values = {}
        for name in self.fields:
            value = obj[name]
            values[name] = tuple(value) if isinstance(value, list) else value
        return self.cls(**values)

    def _encode(self, obj: Any, context: Any, path: Any) -> Any:
        return {name: getattr(obj, name) for name in self.fields}


String = PascalString(Int16ub, "utf8")
Bytes = Prefixed(Int32sb, GreedyBytes)


class _NullableBytes(Adapter):  # type: ignore[misc]
    """int32 length (-1 for null) and the bytes."""

    def _decode(self, obj: Any, context: Any, path: Any) -> Any:
        return None if obj.length < 0 else bytes(obj.data)

    def _encode(self, obj: Any, context: Any, path: Any) -> Any:
        return {"length": -1, "data": b""} if obj is None else {"length": len(obj), "data": obj}


NullableBytes = _NullableBytes(
    Struct("length" / Int32sb, "data" / Bytes_(lambda this: max(this.length, 0)))
)


class _Tuple(Adapter):  # type: ignore[misc]
    def _decode(self, obj: Any, context: Any, path: Any) -> Any:
        return tuple(bytes(item) for item in obj)

    def _encode(self, obj: Any, context: Any, path: Any) -> Any:
        return list(obj)


def message(cls: type, *fields: Any) -> DataclassAdapter:
    return DataclassAdapter(cls, Struct(*fields))


CONFIG_ENTRIES = PrefixedArray(Int32sb, message(m.ConfigEntry, "name" / String, "value" / String))
TOPIC_INFO = message(
    m.TopicInfo,
    "name" / String,
    "partitions" / Int32sb,
    "dispatch" / Int8sb,
    "configs" / CONFIG_ENTRIES,
)
ACK_ENTRIES = PrefixedArray(Int32sb, message(m.AckEntry, "partition" / Int32sb, "offset" / Int64sb))
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
    "keys" / _Tuple(PrefixedArray(Int32sb, Bytes)),
    "key_prefix" / NullableBytes,
)
MAP_ENTRY = message(
    m.MapEntry,
    "key" / Bytes,
    "found" / Flag,
    "revision" / Int64sb,
    "partition" / Int32sb,
    "timestamp" / Int64sb,
    "value" / NullableBytes,
)
MAP_ENTRIES = PrefixedArray(Int32sb, MAP_ENTRY)
CONSUMER_INFO = message(
    m.ConsumerInfo,
    "consumer_id" / Int32sb,
    "name" / String,
    "priority" / Int32sb,
    "credits" / Int32sb,
    "active" / Flag,
)
SUBSCRIPTION_INFO = message(
    m.SubscriptionInfo,
    "name" / String,
    "sub_type" / Int8sb,
    "pending" / Int64sb,
    "delivered" / Int64sb,
    "dropped" / Int64sb,
    "consumers" / PrefixedArray(Int32sb, CONSUMER_INFO),
    "unacked" / Int64sb,
    "dead_lettered" / Int64sb,
)
EMPTY_RESPONSE = message(m.EmptyResponse)

# api key -> (request schema, response schema)
SCHEMAS: Final[dict[int, tuple[DataclassAdapter, DataclassAdapter]]] = {
    m.ApiKey.PRODUCE: (
        message(
            m.ProduceRequest,
            "topic" / String,
            "partition" / Int32sb,
            "isolation" / Int8sb,
            "batch" / GreedyBytes,
        ),
        message(m.ProduceResponse, "partition" / Int32sb, "base_offset" / Int64sb),
    ),
    m.ApiKey.SUBSCRIBE: (
        message(
            m.SubscribeRequest,
            "topic" / String,
            "subscription" / String,
            "sub_type" / Int8sb,
            "consumer_name" / String,
            "priority" / Int32sb,
            "initial_credits" / Int32sb,
            "settings" / SUBSCRIPTION_SETTINGS,
        ),
        message(m.SubscribeResponse, "consumer_id" / Int32sb),
    ),
    m.ApiKey.FLOW: (
        message(m.FlowRequest, "consumer_id" / Int32sb, "credits" / Int32sb),
        EMPTY_RESPONSE,
    ),
    m.ApiKey.ACK: (
        message(m.AckRequest, "consumer_id" / Int32sb, "kind" / Int8sb, "acks" / ACK_ENTRIES),
        EMPTY_RESPONSE,
    ),
    m.ApiKey.NACK: (
        message(m.NackRequest, "consumer_id" / Int32sb, "delay_ms" / Int32sb, "acks" / ACK_ENTRIES),
        EMPTY_RESPONSE,
    ),
    m.ApiKey.SEEK: (
        message(
            m.SeekRequest,
            "topic" / String,
            "subscription" / String,
            "start" / Int8sb,
            "start_value" / Int64sb,
        ),
        EMPTY_RESPONSE,
    ),
    m.ApiKey.DELETE_SUBSCRIPTION: (
        message(m.DeleteSubscriptionRequest, "topic" / String, "subscription" / String),
        EMPTY_RESPONSE,
    ),
    m.ApiKey.UNSUBSCRIBE: (message(m.UnsubscribeRequest, "consumer_id" / Int32sb), EMPTY_RESPONSE),
    m.ApiKey.CREATE_TOPIC: (
        message(
            m.CreateTopicRequest,
            "name" / String,
            "partitions" / Int32sb,
            "dispatch" / Int8sb,
            "configs" / CONFIG_ENTRIES,
        ),
        EMPTY_RESPONSE,
    ),
    m.ApiKey.DELETE_TOPIC: (message(m.DeleteTopicRequest, "name" / String), EMPTY_RESPONSE),
    m.ApiKey.LIST_TOPICS: (
        message(m.ListTopicsRequest),
        message(m.ListTopicsResponse, "topics" / PrefixedArray(Int32sb, TOPIC_INFO)),
    ),
    m.ApiKey.DESCRIBE_TOPIC: (
        message(m.DescribeTopicRequest, "name" / String),
        message(
            m.DescribeTopicResponse,
            "topic" / TOPIC_INFO,
            "next_offsets" / PrefixedArray(Int32sb, Int64sb),
            "start_offsets" / PrefixedArray(Int32sb, Int64sb),
            "messages_in" / Int64sb,
            "bytes_in" / Int64sb,
            "subscriptions" / PrefixedArray(Int32sb, SUBSCRIPTION_INFO),
        ),
    ),
    m.ApiKey.INIT_PRODUCER_ID: (
        message(m.InitProducerIdRequest),
        message(m.InitProducerIdResponse, "producer_id" / Int64sb, "producer_epoch" / Int16sb),
    ),
    m.ApiKey.MAP_GET: (
        message(m.MapGetRequest, "topic" / String, "keys" / _Tuple(PrefixedArray(Int32sb, Bytes))),
        message(m.MapGetResponse, "entries" / MAP_ENTRIES),
    ),
    m.ApiKey.MAP_SET: (
        message(
            m.MapSetRequest,
            "topic" / String,
            "writes"
            / PrefixedArray(
                Int32sb,
                message(
                    m.MapWrite,
                    "key" / Bytes,
                    "value" / NullableBytes,
                    "expected_revision" / Int64sb,
                ),
            ),
        ),
        message(m.MapSetResponse, "revisions" / PrefixedArray(Int32sb, Int64sb)),
    ),
    m.ApiKey.MAP_SCAN: (
        message(
            m.MapScanRequest,
            "topic" / String,
            "prefix" / Bytes,
            "limit" / Int32sb,
            "after" / Bytes,
        ),
        message(m.MapScanResponse, "entries" / MAP_ENTRIES, "cursor" / Bytes),
    ),
    m.ApiKey.MAP_SIZE: (
        message(m.MapSizeRequest, "topic" / String),
        message(m.MapSizeResponse, "size" / Int64sb),
    ),
    m.ApiKey.API_VERSIONS: (
        message(m.ApiVersionsRequest),
        message(
            m.ApiVersionsResponse,
            "apis"
            / PrefixedArray(
                Int32sb,
                message(
                    m.ApiVersionRange,
                    "api_key" / Int16sb,
                    "min_version" / Int16sb,
                    "max_version" / Int16sb,
                ),
            ),
        ),
    ),
    m.ApiKey.AUTHENTICATE: (
        message(m.AuthenticateRequest, "mechanism" / String, "credentials" / Bytes),
        message(m.AuthenticateResponse, "principal" / String, "expires_ms" / Int64sb),
    ),
}

PUSH_SCHEMAS: Final[dict[int, DataclassAdapter]] = {
    m.ApiKey.DELIVER: message(
        m.Delivery, "partition" / Int32sb, "delivery_count" / Int32sb, "batch" / GreedyBytes
    ),
    m.ApiKey.CONSUMER_CLOSED: message(m.ConsumerClosed, "error_code" / Int16sb, "message" / String),
    m.ApiKey.MESSAGES_DROPPED: message(m.MessagesDropped, "count" / Int64sb),
    m.ApiKey.THROTTLE: message(m.Throttle, "throttle_ms" / Int32sb),
}

REQUEST_API_KEYS: Final = {cls: key for key, (schema, _) in SCHEMAS.items() for cls in [schema.cls]}
PUSH_API_KEYS: Final = {schema.cls: key for key, schema in PUSH_SCHEMAS.items()}

# Every API is at version 0; the table lets a client ask (API_VERSIONS) before relying on one.
SUPPORTED_VERSIONS: Final[dict[int, tuple[int, int]]] = {key: (0, 0) for key in SCHEMAS}

ERROR_HEADER = struct.Struct(">h")
_PRODUCE_RESPONSE = struct.Struct(">hiq")
_DELIVER_FIELDS = struct.Struct(">ii")  # partition, delivery count
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_PARTITION_ISOLATION = struct.Struct(">ib")
_PRODUCE_PREFIX_SIZE: Final = 2 + _PARTITION_ISOLATION.size  # topic length, partition, isolation
_OK = ERROR_HEADER.pack(0)


def check_version(header: FrameHeader) -> None:
    versions = SUPPORTED_VERSIONS.get(header.api_key)
    if versions is None:
        raise UnsupportedApi(f"unknown api key {header.api_key}")
    low, high = versions
    if not low <= header.api_version <= high:
        raise UnsupportedVersion(
            f"api key {header.api_key} version {header.api_version} not supported "
            f"(supported: {low}..{high})"
        )


def _parse(schema: Construct, body: bytes, what: str) -> Any:
    try:
        return schema.parse(body)
    except (ConstructError, UnicodeDecodeError, ValueError, OverflowError) as exc:
        raise MalformedFrame(f"malformed {what}: {exc}") from None


def _build(schema: Construct, value: Any) -> bytes:
    try:
        return bytes(schema.build(value))
    except (ConstructError, UnicodeEncodeError, ValueError, OverflowError, TypeError) as exc:
        raise HeadwaterError(f"cannot encode {type(value).__name__}: {exc}") from None


# Requests


def encode_request(request: m.Request, correlation_id: int, flags: int = 0) -> bytes:
    api_key = REQUEST_API_KEYS[type(request)]
    if api_key == m.ApiKey.PRODUCE:
        assert isinstance(request, m.ProduceRequest)
        return b"".join(produce_request_parts(request, correlation_id, flags))
    if api_key == m.ApiKey.MAP_GET:
        assert isinstance(request, m.MapGetRequest)
        return encode_map_get_request(request, correlation_id, flags)
    if api_key == m.ApiKey.MAP_SET:
        assert isinstance(request, m.MapSetRequest)
        return encode_map_set_request(request, correlation_id, flags)
    schema = SCHEMAS[api_key][0]
    return encode_frame(api_key, 0, correlation_id, flags, _build(schema, request))


def produce_request_parts(
    request: m.ProduceRequest, correlation_id: int, flags: int = 0
) -> tuple[bytes, bytes]:
    """A produce frame as (prefix, batch), so the batch can be written without a copy."""
    topic = request.topic.encode()
    fields = (
        _U16.pack(len(topic))
        + topic
        + _PARTITION_ISOLATION.pack(request.partition, request.isolation)
    )
    prefix = frame_prefix(
        m.ApiKey.PRODUCE, 0, correlation_id, flags, len(fields) + len(request.batch)
    )
    return prefix + fields, request.batch


def decode_request(header: FrameHeader, body: bytes) -> m.Request:
    """Decode a request body; raises a `ProtocolError` subclass on anything invalid."""
    check_version(header)
    if header.api_key == m.ApiKey.PRODUCE:
        return decode_produce_request(body)
    if header.api_key == m.ApiKey.MAP_GET:
        return decode_map_get_request(body)
    if header.api_key == m.ApiKey.MAP_SET:
        return decode_map_set_request(body)
    request: m.Request = _parse(SCHEMAS[header.api_key][0], body, m.ApiKey(header.api_key).name)
    return request


def decode_produce_request(body: bytes) -> m.ProduceRequest:
    """The hot-path decoder for produce: equivalent to the construct schema (tested)."""
    if len(body) < _PRODUCE_PREFIX_SIZE:
        raise MalformedFrame("malformed PRODUCE: body shorter than its fixed fields")
    (topic_length,) = _U16.unpack_from(body, 0)
    end = 2 + topic_length
    if len(body) < end + _PARTITION_ISOLATION.size:
        raise MalformedFrame("malformed PRODUCE: topic name runs past the end of the frame")
    try:
        topic = body[2:end].decode()
    except UnicodeDecodeError:
        raise MalformedFrame("malformed PRODUCE: topic name is not valid UTF-8") from None
    partition, isolation = _PARTITION_ISOLATION.unpack_from(body, end)
    return m.ProduceRequest(topic, partition, body[end + _PARTITION_ISOLATION.size :], isolation)


def decode_map_get_request(body: bytes) -> m.MapGetRequest:
    """The hot-path decoder for map get: equivalent to the construct schema (tested)."""
    if len(body) < 2:
        raise MalformedFrame("malformed MAP_GET: body shorter than its fixed fields")
    (topic_length,) = _U16.unpack_from(body, 0)
    position = 2 + topic_length
    if len(body) < position + 4:
        raise MalformedFrame("malformed MAP_GET: topic name runs past the end of the frame")
    try:
        topic = body[2:position].decode()
    except UnicodeDecodeError:
        raise MalformedFrame("malformed MAP_GET: topic name is not valid UTF-8") from None
    (count,) = _I32.unpack_from(body, position)
    position += 4
    if count < 0 or count * 4 > len(body) - position:
        raise MalformedFrame(f"malformed MAP_GET: {count} keys cannot fit in the frame")
    keys = []
    for _ in range(count):
        if len(body) < position + 4:
            raise MalformedFrame("malformed MAP_GET: key length runs past the end of the frame")
        (length,) = _I32.unpack_from(body, position)
        position += 4
        if length < 0 or position + length > len(body):
            raise MalformedFrame("malformed MAP_GET: key runs past the end of the frame")
        keys.append(body[position : position + length])
        position += length
    if position != len(body):
        raise MalformedFrame("malformed MAP_GET: bytes after the last key")
    return m.MapGetRequest(topic, tuple(keys))


_MAP_ENTRY_FIXED = struct.Struct(">?qiq")  # found, revision, partition, timestamp
_I64 = struct.Struct(">q")


def _take_bytes(
    body: bytes, position: int, what: str, nullable: bool = False
) -> tuple[bytes | None, int]:
    if len(body) < position + 4:
        raise MalformedFrame(f"malformed {what}: length runs past the end of the frame")
    (length,) = _I32.unpack_from(body, position)
    position += 4
    if length < 0:
        if nullable:  # any negative length is null, as the construct schema reads it
            return None, position
        raise MalformedFrame(f"malformed {what}: negative length {length}")
    if position + length > len(body):
        raise MalformedFrame(f"malformed {what}: bytes run past the end of the frame")
    return body[position : position + length], position + length


def _take_topic(body: bytes, what: str) -> tuple[str, int]:
    if len(body) < 2:
        raise MalformedFrame(f"malformed {what}: body shorter than its fixed fields")
    (topic_length,) = _U16.unpack_from(body, 0)
    position = 2 + topic_length
    if len(body) < position:
        raise MalformedFrame(f"malformed {what}: topic name runs past the end of the frame")
    try:
        return body[2:position].decode(), position
    except UnicodeDecodeError:
        raise MalformedFrame(f"malformed {what}: topic name is not valid UTF-8") from None


def decode_map_set_request(body: bytes) -> m.MapSetRequest:
    """The hot-path decoder for map set: equivalent to the construct schema (tested)."""
    topic, position = _take_topic(body, "MAP_SET")
    if len(body) < position + 4:
        raise MalformedFrame("malformed MAP_SET: write count runs past the end of the frame")
    (count,) = _I32.unpack_from(body, position)
    position += 4
    if count < 0 or count * 16 > len(body) - position:
        raise MalformedFrame(f"malformed MAP_SET: {count} writes cannot fit in the frame")
    writes = []
    for _ in range(count):
        write_key, position = _take_bytes(body, position, "MAP_SET")
        value, position = _take_bytes(body, position, "MAP_SET", nullable=True)
        if len(body) < position + 8:
            raise MalformedFrame("malformed MAP_SET: revision runs past the end of the frame")
        (expected,) = _I64.unpack_from(body, position)
        position += 8
        assert write_key is not None
        writes.append(m.MapWrite(write_key, value, expected))
    if position != len(body):
        raise MalformedFrame("malformed MAP_SET: bytes after the last write")
    return m.MapSetRequest(topic, tuple(writes))


def encode_map_set_request(request: m.MapSetRequest, correlation_id: int, flags: int = 0) -> bytes:
    topic = request.topic.encode()
    parts = [_U16.pack(len(topic)), topic, _I32.pack(len(request.writes))]
    for write in request.writes:
        parts += (_I32.pack(len(write.key)), write.key)
        if write.value is None:
            parts.append(_I32.pack(-1))
        else:
            parts += (_I32.pack(len(write.value)), write.value)
        parts.append(_I64.pack(write.expected_revision))
    body = b"".join(parts)
    return frame_prefix(m.ApiKey.MAP_SET, 0, correlation_id, flags, len(body)) + body


def encode_map_set_response(correlation_id: int, response: m.MapSetResponse) -> bytes:
    body = (
        _OK
        + _I32.pack(len(response.revisions))
        + b"".join(_I64.pack(r) for r in response.revisions)
    )
    return frame_prefix(m.ApiKey.MAP_SET, 0, correlation_id, Flags.RESPONSE, len(body)) + body


def encode_map_get_request(request: m.MapGetRequest, correlation_id: int, flags: int = 0) -> bytes:
    """The hot-path encoder for map get: equivalent to the construct schema (tested)."""
    topic = request.topic.encode()
    parts = [_U16.pack(len(topic)), topic, _I32.pack(len(request.keys))]
    for wanted in request.keys:
        parts.append(_I32.pack(len(wanted)))
        parts.append(wanted)
    body = b"".join(parts)
    return frame_prefix(m.ApiKey.MAP_GET, 0, correlation_id, flags, len(body)) + body


def decode_map_get_response(body: bytes) -> m.MapGetResponse:
    """The hot-path decoder for successful map get responses (after the error code)."""
    try:
        (count,) = _I32.unpack_from(body, 0)
        position = 4
        entries = []
        for _ in range(count):
            (length,) = _I32.unpack_from(body, position)
            position += 4
            entry_key = body[position : position + length]
            position += length
            found, revision, partition, timestamp = _MAP_ENTRY_FIXED.unpack_from(body, position)
            position += _MAP_ENTRY_FIXED.size
            (length,) = _I32.unpack_from(body, position)
            position += 4
            value = None if length < 0 else body[position : position + length]
            position += max(length, 0)
            entries.append(m.MapEntry(entry_key, found, revision, partition, timestamp, value))
    except struct.error:
        raise MalformedFrame("malformed MAP_GET response") from None
    return m.MapGetResponse(tuple(entries))


def encode_map_get_response(correlation_id: int, response: m.MapGetResponse) -> bytes:
    """The hot-path encoder for map get responses: equivalent to the construct schema."""
    parts = [_OK, _I32.pack(len(response.entries))]
    for entry in response.entries:
        parts.append(_I32.pack(len(entry.key)))
        parts.append(entry.key)
        parts.append(
            _MAP_ENTRY_FIXED.pack(entry.found, entry.revision, entry.partition, entry.timestamp)
        )
        if entry.value is None:
            parts.append(_I32.pack(-1))
        else:
            parts.append(_I32.pack(len(entry.value)))
            parts.append(entry.value)
    body = b"".join(parts)
    return frame_prefix(m.ApiKey.MAP_GET, 0, correlation_id, Flags.RESPONSE, len(body)) + body


# Responses


def encode_response(api_key: int, correlation_id: int, response: m.Response) -> bytes:
    if type(response) is m.ProduceResponse:
        return encode_produce_response(correlation_id, response.partition, response.base_offset)
    if type(response) is m.MapGetResponse:
        return encode_map_get_response(correlation_id, response)
    if type(response) is m.MapSetResponse:
        return encode_map_set_response(correlation_id, response)
    schema = SCHEMAS[api_key][1]
    return encode_frame(api_key, 0, correlation_id, Flags.RESPONSE, _OK + _build(schema, response))


def encode_produce_response(correlation_id: int, partition: int, base_offset: int) -> bytes:
    body = _PRODUCE_RESPONSE.pack(0, partition, base_offset)
    return frame_prefix(m.ApiKey.PRODUCE, 0, correlation_id, Flags.RESPONSE, len(body)) + body


def encode_error(
    api_key: int, api_version: int, correlation_id: int, error: HeadwaterError
) -> bytes:
    text = error.message.encode()[:4096]
    body = ERROR_HEADER.pack(error.code) + _U16.pack(len(text)) + text
    return encode_frame(api_key, api_version, correlation_id, Flags.RESPONSE, body)


def decode_response(header: FrameHeader, body: bytes) -> m.Response:
    """Decode a response body, raising the matching `HeadwaterError` for an error response."""
    if len(body) < ERROR_HEADER.size:
        raise MalformedFrame("response shorter than its error code")
    (code,) = ERROR_HEADER.unpack_from(body, 0)
    if code != 0:
        text = _parse(String, body[ERROR_HEADER.size :], "error message")
        raise error_for_code(code, text)
    if header.api_key == m.ApiKey.PRODUCE and len(body) == _PRODUCE_RESPONSE.size:
        _, partition, base_offset = _PRODUCE_RESPONSE.unpack(body)
        return m.ProduceResponse(partition, base_offset)
    if header.api_key == m.ApiKey.MAP_GET:
        return decode_map_get_response(body[ERROR_HEADER.size :])
    if header.api_key == m.ApiKey.MAP_SET and len(body) >= 6:
        (count,) = _I32.unpack_from(body, 2)
        if count >= 0 and len(body) == 6 + 8 * count:
            return m.MapSetResponse(tuple(r for (r,) in _I64.iter_unpack(body[6:])))
    schemas = SCHEMAS.get(header.api_key)
    if schemas is None:
        raise UnsupportedApi(f"response for unknown api key {header.api_key}")
    response: m.Response = _parse(schemas[1], body[ERROR_HEADER.size :], "response")
    return response


# Pushed frames


def delivery_prefix(
    consumer_id: int, partition: int, batch_size: int, delivery_count: int = 1
) -> bytes:
    """Size prefix, header and fixed fields of a delivery; the batch bytes follow unchanged."""
    return frame_prefix(
        m.ApiKey.DELIVER, 0, consumer_id, Flags.PUSH, _DELIVER_FIELDS.size + batch_size
    ) + _DELIVER_FIELDS.pack(partition, delivery_count)


def encode_push(consumer_id: int, push: m.Push) -> bytes:
    api_key = PUSH_API_KEYS[type(push)]
    return encode_frame(api_key, 0, consumer_id, Flags.PUSH, _build(PUSH_SCHEMAS[api_key], push))


def decode_push(header: FrameHeader, body: bytes) -> m.Push:
    if header.api_key == m.ApiKey.DELIVER:
        if len(body) < _DELIVER_FIELDS.size:
            raise MalformedFrame("delivery shorter than its fixed fields")
        partition, delivery_count = _DELIVER_FIELDS.unpack_from(body, 0)
        return m.Delivery(partition, delivery_count, body[_DELIVER_FIELDS.size :])
    schema = PUSH_SCHEMAS.get(header.api_key)
    if schema is None:
        raise UnsupportedApi(f"unknown pushed api key {header.api_key}")
    push: m.Push = _parse(schema, body, "pushed frame")
    return push
