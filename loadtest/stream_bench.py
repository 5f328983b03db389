"""The Spark streaming source's read rate next to the native consumer's, in the same run.

A server of its own (a temporary data directory, the default reliable settings: fsync `always`),
one reliable topic of 3 partitions holding N records of 100-byte values (produced first, not
timed). Then, each reading all N records from the start:

- `consumer`: the native client, an Exclusive subscription from earliest, `next_batch()` and one
  cumulative ack per batch (at-least-once delivery, the server tracking the cursor);
- `fetch`: `Client.fetch` in a loop per partition, one partition after another, records decoded
  (what one Spark task does, without Spark);
- `spark`: `spark.readStream.format("headwater")` with `Trigger.AvailableNow`, uncapped, into
  the `noop` sink on local[2]; the session is started, and a small query run, beforehand (not
  timed): the figure is from the query's start to its end, planning included.

Results go to stdout as JSON (records/s for each).

    python -m loadtest.stream_bench --records 300000
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


async def produce(address: str, topic: str, records: int) -> None:
    import headwater

    async with await headwater.connect(address) as client:
        await client.create_topic(topic, partitions=PARTITIONS, dispatch="reliable")
        producer = client.producer(topic)
        per_partition, chunk = records // PARTITIONS, 500
        for partition in range(PARTITIONS):
            for _ in range(per_partition // chunk):
                await producer.send_batch([VALUE] * chunk, partition=partition)
        await producer.close()


async def consume(address: str, topic: str, records: int) -> float:
    import headwater

    async with await headwater.connect(address) as client:
        started = time.perf_counter()
        consumer = await client.subscribe(topic, "bench", start="earliest")
        seen = 0
        while seen < records:
            batch = await consumer.next_batch(timeout=60)
            seen += len(batch.values())
            await batch.ack_cumulative()
        elapsed = time.perf_counter() - started
        await consumer.close()
    return elapsed


async def fetch(address: str, topic: str, records: int) -> float:
    import headwater
    from headwater.spark_compaction.wal_segments import row

    async with await headwater.connect(address) as client:
        started = time.perf_counter()
        seen = 0
        for partition in range(PARTITIONS):
            offset = 0
            end = (await client.describe_topic(topic)).next_offsets[partition]
            while offset < end:
                fetched = await client.fetch(topic, partition, offset)
                seen += len(fetched.records(row))
                offset = fetched.next_offset
        elapsed = time.perf_counter() - started
    assert seen == records, (seen, records)
    return elapsed


def spark_read(spark: Any, address: str, topic: str, checkpoint: Path) -> float:
    started = time.perf_counter()
    query = (
        spark.readStream.format("headwater")
        .option("server", address)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    args = parser.parse_args()
    records = args.records // (PARTITIONS * 500) * PARTITIONS * 500

    from headwater.spark_compaction.session import spark_session
    from headwater.testing import ServerProcess

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = ServerProcess(root / "data").start()
        try:
            asyncio.run(produce(server.address, "warm", PARTITIONS * 500))
            asyncio.run(produce(server.address, "bench", records))
            spark = spark_session("local[2]", {"spark.sql.shuffle.partitions": "2"})
            spark_read(spark, server.address, "warm", root / "warm-checkpoint")
            results = {
                "consumer": records / asyncio.run(consume(server.address, "bench", records)),
                "fetch": records / asyncio.run(fetch(server.address, "bench", records)),
                "spark": records / spark_read(spark, server.address, "bench", root / "ckpt"),
            }
            spark.stop()
        finally:
            server.stop()
    print(
        json.dumps(
            {
                "records": records,
                "records_per_s": {k: round(v) for k, v in results.items()},
                "cpus": os.cpu_count(),
                "load_average": os.getloadavg(),
                "python": platform.python_version(),
            }
        )
    )


if __name__ == "__main__":
    main()
