"""Transactions: a transactional producer's partitions, offsets and end, and listing.

Written by tools/kafka_messages.py from Kafka's JSON message specs: do not edit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from headwater.server.kafka.messages.declare import Field, Message, Struct

__all__ = [
    "AddOffsetsToTxnRequest",
    "AddOffsetsToTxnResponse",
    "AddPartitionsToTxnPartitionResult",
    "AddPartitionsToTxnRequest",
    "AddPartitionsToTxnResponse",
    "AddPartitionsToTxnTopic",
    "AddPartitionsToTxnTopicResult",
    "DescribeTransactionsRequest",
    "DescribeTransactionsResponse",
    "EndTxnRequest",
    "EndTxnResponse",
    "ListTransactionsRequest",
    "ListTransactionsResponse",
    "ListTransactionsTransactionState",
    "TopicData",
    "TransactionState",
    "TxnOffsetCommitRequest",
    "TxnOffsetCommitRequestPartition",
    "TxnOffsetCommitRequestTopic",
    "TxnOffsetCommitResponse",
    "TxnOffsetCommitResponsePartition",
    "TxnOffsetCommitResponseTopic",
]


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnTopic(Struct):
    name: str = ""
    partitions: Sequence[int] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("partitions", "int32", 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnRequest(Message):
    """AddPartitionsToTxn request, versions 0-3 (flexible from 3)."""

    API_KEY: ClassVar[int] = 24
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = 3
    v3_and_below_transactional_id: str = ""
    v3_and_below_producer_id: int = 0
    v3_and_below_producer_epoch: int = 0
    v3_and_below_topics: Sequence[AddPartitionsToTxnTopic] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("v3_and_below_transactional_id", "string", 0, 3),
        Field("v3_and_below_producer_id", "int64", 0, 3),
        Field("v3_and_below_producer_epoch", "int16", 0, 3),
        Field("v3_and_below_topics", AddPartitionsToTxnTopic, 0, 3, array=True),
    )


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnPartitionResult(Struct):
    partition_index: int = 0
    partition_error_code: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("partition_index", "int32", 0),
        Field("partition_error_code", "int16", 0),
    )


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnTopicResult(Struct):
    name: str = ""
    results_by_partition: Sequence[AddPartitionsToTxnPartitionResult] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("results_by_partition", AddPartitionsToTxnPartitionResult, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnResponse(Message):
    """AddPartitionsToTxn response, versions 0-3 (flexible from 3)."""

    API_KEY: ClassVar[int] = 24
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = 3
    throttle_time_ms: int = 0
    results_by_topic_v3_and_below: Sequence[AddPartitionsToTxnTopicResult] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("results_by_topic_v3_and_below", AddPartitionsToTxnTopicResult, 0, 3, array=True),
    )


@dataclass(frozen=True, slots=True)
class AddOffsetsToTxnRequest(Message):
    """AddOffsetsToTxn request, versions 0-3 (flexible from 3)."""

    API_KEY: ClassVar[int] = 25
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = 3
    transactional_id: str = ""
    producer_id: int = 0
    producer_epoch: int = 0
    group_id: str = ""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("transactional_id", "string", 0),
        Field("producer_id", "int64", 0),
        Field("producer_epoch", "int16", 0),
        Field("group_id", "string", 0),
    )


@dataclass(frozen=True, slots=True)
class AddOffsetsToTxnResponse(Message):
    """AddOffsetsToTxn response, versions 0-3 (flexible from 3)."""

    API_KEY: ClassVar[int] = 25
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = 3
    throttle_time_ms: int = 0
    error_code: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("error_code", "int16", 0),
    )


@dataclass(frozen=True, slots=True)
class EndTxnRequest(Message):
    """EndTxn request, versions 0-3 (flexible from 3)."""

    API_KEY: ClassVar[int] = 26
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = 3
    transactional_id: str = ""
    producer_id: int = 0
    producer_epoch: int = 0
    committed: bool = False
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("transactional_id", "string", 0),
        Field("producer_id", "int64", 0),
        Field("producer_epoch", "int16", 0),
        Field("committed", "bool", 0),
    )


@dataclass(frozen=True, slots=True)
class EndTxnResponse(Message):
    """EndTxn response, versions 0-3 (flexible from 3)."""

    API_KEY: ClassVar[int] = 26
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = 3
    throttle_time_ms: int = 0
    error_code: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("error_code", "int16", 0),
    )


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitRequestPartition(Struct):
    partition_index: int = 0
    committed_offset: int = 0
    committed_leader_epoch: int = -1
    committed_metadata: str | None = ""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("partition_index", "int32", 0),
        Field("committed_offset", "int64", 0),
        Field("committed_leader_epoch", "int32", 2),
        Field("committed_metadata", "string", 0, nullable=0),
    )


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitRequestTopic(Struct):
    name: str = ""
    partitions: Sequence[TxnOffsetCommitRequestPartition] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("partitions", TxnOffsetCommitRequestPartition, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitRequest(Message):
    """TxnOffsetCommit request, versions 0-3 (flexible from 3)."""

    API_KEY: ClassVar[int] = 28
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = 3
    transactional_id: str = ""
    group_id: str = ""
    producer_id: int = 0
    producer_epoch: int = 0
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None
    topics: Sequence[TxnOffsetCommitRequestTopic] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("transactional_id", "string", 0),
        Field("group_id", "string", 0),
        Field("producer_id", "int64", 0),
        Field("producer_epoch", "int16", 0),
        Field("generation_id", "int32", 3),
        Field("member_id", "string", 3),
        Field("group_instance_id", "string", 3, nullable=3),
        Field("topics", TxnOffsetCommitRequestTopic, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitResponsePartition(Struct):
    partition_index: int = 0
    error_code: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("partition_index", "int32", 0),
        Field("error_code", "int16", 0),
    )


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitResponseTopic(Struct):
    name: str = ""
    partitions: Sequence[TxnOffsetCommitResponsePartition] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("partitions", TxnOffsetCommitResponsePartition, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitResponse(Message):
    """TxnOffsetCommit response, versions 0-3 (flexible from 3)."""

    API_KEY: ClassVar[int] = 28
    VERSIONS: ClassVar[tuple[int, int]] = (0, 3)
    FLEXIBLE_FROM: ClassVar[int | None] = 3
    throttle_time_ms: int = 0
    topics: Sequence[TxnOffsetCommitResponseTopic] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("topics", TxnOffsetCommitResponseTopic, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class DescribeTransactionsRequest(Message):
    """DescribeTransactions request, versions 0-0 (flexible from 0)."""

    API_KEY: ClassVar[int] = 65
    VERSIONS: ClassVar[tuple[int, int]] = (0, 0)
    FLEXIBLE_FROM: ClassVar[int | None] = 0
    transactional_ids: Sequence[str] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("transactional_ids", "string", 0, array=True),)


@dataclass(frozen=True, slots=True)
class TopicData(Struct):
    topic: str = ""
    partitions: Sequence[int] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("topic", "string", 0),
        Field("partitions", "int32", 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class TransactionState(Struct):
    error_code: int = 0
    transactional_id: str = ""
    transaction_state: str = ""
    transaction_timeout_ms: int = 0
    transaction_start_time_ms: int = 0
    producer_id: int = 0
    producer_epoch: int = 0
    topics: Sequence[TopicData] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("error_code", "int16", 0),
        Field("transactional_id", "string", 0),
        Field("transaction_state", "string", 0),
        Field("transaction_timeout_ms", "int32", 0),
        Field("transaction_start_time_ms", "int64", 0),
        Field("producer_id", "int64", 0),
        Field("producer_epoch", "int16", 0),
        Field("topics", TopicData, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class DescribeTransactionsResponse(Message):
    """DescribeTransactions response, versions 0-0 (flexible from 0)."""

    API_KEY: ClassVar[int] = 65
    VERSIONS: ClassVar[tuple[int, int]] = (0, 0)
    FLEXIBLE_FROM: ClassVar[int | None] = 0
    throttle_time_ms: int = 0
    transaction_states: Sequence[TransactionState] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("transaction_states", TransactionState, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class ListTransactionsRequest(Message):
    """ListTransactions request, versions 0-1 (flexible from 0)."""

    API_KEY: ClassVar[int] = 66
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = 0
    state_filters: Sequence[str] = ()
    producer_id_filters: Sequence[int] = ()
    duration_filter: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("state_filters", "string", 0, array=True),
        Field("producer_id_filters", "int64", 0, array=True),
        Field("duration_filter", "int64", 1),
    )


@dataclass(frozen=True, slots=True)
class ListTransactionsTransactionState(Struct):
    transactional_id: str = ""
    producer_id: int = 0
    transaction_state: str = ""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("transactional_id", "string", 0),
        Field("producer_id", "int64", 0),
        Field("transaction_state", "string", 0),
    )


@dataclass(frozen=True, slots=True)
class ListTransactionsResponse(Message):
    """ListTransactions response, versions 0-1 (flexible from 0)."""

    API_KEY: ClassVar[int] = 66
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = 0
    throttle_time_ms: int = 0
    error_code: int = 0
    unknown_state_filters: Sequence[str] = ()
    transaction_states: Sequence[ListTransactionsTransactionState] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("error_code", "int16", 0),
        Field("unknown_state_filters", "string", 0, array=True),
        Field("transaction_states", ListTransactionsTransactionState, 0, array=True),
    )
