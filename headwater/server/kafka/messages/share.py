"""Share groups (KIP-932): membership, description, fetching and acknowledging records.

Written by tools/kafka_messages.py from Kafka's JSON message specs: do not edit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from headwater.server.kafka.messages.declare import Field, Message, Struct

__all__ = [
    "AcknowledgePartition",
    "AcknowledgeTopic",
    "AcknowledgementBatch",
    "AcquiredRecords",
    "Assignment",
    "DescribedGroup",
    "FetchPartition",
    "FetchTopic",
    "ForgottenTopic",
    "LeaderIdAndEpoch",
    "Member",
    "NodeEndpoint",
    "PartitionData",
    "ShareAcknowledgePartitionData",
    "ShareAcknowledgeRequest",
    "ShareAcknowledgeResponse",
    "ShareAcknowledgeTopicResponse",
    "ShareFetchRequest",
    "ShareFetchResponse",
    "ShareFetchableTopicResponse",
    "ShareGroupDescribeAssignment",
    "ShareGroupDescribeRequest",
    "ShareGroupDescribeResponse",
    "ShareGroupDescribeTopicPartitions",
    "ShareGroupHeartbeatRequest",
    "ShareGroupHeartbeatResponse",
    "TopicPartitions",
]


@dataclass(frozen=True, slots=True)
class ShareGroupHeartbeatRequest(Message):
    """ShareGroupHeartbeat request, versions 1-1 (flexible from 0)."""

    API_KEY: ClassVar[int] = 76
    VERSIONS: ClassVar[tuple[int, int]] = (1, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = 0
    group_id: str = ""
    member_id: str = ""
    member_epoch: int = 0
    rack_id: str | None = None
    subscribed_topic_names: Sequence[str] | None = None
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("group_id", "string", 0),
        Field("member_id", "string", 0),
        Field("member_epoch", "int32", 0),
        Field("rack_id", "string", 0, nullable=0),
        Field("subscribed_topic_names", "string", 0, array=True, nullable=0),
    )


@dataclass(frozen=True, slots=True)
class TopicPartitions(Struct):
    topic_id: bytes = bytes(16)
    partitions: Sequence[int] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic_id", "uuid", 0),
        Field("partitions", "int32", 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class Assignment(Struct):
    topic_partitions: Sequence[TopicPartitions] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic_partitions", TopicPartitions, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ShareGroupHeartbeatResponse(Message):
    """ShareGroupHeartbeat response, versions 1-1 (flexible from 0)."""

    API_KEY: ClassVar[int] = 76
    VERSIONS: ClassVar[tuple[int, int]] = (1, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = 0
    throttle_time_ms: int = 0
    error_code: int = 0
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("error_code", "int16", 0),
        Field("error_message", "string", 0, nullable=0),
        Field("member_id", "string", 0, nullable=0),
        Field("member_epoch", "int32", 0),
        Field("heartbeat_interval_ms", "int32", 0),
        Field("assignment", Assignment, 0, nullable=0),
    )


@dataclass(frozen=True, slots=True)
class ShareGroupDescribeRequest(Message):
    """ShareGroupDescribe request, versions 1-1 (flexible from 0)."""

    API_KEY: ClassVar[int] = 77
    VERSIONS: ClassVar[tuple[int, int]] = (1, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = 0
    group_ids: Sequence[str] = ()
    include_authorized_operations: bool = False
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("group_ids", "string", 0, array=True),
        Field("include_authorized_operations", "bool", 0),
    )


@dataclass(frozen=True, slots=True)
class ShareGroupDescribeTopicPartitions(Struct):
    topic_id: bytes = bytes(16)
    topic_name: str = ""
    partitions: Sequence[int] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic_id", "uuid", 0),
        Field("topic_name", "string", 0),
        Field("partitions", "int32", 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ShareGroupDescribeAssignment(Struct):
    topic_partitions: Sequence[ShareGroupDescribeTopicPartitions] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic_partitions", ShareGroupDescribeTopicPartitions, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class Member(Struct):
    member_id: str = ""
    rack_id: str | None = None
    member_epoch: int = 0
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: Sequence[str] = ()
    assignment: ShareGroupDescribeAssignment = ShareGroupDescribeAssignment()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("member_id", "string", 0),
        Field("rack_id", "string", 0, nullable=0),
        Field("member_epoch", "int32", 0),
        Field("client_id", "string", 0),
        Field("client_host", "string", 0),
        Field("subscribed_topic_names", "string", 0, array=True),
        Field("assignment", ShareGroupDescribeAssignment, 0),
    )


@dataclass(frozen=True, slots=True)
class DescribedGroup(Struct):
    error_code: int = 0
    error_message: str | None = None
    group_id: str = ""
    group_state: str = ""
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor_name: str = ""
    members: Sequence[Member] = ()
    authorized_operations: int = -2147483648
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("error_code", "int16", 0),
        Field("error_message", "string", 0, nullable=0),
        Field("group_id", "string", 0),
        Field("group_state", "string", 0),
        Field("group_epoch", "int32", 0),
        Field("assignment_epoch", "int32", 0),
        Field("assignor_name", "string", 0),
        Field("members", Member, 0, array=True),
        Field("authorized_operations", "int32", 0),
    )


@dataclass(frozen=True, slots=True)
class ShareGroupDescribeResponse(Message):
    """ShareGroupDescribe response, versions 1-1 (flexible from 0)."""

    API_KEY: ClassVar[int] = 77
    VERSIONS: ClassVar[tuple[int, int]] = (1, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = 0
    throttle_time_ms: int = 0
    groups: Sequence[DescribedGroup] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("groups", DescribedGroup, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class AcknowledgementBatch(Struct):
    first_offset: int = 0
    last_offset: int = 0
    acknowledge_types: Sequence[int] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("first_offset", "int64", 0),
        Field("last_offset", "int64", 0),
        Field("acknowledge_types", "int8", 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class FetchPartition(Struct):
    partition_index: int = 0
    acknowledgement_batches: Sequence[AcknowledgementBatch] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("partition_index", "int32", 0),
        Field("acknowledgement_batches", AcknowledgementBatch, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class FetchTopic(Struct):
    topic_id: bytes = bytes(16)
    partitions: Sequence[FetchPartition] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic_id", "uuid", 0),
        Field("partitions", FetchPartition, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ForgottenTopic(Struct):
    topic_id: bytes = bytes(16)
    partitions: Sequence[int] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic_id", "uuid", 0),
        Field("partitions", "int32", 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ShareFetchRequest(Message):
    """ShareFetch request, versions 1-1 (flexible from 0)."""

    API_KEY: ClassVar[int] = 78
    VERSIONS: ClassVar[tuple[int, int]] = (1, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = 0
    group_id: str | None = None
    member_id: str | None = ""
    share_session_epoch: int = 0
    max_wait_ms: int = 0
    min_bytes: int = 0
    max_bytes: int = 2147483647
    max_records: int = 0
    batch_size: int = 0
    topics: Sequence[FetchTopic] = ()
    forgotten_topics_data: Sequence[ForgottenTopic] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("group_id", "string", 0, nullable=0),
        Field("member_id", "string", 0, nullable=0),
        Field("share_session_epoch", "int32", 0),
        Field("max_wait_ms", "int32", 0),
        Field("min_bytes", "int32", 0),
        Field("max_bytes", "int32", 0),
        Field("max_records", "int32", 1),
        Field("batch_size", "int32", 1),
        Field("topics", FetchTopic, 0, array=True),
        Field("forgotten_topics_data", ForgottenTopic, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class LeaderIdAndEpoch(Struct):
    leader_id: int = 0
    leader_epoch: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("leader_id", "int32", 0),
        Field("leader_epoch", "int32", 0),
    )


@dataclass(frozen=True, slots=True)
class AcquiredRecords(Struct):
    first_offset: int = 0
    last_offset: int = 0
    delivery_count: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("first_offset", "int64", 0),
        Field("last_offset", "int64", 0),
        Field("delivery_count", "int16", 0),
    )


@dataclass(frozen=True, slots=True)
class PartitionData(Struct):
    partition_index: int = 0
    error_code: int = 0
    error_message: str | None = None
    acknowledge_error_code: int = 0
    acknowledge_error_message: str | None = None
    current_leader: LeaderIdAndEpoch = LeaderIdAndEpoch()
    records: bytes | None = None
    acquired_records: Sequence[AcquiredRecords] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("partition_index", "int32", 0),
        Field("error_code", "int16", 0),
        Field("error_message", "string", 0, nullable=0),
        Field("acknowledge_error_code", "int16", 0),
        Field("acknowledge_error_message", "string", 0, nullable=0),
        Field("current_leader", LeaderIdAndEpoch, 0),
        Field("records", "records", 0, nullable=0),
        Field("acquired_records", AcquiredRecords, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ShareFetchableTopicResponse(Struct):
    topic_id: bytes = bytes(16)
    partitions: Sequence[PartitionData] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic_id", "uuid", 0),
        Field("partitions", PartitionData, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class NodeEndpoint(Struct):
    node_id: int = 0
    host: str = ""
    port: int = 0
    rack: str | None = None
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("node_id", "int32", 0),
        Field("host", "string", 0),
        Field("port", "int32", 0),
        Field("rack", "string", 0, nullable=0),
    )


@dataclass(frozen=True, slots=True)
class ShareFetchResponse(Message):
    """ShareFetch response, versions 1-1 (flexible from 0)."""

    API_KEY: ClassVar[int] = 78
    VERSIONS: ClassVar[tuple[int, int]] = (1, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = 0
    throttle_time_ms: int = 0
    error_code: int = 0
    error_message: str | None = None
    acquisition_lock_timeout_ms: int = 0
    responses: Sequence[ShareFetchableTopicResponse] = ()
    node_endpoints: Sequence[NodeEndpoint] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("error_code", "int16", 0),
        Field("error_message", "string", 0, nullable=0),
        Field("acquisition_lock_timeout_ms", "int32", 0),
        Field("responses", ShareFetchableTopicResponse, 0, array=True),
        Field("node_endpoints", NodeEndpoint, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class AcknowledgePartition(Struct):
    partition_index: int = 0
    acknowledgement_batches: Sequence[AcknowledgementBatch] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("partition_index", "int32", 0),
        Field("acknowledgement_batches", AcknowledgementBatch, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class AcknowledgeTopic(Struct):
    topic_id: bytes = bytes(16)
    partitions: Sequence[AcknowledgePartition] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic_id", "uuid", 0),
        Field("partitions", AcknowledgePartition, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ShareAcknowledgeRequest(Message):
    """ShareAcknowledge request, versions 1-1 (flexible from 0)."""

    API_KEY: ClassVar[int] = 79
    VERSIONS: ClassVar[tuple[int, int]] = (1, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = 0
    group_id: str | None = None
    member_id: str | None = ""
    share_session_epoch: int = 0
    topics: Sequence[AcknowledgeTopic] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("group_id", "string", 0, nullable=0),
        Field("member_id", "string", 0, nullable=0),
        Field("share_session_epoch", "int32", 0),
        Field("topics", AcknowledgeTopic, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ShareAcknowledgePartitionData(Struct):
    partition_index: int = 0
    error_code: int = 0
    error_message: str | None = None
    current_leader: LeaderIdAndEpoch = LeaderIdAndEpoch()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("partition_index", "int32", 0),
        Field("error_code", "int16", 0),
        Field("error_message", "string", 0, nullable=0),
        Field("current_leader", LeaderIdAndEpoch, 0),
    )


@dataclass(frozen=True, slots=True)
class ShareAcknowledgeTopicResponse(Struct):
    topic_id: bytes = bytes(16)
    partitions: Sequence[ShareAcknowledgePartitionData] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic_id", "uuid", 0),
        Field("partitions", ShareAcknowledgePartitionData, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ShareAcknowledgeResponse(Message):
    """ShareAcknowledge response, versions 1-1 (flexible from 0)."""

    API_KEY: ClassVar[int] = 79
    VERSIONS: ClassVar[tuple[int, int]] = (1, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = 0
    throttle_time_ms: int = 0
    error_code: int = 0
    error_message: str | None = None
    responses: Sequence[ShareAcknowledgeTopicResponse] = ()
    node_endpoints: Sequence[NodeEndpoint] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("error_code", "int16", 0),
        Field("error_message", "string", 0, nullable=0),
        Field("responses", ShareAcknowledgeTopicResponse, 0, array=True),
        Field("node_endpoints", NodeEndpoint, 0, array=True),
    )
