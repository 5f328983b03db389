"""PRODUCE and the DELIVER push: the hot paths, in struct, beside their construct schemas.

A produce frame is written as (prefix, batch) so the record batch goes to the socket without a
copy; the server reads it back with `decode_produce_request` (a slice, no parse of the batch) and
answers with the fixed 14-byte `encode_produce_response`. A delivery is `delivery_prefix` followed
by the batch bytes exactly as stored.
"""

from __future__ import annotations

import struct
from typing import Final

from construct import GreedyBytes, Int8sb, Int32sb, Int64sb

from headwater.wire import messages as m
from headwater.wire.api.base import U16, Api, PushApi, String, message
from headwater.wire.errors import MalformedFrame
from headwater.wire.frames import Flags, frame_prefix

_PRODUCE_RESPONSE = struct.Struct(">hiq")  # error code, partition, base offset
_DELIVER_FIELDS = struct.Struct(">ii")  # partition, delivery count
_PARTITION_ISOLATION = struct.Struct(">ib")
_PRODUCE_PREFIX_SIZE: Final = 2 + _PARTITION_ISOLATION.size  # topic length, partition, isolation


def produce_request_parts(
    request: m.ProduceRequest, correlation_id: int, flags: int = 0
) -> tuple[bytes, bytes]:
    """A produce frame as (prefix, batch), so the batch can be written without a copy."""
    topic = request.topic.encode()
    fields = (
        U16.pack(len(topic))
        + topic
        + _PARTITION_ISOLATION.pack(request.partition, request.isolation)
    )
    prefix = frame_prefix(
        m.ApiKey.PRODUCE, 0, correlation_id, flags, len(fields) + len(request.batch)
    )
    return prefix + fields, request.batch


def encode_produce_request(request: m.ProduceRequest, correlation_id: int, flags: int = 0) -> bytes:
    return b"".join(produce_request_parts(request, correlation_id, flags))


def decode_produce_request(body: bytes) -> m.ProduceRequest:
    """The hot-path decoder for produce: equivalent to the construct schema (tested)."""
    if len(body) < _PRODUCE_PREFIX_SIZE:
        raise MalformedFrame("malformed PRODUCE: body shorter than its fixed fields")
    (topic_length,) = U16.unpack_from(body, 0)
    end = 2 + topic_length
    if len(body) < end + _PARTITION_ISOLATION.size:
        raise MalformedFrame("malformed PRODUCE: topic name runs past the end of the frame")
    try:
        topic = body[2:end].decode()
    except UnicodeDecodeError:
        raise MalformedFrame("malformed PRODUCE: topic name is not valid UTF-8") from None
    partition, isolation = _PARTITION_ISOLATION.unpack_from(body, end)
    return m.ProduceRequest(topic, partition, body[end + _PARTITION_ISOLATION.size :], isolation)


def encode_produce_response(correlation_id: int, partition: int, base_offset: int) -> bytes:
    body = _PRODUCE_RESPONSE.pack(0, partition, base_offset)
    return frame_prefix(m.ApiKey.PRODUCE, 0, correlation_id, Flags.RESPONSE, len(body)) + body


def _encode_response(correlation_id: int, response: m.ProduceResponse) -> bytes:
    return encode_produce_response(correlation_id, response.partition, response.base_offset)


_RESPONSE_FIELDS = struct.Struct(">iq")


def _decode_response(body: bytes) -> m.ProduceResponse | None:
    if len(body) != _RESPONSE_FIELDS.size:
        return None  # the schema names what is wrong
    partition, base_offset = _RESPONSE_FIELDS.unpack(body)
    return m.ProduceResponse(partition, base_offset)


def delivery_prefix(
    consumer_id: int, partition: int, batch_size: int, delivery_count: int = 1
) -> bytes:
    """Size prefix, header and fixed fields of a delivery; the batch bytes follow unchanged."""
    return frame_prefix(
        m.ApiKey.DELIVER, 0, consumer_id, Flags.PUSH, _DELIVER_FIELDS.size + batch_size
    ) + _DELIVER_FIELDS.pack(partition, delivery_count)


def _decode_delivery(body: bytes) -> m.Delivery:
    if len(body) < _DELIVER_FIELDS.size:
        raise MalformedFrame("delivery shorter than its fixed fields")
    partition, delivery_count = _DELIVER_FIELDS.unpack_from(body, 0)
    return m.Delivery(partition, delivery_count, body[_DELIVER_FIELDS.size :])


APIS: Final = (
    Api(
        m.ApiKey.PRODUCE,
        message(
            m.ProduceRequest,
            "topic" / String,
            "partition" / Int32sb,
            "isolation" / Int8sb,
            "batch" / GreedyBytes,
        ),
        message(m.ProduceResponse, "partition" / Int32sb, "base_offset" / Int64sb),
        encode_request=encode_produce_request,
        decode_request=decode_produce_request,
        encode_response=_encode_response,
        decode_response=_decode_response,
    ),
)

PUSHES: Final = (
    PushApi(
        m.ApiKey.DELIVER,
        message(
            m.Delivery, "partition" / Int32sb, "delivery_count" / Int32sb, "batch" / GreedyBytes
        ),
        decode=_decode_delivery,
    ),
)
