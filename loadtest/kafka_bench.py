"""Stock Kafka clients on the Kafka listener next to the native batch API, in the same run.

A server of its own (a temporary data directory) with its Kafka listener on; topics of 3
partitions, reliable with fsync `never` (the protocol is measured, not the disk), N records of
100-byte values. Rows, each timed from the first send to the last acknowledgement (producers) or
the last record in hand (consumers), with the server's CPU seconds over the same span:

- `native producer`: `Producer.send_batch` of 500 values per call, per partition (at-least-once);
- `aiokafka producer`: `AIOKafkaProducer.send` per record (acks=1, linger 5 ms, 256 KiB batches,
  no idempotence), every future awaited at the end;
- `kcat producer (librdkafka)`: `kcat -P` reading the values as lines (acks=1, linger 5 ms,
  partitioner random), the process's whole run;
- `confluent-kafka producer`: `Producer.produce` per record (librdkafka; acks=1, linger 5 ms,
  no idempotence), then `flush()`;
- `native consumer`: an Exclusive subscription from earliest, `next_batch()` and one cumulative
  ack per batch;
- `aiokafka consumer`: the three partitions assigned (no group), from the beginning, `getmany`;
- `kcat consumer (librdkafka)`: `kcat -C -e` from the beginning, printing only offsets;
- `confluent-kafka consumer`: the three partitions assigned from the beginning, `consume()` in
  batches of up to 10,000.

aiokafka encodes and decodes each record in Python, so its rows measure the client more than the
server; kcat's are librdkafka's C client, the fairest comparison of the two protocols.

Results go to stdout as JSON: msgs/s and server CPU µs per message for each row.

    python -m loadtest.kafka_bench --records 300000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

PARTITIONS = 3
VALUE = b"v" * 100
CHUNK = 500


async def native_produce(address: str, bootstrap: str, topic: str, records: int) -> None:
    import headwater

    async with await headwater.connect(address) as client:
        producer = client.producer(topic)
        for i in range(records // CHUNK):
            await producer.send_batch([VALUE] * CHUNK, partition=i % PARTITIONS)
        await producer.flush()
        await producer.close()


async def kafka_produce(address: str, bootstrap: str, topic: str, records: int) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks=1,
        linger_ms=5,
        max_batch_size=256 * 1024,
        enable_idempotence=False,
    )
    await producer.start()
    try:
        futures = [
            await producer.send(topic, VALUE, partition=i % PARTITIONS) for i in range(records)
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def native_consume(address: str, bootstrap: str, topic: str, records: int) -> None:
    import headwater

    async with await headwater.connect(address) as client:
        consumer = await client.subscribe(topic, "bench", start="earliest", prefetch=20_000)
        seen = 0
        while seen < records:
            batch = await consumer.next_batch(timeout=60)
            seen += len(batch.values())
            await batch.ack_cumulative()
        await consumer.close()


async def kafka_consume(address: str, bootstrap: str, topic: str, records: int) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_bytes=8 * 1024 * 1024,
        max_partition_fetch_bytes=2 * 1024 * 1024,
    )
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        seen = 0
        while seen < records:
            batches = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            seen += sum(len(messages) for messages in batches.values())
    finally:
        await consumer.stop()


async def kcat_produce(address: str, bootstrap: str, topic: str, records: int) -> None:
    lines = (VALUE + b"\n") * records
    process = await asyncio.create_subprocess_exec(
        "kcat",
        "-b",
        bootstrap,
        "-P",
        "-t",
        topic,
        "-X",
        "linger.ms=5",
        "-X",
        "batch.size=262144",
        "-X",
        "acks=1",
        "-X",
        "enable.idempotence=false",
        stdin=asyncio.subprocess.PIPE,
    )
    await process.communicate(lines)
    if process.returncode:
        raise RuntimeError(f"kcat -P exited {process.returncode}")


async def kcat_consume(address: str, bootstrap: str, topic: str, records: int) -> None:
    process = await asyncio.create_subprocess_exec(
        "kcat",
        "-b",
        bootstrap,
        "-C",
        "-t",
        topic,
        "-o",
        "beginning",
        "-e",
        "-q",
        "-f",
        "%o\n",
        # librdkafka reads read_committed by default: only what an fsync covers, which under
        # fsync `never` is nothing yet (docs/KAFKA.md)
        "-X",
        "isolation.level=read_uncommitted",
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await process.communicate()
    seen = out.count(b"\n")
    if process.returncode or seen != records:
        raise RuntimeError(f"kcat -C exited {process.returncode} after {seen} records")


async def confluent_produce(address: str, bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": 1,
            "linger.ms": 5,
            "batch.size": 256 * 1024,
            "enable.idempotence": False,
            "queue.buffering.max.messages": records,
        }
    )
    for i in range(records):
        producer.produce(topic, VALUE, partition=i % PARTITIONS)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("confluent-kafka did not deliver every record in 120 s")


async def confluent_consume(address: str, bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",  # as kcat's, above
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        seen = 0
        deadline = time.monotonic() + 120
        while seen < records and time.monotonic() < deadline:
            seen += sum(1 for m in consumer.consume(10_000, 1.0) if not m.error())
        if seen < records:
            raise RuntimeError(f"confluent-kafka read {seen} of {records} records")
    finally:
        consumer.close()


Step = Callable[[str, str, str, int], Awaitable[None]]


def timed(step: Step, server: Any, bootstrap: str, topic: str, records: int) -> dict[str, float]:
    from loadtest.harness import process_cpu

    cpu = process_cpu(server.process.pid)
    started = time.perf_counter()
    asyncio.run(step(server.address, bootstrap, topic, records))
    elapsed = time.perf_counter() - started
    used = process_cpu(server.process.pid) - cpu
    return {
        "msgs_per_s": round(records / elapsed),
        "server_cpu_us_per_msg": round(used / records * 1e6, 2),
    }


async def create(address: str, *topics: str) -> None:
    import headwater

    async with await headwater.connect(address) as client:
        for topic in topics:
            await client.create_topic(
                topic, partitions=PARTITIONS, dispatch="reliable", configs={"fsync": "never"}
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=1, help="alternating runs of every row")
    args = parser.parse_args()
    records = args.records // (PARTITIONS * CHUNK) * PARTITIONS * CHUNK

    from headwater.testing import ServerProcess

    rows: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        port_file = root / "kafka.port"
        server = ServerProcess(
            root / "data", extra_args=("--kafka-port", "0", "--kafka-port-file", str(port_file))
        ).start()
        bootstrap = f"127.0.0.1:{int(port_file.read_text())}"
        try:
            for run in range(args.runs):
                native, kafka, kcat = f"native-{run}", f"kafka-{run}", f"kcat-{run}"
                confluent = f"confluent-{run}"
                asyncio.run(create(server.address, native, kafka, kcat, confluent))
                for name, step, topic in (
                    ("native producer", native_produce, native),
                    ("aiokafka producer", kafka_produce, kafka),
                    ("kcat producer (librdkafka)", kcat_produce, kcat),
                    ("confluent-kafka producer", confluent_produce, confluent),
                    ("native consumer", native_consume, native),
                    ("aiokafka consumer", kafka_consume, kafka),
                    ("kcat consumer (librdkafka)", kcat_consume, kcat),
                    ("confluent-kafka consumer", confluent_consume, confluent),
                ):
                    rows.setdefault(name, []).append(timed(step, server, bootstrap, topic, records))
        finally:
            server.stop()
    print(
        json.dumps(
            {
                "records": records,
                "value_bytes": len(VALUE),
                "rows": rows,
                "cpus": os.cpu_count(),
                "load_average": os.getloadavg(),
                "python": platform.python_version(),
            }
        )
    )


if __name__ == "__main__":
    main()
