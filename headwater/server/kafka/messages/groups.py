"""The consumer group protocol: coordinator, membership, listing, deletion.

Written by tools/kafka_messages.py from Kafka's JSON message specs: do not edit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from headwater.server.kafka.messages.declare import Field, Message, Struct

__all__ = [
    "DeletableGroupResult",
    "DeleteGroupsRequest",
    "DeleteGroupsResponse",
    "DescribeGroupsRequest",
    "DescribeGroupsResponse",
    "DescribedGroup",
    "DescribedGroupMember",
    "FindCoordinatorRequest",
    "FindCoordinatorResponse",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "JoinGroupRequest",
    "JoinGroupRequestProtocol",
    "JoinGroupResponse",
    "JoinGroupResponseMember",
    "LeaveGroupRequest",
    "LeaveGroupResponse",
    "ListGroupsRequest",
    "ListGroupsResponse",
    "ListedGroup",
    "MemberIdentity",
    "MemberResponse",
    "SyncGroupRequest",
    "SyncGroupRequestAssignment",
    "SyncGroupResponse",
]


@dataclass(frozen=True, slots=True)
class FindCoordinatorRequest(Message):
    """FindCoordinator request, versions 0-1."""

    API_KEY: ClassVar[int] = 10
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    key: str = ""
    key_type: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("key", "string", 0, 3),
        Field("key_type", "int8", 1),
    )


@dataclass(frozen=True, slots=True)
class FindCoordinatorResponse(Message):
    """FindCoordinator response, versions 0-1."""

    API_KEY: ClassVar[int] = 10
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    error_code: int = 0
    error_message: str | None = ""
    node_id: int = 0
    host: str = ""
    port: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 1),
        Field("error_code", "int16", 0, 3),
        Field("error_message", "string", 1, 3, nullable=1),
        Field("node_id", "int32", 0, 3),
        Field("host", "string", 0, 3),
        Field("port", "int32", 0, 3),
    )


@dataclass(frozen=True, slots=True)
class JoinGroupRequestProtocol(Struct):
    name: str = ""
    metadata: bytes = b""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("metadata", "bytes", 0),
    )


@dataclass(frozen=True, slots=True)
class JoinGroupRequest(Message):
    """JoinGroup request, versions 0-5."""

    API_KEY: ClassVar[int] = 11
    VERSIONS: ClassVar[tuple[int, int]] = (0, 5)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    group_id: str = ""
    session_timeout_ms: int = 0
    rebalance_timeout_ms: int = -1
    member_id: str = ""
    group_instance_id: str | None = None
    protocol_type: str = ""
    protocols: Sequence[JoinGroupRequestProtocol] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("group_id", "string", 0),
        Field("session_timeout_ms", "int32", 0),
        Field("rebalance_timeout_ms", "int32", 1),
        Field("member_id", "string", 0),
        Field("group_instance_id", "string", 5, nullable=5),
        Field("protocol_type", "string", 0),
        Field("protocols", JoinGroupRequestProtocol, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class JoinGroupResponseMember(Struct):
    member_id: str = ""
    group_instance_id: str | None = None
    metadata: bytes = b""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("member_id", "string", 0),
        Field("group_instance_id", "string", 5, nullable=5),
        Field("metadata", "bytes", 0),
    )


@dataclass(frozen=True, slots=True)
class JoinGroupResponse(Message):
    """JoinGroup response, versions 0-5."""

    API_KEY: ClassVar[int] = 11
    VERSIONS: ClassVar[tuple[int, int]] = (0, 5)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    error_code: int = 0
    generation_id: int = -1
    protocol_name: str = ""
    leader: str = ""
    member_id: str = ""
    members: Sequence[JoinGroupResponseMember] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 2),
        Field("error_code", "int16", 0),
        Field("generation_id", "int32", 0),
        Field("protocol_name", "string", 0),
        Field("leader", "string", 0),
        Field("member_id", "string", 0),
        Field("members", JoinGroupResponseMember, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class HeartbeatRequest(Message):
    """Heartbeat request, versions 0-3."""

    API_KEY: ClassVar[int] = 12
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    group_id: str = ""
    generation_id: int = 0
    member_id: str = ""
    group_instance_id: str | None = None
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("group_id", "string", 0),
        Field("generation_id", "int32", 0),
        Field("member_id", "string", 0),
        Field("group_instance_id", "string", 3, nullable=3),
    )


@dataclass(frozen=True, slots=True)
class HeartbeatResponse(Message):
    """Heartbeat response, versions 0-3."""

    API_KEY: ClassVar[int] = 12
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    error_code: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 1),
        Field("error_code", "int16", 0),
    )


@dataclass(frozen=True, slots=True)
class MemberIdentity(Struct):
    member_id: str = ""
    group_instance_id: str | None = None
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("member_id", "string", 3),
        Field("group_instance_id", "string", 3, nullable=3),
    )


@dataclass(frozen=True, slots=True)
class LeaveGroupRequest(Message):
    """LeaveGroup request, versions 0-3."""

    API_KEY: ClassVar[int] = 13
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    group_id: str = ""
    member_id: str = ""
    members: Sequence[MemberIdentity] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("group_id", "string", 0),
        Field("member_id", "string", 0, 2),
        Field("members", MemberIdentity, 3, array=True),
    )


@dataclass(frozen=True, slots=True)
class MemberResponse(Struct):
    member_id: str = ""
    group_instance_id: str | None = ""
    error_code: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("member_id", "string", 3),
        Field("group_instance_id", "string", 3, nullable=3),
        Field("error_code", "int16", 3),
    )


@dataclass(frozen=True, slots=True)
class LeaveGroupResponse(Message):
    """LeaveGroup response, versions 0-3."""

    API_KEY: ClassVar[int] = 13
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    error_code: int = 0
    members: Sequence[MemberResponse] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 1),
        Field("error_code", "int16", 0),
        Field("members", MemberResponse, 3, array=True),
    )


@dataclass(frozen=True, slots=True)
class SyncGroupRequestAssignment(Struct):
    member_id: str = ""
    assignment: bytes = b""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("member_id", "string", 0),
        Field("assignment", "bytes", 0),
    )


@dataclass(frozen=True, slots=True)
class SyncGroupRequest(Message):
    """SyncGroup request, versions 0-3."""

    API_KEY: ClassVar[int] = 14
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    group_id: str = ""
    generation_id: int = 0
    member_id: str = ""
    group_instance_id: str | None = None
    assignments: Sequence[SyncGroupRequestAssignment] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("group_id", "string", 0),
        Field("generation_id", "int32", 0),
        Field("member_id", "string", 0),
        Field("group_instance_id", "string", 3, nullable=3),
        Field("assignments", SyncGroupRequestAssignment, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class SyncGroupResponse(Message):
    """SyncGroup response, versions 0-3."""

    API_KEY: ClassVar[int] = 14
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    error_code: int = 0
    assignment: bytes = b""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 1),
        Field("error_code", "int16", 0),
        Field("assignment", "bytes", 0),
    )


@dataclass(frozen=True, slots=True)
class DescribeGroupsRequest(Message):
    """DescribeGroups request, versions 0-2."""

    API_KEY: ClassVar[int] = 15
    VERSIONS: ClassVar[tuple[int, int]] = (0, 2)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    groups: Sequence[str] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("groups", "string", 0, array=True),)


@dataclass(frozen=True, slots=True)
class DescribedGroupMember(Struct):
    member_id: str = ""
    client_id: str = ""
    client_host: str = ""
    member_metadata: bytes = b""
    member_assignment: bytes = b""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("member_id", "string", 0),
        Field("client_id", "string", 0),
        Field("client_host", "string", 0),
        Field("member_metadata", "bytes", 0),
        Field("member_assignment", "bytes", 0),
    )


@dataclass(frozen=True, slots=True)
class DescribedGroup(Struct):
    error_code: int = 0
    group_id: str = ""
    group_state: str = ""
    protocol_type: str = ""
    protocol_data: str = ""
    members: Sequence[DescribedGroupMember] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("error_code", "int16", 0),
        Field("group_id", "string", 0),
        Field("group_state", "string", 0),
        Field("protocol_type", "string", 0),
        Field("protocol_data", "string", 0),
        Field("members", DescribedGroupMember, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class DescribeGroupsResponse(Message):
    """DescribeGroups response, versions 0-2."""

    API_KEY: ClassVar[int] = 15
    VERSIONS: ClassVar[tuple[int, int]] = (0, 2)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    groups: Sequence[DescribedGroup] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 1),
        Field("groups", DescribedGroup, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ListGroupsRequest(Message):
    """ListGroups request, versions 0-5 (flexible from 3)."""

    API_KEY: ClassVar[int] = 16
    VERSIONS: ClassVar[tuple[int, int]] = (0, 5)
    FLEXIBLE_FROM: ClassVar[int | None] = 3
    states_filter: Sequence[str] = ()
    types_filter: Sequence[str] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("states_filter", "string", 4, array=True),
        Field("types_filter", "string", 5, array=True),
    )


@dataclass(frozen=True, slots=True)
class ListedGroup(Struct):
    group_id: str = ""
    protocol_type: str = ""
    group_state: str = ""
    group_type: str = ""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("group_id", "string", 0),
        Field("protocol_type", "string", 0),
        Field("group_state", "string", 4),
        Field("group_type", "string", 5),
    )


@dataclass(frozen=True, slots=True)
class ListGroupsResponse(Message):
    """ListGroups response, versions 0-5 (flexible from 3)."""

    API_KEY: ClassVar[int] = 16
    VERSIONS: ClassVar[tuple[int, int]] = (0, 5)
    FLEXIBLE_FROM: ClassVar[int | None] = 3
    throttle_time_ms: int = 0
    error_code: int = 0
    groups: Sequence[ListedGroup] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 1),
        Field("error_code", "int16", 0),
        Field("groups", ListedGroup, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class DeleteGroupsRequest(Message):
    """DeleteGroups request, versions 0-1."""

    API_KEY: ClassVar[int] = 42
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    groups_names: Sequence[str] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("groups_names", "string", 0, array=True),)


@dataclass(frozen=True, slots=True)
class DeletableGroupResult(Struct):
    group_id: str = ""
    error_code: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("group_id", "string", 0),
        Field("error_code", "int16", 0),
    )


@dataclass(frozen=True, slots=True)
class DeleteGroupsResponse(Message):
    """DeleteGroups response, versions 0-1."""

    API_KEY: ClassVar[int] = 42
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    results: Sequence[DeletableGroupResult] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("results", DeletableGroupResult, 0, array=True),
    )
