"""The `headwater` Structured Streaming source on local[2] and on a standalone cluster: a query
over a live 3-partition topic while a producer writes, into a Parquet file sink with a
checkpoint, stopped (or its driver killed with kill -9) and restarted from the checkpoint;
afterwards the sink holds every produced record exactly once, compared by partition and offset
(and value). Plus the driver-side planning: startingOffsets, maxRecordsPerTrigger and partitions
added to the topic."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

import headwater
from headwater.spark_compaction.standalone import StandaloneCluster
from headwater.spark_compaction.stream import TopicStreamReader, capped
from headwater.testing import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
PARTITIONS = 3


class Producing(threading.Thread):
    """Writes `rounds` rounds of one record per partition (value `r<round>-p<partition>`), `pause`
    s apart, remembering where each landed; `stop` ends it sooner."""

    def __init__(self, address: str, topic: str, rounds: int, pause: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.address, self.topic, self.rounds, self.pause = address, topic, rounds, pause
        self.stop = threading.Event()
        self.landed: dict[tuple[int, int], bytes] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:  # reported by finish()
            self.error = exc

    async def _produce(self) -> None:
        async with await headwater.connect(self.address) as client:
            producer = client.producer(self.topic)
            for round_ in range(self.rounds):
                if self.stop.is_set():
                    break
                futures = [
                    (await producer.send(f"r{round_}-p{p}".encode(), partition=p), p)
                    for p in range(PARTITIONS)
                ]
                for future, p in futures:
                    meta = await future
                    assert meta.partition == p
                    self.landed[(p, meta.offset)] = f"r{round_}-p{p}".encode()
                await asyncio.sleep(self.pause)
            await producer.close()

    def finish(self, timeout: float = 120) -> dict[tuple[int, int], bytes]:
        self.join(timeout)
        assert not self.is_alive(), "the producer did not finish"
        if self.error is not None:
            raise self.error
        return self.landed


def created(address: str, topic: str) -> None:
    async def create() -> None:
        async with await headwater.connect(address) as client:
            await client.create_topic(topic, partitions=PARTITIONS, dispatch="reliable")

    asyncio.run(create())


def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll a condition another process brings about (a checkpoint file), bounded."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def commits(checkpoint: Path) -> int:
    folder = checkpoint / "commits"
    return len([f for f in folder.iterdir() if f.name.isdigit()]) if folder.exists() else 0


def last_offsets(checkpoint: Path) -> dict[str, int]:
    newest = max(
        (f for f in (checkpoint / "offsets").iterdir() if f.name.isdigit()),
        key=lambda f: int(f.name),
    )
    offsets: dict[str, int] = json.loads(newest.read_text().splitlines()[-1])
    return offsets


def sink_rows(spark: Any, sink: Path) -> list[tuple[int, int, bytes]]:
    """What the sink holds, read by Spark: through the file sink's metadata log, so files of a
    batch that never committed (a killed driver's) are not counted."""
    frame = spark.read.parquet(str(sink))
    return [(r.partition, r.offset, bytes(r.value)) for r in frame.collect()]


def exactly_once(rows: list[tuple[int, int, bytes]], landed: dict[tuple[int, int], bytes]) -> None:
    positions = [(p, o) for p, o, _ in rows]
    duplicates = len(positions) - len(set(positions))
    assert duplicates == 0, f"{duplicates} records written twice"
    missing = sorted(set(landed) - set(positions))
    assert not missing, f"{len(missing)} records missing, first {missing[:5]}"
    assert {(p, o): v for p, o, v in rows} == landed


def query(spark: Any, server: str, topic: str, sink: Path, checkpoint: Path) -> Any:
    stream = (
        spark.readStream.format("headwater")
        .option("server", server)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "40")
        .load()
    )
    return (
        stream.writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def test_a_stopped_query_restarts_from_its_checkpoint_exactly_once(
    spark: Any, server: ServerProcess, topic_name: str, tmp_path: Path
) -> None:
    created(server.address, topic_name)
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    producing = Producing(server.address, topic_name, rounds=200)
    producing.start()
    first = query(spark, server.address, topic_name, sink, checkpoint)
    until(lambda: commits(checkpoint) >= 2, 180, "two committed micro-batches")
    first.stop()
    stopped_at = sum(last_offsets(checkpoint).values())
    assert stopped_at < 3 * 200, "the first run read everything: the restart proves nothing"

    second = query(spark, server.address, topic_name, sink, checkpoint)
    landed = producing.finish()
    second.processAllAvailable()  # every record readable now is in a committed batch
    second.stop()
    assert len(landed) == 3 * 200
    exactly_once(sink_rows(spark, sink), landed)


def _driver(
    server: str, topic: str, sink: Path, checkpoint: Path, mode: str, master: str = "local[2]"
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.stream_query",
            server,
            topic,
            str(sink),
            str(checkpoint),
            mode,
            master,
        ],
        cwd=ROOT,
        env=env,
        start_new_session=True,  # its own process group: the driver's JVM goes with it
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _kill(driver: subprocess.Popen[bytes]) -> None:
    """kill -9 the driver by its PID, then whatever it started (its JVM) by its process group."""
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(30)
    with contextlib.suppress(ProcessLookupError):  # the JVM ended with the driver's pipe
        os.killpg(driver.pid, signal.SIGKILL)


@pytest.mark.timeout(1200)  # three driver JVMs, one after the other, on a loaded 2-core machine
def test_a_driver_killed_twice_restarts_from_its_checkpoint_exactly_once(
    spark: Any, server: ServerProcess, topic_name: str, tmp_path: Path
) -> None:
    _killed_twice_then_drained(spark, server, topic_name, tmp_path, "local[2]")


@pytest.mark.timeout(1500)  # the cluster's JVMs beside three drivers' on a loaded 2-core machine
def test_on_a_standalone_cluster_a_driver_killed_twice_restarts_exactly_once(
    spark: Any, server: ServerProcess, topic_name: str, tmp_path: Path
) -> None:
    """The same on a standalone master and worker on 127.0.0.1: the tasks run in the worker's
    executors, and each killed driver's application is ended by the master."""
    directory = tmp_path / "cluster"
    directory.mkdir()
    with StandaloneCluster(directory, workers=1, cores=2) as cluster:
        cluster.wait_for_workers()
        _killed_twice_then_drained(spark, server, topic_name, tmp_path, cluster.master_url)
        state = cluster.state()
        assert state is not None
        # the two killed drivers' applications and the drain's ran on the cluster
        ran = state["completedapps"] + state["activeapps"]
        assert len(ran) == 3, [app["name"] for app in ran]


def _killed_twice_then_drained(
    spark: Any, server: ServerProcess, topic_name: str, tmp_path: Path, master: str
) -> None:
    created(server.address, topic_name)
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    # about 15 records a second for as long as the two drivers run (a driver's JVM takes a minute
    # to start on a loaded machine), so each is killed while the producer writes
    producing = Producing(server.address, topic_name, rounds=3000, pause=0.2)
    producing.start()
    killed_at = []
    for _ in range(2):
        done = commits(checkpoint)
        driver = _driver(server.address, topic_name, sink, checkpoint, "run", master)
        try:
            until(lambda done=done: commits(checkpoint) > done, 240, "a micro-batch committed")
        finally:
            _kill(driver)
        killed_at.append(sum(last_offsets(checkpoint).values()))
    producing.stop.set()
    landed = producing.finish()
    assert killed_at[-1] < len(landed), "the killed drivers read everything"
    drain = _driver(server.address, topic_name, sink, checkpoint, "drain", master)
    try:
        assert drain.wait(300) == 0
    finally:
        if drain.poll() is None:
            _kill(drain)
    exactly_once(sink_rows(spark, sink), landed)


# Driver-side planning, against the real server, without running a query


def test_starting_offsets_the_cap_and_added_partitions(
    server: ServerProcess, topic_name: str
) -> None:
    created(server.address, topic_name)
    Producing(server.address, topic_name, rounds=10).run()  # 10 records per partition
    options = {"server": server.address, "topic": topic_name}
    earliest = TopicStreamReader({**options, "startingOffsets": "earliest"}).initialOffset()
    assert earliest == {"0": 0, "1": 0, "2": 0}
    latest = TopicStreamReader({**options, "startingoffsets": "latest"}).initialOffset()
    assert latest == {"0": 10, "1": 10, "2": 10}
    chosen = TopicStreamReader({**options, "startingOffsets": '{"1": 4, "2": -1}'})
    assert chosen.initialOffset() == {"0": 0, "1": 4, "2": 10}

    reader = TopicStreamReader({**options, "maxRecordsPerTrigger": "12"})
    assert reader.getDefaultReadLimit() == ReadMaxRows(12)
    start = {"0": 0, "1": 4, "2": 10}
    assert reader.latestOffset(start, ReadMaxRows(12)) == {"0": 8, "1": 8, "2": 10}  # 8 + 4
    assert reader.latestOffset(start, ReadAllAvailable()) == {"0": 10, "1": 10, "2": 10}

    async def grow() -> None:
        async with await headwater.connect(server.address) as client:
            await client.create_partitions(topic_name, 4)
            await (await client.producer(topic_name).send(b"new", partition=3))

    asyncio.run(grow())
    end = reader.latestOffset({"0": 10, "1": 10, "2": 10}, ReadAllAvailable())
    assert end == {"0": 10, "1": 10, "2": 10, "3": 1}
    (added,) = reader.partitions({"0": 10, "1": 10, "2": 10}, end)
    assert (added.partition, added.start, added.end) == (3, 0, 1)
    rows = [r for batch in reader.read(added) for r in batch.to_pylist()]
    assert [(r["partition"], r["offset"], r["value"]) for r in rows] == [(3, 0, b"new")]


def test_the_cap_is_shared_in_proportion_and_always_moves() -> None:
    assert capped({0: 0, 1: 0}, {0: 100, 1: 100}, 10) == {0: 5, 1: 5}
    assert capped({0: 0, 1: 0}, {0: 90, 1: 10}, 10) == {0: 9, 1: 1}
    assert capped({0: 0, 1: 0, 2: 0}, {0: 1, 1: 1, 2: 1}, 2) == {0: 1, 1: 1, 2: 0}
    assert capped({0: 5}, {0: 6}, 10) == {0: 6}
