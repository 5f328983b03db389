"""The messages of the admin requests added for operators: ALTER_TOPIC_CONFIGS,
LIST_SUBSCRIPTIONS, SERVER_INFO, and the per-partition storage DESCRIBE_TOPIC reports.

Kept apart from `wire.messages` so that module stays small; it re-exports every class here, so
code names them `messages.X` like any other message. Layouts: `wire.api.admin`, docs/PROTOCOL.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headwater.wire.messages import ConfigEntry, TopicInfo

__all__ = [
    "AlterTopicConfigsRequest",
    "AlterTopicConfigsResponse",
    "CreatePartitionsRequest",
    "ListSubscriptionsRequest",
    "ListSubscriptionsResponse",
    "PartitionInfo",
    "ServerInfoRequest",
    "ServerInfoResponse",
    "SubscriptionDetail",
    "SubscriptionPartition",
]


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition of a reliable topic, as DESCRIBE_TOPIC reports it."""

    partition: int
    start_offset: int  # the oldest offset still stored (object store or local)
    next_offset: int
    local_start_offset: int  # the oldest offset in the local WAL
    size_bytes: int  # local WAL bytes
    segments: int  # local WAL segments (the open one included)
    uploaded_offset: int  # offsets below this are in the object store; -1: no object store
    upload_lag_offsets: int  # offsets held only locally (not yet uploaded)
    upload_lag_bytes: int  # bytes of the local segments not yet uploaded


@dataclass(frozen=True, slots=True)
class AlterTopicConfigsRequest:
    """Change some of a topic's configs; the ones not named keep their values."""

    name: str
    configs: tuple[ConfigEntry, ...]


@dataclass(frozen=True, slots=True)
class AlterTopicConfigsResponse:
    topic: TopicInfo  # with every config as it is now


@dataclass(frozen=True, slots=True)
class ListSubscriptionsRequest:
    topic: str  # empty: the subscriptions of every topic


@dataclass(frozen=True, slots=True)
class SubscriptionPartition:
    partition: int
    committed: int  # every offset below this is acknowledged
    dispatched: int  # the first offset never delivered
    next_offset: int  # the partition's
    backlog: int  # never delivered yet
    lag: int  # not acknowledged yet: backlog + unacked + redelivering
    unacked: int  # delivered to a consumer, awaiting its ack
    redelivering: int  # delivered, not acknowledged, waiting to be delivered again
    dead_lettered: int  # moved to the dead-letter topic since the server started


@dataclass(frozen=True, slots=True)
class SubscriptionDetail:
    topic: str
    name: str
    sub_type: int
    durable: int
    consumers: int
    backlog: int
    lag: int
    unacked: int
    redelivering: int
    delivered: int
    dropped: int
    dead_lettered: int
    partitions: tuple[SubscriptionPartition, ...]  # reliable standard/shared subscriptions only


@dataclass(frozen=True, slots=True)
class ListSubscriptionsResponse:
    subscriptions: tuple[SubscriptionDetail, ...]


@dataclass(frozen=True, slots=True)
class ServerInfoRequest:
    pass


@dataclass(frozen=True, slots=True)
class ServerInfoResponse:
    version: str
    started_ms: int  # ms since the epoch
    uptime_ms: int
    connections: int
    topic_count: int
    subscription_count: int
    data_dir: str
    data_dir_bytes: int  # bytes of the files under the data directory
    memory_budget_bytes: int = 0  # memory_max_bytes: what client backlogs may hold in all
    memory_used_bytes: int = 0  # what they hold now


@dataclass(frozen=True, slots=True)
class CreatePartitionsRequest:
    """Grow topic `name` to `partitions` partitions in all (never fewer than it has)."""

    name: str
    partitions: int
