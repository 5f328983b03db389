"""Stock Kafka clients (confluent-kafka over librdkafka, and kafka-python) against a Headwater
cluster as against a Kafka cluster (docs/KAFKA.md, "In a cluster"): three brokers on a real etcd and
moto's S3, each with a Kafka port. Metadata names the three brokers and each partition's owner as
its leader; a topic created through one broker; an acks=all producer bootstrapped at all three,
every acknowledged message read back; kill -9 of a partition owner mid-stream, the producer carries
on after a metadata refresh and nothing acknowledged is lost; kafka-python's idempotent producer and
a group of two of its consumers ride through kill -9 of a partition owner (every acknowledged
message consumed, none stored twice); a consumer group across the brokers, whose committed offsets
survive kill -9 of its coordinator, and a partition handed off keeps the offset its group committed
through another broker; Produce, Fetch and ListOffsets at a broker that is not the leader answered
NOT_LEADER_OR_FOLLOWER at once; odd but well-formed requests never break a cluster handler. The
rules of node ids, leaders and group coordinators are checked without a cluster too
(`kafka_nodes.ClusterNodes` over a fake view).

One cluster for the module (starting brokers is most of its time): the tests that kill a broker
start it again on its ports before they end.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
import zlib
from collections.abc import Iterator

import pytest
from aiokafka.protocol.fetch import FetchRequest_v4, FetchResponse_v4
from aiokafka.protocol.offset import OffsetRequest_v1, OffsetResponse_v1
from aiokafka.protocol.produce import ProduceRequest_v3, ProduceResponse_v3
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError as KafkaPythonError

import headwater
from headwater.server.kafka import kafka_nodes
from headwater.server.kafka.apis import SERVED
from headwater.server.kafka.kafka_nodes import ClusterNodes, node_id
from headwater.server.requests.partition_ownership import BrokerAddress
from headwater.wire.records import BatchBuilder
from tests.support.cluster_support import Cluster, running_cluster
from tests.support.kafka_support import RawKafka, odd_requests
from tests.support.s3 import MotoS3, create_bucket

BROKERS = ("b1", "b2", "b3")
PARTITIONS = 6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, s3: MotoS3) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("kafka-cluster")
    asyncio.run(create_bucket(s3, "hw-kafka-cluster"))
    with running_cluster(root, s3, "hw-kafka-cluster", 2000, kafka=True) as cluster:
        threads = [threading.Thread(target=cluster.start_broker, args=(b,)) for b in BROKERS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert set(cluster.brokers) == set(BROKERS)
        yield cluster


def _bootstrap(cluster: Cluster) -> str:
    return ",".join(f"127.0.0.1:{cluster.kafka_ports[b]}" for b in BROKERS)


def _create_topic(cluster: Cluster, topic: str, through: str = "b2") -> None:
    """Through one broker's Kafka port; then until its partitions are spread over the three."""
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{cluster.kafka_ports[through]}"})
    futures = admin.create_topics([NewTopic(topic, PARTITIONS, 1)], operation_timeout=30)
    futures[topic].result(timeout=60)
    asyncio.run(cluster.wait_owned(topic, PARTITIONS, set(BROKERS), timeout=60))


def _producer(cluster: Cluster, acked: list[tuple[int, int, bytes]]) -> Producer:
    def delivered(error: KafkaError | None, message: object) -> None:
        if error is None:
            acked.append((message.partition(), message.offset(), message.value()))  # type: ignore[attr-defined]

    return Producer(
        {
            "on_delivery": delivered,
            "bootstrap.servers": _bootstrap(cluster),
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 60_000,
            "retry.backoff.ms": 100,
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )


def _send(producer: Producer, topic: str, value: bytes, index: int) -> None:
    """To partition `index` % PARTITIONS: every partition, so every broker, gets its share
    (librdkafka's sticky partitioner would put a burst in one)."""
    for _ in range(100):  # bounded: a full local queue drains within poll()s
        try:
            producer.produce(topic, value, partition=index % PARTITIONS)
            return
        except BufferError:
            producer.poll(0.1)
    raise AssertionError("the producer's queue never drained")


def _read_all(cluster: Cluster, topic: str, wanted: set[bytes], timeout: float = 60) -> set[bytes]:
    """Every partition from the start (assigned, no group) until `wanted` is all read."""
    return set(_read_every(cluster, topic, wanted, timeout))


def _read_every(
    cluster: Cluster, topic: str, wanted: set[bytes], timeout: float = 60
) -> list[bytes]:
    """As `_read_all`, every value as often as it is stored, until the partitions' ends once
    `wanted` is all read."""
    consumer = Consumer(
        {
            "bootstrap.servers": _bootstrap(cluster),
            "group.id": "reader-unused",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 1000,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen: list[bytes] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if wanted <= set(seen) and len(at_end) == PARTITIONS:
                break
            for message in consumer.consume(500, 0.5):
                if message.error() is None:
                    seen.append(message.value())
                    at_end.discard(message.partition())
                elif message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
    finally:
        consumer.close()
    return seen


def test_metadata_names_the_brokers_and_each_partitions_owner(cluster: Cluster) -> None:
    topic = "meta"
    _create_topic(cluster, topic)
    owners = asyncio.run(cluster.owners(topic))
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{cluster.kafka_ports['b3']}"})
    for _ in range(50):  # a partition handed off between the two reads: read again (bounded)
        metadata = admin.list_topics(topic, timeout=10)
        leaders = {p.id: p.leader for p in metadata.topics[topic].partitions.values()}
        if leaders == {p: node_id(b) for p, b in owners.items()}:
            break
        time.sleep(0.1)
        owners = asyncio.run(cluster.owners(topic))
    assert leaders == {p: node_id(b) for p, b in owners.items()}
    assert {(b.id, b.port) for b in metadata.brokers.values()} == {
        (node_id(b), cluster.kafka_ports[b]) for b in BROKERS
    }
    assert all(p.replicas == [p.leader] for p in metadata.topics[topic].partitions.values())


def test_a_broker_answers_not_leader_for_a_partition_it_does_not_serve(cluster: Cluster) -> None:
    """Produce, Fetch (a long poll asked for) and ListOffsets of partition 0 at a broker that
    does not own it: NOT_LEADER_OR_FOLLOWER (6) at once, never a wait; at its owner, answered."""
    topic = "strangers"
    _create_topic(cluster, topic)
    owner = asyncio.run(cluster.owners(topic))[0]
    stranger = next(b for b in BROKERS if b != owner)
    builder = BatchBuilder()
    builder.append(b"k", b"v")
    batch = builder.build()

    def ask(broker: str) -> tuple[int, int, int]:
        raw = RawKafka(cluster.kafka_ports[broker], timeout=10)
        try:
            raw.request(
                0, 3, 1, ProduceRequest_v3(None, -1, 30_000, [(topic, [(0, batch)])]).encode()
            )
            ((_, ((_, produced, _, _),)),) = ProduceResponse_v3.decode(raw.response()[1]).topics
            body = FetchRequest_v4(-1, 5000, 1, 1 << 20, 0, [(topic, [(0, 0, 1 << 20)])]).encode()
            raw.request(1, 4, 2, body)
            ((_, ((_, fetched, *_),)),) = FetchResponse_v4.decode(raw.response()[1]).topics
            raw.request(2, 1, 3, OffsetRequest_v1(-1, [(topic, [(0, -1)])]).encode())
            ((_, ((_, listed, *_),)),) = OffsetResponse_v1.decode(raw.response()[1]).topics
            return produced, fetched, listed
        finally:
            raw.close()

    started = time.monotonic()
    assert ask(stranger) == (6, 6, 6)
    assert time.monotonic() - started < 4  # the Fetch's 5 s long poll was not waited out
    # the owner's key is in etcd from the moment it won it, its take-over may still run: a
    # produce then is refused (6: the client looks again), not held behind it (issue 42)
    deadline = time.monotonic() + 30
    while (answer := ask(owner))[0] == 6 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert answer == (0, 0, 0)


def test_odd_requests_never_break_a_cluster_handler(cluster: Cluster) -> None:
    """test_kafka_hostile's well-formed requests with odd values (null and huge names, extreme
    numbers), 200 of the APIs a cluster answers its own way, at a cluster broker: the cluster's
    paths (group coordinators by hash, leaders by owner, NOT_COORDINATOR) never log a handler
    failure, and the broker serves on."""
    rng = random.Random(23)
    port = cluster.kafka_ports["b1"]
    # the APIs whose answers depend on the cluster: Produce, Fetch, ListOffsets, Metadata and
    # the group APIs (8-16)
    apis = [a for a in SERVED.values() if a.key in (0, 1, 2, 3) or 8 <= a.key <= 16]
    for round_ in range(20):
        odd_requests(port, rng, apis, round_)
    assert "kafka.handler_failed" not in cluster.brokers["b1"].log()
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    assert len(admin.list_topics(timeout=10).brokers) == len(BROKERS)


def test_acks_all_through_three_brokers_every_acknowledged_message_read_back(
    cluster: Cluster,
) -> None:
    topic = "ledger"
    _create_topic(cluster, topic)
    acked: list[tuple[int, int, bytes]] = []
    producer = _producer(cluster, acked)
    values = [f"m{i}".encode() for i in range(600)]
    for i, value in enumerate(values):
        _send(producer, topic, value, i)
    assert producer.flush(60) == 0
    assert sorted(v for _, _, v in acked) == sorted(values)
    assert {p for p, _, _ in acked} == set(range(PARTITIONS))  # every broker took its share
    assert _read_all(cluster, topic, set(values)) == set(values)


def test_kill_9_of_a_partition_owner_mid_stream_loses_nothing_acknowledged(
    cluster: Cluster,
) -> None:
    topic = "stream"
    _create_topic(cluster, topic)
    owners = asyncio.run(cluster.owners(topic))
    victim = owners[0]
    acked: list[tuple[int, int, bytes]] = []
    producer = _producer(cluster, acked)
    sent: list[bytes] = []
    for i in range(400):
        sent.append(f"s{i}".encode())
        _send(producer, topic, sent[-1], i)
        producer.poll(0)
        if i % 50 == 49:
            time.sleep(0.05)  # a stream, not one burst
        if i == 150:
            cluster.brokers[victim].kill()
    assert producer.flush(90) == 0, "messages never acknowledged"
    after = asyncio.run(cluster.wait_owned(topic, PARTITIONS, set(BROKERS) - {victim}))
    assert victim not in after.values()
    # the producer kept going: everything sent, the victim's partitions included, acknowledged
    assert set(sent) == {v for _, _, v in acked}
    victims = {p for p, b in owners.items() if b == victim}
    assert victims & {p for p, _, v in acked if int(v[1:]) > 150}
    assert _read_all(cluster, topic, set(sent)) == set(sent)
    cluster.restart_broker(victim)


def test_kafka_python_producer_and_group_ride_through_kill_9_of_a_partition_owner(
    cluster: Cluster,
) -> None:
    """kafka-python (pure Python, its own metadata and retry logic): an idempotent acks=all
    producer and a group of two consumers, the owner of a partition killed with kill -9 while
    both run. Every acknowledged message reaches the group; none is acknowledged twice."""
    topic, group = "pyride", "pyriders"
    _create_topic(cluster, topic)
    owners = asyncio.run(cluster.owners(topic))
    victim = owners[0]
    bootstrap = [f"127.0.0.1:{cluster.kafka_ports[b]}" for b in BROKERS]
    seen: list[bytes] = []
    done = threading.Event()
    lock = threading.Lock()

    def member() -> None:
        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=500,
            metadata_max_age_ms=1000,
        )
        try:
            deadline = time.monotonic() + 120
            while not done.is_set() and time.monotonic() < deadline:
                batches = consumer.poll(timeout_ms=200, max_records=200)
                values = [r.value for records in batches.values() for r in records]
                if values:
                    with lock:
                        seen.extend(values)
                    with contextlib.suppress(KafkaPythonError):  # a rebalance: read again
                        consumer.commit()
        finally:
            consumer.close()

    members = [threading.Thread(target=member) for _ in range(2)]
    for thread in members:
        thread.start()
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        retries=50,
        retry_backoff_ms=200,
        request_timeout_ms=10_000,
        metadata_max_age_ms=1000,
    )
    futures = {}
    try:
        for i in range(300):
            value = f"p{i}".encode()
            futures[value] = producer.send(topic, value, partition=i % PARTITIONS)
            if i % 50 == 49:
                time.sleep(0.05)  # a stream, not one burst
            if i == 120:
                cluster.brokers[victim].kill()
        producer.flush(120)
        acked = {value for value, future in futures.items() if future.succeeded()}
        assert acked == set(futures), f"{len(futures) - len(acked)} never acknowledged"
        victims = {p for p, b in owners.items() if b == victim}
        assert victims & {int(v[1:]) % PARTITIONS for v in acked if int(v[1:]) > 120}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with lock:
                if acked <= set(seen):
                    break
            time.sleep(0.1)
    finally:
        done.set()
        for thread in members:
            thread.join()
        producer.close()
        cluster.restart_broker(victim)
    assert acked <= set(seen), f"{len(acked - set(seen))} acknowledged, never consumed"
    # every acknowledged value was stored once: the idempotent producer's retries after the
    # kill were refused as duplicates, not appended again
    stored = _read_every(cluster, topic, acked)
    assert sorted(stored) == sorted(acked)


def test_a_group_across_the_brokers_and_its_offsets_survive_kill_9_of_its_coordinator(
    cluster: Cluster,
) -> None:
    topic, group = "work", "workers"
    _create_topic(cluster, topic)
    acked: list[tuple[int, int, bytes]] = []
    producer = _producer(cluster, acked)
    values = {f"w{i}".encode() for i in range(300)}
    for i, value in enumerate(sorted(values)):
        _send(producer, topic, value, i)
    assert producer.flush(60) == 0
    ends = [max(o for p, o, _ in acked if p == partition) + 1 for partition in range(PARTITIONS)]
    seen: dict[str, set[bytes]] = {"x": set(), "y": set()}
    assigned: dict[str, set[int]] = {"x": set(), "y": set()}  # every partition it ever had
    done = threading.Event()

    def member(name: str) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": _bootstrap(cluster),
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 500,
            }
        )
        consumer.subscribe([topic])
        try:
            deadline = time.monotonic() + 60
            while not done.is_set() and time.monotonic() < deadline:
                messages = [m for m in consumer.consume(100, 0.2) if m.error() is None]
                assigned[name].update(tp.partition for tp in consumer.assignment())
                seen[name].update(m.value() for m in messages)
                if messages:
                    consumer.commit(asynchronous=False)
        finally:
            consumer.close()

    members = [threading.Thread(target=member, args=(n,)) for n in seen]
    for thread in members:
        thread.start()
    deadline = time.monotonic() + 60
    # until everything is read and both members had partitions (the second to join may find
    # everything read: it still gets its share of the partitions)
    while time.monotonic() < deadline and not (
        seen["x"] | seen["y"] == values and assigned["x"] and assigned["y"]
    ):
        time.sleep(0.1)
    done.set()
    for thread in members:
        thread.join()
    assert seen["x"] | seen["y"] == values
    assert assigned["x"] and assigned["y"], "one member never had a partition"

    # every partition's committed offset is its end: the members committed what they read
    assert _committed(cluster, topic, group) == ends
    # kill -9 the group's coordinator: another broker coordinates it, with the same offsets
    admin = AdminClient({"bootstrap.servers": _bootstrap(cluster)})
    described = admin.describe_consumer_groups([group])[group].result(timeout=10)
    coordinator = next(b for b in BROKERS if node_id(b) == described.coordinator.id)
    cluster.brokers[coordinator].kill()
    try:
        assert _committed(cluster, topic, group, without=coordinator) == ends
    finally:
        cluster.restart_broker(coordinator)


def test_a_partition_handed_off_keeps_the_offset_its_group_committed_through_another_broker(
    cluster: Cluster,
) -> None:
    """A subscription a native consumer created (so each owner has a copy of its cursors) is
    then committed to as a Kafka group: its coordinator writes the checkpoint of a partition
    another broker serves, whose copy stays behind. Stopping that broker gracefully hands the
    partition off: the offset the group committed is what the next owner and OffsetFetch see
    (the hand-off used to write the owner's stale copy over it)."""
    topic, group = "handed", "committers"
    ends = _topic_of_twenty_per_partition(cluster, topic)
    partition, owner = _served_away_from_the_coordinator(cluster, topic, group)
    asyncio.run(_subscribe_natively(cluster, owner, topic, group))
    last = ends[partition] - 1
    _commit(cluster, topic, group, partition, last)
    assert _committed(cluster, topic, group)[partition] == last
    cluster.brokers[owner].stop()  # graceful: it hands its partitions off
    try:
        asyncio.run(cluster.wait_owned(topic, PARTITIONS, set(BROKERS) - {owner}, timeout=60))
        assert _committed(cluster, topic, group, without=owner)[partition] == last
    finally:
        cluster.restart_broker(owner)


def test_an_owner_whose_copy_moves_after_a_commit_through_another_broker_takes_the_commit(
    cluster: Cluster,
) -> None:
    """A native consumer of a subscription holds an unacked message of a partition while a Kafka
    group of the same name commits that partition's offset through its coordinator, another
    broker. The consumer then acks, so the owner's copy of the cursor moves: its next checkpoint
    (every 0.5 s) must not write that copy over the commit (it did, and the group's commit was
    lost whenever the copy had moved: test_a_partition_handed_off_... failed now and then). The
    owner takes the commit instead, as a seek."""
    topic, group = "adopted", "mixed-consumers"
    ends = _topic_of_twenty_per_partition(cluster, topic)
    partition, owner = _served_away_from_the_coordinator(cluster, topic, group)
    last = ends[partition] - 1

    async def mixed() -> None:
        async with await headwater.connect(await cluster.address(owner)) as client:
            consumer = await client.subscribe(topic, group, type="failover", start="earliest")
            held = None
            for _ in range(20 * PARTITIONS):
                message = await consumer.receive(timeout=30)
                if message.partition == partition:
                    held = message
                    break
            assert held is not None and held.offset < last
            await asyncio.to_thread(_commit, cluster, topic, group, partition, last)
            committed = await asyncio.to_thread(_committed, cluster, topic, group)
            assert committed[partition] == last
            await held.ack()  # the owner's copy moves
            deadline = time.monotonic() + 60
            while "cluster.checkpoint_adopted" not in cluster.brokers[owner].log():
                committed = await asyncio.to_thread(_committed, cluster, topic, group)
                assert committed[partition] == last, "the owner wrote its copy over the commit"
                assert time.monotonic() < deadline, "the owner never checkpointed"
                await asyncio.sleep(0.2)

    asyncio.run(mixed())
    assert _committed(cluster, topic, group)[partition] == last
    cluster.brokers[owner].stop()  # graceful: its release writes what it holds now
    try:
        asyncio.run(cluster.wait_owned(topic, PARTITIONS, set(BROKERS) - {owner}, timeout=60))
        assert _committed(cluster, topic, group, without=owner)[partition] == last
    finally:
        cluster.restart_broker(owner)


def _topic_of_twenty_per_partition(cluster: Cluster, topic: str) -> list[int]:
    """A topic with 20 acknowledged messages in each partition; each partition's end."""
    _create_topic(cluster, topic)
    acked: list[tuple[int, int, bytes]] = []
    producer = _producer(cluster, acked)
    for i in range(20 * PARTITIONS):
        _send(producer, topic, f"{topic}-{i}".encode(), i)
    assert producer.flush(60) == 0
    return [max(o for p, o, _ in acked if p == partition) + 1 for partition in range(PARTITIONS)]


def _served_away_from_the_coordinator(cluster: Cluster, topic: str, group: str) -> tuple[int, str]:
    """A partition, and its owner, that the group's coordinator does not serve."""
    coordinator = ClusterNodes(_Peers(cluster.kafka_ports, {})).coordinator(group)
    assert coordinator is not None
    owners = asyncio.run(cluster.owners(topic))
    return next((p, b) for p, b in sorted(owners.items()) if b != coordinator.broker_id)


def _commit(cluster: Cluster, topic: str, group: str, partition: int, offset: int) -> None:
    committer = Consumer(
        {"bootstrap.servers": _bootstrap(cluster), "group.id": group, "enable.auto.commit": False}
    )
    try:
        committer.commit(offsets=[TopicPartition(topic, partition, offset)], asynchronous=False)
    finally:
        committer.close()


async def _subscribe_natively(cluster: Cluster, broker: str, topic: str, name: str) -> None:
    """A Failover subscription (a Kafka group's kind) made by a native consumer, which attaches
    at every partition's owner: until `broker` has it, then the consumer leaves."""
    async with await headwater.connect(await cluster.address(broker)) as client:
        consumer = await client.subscribe(topic, name, type="failover", start="earliest")
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                described = await client.describe_topic(topic)
                if any(s.name == name for s in described.subscriptions):
                    return
                await asyncio.sleep(0.1)
            raise AssertionError(f"{broker} never had subscription {name} of {topic}")
        finally:
            await consumer.close()


def _committed(cluster: Cluster, topic: str, group: str, without: str | None = None) -> list[int]:
    bootstrap = ",".join(f"127.0.0.1:{cluster.kafka_ports[b]}" for b in BROKERS if b != without)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = consumer.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30
        )
        return [tp.offset for tp in found]
    finally:
        consumer.close()


class _Peers:
    """A cluster's view without a cluster, for `ClusterNodes`' rules."""

    def __init__(self, kafka: dict[str, int], owners: dict[int, str], this: str = "b1") -> None:
        self.kafka = kafka
        self.owners = owners
        self.this = this

    @property
    def this_broker(self) -> BrokerAddress:
        return BrokerAddress(self.this, "127.0.0.1", 1)

    def serves(self, topic: str, partition: int) -> bool:
        return self.owners.get(partition) == self.this

    def owner(self, topic: str, partition: int) -> BrokerAddress | None:
        found = self.owners.get(partition)
        return None if found is None else BrokerAddress(found, "127.0.0.1", 1)

    def brokers(self) -> list[BrokerAddress]:
        return [BrokerAddress(b, "127.0.0.1", 1) for b in sorted(self.kafka)]

    def kafka_addresses(self) -> dict[str, tuple[str, int]]:
        return {b: ("127.0.0.1", port) for b, port in self.kafka.items()}


def test_node_ids_leaders_and_coordinators_follow_the_cluster_view() -> None:
    """Node ids depend on the broker id alone; a partition without an owner, or whose owner has
    no Kafka port, has no leader; a broker leaving moves only the groups it coordinated."""
    peers = _Peers({"b1": 9001, "b2": 9002, "b3": 9003}, {0: "b1", 1: "b3", 3: "gone"})
    nodes = ClusterNodes(peers)
    assert {n.broker_id: n.node_id for n in nodes.nodes()} == {
        b: zlib.crc32(b.encode()) & 0x7FFFFFFF for b in ("b1", "b2", "b3")
    }
    assert [None if n is None else n.broker_id for n in nodes.leaders("t", 4)] == [
        "b1",
        "b3",
        None,
        None,
    ]
    assert nodes.controller() == node_id("b1")
    groups = [f"group-{i}" for i in range(300)]
    before = {g: nodes.coordinator(g) for g in groups}
    assert {n.broker_id for n in before.values() if n is not None} == {"b1", "b2", "b3"}
    del peers.kafka["b2"]  # b2 gone (or registered without a Kafka port)
    after = {g: nodes.coordinator(g) for g in groups}
    moved = {g for g in groups if before[g] != after[g]}
    assert moved == {g for g in groups if before[g] is not None and before[g].broker_id == "b2"}
    assert nodes.this() is not None and nodes.coordinator(None) is not None


def test_a_node_id_clash_leaves_the_higher_broker_id_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_nodes, "node_id", lambda broker_id: 7)
    nodes = ClusterNodes(_Peers({"b1": 9001, "b2": 9002}, {0: "b2"}))
    assert [(n.broker_id, n.node_id) for n in nodes.nodes()] == [("b1", 7)]
    assert nodes.leaders("t", 1) == [None]
