"""Cluster: LOOKUP (which broker owns each partition of the topics named; version 1 may wait for
a partition's new owner, a long poll).

Rare (a client asks once per topic, then on NOT_OWNER or a lost connection), so the schemas do
the work, with two guards: the arrays' counts are checked against `wire.limits.MAX_LOOKUP_TOPICS`
and `MAX_LOOKUP_WAITS` before any element is parsed (`BoundedArray`), so a frame of millions of
one-byte names costs a few bytes' work, not seconds of construct's parse (no client stalls the
others), and each name's length against `MAX_TOPIC_NAME_LENGTH` before it is read (`TopicName`):
an answer quoting 100 names of 64 KiB took construct 270 ms to encode.
"""

from __future__ import annotations

from typing import Any, Final

from construct import Computed, Construct, Int16sb, Int32sb, Int64sb, PrefixedArray, Select
from construct.core import stream_read

from headwater.wire import messages as m
from headwater.wire.api.base import U16, Api, BoundedArray, String, message, older_message
from headwater.wire.errors import InvalidRequest, MalformedFrame
from headwater.wire.limits import MAX_LOOKUP_TOPICS, MAX_LOOKUP_WAITS, MAX_TOPIC_NAME_LENGTH

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


class TopicName(Construct):  # type: ignore[misc]
    """A topic name (uint16 length + UTF-8) whose length is checked before it is read: over
    MAX_TOPIC_NAME_LENGTH no topic has it, and an answer quoting it would be large."""

    def _parse(self, stream: Any, context: Any, path: Any) -> Any:
        (length,) = U16.unpack(stream_read(stream, 2, path))
        if length > MAX_TOPIC_NAME_LENGTH:
            raise InvalidRequest(
                f"LOOKUP names a topic of {length} bytes; topic names are at most "
                f"{MAX_TOPIC_NAME_LENGTH}"
            )
        try:
            return stream_read(stream, length, path).decode()
        except UnicodeDecodeError:
            raise MalformedFrame("malformed LOOKUP: topic name is not valid UTF-8") from None

    def _build(self, obj: Any, stream: Any, context: Any, path: Any) -> Any:
        return String._build(obj, stream, context, path)


LOOKUP_TOPICS = BoundedArray(MAX_LOOKUP_TOPICS, "LOOKUP topics", TopicName())
LOOKUP_WAIT = message(m.LookupWait, "topic" / TopicName(), "partition" / Int32sb, "epoch" / Int64sb)


APIS: Final = (
    Api(
        m.ApiKey.LOOKUP,
        message(
            m.LookupRequest,
            "topics" / LOOKUP_TOPICS,
            "max_wait_ms" / Int32sb,
            "wait_for" / BoundedArray(MAX_LOOKUP_WAITS, "LOOKUP wait_for", LOOKUP_WAIT),
        ),
        message(
            m.LookupResponse,
            "brokers" / PrefixedArray(Int32sb, LOOKUP_BROKER),
            "topics" / PrefixedArray(Int32sb, LOOKUP_TOPIC),
            # added later, at the end: an older client ignores it (a response's trailing bytes
            # are never an error), and an older server's answer, which ends before it, reads 0
            "lease_ms" / Select(Int32sb, Computed(0)),
        ),
        version=1,
        older=(older_message(m.LookupRequest, "topics" / LOOKUP_TOPICS),),
    ),
)
