"""Cluster: LOOKUP (which broker owns each partition of the topics named).

Rare (a client asks once per topic, then on NOT_OWNER or a lost connection), so the schemas do
the work, except for one guard: the request's topic count is checked against
`wire.limits.MAX_LOOKUP_TOPICS` before any name is parsed, so a frame of millions of one-byte
names costs a few bytes' work, not seconds of construct's parse (no client stalls the others), and
each name against `MAX_TOPIC_NAME_LENGTH`: an answer quoting 100 names of 64 KiB took construct
270 ms to encode.
"""

from __future__ import annotations

from typing import Final

from construct import Computed, Int16sb, Int32sb, Int64sb, PrefixedArray, Select

from headwater.wire import messages as m
from headwater.wire.api.base import I32, U16, Api, String, message
from headwater.wire.errors import InvalidRequest, MalformedFrame
from headwater.wire.limits import MAX_LOOKUP_TOPICS, MAX_TOPIC_NAME_LENGTH

LOOKUP_PARTITION = message(
    m.LookupPartition, "partition" / Int32sb, "broker_id" / String, "epoch" / Int64sb
)
LOOKUP_TOPIC = message(
    m.LookupTopic,
    "name" / String,
    "error_code" / Int16sb,
    "error_message" / String,
    "partitions" / PrefixedArray(Int32sb, LOOKUP_PARTITION),
)
LOOKUP_BROKER = message(m.LookupBroker, "broker_id" / String, "host" / String, "port" / Int32sb)


def decode_lookup_request(body: bytes) -> m.Request:
    """int32 count (at most MAX_LOOKUP_TOPICS), then each name: uint16 length + UTF-8."""
    if len(body) < 4:
        raise MalformedFrame("malformed LOOKUP: body shorter than its topic count")
    (count,) = I32.unpack_from(body, 0)
    if count < 0:
        raise MalformedFrame(f"malformed LOOKUP: negative topic count {count}")
    if count > MAX_LOOKUP_TOPICS:
        raise InvalidRequest(f"LOOKUP names {count} topics; at most {MAX_LOOKUP_TOPICS} at once")
    position, topics = 4, []
    for _ in range(count):
        if len(body) < position + 2:
            raise MalformedFrame("malformed LOOKUP: topic name runs past the end of the frame")
        (length,) = U16.unpack_from(body, position)
        position += 2
        if length > MAX_TOPIC_NAME_LENGTH:  # no topic has it; and its answer would quote it
            raise InvalidRequest(
                f"LOOKUP names a topic of {length} bytes; topic names are at most "
                f"{MAX_TOPIC_NAME_LENGTH}"
            )
        if len(body) < position + length:
            raise MalformedFrame("malformed LOOKUP: topic name runs past the end of the frame")
        try:
            topics.append(body[position : position + length].decode())
        except UnicodeDecodeError:
            raise MalformedFrame("malformed LOOKUP: topic name is not valid UTF-8") from None
        position += length
    if position != len(body):
        raise MalformedFrame(
            f"malformed LOOKUP: {len(body) - position} bytes after the end of the request"
        )
    return m.LookupRequest(tuple(topics))


APIS: Final = (
    Api(
        m.ApiKey.LOOKUP,
        message(m.LookupRequest, "topics" / PrefixedArray(Int32sb, String)),
        message(
            m.LookupResponse,
            "brokers" / PrefixedArray(Int32sb, LOOKUP_BROKER),
            "topics" / PrefixedArray(Int32sb, LOOKUP_TOPIC),
            # added later, at the end: an older client ignores it (a response's trailing bytes
            # are never an error), and an older server's answer, which ends before it, reads 0
            "lease_ms" / Select(Int32sb, Computed(0)),
        ),
        decode_request=decode_lookup_request,
    ),
)
