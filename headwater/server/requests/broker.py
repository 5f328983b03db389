"""The broker: one handler per request type, and the turns that keep requests on a topic in order.

Handlers run on the event loop and return a `server.reply.Reply`: the response itself when
it is ready (a non-reliable produce is a validate, a stamp and a fan-out), or a `Waiting` that says
what it waits for: `AfterDurable` (a reliable produce under fsync `always` waits for its group
commit) or `AfterWork` (a reliable subscribe may read the WAL to find a timestamp). Each raises a
`HeadwaterError` subclass for a bad request; the connection turns it into an error response.
Consumer requests are in `server.requests.consumer_requests`, map requests in
`server.requests.map_requests`, FETCH in `server.requests.fetch`, the transaction requests in
`server.requests.transaction_requests`.

Topics and subscriptions live in `TopicCatalog`, which owns their files and state. Requests that
change a topic or may await while acting on it (create, delete, subscribe, seek,
DELETE_SUBSCRIPTION, a map request whose state is not built yet) run in a turn of the topic's name
(`server.topic_turns`), taken when the request is read; so does any other request naming a
topic whose line is not empty, so pipelined requests keep their order. A handler in a turn looks the
topic up once the turn is its own: a request that lost a race with a delete gets UNKNOWN_TOPIC,
never a half-made subscription on a deleted topic. What a handler does in its turn is its work
(`AfterWork`); its durability wait (`AfterDurable`) comes after the turn is given up, so the
produces queued behind it do not wait for its fsync.

Idempotent produces in a cluster (docs/CLUSTER.md) may have to wait before their sequence can be
checked: for the partition's producer table, which a new owner rebuilds from the object store in
the background (`LogPartition.producers_ready`), or for a read of etcd's producer-id counter (an
id another broker issued since this one last looked). The rebuild reads the newest part of the
log first: a batch the table already answers as it will once whole (`ProducerTable.answers`: the
producer's retry of a batch found, or its next one) does not wait for the rest, and a waiting one
looks again each time the rebuild found more (`LogPartition.producers_found`). Such a produce
waits in its producer's queue of waiting idempotent produces on the partition, and every later
produce of that producer there queues behind it until the queue is empty, so a producer's batches
are still checked and appended in the order they came (another producer's do not wait for it: one
the rebuild has not met yet waits for all of it); non-idempotent produces never wait. The wait
holds no turn of the topic (one that came in a turn gives it up first, `AfterData`), so the
topic's other produces are not held up by a rebuild; the append takes the turn again when the
line is busy.

In a cluster, a produce for a partition this broker is taking over right now (its ownership key
won, the take-over's object-store claim under way: `Ownership.taking_over`) waits for the
take-over to end and then goes as if it had just come (`AfterOwner`, outside the topic's turn,
which the take-over holds); later produces for the partition queue behind it, in order. Clients
learn of a new owner from LOOKUP as soon as its key exists, a few hundred ms before it serves, and
a NOT_OWNER answer then sent them back to look up and retry (issue 42).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, overload

from headwater.durables.producers import ProducerTable
from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.config import ServerConfig
from headwater.server.reply import (
    AfterData,
    AfterDurable,
    AfterOwner,
    AfterWork,
    Reply,
    Waiting,
    after,
)
from headwater.server.request_table import REQUESTS, bind, handles
from headwater.server.requests.admin_requests import AdminHandlers
from headwater.server.requests.consumer_requests import ConsumerHandlers
from headwater.server.requests.fetch import FetchHandler
from headwater.server.requests.group_offsets import GroupOffsets
from headwater.server.requests.lookup import LookupHandler
from headwater.server.requests.map_requests import MapHandlers
from headwater.server.requests.partition_ownership import (
    BrokerAddress,
    Ownership,
    not_owner,
)
from headwater.server.requests.placement import Placement, SingleBrokerPlacement
from headwater.server.requests.topic_definitions import (
    TopicDefinitions,
)
from headwater.server.requests.transaction_coordinator import TransactionCoordinator
from headwater.server.requests.transaction_requests import TransactionRequests
from headwater.server.schemas.schema_registry import SchemaHandlers
from headwater.server.topic_turns import Turn
from headwater.server.topics.subscription_contract import Consumer
from headwater.server.topics.subscription_contract import ConsumerSession as Session
from headwater.server.topics.topic import (
    LogPartition,
    LogTopic,
    MemoryPartition,
    MemoryTopic,
    Topic,
)
from headwater.wire import messages as m
from headwater.wire.errors import (
    InvalidRequest,
    InvalidTopicName,
    NotSupported,
    RecordTooLarge,
    StorageError,
    UnknownProducerId,
    UnknownTopic,
)
from headwater.wire.names import is_dead_letter_name
from headwater.wire.protocol import REQUEST_API_KEYS, SUPPORTED_VERSIONS
from headwater.wire.records import (
    BatchInfo,
    Compression,
    inspect_batch,
    read_records,
    validate_records,
)

Handler = Callable[[Session, Any], Reply]

# how long an idempotent produce waits for its partition's producer table or the producer-id
# counter before it is answered STORAGE_ERROR (retriable: the producer resends the same batch)
PRODUCER_WAIT = 10.0
# the longest a produce waits for this broker's take-over of its partition (then NOT_OWNER): a
# take-over is a claim and a marker in the object store, bounded by `acquire_timeout` (30 s)
TAKE_OVER_WAIT = 10.0
_TABLE_LOOKS = 100_000  # bounds a produce's looks at a rebuilt table (one each time it found more)


class Broker:
    def __init__(
        self,
        config: ServerConfig,
        catalog: TopicCatalog,
        connections: Callable[[], int] = lambda: 0,
        placement: Placement | None = None,
        offsets: GroupOffsets | None = None,
    ) -> None:
        """`placement`: the deployment this broker serves in (`server.requests.placement`), the
        catalog's own; by default one broker on `config`'s address. `offsets`: the groups'
        offsets (a cluster's keep them where every broker reads them); by default this
        broker's cursors."""
        self._config = config
        self.catalog = catalog
        if placement is None:
            placement = SingleBrokerPlacement(BrokerAddress("local", config.host, config.port))
        self.ownership: Ownership = placement.ownership
        gate = placement.subscribe_gate(catalog)
        self.consumers = ConsumerHandlers(config, catalog, on_detached=gate.detached_consumer)
        self.memory = self.consumers.memory  # the server's memory budget (server info, metrics)
        self.admin = AdminHandlers(
            catalog, config.data_dir, connections, self.memory, config.max_connections
        )
        self.maps = MapHandlers(catalog, self.ownership)
        self.fetches = FetchHandler(catalog, self.ownership)
        self._producer_ids = placement.producer_ids(catalog)
        self.group_offsets = offsets or GroupOffsets(catalog)
        self.transactions = TransactionCoordinator(
            catalog,
            self._producer_ids,
            self.ownership,
            self.group_offsets,
            placement.transactions(catalog),
        )
        # (topic, partition, producer id) -> the producer's last idempotent produce waiting
        # there: its later ones queue behind it, so its batches keep their order (module doc)
        self._waiting: dict[tuple[str, int, int], asyncio.Future[None]] = {}
        # per partition, the last produce waiting for this broker's take-over of it
        self._take_over_line: dict[tuple[str, int], asyncio.Future[None]] = {}
        self.definitions: TopicDefinitions = placement.definitions(catalog)
        consumers = self.consumers
        schemas = SchemaHandlers(catalog.schemas, catalog.topics)
        handlers: dict[type, Handler] = bind(
            self,
            consumers,
            self.fetches,
            self.maps,
            self.admin,
            schemas,
            LookupHandler(self.ownership, catalog.topics),
            TransactionRequests(self.transactions),
        )
        # what SUBSCRIBE passes first (a cluster claims an Exclusive subscription in etcd)
        handlers[m.SubscribeRequest] = gate.wrap(consumers.subscribe)
        self._handlers = handlers
        # AUTHENTICATE is the connection's, before the broker (security.access)
        missing = set(REQUEST_API_KEYS) - set(self._handlers) - {m.AuthenticateRequest}
        if missing:
            raise TypeError(f"requests with no handler: {sorted(t.__name__ for t in missing)}")

    @property
    def topics(self) -> dict[str, Topic]:
        return self.catalog.topics

    def handle(self, session: Session, request: m.Request) -> Reply:
        handler = self._handlers[type(request)]
        kind = REQUESTS[type(request)]
        name = kind.topic(request)
        if name is not None and (
            kind.in_turn
            or self._busy(name, request)
            or (kind.last_value and not self.maps.ready(name))
        ):
            return AfterWork(self._in_turn(self.catalog.turn(name), handler, session, request))
        return handler(session, request)

    def _busy(self, name: str, request: m.Request) -> bool:
        """Whether the request queues in its topic's line: any turn there holds it, but a
        take-over's (`topic_turns`) holds no produce."""
        if type(request) is m.ProduceRequest:
            return self.catalog.blocks_produce(name)
        return self.catalog.busy(name)

    @staticmethod
    async def _in_turn(turn: Turn, handler: Handler, session: Session, request: m.Request) -> Reply:
        async with turn:
            reply = handler(session, request)
            while isinstance(reply, AfterWork):
                reply = await reply.work
        return reply  # a durability wait needs no turn

    def _topic(self, name: str) -> Topic:
        topic = self.catalog.topics.get(name)
        if topic is None:
            raise UnknownTopic(f"topic {name!r} does not exist")
        return topic

    def detach(self, consumer: Consumer) -> None:
        """A consumer's connection closed."""
        self.consumers.detach(consumer)

    # Messages

    @handles(m.ProduceRequest, "topic", "produce")
    def produce(
        self,
        session: Session,
        request: m.ProduceRequest,
        info: BatchInfo | None = None,
        schema_checked: bool = False,
        queued: bool = False,
    ) -> Reply:
        """`info`: the batch already validated (the connection inflates large ones off the loop);
        `schema_checked`: its records already passed the topic's schema (there too); `queued`:
        it waited for a take-over of its partition and goes now."""
        if not queued:
            waiting = self._after_take_over(session, request, info, schema_checked)
            if waiting is not None:
                return waiting
        topic = self._topic(request.topic)
        if request.isolation not in (m.Isolation.APPENDED, m.Isolation.FSYNCED):
            raise InvalidRequest(f"unknown isolation {request.isolation} (0 appended, 1 fsynced)")
        if topic.reliable and len(request.batch) > topic.settings.max_message_bytes:
            raise RecordTooLarge(
                f"record batch of {len(request.batch)} bytes exceeds topic {topic.name!r}'s "
                f"max.message.bytes {topic.settings.max_message_bytes}"
            )
        if info is None:
            info = self._check_batch(topic, request.batch)
        schemas = self.catalog.schemas.validating.get(request.topic)
        if schemas is not None and not schema_checked:  # the one per-record cost
            schemas.check_batch(request.batch, self._config.max_decompressed_batch)
        if not topic.reliable:
            return self._publish(topic, request, info)
        return self._append(topic, request, info)

    def produce_validated(
        self,
        session: Session,
        request: m.ProduceRequest,
        info: BatchInfo | None,
        schema_checked: bool = False,
        queued: bool = False,
    ) -> Reply:
        """A produce the connection validated itself (off the loop, `produce`'s `info` and
        `schema_checked`): in its topic's turn when the topic's line is busy, as `handle` puts
        every request, so it neither overtakes a producer's earlier batch waiting there nor
        appends while a delete holds the topic (a take-over's turn holds no produce:
        `topic_turns`)."""
        if self.catalog.blocks_produce(request.topic):
            go = partial(self.produce, info=info, schema_checked=schema_checked, queued=queued)
            return AfterWork(self._in_turn(self.catalog.turn(request.topic), go, session, request))
        return self.produce(session, request, info, schema_checked, queued)

    def _after_take_over(
        self,
        session: Session,
        request: m.ProduceRequest,
        info: BatchInfo | None,
        schema_checked: bool,
    ) -> Reply | None:
        """The produce, once this broker's take-over of its partition under way ends and the
        produces for the partition queued before it went; None when it need not wait."""
        key = (request.topic, request.partition)
        previous = self._take_over_line.get(key)
        wait = previous if previous is not None else self.ownership.taking_over(*key)
        if wait is None:
            return None
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._take_over_line[key] = mine
        go = partial(self.produce_validated, info=info, schema_checked=schema_checked, queued=True)
        return AfterOwner(self._queued_for_take_over(key, wait, mine, go, session, request))

    async def _queued_for_take_over(
        self,
        key: tuple[str, int],
        wait: asyncio.Future[None],
        mine: asyncio.Future[None],
        go: Handler,
        session: Session,
        request: m.ProduceRequest,
    ) -> Reply:
        try:
            # bounded; never cancels `wait` (the coordinator's, or the produce before this one)
            await asyncio.wait([wait], timeout=TAKE_OVER_WAIT)
            # what it returns holds this produce's place (a turn, its producer's queue) before
            # the next one in the line goes
            return go(session, request)
        finally:
            mine.set_result(None)
            if self._take_over_line.get(key) is mine:
                del self._take_over_line[key]

    def _check_batch(self, topic: Topic, batch: bytes) -> BatchInfo:
        """What a produce's batch must pass. A non-reliable topic keeps nothing and has no
        last-value state, so an uncompressed batch there is checked by its header and CRC alone
        and fanned out undecoded (a record that does not decode ends the consumers that got it,
        and no later one). Reliable topics store what they take: every record is decoded once
        (in C), so a stored batch always reads."""
        if not topic.reliable:
            info = inspect_batch(batch)
            if info.compression == Compression.NONE:
                return info
        return validate_records(batch, self._config.max_decompressed_batch)

    def _publish(self, topic: MemoryTopic, request: m.ProduceRequest, info: BatchInfo) -> Reply:
        if info.transactional:
            raise NotSupported(
                f"topic {topic.name!r} is non-reliable: transactions write reliable topics only"
            )
        partition = self._pick(topic, request.partition)
        if not self.ownership.serves(topic.name, partition.index):
            raise not_owner(self.ownership, topic.name, partition.index)
        if info.producer_id < 0:
            base_offset, _ = topic.accept(partition, request.batch, info.record_count, False)
            return m.ProduceResponse(partition.index, base_offset)
        return self._idempotent(
            topic,
            partition,
            request,
            info,
            lambda: self._publish_idempotent(topic, partition, request, info),
        )

    def _publish_idempotent(
        self,
        topic: MemoryTopic,
        partition: MemoryPartition,
        request: m.ProduceRequest,
        info: BatchInfo,
    ) -> Reply:
        original = self._check_producer(request, info, partition.producers)
        if original is not None:  # a retry of a batch already appended
            return m.ProduceResponse(partition.index, original)
        base_offset, _ = topic.accept(partition, request.batch, info.record_count, False)
        partition.producers.record(
            info.producer_id,
            info.base_sequence,
            info.record_count,
            base_offset,
            info.producer_epoch,
        )
        return m.ProduceResponse(partition.index, base_offset)

    def _append(self, topic: LogTopic, request: m.ProduceRequest, info: BatchInfo) -> Reply:
        committed = request.isolation == m.Isolation.FSYNCED
        if request.partition == -1 and topic.last_value is not None:
            records = read_records(request.batch, self._config.max_decompressed_batch)
            partition = topic.partitions[topic.last_value.partition_for(records)]
        else:
            partition = self._pick(topic, request.partition)
        if not self.ownership.serves(topic.name, partition.index):
            raise not_owner(self.ownership, topic.name, partition.index)
        counts = [(partition, info.record_count)]
        if info.producer_id < 0:
            return topic.when_leased(
                counts, lambda: self._append_now(topic, partition, request, info, committed)
            )
        return self._idempotent(
            topic,
            partition,
            request,
            info,
            lambda: topic.when_leased(
                counts, lambda: self._append_idempotent(topic, partition, request, info, committed)
            ),
        )

    def _append_now(
        self,
        topic: LogTopic,
        partition: LogPartition,
        request: m.ProduceRequest,
        info: BatchInfo,
        committed: bool,
    ) -> Reply:
        """The append, once the offset lease covers it (`LogTopic.when_leased`)."""
        if not self.ownership.serves(topic.name, partition.index):
            raise not_owner(self.ownership, topic.name, partition.index)  # moved while it waited
        base_offset, durable = topic.accept(partition, request.batch, info.record_count, committed)
        response = m.ProduceResponse(partition.index, base_offset)
        return response if durable is None else AfterDurable(response, durable)

    def _append_idempotent(
        self,
        topic: LogTopic,
        partition: LogPartition,
        request: m.ProduceRequest,
        info: BatchInfo,
        committed: bool,
    ) -> Reply:
        if not self.ownership.serves(topic.name, partition.index):
            # moved while it waited (the offset lease, the producer table's rebuild), or this
            # broker woke from a freeze past its lease: refused before anything is appended
            raise not_owner(self.ownership, topic.name, partition.index)
        if info.transactional:  # checked now, with no await before the append
            # before the sequence: a batch of an epoch the coordinator does not hold is
            # INVALID_PRODUCER_EPOCH whatever its sequence (it was OUT_OF_ORDER_SEQUENCE for a
            # newer epoch's), and a retry arriving after its transaction ended is refused
            self.transactions.verify(
                info.producer_id, info.producer_epoch, topic.name, partition.index
            )
        original = self._check_producer(request, info, partition.producers)
        if original is not None:  # a retry of a batch already appended
            return m.ProduceResponse(partition.index, original)
        base_offset, durable = topic.accept(partition, request.batch, info.record_count, committed)
        entry = partition.producers.record(
            info.producer_id,
            info.base_sequence,
            info.record_count,
            base_offset,
            info.producer_epoch,
        )
        saved = self.catalog.producers.save(topic, partition.index, info.producer_id, entry)
        return after(m.ProduceResponse(partition.index, base_offset), durable, saved)

    @overload
    def _pick(self, topic: MemoryTopic, requested: int) -> MemoryPartition: ...

    @overload
    def _pick(self, topic: LogTopic, requested: int) -> LogPartition: ...

    def _pick(self, topic: Topic, requested: int) -> MemoryPartition | LogPartition:
        """The partition asked for; for -1, the next in turn (in a cluster, of those served
        here: a producer that leaves the choice to the broker is never sent elsewhere)."""
        partition = topic.pick_partition(requested)
        if requested == -1:
            for _ in range(len(topic.partitions)):
                if self.ownership.serves(topic.name, partition.index):
                    break
                partition = topic.pick_partition(requested)
        return partition

    def _check_producer(
        self, request: m.ProduceRequest, info: BatchInfo, producers: ProducerTable
    ) -> int | None:
        """The original offset if this batch retries an appended one; None if it is new."""
        if request.partition == -1:
            raise InvalidRequest("an idempotent producer must name the partition")
        if not self._issued(info.producer_id):
            raise UnknownProducerId(f"producer id {info.producer_id} was not issued by this server")
        return producers.check(
            info.producer_id, info.base_sequence, info.record_count, info.producer_epoch
        )

    def _issued(self, producer_id: int) -> bool:
        return self._producer_ids.issued(producer_id)

    def _idempotent(
        self,
        topic: Topic,
        partition: MemoryPartition | LogPartition,
        request: m.ProduceRequest,
        info: BatchInfo,
        go: Callable[[], Reply],
    ) -> Reply:
        """`go()` (check the sequence and append) now, or once what the batch waits for is
        there and the produces of its producer queued before it on the partition are done."""
        key = (topic.name, partition.index, info.producer_id)
        if key not in self._waiting and not self._must_wait(topic, partition, info):
            return go()
        if request.partition == -1:
            raise InvalidRequest("an idempotent producer must name the partition")
        previous = self._waiting.get(key)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[key] = mine
        # awaited outside the topic's turn (`AfterData`): a produce that came while the line
        # was busy (a take-over of another partition holds it while it claims) held the turn
        # for the whole rebuild of the table, and every other produce to the topic here queued
        # behind it: 5.5 s without an ack on the new owner's other partitions (issue 42). The
        # producer's queue (`_waiting`) keeps the order; the append takes the turn if busy
        return AfterData(self._queued(key, previous, mine, topic, partition, info, go))

    def _must_wait(
        self, topic: Topic, partition: MemoryPartition | LogPartition, info: BatchInfo
    ) -> bool:
        if self._table_wait(partition, info) is not None:
            return True
        return self._producer_ids.unknown_yet(info.producer_id) or self._unverified(
            topic, partition, info
        )

    def _unverified(
        self, topic: Topic, partition: MemoryPartition | LogPartition, info: BatchInfo
    ) -> bool:
        """A transactional batch the coordinator's state, as known here, refuses for now (in a
        cluster the state may have moved at another broker: it is read again first)."""
        return info.transactional and self.transactions.unverified(
            info.producer_id, info.producer_epoch, topic.name, partition.index
        )

    @staticmethod
    def _table_wait(
        partition: MemoryPartition | LogPartition, info: BatchInfo
    ) -> asyncio.Future[None] | None:
        """The rebuild of the partition's producer table the batch waits for, if any: not
        once the table answers it as it will when whole (a transactional batch waits for the
        whole of it: the partition's transactions come from the same rebuild)."""
        ready = partition.producers_ready
        if ready is None or ready.done():
            return None
        answered = partition.producers.answers(
            info.producer_id, info.base_sequence, info.record_count, info.producer_epoch
        )
        return None if answered and not info.transactional else ready

    async def _queued(
        self,
        key: tuple[str, int, int],
        previous: asyncio.Future[None] | None,
        mine: asyncio.Future[None],
        topic: Topic,
        partition: MemoryPartition | LogPartition,
        info: BatchInfo,
        go: Callable[[], Reply],
    ) -> Reply:
        try:
            deadline = asyncio.get_running_loop().time() + PRODUCER_WAIT
            if previous is not None:
                await asyncio.wait([previous])  # (never cancels it: it is not ours)
            # bounded: each look follows more found, or a table rebuilt again (the partition
            # lost and taken over meanwhile)
            for _ in range(_TABLE_LOOKS):
                wait = self._table_wait(partition, info)
                if wait is None:
                    break
                found = partition.producers_found
                await self._bounded(_either(wait, found), deadline, key)
            if self._producer_ids.unknown_yet(info.producer_id):
                # issued by another broker after this one last read the counter
                await self._bounded(self._producer_ids.refresh(), deadline, key)
            if self._unverified(topic, partition, info):
                # its transaction's state changed at another broker after this one last saw it
                await self._bounded(self.transactions.catch_up(info.producer_id), deadline, key)
            if self.catalog.blocks_produce(topic.name):  # a create or delete holds the topic
                async with self.catalog.turn(topic.name):
                    return self._go_if_served(topic, partition, go)
            return self._go_if_served(topic, partition, go)
        finally:
            mine.set_result(None)
            if self._waiting.get(key) is mine:
                del self._waiting[key]

    def _go_if_served(
        self, topic: Topic, partition: MemoryPartition | LogPartition, go: Callable[[], Reply]
    ) -> Reply:
        if self.catalog.topics.get(topic.name) is not topic:
            raise UnknownTopic(f"topic {topic.name!r} does not exist")
        if not self.ownership.serves(topic.name, partition.index):
            raise not_owner(self.ownership, topic.name, partition.index)
        return go()

    @staticmethod
    async def _bounded(wait: Awaitable[None], deadline: float, key: tuple[str, int, int]) -> None:
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(max(remaining, 0.001)):
                await wait
        except TimeoutError:
            topic, partition, _ = key
            raise StorageError(
                f"{topic}/{partition}: the idempotent producers' state is not ready yet"
            ) from None

    @handles(m.InitProducerIdRequest)
    def init_producer_id(self, session: Session, request: m.InitProducerIdRequest) -> Reply:
        return self._producer_ids.init_producer_id()

    # Admin

    @handles(m.CreateTopicRequest, "name", "admin", in_turn=True)
    def create_topic(self, session: Session, request: m.CreateTopicRequest) -> Reply:
        if is_dead_letter_name(request.name):  # only the server creates these (deadletter)
            raise InvalidTopicName(
                f"topic name {request.name!r} is reserved: a name ending -<16 hex digits>-DLQ "
                "is a dead-letter topic's, which the server creates on first use"
            )
        return AfterWork(self._create_topic(request))

    async def _create_topic(self, request: m.CreateTopicRequest) -> Reply:
        await self.definitions.create_topic(request)
        return m.EmptyResponse()

    @handles(m.DeleteTopicRequest, "name", "admin", in_turn=True)
    def delete_topic(self, session: Session, request: m.DeleteTopicRequest) -> Reply:
        return AfterWork(self._delete_topic(request))

    async def _delete_topic(self, request: m.DeleteTopicRequest) -> Reply:
        self._topic(request.name)
        await self.definitions.delete_topic(request.name)
        return m.EmptyResponse()

    @handles(m.CreatePartitionsRequest, "name", "admin", in_turn=True)
    def create_partitions(self, session: Session, request: m.CreatePartitionsRequest) -> Reply:
        return AfterWork(self.definitions.create_partitions(request))

    @handles(m.ListTopicsRequest)  # filtered to the topics the principal has a grant on
    def list_topics(self, session: Session, request: m.ListTopicsRequest) -> m.ListTopicsResponse:
        return m.ListTopicsResponse(tuple(t.info for _, t in sorted(self.catalog.topics.items())))

    # describe shows subscriptions and counters: a consumer's view
    @handles(m.DescribeTopicRequest, "name", "consume")
    def describe_topic(self, session: Session, request: m.DescribeTopicRequest) -> Reply:
        topic = self._topic(request.name)
        if self.catalog.horizons is None or not topic.reliable:
            return self._describe(topic)
        return AfterWork(self._describe_with_horizons(topic))

    def _describe(self, topic: Topic) -> m.DescribeTopicResponse:
        return dataclasses.replace(topic.describe(), partitions=self.admin.partitions(topic))

    async def _describe_with_horizons(self, topic: LogTopic) -> Reply:
        """Each partition's newest snapshot horizon, as `snapshot.partition.<p>.horizon`
        entries after the topic's configs (none for a partition without a snapshot)."""
        assert self.catalog.horizons is not None
        horizons = await self.catalog.horizons.get(topic.name)
        description = self._describe(topic)
        entries = tuple(
            m.ConfigEntry(f"snapshot.partition.{p}.horizon", str(horizon))
            for p, horizon in sorted(horizons.items())
            if p < len(topic.partitions) and horizon <= topic.partitions[p].next_offset
        )
        if not entries:
            return description
        info = description.topic
        return dataclasses.replace(
            description, topic=dataclasses.replace(info, configs=(*info.configs, *entries))
        )

    @handles(m.ApiVersionsRequest, before_auth=True)
    def api_versions(
        self, session: Session, request: m.ApiVersionsRequest
    ) -> m.ApiVersionsResponse:
        return m.ApiVersionsResponse(
            tuple(
                m.ApiVersionRange(k, lo, hi) for k, (lo, hi) in sorted(SUPPORTED_VERSIONS.items())
            )
        )


async def _either(ready: asyncio.Future[None], found: asyncio.Future[None] | None) -> None:
    """Until the rebuild is done or found more (neither future is cancelled: not ours)."""
    await asyncio.wait(
        [f for f in (ready, found) if f is not None], return_when=asyncio.FIRST_COMPLETED
    )


__all__ = ["Broker", "Reply", "Waiting"]
