"""A read below the local WAL over a hole of missing objects longer than one read's walk
(`object_store.walk_limit`, `storage.log_reader.Walked`).

Three objects in a row are deleted from the object store of a server whose reads walk over two
missing objects at most: the first read at the hole is cut short with nothing found. The next
read goes on where that walk stopped, so a subscription from `earliest`, a native FETCH reader
and a Kafka consumer (librdkafka) each get every record after the hole, in order, and none twice.
Nothing is stepped over that the walk did not find missing: the FETCH that ends cut short
answers no batch and no step (its `next_offset` is the offset asked for), so a Kafka Fetch gets
no gap batch spanning records it never saw. Before, every read at the hole walked the same two
objects again and stopped there: each reader stayed in front of the hole for good.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import headwater
from tests.support.kafka_support import KafkaServer

TOPIC = "holes"
RECORDS = 120


def _objects(server: KafkaServer) -> list[Path]:
    return sorted((server.process.data_dir / "objects" / TOPIC / "0").glob("*.log"))


def _local_start(server: KafkaServer) -> int:
    local = (server.process.data_dir / "topics" / TOPIC / "0").glob("*.log")
    return min(int(p.name[:20]) for p in local)


async def _hole(server: KafkaServer, client: headwater.Client) -> list[bytes]:
    """RECORDS records of one batch each in segments of about 14, uploaded and trimmed locally;
    objects 1 to 3 then deleted. The values a reader can still get, in offset order."""
    await client.create_topic(
        TOPIC,
        dispatch="reliable",
        configs={"segment.bytes": 1024, "retention.bytes": 0, "fsync": "never"},
    )
    producer = client.producer(TOPIC)
    values = [f"value-{i:04d}-{'x' * 60}".encode() for i in range(RECORDS)]
    for value in values:
        await (await producer.send(value, partition=0))
    await producer.close()
    deadline = time.monotonic() + 60
    while True:  # uploaded, and the local WAL starts past the hole's end
        objects = _objects(server)
        if len(objects) >= 6 and _local_start(server) >= int(objects[5].name[:20]):
            break
        assert time.monotonic() < deadline, "segments not uploaded and trimmed in time"
        await asyncio.sleep(0.1)
    first, end = int(objects[1].name[:20]), int(objects[4].name[:20])
    for lost in objects[1:4]:
        lost.unlink()
    return values[:first] + values[end:]


async def test_readers_below_a_hole_longer_than_the_walk_limit_get_the_records_after_it(
    tmp_path: Path,
) -> None:
    from confluent_kafka import Consumer

    server = KafkaServer(tmp_path / "data", config="[object_store]\nwalk_limit = 2\n").start()
    try:
        async with await headwater.connect(server.address) as client:
            expected = await _hole(server, client)

            # a native FETCH reader: each answer either has batches or steps nowhere
            received: list[bytes] = []
            offset, cut_short = 0, 0
            for _ in range(RECORDS * 2):
                if len(received) == len(expected):
                    break
                fetched = await client.fetch(TOPIC, 0, offset, max_bytes=1)
                values = [r.value for r in fetched.records()]
                if not values:
                    assert fetched.next_offset == offset, "stepped over what was never read"
                    cut_short += 1
                received += [v for v in values if v is not None]
                offset = fetched.next_offset
            assert received == expected
            assert cut_short >= 1  # the first read at the hole stopped at the walk limit

            # a subscription from earliest: every record after the hole, without an append
            consumer = await client.subscribe(TOPIC, "replay", start="earliest", prefetch=50)
            delivered = []
            while len(delivered) < len(expected):
                message = await consumer.receive(timeout=30)  # stuck in front of the hole
                delivered.append(message.value)
                await message.ack()
            assert delivered == expected
            await consumer.close()

        def kafka_read() -> list[bytes]:
            reader = Consumer(
                {
                    "bootstrap.servers": server.bootstrap,
                    "group.id": "walk",
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                    # (read_committed sees only what an fsync covers: under `never`, the
                    # sealed segments; docs/KAFKA.md)
                    "isolation.level": "read_uncommitted",
                }
            )
            got: list[bytes] = []
            try:
                reader.subscribe([TOPIC])
                deadline = time.monotonic() + 60
                while len(got) < len(expected) and time.monotonic() < deadline:
                    message = reader.poll(0.5)
                    if message is not None and message.error() is None:
                        got.append(message.value())
            finally:
                reader.close()
            return got

        assert await asyncio.to_thread(kafka_read) == expected
    finally:
        server.stop()
    log = server.process.log()
    assert "topic.read_walk_cut_short" in log
    assert "Traceback" not in log
