"""Produce and InitProducerId: records in, producer ids out.

Written by tools/kafka_messages.py from Kafka's JSON message specs: do not edit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from headwater.server.kafka.messages.declare import Field, Message, Struct

__all__ = [
    "BatchIndexAndErrorMessage",
    "InitProducerIdRequest",
    "InitProducerIdResponse",
    "PartitionProduceData",
    "PartitionProduceResponse",
    "ProduceRequest",
    "ProduceResponse",
    "TopicProduceData",
    "TopicProduceResponse",
]


@dataclass(frozen=True, slots=True)
class PartitionProduceData(Struct):
    index: int = 0
    records: bytes | None = None
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("index", "int32", 0),
        Field("records", "records", 0, nullable=0),
    )


@dataclass(frozen=True, slots=True)
class TopicProduceData(Struct):
    name: str = ""
    partition_data: Sequence[PartitionProduceData] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0, 12),
        Field("partition_data", PartitionProduceData, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ProduceRequest(Message):
    """Produce request, versions 3-8."""

    API_KEY: ClassVar[int] = 0
    VERSIONS: ClassVar[tuple[int, int]] = (3, 8)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    transactional_id: str | None = None
    acks: int = 0
    timeout_ms: int = 0
    topic_data: Sequence[TopicProduceData] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("transactional_id", "string", 3, nullable=3),
        Field("acks", "int16", 0),
        Field("timeout_ms", "int32", 0),
        Field("topic_data", TopicProduceData, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class BatchIndexAndErrorMessage(Struct):
    batch_index: int = 0
    batch_index_error_message: str | None = None
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("batch_index", "int32", 8),
        Field("batch_index_error_message", "string", 8, nullable=8),
    )


@dataclass(frozen=True, slots=True)
class PartitionProduceResponse(Struct):
    index: int = 0
    error_code: int = 0
    base_offset: int = 0
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    record_errors: Sequence[BatchIndexAndErrorMessage] = ()
    error_message: str | None = None
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("index", "int32", 0),
        Field("error_code", "int16", 0),
        Field("base_offset", "int64", 0),
        Field("log_append_time_ms", "int64", 2),
        Field("log_start_offset", "int64", 5),
        Field("record_errors", BatchIndexAndErrorMessage, 8, array=True),
        Field("error_message", "string", 8, nullable=8),
    )


@dataclass(frozen=True, slots=True)
class TopicProduceResponse(Struct):
    name: str = ""
    partition_responses: Sequence[PartitionProduceResponse] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0, 12),
        Field("partition_responses", PartitionProduceResponse, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ProduceResponse(Message):
    """Produce response, versions 3-8."""

    API_KEY: ClassVar[int] = 0
    VERSIONS: ClassVar[tuple[int, int]] = (3, 8)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    responses: Sequence[TopicProduceResponse] = ()
    throttle_time_ms: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("responses", TopicProduceResponse, 0, array=True),
        Field("throttle_time_ms", "int32", 1),
    )


@dataclass(frozen=True, slots=True)
class InitProducerIdRequest(Message):
    """InitProducerId request, versions 0-4 (flexible from 2)."""

    API_KEY: ClassVar[int] = 22
    VERSIONS: ClassVar[tuple[int, int]] = (0, 4)
    FLEXIBLE_FROM: ClassVar[int | None] = 2
    transactional_id: str | None = ""
    transaction_timeout_ms: int = 0
    producer_id: int = -1
    producer_epoch: int = -1
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("transactional_id", "string", 0, nullable=0),
        Field("transaction_timeout_ms", "int32", 0),
        Field("producer_id", "int64", 3),
        Field("producer_epoch", "int16", 3),
    )


@dataclass(frozen=True, slots=True)
class InitProducerIdResponse(Message):
    """InitProducerId response, versions 0-4 (flexible from 2)."""

    API_KEY: ClassVar[int] = 22
    VERSIONS: ClassVar[tuple[int, int]] = (0, 4)
    FLEXIBLE_FROM: ClassVar[int | None] = 2
    throttle_time_ms: int = 0
    error_code: int = 0
    producer_id: int = 0
    producer_epoch: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("error_code", "int16", 0),
        Field("producer_id", "int64", 0),
        Field("producer_epoch", "int16", 0),
    )
