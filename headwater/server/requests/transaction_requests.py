"""The native transaction requests, as calls to the one transaction coordinator.

INIT_TRANSACTIONS, ADD_PARTITIONS_TO_TXN, ADD_ACKS_TO_TXN and END_TXN each become the coordinator's
call (`requests.transaction_coordinator`), as the Kafka front end's requests of the same meaning do
(`kafka.txn_handlers`): one model, two protocols. WRITE_TXN_MARKER and WRITE_TXN_ACKS are a
cluster broker's requests to a partition's owner (`TransactionCoordinator.marker_at_owner`,
`acks_at_owner`). The coordinator raises the precise
error (PRODUCER_FENCED, INVALID_TXN_STATE, CONCURRENT_TRANSACTIONS...), which is the answer.

Grants (`server.request_table`): adding a topic's partitions takes `produce` on it (the transaction
then writes them), and so do WRITE_TXN_MARKER and WRITE_TXN_ACKS (the peer token's grant; the owner
writes only the end, and applies only the acknowledgements, a transactional id's state decided, so
they let nobody decide one); adding acknowledgements of a
subscription's messages takes `consume` on its topic, and the subscription must be the principal's
(or `admin` on the topic), as attaching to it does (`security.access`). Each request naming a
transactional id also takes `produce` on `txn:<id>` (Kafka's WRITE on the TransactionalId;
TRANSACTIONAL_ID_NOT_AUTHORIZED without it, checked before the topic's grant as Kafka does).

The two requests naming a topic wait for the coordinator after their topic's turn is given up
(`AfterData`): the coordinator's end of a transaction takes a topic's turn to apply its
acknowledgements while it holds the transactional id, so a request waiting for the id inside a
turn could hold that turn against it.
"""

from __future__ import annotations

from headwater.server.reply import AfterData, AfterWork, Reply
from headwater.server.request_table import handles
from headwater.server.requests.transaction_coordinator import TransactionCoordinator
from headwater.server.topics.subscription_contract import ConsumerSession as Session
from headwater.wire import messages as m
from headwater.wire.errors import InvalidRequest


class TransactionRequests:
    def __init__(self, coordinator: TransactionCoordinator) -> None:
        self._coordinator = coordinator

    @handles(m.InitTransactionsRequest, transactional_id_field="transactional_id")
    def init_transactions(self, session: Session, request: m.InitTransactionsRequest) -> Reply:
        if request.timeout_ms < 0:
            raise InvalidRequest(
                f"transaction timeout {request.timeout_ms} ms: 0 (the server's default) or more"
            )
        return AfterWork(self._init(request))

    async def _init(self, request: m.InitTransactionsRequest) -> Reply:
        producer_id, epoch = await self._coordinator.init_producer_id(
            request.transactional_id,
            request.timeout_ms,
            request.producer_id,
            request.producer_epoch,
        )
        return m.InitProducerIdResponse(producer_id, epoch)

    @handles(
        m.AddPartitionsToTxnRequest, "topic", "produce", transactional_id_field="transactional_id"
    )
    def add_partitions(self, session: Session, request: m.AddPartitionsToTxnRequest) -> Reply:
        if not request.partitions:
            raise InvalidRequest("ADD_PARTITIONS_TO_TXN names no partition")
        return AfterData(self._add_partitions(request))

    async def _add_partitions(self, request: m.AddPartitionsToTxnRequest) -> Reply:
        await self._coordinator.add_partitions(
            request.transactional_id,
            request.producer_id,
            request.producer_epoch,
            [(request.topic, index) for index in request.partitions],
        )
        return m.EmptyResponse()

    @handles(m.AddAcksToTxnRequest, "topic", "consume", transactional_id_field="transactional_id")
    def add_acks(self, session: Session, request: m.AddAcksToTxnRequest) -> Reply:
        if not request.ranges and not request.positions:
            raise InvalidRequest("ADD_ACKS_TO_TXN names no range and no position")
        return AfterData(self._add_acks(request))

    async def _add_acks(self, request: m.AddAcksToTxnRequest) -> Reply:
        await self._coordinator.add_acks(
            request.transactional_id,
            request.producer_id,
            request.producer_epoch,
            request.topic,
            request.subscription,
            request.ranges,
            request.positions,
        )
        return m.EmptyResponse()

    @handles(m.EndTxnRequest, transactional_id_field="transactional_id")
    def end(self, session: Session, request: m.EndTxnRequest) -> Reply:
        return AfterWork(self._end(request))

    async def _end(self, request: m.EndTxnRequest) -> Reply:
        await self._coordinator.end(
            request.transactional_id, request.producer_id, request.producer_epoch, request.commit
        )
        return m.EmptyResponse()

    @handles(m.WriteTxnMarkerRequest, "topic", "produce")
    def write_marker(self, session: Session, request: m.WriteTxnMarkerRequest) -> Reply:
        return AfterData(self._write_marker(request))

    async def _write_marker(self, request: m.WriteTxnMarkerRequest) -> Reply:
        await self._coordinator.marker_at_owner(
            request.topic,
            request.partition,
            request.producer_id,
            request.producer_epoch,
            request.commit,
        )
        return m.EmptyResponse()

    @handles(m.WriteTxnAcksRequest, "topic", "produce")
    def write_acks(self, session: Session, request: m.WriteTxnAcksRequest) -> Reply:
        return AfterData(self._write_acks(request))

    async def _write_acks(self, request: m.WriteTxnAcksRequest) -> Reply:
        await self._coordinator.acks_at_owner(request)
        return m.EmptyResponse()
