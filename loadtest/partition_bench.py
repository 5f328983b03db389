"""Partitions and Key_Shared: end-to-end throughput with 1, 4 and 16 partitions, and Key_Shared
against Shared with 4 consumers.

One server (`python -m headwater serve`, its own process, a temporary data directory) and the
clients in this process. Each row creates a reliable topic (fsync never), attaches its consumers,
produces `--count` keyed 100-byte records (1,000 distinct keys) with one producer, and times
from the first send to the last record received and acknowledged by the consumers: msgs/s end
to end. Each row runs `--runs` times; the median is reported with every run's figure.

    python -m loadtest.partition_bench --count 50000 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import headwater
from headwater.testing import ServerProcess


async def _row(
    address: str, topic: str, partitions: int, sub_type: str, consumers: int, count: int
) -> float:
    async with await headwater.connect(address) as admin:
        await admin.create_topic(
            topic, partitions=partitions, dispatch="reliable", configs={"fsync": "never"}
        )
        clients = [await headwater.connect(address) for _ in range(consumers)]
        attached = [
            await c.subscribe(
                topic,
                "bench",
                type=sub_type,
                name=f"c{i}",
                start="earliest",  # type: ignore[arg-type]
            )
            for i, c in enumerate(clients)
        ]
        received = 0
        done = asyncio.Event()

        async def take(consumer: headwater.Consumer) -> None:
            nonlocal received
            while not done.is_set():
                try:
                    batch = await consumer.receive_batch(timeout=0.2)
                except TimeoutError:
                    continue
                for message in batch:
                    await message.ack()
                received += len(batch)
                if received >= count:
                    done.set()

        tasks = [asyncio.create_task(take(c)) for c in attached]
        value = b"v" * 100
        started = time.perf_counter()
        producer = admin.producer(topic)
        for i in range(count):
            await producer.send(value, key=b"key-%d" % (i % 1000))
        await producer.close()
        await asyncio.wait_for(done.wait(), timeout=600)
        elapsed = time.perf_counter() - started
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for client in clients:
            await client.close()
        await admin.delete_topic(topic)
    return count / elapsed


ROWS = [
    ("1 partition, exclusive", 1, "exclusive", 1),
    ("4 partitions, exclusive", 4, "exclusive", 1),
    ("16 partitions, exclusive", 16, "exclusive", 1),
    ("4 partitions, shared, 4 consumers", 4, "shared", 4),
    ("4 partitions, key_shared, 4 consumers", 4, "key_shared", 4),
    ("4 partitions, failover, 4 consumers", 4, "failover", 4),
]


async def main(count: int, runs: int) -> None:
    directory = Path(tempfile.mkdtemp(prefix="hw-partition-bench-"))
    server = ServerProcess(directory / "data").start()
    try:
        print("| row | msgs/s end to end (median) | runs |")
        print("|---|---|---|")
        for n, (label, partitions, sub_type, consumers) in enumerate(ROWS):
            figures = [
                await _row(
                    server.address, f"bench-{n}-{run}", partitions, sub_type, consumers, count
                )
                for run in range(runs)
            ]
            runs_text = ", ".join(f"{f:,.0f}" for f in figures)
            print(f"| {label} | {statistics.median(figures):,.0f} | {runs_text} |", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.count, args.runs))
