"""Producer delivery semantics over TCP, through a proxy that drops connections and responses."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from kafka.record.default_records import DefaultRecordBatch as KafkaBatch

import headwater
from headwater import AtLeastOnce, AtMostOnce, Compression, Isolation, RetryPolicy
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import (
    ConnectionClosed,
    ErrorCode,
    HeadwaterError,
    OutOfOrderSequence,
    RecordTooLarge,
    UnknownProducerId,
    UnknownTopic,
)
from headwater.wire.records import BatchBuilder, read_records
from tests.support.helpers import HANG, eventually
from tests.support.proxy import FaultyProxy
from tests.support.rawwire import RawPeer


@pytest.fixture
async def proxy(server: ServerProcess) -> AsyncIterator[FaultyProxy]:
    faulty = await FaultyProxy(server.port, seed=20261122).start()
    yield faulty
    await faulty.close()


async def read_all(client: headwater.Client, topic: str, count: int | None = None) -> list[bytes]:
    """Every message stored in the topic (its producers have finished): `count`, else as many
    as its next offsets say (not after a kill -9: appends continue past the offset lease's gap),
    each batch waited for up to 30 s (a hang bound)."""
    stored = count if count is not None else sum((await client.describe_topic(topic)).next_offsets)
    consumer = await client.subscribe(topic, "check", start="earliest", prefetch=5000)
    values: list[bytes] = []
    while len(values) < stored:
        batch = await consumer.receive_batch(5000, timeout=30)
        values.extend(message.value or b"" for message in batch)
        await consumer.ack_cumulative(batch[-1])
    assert len(values) == stored
    return values


RETRY = AtLeastOnce(RetryPolicy(max_retries=50, initial_delay=0.01, max_delay=0.05, timeout=30))


async def produce_through(proxy: FaultyProxy, topic: str, count: int, **options: object) -> None:
    async with await headwater.connect(proxy.address) as client:
        producer = client.producer(topic, max_in_flight=4, batch_size=400, **options)
        for i in range(count):
            await producer.send(f"m{i:05d}".encode(), partition=0)
            if i % 25 == 24:
                await asyncio.sleep(0.002)  # let batches go out while faults happen
        await producer.flush()


async def test_idempotent_at_least_once_writes_each_message_exactly_once(
    client: headwater.Client, proxy: FaultyProxy, topic_name: str
) -> None:
    await client.create_topic(topic_name, dispatch="reliable", configs={"fsync": "never"})
    proxy.drop_requests = 0.03
    proxy.drop_responses = 0.08
    await produce_through(proxy, topic_name, 2000, delivery=RETRY, idempotent=True)
    assert proxy.cuts > 5, "the proxy should have cut connections"
    values = await read_all(client, topic_name)
    expected = [f"m{i:05d}".encode() for i in range(2000)]
    assert values == expected  # all present, in order, none twice


async def test_at_least_once_without_idempotence_loses_nothing(
    client: headwater.Client, proxy: FaultyProxy, topic_name: str
) -> None:
    await client.create_topic(topic_name, dispatch="reliable", configs={"fsync": "never"})
    proxy.drop_responses = 0.08
    await produce_through(proxy, topic_name, 1000, delivery=RETRY)
    assert proxy.cuts > 0
    counts = Counter(await read_all(client, topic_name))
    assert set(counts) == {f"m{i:05d}".encode() for i in range(1000)}  # at least once each
    assert sum(counts.values()) >= 1000  # dropped responses cause resends: duplicates allowed


async def test_at_most_once_never_blocks_and_may_lose(
    client: headwater.Client, proxy: FaultyProxy, topic_name: str
) -> None:
    await client.create_topic(topic_name, dispatch="reliable", configs={"fsync": "never"})
    proxy.drop_requests = 0.1
    # the producer finishes without waiting on the server, whatever is lost on the way; a
    # batch written to a connection already known dead fails (and flush reports it), one written
    # to a connection cut later is lost silently
    with contextlib.suppress(HeadwaterError):
        await asyncio.wait_for(
            produce_through(proxy, topic_name, 1000, delivery=AtMostOnce()), timeout=20
        )
    values = await read_all(client, topic_name)
    assert proxy.cuts > 0
    assert set(values) <= {f"m{i:05d}".encode() for i in range(1000)}
    assert len(values) < 1000  # batches written into a cut connection are gone
    assert len(values) == len(set(values))  # but nothing is ever sent twice


async def test_at_most_once_futures_resolve_on_write_without_offsets(
    client: headwater.Client, topic: str
) -> None:
    producer = client.producer(topic, delivery=AtMostOnce())
    future = await producer.send(b"fire")
    metadata = await future
    assert metadata.offset is None and metadata.topic == topic
    waiting = client.producer(topic, delivery=AtMostOnce(wait_for_offsets=True))
    assert (await (await waiting.send(b"and wait"))).offset == 1


async def test_non_retriable_errors_fail_at_once(client: headwater.Client) -> None:
    producer = client.producer("no-such-topic", delivery=RETRY)
    future = await producer.send(b"x")
    with pytest.raises(UnknownTopic):
        await asyncio.wait_for(future, 2)
    with pytest.raises(UnknownTopic):
        await producer.flush()
    await producer.flush()  # the error was reported once


async def test_retries_give_up_after_the_policy(server: ServerProcess, topic_name: str) -> None:
    async with await headwater.connect(server.address) as admin:
        await admin.create_topic(topic_name, dispatch="non-reliable")
        proxy = await FaultyProxy(server.port).start()
        proxy.drop_requests = 1.0  # every request is lost
        async with await headwater.connect(proxy.address) as client:
            policy = RetryPolicy(max_retries=3, initial_delay=0.05, max_delay=0.05, timeout=5)
            producer = client.producer(topic_name, delivery=AtLeastOnce(policy))
            started = asyncio.get_running_loop().time()
            future = await producer.send(b"never arrives")
            with pytest.raises(HeadwaterError) as raised:
                await asyncio.wait_for(future, 10)
            assert raised.value.retriable
            elapsed = asyncio.get_running_loop().time() - started
            assert 0.15 <= elapsed < 5  # three retries 50 ms apart, not the whole budget
        await proxy.close()


async def test_unanswered_requests_time_out_and_are_retried(
    client: headwater.Client, proxy: FaultyProxy, topic_name: str
) -> None:
    await client.create_topic(topic_name, dispatch="reliable")
    topic = topic_name
    async with await headwater.connect(proxy.address) as through:
        producer = through.producer(topic, delivery=RETRY, request_timeout=0.3, idempotent=True)
        await (await producer.send(b"first"))
        connections = proxy.connections
        proxy.pause()  # requests go nowhere, no answer comes
        future = await producer.send(b"second")
        # past the request timeout the producer reconnects: the proxy sees a new connection
        await eventually(lambda: proxy.connections > connections, what="the producer reconnecting")
        proxy.resume()
        metadata = await asyncio.wait_for(future, 10)
        assert metadata.offset == 1
    # the paused request reached the server late as well: stored once all the same
    assert await read_all(client, topic) == [b"first", b"second"]


async def test_flush_waits_for_every_send(client: headwater.Client, topic: str) -> None:
    producer = client.producer(topic, linger=10.0)  # only flush sends these
    futures = [await producer.send(f"v{i}".encode()) for i in range(10)]
    await asyncio.sleep(0.1)
    assert not any(f.done() for f in futures)
    await producer.flush()
    assert all(f.done() for f in futures)
    assert [f.result().offset for f in futures] == list(range(10))


async def test_flush_and_close_end_while_another_task_keeps_sending(
    client: headwater.Client, topic: str
) -> None:
    """`flush` waits for the sends made before it, not for those another task goes on making
    (it waited until nothing at all was open or unanswered, which a task sending without pause
    never allows: it hung, and `close` with it). `close` refuses sends from its start, then
    ends once every send it accepted before is answered."""
    producer = client.producer(topic)
    sent: list[headwater.SendFuture] = []
    refused: list[ConnectionClosed] = []

    async def keep_sending() -> None:
        for count in range(1_000_000):
            try:
                sent.append(await producer.send(f"v{count}".encode()))
            except ConnectionClosed as exc:
                refused.append(exc)
                return
            await asyncio.sleep(0)

    sending = asyncio.create_task(keep_sending())
    await eventually(lambda: len(sent) > 200, what="a stream of sends")
    before = list(sent)
    async with asyncio.timeout(HANG):
        await producer.flush()
    assert all(f.done() for f in before)
    async with asyncio.timeout(HANG):
        await producer.close()
    await asyncio.wait_for(sending, HANG)
    assert refused, "the sending task was not refused after close"
    assert all(f.done() and f.exception() is None for f in sent)
    with pytest.raises(ConnectionClosed):
        await producer.send(b"late")


async def test_backpressure_when_the_queue_is_full(
    client: headwater.Client, proxy: FaultyProxy, topic: str
) -> None:
    async with await headwater.connect(proxy.address) as through:
        producer = through.producer(topic, max_queued_batches=2, batch_size=1)
        await (await producer.send(b"connect first"))
        proxy.pause()  # the server's answers stop coming
        await producer.send(b"a")
        await producer.send(b"b")
        third = asyncio.create_task(producer.send(b"c"))
        await asyncio.sleep(0.3)
        assert not third.done(), "send must wait while two batches are unanswered"
        proxy.resume()
        await asyncio.wait_for(third, 5)
        await producer.flush()


async def test_batch_boundaries_by_size_and_linger(server: ServerProcess, topic: str) -> None:
    peer = await RawPeer.open(server.address)
    response = await peer.call(m.SubscribeRequest(topic, "sizes", 0, "raw", 0, 10_000))
    assert isinstance(response, m.SubscribeResponse)
    async with await headwater.connect(server.address) as client:
        by_size = client.producer(topic, batch_size=1000)
        for _ in range(30):
            await by_size.send(b"s" * 100)
        await by_size.flush()
        deliveries = await peer.deliveries(records=30)
        sizes = [len(read_records(d.batch)) for _, d in deliveries]
        assert sum(sizes) == 30 and max(sizes) <= 10 and len(sizes) >= 3

        lingering = client.producer(topic, linger=5.0)  # flush ends it: the test never waits 5 s
        for _ in range(3):
            await lingering.send(b"l")
            await asyncio.sleep(0.02)  # separate loop turns, one linger window
        await lingering.flush()
        immediate = client.producer(topic)
        for _ in range(3):
            await immediate.send(b"i")
            await asyncio.sleep(0.02)
        await immediate.flush()
        deliveries = await peer.deliveries(records=6)
        batches = [[r.value for r in read_records(d.batch)] for _, d in deliveries]
        assert batches == [[b"l", b"l", b"l"], [b"i"], [b"i"], [b"i"]]
    await peer.close()


async def test_record_larger_than_max_request_size(client: headwater.Client, topic: str) -> None:
    producer = client.producer(topic, max_request_size=4096)
    with pytest.raises(RecordTooLarge):
        await producer.send(b"x" * 5000)
    await (await producer.send(b"x" * 1000))


@pytest.mark.parametrize(
    "codec", [Compression.GZIP, Compression.LZ4, Compression.ZSTD, Compression.SNAPPY]
)
async def test_compressed_batches_are_stored_as_sent_and_decode_in_kafka_python(
    server: ServerProcess, client: headwater.Client, topic_name: str, codec: Compression
) -> None:
    await client.create_topic(topic_name, dispatch="reliable")
    peer = await RawPeer.open(server.address)
    response = await peer.call(
        m.SubscribeRequest(
            topic_name, "raw", 0, "raw", 0, 1000, m.SubscriptionSettings(m.StartPosition.EARLIEST)
        )
    )
    assert isinstance(response, m.SubscribeResponse)
    producer = client.producer(topic_name, compression=codec)
    values = [f"compressible value {i} ".encode() * 20 for i in range(50)]
    for value in values:
        await producer.send(value)
    await producer.flush()
    (delivery,) = [d for _, d in await peer.deliveries(records=50)]
    theirs = KafkaBatch(delivery.batch)
    assert theirs.compression_type == codec
    assert theirs.validate_crc()
    assert [r.value for r in theirs] == values
    assert len(delivery.batch) < sum(len(v) for v in values) / 4
    consumer = await client.subscribe(topic_name, "decoded", start="earliest")
    assert [(await consumer.receive(timeout=30)).value for _ in values] == values
    await peer.close()


async def test_read_committed_and_committed_only_consumers(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, dispatch="reliable", configs={"fsync": "never"})
    watcher = await client.subscribe(topic_name, "durable", start="earliest", committed_only=True)
    fast = client.producer(topic_name)  # read_uncommitted: acked once appended
    await (await fast.send(b"appended"))
    with pytest.raises(TimeoutError):  # under fsync=never nothing has fsynced it yet
        await watcher.receive(timeout=0.5)
    careful = client.producer(topic_name, isolation=Isolation.FSYNCED)
    await (await careful.send(b"durable"))  # acked only after an fsync, which covers both
    got = [await watcher.receive(timeout=30) for _ in range(2)]
    assert [g.value for g in got] == [b"appended", b"durable"]


async def test_idempotence_rules_over_the_wire(fresh_server: ServerProcess) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("dedup", dispatch="reliable")
    peer = await RawPeer.open(fresh_server.address)
    response = await peer.call(m.InitProducerIdRequest())
    assert isinstance(response, m.InitProducerIdResponse)
    producer_id = response.producer_id

    def batch(sequence: int, *values: bytes, pid: int = producer_id) -> bytes:
        builder = BatchBuilder(producer_id=pid, producer_epoch=0, base_sequence=sequence)
        for value in values:
            builder.append(None, value)
        return builder.build()

    assert await peer.call(m.ProduceRequest("dedup", 0, batch(0, b"a", b"b"))) == (
        m.ProduceResponse(0, 0)
    )
    assert await peer.call(m.ProduceRequest("dedup", 0, batch(2, b"c"))) == m.ProduceResponse(0, 2)
    # a retry of an appended batch gets its original offset back and is not stored again
    assert await peer.call(m.ProduceRequest("dedup", 0, batch(0, b"a", b"b"))) == (
        m.ProduceResponse(0, 0)
    )
    gap = await peer.call(m.ProduceRequest("dedup", 0, batch(9, b"z")))
    assert isinstance(gap, OutOfOrderSequence) and "expected 3" in gap.message
    unknown = await peer.call(m.ProduceRequest("dedup", 0, batch(0, b"z", pid=999)))
    assert isinstance(unknown, UnknownProducerId)
    keyless = await peer.call(m.ProduceRequest("dedup", -1, batch(3, b"d")))
    assert isinstance(keyless, HeadwaterError) and keyless.code == ErrorCode.INVALID_REQUEST
    await peer.close()
    # the producer state survives kill -9
    fresh_server.kill()
    fresh_server.start()
    peer = await RawPeer.open(fresh_server.address)
    assert await peer.call(m.ProduceRequest("dedup", 0, batch(2, b"c"))) == m.ProduceResponse(0, 2)
    after_kill = await peer.call(m.ProduceRequest("dedup", 0, batch(3, b"d")))
    # a kill -9 restarts appends at the offset lease: a gap, never a reused offset
    assert isinstance(after_kill, m.ProduceResponse) and after_kill.base_offset >= 3
    await peer.close()
    async with await headwater.connect(fresh_server.address) as client:
        assert await read_all(client, "dedup", 4) == [b"a", b"b", b"c", b"d"]


async def test_dedup_state_recovers_from_the_wal(fresh_server: ServerProcess) -> None:
    """A kill -9 between the WAL append and the producer-state write loses the state of the
    newest batch; the server finds it again in the WAL's batch headers on start."""
    from headwater.storage.state import PRODUCER, StateStore, key

    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("window", dispatch="reliable", configs={"fsync": "always"})
    peer = await RawPeer.open(fresh_server.address)
    response = await peer.call(m.InitProducerIdRequest())
    assert isinstance(response, m.InitProducerIdResponse)
    builder = BatchBuilder(producer_id=response.producer_id, producer_epoch=0, base_sequence=0)
    builder.append(None, b"once")
    batch = builder.build()
    assert await peer.call(m.ProduceRequest("window", 0, batch)) == m.ProduceResponse(0, 0)
    await peer.close()
    fresh_server.kill()
    state = StateStore(fresh_server.data_dir / "state")
    state.delete_prefix(key(PRODUCER, "window") + b"\0")  # as if the write never happened
    state.close()
    fresh_server.start()
    peer = await RawPeer.open(fresh_server.address)
    assert await peer.call(m.ProduceRequest("window", 0, batch)) == m.ProduceResponse(0, 0)
    await peer.close()
    async with await headwater.connect(fresh_server.address) as client:
        assert await read_all(client, "window", 1) == [b"once"]


async def test_answered_batches_are_not_kept_for_the_request_timeout(server: ServerProcess) -> None:
    """Each request's timeout timer held its batch (frame, futures) until it fired, answered or
    not: at thousands of requests a second, request_timeout's worth of sent batches stayed alive
    and every full collection walked them (a soak's producer: collections of up to 0.5 s)."""
    from headwater.client.accumulator import ProducerBatch

    async with await headwater.connect(server.address) as client:
        await client.create_topic("timer-kept", dispatch="reliable")
        producer = client.producer("timer-kept", request_timeout=600.0)
        for i in range(300):  # one request each: the flush waits for the answer
            await producer.send(b"%d" % i)
            await producer.flush()
        gc.collect()
        alive = sum(1 for o in gc.get_objects() if isinstance(o, ProducerBatch))
        assert alive <= 2, f"{alive} answered batches still held"
        await producer.close()
