"""The exactly-once sink's micro-batch commit timed against the commit it replaced, in one run.

A server of its own (a temporary data directory, the default reliable settings: fsync `always`),
a reliable topic of 3 partitions; rows of a string key and a 100-byte value. No Spark: the
functions Spark's Python workers call (headwater/spark_compaction/sink.py), in this one process,
so the figures are the sink's own. For each micro-batch size, `--batches` micro-batches of a
query are written each way, the ways taking turns batch by batch, each timed from its first row
until the driver's commit returned:

- `driver-txn`: `commit=driver` as now: the driver's commit of a staged Arrow file, one
  transaction of the rows and the query's marker;
- `driver-plain`: the same file committed as before transactions: the rows with an idempotent
  producer, then the marker (a map write) once all are acknowledged;
- `task-txn`: `commit=task` as now: two tasks (one after the other, half the rows each), each
  writing its rows and its marker in a transaction it hands off, then the driver's commit (two
  END_TXNs and the query's marker);
- `task-plain`: two tasks producing their rows with idempotent producers, then the marker.

Results go to stdout as JSON: per size and way, the median milliseconds per micro-batch and the
rows per second that makes.

    python -m loadtest.sink_txn_bench --sizes 1000,10000,100000 --batches 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

PARTITIONS = 3
VALUE = b"v" * 100
WAYS = ("driver-txn", "driver-plain", "task-txn", "task-plain")


def table(first: int, count: int) -> Any:
    import pyarrow as pa

    keys = [str(i).encode() for i in range(first, first + count)]
    return pa.record_batch({"key": keys, "value": [VALUE] * count})


def ways(address: str, staging: Path) -> dict[str, Callable[[int, int, int], None]]:
    from headwater.spark_compaction import sink

    def settings(topic: str, commit: str) -> Any:
        return sink.SinkSettings({"server": address, "topic": topic, "commit": commit})

    queries = {way: str(uuid.uuid4()) for way in WAYS}

    def driver(way: str, transactional: bool) -> Callable[[int, int, int], None]:
        def run(batch: int, first: int, count: int) -> None:
            staged = sink.stage_task(str(staging / way), iter([table(first, count)]))
            message = sink.Staged(staged.path, staged.rows, queries[way])
            sink.commit_batch(settings(way, "driver"), [message], batch, transactional)

        return run

    def task(way: str, transactional: bool) -> Callable[[int, int, int], None]:
        def run(batch: int, first: int, count: int) -> None:
            config = settings(way, "task")
            halves = [(first, count // 2), (first + count // 2, count - count // 2)]
            messages = []
            for partition, (start, rows) in enumerate(halves):
                batches = iter([table(start, rows)])
                if transactional:
                    messages.append(
                        sink.write_batch_task(config, batches, queries[way], batch, partition)
                    )
                else:
                    written = sink.write_task(config, batches)
                    messages.append(sink.SinkCommit(written.rows, queries[way]))
            sink.commit_batch(config, messages, batch, transactional)

        return run

    return {
        "driver-txn": driver("driver-txn", True),
        "driver-plain": driver("driver-plain", False),
        "task-txn": task("task-txn", True),
        "task-plain": task("task-plain", False),
    }


async def setup(address: str) -> None:
    import headwater

    async with await headwater.connect(address) as client:
        for way in WAYS:
            await client.create_topic(way, partitions=PARTITIONS, dispatch="reliable")
        await client.create_topic(
            "headwater-sink-commits", configs={"last.value": "true"}, exist_ok=True
        )


async def written(address: str, topic: str) -> int:
    """The committed records of `topic` (markers and aborted records left out)."""
    import headwater

    count = 0
    async with await headwater.connect(address) as client:
        for partition in range(PARTITIONS):
            offset = 0
            for _ in range(100_000):  # each FETCH moves on, or the partition is read
                fetched = await client.fetch(topic, partition, offset, 4 * 1024 * 1024)
                count += len(fetched.records())
                if fetched.next_offset >= fetched.end_offset:
                    break
                offset = fetched.next_offset
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--batches", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    from headwater.testing import ServerProcess

    timings: dict[int, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(Path(tmp) / "data").start()
        try:
            asyncio.run(setup(server.address))
            runs = ways(server.address, Path(tmp) / "staging")
            batch, first = 0, 0
            for size in sizes:
                timings[size] = {way: [] for way in WAYS}
                for _ in range(args.batches):
                    for way in WAYS:
                        started = time.perf_counter()
                        runs[way](batch, first, size)
                        timings[size][way].append(time.perf_counter() - started)
                    batch, first = batch + 1, first + size
            total = first
            for way in WAYS:  # each wrote every row, once
                assert asyncio.run(written(server.address, way)) == total, way
        finally:
            server.stop()
    results = {
        str(size): {
            way: {
                "ms_per_batch": round(statistics.median(times) * 1000, 1),
                "rows_per_s": round(size / statistics.median(times)),
            }
            for way, times in by_way.items()
        }
        for size, by_way in timings.items()
    }
    print(
        json.dumps(
            {
                "rows_per_way": total,
                "results": results,
                "cpus": os.cpu_count(),
                "load_average": os.getloadavg(),
                "python": platform.python_version(),
            }
        )
    )


if __name__ == "__main__":
    main()
