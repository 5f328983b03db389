"""Kafka 4's consumer group protocol (KIP-848): heartbeats that carry the assignment,
and describing such groups.

Written by tools/kafka_messages.py from Kafka's JSON message specs: do not edit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from headwater.server.kafka.messages.declare import Field, Message, Struct

__all__ = [
    "AssignedTopicPartitions",
    "ConsumerGroup",
    "ConsumerGroupDescribeRequest",
    "ConsumerGroupDescribeResponse",
    "ConsumerGroupHeartbeatRequest",
    "ConsumerGroupHeartbeatResponse",
    "ConsumerGroupMember",
    "DescribedTopicPartitions",
    "HeartbeatAssignment",
    "MemberAssignment",
    "OwnedTopicPartitions",
]


@dataclass(frozen=True, slots=True)
class OwnedTopicPartitions(Struct):
    topic_id: bytes = bytes(16)
    partitions: Sequence[int] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic_id", "uuid", 0),
        Field("partitions", "int32", 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ConsumerGroupHeartbeatRequest(Message):
    """ConsumerGroupHeartbeat request, versions 0-1 (flexible from 0)."""

    API_KEY: ClassVar[int] = 68
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = 0
    group_id: str = ""
    member_id: str = ""
    member_epoch: int = 0
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: Sequence[str] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    topic_partitions: Sequence[OwnedTopicPartitions] | None = None
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("group_id", "string", 0),
        Field("member_id", "string", 0),
        Field("member_epoch", "int32", 0),
        Field("instance_id", "string", 0, nullable=0),
        Field("rack_id", "string", 0, nullable=0),
        Field("rebalance_timeout_ms", "int32", 0),
        Field("subscribed_topic_names", "string", 0, array=True, nullable=0),
        Field("subscribed_topic_regex", "string", 1, nullable=1),
        Field("server_assignor", "string", 0, nullable=0),
        Field("topic_partitions", OwnedTopicPartitions, 0, array=True, nullable=0),
    )


@dataclass(frozen=True, slots=True)
class AssignedTopicPartitions(Struct):
    topic_id: bytes = bytes(16)
    partitions: Sequence[int] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic_id", "uuid", 0),
        Field("partitions", "int32", 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class HeartbeatAssignment(Struct):
    topic_partitions: Sequence[AssignedTopicPartitions] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic_partitions", AssignedTopicPartitions, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ConsumerGroupHeartbeatResponse(Message):
    """ConsumerGroupHeartbeat response, versions 0-1 (flexible from 0)."""

    API_KEY: ClassVar[int] = 68
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = 0
    throttle_time_ms: int = 0
    error_code: int = 0
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: HeartbeatAssignment | None = None
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("error_code", "int16", 0),
        Field("error_message", "string", 0, nullable=0),
        Field("member_id", "string", 0, nullable=0),
        Field("member_epoch", "int32", 0),
        Field("heartbeat_interval_ms", "int32", 0),
        Field("assignment", HeartbeatAssignment, 0, nullable=0),
    )


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescribeRequest(Message):
    """ConsumerGroupDescribe request, versions 0-0 (flexible from 0)."""

    API_KEY: ClassVar[int] = 69
    VERSIONS: ClassVar[tuple[int, int]] = (0, 0)
    FLEXIBLE_FROM: ClassVar[int | None] = 0
    group_ids: Sequence[str] = ()
    include_authorized_operations: bool = False
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("group_ids", "string", 0, array=True),
        Field("include_authorized_operations", "bool", 0),
    )


@dataclass(frozen=True, slots=True)
class DescribedTopicPartitions(Struct):
    topic_id: bytes = bytes(16)
    topic_name: str = ""
    partitions: Sequence[int] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic_id", "uuid", 0),
        Field("topic_name", "string", 0),
        Field("partitions", "int32", 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class MemberAssignment(Struct):
    topic_partitions: Sequence[DescribedTopicPartitions] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic_partitions", DescribedTopicPartitions, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ConsumerGroupMember(Struct):
    member_id: str = ""
    instance_id: str | None = None
    rack_id: str | None = None
    member_epoch: int = 0
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: Sequence[str] = ()
    subscribed_topic_regex: str | None = None
    assignment: MemberAssignment = MemberAssignment()
    target_assignment: MemberAssignment = MemberAssignment()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("member_id", "string", 0),
        Field("instance_id", "string", 0, nullable=0),
        Field("rack_id", "string", 0, nullable=0),
        Field("member_epoch", "int32", 0),
        Field("client_id", "string", 0),
        Field("client_host", "string", 0),
        Field("subscribed_topic_names", "string", 0, array=True),
        Field("subscribed_topic_regex", "string", 0, nullable=0),
        Field("assignment", MemberAssignment, 0),
        Field("target_assignment", MemberAssignment, 0),
    )


@dataclass(frozen=True, slots=True)
class ConsumerGroup(Struct):
    error_code: int = 0
    error_message: str | None = None
    group_id: str = ""
    group_state: str = ""
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor_name: str = ""
    members: Sequence[ConsumerGroupMember] = ()
    authorized_operations: int = -2147483648
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("error_code", "int16", 0),
        Field("error_message", "string", 0, nullable=0),
        Field("group_id", "string", 0),
        Field("group_state", "string", 0),
        Field("group_epoch", "int32", 0),
        Field("assignment_epoch", "int32", 0),
        Field("assignor_name", "string", 0),
        Field("members", ConsumerGroupMember, 0, array=True),
        Field("authorized_operations", "int32", 0),
    )


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescribeResponse(Message):
    """ConsumerGroupDescribe response, versions 0-0 (flexible from 0)."""

    API_KEY: ClassVar[int] = 69
    VERSIONS: ClassVar[tuple[int, int]] = (0, 0)
    FLEXIBLE_FROM: ClassVar[int | None] = 0
    throttle_time_ms: int = 0
    groups: Sequence[ConsumerGroup] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("groups", ConsumerGroup, 0, array=True),
    )
