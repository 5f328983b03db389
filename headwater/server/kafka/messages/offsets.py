"""ListOffsets (a partition's offsets), OffsetCommit and OffsetFetch (a group's).

Written by tools/kafka_messages.py from Kafka's JSON message specs: do not edit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from headwater.server.kafka.messages.declare import Field, Message, Struct

__all__ = [
    "ListOffsetsPartition",
    "ListOffsetsPartitionResponse",
    "ListOffsetsRequest",
    "ListOffsetsResponse",
    "ListOffsetsTopic",
    "ListOffsetsTopicResponse",
    "OffsetCommitRequest",
    "OffsetCommitRequestPartition",
    "OffsetCommitRequestTopic",
    "OffsetCommitResponse",
    "OffsetCommitResponsePartition",
    "OffsetCommitResponseTopic",
    "OffsetFetchRequest",
    "OffsetFetchRequestTopic",
    "OffsetFetchResponse",
    "OffsetFetchResponsePartition",
    "OffsetFetchResponseTopic",
]


@dataclass(frozen=True, slots=True)
class ListOffsetsPartition(Struct):
    partition_index: int = 0
    timestamp: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("partition_index", "int32", 0),
        Field("timestamp", "int64", 0),
    )


@dataclass(frozen=True, slots=True)
class ListOffsetsTopic(Struct):
    name: str = ""
    partitions: Sequence[ListOffsetsPartition] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("partitions", ListOffsetsPartition, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ListOffsetsRequest(Message):
    """ListOffsets request, versions 1-3."""

    API_KEY: ClassVar[int] = 2
    VERSIONS: ClassVar[tuple[int, int]] = (1, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    replica_id: int = 0
    isolation_level: int = 0
    topics: Sequence[ListOffsetsTopic] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("replica_id", "int32", 0),
        Field("isolation_level", "int8", 2),
        Field("topics", ListOffsetsTopic, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ListOffsetsPartitionResponse(Struct):
    partition_index: int = 0
    error_code: int = 0
    timestamp: int = -1
    offset: int = -1
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("partition_index", "int32", 0),
        Field("error_code", "int16", 0),
        Field("timestamp", "int64", 1),
        Field("offset", "int64", 1),
    )


@dataclass(frozen=True, slots=True)
class ListOffsetsTopicResponse(Struct):
    name: str = ""
    partitions: Sequence[ListOffsetsPartitionResponse] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("partitions", ListOffsetsPartitionResponse, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ListOffsetsResponse(Message):
    """ListOffsets response, versions 1-3."""

    API_KEY: ClassVar[int] = 2
    VERSIONS: ClassVar[tuple[int, int]] = (1, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    topics: Sequence[ListOffsetsTopicResponse] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 2),
        Field("topics", ListOffsetsTopicResponse, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class OffsetCommitRequestPartition(Struct):
    partition_index: int = 0
    committed_offset: int = 0
    commit_timestamp: int = -1
    committed_metadata: str | None = ""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("partition_index", "int32", 0),
        Field("committed_offset", "int64", 0),
        Field("commit_timestamp", "int64", 1, 1),
        Field("committed_metadata", "string", 0, nullable=0),
    )


@dataclass(frozen=True, slots=True)
class OffsetCommitRequestTopic(Struct):
    name: str = ""
    partitions: Sequence[OffsetCommitRequestPartition] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0, 9),
        Field("partitions", OffsetCommitRequestPartition, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class OffsetCommitRequest(Message):
    """OffsetCommit request, versions 0-3."""

    API_KEY: ClassVar[int] = 8
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    group_id: str = ""
    generation_id_or_member_epoch: int = -1
    member_id: str = ""
    retention_time_ms: int = -1
    topics: Sequence[OffsetCommitRequestTopic] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("group_id", "string", 0),
        Field("generation_id_or_member_epoch", "int32", 1),
        Field("member_id", "string", 1),
        Field("retention_time_ms", "int64", 2, 4),
        Field("topics", OffsetCommitRequestTopic, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class OffsetCommitResponsePartition(Struct):
    partition_index: int = 0
    error_code: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("partition_index", "int32", 0),
        Field("error_code", "int16", 0),
    )


@dataclass(frozen=True, slots=True)
class OffsetCommitResponseTopic(Struct):
    name: str = ""
    partitions: Sequence[OffsetCommitResponsePartition] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0, 9),
        Field("partitions", OffsetCommitResponsePartition, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse(Message):
    """OffsetCommit response, versions 0-3."""

    API_KEY: ClassVar[int] = 8
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    topics: Sequence[OffsetCommitResponseTopic] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 3),
        Field("topics", OffsetCommitResponseTopic, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class OffsetFetchRequestTopic(Struct):
    name: str = ""
    partition_indexes: Sequence[int] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0, 7),
        Field("partition_indexes", "int32", 0, 7, array=True),
    )


@dataclass(frozen=True, slots=True)
class OffsetFetchRequest(Message):
    """OffsetFetch request, versions 1-3."""

    API_KEY: ClassVar[int] = 9
    VERSIONS: ClassVar[tuple[int, int]] = (1, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    group_id: str = ""
    topics: Sequence[OffsetFetchRequestTopic] | None = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("group_id", "string", 0, 7),
        Field("topics", OffsetFetchRequestTopic, 0, 7, array=True, nullable=2),
    )


@dataclass(frozen=True, slots=True)
class OffsetFetchResponsePartition(Struct):
    partition_index: int = 0
    committed_offset: int = 0
    metadata: str | None = ""
    error_code: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("partition_index", "int32", 0, 7),
        Field("committed_offset", "int64", 0, 7),
        Field("metadata", "string", 0, 7, nullable=0),
        Field("error_code", "int16", 0, 7),
    )


@dataclass(frozen=True, slots=True)
class OffsetFetchResponseTopic(Struct):
    name: str = ""
    partitions: Sequence[OffsetFetchResponsePartition] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0, 7),
        Field("partitions", OffsetFetchResponsePartition, 0, 7, array=True),
    )


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse(Message):
    """OffsetFetch response, versions 1-3."""

    API_KEY: ClassVar[int] = 9
    VERSIONS: ClassVar[tuple[int, int]] = (1, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    topics: Sequence[OffsetFetchResponseTopic] = ()
    error_code: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 3),
        Field("topics", OffsetFetchResponseTopic, 0, 7, array=True),
        Field("error_code", "int16", 2, 7),
    )
