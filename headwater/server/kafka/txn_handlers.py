"""Kafka's transaction APIs as calls to the one transaction coordinator.

The coordinator is `server.requests.transaction_coordinator`. InitProducerId with a transactional
id, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit and EndTxn each become the
coordinator's call of the same name; DescribeTransactions and ListTransactions read its states.
FindCoordinator with key type 1 (transaction) answers as for a group (`group_handlers`). Each
refusal is the Kafka error a client acts on (`kafka_errors`); PRODUCER_FENCED is told as
INVALID_PRODUCER_EPOCH to the versions older than the one that added it, as Kafka's broker does.

Grants (docs/SECURITY.md), as Kafka's ACLs: every request using a transactional id takes `produce`
on `txn:<id>` (Kafka's WRITE on the TransactionalId), checked first:
TRANSACTIONAL_ID_AUTHORIZATION_FAILED without it. Adding a partition to a transaction, and so
writing it, also takes the produce grant on its topic; sending a group's offsets the consume
grant on each topic named, as OffsetCommit does. DescribeTransactions answers
TRANSACTIONAL_ID_AUTHORIZATION_FAILED for an id the principal has no grant on (Kafka's DESCRIBE,
which WRITE implies), and ListTransactions leaves such ids out.
"""

from __future__ import annotations

import time
from typing import Final

import structlog

from headwater.durables.transaction_state import PendingOffset, TxnState
from headwater.server.kafka import kafka_errors as k
from headwater.server.kafka.group_handlers import (
    KafkaSession,
    Pace,
    Permits,
    may_describe,
    may_use,
)
from headwater.server.kafka.messages import produce as pr
from headwater.server.kafka.messages import transactions as tx
from headwater.server.requests.transaction_coordinator import TransactionCoordinator
from headwater.server.security.authz import Action
from headwater.wire.errors import HeadwaterError

log = structlog.get_logger(__name__)

# the first version of each API that may carry PRODUCER_FENCED (older ones are told
# INVALID_PRODUCER_EPOCH)
_FENCED_FROM: Final = {"InitProducerId": 4, "EndTxn": 2, "AddOffsetsToTxn": 2, "AddPartitions": 2}
_OPERATION_NOT_ATTEMPTED: Final = 55


def _code(error: HeadwaterError, api: str, version: int) -> int:
    code = k.kafka_code(error)
    if code == k.PRODUCER_FENCED and version < _FENCED_FROM.get(api, 1 << 16):
        return k.INVALID_PRODUCER_EPOCH
    return code


class TransactionHandlers:
    def __init__(self, coordinator: TransactionCoordinator, permits: Permits) -> None:
        self._coordinator = coordinator
        self._permits = permits

    async def init_producer_id(
        self, session: KafkaSession, version: int, request: pr.InitProducerIdRequest
    ) -> pr.InitProducerIdResponse:
        assert request.transactional_id is not None
        if not may_use(self._permits, session, request.transactional_id):
            return pr.InitProducerIdResponse(
                error_code=k.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                producer_id=-1,
                producer_epoch=-1,
            )
        if request.transaction_timeout_ms <= 0:
            # Kafka's rule: 1 ms or more (0 is not "the default" here, as it is natively)
            return pr.InitProducerIdResponse(
                error_code=k.INVALID_TRANSACTION_TIMEOUT, producer_id=-1, producer_epoch=-1
            )
        try:
            producer_id, epoch = await self._coordinator.init_producer_id(
                request.transactional_id,
                request.transaction_timeout_ms,
                request.producer_id if version >= 3 else -1,
                request.producer_epoch if version >= 3 else -1,
            )
        except HeadwaterError as exc:
            log.info(
                "kafka.init_producer_id_refused",
                transactional_id=request.transactional_id,
                error=str(exc),
            )
            return pr.InitProducerIdResponse(
                error_code=_code(exc, "InitProducerId", version), producer_id=-1, producer_epoch=-1
            )
        return pr.InitProducerIdResponse(
            error_code=0, producer_id=producer_id, producer_epoch=epoch
        )

    async def add_partitions_to_txn(
        self, session: KafkaSession, version: int, request: tx.AddPartitionsToTxnRequest
    ) -> tx.AddPartitionsToTxnResponse:
        wanted = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
        codes: dict[tuple[str, int], int] = {}
        usable = may_use(self._permits, session, request.v3_and_below_transactional_id)
        for name, index in wanted:
            if not usable:
                codes[(name, index)] = k.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            elif not self._permits(session, Action.PRODUCE, name):
                codes[(name, index)] = k.TOPIC_AUTHORIZATION_FAILED
        if not codes:
            try:
                await self._coordinator.add_partitions(
                    request.v3_and_below_transactional_id,
                    request.v3_and_below_producer_id,
                    request.v3_and_below_producer_epoch,
                    wanted,
                )
            except HeadwaterError as exc:
                # which partition failed: the first one the coordinator refused, the others were
                # not attempted (Kafka's answer)
                code = _code(exc, "AddPartitions", version)
                log.info("kafka.add_partitions_refused", error=str(exc))
                bad = _partition_of(exc, wanted)
                for where in wanted:
                    if bad is None or where == bad:
                        codes[where] = code
                    else:
                        codes[where] = _OPERATION_NOT_ATTEMPTED
        elif len(codes) < len(wanted):
            for where in wanted:
                codes.setdefault(where, _OPERATION_NOT_ATTEMPTED)
        by_topic: dict[str, list[tx.AddPartitionsToTxnPartitionResult]] = {}
        pace = Pace()
        for name, index in wanted:
            by_topic.setdefault(name, []).append(
                tx.AddPartitionsToTxnPartitionResult(
                    partition_index=index, partition_error_code=codes.get((name, index), 0)
                )
            )
            await pace.step()
        return tx.AddPartitionsToTxnResponse(
            throttle_time_ms=0,
            results_by_topic_v3_and_below=[
                tx.AddPartitionsToTxnTopicResult(name=n, results_by_partition=r)
                for n, r in by_topic.items()
            ],
        )

    async def add_offsets_to_txn(
        self, session: KafkaSession, version: int, request: tx.AddOffsetsToTxnRequest
    ) -> tx.AddOffsetsToTxnResponse:
        if not may_use(self._permits, session, request.transactional_id):
            return tx.AddOffsetsToTxnResponse(
                throttle_time_ms=0, error_code=k.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            )
        try:
            await self._coordinator.add_offsets(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.group_id,
            )
        except HeadwaterError as exc:
            log.info("kafka.add_offsets_refused", group=request.group_id, error=str(exc))
            return tx.AddOffsetsToTxnResponse(
                throttle_time_ms=0, error_code=_code(exc, "AddOffsetsToTxn", version)
            )
        return tx.AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=0)

    async def txn_offset_commit(
        self, session: KafkaSession, version: int, request: tx.TxnOffsetCommitRequest
    ) -> tx.TxnOffsetCommitResponse:
        offsets = [
            PendingOffset(request.group_id, t.name, p.partition_index, p.committed_offset)
            for t in request.topics
            for p in t.partitions
        ]
        denied = {o.topic for o in offsets if not self._permits(session, Action.CONSUME, o.topic)}
        code = k.TOPIC_AUTHORIZATION_FAILED if denied else 0
        if not may_use(self._permits, session, request.transactional_id):
            denied, code = set(), k.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        elif not denied:
            try:
                await self._coordinator.commit_offsets(
                    request.transactional_id, request.producer_id, request.producer_epoch, offsets
                )
            except HeadwaterError as exc:
                log.info("kafka.txn_offset_commit_refused", group=request.group_id, error=str(exc))
                code = _code(exc, "TxnOffsetCommit", version)
        return tx.TxnOffsetCommitResponse(
            throttle_time_ms=0,
            topics=[
                tx.TxnOffsetCommitResponseTopic(
                    name=t.name,
                    partitions=[
                        tx.TxnOffsetCommitResponsePartition(
                            partition_index=p.partition_index,
                            error_code=k.TOPIC_AUTHORIZATION_FAILED if t.name in denied else code,
                        )
                        for p in t.partitions
                    ],
                )
                for t in request.topics
            ],
        )

    async def end_txn(
        self, session: KafkaSession, version: int, request: tx.EndTxnRequest
    ) -> tx.EndTxnResponse:
        if not may_use(self._permits, session, request.transactional_id):
            return tx.EndTxnResponse(
                throttle_time_ms=0, error_code=k.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            )
        try:
            await self._coordinator.end(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.committed,
            )
        except HeadwaterError as exc:
            log.info(
                "kafka.end_txn_refused",
                transactional_id=request.transactional_id,
                commit=request.committed,
                error=str(exc),
            )
            return tx.EndTxnResponse(throttle_time_ms=0, error_code=_code(exc, "EndTxn", version))
        return tx.EndTxnResponse(throttle_time_ms=0, error_code=0)

    async def describe_transactions(
        self, session: KafkaSession, version: int, request: tx.DescribeTransactionsRequest
    ) -> tx.DescribeTransactionsResponse:
        states = []
        for transactional_id in request.transactional_ids:
            allowed = may_describe(self._permits, session, transactional_id)
            txn = self._coordinator.get(transactional_id) if allowed else None
            if txn is None:
                states.append(
                    tx.TransactionState(
                        error_code=k.TRANSACTIONAL_ID_NOT_FOUND
                        if allowed
                        else k.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                        transactional_id=transactional_id,
                        transaction_state="",
                        transaction_timeout_ms=0,
                        transaction_start_time_ms=-1,
                        producer_id=-1,
                        producer_epoch=-1,
                    )
                )
                continue
            topics: dict[str, list[int]] = {}
            for name, index in sorted(txn.partitions):
                topics.setdefault(name, []).append(index)
            states.append(
                tx.TransactionState(
                    error_code=0,
                    transactional_id=transactional_id,
                    transaction_state=str(txn.state),
                    transaction_timeout_ms=txn.timeout_ms,
                    transaction_start_time_ms=txn.started_ms,
                    producer_id=txn.producer_id,
                    producer_epoch=txn.epoch,
                    topics=[tx.TopicData(topic=n, partitions=p) for n, p in topics.items()],
                )
            )
        return tx.DescribeTransactionsResponse(throttle_time_ms=0, transaction_states=states)

    async def list_transactions(
        self, session: KafkaSession, version: int, request: tx.ListTransactionsRequest
    ) -> tx.ListTransactionsResponse:
        known = {str(s) for s in TxnState}
        unknown = [s for s in request.state_filters if s not in known]
        wanted_states = set(request.state_filters) & known
        producers = set(request.producer_id_filters)
        now_ms = _now_ms()
        listed = []
        for txn in self._coordinator.transactions():
            if wanted_states and str(txn.state) not in wanted_states:
                continue
            if producers and txn.producer_id not in producers:
                continue
            if not may_describe(self._permits, session, txn.transactional_id):
                continue
            # (Kafka's rule: a transaction not in progress started at -1, so it always passes)
            if version >= 1 and 0 <= request.duration_filter > now_ms - txn.started_ms:
                continue
            listed.append(
                tx.ListTransactionsTransactionState(
                    transactional_id=txn.transactional_id,
                    producer_id=txn.producer_id,
                    transaction_state=str(txn.state),
                )
            )
        return tx.ListTransactionsResponse(
            throttle_time_ms=0,
            error_code=0,
            unknown_state_filters=unknown,
            transaction_states=listed,
        )


def _now_ms() -> int:
    return int(time.time() * 1000)


def _partition_of(error: HeadwaterError, wanted: list[tuple[str, int]]) -> tuple[str, int] | None:
    """The partition a refusal names (an unknown topic or partition), if one of `wanted`."""
    for name, index in wanted:
        if f"topic {name!r}" in error.message and (
            "partition" not in error.message or f"partition {index}" in error.message
        ):
            return name, index
    return None
