"""Kafka consumer groups on the Kafka listener of a real server (docs/KAFKA.md): a group's
committed offsets are the reliable subscription of its name (`subscription list` shows them,
`subscription reset` moves them, kill -9 keeps them); three aiokafka members rebalance as they
join and leave and consume every message; kcat consumes as a group (`-G`)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import CommitFailedError
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

import headwater
from tests.support.kafka_support import KafkaServer


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    server = KafkaServer(tmp_path_factory.mktemp("kafka-groups") / "data").start()
    yield server
    server.stop()


async def _create(server: KafkaServer, topic: str, partitions: int) -> None:
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic, partitions=partitions, dispatch="reliable")


def _produce(server: KafkaServer, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(
        bootstrap_servers=server.bootstrap, acks="all", enable_idempotence=False
    )
    for value in values:
        producer.send(topic, value, key=value)
    producer.flush()
    producer.close()


def _group_read(server: KafkaServer, topic: str, group: str, expected: int) -> list[bytes]:
    """What one kafka-python member of `group` consumes (up to `expected`), committed after."""
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=server.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=6000,
    )
    values: list[bytes] = []
    try:
        for message in consumer:
            values.append(message.value)
            if len(values) == expected:
                break
        consumer.commit()
    finally:
        consumer.close()
    return values


async def _committed(server: KafkaServer, topic: str, group: str) -> list[int]:
    async with await headwater.connect(server.address) as client:
        (detail,) = [s for s in await client.list_subscriptions(topic) if s.name == group]
        return [p.committed for p in detail.partitions]


def test_a_groups_offsets_are_its_subscription_and_survive_kill_9(
    tmp_path: Path, topic_name: str
) -> None:
    server = KafkaServer(tmp_path / "data").start()
    try:
        asyncio.run(_create(server, topic_name, 3))
        first = [f"a{i}".encode() for i in range(30)]
        _produce(server, topic_name, first)
        assert sorted(_group_read(server, topic_name, "billing", 30)) == sorted(first)
        committed = asyncio.run(_committed(server, topic_name, "billing"))
        assert sum(committed) == 30  # every partition's cursor at its end
        server.kill()
        server.start()
        assert asyncio.run(_committed(server, topic_name, "billing")) == committed
        later = [f"b{i}".encode() for i in range(12)]
        _produce(server, topic_name, later)
        # the group goes on from its committed offsets: only what came after
        assert sorted(_group_read(server, topic_name, "billing", 12)) == sorted(later)
    finally:
        server.kill()


def test_subscription_reset_moves_a_kafka_groups_offsets(
    kafka: KafkaServer, topic_name: str
) -> None:
    asyncio.run(_create(kafka, topic_name, 2))
    values = [f"v{i}".encode() for i in range(10)]
    _produce(kafka, topic_name, values)
    assert sorted(_group_read(kafka, topic_name, "audit", 10)) == sorted(values)

    async def reset() -> None:
        async with await headwater.connect(kafka.address) as client:
            await client.reset_subscription(topic_name, "audit", "earliest")

    asyncio.run(reset())
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id="audit")
    try:
        assert [consumer.committed(TopicPartition(topic_name, p)) for p in range(2)] == [0, 0]
    finally:
        consumer.close()
    assert sorted(_group_read(kafka, topic_name, "audit", 10)) == sorted(values)


async def test_three_aiokafka_members_rebalance_and_consume_everything(
    kafka: KafkaServer, topic_name: str
) -> None:
    await _create(kafka, topic_name, 6)
    values = [f"m{i}".encode() for i in range(3000)]
    await asyncio.to_thread(_produce, kafka, topic_name, values)
    seen: dict[str, list[bytes]] = {}
    assigned: dict[str, set[int]] = {}
    members: list[AIOKafkaConsumer] = []

    async def member(name: str, stop: asyncio.Event) -> None:
        consumer = AIOKafkaConsumer(
            topic_name,
            bootstrap_servers=kafka.bootstrap,
            group_id="workers",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            max_poll_records=20,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=500,
        )
        members.append(consumer)
        await consumer.start()
        try:
            while not stop.is_set():
                batches = await consumer.getmany(timeout_ms=200, max_records=20)
                assigned[name] = {tp.partition for tp in consumer.assignment()}
                for messages in batches.values():
                    seen.setdefault(name, []).extend(m.value for m in messages)
                if batches:
                    # a rebalance began: the commit fails (Kafka's rule) and the records come again
                    with contextlib.suppress(CommitFailedError):
                        await consumer.commit()
                await asyncio.sleep(0.02)  # slow enough that the later members get a share
        finally:
            await consumer.stop()  # LeaveGroup: the others rebalance

    stops = [asyncio.Event() for _ in range(3)]
    tasks = [asyncio.ensure_future(member("a", stops[0]))]
    async with asyncio.timeout(90):
        await _until(lambda: len(seen.get("a", [])) >= 20)
        tasks.append(asyncio.ensure_future(member("b", stops[1])))
        tasks.append(asyncio.ensure_future(member("c", stops[2])))
        # b and c hold partitions of their own (what a had committed of them is not read again:
        # a commit during the rebalance counts, as in Kafka)
        await _until(lambda: bool(assigned.get("b")) and bool(assigned.get("c")))
        await _until(lambda: not assigned["a"] & (assigned["b"] | assigned["c"]))
        stops[0].set()  # a leaves: b and c take its partitions
        await tasks[0]
        await _until(lambda: len({v for vs in seen.values() for v in vs}) == len(values))
        for stop in stops:
            stop.set()
        await asyncio.gather(*tasks)
    everything = [v for vs in seen.values() for v in vs]
    assert set(everything) == set(values)  # every message consumed
    # none twice except what a member had not committed when its partition moved (at most one
    # poll of 20 per partition per rebalance: 3 rebalances after the first assignment)
    assert len(everything) - len(values) <= 3 * 6 * 20
    assert sum(await _committed(kafka, topic_name, "workers")) == len(values)


async def _until(condition: object) -> None:
    assert callable(condition)
    while not condition():
        await asyncio.sleep(0.05)


def test_kcat_consumes_as_a_group(kafka: KafkaServer, topic_name: str) -> None:
    asyncio.run(_create(kafka, topic_name, 2))
    values = [f"k{i}".encode() for i in range(8)]
    _produce(kafka, topic_name, values)
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is not installed: `make install` installs Debian's kcat"
    done = subprocess.run(
        [
            kcat,
            "-b",
            kafka.bootstrap,
            "-G",
            "kcat-group",
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%s\n",
            topic_name,
        ],
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert sorted(done.stdout.decode().split()) == sorted(v.decode() for v in values)


def test_three_confluent_kafka_members_rebalance_and_consume_everything(
    kafka: KafkaServer, topic_name: str
) -> None:
    """librdkafka's group client (confluent-kafka): a joins, b and c join it, a leaves; every
    message is consumed and the group's committed offsets reach the end."""
    from confluent_kafka import Consumer, KafkaException

    asyncio.run(_create(kafka, topic_name, 6))
    values = [f"c{i}".encode() for i in range(3000)]
    _produce(kafka, topic_name, values)
    seen: dict[str, list[bytes]] = {"a": [], "b": [], "c": []}
    assigned: dict[str, set[int]] = {name: set() for name in seen}
    stops = {name: threading.Event() for name in seen}

    def member(name: str) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": kafka.bootstrap,
                "group.id": "confluent-workers",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 500,
            }
        )
        consumer.subscribe([topic_name])
        try:
            while not stops[name].is_set():
                messages = consumer.consume(10, 0.2)
                assigned[name] = {tp.partition for tp in consumer.assignment()}
                got = [m.value() for m in messages if not m.error()]
                seen[name].extend(got)
                if got:
                    with contextlib.suppress(KafkaException):  # a rebalance: redelivered
                        consumer.commit(asynchronous=False)
                time.sleep(0.05)  # slow enough that the later members get a share
        finally:
            consumer.close()  # LeaveGroup

    threads = {name: threading.Thread(target=member, args=(name,)) for name in seen}
    deadline = time.monotonic() + 120

    def until(condition: Callable[[], bool]) -> None:
        while not condition():
            assert time.monotonic() < deadline, {n: len(v) for n, v in seen.items()}
            time.sleep(0.05)

    threads["a"].start()
    try:
        until(lambda: len(seen["a"]) >= 20)
        threads["b"].start()
        threads["c"].start()
        until(lambda: bool(assigned["b"]) and bool(assigned["c"]))
        stops["a"].set()
        threads["a"].join(60)
        until(lambda: len({v for vs in seen.values() for v in vs}) == len(values))
    finally:
        for stop in stops.values():
            stop.set()
        for thread in threads.values():
            if thread.is_alive() or thread.ident is not None:
                thread.join(60)
    everything = [v for vs in seen.values() for v in vs]
    assert set(everything) == set(values)
    assert len(everything) - len(values) <= 3 * 6 * 20
    assert sum(asyncio.run(_committed(kafka, topic_name, "confluent-workers"))) == len(values)
