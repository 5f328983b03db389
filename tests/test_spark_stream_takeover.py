"""The `headwater` streaming source rides through a cluster take-over (issue 40): three brokers
(etcd, moto's S3), a topic of 3 partitions produced at about 2,000 records/s, a query reading it
into a Parquet sink; the owner of a partition is killed with kill -9 while both run. The query goes
on without being restarted by hand (the tasks' FETCHes and the driver's DESCRIBE retry until the
partition's new owner serves it; the killed broker is the first of the source's `server` list, so
connecting passes over it) and the sink holds every acknowledged record exactly once."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import headwater
from tests.support.cluster_support import running_cluster
from tests.support.s3 import MotoS3
from tests.test_spark_stream import PARTITIONS, created, last_offsets, sink_rows, until

LEASE_TTL_MS = 2000
RATE = 2000  # records/s, in rounds of TICK seconds
TICK = 0.05


class Steady(threading.Thread):
    """Produces about RATE records/s over the partitions (each value unique) until stopped,
    remembering where each acknowledged record landed; a send that fails is counted, not
    retried here (the client retries what it can), and never counted as acknowledged."""

    def __init__(self, address: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.address, self.topic = address, topic
        self.stop = threading.Event()
        self.landed: dict[tuple[int, int], bytes] = {}
        self.sent: set[bytes] = set()
        self.failed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:  # reported by finish()
            self.error = exc

    async def _produce(self) -> None:
        per_tick = round(RATE * TICK)
        async with await headwater.connect(self.address) as client:
            producer = client.producer(self.topic)
            tick = 0
            for tick in range(int(600 / TICK)):  # bounded: 10 minutes at most
                if self.stop.is_set():
                    break
                began = time.monotonic()
                values = [b"t%d-%d" % (tick, i) for i in range(per_tick)]
                self.sent.update(values)
                pending = [
                    (await producer.send(v, partition=i % PARTITIONS), v)
                    for i, v in enumerate(values)
                ]
                for future, value in pending:
                    try:
                        meta = await future
                    except headwater.HeadwaterError:
                        self.failed += 1
                        continue
                    self.landed[(meta.partition, meta.offset)] = value
                await asyncio.sleep(max(0.0, TICK - (time.monotonic() - began)))
            await producer.close()

    def finish(self, timeout: float = 300) -> dict[tuple[int, int], bytes]:
        self.stop.set()
        self.join(timeout)
        assert not self.is_alive(), "the producer did not finish"
        if self.error is not None:
            raise self.error
        return self.landed


def _next_offsets(address: str, topic: str) -> dict[str, int]:
    async def describe() -> dict[str, int]:
        async with await headwater.connect(address) as client:
            found = await client.describe_topic(topic)
        return {str(p): o for p, o in enumerate(found.next_offsets)}

    return asyncio.run(describe())


@pytest.mark.timeout(1200)
def test_a_query_rides_through_a_kill9_of_a_partition_owner_exactly_once(
    spark: Any, tmp_path: Path, s3: MotoS3, bucket: str, topic_name: str
) -> None:
    with running_cluster(tmp_path, s3, bucket, LEASE_TTL_MS) as cluster:
        brokers = ("b1", "b2", "b3")
        for broker in brokers:
            cluster.start_broker(broker)
        addresses = {b: asyncio.run(cluster.address(b)) for b in brokers}
        created(addresses["b1"], topic_name)
        owners = asyncio.run(cluster.wait_owned(topic_name, PARTITIONS, set(brokers), 60))
        victim = owners[0]
        survivor = next(b for b in brokers if b != victim)
        producing = Steady(addresses[survivor], topic_name)
        producing.start()

        sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
        servers = ",".join([addresses[victim], *(addresses[b] for b in brokers if b != victim)])
        running = (
            spark.readStream.format("headwater")
            .option("server", servers)
            .option("topic", topic_name)
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="500 milliseconds")
            .start()
        )
        until(lambda: (checkpoint / "commits" / "2").exists(), 300, "three micro-batches")
        before = len(producing.landed)
        cluster.brokers[victim].kill()  # kill -9, its leases left to lapse
        taken = asyncio.run(
            cluster.wait_owned(topic_name, PARTITIONS, set(brokers) - {victim}, 120)
        )
        assert taken[0] != victim
        until(lambda: len(producing.landed) > before + 10 * RATE, 300, "10 s more records")
        assert running.isActive and running.exception() is None
        landed = producing.finish()
        ends = _next_offsets(addresses[survivor], topic_name)

        def caught_up() -> bool:
            assert running.exception() is None, running.exception()
            return (checkpoint / "offsets").exists() and last_offsets(checkpoint) == ends

        until(caught_up, 600, "the query to read everything produced")
        running.processAllAvailable()
        assert running.isActive and running.exception() is None
        running.stop()

    rows = sink_rows(spark, sink)
    positions = [(p, o) for p, o, _ in rows]
    assert len(positions) == len(set(positions)), "a record written twice"
    held = {(p, o): v for p, o, v in rows}
    missing = [position for position in landed if position not in held]
    assert not missing, f"{len(missing)} acknowledged records missing, first {missing[:5]}"
    assert all(held[position] == value for position, value in landed.items())
    # anything else in the sink was sent and not acknowledged (or sent again by the client)
    assert {v for p, v in held.items() if p not in landed} <= producing.sent
    assert len(landed) > 10 * RATE
