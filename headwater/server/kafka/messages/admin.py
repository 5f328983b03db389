"""Topics made, deleted and grown, and records deleted, by an admin client.

Written by tools/kafka_messages.py from Kafka's JSON message specs: do not edit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from headwater.server.kafka.messages.declare import Field, Message, Struct

__all__ = [
    "CreatableReplicaAssignment",
    "CreatableTopic",
    "CreatableTopicConfig",
    "CreatableTopicResult",
    "CreatePartitionsAssignment",
    "CreatePartitionsRequest",
    "CreatePartitionsResponse",
    "CreatePartitionsTopic",
    "CreatePartitionsTopicResult",
    "CreateTopicsRequest",
    "CreateTopicsResponse",
    "DeletableTopicResult",
    "DeleteRecordsPartition",
    "DeleteRecordsPartitionResult",
    "DeleteRecordsRequest",
    "DeleteRecordsResponse",
    "DeleteRecordsTopic",
    "DeleteRecordsTopicResult",
    "DeleteTopicsRequest",
    "DeleteTopicsResponse",
]


@dataclass(frozen=True, slots=True)
class CreatableReplicaAssignment(Struct):
    partition_index: int = 0
    broker_ids: Sequence[int] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("partition_index", "int32", 0),
        Field("broker_ids", "int32", 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class CreatableTopicConfig(Struct):
    name: str = ""
    value: str | None = ""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("value", "string", 0, nullable=0),
    )


@dataclass(frozen=True, slots=True)
class CreatableTopic(Struct):
    name: str = ""
    num_partitions: int = 0
    replication_factor: int = 0
    assignments: Sequence[CreatableReplicaAssignment] = ()
    configs: Sequence[CreatableTopicConfig] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("num_partitions", "int32", 0),
        Field("replication_factor", "int16", 0),
        Field("assignments", CreatableReplicaAssignment, 0, array=True),
        Field("configs", CreatableTopicConfig, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class CreateTopicsRequest(Message):
    """CreateTopics request, versions 0-3."""

    API_KEY: ClassVar[int] = 19
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    topics: Sequence[CreatableTopic] = ()
    timeout_ms: int = 60000
    validate_only: bool = False
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topics", CreatableTopic, 0, array=True),
        Field("timeout_ms", "int32", 0),
        Field("validate_only", "bool", 1),
    )


@dataclass(frozen=True, slots=True)
class CreatableTopicResult(Struct):
    name: str = ""
    error_code: int = 0
    error_message: str | None = ""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("error_code", "int16", 0),
        Field("error_message", "string", 1, nullable=0),
    )


@dataclass(frozen=True, slots=True)
class CreateTopicsResponse(Message):
    """CreateTopics response, versions 0-3."""

    API_KEY: ClassVar[int] = 19
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    topics: Sequence[CreatableTopicResult] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 2),
        Field("topics", CreatableTopicResult, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class DeleteTopicsRequest(Message):
    """DeleteTopics request, versions 0-3."""

    API_KEY: ClassVar[int] = 20
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    topic_names: Sequence[str] = ()
    timeout_ms: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic_names", "string", 0, 5, array=True),
        Field("timeout_ms", "int32", 0),
    )


@dataclass(frozen=True, slots=True)
class DeletableTopicResult(Struct):
    name: str = ""
    error_code: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("error_code", "int16", 0),
    )


@dataclass(frozen=True, slots=True)
class DeleteTopicsResponse(Message):
    """DeleteTopics response, versions 0-3."""

    API_KEY: ClassVar[int] = 20
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    responses: Sequence[DeletableTopicResult] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 1),
        Field("responses", DeletableTopicResult, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class CreatePartitionsAssignment(Struct):
    broker_ids: Sequence[int] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("broker_ids", "int32", 0, array=True),)


@dataclass(frozen=True, slots=True)
class CreatePartitionsTopic(Struct):
    name: str = ""
    count: int = 0
    assignments: Sequence[CreatePartitionsAssignment] | None = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("count", "int32", 0),
        Field("assignments", CreatePartitionsAssignment, 0, array=True, nullable=0),
    )


@dataclass(frozen=True, slots=True)
class CreatePartitionsRequest(Message):
    """CreatePartitions request, versions 0-1."""

    API_KEY: ClassVar[int] = 37
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    topics: Sequence[CreatePartitionsTopic] = ()
    timeout_ms: int = 0
    validate_only: bool = False
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topics", CreatePartitionsTopic, 0, array=True),
        Field("timeout_ms", "int32", 0),
        Field("validate_only", "bool", 0),
    )


@dataclass(frozen=True, slots=True)
class CreatePartitionsTopicResult(Struct):
    name: str = ""
    error_code: int = 0
    error_message: str | None = None
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("error_code", "int16", 0),
        Field("error_message", "string", 0, nullable=0),
    )


@dataclass(frozen=True, slots=True)
class CreatePartitionsResponse(Message):
    """CreatePartitions response, versions 0-1."""

    API_KEY: ClassVar[int] = 37
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    results: Sequence[CreatePartitionsTopicResult] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("results", CreatePartitionsTopicResult, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class DeleteRecordsPartition(Struct):
    partition_index: int = 0
    offset: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("partition_index", "int32", 0),
        Field("offset", "int64", 0),
    )


@dataclass(frozen=True, slots=True)
class DeleteRecordsTopic(Struct):
    name: str = ""
    partitions: Sequence[DeleteRecordsPartition] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("partitions", DeleteRecordsPartition, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class DeleteRecordsRequest(Message):
    """DeleteRecords request, versions 0-1."""

    API_KEY: ClassVar[int] = 21
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    topics: Sequence[DeleteRecordsTopic] = ()
    timeout_ms: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topics", DeleteRecordsTopic, 0, array=True),
        Field("timeout_ms", "int32", 0),
    )


@dataclass(frozen=True, slots=True)
class DeleteRecordsPartitionResult(Struct):
    partition_index: int = 0
    low_watermark: int = 0
    error_code: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("partition_index", "int32", 0),
        Field("low_watermark", "int64", 0),
        Field("error_code", "int16", 0),
    )


@dataclass(frozen=True, slots=True)
class DeleteRecordsTopicResult(Struct):
    name: str = ""
    partitions: Sequence[DeleteRecordsPartitionResult] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("partitions", DeleteRecordsPartitionResult, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class DeleteRecordsResponse(Message):
    """DeleteRecords response, versions 0-1."""

    API_KEY: ClassVar[int] = 21
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    topics: Sequence[DeleteRecordsTopicResult] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("topics", DeleteRecordsTopicResult, 0, array=True),
    )
