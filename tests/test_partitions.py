"""Partitions: key routing (documented vectors), round robin, adding partitions (CREATE_PARTITIONS)
under load and kill -9, and Failover/Shared over partitions."""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import headwater
from headwater.client.producer import AtLeastOnce, ProducerConfig
from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.config import ObjectStoreConfig, ServerConfig
from headwater.server.topics.subscription_contract import Consumer
from headwater.storage.state import StateStore
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import InvalidPartition, InvalidRequest, UnknownTopic
from headwater.wire.keys import partition_for_key
from headwater.wire.records import build_batch
from tests.support.helpers import drain, drain_until, eventually, nothing_at_hand, subscription_info

# The vectors of docs/PROTOCOL.md ("Partition of a key"): key, crc32, partition for N = 1, 2, 3,
# 4, 16, 100. A client in any language must give the same.
VECTORS = [
    (b"", 0x00000000, [0, 0, 0, 0, 0, 0]),
    (b"a", 0xE8B7BE43, [0, 1, 0, 3, 3, 7]),
    (b"key-1", 0x0EECBF7A, [0, 0, 2, 2, 10, 38]),
    (b"user:42", 0x646F0D86, [0, 0, 1, 2, 6, 58]),
    ("héllo".encode(), 0x9E3B8236, [0, 0, 2, 2, 6, 86]),
    (bytes(range(8)), 0x88AA689F, [0, 1, 2, 3, 15, 79]),
]
COUNTS = [1, 2, 3, 4, 16, 100]


@pytest.mark.parametrize(("key", "crc", "expected"), VECTORS)
def test_partition_for_key_matches_the_documented_vectors(
    key: bytes, crc: int, expected: list[int]
) -> None:
    assert [partition_for_key(key, n) for n in COUNTS] == expected
    assert [crc % n for n in COUNTS] == expected


async def _send_keys(address: str, topic: str, keys: list[bytes]) -> dict[bytes, int]:
    async with await headwater.connect(address) as client:
        producer = client.producer(topic)
        futures = [(k, await producer.send(b"v", key=k)) for k in keys]
        await producer.flush()
        routed = {k: (await f).partition for k, f in futures}
        await producer.close()
    return routed


async def test_keyed_routing_is_the_same_across_client_restarts_and_matches_the_hash(
    server: ServerProcess, topic_name: str
) -> None:
    async with await headwater.connect(server.address) as admin:
        await admin.create_topic(topic_name, partitions=7)
    keys = [key for key, _, _ in VECTORS] + [f"k{i}".encode() for i in range(50)]
    first = await _send_keys(server.address, topic_name, keys)
    second = await _send_keys(server.address, topic_name, keys)
    assert first == second == {k: partition_for_key(k, 7) for k in keys}


async def test_keyless_records_spread_round_robin(server: ServerProcess, topic_name: str) -> None:
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic_name, partitions=4)
        for idempotent in (False, True):
            producer = client.producer(topic_name, ProducerConfig(idempotent=idempotent))
            partitions = []
            for _ in range(8):
                future = await producer.send(b"x")
                await producer.flush()
                partitions.append((await future).partition)
            await producer.close()
            assert sorted(partitions) == [0, 0, 1, 1, 2, 2, 3, 3]


async def test_per_key_order_under_concurrent_producers(
    server: ServerProcess, topic_name: str
) -> None:
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic_name, partitions=4, dispatch="reliable")
        consumer = await client.subscribe(topic_name, "order", start="earliest")

        async def produce(writer: int) -> None:
            async with await headwater.connect(server.address) as own:
                producer = own.producer(topic_name, ProducerConfig(idempotent=True))
                for seq in range(100):
                    await producer.send(f"{writer}:{seq}".encode(), key=f"key{seq % 10}".encode())
                await producer.close()

        await asyncio.gather(*(produce(w) for w in range(4)))
        got = await drain(consumer, 400)
    seqs: dict[tuple[str, str], list[int]] = defaultdict(list)
    for message in got:
        assert message.key is not None and message.value is not None
        assert message.partition == partition_for_key(message.key, 4)
        writer, seq = message.value.decode().split(":")
        seqs[(writer, message.key.decode())].append(int(seq))
    assert len(got) == 400
    assert all(s == sorted(s) for s in seqs.values())


async def test_alter_adds_partitions_and_reliable_subscriptions_get_them_from_the_start(
    fresh_server: ServerProcess,
) -> None:
    keys = [f"key{i}".encode() for i in range(40)]
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("grow", partitions=2, dispatch="reliable")
        consumer = await client.subscribe("grow", "before", start="latest")
        producer = client.producer("grow", ProducerConfig(metadata_max_age=0))
        for key in keys:
            await producer.send(b"old", key=key)
        await producer.flush()
        await client.create_partitions("grow", 5)
        await client.create_partitions("grow", 5)  # the same count again: nothing to do
        futures = [(k, await producer.send(b"new", key=k)) for k in keys]
        await producer.flush()
        routed = {key: (await future).partition for key, future in futures}
        assert routed == {key: partition_for_key(key, 5) for key in keys}  # by the new count
        assert max(routed.values()) >= 2
        got = await drain(consumer, 80)
        assert sorted((m.key, m.value) for m in got) == sorted(
            [(k, b"old") for k in keys] + [(k, b"new") for k in keys]
        )
        for message in got:
            await message.ack()
        with pytest.raises(InvalidRequest):
            await client.create_partitions("grow", 3)  # never removed
        with pytest.raises(InvalidRequest):
            await client.create_partitions("grow", 100_000)
        with pytest.raises(UnknownTopic):
            await client.create_partitions("nope", 3)
        description = await client.describe_topic("grow")  # sent after the acks (it flushes them)
        assert description.topic.partitions == 5 and len(description.next_offsets) == 5
        (info,) = description.subscriptions
        assert (info.pending, info.unacked) == (0, 0)  # every ack recorded before the stop
        await producer.close()
    fresh_server.stop()
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        description = await client.describe_topic("grow")
        assert description.topic.partitions == 5
        assert sum(description.next_offsets) == 80
        consumer = await client.subscribe("grow", "before")
        # everything was acked, in every partition: nothing pending, nothing delivered
        info = await subscription_info(client, "grow", "before")
        assert (info.pending, info.delivered) == (0, 0)
        await nothing_at_hand(consumer)
        producer = client.producer("grow")
        for key in keys:
            await producer.send(b"after", key=key)
        await producer.close()
        got = await drain(consumer, 40)
        assert sorted(m.key or b"" for m in got) == sorted(keys)
        assert all(m.partition == partition_for_key(m.key or b"", 5) for m in got)


async def test_alter_refuses_a_topic_keeping_last_values(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, partitions=2, dispatch="reliable")
    await client.create_topic(
        topic_name + "-lv", partitions=2, dispatch="reliable", configs={"last.value": "true"}
    )
    with pytest.raises(InvalidRequest, match="last values"):
        await client.create_partitions(topic_name + "-lv", 4)
    await client.create_topic(topic_name + "-mem", partitions=1)
    consumer = await client.subscribe(topic_name + "-mem", "live", type="failover")
    await client.create_partitions(topic_name + "-mem", 3)
    producer = client.producer(topic_name + "-mem")
    for i in range(6):
        await producer.send(b"m", partition=i % 3)
    await producer.close()
    assert sorted(m.partition for m in await drain(consumer, 6)) == [0, 0, 1, 1, 2, 2]


async def test_alter_racing_produce_and_subscribe_on_several_connections(
    server: ServerProcess, topic_name: str
) -> None:
    async with await headwater.connect(server.address) as admin:
        await admin.create_topic(topic_name, partitions=1, dispatch="reliable")
        early = await admin.subscribe(topic_name, "early", start="earliest", type="shared")
        acked: list[bytes] = []

        async def produce(writer: int) -> None:
            config = ProducerConfig(delivery=AtLeastOnce(), metadata_max_age=0)
            async with await headwater.connect(server.address) as own:
                producer = own.producer(topic_name, config)
                futures = []
                for seq in range(150):
                    value = f"{writer}:{seq}".encode()
                    futures.append((value, await producer.send(value, key=value)))
                    if seq % 10 == 0:
                        await asyncio.sleep(0)
                await producer.flush()
                for value, future in futures:
                    await future
                    acked.append(value)
                await producer.close()

        async def alter() -> None:
            async with await headwater.connect(server.address) as own:
                for count in (2, 3, 5, 8):
                    await own.create_partitions(topic_name, count)
                    await asyncio.sleep(0.01)

        async def subscribe(n: int) -> None:
            async with await headwater.connect(server.address) as own:
                consumer = await own.subscribe(topic_name, f"late{n}", start="earliest")
                await consumer.close()

        await asyncio.gather(
            *(produce(w) for w in range(3)), alter(), *(subscribe(n) for n in range(4))
        )
        assert len(acked) == 450
        # at-least-once: a retried send may be stored twice, so read until every value has come
        got = await drain_until(early, lambda got: len({m.value for m in got}) >= 450)
        description = await admin.describe_topic(topic_name)
    assert description.topic.partitions == 8
    assert sorted(acked) == sorted({m.value for m in got if m.value is not None})


async def test_kill_9_during_alter(fresh_server: ServerProcess) -> None:
    """A kill -9 in the middle of an alter leaves the old count or the new one, consistently:
    the next alter, produce and subscribe work and nothing acknowledged is lost."""
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("k9", partitions=2, dispatch="reliable")
        await client.subscribe("k9", "sub", start="earliest")
        producer = client.producer("k9")
        for i in range(20):
            await producer.send(b"before", key=str(i).encode())
        await producer.close()
    count = 2
    for delay, target in ((0.0, 24), (0.005, 48), (0.02, 64)):
        async with await headwater.connect(fresh_server.address) as client:
            altering = asyncio.create_task(client.create_partitions("k9", target))
            await asyncio.sleep(delay)
            fresh_server.kill()
            await asyncio.gather(altering, return_exceptions=True)
        fresh_server.start()
        async with await headwater.connect(fresh_server.address) as client:
            found = (await client.describe_topic("k9")).topic.partitions
            assert found in (count, target)
            count = found
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_partitions("k9", 64)
        producer = client.producer("k9")
        for i in range(200):
            await producer.send(b"after", key=str(i).encode())
        await producer.close()
        consumer = await client.subscribe("k9", "sub")
        got = await drain(consumer, 220)
        description = await client.describe_topic("k9")
    assert description.topic.partitions == 64
    assert [m.value for m in got].count(b"before") == 20
    assert sum(1 for m in got if m.value == b"after") == 200


# Failover and Shared over partitions


async def _receive_all(
    consumers: dict[str, headwater.Consumer], counts: dict[str, int]
) -> dict[int, set[str]]:
    """`counts[name]` messages from each consumer, at once (acking); partition -> the consumers
    that received from it."""
    owners: dict[int, set[str]] = defaultdict(set)

    async def take(name: str, consumer: headwater.Consumer) -> None:
        for message in await drain(consumer, counts[name]):
            owners[message.partition].add(name)
            await message.ack()

    await asyncio.gather(*(take(n, c) for n, c in consumers.items()))
    return owners


async def test_failover_four_partitions_two_then_three_then_one_consumers(
    server: ServerProcess, topic_name: str
) -> None:
    received: dict[bytes, int] = defaultdict(int)
    async with await headwater.connect(server.address) as admin:
        await admin.create_topic(topic_name, partitions=4, dispatch="reliable")
        clients = {n: await headwater.connect(server.address) for n in "abc"}
        consumers: dict[str, headwater.Consumer] = {}
        log: list[tuple[int, str]] = []  # (partition, consumer) in receive order

        async def subscribe(name: str) -> None:
            consumers[name] = await clients[name].subscribe(
                topic_name, "fo", type="failover", name=name, prefetch=5
            )

        async def phase(tag: str, expected: dict[int, str]) -> None:
            producer = admin.producer(topic_name)
            for i in range(80):
                await producer.send(f"{tag}{i}".encode(), partition=i % 4)
            await producer.close()
            owners: dict[int, set[str]] = defaultdict(set)
            for name, consumer in consumers.items():
                count = 20 * sum(1 for owner in expected.values() if owner == name)
                for message in await drain(consumer, count):
                    assert message.value is not None
                    received[message.value] += 1
                    owners[message.partition].add(name)
                    log.append((message.partition, name))
                    await message.ack()
            assert {p: sorted(n) for p, n in owners.items()} == {
                p: [n] for p, n in expected.items()
            }

            async def all_acked() -> bool:
                return (await subscription_info(admin, topic_name, "fo")).pending == 0

            # the acks travel on each consumer's own connection: the next phase's subscribe or
            # close (another connection) must come after the server recorded them, or their
            # messages would rightly be redelivered to the partitions' next owners
            await eventually(all_acked, what=f"phase {tag}'s acks recorded")

        await subscribe("a")
        await subscribe("b")
        await phase("x", {0: "a", 1: "b", 2: "a", 3: "b"})  # partition i -> consumer i % n
        await subscribe("c")
        await phase("y", {0: "a", 1: "b", 2: "c", 3: "a"})
        await clients["a"].close()
        del consumers["a"]
        await clients["b"].close()
        del consumers["b"]
        await phase("z", {p: "c" for p in range(4)})
        description = await admin.describe_topic(topic_name)
        await clients["c"].close()
    assert len(received) == 240 and set(received.values()) == {1}  # nothing lost, no duplicate
    assert [c.active for c in description.subscriptions[0].consumers] == [True]


async def test_failover_reassigns_a_leavers_partitions_with_its_unacked(
    server: ServerProcess, topic_name: str
) -> None:
    async with await headwater.connect(server.address) as admin:
        await admin.create_topic(topic_name, partitions=4, dispatch="reliable")
        a_client = await headwater.connect(server.address)
        a = await a_client.subscribe(topic_name, "fo", type="failover", name="a")
        b = await admin.subscribe(topic_name, "fo", type="failover", name="b")
        producer = admin.producer(topic_name)
        for i in range(40):
            await producer.send(str(i).encode(), partition=i % 4)
        await producer.close()
        from_a = await drain(a, 20)
        assert {m.partition for m in from_a} == {0, 2}
        for message in from_a[:5]:
            await message.ack()

        async def five_acked() -> bool:  # of the 40, the 5 acks recorded
            return (await subscription_info(admin, topic_name, "fo")).pending == 35

        await eventually(five_acked, what="a's five acks recorded")
        await a_client.close()  # its 15 unacked go to b, which now has every partition
        from_b = await drain(b, 35)
    values = sorted(int(m.value or b"") for m in from_b)
    expected = sorted(int(m.value or b"") for m in from_a[5:]) + [i for i in range(40) if i % 2]
    assert values == sorted(expected)


async def test_shared_spreads_every_partition_across_its_consumers(
    server: ServerProcess, topic_name: str
) -> None:
    """Credit decides, not timing: with 4 credits each and 8 messages of a partition, neither
    consumer can take them all, so each partition is spread over both. (A drain that gave up
    after 0.4 s without a message failed under load: one consumer quit early.)"""
    async with await headwater.connect(server.address) as admin:
        await admin.create_topic(topic_name, partitions=2, dispatch="reliable")
        consumers = {
            n: await admin.subscribe(topic_name, "sh", type="shared", name=n, prefetch=4)
            for n in "ab"
        }
        owners: dict[int, set[str]] = defaultdict(set)
        producer = admin.producer(topic_name)
        for partition in (0, 1):
            for _ in range(8):
                await producer.send(b"s", partition=partition)
            await producer.flush()
            for name, consumer in consumers.items():
                for _ in range(4):
                    message = await consumer.receive(timeout=30)
                    owners[message.partition].add(name)
                    await message.ack()
        await producer.close()
    assert owners == {0: {"a", "b"}, 1: {"a", "b"}}


async def test_a_consumer_attaches_to_chosen_partitions(
    server: ServerProcess, topic_name: str
) -> None:
    """SUBSCRIBE's `partitions`: a consumer is sent only the partitions it chose; Failover spreads
    each partition over the consumers that chose it; a partition that does not exist is refused."""
    async with await headwater.connect(server.address) as admin:
        await admin.create_topic(topic_name, partitions=4, dispatch="reliable")
        with pytest.raises(InvalidPartition):
            await admin.subscribe(topic_name, "x", partitions=[4])
        with pytest.raises(InvalidRequest):
            await admin.subscribe(topic_name, "ks", type="key_shared", partitions=[1])
        only_2 = await admin.subscribe(topic_name, "p2", partitions=[2], start="earliest")
        fo = {
            "a": await admin.subscribe(topic_name, "fo", type="failover", name="a", partitions=[0]),
            "b": await admin.subscribe(topic_name, "fo", type="failover", name="b"),
        }
        shared = await admin.subscribe(topic_name, "sh", type="shared", partitions=[0, 3])
        live_client = await headwater.connect(server.address)
        await live_client.create_topic(topic_name + "-live", partitions=3)
        live = await live_client.subscribe(topic_name + "-live", "l", partitions=[1])
        producer = admin.producer(topic_name)
        live_producer = admin.producer(topic_name + "-live")
        for i in range(40):
            await producer.send(b"r", partition=i % 4)
            await live_producer.send(b"l", partition=i % 3)
        await producer.close()
        await live_producer.close()
        assert {m.partition for m in await drain(only_2, 10)} == {2}
        owners = await _receive_all(fo, {"a": 10, "b": 30})
        assert owners == {0: {"a"}, 1: {"b"}, 2: {"b"}, 3: {"b"}}
        assert sorted({m.partition for m in await drain(shared, 20)}) == [0, 3]
        assert {m.partition for m in await drain(live, 13)} == {1}  # i % 3 == 1 for 13 of 40
        await live_client.close()


async def test_failover_under_load_one_active_consumer_per_partition_at_every_moment(
    server: ServerProcess, topic_name: str
) -> None:
    """Messages flow while consumers go 2 -> 3 -> 1. In each partition, the first deliveries in
    offset order form at most one run per ownership period (two active consumers at once would
    interleave), nothing is lost, and a message is delivered twice only as a redelivery."""
    total = 1200
    async with await headwater.connect(server.address) as admin:
        await admin.create_topic(topic_name, partitions=4, dispatch="reliable")
        clients = {n: await headwater.connect(server.address) for n in "abc"}
        first: dict[tuple[int, int], str] = {}  # (partition, offset) -> who got it first
        duplicates: list[tuple[int, int, int]] = []
        done: set[bytes] = set()
        stops = {n: asyncio.Event() for n in "abc"}

        async def run(name: str) -> None:
            consumer = await clients[name].subscribe(
                topic_name, "fo", type="failover", name=name, prefetch=10
            )
            while not stops[name].is_set():
                try:
                    message = await consumer.receive(timeout=0.1)
                except TimeoutError:
                    continue
                place = (message.partition, message.offset)
                if place in first:
                    duplicates.append((*place, message.delivery_count))
                else:
                    first[place] = name
                assert message.value is not None
                done.add(message.value)
                await message.ack()

        async def produce() -> None:
            producer = admin.producer(topic_name)
            for i in range(total):
                await producer.send(str(i).encode(), partition=i % 4)
                if i % 50 == 0:
                    await producer.flush()
                    await asyncio.sleep(0.01)
            await producer.close()

        async def until(count: int) -> None:
            deadline = asyncio.get_running_loop().time() + 30
            while len(done) < count:
                assert asyncio.get_running_loop().time() < deadline, len(done)
                await asyncio.sleep(0.01)

        tasks = {n: asyncio.create_task(run(n)) for n in "ab"}
        producing = asyncio.create_task(produce())
        await until(total // 3)
        tasks["c"] = asyncio.create_task(run("c"))
        await until(2 * total // 3)
        for name in "ab":  # they leave: what they held unacked goes to c
            stops[name].set()
            await tasks[name]
            await clients[name].close()
        await producing
        await until(total)
        stops["c"].set()
        await tasks["c"]
        await clients["c"].close()
    assert done == {str(i).encode() for i in range(total)}
    assert all(count > 1 for _, _, count in duplicates)
    for partition in range(4):
        owners = [first[p] for p in sorted(p for p in first if p[0] == partition)]
        runs = [o for i, o in enumerate(owners) if i == 0 or owners[i - 1] != o]
        assert len(runs) <= 4, (partition, runs)  # ownership changed at most 3 times


@dataclass
class _Session:
    writable: bool = True
    consumers: dict[int, Consumer] = field(default_factory=dict)
    peer: str = "test"
    deliveries: list[tuple[int, int]] = field(default_factory=list)

    def send_delivery(
        self, consumer_id: int, partition: int, batch: bytes, delivery_count: int = 1
    ) -> None:
        self.deliveries.append((consumer_id, partition))

    def send_consumer_closed(self, consumer_id: int, code: int, message: str) -> None:
        pass

    def send_messages_dropped(self, consumer_id: int, count: int) -> None:
        pass


async def test_due_messages_nobody_can_take_do_not_spin_the_pump(tmp_path: Path) -> None:
    """A Failover consumer holds partition 1 with no credit left and its message falls due (ack
    timeout): the pump waits for credit instead of waking every millisecond (before: a 1 ms
    timer on the past due time, some 6% of a core per stuck subscription)."""
    config = ServerConfig(data_dir=tmp_path, object_store=ObjectStoreConfig(backend="none"))
    state = StateStore(tmp_path / "state")
    catalog = TopicCatalog(config, state)
    await catalog.open()
    try:
        topic = await catalog.create_topic(
            m.CreateTopicRequest(
                "t", 2, m.DispatchMode.RELIABLE, (m.ConfigEntry("fsync", "never"),)
            )
        )
        assert topic.reliable
        subscription = await catalog.subscriptions.get_or_create(
            topic,
            "fo",
            m.SubscriptionType.FAILOVER,
            m.SubscriptionSettings(
                start=m.StartPosition.EARLIEST, ack_timeout_ms=50, backoff_initial_ms=1
            ),
        )
        session = _Session()
        for consumer_id, name in ((1, "a"), (2, "b")):
            consumer = Consumer(consumer_id, name, 0, session, subscription, credits=1)
            session.consumers[consumer_id] = consumer
            subscription.attach(consumer)
        topic.append(topic.partitions[1], build_batch([(None, b"x", ())]), 1)
        deadline = time.monotonic() + 30  # bounds a hang only
        while not session.deliveries:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert session.deliveries == [(2, 1)]  # b owns partition 1, and now has no credit
        # durations under test: the 50 ms ack timeout passes (4x over: the message is due, b
        # cannot take it), then a 0.5 s window in which a spinning pump would run ~500 rounds
        # (a loaded machine runs fewer, never more)
        await asyncio.sleep(0.2)
        rounds = subscription.rounds  # type: ignore[attr-defined]
        await asyncio.sleep(0.5)
        assert subscription.rounds - rounds < 25  # type: ignore[attr-defined]
        subscription.grant(session.consumers[2], 1)
        while len(session.deliveries) < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert session.deliveries[1] == (2, 1)  # the redelivery, at once on credit
    finally:
        await catalog.close()
        state.close()


def test_cli_topic_alter_partitions_and_consume_key_shared(
    server: ServerProcess, topic_name: str
) -> None:
    from tests.support.cli_process import hw

    assert hw("topic", "create", topic_name, "--partitions", "2", server=server).returncode == 0
    altered = hw(
        "topic", "alter", topic_name, "--partitions", "3", "--format", "json", server=server
    )
    assert altered.returncode == 0, altered.stderr
    assert json.loads(altered.stdout)["partitions"] == 3
    shrink = hw("topic", "alter", topic_name, "--partitions", "1", server=server)
    assert shrink.returncode == 1 and "never removed" in shrink.stderr
    sent = hw("produce", topic_name, "--partition", "2", "a", "b", server=server)
    assert sent.returncode == 0, sent.stderr
    got = hw(
        "consume", topic_name, "-s", "ks", "--type", "key-shared", "--from", "earliest",
        "--exit-at-end", "--print", "partition", server=server,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines() == ["partition=2\ta", "partition=2\tb"]
    described = hw("topic", "describe", topic_name, "--format", "json", server=server)
    description = json.loads(described.stdout)
    # one spelling wherever the CLI prints the type, the one `--type` shows (issue 41)
    assert [s["type"] for s in description["subscriptions"]] == ["key-shared"]
    assert "  ks (key-shared): " in hw("topic", "describe", topic_name, server=server).stdout
    assert [p["partition"] for p in description["partitions"]] == [0, 1, 2]
    listed = hw("subscription", "list", topic_name, "--format", "json", server=server)
    assert [s["type"] for s in json.loads(listed.stdout)] == ["key-shared"]
    table = hw("subscription", "list", topic_name, server=server).stdout.splitlines()
    assert table[1].split()[:3] == [topic_name, "ks", "key-shared"]
    # the Python API's spelling is taken as input too
    again = hw(
        "consume", topic_name, "-s", "ks", "--type", "key_shared", "--from", "earliest",
        "--exit-at-end", server=server,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr


async def test_producer_learns_the_new_count_after_its_age_or_a_partition_error(
    server: ServerProcess, topic_name: str
) -> None:
    keys = [f"key{i}".encode() for i in range(30)]
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic_name, partitions=2, dispatch="reliable")
        producer = client.producer(topic_name, ProducerConfig(metadata_max_age=3600))

        async def routed() -> dict[bytes, int]:
            futures = [(k, await producer.send(b"v", key=k)) for k in keys]
            await producer.flush()
            return {k: (await f).partition for k, f in futures}

        assert await routed() == {k: partition_for_key(k, 2) for k in keys}
        await client.create_partitions(topic_name, 4)
        assert await routed() == {k: partition_for_key(k, 2) for k in keys}  # still trusted
        with pytest.raises(InvalidPartition):
            await (await producer.send(b"v", partition=9))
        with pytest.raises(InvalidPartition):
            await producer.flush()  # reports the error once
        assert await routed() == {k: partition_for_key(k, 4) for k in keys}  # asked again
        await producer.close()
