"""ApiVersions and Metadata: what the broker serves and where partitions are.

Written by tools/kafka_messages.py from Kafka's JSON message specs: do not edit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from headwater.server.kafka.messages.declare import Field, Message, Struct

__all__ = [
    "ApiVersion",
    "ApiVersionsRequest",
    "ApiVersionsResponse",
    "MetadataRequest",
    "MetadataRequestTopic",
    "MetadataResponse",
    "MetadataResponseBroker",
    "MetadataResponsePartition",
    "MetadataResponseTopic",
]


@dataclass(frozen=True, slots=True)
class ApiVersionsRequest(Message):
    """ApiVersions request, versions 0-3 (flexible from 3)."""

    API_KEY: ClassVar[int] = 18
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = 3
    client_software_name: str = ""
    client_software_version: str = ""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("client_software_name", "string", 3),
        Field("client_software_version", "string", 3),
    )


@dataclass(frozen=True, slots=True)
class ApiVersion(Struct):
    api_key: int = 0
    min_version: int = 0
    max_version: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("api_key", "int16", 0),
        Field("min_version", "int16", 0),
        Field("max_version", "int16", 0),
    )


@dataclass(frozen=True, slots=True)
class ApiVersionsResponse(Message):
    """ApiVersions response, versions 0-3 (flexible from 3)."""

    API_KEY: ClassVar[int] = 18
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = 3
    error_code: int = 0
    api_keys: Sequence[ApiVersion] = ()
    throttle_time_ms: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("error_code", "int16", 0),
        Field("api_keys", ApiVersion, 0, array=True),
        Field("throttle_time_ms", "int32", 1),
    )


@dataclass(frozen=True, slots=True)
class MetadataRequestTopic(Struct):
    topic_id: bytes = b""
    name: str | None = ""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic_id", "uuid", 10),
        Field("name", "string", 0, nullable=10),
    )


@dataclass(frozen=True, slots=True)
class MetadataRequest(Message):
    """Metadata request, versions 0-12 (flexible from 9)."""

    API_KEY: ClassVar[int] = 3
    VERSIONS: ClassVar[tuple[int, int]] = (0, 12)
    FLEXIBLE_FROM: ClassVar[int | None] = 9
    topics: Sequence[MetadataRequestTopic] | None = ()
    allow_auto_topic_creation: bool = True
    include_cluster_authorized_operations: bool = False
    include_topic_authorized_operations: bool = False
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topics", MetadataRequestTopic, 0, array=True, nullable=1),
        Field("allow_auto_topic_creation", "bool", 4),
        Field("include_cluster_authorized_operations", "bool", 8, 10),
        Field("include_topic_authorized_operations", "bool", 8),
    )


@dataclass(frozen=True, slots=True)
class MetadataResponseBroker(Struct):
    node_id: int = 0
    host: str = ""
    port: int = 0
    rack: str | None = None
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("node_id", "int32", 0),
        Field("host", "string", 0),
        Field("port", "int32", 0),
        Field("rack", "string", 1, nullable=1),
    )


@dataclass(frozen=True, slots=True)
class MetadataResponsePartition(Struct):
    error_code: int = 0
    partition_index: int = 0
    leader_id: int = 0
    leader_epoch: int = -1
    replica_nodes: Sequence[int] = ()
    isr_nodes: Sequence[int] = ()
    offline_replicas: Sequence[int] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("error_code", "int16", 0),
        Field("partition_index", "int32", 0),
        Field("leader_id", "int32", 0),
        Field("leader_epoch", "int32", 7),
        Field("replica_nodes", "int32", 0, array=True),
        Field("isr_nodes", "int32", 0, array=True),
        Field("offline_replicas", "int32", 5, array=True),
    )


@dataclass(frozen=True, slots=True)
class MetadataResponseTopic(Struct):
    error_code: int = 0
    name: str | None = ""
    topic_id: bytes = b""
    is_internal: bool = False
    partitions: Sequence[MetadataResponsePartition] = ()
    topic_authorized_operations: int = -2147483648
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("error_code", "int16", 0),
        Field("name", "string", 0, nullable=12),
        Field("topic_id", "uuid", 10),
        Field("is_internal", "bool", 1),
        Field("partitions", MetadataResponsePartition, 0, array=True),
        Field("topic_authorized_operations", "int32", 8),
    )


@dataclass(frozen=True, slots=True)
class MetadataResponse(Message):
    """Metadata response, versions 0-12 (flexible from 9)."""

    API_KEY: ClassVar[int] = 3
    VERSIONS: ClassVar[tuple[int, int]] = (0, 12)
    FLEXIBLE_FROM: ClassVar[int | None] = 9
    throttle_time_ms: int = 0
    brokers: Sequence[MetadataResponseBroker] = ()
    cluster_id: str | None = None
    controller_id: int = -1
    topics: Sequence[MetadataResponseTopic] = ()
    cluster_authorized_operations: int = -2147483648
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 3),
        Field("brokers", MetadataResponseBroker, 0, array=True),
        Field("cluster_id", "string", 2, nullable=2),
        Field("controller_id", "int32", 1),
        Field("topics", MetadataResponseTopic, 0, array=True),
        Field("cluster_authorized_operations", "int32", 8, 10),
    )
