"""Kafka conformance gaps a check of stock clients found (issue 38, item 6), each through
confluent-kafka (librdkafka) and kafka-python against a real server process (docs/KAFKA.md): a
batch over the topic's `max.message.bytes` is MESSAGE_TOO_LARGE, not a closed connection;
ListOffsets by time names the first record at or after the time; DeleteRecords and DeleteGroups;
ListGroups lists groups with offsets only; DescribeConfigs tells defaults from topic configs;
a restarted static member gets its partitions back without a rebalance; topics are auto-created
only when the server's option and the request allow it."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.errors import KafkaTimeoutError, MessageSizeTooLargeError

import headwater
from headwater.wire import messages as m
from headwater.wire.records import BatchBuilder
from tests.support.kafka_support import KafkaServer, RawKafka

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    server = KafkaServer(tmp_path_factory.mktemp("kafka") / "data").start()
    yield server
    server.stop()


def _admin(server: KafkaServer) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=10_000)


def _confluent_produce(server: KafkaServer, topic: str, values: list[bytes]) -> list[Any]:
    """Each value's delivery: its error, or None."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": server.bootstrap,
            "message.max.bytes": 6 * MIB,
            "enable.idempotence": False,
            "acks": "all",
            "linger.ms": 0,
        }
    )
    results: list[Any] = []
    for value in values:
        outcome: list[Any] = []
        producer.produce(topic, value, on_delivery=lambda error, _m, o=outcome: o.append(error))
        deadline = time.monotonic() + 30
        while not outcome and time.monotonic() < deadline:
            producer.poll(0.1)
        assert outcome, "no delivery report"
        results.append(outcome[0])
    producer.flush(10)
    return results


# 1. MESSAGE_TOO_LARGE per batch, with the topic's max.message.bytes


def test_a_batch_over_max_message_bytes_is_message_too_large_and_the_connection_stays(
    kafka: KafkaServer, topic_name: str
) -> None:
    from confluent_kafka import KafkaError

    admin = _admin(kafka)
    try:
        admin.create_topics(
            [NewTopic(topic_name, 1, 1, topic_configs={"max.message.bytes": str(MIB)})]
        )
        described = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic_name, ["max.message.bytes"])]
        )
        assert described["topic"][topic_name]["max.message.bytes"]["value"] == str(MIB)
    finally:
        admin.close()
    big = b"x" * (2 * MIB)
    # librdkafka: the big one refused with the broker's code, the small one after it delivered
    too_large, small = _confluent_produce(kafka, topic_name, [big, b"small"])
    assert too_large is not None and too_large.code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert small is None
    # kafka-python: the same, on one connection it keeps
    producer = KafkaProducer(
        bootstrap_servers=kafka.bootstrap,
        max_request_size=6 * MIB,
        acks="all",
        enable_idempotence=False,
    )
    try:
        with pytest.raises(MessageSizeTooLargeError):
            producer.send(topic_name, big).get(30)
        assert producer.send(topic_name, b"small too").get(30).offset == 1
        # raised through AlterConfigs, the same batch is taken
        admin = _admin(kafka)
        try:
            admin.alter_configs(
                [
                    ConfigResource(
                        ConfigResourceType.TOPIC,
                        topic_name,
                        configs={"max.message.bytes": str(3 * MIB)},
                    )
                ]
            )
        finally:
            admin.close()
        assert producer.send(topic_name, big).get(30).offset == 2
    finally:
        producer.close()


async def test_max_message_bytes_through_topic_alter_holds_for_native_producers(
    kafka: KafkaServer, topic_name: str
) -> None:
    async with await headwater.connect(kafka.address) as client:
        await client.create_topic(topic_name, dispatch="reliable")
        await client.alter_topic(topic_name, {"max.message.bytes": "2048"})
        described = await client.describe_topic(topic_name)
        assert (
            dict((c.name, c.value) for c in described.topic.configs)["max.message.bytes"] == "2048"
        )
        builder = BatchBuilder()
        builder.append(None, b"y" * 4096)
        batch = builder.build()
        with pytest.raises(headwater.RecordTooLarge):
            await client.request(m.ProduceRequest(topic_name, 0, batch, m.Isolation.APPENDED))
        with pytest.raises(headwater.InvalidRequest, match="at most"):
            await client.alter_topic(topic_name, {"max.message.bytes": str(64 * MIB)})


def test_only_a_frame_past_the_socket_limit_closes_the_connection(kafka: KafkaServer) -> None:
    raw = RawKafka(kafka.kafka_port)
    try:
        raw.send_raw(struct.pack(">i", 9 * MIB) + struct.pack(">hhih", 0, 3, 1, 0))
        assert raw.closed()
    finally:
        raw.close()


# 2. ListOffsets by time: the first record at or after the time, with its own timestamp


async def _one_batch(server: KafkaServer, topic: str, stamps: list[int]) -> None:
    """A batch of records with these timestamps, at offsets 0, 1, ..."""
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic, dispatch="reliable")
        builder = BatchBuilder()
        for i, stamp in enumerate(stamps):
            builder.append(None, b"%d" % i, timestamp=stamp)
        await client.request(m.ProduceRequest(topic, 0, builder.build(), m.Isolation.FSYNCED))


STAMPS = [1_000_000, 2_000_000, 3_000_000, 2_500_000]
# the time asked, the offset and timestamp answered: the first record at or after it by offset
BY_TIME = {
    1_500_000: (1, 2_000_000),
    2_000_000: (1, 2_000_000),
    2_200_000: (2, 3_000_000),
    3_000_000: (2, 3_000_000),
    999: (0, 1_000_000),
}


def test_list_offsets_by_time_answers_the_first_record_and_its_timestamp(
    kafka: KafkaServer, topic_name: str
) -> None:
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as ConfluentPartition

    asyncio.run(_one_batch(kafka, topic_name, STAMPS))
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "by-time"})
    try:
        for asked, (offset, _stamp) in BY_TIME.items():
            [found] = consumer.offsets_for_times(
                [ConfluentPartition(topic_name, 0, asked)], timeout=10
            )
            assert (asked, found.error, found.offset) == (asked, None, offset)
        [after] = consumer.offsets_for_times(
            [ConfluentPartition(topic_name, 0, 3_000_001)], timeout=10
        )
        assert after.offset == -1  # none at or after it (librdkafka: OFFSET_END)
    finally:
        consumer.close()
    python = KafkaConsumer(bootstrap_servers=kafka.bootstrap)
    try:
        partition = TopicPartition(topic_name, 0)
        for asked, (offset, stamp) in BY_TIME.items():
            found = python.offsets_for_times({partition: asked})[partition]
            assert found is not None
            assert (asked, found.offset, found.timestamp) == (asked, offset, stamp)
        assert python.offsets_for_times({partition: 3_000_001})[partition] is None
    finally:
        python.close()


# 3. DeleteRecords moves the partition's start; DeleteGroups deletes the group's subscription


def _produce_values(server: KafkaServer, topic: str, count: int) -> None:
    producer = KafkaProducer(bootstrap_servers=server.bootstrap, acks="all")
    try:
        for i in range(count):
            producer.send(topic, b"%d" % i, partition=0).get(10)
    finally:
        producer.close()


def _first_read(server: KafkaServer, topic: str) -> int:
    """The offset kafka-python's consumer reads first from the earliest."""
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=server.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=10_000,
    )
    try:
        return next(iter(consumer)).offset
    finally:
        consumer.close()


def test_delete_records_moves_the_partition_start_and_survives_a_restart(
    tmp_path_factory: pytest.TempPathFactory, topic_name: str
) -> None:
    from confluent_kafka import TopicPartition as ConfluentPartition
    from confluent_kafka.admin import AdminClient

    server = KafkaServer(tmp_path_factory.mktemp("delete-records") / "data").start()
    try:
        asyncio.run(_create_reliable(server, topic_name, 2))
        _produce_values(server, topic_name, 10)
        # confluent-kafka: up to offset 4
        confluent = AdminClient({"bootstrap.servers": server.bootstrap})
        futures = confluent.delete_records([ConfluentPartition(topic_name, 0, 4)])
        [deleted] = [f.result(10) for f in futures.values()]
        assert deleted.low_watermark == 4
        assert _first_read(server, topic_name) == 4
        # kafka-python: up to offset 7; the start never moves back
        admin = _admin(server)
        try:
            answer = admin.delete_records({TopicPartition(topic_name, 0): 7})
            assert [v["low_watermark"] for v in answer.values()] == [7]
            answer = admin.delete_records({TopicPartition(topic_name, 0): 2})
            assert [v["low_watermark"] for v in answer.values()] == [7]
        finally:
            admin.close()
        server.kill()
        server.start()
        assert _first_read(server, topic_name) == 7
        python = KafkaConsumer(bootstrap_servers=server.bootstrap)
        try:
            partition = TopicPartition(topic_name, 0)
            assert python.beginning_offsets([partition])[partition] == 7
        finally:
            python.close()
    finally:
        server.stop()


async def _create_reliable(server: KafkaServer, topic: str, partitions: int = 1) -> None:
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic, partitions=partitions, dispatch="reliable")


async def _subscriptions(server: KafkaServer, topic: str) -> list[str]:
    async with await headwater.connect(server.address) as client:
        return [s.name for s in await client.list_subscriptions(topic)]


def test_delete_groups_deletes_the_group_subscription(kafka: KafkaServer, topic_name: str) -> None:
    from confluent_kafka import Consumer, KafkaException
    from confluent_kafka import TopicPartition as ConfluentPartition
    from confluent_kafka.admin import AdminClient

    asyncio.run(_create_reliable(kafka, topic_name))
    _produce_values(kafka, topic_name, 3)
    for group in ("by-confluent", "by-python"):
        consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
        try:
            consumer.commit(offsets=[ConfluentPartition(topic_name, 0, 2)], asynchronous=False)
        finally:
            consumer.close()
    assert set(asyncio.run(_subscriptions(kafka, topic_name))) >= {"by-confluent", "by-python"}
    confluent = AdminClient({"bootstrap.servers": kafka.bootstrap})
    [done] = confluent.delete_consumer_groups(["by-confluent"]).values()
    assert done.result(10) is None
    admin = _admin(kafka)
    try:
        answered = dict(admin.delete_groups(["by-python", "never-was"]))
        assert answered == {"by-python": "OK", "never-was": "GroupIdNotFoundError"}
    finally:
        admin.close()
    names = asyncio.run(_subscriptions(kafka, topic_name))
    assert "by-confluent" not in names and "by-python" not in names
    [again] = confluent.delete_consumer_groups(["by-confluent"]).values()
    with pytest.raises(KafkaException, match="GROUP_ID_NOT_FOUND"):
        again.result(10)


# 4. ListGroups lists groups with offsets and no members; DescribeConfigs tells each source


def test_list_groups_lists_a_group_with_committed_offsets_and_no_members(
    kafka: KafkaServer, topic_name: str
) -> None:
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as ConfluentPartition
    from confluent_kafka.admin import AdminClient

    asyncio.run(_create_reliable(kafka, topic_name))
    _produce_values(kafka, topic_name, 2)
    group = f"idle-{topic_name}"
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=[ConfluentPartition(topic_name, 0, 1)], asynchronous=False)
    finally:
        consumer.close()
    confluent = AdminClient({"bootstrap.servers": kafka.bootstrap})
    listed = confluent.list_consumer_groups(request_timeout=10).result()
    assert group in {g.group_id for g in listed.valid}
    admin = _admin(kafka)
    try:
        assert group in {g["group_id"] for g in admin.list_groups()}
    finally:
        admin.close()


def test_describe_configs_tells_a_default_from_a_topic_config(
    kafka: KafkaServer, topic_name: str
) -> None:
    from confluent_kafka.admin import AdminClient, ConfigSource
    from confluent_kafka.admin import ConfigResource as ConfluentResource

    admin = _admin(kafka)
    try:
        admin.create_topics([NewTopic(topic_name, 1, 1, topic_configs={"retention.ms": "60000"})])
        resource = ConfigResource(ConfigResourceType.TOPIC, topic_name)
        # kafka-python shows only the configs not at their default unless told otherwise
        modified = admin.describe_configs([resource])["topic"][topic_name]
        described = admin.describe_configs([resource], config_filter="all")["topic"][topic_name]
    finally:
        admin.close()
    assert set(modified) == {"retention.ms"}
    assert described["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    assert described["segment.ms"]["config_source"] == "DEFAULT_CONFIG"
    assert described["cleanup.policy"]["config_source"] == "DEFAULT_CONFIG"
    confluent = AdminClient({"bootstrap.servers": kafka.bootstrap})
    [future] = confluent.describe_configs(
        [ConfluentResource("topic", topic_name)], request_timeout=10
    ).values()
    entries = future.result()
    assert entries["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert not entries["retention.ms"].is_default
    for name in ("segment.ms", "segment.bytes", "max.message.bytes", "cleanup.policy"):
        assert entries[name].source == ConfigSource.DEFAULT_CONFIG.value, name
        assert entries[name].is_default, name


# 5. Static membership: a restarted member with its instance id gets its partitions back at once


def _confluent_member(server: KafkaServer, topic: str, group: str, instance: str) -> Any:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": server.bootstrap,
            "group.id": group,
            "group.instance.id": instance,
            "session.timeout.ms": 45_000,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    return consumer


def _assigned(consumer: Any, deadline: float) -> set[int]:
    """Poll until the consumer has an assignment; its partitions."""
    while time.monotonic() < deadline:
        consumer.poll(0.1)
        assigned = consumer.assignment()
        if assigned:
            return {p.partition for p in assigned}
    raise AssertionError("no assignment")


def test_a_restarted_static_member_gets_its_partitions_back_without_a_rebalance(
    kafka: KafkaServer, topic_name: str
) -> None:
    asyncio.run(_create_reliable(kafka, topic_name, 4))
    group = f"static-{topic_name}"
    events: list[tuple[str, str]] = []

    def watch(name: str) -> dict[str, Any]:
        return {
            "on_assign": lambda _c, parts: events.append((name, "assign")),
            "on_revoke": lambda _c, parts: events.append((name, "revoke")),
        }

    first = _confluent_member(kafka, topic_name, group, "a")
    other = _confluent_member(kafka, topic_name, group, "b")
    first.subscribe([topic_name], **watch("a"))
    other.subscribe([topic_name], **watch("b"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        first.poll(0.1)
        other.poll(0.1)
        if len(first.assignment()) + len(other.assignment()) == 4 and other.assignment():
            break
    mine = {p.partition for p in first.assignment()}
    theirs = {p.partition for p in other.assignment()}
    assert len(mine | theirs) == 4 and not mine & theirs
    first.close()  # a static member's close sends no LeaveGroup: it is still in the group
    events.clear()
    started = time.monotonic()
    again = _confluent_member(kafka, topic_name, group, "a")
    again.subscribe([topic_name], **watch("a"))
    back = _assigned(again, started + 30)
    took = time.monotonic() - started
    for _ in range(20):  # the other member sees no rebalance meanwhile
        other.poll(0.1)
    assert back == mine
    # back before the 45 s session timeout could have freed its place (the bound is load's margin)
    assert took < 30, took
    assert ("b", "revoke") not in events and ("b", "assign") not in events
    assert {p.partition for p in other.assignment()} == theirs
    again.close()
    other.close()
    # kafka-python's consumers, one of two restarted with its instance id: the same partitions,
    # and the other sees no rebalance
    from kafka import ConsumerRebalanceListener

    python_group = f"static-python-{topic_name}"
    revoked: list[str] = []

    class Watch(ConsumerRebalanceListener):  # type: ignore[misc]
        def __init__(self, name: str) -> None:
            self.name = name

        def on_partitions_revoked(self, revoked_partitions: Any) -> None:
            revoked.append(self.name)

        def on_partitions_assigned(self, assigned: Any) -> None:
            pass

    def python_member(instance: str) -> KafkaConsumer:
        consumer = KafkaConsumer(
            bootstrap_servers=kafka.bootstrap,
            group_id=python_group,
            group_instance_id=instance,
            session_timeout_ms=45_000,
            enable_auto_commit=False,
        )
        consumer.subscribe([topic_name], listener=Watch(instance))
        return consumer

    class Polled:
        """A consumer polled on a thread of its own (kafka-python joins inside poll)."""

        def __init__(self, instance: str) -> None:
            self.consumer = python_member(instance)
            self.stop = threading.Event()
            self.assigned: set[int] = set()
            self.thread = threading.Thread(target=self.run, daemon=True)
            self.thread.start()

        def run(self) -> None:
            while not self.stop.is_set():
                self.consumer.poll(100)
                self.assigned = {t.partition for t in self.consumer.assignment()}
            self.consumer.close(autocommit=False)

        def close(self) -> None:
            self.stop.set()
            self.thread.join(30)

    p, q = Polled("p"), Polled("q")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
        p.assigned and q.assigned and len(p.assigned | q.assigned) == 4
    ):
        time.sleep(0.1)
    p_had, q_had = p.assigned, q.assigned
    assert len(p_had | q_had) == 4 and not p_had & q_had
    p.close()
    revoked.clear()
    started = time.monotonic()
    p = Polled("p")
    try:
        while time.monotonic() < started + 30 and not p.assigned:
            time.sleep(0.05)
        took = time.monotonic() - started
        time.sleep(1)
        assert p.assigned == p_had
        assert took < 30, took  # before the 45 s session timeout
        assert "q" not in revoked and q.assigned == q_had
    finally:
        p.close()
        q.close()


# 6. Topic auto-creation: an option of the server, Kafka's per-request flag honoured


def test_topics_are_auto_created_only_when_the_server_and_the_request_allow_it(
    kafka: KafkaServer, tmp_path_factory: pytest.TempPathFactory, topic_name: str
) -> None:
    from confluent_kafka import Consumer, Producer

    # the default: off. A producer's Metadata does not create the topic
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, max_block_ms=2000)
    try:
        with pytest.raises(KafkaTimeoutError):
            producer.send(f"{topic_name}-off", b"v").get(5)
    finally:
        producer.close()
    assert f"{topic_name}-off" not in asyncio.run(_topics(kafka))
    # on: [kafka] auto_create_topics = true
    directory = tmp_path_factory.mktemp("auto-create")
    settings = directory / "headwater.toml"
    settings.write_text("[kafka]\nauto_create_topics = true\nauto_create_partitions = 3\n")
    server = KafkaServer(directory / "data")
    server.process.extra_args += ("--config", str(settings))
    server.start()
    try:
        # librdkafka's consumer asks with allow_auto_topic_creation false: not created
        consumer = Consumer(
            {"bootstrap.servers": server.bootstrap, "group.id": "auto", "log_level": 0}
        )
        try:
            consumer.list_topics(f"{topic_name}-consumed", timeout=5)
        finally:
            consumer.close()
        assert f"{topic_name}-consumed" not in asyncio.run(_topics(server))
        # librdkafka's producer (allows it): created with the partitions configured
        confluent = Producer({"bootstrap.servers": server.bootstrap})
        delivered: list[Any] = []
        confluent.produce(
            f"{topic_name}-confluent", b"v", on_delivery=lambda e, m: delivered.append(e)
        )
        confluent.flush(30)
        assert delivered == [None]
        # kafka-python's producer too
        producer = KafkaProducer(bootstrap_servers=server.bootstrap)
        try:
            assert producer.send(f"{topic_name}-python", b"v").get(30).offset == 0
        finally:
            producer.close()
        topics = asyncio.run(_topics(server))
        assert topics[f"{topic_name}-confluent"] == 3 and topics[f"{topic_name}-python"] == 3
    finally:
        server.stop()


async def _topics(server: KafkaServer) -> dict[str, int]:
    async with await headwater.connect(server.address) as client:
        return {t.name: t.partitions for t in await client.list_topics()}
