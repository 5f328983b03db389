"""The messages of LOOKUP: which broker owns each partition of some topics (a cluster).

Kept apart from `wire.messages` so that module stays small; it re-exports every class here, so
code names them `messages.X` like any other message. Any broker answers LOOKUP for every topic;
an unknown topic is reported in its `LookupTopic` (error_code, message), not as a failed request.
Layout: `wire.api.cluster`; meaning: docs/PROTOCOL.md and docs/CLUSTER.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from headwater.wire.errors import ErrorCode
from headwater.wire.limits import MAX_TOPIC_NAME_LENGTH

_MAX_QUOTED = MAX_TOPIC_NAME_LENGTH + 1

__all__ = [
    "LookupBroker",
    "LookupPartition",
    "LookupRequest",
    "LookupResponse",
    "LookupTopic",
]


@dataclass(frozen=True, slots=True)
class LookupRequest:
    topics: tuple[str, ...]  # at most wire.limits.MAX_LOOKUP_TOPICS; none: the brokers only


@dataclass(frozen=True, slots=True)
class LookupBroker:
    broker_id: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class LookupPartition:
    partition: int
    broker_id: str  # "" while nobody owns it (a hand-off or a failover under way)
    epoch: int  # grows each time the partition changes owner (0 on a single broker)


@dataclass(frozen=True, slots=True)
class LookupTopic:
    name: str
    error_code: int  # 0, or the error for this topic alone (UNKNOWN_TOPIC, ...)
    error_message: str
    partitions: tuple[LookupPartition, ...]

    @classmethod
    def unknown(cls, name: str) -> LookupTopic:
        """The answer for a topic that does not exist, or that the principal has no grant on:
        the same bytes, so the answer does not tell which."""
        # a name longer than any topic's is cut in the message: it must fit its uint16 length
        shown = name if len(name) <= _MAX_QUOTED else name[:_MAX_QUOTED] + "..."
        return cls(name, ErrorCode.UNKNOWN_TOPIC, f"topic {shown!r} does not exist", ())


@dataclass(frozen=True, slots=True)
class LookupResponse:
    brokers: tuple[LookupBroker, ...]  # the live brokers
    topics: tuple[LookupTopic, ...]  # in the order asked
