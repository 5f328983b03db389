"""A new owner's idempotent-producer table, on real parts (a topic catalog on disk, the cloud
tail and manifests over the local object store backend, the tail committer, the broker's produce
path) with an in-memory stand-in for etcd.

The previous owner stored a producer's batches in a segment and a tail chunk. The take-over
restarts the log at their end and rebuilds the table from both (the chunk read in place), in the
background: a plain produce is answered at once meanwhile, the producer's retry of a stored
batch and its next batch wait for the rebuild and are then answered in the order they came (the
retry with its original offset, appended nothing), and so is one that comes as the rebuild ends,
behind them. A later take-over that keeps the log keeps the table. The chunks in place are read
newest first: what the newest ones answer is answered before the older ones are read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

import headwater
from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.cluster.cluster_mode import CloudDurability
from headwater.server.cluster.cluster_partitions import ClusterPartitions, TakeOverTransactions
from headwater.server.cluster.coordinator_state import Standing
from headwater.server.cluster.tail_commit import TailCommitter
from headwater.server.config import ObjectStoreConfig, ServerConfig
from headwater.server.reply import AfterWork, Waiting, resolve
from headwater.server.requests.broker import Broker
from headwater.server.requests.partition_ownership import BrokerAddress, Ownership
from headwater.server.requests.placement import OpenGate, ProducerIds, SharedProducerIds
from headwater.server.requests.topic_definitions import (
    LocalTopics,
    SubscribeGate,
    TopicDefinitions,
)
from headwater.server.requests.transaction_placement import (
    LocalTransactions,
    TransactionPlacement,
)
from headwater.server.topics.placement import LocalPlacement
from headwater.server.topics.subscription_contract import Consumer
from headwater.server.topics.topic import LogTopic
from headwater.storage.archive import ObjectArchive
from headwater.storage.cloud_tail import Chunk, CloudTail, fold
from headwater.storage.objectstore import LocalObjectStore
from headwater.storage.partition_manifest import PartitionManifests, SegmentEntry
from headwater.storage.reader import LogRead
from headwater.storage.segments import batch_location
from headwater.storage.state import StateStore
from headwater.storage.uploader import Uploader
from headwater.wire import messages as m
from headwater.wire.errors import OutOfOrderSequence
from headwater.wire.records import BatchBuilder, build_batch, stamp_base_offset

TOPIC = "orders"
PREVIOUS_EPOCH = 3
PRODUCER = 5
THIS = BrokerAddress("b2", "127.0.0.1", 1)


def idempotent(
    sequence: int, *values: bytes, base: int | None = None, producer: int = PRODUCER
) -> bytes:
    builder = BatchBuilder(producer_id=producer, producer_epoch=0, base_sequence=sequence)
    for value in values:
        builder.append(None, value)
    batch = bytearray(builder.build())
    if base is not None:
        stamp_base_offset(batch, base)
    return bytes(batch)


class Etcd:
    """Ownership, checkpoints and producer ids for one partition owned here."""

    def __init__(self) -> None:
        self.current: int | None = None

    async def put_checkpoint(self, key: str, value: bytes) -> None:
        pass

    async def create_checkpoint(
        self, key: str, value: bytes, since: int = 0, topic: str | None = None
    ) -> bytes | None:
        return None

    async def get_checkpoint(self, key: str, since: int = 0) -> bytes | None:
        return None

    def incarnation(self, name: str) -> int:
        return 0

    def owned(self) -> list[tuple[str, int]]:
        return [(TOPIC, 0)] if self.current is not None else []

    def epoch(self, topic: str, partition: int) -> int | None:
        return self.current if (topic, partition) == (TOPIC, 0) else None

    def serves(self, topic: str, partition: int) -> bool:
        return self.epoch(topic, partition) is not None

    def serves_every(self, topic: str, partitions: int) -> bool:
        return all(self.serves(topic, p) for p in range(partitions))

    def standing(self, topic: str, partition: int) -> Standing:
        return Standing.HELD if self.serves(topic, partition) else Standing.GONE

    def owner(self, topic: str, partition: int) -> BrokerAddress | None:
        return THIS if self.serves(topic, partition) else None

    def taking_over(self, topic: str, partition: int) -> asyncio.Future[None] | None:
        return None  # the tests set `current` at once

    def changed(self) -> asyncio.Future[None]:
        return asyncio.get_running_loop().create_future()

    this_broker = THIS

    # producer ids: every id below 100 was issued
    async def issue(self) -> int:
        return 0

    def issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < 100

    async def refresh(self) -> None:
        pass


class EtcdPlacement(LocalPlacement):
    """A cluster's placement over the fake etcd: its ownership and producer ids."""

    def __init__(self, etcd: Etcd) -> None:
        self._etcd = etcd

    @property
    def ownership(self) -> Ownership:
        return cast(Ownership, self._etcd)

    @property
    def serves(self) -> Callable[[str, int], bool] | None:
        return self._etcd.serves

    def definitions(self, catalog: TopicCatalog) -> TopicDefinitions:
        return LocalTopics(catalog)

    def subscribe_gate(self, catalog: TopicCatalog) -> SubscribeGate:
        return OpenGate()

    def producer_ids(self, catalog: TopicCatalog) -> ProducerIds:
        return SharedProducerIds(self._etcd)

    def transactions(self, catalog: TopicCatalog) -> TransactionPlacement:
        return LocalTransactions(catalog)  # (no transactions in these tests)


@dataclass
class Owner:
    """This broker, built as serve.py and ClusterMode build it, over the previous owner's data."""

    broker: Broker
    partitions: ClusterPartitions
    topic: LogTopic
    tail: CloudTail
    etcd: Etcd
    manifests: PartitionManifests


@contextlib.asynccontextmanager
async def new_owner(
    tmp_path: Path,
    segments: list[list[bytes]],
    chunk: tuple[int, int, bytes],
    transactions: TakeOverTransactions | None = None,
    above: tuple[tuple[int, int, bytes], ...] = (),
) -> AsyncIterator[Owner]:
    """The previous owner's `segments` (stamped batches from offset 0 on, each list folded into
    a segment the manifest names) and `chunk` (first, end, stamped batches) in the tail above,
    then the chunks `above`; `transactions`: what the take-over asks of the cluster's
    transactions."""
    store = LocalObjectStore(tmp_path / "objects")
    tail = CloudTail(store)
    manifests = PartitionManifests(store)
    claimed = await manifests.claim(TOPIC, 0, PREVIOUS_EPOCH)
    await tail.mark_epoch(TOPIC, 0, PREVIOUS_EPOCH, 0)
    known = claimed
    for number, batches in enumerate(segments):
        data, index = fold(batches)
        base = batch_location(batches[0], 0).base_offset
        segment_end = batch_location(batches[-1], 0).next_offset
        name = f"{TOPIC}/0/{base:020d}-{PREVIOUS_EPOCH:020d}-folded{number}"
        await store.put(f"{name}.index", index)
        await store.put(f"{name}.log", data)
        entry = SegmentEntry(base, segment_end, base, name, len(data))
        known = await manifests.add(TOPIC, 0, PREVIOUS_EPOCH, entry, known)
    for first, end, batch in (chunk, *above):
        await tail.put(TOPIC, 0, Chunk(first, end, PREVIOUS_EPOCH), batch)

    config = ServerConfig(
        data_dir=tmp_path / "data",
        object_store=ObjectStoreConfig(backend="local", path=tmp_path / "objects"),
    )
    state = StateStore(tmp_path / "data" / "state")
    uploader = Uploader(store, state, 0.01, 0.1)
    etcd = Etcd()
    placement = EtcdPlacement(etcd)
    catalog = TopicCatalog(config, state, uploader, ObjectArchive(store, uploader), placement)
    committer = TailCommitter(
        tail, 0.001, etcd.standing, etcd.epoch, lambda t, p: headwater.NotOwner("owner=none")
    )
    partitions = ClusterPartitions(
        catalog, tail, committer, etcd, etcd.serves, transactions=transactions
    )
    committer.on_stored = partitions.stored
    uploader.may_upload = etcd.serves
    uploader.purges = False
    uploader.publisher = partitions
    uploader.start()
    broker = Broker(config, catalog, placement=placement)
    try:
        await catalog.open()
        topic = await catalog.create_topic(
            m.CreateTopicRequest(
                TOPIC, 1, m.DispatchMode.RELIABLE, (m.ConfigEntry("fsync", "never"),)
            )
        )
        assert isinstance(topic, LogTopic)
        topic.durable = CloudDurability(committer, partitions)
        yield Owner(broker, partitions, topic, tail, etcd, manifests)
    finally:
        etcd.current = None
        await partitions.close()
        committer.reset(TOPIC, 0)
        await committer.settle(TOPIC, 0)
        await catalog.close()
        await store.close()
        state.close()


async def test_idempotent_produces_wait_for_the_rebuild_in_order_and_others_do_not(
    tmp_path: Path,
) -> None:
    # the previous owner stored sequences 0-1 at offsets [0, 2), folded into a segment the
    # manifest names, and 2-4 at [2, 5) in a tail chunk
    retried = idempotent(2, b"c", b"d", b"e")
    segment = [idempotent(0, b"a", b"b", base=0)]
    chunk = (2, 5, idempotent(2, b"c", b"d", b"e", base=2))
    async with new_owner(tmp_path, [segment], chunk) as o:
        broker, partitions, topic, tail, etcd = o.broker, o.partitions, o.topic, o.tail, o.etcd
        session = cast(Any, None)
        # the rebuild's reads wait until the test lets them go
        reads_go = asyncio.Event()
        read = topic.read

        async def held_read(partition: int, offset: int) -> list[bytes]:
            await reads_go.wait()
            return await read(partition, offset)

        topic.read = held_read  # type: ignore[method-assign]
        read_chunk = tail.read

        async def held_chunk(name: str, partition: int, chunk: Chunk) -> list[bytes]:
            await reads_go.wait()
            return await read_chunk(name, partition, chunk)

        tail.read = held_chunk  # type: ignore[method-assign]

        etcd.current = 7
        await partitions.acquire(TOPIC, 0, 7)
        holder = topic.partitions[0]
        assert holder.log.start_offset == 5  # restarted at the chain's end, [0, 5) in place
        assert holder.producers_ready is not None and not holder.producers_ready.done()

        # a plain produce does not wait for the rebuild
        plain = broker.handle(session, m.ProduceRequest(TOPIC, 0, build_batch([(None, b"p", ())])))
        assert not isinstance(plain, AfterWork)
        # the producer's retry of its stored batch, then its next one: both wait
        retry = broker.handle(session, m.ProduceRequest(TOPIC, 0, retried))
        following = broker.handle(session, m.ProduceRequest(TOPIC, 0, idempotent(5, b"f")))
        assert isinstance(retry, Waiting) and isinstance(following, Waiting)
        answers = [asyncio.ensure_future(resolve(r)) for r in (retry, following)]
        assert await resolve(plain) == m.ProduceResponse(0, 5)
        assert not any(a.done() for a in answers)

        reads_go.set()
        ready = holder.producers_ready
        await ready
        # the table is ready, the waiting produces have not run yet: one coming now queues
        # behind them (checked first, it would be a gap: sequence 6 before 5)
        last = broker.handle(session, m.ProduceRequest(TOPIC, 0, idempotent(6, b"g")))
        assert isinstance(last, Waiting)
        assert await asyncio.wait_for(answers[0], 10) == m.ProduceResponse(0, 2)  # a duplicate
        assert await asyncio.wait_for(answers[1], 10) == m.ProduceResponse(0, 6)  # next offset
        assert await asyncio.wait_for(resolve(last), 10) == m.ProduceResponse(0, 7)
        assert holder.log.next_offset == 8  # the retry appended nothing
        # the batch in the segment is known too
        first = broker.handle(session, m.ProduceRequest(TOPIC, 0, idempotent(0, b"a", b"b")))
        assert first == m.ProduceResponse(0, 0)

        # a take-over that keeps the log (nothing stored elsewhere since) keeps the table: the
        # retry is answered at once from it. The log is kept only once the first take-over's fold
        # has named the chunks it read in place in the manifest (before that, the log does not
        # hold everything above the manifest's segments and is rebuilt:
        # tests/test_cluster_takeover_retry.py), so wait for the fold
        deadline = asyncio.get_running_loop().time() + 30  # bounds a hang only
        while (await o.manifests.latest(TOPIC, 0)).end < 5:
            assert asyncio.get_running_loop().time() < deadline, "the fold never named [2, 5)"
            await asyncio.sleep(0.05)
        await partitions.release(TOPIC, 0)
        etcd.current = 9
        await partitions.acquire(TOPIC, 0, 9)
        assert partitions.kept == 1
        again = broker.handle(session, m.ProduceRequest(TOPIC, 0, idempotent(6, b"g")))
        assert again == m.ProduceResponse(0, 7)


async def test_an_idempotent_produce_waiting_for_the_rebuild_holds_no_turn_of_the_topic(
    tmp_path: Path,
) -> None:
    """An idempotent produce that came while the topic's turn was busy (another partition's
    take-over holds it while it claims) waits for the producer table outside the turn: the
    topic's other produces here are answered meanwhile, not after the rebuild (they waited for
    its whole length, 5.5 s after a freeze: issue 42), and the waiting one is answered once
    the table is there, after them."""
    chunk = (2, 5, idempotent(2, b"c", b"d", b"e", base=2))
    async with new_owner(tmp_path, [[idempotent(0, b"a", b"b", base=0)]], chunk) as o:
        broker, session = o.broker, cast(Any, None)
        reads_go = asyncio.Event()  # the rebuild's reads wait until the test lets them go
        read_chunk = o.tail.read

        async def held_chunk(name: str, partition: int, chunk: Chunk) -> list[bytes]:
            await reads_go.wait()
            return await read_chunk(name, partition, chunk)

        o.tail.read = held_chunk  # type: ignore[method-assign]
        o.etcd.current = 7
        await o.partitions.acquire(TOPIC, 0, 7)
        holder = o.topic.partitions[0]
        assert holder.producers_ready is not None and not holder.producers_ready.done()
        taken, release = asyncio.Event(), asyncio.Event()

        async def another_take_over() -> None:
            async with broker.catalog.turn(TOPIC):
                taken.set()
                await release.wait()

        holding = asyncio.ensure_future(another_take_over())
        await taken.wait()
        waiting = broker.handle(session, m.ProduceRequest(TOPIC, 0, idempotent(5, b"f")))
        answer = asyncio.ensure_future(resolve(waiting))
        release.set()
        await holding
        plain = broker.handle(session, m.ProduceRequest(TOPIC, 0, build_batch([(None, b"p", ())])))
        assert await asyncio.wait_for(resolve(plain), 10) == m.ProduceResponse(0, 5)
        assert not answer.done()  # still waiting for the table
        reads_go.set()
        assert await asyncio.wait_for(answer, 10) == m.ProduceResponse(0, 6)


async def test_a_take_over_holds_no_produce_of_the_topic_while_it_claims(tmp_path: Path) -> None:
    """A take-over holds its topic's turn from before its claim in the object store (a few
    hundred milliseconds under load) until it is done, so a SUBSCRIBE waits for it; produces do
    not (the topic's other partitions here went without an ack as long: issue 42), unless
    another turn is in the line (a delete, a create, a produce queued there)."""
    chunk = (2, 5, idempotent(2, b"c", b"d", b"e", base=2))
    async with new_owner(tmp_path, [[idempotent(0, b"a", b"b", base=0)]], chunk) as o:
        broker, session, catalog = o.broker, cast(Any, None), o.broker.catalog
        o.etcd.current = 7
        await o.partitions.acquire(TOPIC, 0, 7)
        claims_go = asyncio.Event()  # the next take-over's listing waits until the test says
        state = o.tail.state

        async def held_state(name: str, partition: int) -> Any:
            await claims_go.wait()
            return await state(name, partition)

        o.tail.state = held_state  # type: ignore[method-assign]
        # a take-over of the topic (this partition again: the fake etcd serves it all along,
        # standing in for another partition of the topic)
        o.etcd.current = 9
        acquiring = asyncio.ensure_future(o.partitions.acquire(TOPIC, 0, 9))
        deadline = asyncio.get_running_loop().time() + 30  # bounds a hang only
        while not catalog.busy(TOPIC):
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        assert not catalog.blocks_produce(TOPIC)
        plain = broker.handle(session, m.ProduceRequest(TOPIC, 0, build_batch([(None, b"p", ())])))
        assert not isinstance(plain, AfterWork)  # not queued in the topic's line
        # another kind of turn waiting in the line: produces queue behind it again
        waiting = catalog.turn(TOPIC)
        assert catalog.blocks_produce(TOPIC)
        claims_go.set()
        await asyncio.wait_for(acquiring, 30)
        async with waiting:  # its place comes once the take-over is done
            pass
        assert await asyncio.wait_for(resolve(plain), 10) == m.ProduceResponse(0, 5)
        assert not catalog.busy(TOPIC)


async def test_a_rebuild_reads_a_large_segment_in_parallel_ranges_and_misses_no_batch(
    tmp_path: Path,
) -> None:
    """12 batches of 800 KB in three segments (their indexes, then ranges from several index
    entries, read at once) and one in the chunk: the table holds every one of them, in order."""
    value = b"v" * 400_000
    batches = [idempotent(2 * k, value, value, base=2 * k) for k in range(12)]
    chunk = (24, 27, idempotent(24, b"c", b"d", b"e", base=24))
    async with new_owner(tmp_path, [batches[:4], batches[4:8], batches[8:]], chunk) as owner:
        archive = owner.topic.archive
        assert archive is not None
        read_span = archive.read_span
        reads: list[int] = []
        in_flight = [0, 0]  # now, most at once

        async def counted(topic: str, partition: int, offset: int) -> LogRead:
            reads.append(offset)
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
            try:
                return await read_span(topic, partition, offset)
            finally:
                in_flight[0] -= 1

        archive.read_span = counted  # type: ignore[method-assign]
        owner.etcd.current = 7
        await owner.partitions.acquire(TOPIC, 0, 7)
        ready = owner.topic.partitions[0].producers_ready
        assert ready is not None
        await asyncio.wait_for(ready, 30)
        entry = owner.topic.partitions[0].producers.producers[PRODUCER]
        assert list(entry.recent) == [(2 * k, 2, 2 * k) for k in range(12)] + [(24, 3, 24)]
        # ranges of about 1 MiB from index entries, read at once rather than one after another
        assert len(set(reads)) >= 5 and in_flight[1] >= 5


async def test_a_batch_the_newest_chunks_answer_does_not_wait_for_the_whole_tail(
    tmp_path: Path,
) -> None:
    """A take-over reads the chunks in place newest first, into the table as they come: the
    producer's retry of a batch in the newest chunk, and its next batch, are answered while the
    older chunks are still unread (they waited for the whole tail: up to 500 chunks after a busy
    owner, 1.2-8 s, issue 42). Its retry of a batch not found yet, a gap in its sequence and
    another producer not met yet wait for the whole rebuild, and are then answered as before
    (the retry with its original offset, appending nothing); the table then holds every batch,
    the older ones under those appended meanwhile."""
    other = PRODUCER + 1
    # the segment: sequences 0-1 at [0, 2), the other producer's 0 at 2; the chunks: 2-4 at
    # [3, 6), 5 at 6, 6 at 7 (the newest)
    segment = [idempotent(0, b"a", b"b", base=0), idempotent(0, b"x", base=2, producer=other)]
    chunk = (3, 6, idempotent(2, b"c", b"d", b"e", base=3))
    above = ((6, 7, idempotent(5, b"f", base=6)), (7, 8, idempotent(6, b"g", base=7)))
    async with new_owner(tmp_path, [segment], chunk, above=above) as o:
        broker, session = o.broker, cast(Any, None)
        older_go = asyncio.Event()  # the older chunks' reads wait until the test lets them go
        read_chunk = o.tail.read
        newest = Chunk(7, 8, PREVIOUS_EPOCH)

        async def held_chunk(name: str, partition: int, found: Chunk) -> list[bytes]:
            if found != newest:
                await older_go.wait()
            return await read_chunk(name, partition, found)

        o.tail.read = held_chunk  # type: ignore[method-assign]
        o.etcd.current = 7
        await o.partitions.acquire(TOPIC, 0, 7)
        holder = o.topic.partitions[0]
        ready = holder.producers_ready
        assert ready is not None and holder.log.start_offset == 8

        def produce(batch: bytes) -> Any:
            return resolve(broker.handle(session, m.ProduceRequest(TOPIC, 0, batch)))

        # the retry of the newest batch: its original offset, before the older chunks are read
        assert await asyncio.wait_for(produce(idempotent(6, b"g")), 10) == m.ProduceResponse(0, 7)
        assert await asyncio.wait_for(produce(idempotent(7, b"h")), 10) == m.ProduceResponse(0, 8)
        assert not ready.done()
        # what the chunks read so far cannot answer waits
        retry = asyncio.ensure_future(produce(idempotent(5, b"f")))  # in a chunk not read yet
        gap = asyncio.ensure_future(produce(idempotent(10, b"k")))  # (queued behind the retry)
        stranger = asyncio.ensure_future(produce(idempotent(1, b"y", producer=other)))
        pending = await asyncio.wait([retry, gap, stranger], timeout=0.2)  # (only a look)
        assert not pending[0]
        older_go.set()
        assert await asyncio.wait_for(retry, 10) == m.ProduceResponse(0, 6)
        with pytest.raises(OutOfOrderSequence):
            await asyncio.wait_for(gap, 10)
        assert await asyncio.wait_for(stranger, 10) == m.ProduceResponse(0, 9)
        assert ready.done() and holder.log.next_offset == 10  # the retries appended nothing
        table = holder.producers.producers
        assert list(table[PRODUCER].recent) == [
            (0, 2, 0),
            (2, 3, 3),
            (5, 1, 6),
            (6, 1, 7),
            (7, 1, 8),
        ]
        assert list(table[other].recent) == [(0, 1, 2), (1, 1, 9)]


async def test_acks_and_credits_pass_a_take_over_holding_the_topic(tmp_path: Path) -> None:
    """A take-over holds its topic's turn while it claims the partition; a consumer's FLOW and
    ACK name no topic and never queue in its line (answered at once, their effect there), as
    produces pass it; a SUBSCRIBE waits for it."""
    chunk = (2, 5, idempotent(2, b"c", b"d", b"e", base=2))
    async with new_owner(tmp_path, [[idempotent(0, b"a", b"b", base=0)]], chunk) as o:
        broker, catalog = o.broker, o.broker.catalog
        subscription = await catalog.subscriptions.get_or_create(
            o.topic, "s", m.SubscriptionType.SHARED, m.SubscriptionSettings()
        )
        session = _Session()
        consumer = Consumer(1, "c", 0, session, subscription)
        session.consumers[1] = consumer
        subscription.attach(consumer)
        claims_go = asyncio.Event()  # the take-over's listing waits until the test says
        state = o.tail.state

        async def held_state(name: str, partition: int) -> Any:
            await claims_go.wait()
            return await state(name, partition)

        o.tail.state = held_state  # type: ignore[method-assign]
        o.etcd.current = 7
        acquiring = asyncio.ensure_future(o.partitions.acquire(TOPIC, 0, 7))
        deadline = asyncio.get_running_loop().time() + 30  # bounds a hang only
        while not catalog.busy(TOPIC):
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        flow = broker.handle(cast(Any, session), m.FlowRequest(1, 5))
        assert flow == m.EmptyResponse() and consumer.credits == 5
        ack = broker.handle(cast(Any, session), m.AckRequest(1, (m.AckEntry(0, 0),)))
        assert ack == m.EmptyResponse()
        subscribe = broker.handle(
            cast(Any, session), m.SubscribeRequest(TOPIC, "s", m.SubscriptionType.SHARED, "d")
        )
        assert isinstance(subscribe, AfterWork)  # queued behind the take-over
        claims_go.set()
        await asyncio.wait_for(acquiring, 30)
        subscribed = await asyncio.wait_for(resolve(subscribe), 10)
        assert isinstance(subscribed, m.SubscribeResponse)


@dataclass
class _Session:
    """A consumer's connection: what the subscription sends it is dropped."""

    writable: bool = True
    consumers: dict[int, Consumer] = field(default_factory=dict)
    peer: str = "test"
    principal: str = ""

    def send_delivery(
        self, consumer_id: int, partition: int, batch: bytes, delivery_count: int = 1
    ) -> None:
        pass

    def send_consumer_closed(self, consumer_id: int, code: int, message: str) -> None:
        pass

    def send_messages_dropped(self, consumer_id: int, count: int) -> None:
        pass
