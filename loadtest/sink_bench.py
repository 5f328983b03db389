"""The Spark sink's write rate next to the native producer's, in the same run.

A server of its own (a temporary data directory, the default reliable settings: fsync `always`),
reliable topics of 3 partitions. Each writer writes N rows of a string key (the row number) and a
100-byte value into a topic of its own, keyed (`crc32(key) % 3`), and is timed from its start until
the server has acknowledged every row:

- `producer`: the native client in one process, an idempotent producer, `send_batch` of 500 rows
  at a time, then `flush()`;
- `spark-driver` / `spark-task`: `df.write.format("headwater")` on local[2] from a 2-partition
  `spark.range` DataFrame, with `commit=driver` (the default: the tasks stage their rows in
  files, the driver produces them with one producer) and `commit=task` (each task produces its
  own). The session is started, and a small write done, beforehand (not timed).

Results go to stdout as JSON (rows/s for each).

    python -m loadtest.sink_bench --records 300000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

PARTITIONS = 3
VALUE = b"v" * 100
CHUNK = 500


async def create(address: str, *topics: str) -> None:
    import headwater

    async with await headwater.connect(address) as client:
        for topic in topics:
            await client.create_topic(topic, partitions=PARTITIONS, dispatch="reliable")


async def produce(address: str, topic: str, records: int) -> float:
    import headwater

    async with await headwater.connect(address) as client:
        started = time.perf_counter()
        producer = client.producer(topic, idempotent=True)
        for first in range(0, records, CHUNK):
            keys = [str(i).encode() for i in range(first, min(first + CHUNK, records))]
            await producer.send_batch([VALUE] * len(keys), keys=keys)
        await producer.flush()
        elapsed = time.perf_counter() - started
        await producer.close()
    return elapsed


def spark_write(spark: Any, address: str, topic: str, records: int, commit: str) -> float:
    frame = spark.range(0, records, numPartitions=2).selectExpr(
        "cast(id as string) as key", f"cast(repeat('v', {len(VALUE)}) as binary) as value"
    )
    started = time.perf_counter()
    frame.write.format("headwater").mode("append").option("server", address).option(
        "topic", topic
    ).option("commit", commit).save()
    return time.perf_counter() - started


async def written(address: str, topic: str) -> int:
    import headwater

    async with await headwater.connect(address) as client:
        return sum((await client.describe_topic(topic)).next_offsets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    args = parser.parse_args()
    records = args.records

    from headwater.spark_compaction.session import spark_session
    from headwater.testing import ServerProcess

    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(Path(tmp) / "data").start()
        try:
            names = ("warm", "producer", "spark-driver", "spark-task")
            asyncio.run(create(server.address, *names))
            spark = spark_session("local[2]", {"spark.sql.shuffle.partitions": "2"})
            spark_write(spark, server.address, "warm", 1000, "driver")
            results = {
                "producer": records / asyncio.run(produce(server.address, "producer", records)),
                "spark-driver": records
                / spark_write(spark, server.address, "spark-driver", records, "driver"),
                "spark-task": records
                / spark_write(spark, server.address, "spark-task", records, "task"),
            }
            spark.stop()
            for name in names[1:]:  # each wrote every row, once
                assert asyncio.run(written(server.address, name)) == records, name
        finally:
            server.stop()
    print(
        json.dumps(
            {
                "records": records,
                "rows_per_s": {k: round(v) for k, v in results.items()},
                "cpus": os.cpu_count(),
                "load_average": os.getloadavg(),
                "python": platform.python_version(),
            }
        )
    )


if __name__ == "__main__":
    main()
