"""Kafka 4's consumer group protocol (KIP-848) in a cluster (docs/KAFKA.md, "Consumer groups of
Kafka 4"): three brokers on a real etcd and moto's S3, three confluent-kafka consumers with
`group.protocol=consumer` on a 6-partition topic while a producer streams into it. The group's
coordinator (FindCoordinator: the brokers' hash of the group id) is killed with kill -9, then
started again, so the group moves to another broker and back, each time to a coordinator that
rebuilds it from its members' heartbeats. After each move the members are back (the same
members), every partition has exactly one owner, and consumption goes on. All through: no
committed offset goes backwards (sampled with OffsetFetch, and each partition's new owner starts
at or past the offset committed before it got it), every record acknowledged to the producer is
consumed, and a record consumed twice is one after the last commit of its partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from headwater.server.kafka.kafka_nodes import node_id
from tests.support.cluster_support import Cluster, running_cluster
from tests.support.s3 import MotoS3, create_bucket

BROKERS = ("b1", "b2", "b3")
PARTITIONS = 6
# the members' heartbeats every 0.5 s: a new coordinator has them back within a few
KAFKA = "\n[kafka]\nconsumer_session_timeout_ms = 10000\nconsumer_heartbeat_interval_ms = 500\n"


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory, s3: MotoS3) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("kip848-cluster")
    asyncio.run(create_bucket(s3, "hw-kip848-cluster"))
    with running_cluster(
        root, s3, "hw-kip848-cluster", 2000, kafka=True, cluster_settings=KAFKA
    ) as cluster:
        threads = [threading.Thread(target=cluster.start_broker, args=(b,)) for b in BROKERS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert set(cluster.brokers) == set(BROKERS)
        yield cluster


def _bootstrap(cluster: Cluster, without: str | None = None) -> str:
    return ",".join(f"127.0.0.1:{cluster.kafka_ports[b]}" for b in BROKERS if b != without)


class Ledger:
    """What the members consumed and committed, shared by their threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.consumed: dict[tuple[int, int], int] = {}  # (partition, offset) -> times
        self.values: set[bytes] = set()
        self.committed = [0] * PARTITIONS  # the highest commit a member saw succeed
        self.violations: list[str] = []
        # (member, partition) newly assigned -> the partition's commit then: where it must start
        self.starting: dict[tuple[str, int], int] = {}

    def took(self, member: str, partitions: list[int]) -> None:
        """`partitions` newly assigned to `member`: remembered to check where it starts."""
        with self.lock:
            for partition in partitions:
                self.starting[member, partition] = self.committed[partition]

    def consumed_one(self, member: str, partition: int, offset: int, value: bytes) -> None:
        with self.lock:
            floor = self.starting.pop((member, partition), None)
            if floor is not None and offset < floor:
                self.violations.append(
                    f"{member} started partition {partition} at {offset}, "
                    f"below the offset committed before it got it ({floor})"
                )
            times = self.consumed.get((partition, offset), 0)
            if times and offset < self.committed[partition]:
                self.violations.append(
                    f"{partition}@{offset} consumed again, below its commit "
                    f"{self.committed[partition]}"
                )
            self.consumed[partition, offset] = times + 1
            self.values.add(value)

    def commit_done(self, offsets: list[TopicPartition]) -> None:
        with self.lock:
            for tp in offsets:
                if tp.error is None and tp.offset >= 0:
                    self.committed[tp.partition] = max(self.committed[tp.partition], tp.offset)


class Member:
    """A KIP-848 consumer on its own thread, committing synchronously after each batch: the
    commit and the revocation are served by the same thread (the rebalance callbacks run in its
    poll), so a partition is never handed on with a commit of it still in flight."""

    def __init__(self, cluster: Cluster, topic: str, group: str, name: str, ledger: Ledger):
        self.name = name
        self.ledger = ledger
        self.assigned: frozenset[int] = frozenset()
        self.errors: list[str] = []
        self.consumer = Consumer(
            {
                "bootstrap.servers": _bootstrap(cluster),
                "group.id": group,
                "group.protocol": "consumer",
                "client.id": name,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "topic.metadata.refresh.interval.ms": 1000,
                "retry.backoff.ms": 100,
            }
        )
        self.consumer.subscribe([topic], on_assign=self._assigned, on_revoke=self._revoked)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.ledger.took(self.name, [tp.partition for tp in partitions])
        self.assigned = self.assigned | {tp.partition for tp in partitions}

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigned = self.assigned - {tp.partition for tp in partitions}

    def _run(self) -> None:
        deadline = time.monotonic() + 300
        while not self._stop.is_set() and time.monotonic() < deadline:
            messages = self.consumer.consume(200, 0.1)
            taken = 0
            for message in messages:
                error = message.error()
                if error is None:
                    self.ledger.consumed_one(
                        self.name, message.partition(), message.offset(), message.value()
                    )
                    taken += 1
                elif error.code() != KafkaError._PARTITION_EOF:
                    self.errors.append(str(error))
            if taken:
                self.commit()

    def commit(self) -> None:
        try:
            done = self.consumer.commit(asynchronous=False)
        except KafkaException as exc:  # the coordinator gone, or moving: the next one commits
            self.errors.append(f"commit: {exc}")
            return
        self.ledger.commit_done(done or [])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self.consumer.close()


class Stream:
    """Unique records into every partition, acks=all and idempotent, until stopped."""

    def __init__(self, cluster: Cluster, topic: str) -> None:
        self.acked: set[bytes] = set()
        self.producer = Producer(
            {
                "bootstrap.servers": _bootstrap(cluster),
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
                "retry.backoff.ms": 100,
                "topic.metadata.refresh.interval.ms": 1000,
                "on_delivery": self._delivered,
            }
        )
        self.topic = topic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _delivered(self, error: KafkaError | None, message: Any) -> None:
        if error is None:
            self.acked.add(message.value())

    def _run(self) -> None:
        deadline = time.monotonic() + 300
        index = 0
        while not self._stop.is_set() and time.monotonic() < deadline:
            for _ in range(PARTITIONS):
                with contextlib.suppress(BufferError):  # the next round sends more
                    value = f"r{index}".encode()
                    self.producer.produce(self.topic, value, partition=index % PARTITIONS)
                    index += 1
            self.producer.poll(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert self.producer.flush(120) == 0, "records never acknowledged"


class CommitWatch:
    """OffsetFetch of the group every 0.2 s through any live broker: a committed offset that
    goes backwards between two samples is a violation."""

    def __init__(self, cluster: Cluster, topic: str, group: str) -> None:
        self.cluster = cluster
        self.topic = topic
        self.group = group
        self.samples = 0
        self.violations: list[str] = []
        self.last = [-1] * PARTITIONS
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        reader = Consumer({"bootstrap.servers": _bootstrap(self.cluster), "group.id": self.group})
        deadline = time.monotonic() + 300
        try:
            while not self._stop.wait(0.2) and time.monotonic() < deadline:
                try:
                    found = reader.committed(
                        [TopicPartition(self.topic, p) for p in range(PARTITIONS)], timeout=5
                    )
                except KafkaException:
                    continue  # the coordinator is moving: sample again
                for tp in found:
                    if tp.error is None and tp.offset >= 0:
                        if tp.offset < self.last[tp.partition]:
                            self.violations.append(
                                f"partition {tp.partition} committed {tp.offset} after "
                                f"{self.last[tp.partition]}"
                            )
                        self.last[tp.partition] = max(self.last[tp.partition], tp.offset)
                self.samples += 1
        finally:
            reader.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def _settled(members: list[Member], timeout: float = 120.0) -> dict[int, str]:
    """Until every partition has exactly one owner, still so a second later; the owners."""
    deadline = time.monotonic() + timeout
    owners: dict[int, list[str]] = {}
    while time.monotonic() < deadline:
        owners = {p: [m.name for m in members if p in m.assigned] for p in range(PARTITIONS)}
        if all(len(o) == 1 for o in owners.values()):
            time.sleep(1.0)
            again = {p: [m.name for m in members if p in m.assigned] for p in range(PARTITIONS)}
            if again == owners:
                return {p: o[0] for p, o in owners.items()}
        time.sleep(0.1)
    raise AssertionError(f"no settled assignment in {timeout}s: {owners}")


def _consumed_more(ledger: Ledger, timeout: float = 120.0) -> None:
    """Until every partition has records consumed past what it had (consumption goes on)."""

    def counts() -> list[int]:
        with ledger.lock:
            return [sum(1 for p, _ in ledger.consumed if p == q) for q in range(PARTITIONS)]

    before = counts()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(a > b for a, b in zip(counts(), before, strict=True)):
            return
        time.sleep(0.2)
    raise AssertionError(f"consumption stalled: {before} -> {counts()}")


def _coordinator(cluster: Cluster, group: str, without: str | None = None) -> tuple[str, set[str]]:
    """The broker that coordinates `group` (FindCoordinator, as a stock admin client asks) and
    the member ids it describes, once it describes all three (bounded)."""
    admin = AdminClient({"bootstrap.servers": _bootstrap(cluster, without)})
    deadline = time.monotonic() + 120
    last: object = None
    while time.monotonic() < deadline:
        try:
            described = admin.describe_consumer_groups([group])[group].result(timeout=10)
        except KafkaException as exc:
            last = exc
        else:
            last = described
            members = {m.member_id for m in described.members}
            broker = next(b for b in BROKERS if node_id(b) == described.coordinator.id)
            if len(members) == 3 and broker != without:
                return broker, members
        time.sleep(0.2)
    raise AssertionError(f"{group} never described with its 3 members: {last}")


def test_consumer_group_rides_through_kill_9_and_restart_of_its_coordinator(
    cluster: Cluster,
) -> None:
    topic, group = "kip848", "kip848-group"
    admin = AdminClient({"bootstrap.servers": _bootstrap(cluster)})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)], operation_timeout=30)[topic].result(60)
    asyncio.run(cluster.wait_owned(topic, PARTITIONS, set(BROKERS), timeout=60))
    ledger = Ledger()
    stream = Stream(cluster, topic)
    members = [Member(cluster, topic, group, f"m{i}", ledger) for i in range(3)]
    watch = CommitWatch(cluster, topic, group)
    try:
        before = _settled(members)
        _consumed_more(ledger)
        coordinator, ids = _coordinator(cluster, group)

        # (a) kill -9 of the coordinator: the group moves to another broker, which rebuilds it
        cluster.brokers[coordinator].kill()
        moved_to, after_kill = _coordinator(cluster, group, without=coordinator)
        assert moved_to != coordinator
        assert after_kill == ids, "the members came back as new members"
        # taken back with the partitions they had: none moved
        assert _settled(members) == before
        _consumed_more(ledger)

        # (b) the coordinator back: the group moves back to it (the hash picks it again)
        cluster.restart_broker(coordinator)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            back, after_restart = _coordinator(cluster, group)
            if back == coordinator:
                break
        assert back == coordinator
        assert after_restart == ids
        assert _settled(members) == before
        _consumed_more(ledger)
    finally:
        stream.stop()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with ledger.lock:
                if stream.acked <= ledger.values:
                    break
            time.sleep(0.2)
        with ledger.lock:
            missing = stream.acked - ledger.values
        assert not missing, f"{len(missing)} acknowledged records never consumed"
    finally:
        for member in members:
            member.close()
        watch.stop()
    assert not ledger.violations, ledger.violations[:10]
    assert not watch.violations, watch.violations[:10]
    assert watch.samples > 10
