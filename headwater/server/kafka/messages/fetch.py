"""Fetch: records out, by offset.

Written by tools/kafka_messages.py from Kafka's JSON message specs: do not edit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from headwater.server.kafka.messages.declare import Field, Message, Struct

__all__ = [
    "AbortedTransaction",
    "FetchPartition",
    "FetchRequest",
    "FetchResponse",
    "FetchTopic",
    "FetchableTopicResponse",
    "ForgottenTopic",
    "PartitionData",
]


@dataclass(frozen=True, slots=True)
class FetchPartition(Struct):
    partition: int = 0
    current_leader_epoch: int = -1
    fetch_offset: int = 0
    log_start_offset: int = -1
    partition_max_bytes: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("partition", "int32", 0),
        Field("current_leader_epoch", "int32", 9),
        Field("fetch_offset", "int64", 0),
        Field("log_start_offset", "int64", 5),
        Field("partition_max_bytes", "int32", 0),
    )


@dataclass(frozen=True, slots=True)
class FetchTopic(Struct):
    topic: str = ""
    partitions: Sequence[FetchPartition] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic", "string", 0, 12),
        Field("partitions", FetchPartition, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ForgottenTopic(Struct):
    topic: str = ""
    partitions: Sequence[int] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic", "string", 7, 12),
        Field("partitions", "int32", 7, array=True),
    )


@dataclass(frozen=True, slots=True)
class FetchRequest(Message):
    """Fetch request, versions 4-11."""

    API_KEY: ClassVar[int] = 1
    VERSIONS: ClassVar[tuple[int, int]] = (4, 11)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    replica_id: int = -1
    max_wait_ms: int = 0
    min_bytes: int = 0
    max_bytes: int = 2147483647
    isolation_level: int = 0
    session_id: int = 0
    session_epoch: int = -1
    topics: Sequence[FetchTopic] = ()
    forgotten_topics_data: Sequence[ForgottenTopic] = ()
    rack_id: str = ""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("replica_id", "int32", 0, 14),
        Field("max_wait_ms", "int32", 0),
        Field("min_bytes", "int32", 0),
        Field("max_bytes", "int32", 3),
        Field("isolation_level", "int8", 4),
        Field("session_id", "int32", 7),
        Field("session_epoch", "int32", 7),
        Field("topics", FetchTopic, 0, array=True),
        Field("forgotten_topics_data", ForgottenTopic, 7, array=True),
        Field("rack_id", "string", 11),
    )


@dataclass(frozen=True, slots=True)
class AbortedTransaction(Struct):
    producer_id: int = 0
    first_offset: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("producer_id", "int64", 4),
        Field("first_offset", "int64", 4),
    )


@dataclass(frozen=True, slots=True)
class PartitionData(Struct):
    partition_index: int = 0
    error_code: int = 0
    high_watermark: int = 0
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted_transactions: Sequence[AbortedTransaction] | None = ()
    preferred_read_replica: int = -1
    records: bytes | None = None
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("partition_index", "int32", 0),
        Field("error_code", "int16", 0),
        Field("high_watermark", "int64", 0),
        Field("last_stable_offset", "int64", 4),
        Field("log_start_offset", "int64", 5),
        Field("aborted_transactions", AbortedTransaction, 4, array=True, nullable=4),
        Field("preferred_read_replica", "int32", 11),
        Field("records", "records", 0, nullable=0),
    )


@dataclass(frozen=True, slots=True)
class FetchableTopicResponse(Struct):
    topic: str = ""
    partitions: Sequence[PartitionData] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic", "string", 0, 12),
        Field("partitions", PartitionData, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class FetchResponse(Message):
    """Fetch response, versions 4-11."""

    API_KEY: ClassVar[int] = 1
    VERSIONS: ClassVar[tuple[int, int]] = (4, 11)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    error_code: int = 0
    session_id: int = 0
    responses: Sequence[FetchableTopicResponse] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 1),
        Field("error_code", "int16", 7),
        Field("session_id", "int32", 7),
        Field("responses", FetchableTopicResponse, 0, array=True),
    )
