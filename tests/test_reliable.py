"""Reliable dispatch end to end: durability across kill -9, torn tails, acks, redelivery, DLQ."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import headwater
from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.config import ObjectStoreConfig, ServerConfig
from headwater.server.topics.subscription_contract import Consumer
from headwater.server.topics.topic import LogTopic
from headwater.storage.segments import scan_segment, segment_name
from headwater.storage.state import StateStore
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import InvalidRequest, UnknownSubscription
from headwater.wire.names import dead_letter_topic
from headwater.wire.records import build_batch, read_records
from tests.support.helpers import HANG, drain, eventually, nothing_at_hand, subscription_info


async def produce(
    client: headwater.Client, topic: str, values: list[bytes], key: bytes | None = None
) -> list[int]:
    producer = client.producer(topic)
    futures = [await producer.send(v, key=key) for v in values]
    await producer.flush()
    return [(await f).offset for f in futures]


def values(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(count)]


async def test_reliable_and_non_reliable_side_by_side(
    client: headwater.Client, topic_name: str
) -> None:
    reliable, fast = f"{topic_name}-r", f"{topic_name}-n"
    await client.create_topic(reliable, dispatch="reliable", configs={"fsync": "never"})
    await client.create_topic(fast, dispatch="non-reliable")
    r_consumer = await client.subscribe(reliable, "s", start="earliest")
    n_consumer = await client.subscribe(fast, "s")
    await produce(client, reliable, values("r", 50))
    await produce(client, fast, values("n", 50))
    got_r = await drain(r_consumer, 50)
    got_n = await drain(n_consumer, 50)
    assert [m.value for m in got_r] == values("r", 50)
    assert [m.value for m in got_n] == values("n", 50)
    assert [m.offset for m in got_r] == list(range(50))
    topics = {t.name: t.dispatch for t in await client.list_topics()}
    assert topics[reliable] == 1 and topics[fast] == 0


async def test_acks_in_and_out_of_order_leave_exactly_the_rest_unacked(
    client: headwater.Client, topic_name: str
) -> None:
    """Acks made in one turn travel as ranges (ACK_RANGES): in order, one range; out of order
    and over two partitions, many. Whatever the order, what comes back to the next consumer is
    exactly what was not acked."""
    await client.create_topic(topic_name, dispatch="reliable", partitions=2)
    consumer = await client.subscribe(topic_name, "s", start="earliest", prefetch=3000)
    producer = client.producer(topic_name)
    for i in range(2000):
        await producer.send(b"%d" % i, partition=i % 2)
    await producer.flush()
    got = await drain(consumer, 2000)
    skipped = {(m.partition, m.offset) for m in got[::7]}
    keep = [m for m in got if (m.partition, m.offset) not in skipped]
    for message in keep[:900]:  # in delivery order: long runs
        await message.ack()
    for message in random.Random(7).sample(keep[900:], len(keep) - 900):  # shuffled: short ones
        await message.ack()
    await consumer.close()
    again = await client.subscribe(topic_name, "s")
    back = await drain(again, len(skipped))
    assert {(m.partition, m.offset) for m in back} == skipped
    assert all(m.delivery_count == 2 for m in back)


async def test_unacked_messages_come_back_to_a_returning_consumer(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, dispatch="reliable")
    await produce(client, topic_name, values("m", 10))
    first = await client.subscribe(topic_name, "standard", start="earliest")
    received = await drain(first, 10)
    for message in received[:4]:
        await message.ack()
    await first.close()
    await produce(client, topic_name, values("late", 2))
    second = await client.subscribe(topic_name, "standard")
    again = await drain(second, 8)
    assert [m.value for m in again] == values("m", 10)[4:] + values("late", 2)
    assert [m.delivery_count for m in again] == [2] * 6 + [1] * 2


async def test_start_positions_and_seek(client: headwater.Client, topic_name: str) -> None:
    await client.create_topic(topic_name, dispatch="reliable")
    await produce(client, topic_name, values("old", 5))
    latest = await client.subscribe(topic_name, "latest")
    earliest = await client.subscribe(topic_name, "earliest", start="earliest")
    at_three = await client.subscribe(topic_name, "offset", start=3)
    await produce(client, topic_name, values("new", 2))
    assert [m.value for m in await drain(latest, 2)] == values("new", 2)
    assert [m.offset for m in await drain(earliest, 7)] == list(range(7))
    assert [m.offset for m in await drain(at_three, 4)] == [3, 4, 5, 6]
    await latest.close()
    await client.seek(topic_name, "latest", 1)
    again = await client.subscribe(topic_name, "latest")
    assert [m.offset for m in await drain(again, 6)] == [1, 2, 3, 4, 5, 6]


async def test_timestamp_start(client: headwater.Client, topic_name: str) -> None:
    await client.create_topic(topic_name, dispatch="reliable")
    await produce(client, topic_name, values("before", 3))
    await asyncio.sleep(0.05)
    import time

    boundary = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    await produce(client, topic_name, values("after", 2))
    consumer = await client.subscribe(topic_name, "ts", start_timestamp=boundary)
    assert [m.value for m in await drain(consumer, 2)] == values("after", 2)


async def test_no_ack_is_redelivered_after_the_ack_timeout(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, dispatch="reliable")
    # the 1 s ack timeout is the behaviour: receiving and acking the redelivery takes far less
    consumer = await client.subscribe(
        topic_name, "slow", ack_timeout=1.0, backoff="fixed", backoff_initial=0.1
    )
    await produce(client, topic_name, [b"only"])
    first = await consumer.receive(timeout=HANG)
    assert first.delivery_count == 1
    second = await consumer.receive(timeout=HANG)  # not acked: comes again
    assert (second.offset, second.value, second.delivery_count) == (first.offset, b"only", 2)
    await second.ack()
    # acked: the server holds nothing more for the subscription (describe flushes the ack first)
    info = await subscription_info(client, topic_name, "slow")
    assert (info.pending, info.unacked) == (0, 0)
    await nothing_at_hand(consumer)


async def test_nack_is_redelivered_after_its_delay(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, dispatch="reliable")
    consumer = await client.subscribe(topic_name, "nacker", ack_timeout=30)
    await produce(client, topic_name, [b"a", b"b"])
    a = await consumer.receive(timeout=30)
    b = await consumer.receive(timeout=30)
    loop = asyncio.get_running_loop()
    started = loop.time()  # before the nack: the server's 0.4 s start after this, however slow
    await a.nack(delay=0.4)
    await b.ack()
    again = await consumer.receive(timeout=30)
    assert loop.time() - started >= 0.35  # the delay, less rounding to whole milliseconds
    assert (again.value, again.delivery_count) == (b"a", 2)


async def test_max_deliveries_moves_to_the_dead_letter_topic(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, dispatch="reliable")
    consumer = await client.subscribe(
        topic_name, "dlq", max_deliveries=3, backoff="fixed", backoff_initial=0.05
    )
    await produce(client, topic_name, [b"poison", b"fine"], key=b"k")
    counts = []
    fine = 0
    for _ in range(10):  # three deliveries of the poison and one of the fine one are expected
        if len(counts) >= 3 and fine >= 1:
            break
        message = await consumer.receive(timeout=HANG)
        if message.value == b"fine":
            fine += 1
            await message.ack()
        else:
            counts.append(message.delivery_count)
            await message.nack()
    assert counts == [1, 2, 3] and fine == 1

    async def settled() -> bool:
        info = await subscription_info(client, topic_name, "dlq")
        return info.dead_lettered == 1 and info.pending == 0

    await eventually(settled, what="the poison dead-lettered and nothing pending")
    await nothing_at_hand(consumer)  # the poison was not delivered a fourth time
    dlq = dead_letter_topic(topic_name, "dlq")
    dead = await client.subscribe(dlq, "inspect", start="earliest")
    (message,) = await drain(dead, 1)
    headers = dict(message.headers)
    assert (message.key, message.value) == (b"k", b"poison")
    assert headers["headwater.dlq.topic"] == topic_name.encode()
    assert headers["headwater.dlq.subscription"] == b"dlq"
    assert headers["headwater.dlq.offset"] == b"0"
    assert headers["headwater.dlq.deliveries"] == b"3"


async def test_shared_departed_consumer_messages_go_to_the_others(
    server: ServerProcess, topic_name: str
) -> None:
    async with await headwater.connect(server.address) as admin:
        await admin.create_topic(topic_name, dispatch="reliable")
        leaving_client = await headwater.connect(server.address)
        leaving = await leaving_client.subscribe(topic_name, "work", type="shared", prefetch=100)
        await produce(admin, topic_name, values("job", 20))
        await drain(leaving, 20)
        staying = await admin.subscribe(topic_name, "work", type="shared", prefetch=100)
        await leaving_client.close()  # leaves with 20 unacked
        rescued = await drain(staying, 20)
        assert sorted(m.value for m in rescued) == sorted(values("job", 20))
        assert all(m.delivery_count == 2 for m in rescued)


async def test_failover_takeover_resumes_from_the_cursor(
    server: ServerProcess, topic_name: str
) -> None:
    async with await headwater.connect(server.address) as admin:
        await admin.create_topic(topic_name, dispatch="reliable")
        main_client = await headwater.connect(server.address)
        primary = await main_client.subscribe(topic_name, "fo", type="failover", name="a")
        backup = await admin.subscribe(topic_name, "fo", type="failover", name="b")
        await produce(admin, topic_name, values("x", 6))
        got = await drain(primary, 6)
        for message in got[:3]:
            await message.ack()

        async def three_acked() -> bool:
            return (await subscription_info(admin, topic_name, "fo")).unacked == 3

        # the primary's acks reached the server, which has delivered everything to the primary:
        # the backup, standing by, has been sent nothing
        await eventually(three_acked, what="the primary's three acks recorded")
        info = await subscription_info(admin, topic_name, "fo")
        assert (info.pending, info.delivered) == (3, 6)  # pending: the 3 unacked, none unsent
        assert sorted((c.name, c.active) for c in info.consumers) == [("a", True), ("b", False)]
        await nothing_at_hand(backup)
        await main_client.close()
        taken_over = await drain(backup, 3)
        assert [m.value for m in taken_over] == values("x", 6)[3:]


async def test_cumulative_ack(client: headwater.Client, topic_name: str) -> None:
    await client.create_topic(topic_name, dispatch="reliable")
    consumer = await client.subscribe(topic_name, "cumulative", start="earliest")
    await produce(client, topic_name, values("c", 8))
    received = await drain(consumer, 8)
    await consumer.ack_cumulative(received[4])
    await consumer.close()
    again = await client.subscribe(topic_name, "cumulative")
    assert [m.offset for m in await drain(again, 3)] == [5, 6, 7]
    with pytest.raises(InvalidRequest):
        await client.subscribe(topic_name, "bad", start=-1)  # type: ignore[arg-type]


async def test_kill_9_mid_stream_loses_nothing_acknowledged(fresh_server: ServerProcess) -> None:
    """fsync `always`: every offset the server acked before kill -9 is there after restart."""
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("crash", partitions=2, dispatch="reliable")
        await client.subscribe("crash", "durable", start="earliest", prefetch=1)
    acknowledged: dict[int, set[bytes]] = {0: set(), 1: set()}
    enough_acked = asyncio.Event()
    client = await headwater.connect(fresh_server.address)
    producer = client.producer("crash")

    async def stream() -> None:
        # bounded in count, far more than can be acked before the kill below cuts it
        for start in range(0, 10_000_000, 50):
            sent = []
            for i in range(start, start + 50):
                value = f"v{i}".encode()
                sent.append((await producer.send(value, partition=i % 2), i % 2, value))
            await producer.flush()  # raises once the server is gone
            for future, partition, value in sent:
                if future.done() and future.exception() is None:
                    acknowledged[partition].add(value)
            if sum(len(v) for v in acknowledged.values()) >= 2_000:
                enough_acked.set()

    task = asyncio.create_task(stream())
    # the kill comes once acks have been seen, however fast or slow the machine is (a kill after
    # a fixed 1.5 s found the stream already finished on an idle machine)
    await asyncio.wait_for(enough_acked.wait(), 60)
    fresh_server.kill()  # SIGKILL, mid-stream
    with pytest.raises(headwater.HeadwaterError):
        await asyncio.wait_for(task, 30)
    await client.close()
    # what is stored, counted in the files (the next offsets are above it: a kill -9 restarts
    # appends at the offset lease)
    stored = sum(
        found.next_offset - found.base_offset
        for path in (fresh_server.data_dir / "topics" / "crash").glob("*/*.log")
        for found in scan_segment(path).batches
    )
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        description = await client.describe_topic("crash")
        consumer = await client.subscribe("crash", "durable", prefetch=5000)
        received: dict[int, list[bytes]] = {0: [], 1: []}
        # every stored message comes (the subscription starts at 0); a bounded wait per message
        for _ in range(stored):
            message = await consumer.receive(timeout=30)
            assert message.value is not None
            received[message.partition].append(message.value)
            await message.ack()  # no redelivery can take the place of an unread message
        for partition in (0, 1):
            missing = acknowledged[partition] - set(received[partition])
            assert not missing, f"partition {partition} lost {len(missing)} acked messages"
            assert description.next_offsets[partition] >= len(acknowledged[partition])
        # offsets continue after the last stored batch
        offsets = await produce(client, "crash", [b"after"])
        assert (
            offsets[0] == description.next_offsets[0] or offsets[0] == description.next_offsets[1]
        )


async def test_torn_tail_is_cut_and_everything_before_is_served(
    fresh_server: ServerProcess,
) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("torn", dispatch="reliable", configs={"fsync": "always"})
        for value in values("t", 20):  # one batch each
            await produce(client, "torn", [value])
    fresh_server.kill()
    segment = fresh_server.data_dir / "topics" / "torn" / "0" / segment_name(0)
    data = bytearray(segment.read_bytes())
    # tear the last batch: cut 5 bytes and flip one byte in what remains of it
    data = data[:-5]
    data[-10] ^= 0xFF
    segment.write_bytes(bytes(data))
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        consumer = await client.subscribe("torn", "after", start="earliest")
        received = await drain(consumer, 19)
        assert [m.value for m in received] == values("t", 19)
        # offset 19 was acknowledged before the damage: it is never given to another message
        (next_offset,) = (await client.describe_topic("torn")).next_offsets
        assert next_offset >= 20
        assert await produce(client, "torn", [b"next"]) == [next_offset]
    assert "wal.tail_cut" in fresh_server.log()


async def test_acks_and_delivery_counts_survive_a_restart(fresh_server: ServerProcess) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("restart", dispatch="reliable")
        consumer = await client.subscribe(
            "restart",
            "s",
            start="earliest",
            backoff="fixed",
            backoff_initial=0.05,
            max_deliveries=5,
        )
        await produce(client, "restart", values("r", 4))
        first = await drain(consumer, 4)
        await first[0].ack()
        await first[2].ack()
        await first[1].nack()
        again = await consumer.receive(timeout=30)
        assert (again.offset, again.delivery_count) == (1, 2)

        async def acks_recorded() -> bool:  # two acked, two unacked (1 redelivered, 3 sent once)
            return (await subscription_info(client, "restart", "s")).unacked == 2

        await eventually(acks_recorded, what="the acks of offsets 0 and 2 recorded")
        # the cursor write follows the acks within two loop turns; a topic created after it goes
        # through the same state writer (a synced, ordered queue): once it exists, so do the acks
        await client.create_topic("restart-barrier", dispatch="reliable")
    fresh_server.kill()
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        consumer = await client.subscribe("restart", "s")
        back = await drain(consumer, 2)
        assert [(m.offset, m.delivery_count) for m in back] == [(1, 3), (3, 2)]


async def test_the_offsets_a_kill_9_skipped_leave_nothing_pending(
    fresh_server: ServerProcess,
) -> None:
    """After an unclean stop the log goes on at its offset lease, past offsets no record holds.
    A subscription that read everything steps over them as over any gap: its backlog is empty
    without waiting for a record after them (it counted the gap as pending until one came).
    Shared and Key_Shared dispatch each read the log their own way: both are checked."""
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("gap", partitions=2, dispatch="reliable")
        await produce(client, "gap", values("g", 6))
    fresh_server.kill()
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        consumers = [
            await client.subscribe("gap", "shared", start="earliest", type="shared"),
            await client.subscribe("gap", "keyed", start="earliest", type="key_shared"),
        ]
        for consumer in consumers:
            for message in await drain(consumer, 6):
                await message.ack()

        async def nothing_pending() -> bool:
            for name in ("shared", "keyed"):
                info = await subscription_info(client, "gap", name)
                if (info.pending, info.unacked) != (0, 0):
                    return False
            return True

        await eventually(nothing_pending, what="nothing pending past the lease's gap")
        # and a record written after the gap is delivered (the cursor stepped to the end only)
        await produce(client, "gap", values("after", 2))
        for consumer in consumers:
            assert len(await drain(consumer, 2)) == 2


async def test_bad_reliable_requests(client: headwater.Client, topic_name: str) -> None:
    await client.create_topic(topic_name, dispatch="non-reliable")  # non-reliable
    with pytest.raises(InvalidRequest, match="keeps no history"):
        await client.subscribe(topic_name, "s", start="earliest")
    with pytest.raises(UnknownSubscription, match="no subscription"):
        await client.seek(topic_name, "nope")
    with pytest.raises(UnknownSubscription, match="no subscription"):
        await client.delete_subscription(topic_name, "nope")


async def test_timestamp_start_reaches_into_archived_history(fresh_server: ServerProcess) -> None:
    """Local segments deleted after upload (local object store): a timestamp start still
    finds the first message at or after it, in the archive."""
    from headwater.wire import messages as m
    from headwater.wire.records import build_batch
    from tests.support.rawwire import RawPeer

    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic(
            "history",
            dispatch="reliable",
            configs={"segment.bytes": 1024, "retention.bytes": 0, "fsync": "never"},
        )
    peer = await RawPeer.open(fresh_server.address)
    for i in range(60):  # one batch each, timestamps 1000, 2000, ...
        batch = build_batch([(None, f"v{i:02d}".encode() * 30, [])], timestamp=1000 * (i + 1))
        assert await peer.call(m.ProduceRequest("history", 0, batch)) == m.ProduceResponse(0, i)
    await peer.close()
    segments = fresh_server.data_dir / "topics" / "history" / "0"
    for _ in range(100):  # sealed segments upload, then retention deletes them locally
        if min(int(p.name[:20]) for p in segments.glob("*.log")) > 10:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("local segments were not trimmed")
    async with await headwater.connect(fresh_server.address) as client:
        consumer = await client.subscribe("history", "ts", start_timestamp=5_500)
        first = await consumer.receive(timeout=30)
        assert (first.offset, first.timestamp) == (5, 6000)


@dataclass
class _Session:
    """A consumer's connection as the pump sees it: always writable, keeps what it is sent."""

    writable: bool = True
    consumers: dict[int, Consumer] = field(default_factory=dict)
    peer: str = "test"
    offsets: list[int] = field(default_factory=list)

    def send_delivery(
        self, consumer_id: int, partition: int, batch: bytes, delivery_count: int = 1
    ) -> None:
        self.offsets.extend(r.offset for r in read_records(batch))

    def send_consumer_closed(self, consumer_id: int, code: int, message: str) -> None:
        pass

    def send_messages_dropped(self, consumer_id: int, count: int) -> None:
        pass


async def test_a_fresh_subscription_after_a_restart_is_not_one_disk_read_per_batch(
    tmp_path: Path,
) -> None:
    """After a restart the tail cache is empty, so the pump reads the WAL from disk; each read
    returns up to a megabyte of batches. Sending only the first of them (before) cost one
    whole read per batch: with single-record batches a fresh subscription from earliest crawled
    at ~100 records/s (test_kill_9_under_mixed_load's stall). Now the batches of one read go out
    while the consumer has credit: 600 records, a handful of reads."""
    config = ServerConfig(data_dir=tmp_path, object_store=ObjectStoreConfig(backend="none"))
    create = m.CreateTopicRequest(
        "t", 1, m.DispatchMode.RELIABLE, (m.ConfigEntry("fsync", "always"),)
    )
    state = StateStore(tmp_path / "state")
    try:
        catalog = TopicCatalog(config, state)
        await catalog.open()
        topic = await catalog.create_topic(create)
        for i in range(600):
            topic.append(topic.partitions[0], build_batch([(None, b"v%d" % i, ())]), 1)
        await catalog.close()

        catalog = TopicCatalog(config, state)
        await catalog.open()
        try:
            topic = catalog.topics["t"]
            assert isinstance(topic, LogTopic)
            reads = 0
            read = topic.read

            async def counting_read(partition: int, offset: int) -> list[bytes]:
                nonlocal reads
                reads += 1
                return await read(partition, offset)

            topic.read = counting_read  # type: ignore[method-assign]
            settings = m.SubscriptionSettings(start=m.StartPosition.EARLIEST)
            subscription = await catalog.subscriptions.get_or_create(
                topic, "fresh", m.SubscriptionType.EXCLUSIVE, settings
            )
            session = _Session()
            consumer = Consumer(1, "c", 0, session, subscription, 1000)  # type: ignore[arg-type]
            subscription.attach(consumer)
            deadline = asyncio.get_running_loop().time() + 10
            while len(session.offsets) < 600 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
            assert session.offsets == list(range(600))
            assert consumer.credits == 400
            assert reads <= 5, f"{reads} WAL reads for 600 single-record batches"
        finally:
            await catalog.close()
    finally:
        state.close()


def test_dead_letter_names_cannot_collide_and_always_end_in_the_suffix() -> None:
    from headwater.wire.limits import MAX_TOPIC_NAME_LENGTH
    from headwater.wire.names import check_topic_name, is_dead_letter_name

    assert dead_letter_topic("orders", "bob/sub") != dead_letter_topic("orders", "bob_sub")
    long_topic = "t" * MAX_TOPIC_NAME_LENGTH
    names = {dead_letter_topic(long_topic, f"s{i}") for i in range(100)}
    assert len(names) == 100
    for name in (*names, dead_letter_topic("orders", "x" * 255)):
        check_topic_name(name)
        assert name.endswith("-DLQ") and is_dead_letter_name(name)
        assert name != long_topic
    # a dead-letter topic's own dead letters go to yet another topic
    inner = dead_letter_topic("orders", "s")
    assert dead_letter_topic(inner, "s") not in (inner, "orders")
    assert not is_dead_letter_name("orders-DLQ") and not is_dead_letter_name("orders")


async def test_subscriptions_whose_names_escape_alike_get_their_own_dead_letter_topics(
    client: headwater.Client, topic_name: str
) -> None:
    """`bob/sub` and `bob_sub` once shared `<topic>-bob_sub-DLQ`: 5 of 5 of one's dead letters
    landed in the other's. Each now has its own, every dead letter names its subscription, and
    CREATE_TOPIC cannot take a dead-letter name first."""
    from headwater.wire.errors import InvalidTopicName

    await client.create_topic(topic_name, dispatch="reliable")
    with pytest.raises(InvalidTopicName, match="reserved"):
        await client.create_topic(dead_letter_topic(topic_name, "bob/sub"), dispatch="reliable")
    consumers = {
        name: await client.subscribe(
            topic_name, name, max_deliveries=1, backoff="fixed", backoff_initial=0.01
        )
        for name in ("bob/sub", "bob_sub")
    }
    await produce(client, topic_name, [b"poison"])
    for consumer in consumers.values():
        message = await consumer.receive(timeout=5)
        await message.nack()
    for name in consumers:
        dlq = dead_letter_topic(topic_name, name)
        deadline = asyncio.get_running_loop().time() + 20
        while dlq not in [t.name for t in await client.list_topics()]:
            assert asyncio.get_running_loop().time() < deadline, f"{name} never dead-lettered"
            await asyncio.sleep(0.05)
        dead = await client.subscribe(dlq, "inspect", start="earliest")
        (message,) = await drain(dead)
        assert dict(message.headers)["headwater.dlq.subscription"] == name.encode()
