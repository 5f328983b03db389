"""Stock Kafka clients against the Kafka listener of a real server (docs/KAFKA.md): kafka-python,
aiokafka and kcat produce with acks=all (idempotent) and consume keyed records with headers, byte
for byte what the native client reads from the same topic, and the reverse; offsets by time;
topics created and deleted through Kafka's admin API; a Fetch long poll woken by a native
produce; acked messages still there after kill -9, and an idempotent producer's retry after it
not appended twice."""

from __future__ import annotations

import asyncio
import shutil
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.protocol.fetch import FetchRequest_v4, FetchResponse_v4
from aiokafka.protocol.produce import ProduceRequest_v3, ProduceResponse_v3
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewPartitions, NewTopic
from kafka.errors import InvalidPartitionsError, TopicAlreadyExistsError

import headwater
from headwater.server.kafka.handlers import split_batches
from headwater.wire.records import BatchBuilder, Compression
from tests.support.kafka_support import KafkaServer, RawKafka

Seen = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    server = KafkaServer(tmp_path_factory.mktemp("kafka") / "data").start()
    yield server
    server.stop()


async def _create(server: KafkaServer, topic: str, partitions: int = 1) -> None:
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic, partitions=partitions, dispatch="reliable")


async def _native_read(server: KafkaServer, topic: str, partitions: int = 1) -> list[Seen]:
    """What the native client's FETCH reads: (partition, offset, key, value, headers)."""
    seen: list[Seen] = []
    async with await headwater.connect(server.address) as client:
        for partition in range(partitions):
            offset = 0
            for _ in range(100):  # a read ends at a segment's end (and a gap starts a segment)
                fetched = await client.fetch(topic, partition, offset)
                seen += [
                    (partition, r.offset, r.key, r.value, tuple(r.headers))
                    for r in fetched.records()
                ]
                offset = fetched.next_offset
                if offset >= fetched.end_offset:
                    break
    return seen


def _kafka_python_read(server: KafkaServer, topic: str, expected: int) -> list[Seen]:
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=server.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=5000,
    )
    seen: list[Seen] = []
    try:
        for message in consumer:
            seen.append(
                (
                    message.partition,
                    message.offset,
                    message.key,
                    message.value,
                    tuple(message.headers),
                )
            )
            if len(seen) == expected:
                break
    finally:
        consumer.close()
    return sorted(seen)


RECORDS = [
    (f"key-{i % 3}".encode(), f"value {i}".encode(), [("n", str(i).encode())]) for i in range(20)
]


def test_kafka_python_produces_with_acks_all_what_the_native_client_and_it_read(
    kafka: KafkaServer, topic_name: str
) -> None:
    asyncio.run(_create(kafka, topic_name, 3))
    # kafka-python 3's default: idempotent (InitProducerId, sequence numbers), acks=all
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
    futures = [producer.send(topic_name, v, key=k, headers=h) for k, v, h in RECORDS]
    acked = [f.get(10) for f in futures]
    producer.close()
    # keyed: one key, one partition, in order
    assert (
        len({(m.partition) for m, (k, _, _) in zip(acked, RECORDS, strict=True) if k == b"key-0"})
        == 1
    )
    native = sorted(asyncio.run(_native_read(kafka, topic_name, 3)))
    assert sorted((m.partition, m.offset) for m in acked) == [(p, o) for p, o, *_ in native]
    assert sorted((v, k) for _, _, k, v, _ in native) == sorted((v, k) for k, v, _ in RECORDS)
    assert {(v, h) for _, _, _, v, h in native} == {(v, tuple(h)) for _, v, h in RECORDS}
    assert _kafka_python_read(kafka, topic_name, len(RECORDS)) == native


async def test_aiokafka_produces_with_acks_all_what_the_native_client_and_it_read(
    kafka: KafkaServer, topic_name: str
) -> None:
    await _create(kafka, topic_name, 2)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka.bootstrap, acks="all", enable_idempotence=True
    )
    await producer.start()
    try:
        acked = [
            await producer.send_and_wait(topic_name, v, key=k, headers=h) for k, v, h in RECORDS
        ]
    finally:
        await producer.stop()
    native = sorted(await _native_read(kafka, topic_name, 2))
    assert sorted((m.partition, m.offset) for m in acked) == [(p, o) for p, o, *_ in native]
    consumer = AIOKafkaConsumer(
        topic_name,
        bootstrap_servers=kafka.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    seen: list[Seen] = []
    try:
        async with asyncio.timeout(20):
            while len(seen) < len(RECORDS):
                for messages in (await consumer.getmany(timeout_ms=1000)).values():
                    seen += [
                        (m.partition, m.offset, m.key, m.value, tuple(m.headers)) for m in messages
                    ]
    finally:
        await consumer.stop()
    assert sorted(seen) == native


async def test_what_the_native_client_produces_kafka_clients_read(
    kafka: KafkaServer, topic_name: str
) -> None:
    await _create(kafka, topic_name)
    async with await headwater.connect(kafka.address) as client:
        producer = client.producer(topic_name)
        for key, value, headers in RECORDS:
            await producer.send(value, key=key, headers=dict(headers), partition=0)
        await producer.flush()
        await producer.close()
    native = await _native_read(kafka, topic_name)
    assert len(native) == len(RECORDS)
    assert await asyncio.to_thread(_kafka_python_read, kafka, topic_name, len(RECORDS)) == native


def _kcat(*args: str, stdin: bytes | None = None) -> str:
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is not installed: `make install` installs Debian's kcat"
    done = subprocess.run([kcat, *args], input=stdin, capture_output=True, timeout=60, check=True)
    return done.stdout.decode()


def test_kcat_lists_produces_keyed_with_headers_and_consumes(
    kafka: KafkaServer, topic_name: str
) -> None:
    asyncio.run(_create(kafka, topic_name, 2))
    listing = _kcat("-b", kafka.bootstrap, "-L", "-t", topic_name)
    assert f'topic "{topic_name}" with 2 partitions' in listing
    assert "partition 1, leader 0" in listing
    lines = b"".join(f"k{i}:v{i}\n".encode() for i in range(10))
    _kcat("-b", kafka.bootstrap, "-P", "-t", topic_name, "-K:", "-H", "src=kcat", stdin=lines)
    native = sorted(asyncio.run(_native_read(kafka, topic_name, 2)))
    assert sorted((k, v) for _, _, k, v, _ in native) == sorted(
        (f"k{i}".encode(), f"v{i}".encode()) for i in range(10)
    )
    assert {h for *_, h in native} == {(("src", b"kcat"),)}
    consumed = _kcat(
        "-b", kafka.bootstrap, "-C", "-t", topic_name, "-e", "-q", "-f", "%p %o %k %s %h\n"
    )
    assert sorted(consumed.splitlines()) == sorted(
        f"{p} {o} {k.decode()} {v.decode()} src=kcat" for p, o, k, v, _ in native
    )


def test_offsets_earliest_latest_and_by_timestamp(kafka: KafkaServer, topic_name: str) -> None:
    asyncio.run(_create(kafka, topic_name))
    producer = KafkaProducer(
        bootstrap_servers=kafka.bootstrap, acks="all", enable_idempotence=False
    )
    base = int(time.time() * 1000)
    for i in range(10):  # timestamps base, base+1000, ...: one batch each (flushed)
        producer.send(topic_name, b"x", timestamp_ms=base + 1000 * i).get(10)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic_name, 0)
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 10}
        found = consumer.offsets_for_times({tp: base + 4500})
        assert found[tp] is not None and found[tp].offset == 5
        assert consumer.offsets_for_times({tp: base + 60_000}) == {tp: None}
    finally:
        consumer.close()


def test_topics_are_created_and_deleted_through_kafka_admin(
    kafka: KafkaServer, topic_name: str
) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        admin.create_topics([NewTopic(topic_name, 4, 1, topic_configs={"retention.ms": "60000"})])
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic(topic_name, 1, 1)])
        assert topic_name in admin.list_topics()

        async def described() -> headwater.wire.messages.DescribeTopicResponse:
            async with await headwater.connect(kafka.address) as client:
                return await client.describe_topic(topic_name)

        info = asyncio.run(described()).topic
        assert info.partitions == 4
        assert ("retention.ms", "60000") in {(c.name, c.value) for c in info.configs}
        admin.delete_topics([topic_name])
        assert topic_name not in admin.list_topics()
    finally:
        admin.close()


async def test_a_fetch_at_the_end_waits_and_is_woken_by_a_native_produce(
    kafka: KafkaServer, topic_name: str
) -> None:
    await _create(kafka, topic_name)
    consumer = AIOKafkaConsumer(
        topic_name,
        bootstrap_servers=kafka.bootstrap,
        auto_offset_reset="latest",
        enable_auto_commit=False,
        fetch_max_wait_ms=15_000,
    )
    await consumer.start()
    try:
        waiting = asyncio.ensure_future(consumer.getone())
        await asyncio.sleep(1.0)  # the consumer's fetch is parked at the end (nothing to await)
        assert not waiting.done()
        async with await headwater.connect(kafka.address) as client:
            producer = client.producer(topic_name)
            sent = time.monotonic()
            await (await producer.send(b"wake", partition=0))
            await producer.close()
        message = await asyncio.wait_for(waiting, 10)
        assert message.value == b"wake"
        assert time.monotonic() - sent < 5.0  # woken by the append, not the 15 s max wait
    finally:
        await consumer.stop()


def test_acked_messages_are_there_after_kill_9(tmp_path: Path, topic_name: str) -> None:
    server = KafkaServer(tmp_path / "data").start()
    try:
        asyncio.run(_create(server, topic_name, 2))
        producer = KafkaProducer(
            bootstrap_servers=server.bootstrap, acks="all", enable_idempotence=False
        )
        acked = [producer.send(topic_name, k + v, key=k).get(10) for k, v, _ in RECORDS]
        server.kill()
        producer.close(timeout=1)
        server.start()
        assert _kafka_python_read(server, topic_name, len(RECORDS)) == sorted(
            (m.partition, m.offset, k, k + v, ())
            for m, (k, v, _) in zip(acked, RECORDS, strict=True)
        )
    finally:
        server.kill()


def _init_producer_id(raw: RawKafka) -> tuple[int, int]:
    raw.request(22, 0, 1, struct.pack(">hi", -1, 60_000))  # no transactional id
    _, body = raw.response()
    _throttle, error, producer_id, epoch = struct.unpack(">ihqh", body)
    assert error == 0
    return producer_id, epoch


def _produce_raw(raw: RawKafka, topic: str, batch: bytes, correlation: int) -> tuple[int, int]:
    """(error code, base offset) of a Produce v3 of `batch` to partition 0 with acks=all."""
    body = ProduceRequest_v3(None, -1, 30_000, [(topic, [(0, batch)])]).encode()
    raw.request(0, 3, correlation, body)
    got, answer = raw.response()
    assert got == correlation
    ((_, ((_, error, offset, _),)),), _ = ProduceResponse_v3.decode(answer).topics, None
    return error, offset


def test_an_idempotent_producers_retry_is_not_appended_twice_even_after_kill_9(
    tmp_path: Path, topic_name: str
) -> None:
    """A Kafka producer id is a Headwater one: the sequence numbers Kafka clients stamp are
    checked by the native idempotent-producer tables, which survive a restart."""
    server = KafkaServer(tmp_path / "data").start()
    try:
        asyncio.run(_create(server, topic_name))
        raw = RawKafka(server.kafka_port)
        producer_id, epoch = _init_producer_id(raw)

        def batch(sequence: int, values: list[bytes]) -> bytes:
            builder = BatchBuilder(
                producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence
            )
            for value in values:
                builder.append(None, value)
            return builder.build()

        first = batch(0, [b"a", b"b", b"c"])
        assert _produce_raw(raw, topic_name, first, 2) == (0, 0)
        assert _produce_raw(raw, topic_name, first, 3) == (0, 0)  # a retry: its first offset
        raw.close()
        server.kill()
        server.start()
        raw = RawKafka(server.kafka_port)
        assert _produce_raw(raw, topic_name, first, 4) == (0, 0)  # still, after kill -9
        error, offset = _produce_raw(raw, topic_name, batch(3, [b"d"]), 5)
        assert error == 0 and offset >= 3  # past the gap an unclean stop leaves (DURABILITY.md)
        error, _ = _produce_raw(raw, topic_name, batch(9, [b"z"]), 6)
        assert error == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER: a gap in the sequence
        raw.close()
        values = [v for *_, v, _ in asyncio.run(_native_read(server, topic_name))]
        assert values == [b"a", b"b", b"c", b"d"]
    finally:
        server.kill()


async def test_a_map_set_natively_is_read_through_kafka_and_a_kafka_tombstone_deletes_it(
    kafka: KafkaServer, topic_name: str
) -> None:
    async with await headwater.connect(kafka.address) as client:
        await client.create_topic(topic_name, dispatch="reliable", configs={"last.value": "true"})
        prices = client.map(topic_name)
        await prices.set(b"IBM", b"142.10")
        await prices.set(b"AAPL", b"200")
        read = await asyncio.to_thread(_kafka_python_read, kafka, topic_name, 2)
        assert [(k, v) for _, _, k, v, _ in read] == [(b"IBM", b"142.10"), (b"AAPL", b"200")]
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(topic_name, None, key=b"IBM")  # a tombstone
        finally:
            await producer.stop()
        assert await prices.get(b"IBM") is None
        assert await prices.get(b"AAPL") is not None


def test_a_batch_checked_off_the_loop_is_not_overtaken_by_the_next(
    kafka: KafkaServer, topic_name: str
) -> None:
    """A large compressed batch is checked on the inflater thread; the small batch pipelined right
    behind it on the same connection still gets the later offsets."""
    asyncio.run(_create(kafka, topic_name))
    big = BatchBuilder(Compression.GZIP)
    for i in range(5000):  # past the records checked on the loop
        big.append(None, b"%d" % i)
    small = BatchBuilder()
    small.append(None, b"after")
    raw = RawKafka(kafka.kafka_port)
    try:
        for correlation, batch in ((1, big.build()), (2, small.build())):
            body = ProduceRequest_v3(None, 1, 30_000, [(topic_name, [(0, batch)])]).encode()
            raw.request(0, 3, correlation, body)
        offsets = []
        for correlation in (1, 2):
            got, answer = raw.response()
            assert got == correlation  # answers in request order
            ((_, ((_, error, offset, _),)),) = ProduceResponse_v3.decode(answer).topics
            assert error == 0
            offsets.append(offset)
        assert offsets == [0, 5000]
    finally:
        raw.close()


def test_partitions_added_and_configs_described_through_kafka_admin(
    kafka: KafkaServer, topic_name: str
) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    compacted = f"{topic_name}-compacted"
    try:
        admin.create_topics(
            [
                NewTopic(topic_name, 2, 1, topic_configs={"retention.ms": "60000"}),
                NewTopic(compacted, 1, 1, topic_configs={"cleanup.policy": "compact"}),
            ]
        )
        admin.create_partitions({topic_name: NewPartitions(5)})
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({topic_name: NewPartitions(3)})  # never fewer
        described = admin.describe_configs(
            [
                ConfigResource(ConfigResourceType.TOPIC, topic_name),
                ConfigResource(ConfigResourceType.TOPIC, compacted),
            ],
            config_filter="all",  # with the defaults (delete is cleanup.policy's)
        )
    finally:
        admin.close()

    async def native() -> tuple[int, bool]:
        async with await headwater.connect(kafka.address) as client:
            plain = await client.describe_topic(topic_name)
            last = await client.describe_topic(compacted)
            return plain.topic.partitions, ("last.value", "true") in {
                (c.name, c.value) for c in last.topic.configs
            }

    assert asyncio.run(native()) == (5, True)  # cleanup.policy=compact is a last-value topic
    plain, compact = described["topic"][topic_name], described["topic"][compacted]
    assert plain["retention.ms"]["value"] == "60000"
    assert (plain["cleanup.policy"]["value"], compact["cleanup.policy"]["value"]) == (
        "delete",
        "compact",
    )


def _fetch_v4(raw: RawKafka, topic: str, isolation: int, correlation: int) -> tuple[int, int]:
    """(records read, last stable offset) of partition 0 from offset 0."""
    body = FetchRequest_v4(-1, 0, 0, 1 << 20, isolation, [(topic, [(0, 0, 1 << 20)])]).encode()
    raw.request(1, 4, correlation, body)
    got, answer = raw.response()
    assert got == correlation
    ((_, ((_, error, _high, stable, _aborted, records),)),) = FetchResponse_v4.decode(answer).topics
    assert error == 0
    return len(records) and sum(
        1 + struct.unpack_from(">i", batch, 23)[0] for batch in split_batches(records)
    ), stable


def test_read_committed_sees_only_what_an_fsync_covers(kafka: KafkaServer, topic_name: str) -> None:
    """On a topic with fsync `never`, a read_committed Fetch gets nothing of what is not yet
    fsynced (its last stable offset stays below); a read_committed produce (acks=all) fsyncs
    everything before it, and the Fetch then sees all of it."""

    async def setup() -> None:
        async with await headwater.connect(kafka.address) as client:
            await client.create_topic(topic_name, configs={"fsync": "never"})
            producer = client.producer(topic_name)
            await producer.send_batch([b"x"] * 10, partition=0)
            await producer.flush()
            await producer.close()

    asyncio.run(setup())
    raw = RawKafka(kafka.kafka_port)
    try:
        assert _fetch_v4(raw, topic_name, 0, 1) == (10, 10)  # read_uncommitted: all of it
        assert _fetch_v4(raw, topic_name, 1, 2) == (0, 0)  # read_committed: nothing fsynced
        producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
        producer.send(topic_name, b"y", partition=0).get(10)
        producer.close()
        assert _fetch_v4(raw, topic_name, 1, 3) == (11, 11)
    finally:
        raw.close()


def test_confluent_kafka_idempotent_producer_and_group_consumer(
    kafka: KafkaServer, topic_name: str
) -> None:
    """librdkafka through confluent-kafka (as Java-like clients run: idempotence on, acks=all,
    a consumer group committing): what it produces is what the native client reads, and its
    commits are the group's subscription."""
    from confluent_kafka import Consumer, Producer

    asyncio.run(_create(kafka, topic_name, 3))
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True, "acks": "all"}
    )
    delivered: list[tuple[int, int]] = []
    errors: list[object] = []

    def done(error: object, message: object) -> None:
        if error is not None:
            errors.append(error)
        else:
            delivered.append((message.partition(), message.offset()))  # type: ignore[attr-defined]

    for key, value, headers in RECORDS:
        producer.produce(topic_name, value=value, key=key, headers=headers, on_delivery=done)
    assert producer.flush(30) == 0
    assert errors == []
    native = sorted(asyncio.run(_native_read(kafka, topic_name, 3)))
    assert sorted(delivered) == [(p, o) for p, o, *_ in native]
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": "confluent",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    seen: list[Seen] = []
    try:
        consumer.subscribe([topic_name])
        deadline = time.monotonic() + 60
        while len(seen) < len(RECORDS) and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None or message.error():
                continue
            seen.append(
                (
                    message.partition(),
                    message.offset(),
                    message.key(),
                    message.value(),
                    tuple(message.headers() or ()),
                )
            )
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert sorted(seen) == native

    async def committed() -> int:
        async with await headwater.connect(kafka.address) as client:
            (group,) = [
                s for s in await client.list_subscriptions(topic_name) if s.name == "confluent"
            ]
            return sum(p.committed for p in group.partitions)

    assert asyncio.run(committed()) == len(RECORDS)


def test_kafka_consumers_step_over_the_offsets_a_kill_9_skipped_to_the_high_watermark(
    tmp_path: Path, topic_name: str
) -> None:
    """After an unclean stop the log goes on at its offset lease, past offsets no batch holds.
    A Kafka client moves only by the batches a Fetch gives it: Fetch answers an empty batch
    spanning such offsets (as a Kafka broker leaves where compaction emptied one), so each
    client's position reaches the high watermark, with no new record needed to pull it there."""
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka import TopicPartition as ConfluentPartition

    server = KafkaServer(tmp_path / "data").start()
    try:
        asyncio.run(_create(server, topic_name))
        producer = KafkaProducer(bootstrap_servers=server.bootstrap, acks="all")
        for i in range(5):
            producer.send(topic_name, f"v{i}".encode()).get(timeout=30)
        producer.close()
        server.kill()
        server.start()
        consumer = KafkaConsumer(
            bootstrap_servers=server.bootstrap, enable_auto_commit=False, consumer_timeout_ms=500
        )
        partition = TopicPartition(topic_name, 0)
        consumer.assign([partition])
        consumer.seek_to_end(partition)
        end = consumer.position(partition)
        assert end > 5, f"no gap after the kill -9: the high watermark is {end}"
        consumer.seek_to_beginning(partition)
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while consumer.position(partition) < end and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                values += [r.value for r in records]
        assert values == [f"v{i}".encode() for i in range(5)]
        assert consumer.position(partition) == end  # kafka-python: across the gap
        consumer.close()

        async def aiokafka_position() -> int:
            from aiokafka import TopicPartition as AioPartition

            reader = AIOKafkaConsumer(bootstrap_servers=server.bootstrap, enable_auto_commit=False)
            await reader.start()
            try:
                assigned = AioPartition(topic_name, 0)
                reader.assign([assigned])
                await reader.seek_to_beginning(assigned)
                got = 0
                for _ in range(60):
                    batch = await reader.getmany(assigned, timeout_ms=500)
                    got += len(batch.get(assigned, []))
                    if await reader.position(assigned) >= end:
                        break
                assert got == 5
                return await reader.position(assigned)
            finally:
                await reader.stop()

        assert asyncio.run(aiokafka_position()) == end

        librdkafka = Consumer(
            {
                "bootstrap.servers": server.bootstrap,
                "group.id": "gap",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
        try:
            librdkafka.assign([ConfluentPartition(topic_name, 0, 0)])
            got = 0
            eof = -1
            deadline = time.monotonic() + 30
            while eof < 0 and time.monotonic() < deadline:
                message = librdkafka.poll(0.5)
                if message is None:
                    continue
                if message.error() is None:
                    got += 1
                elif message.error().code() == KafkaError._PARTITION_EOF:
                    eof = message.offset()
            assert got == 5
            # librdkafka: its fetch position across the gap (its `position()` is the
            # application's, one past the last message delivered, as after Kafka's compaction)
            assert eof == end
        finally:
            librdkafka.close()
    finally:
        server.kill()
