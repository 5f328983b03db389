"""The sink writes a micro-batch once per query and batch id (issue 40), with `commit=driver` and
with `commit=task`:

- a query left in the state a graceful stop during the sink's commit leaves (batch N's records in
  the topic, `commits/N` missing from the checkpoint) and restarted runs batch N again, and the
  sink skips it;
- a driver killed (kill -9) in its commit, its rows sent and not committed (with `commit=task`,
  one task's transaction committed and the other's open), and the query restarted: no reader of
  committed records saw the driver's batch (with `commit=task`, only the committed task's part),
  and afterwards every row is there once;
- a task whose first attempt fails after it produced most of its rows (a UDF raising) is retried
  and its rows are there once (`commit=task`: the failed attempt's transaction is aborted);
- a micro-batch aborted by the driver (`commit=task`, one task failed for good) leaves every
  task's transaction aborted, none holding readers, and its replay writes it once;
- on a cluster, whose brokers refuse transactions for now, the commits fall back to the
  records, then the marker, and a replayed batch is still skipped;
- (long) 10 graceful stops at random moments and 5 driver kill -9s during a 200,000-row
  `rate-micro-batch` stream: every row once.

Reads of the topic are FETCHes: committed ones (what a read_committed reader sees) and raw ones
(every record stored, aborted transactions' too)."""

from __future__ import annotations

import asyncio
import math
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import headwater
from headwater.spark_compaction.sink import (
    DEFAULT_COMMIT_TOPIC,
    PAUSE_ENV,
    SinkSettings,
    Staged,
    abort_batch,
    check_topics,
    commit_batch,
    stage_task,
    write_batch_task,
)
from headwater.testing import ServerProcess
from tests.support.cluster_support import running_cluster
from tests.support.s3 import MotoS3
from tests.support.sink_query import FAIL_AT, TRIGGER_ROWS
from tests.test_spark_sink import created, topic_rows
from tests.test_spark_stream import _kill, commits, until

ROOT = Path(__file__).resolve().parent.parent
ROWS = 200


def _query(spark: Any, address: str, source: str, target: str, tmp_path: Path, commit: str) -> Any:
    return (
        spark.readStream.format("headwater")
        .option("server", address)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "50")
        .load()
        .select("key", "value")
        .writeStream.format("headwater")
        .option("server", address)
        .option("topic", target)
        .option("commit", commit)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )


@pytest.mark.timeout(900)
@pytest.mark.parametrize("commit", ["driver", "task"])
def test_a_batch_written_before_its_spark_commit_is_not_written_again(
    spark: Any, server: ServerProcess, topic_name: str, tmp_path: Path, commit: str
) -> None:
    source, target = f"{topic_name}-in", f"{topic_name}-out"
    created(server.address, source, 2)
    created(server.address, target, 2)

    async def produce() -> None:
        async with (
            await headwater.connect(server.address) as client,
            client.producer(source) as producer,
        ):
            for i in range(ROWS):
                await producer.send(f"v{i}".encode(), key=f"k{i}".encode())

    asyncio.run(produce())
    first = _query(spark, server.address, source, target, tmp_path, commit)
    first.awaitTermination(600)
    assert first.exception() is None
    commits = tmp_path / "checkpoint" / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    assert last >= 3  # 200 rows, 50 a batch
    expected = Counter((f"k{i}".encode(), f"v{i}".encode()) for i in range(ROWS))

    def written() -> Counter[tuple[bytes, bytes]]:
        return Counter((r["key"], r["value"]) for r in topic_rows(server.address, target))

    assert written() == expected

    async def marker() -> bytes | None:
        async with await headwater.connect(server.address) as client:
            entry = await client.map(DEFAULT_COMMIT_TOPIC).get(f"{target}/{first.id}")
            return None if entry is None else entry.value

    assert asyncio.run(marker()) == str(last).encode()

    # what a stop between the sink's commit and Spark's commit log leaves: the batch's records
    # in the topic, its commit missing; the restarted query runs batch `last` again
    for name in (str(last), f".{last}.crc"):
        (commits / name).unlink(missing_ok=True)
    second = _query(spark, server.address, source, target, tmp_path, commit)
    assert second.id == first.id  # the same query: its id is in the checkpoint
    second.awaitTermination(600)
    assert second.exception() is None
    assert (commits / str(last)).exists()  # Spark did run the batch again
    assert written() == expected  # and the sink did not write it twice
    assert asyncio.run(marker()) == str(last).encode()


def _driver(
    address: str, target: str, checkpoint: Path, commit: str, *plan: str, **env: str
) -> subprocess.Popen[bytes]:
    """tests/support/sink_query.py in a process group of its own (`_kill` ends its JVM too),
    its output in CHECKPOINT.log."""
    with open(f"{checkpoint}.log", "ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.sink_query",
                address,
                target,
                str(checkpoint),
                commit,
                *plan,
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1", **env},
            start_new_session=True,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _ended(driver: subprocess.Popen[bytes], checkpoint: Path, timeout: float) -> None:
    """Wait for the driver to exit, and fail with the end of its log unless it exited 0."""
    try:
        driver.wait(timeout)
    finally:
        if driver.poll() is None:
            _kill(driver)
    log = Path(f"{checkpoint}.log").read_bytes().decode(errors="replace")
    assert driver.returncode == 0, log[-3000:]


def _read(address: str, topic: str, raw: bool = False) -> Counter[bytes]:
    """The keys of `topic`'s records, counted: committed ones (up to each partition's last
    stable offset), or with `raw` every one stored (aborted transactions' too, not markers)."""

    async def read() -> Counter[bytes]:
        keys: Counter[bytes] = Counter()
        async with await headwater.connect(address) as client:
            partitions = (await client.describe_topic(topic)).topic.partitions
            for partition in range(partitions):
                offset = 0
                for _ in range(10_000):  # each FETCH moves on, or the partition is read
                    fetched = await client.fetch(topic, partition, offset, raw=raw)
                    keys.update(
                        r.key for r in fetched.records() if r.key and r.key.startswith(b"k")
                    )
                    if fetched.next_offset >= fetched.end_offset:
                        break
                    offset = fetched.next_offset
        return keys

    return asyncio.run(read())


def _held(address: str, topic: str) -> bool:
    """Whether an open transaction holds a partition of `topic` back: a committed read's end
    (the last stable offset) below the partition's readable end."""

    async def held() -> bool:
        async with await headwater.connect(address) as client:
            partitions = (await client.describe_topic(topic)).topic.partitions
            for partition in range(partitions):
                stable = await client.fetch(topic, partition, 0)
                readable = await client.fetch(topic, partition, 0, raw=True)
                if stable.end_offset < readable.end_offset:
                    return True
        return False

    return asyncio.run(held())


def _produced(address: str, source: str, rows: int) -> None:
    async def produce() -> None:
        async with (
            await headwater.connect(address) as client,
            client.producer(source) as producer,
        ):
            for i in range(rows):
                await producer.send(f"v{i}".encode(), key=f"k{i}".encode())

    asyncio.run(produce())


@pytest.mark.timeout(900)
@pytest.mark.parametrize("commit", ["driver", "task"])
def test_a_driver_killed_in_its_commit_writes_the_batch_once_after_the_restart(
    spark: Any, server: ServerProcess, topic_name: str, tmp_path: Path, commit: str
) -> None:
    source, target = f"{topic_name}-in", f"{topic_name}-out"
    created(server.address, source, 2)
    created(server.address, target, 2)
    _produced(server.address, source, ROWS)
    pause, checkpoint = tmp_path / "paused", tmp_path / "checkpoint"
    driver = _driver(
        server.address, target, checkpoint, commit, "topic", source, **{PAUSE_ENV: str(pause)}
    )
    try:
        until(lambda: pause.exists() or driver.poll() is not None, 600, "the commit's pause")
        assert pause.exists(), Path(f"{checkpoint}.log").read_text()[-3000:]
        assert pause.read_text() == "0"  # the first micro-batch's commit
        stored, seen = _read(server.address, target, raw=True), _read(server.address, target)
    finally:
        _kill(driver)
    assert sum(stored.values()) == TRIGGER_ROWS  # every row of the batch sent
    if commit == "driver":
        assert not seen  # in one open transaction with its marker: none of them visible
    else:  # one task's transaction committed, the other's open: the window the docs name
        assert 0 < sum(seen.values()) < TRIGGER_ROWS

    restarted = _query(spark, server.address, source, target, tmp_path, commit)
    restarted.awaitTermination(600)
    assert restarted.exception() is None
    expected = Counter(f"k{i}".encode() for i in range(ROWS))
    assert _read(server.address, target) == expected
    # the killed driver's open transaction was aborted and the batch written again
    aborted = TRIGGER_ROWS - sum(seen.values())
    assert sum(_read(server.address, target, raw=True).values()) == ROWS + aborted


@pytest.mark.timeout(900)
def test_a_task_retried_after_a_failing_udf_writes_its_rows_once_with_commit_task(
    server: ServerProcess, topic_name: str, tmp_path: Path
) -> None:
    source, target, rows = f"{topic_name}-in", f"{topic_name}-out", 3000
    created(server.address, source, 2)
    created(server.address, target, 2)
    _produced(server.address, source, rows)
    checkpoint = tmp_path / "checkpoint"
    _ended(_driver(server.address, target, checkpoint, "task", "flaky", source), checkpoint, 840)

    assert _read(server.address, target) == Counter(f"k{i}".encode() for i in range(rows))
    # the tasks' first attempts had produced rows (up to FAIL_AT each), in transactions their
    # retries' starts aborted
    failed = sum(_read(server.address, target, raw=True).values()) - rows
    assert 0 < failed < 2 * FAIL_AT, "the failures came before any row reached the sink"


def test_an_aborted_micro_batch_leaves_nothing_and_its_replay_writes_once(
    server: ServerProcess, topic_name: str
) -> None:
    """`commit=task`, the sink's functions as Spark's workers call them: the driver's abort of a
    micro-batch (one task failed for good: its message None) aborts every task's open
    transaction, the failed task's too, so nothing of it is ever read; the replay writes it
    once."""
    created(server.address, topic_name, 2)
    settings = SinkSettings({"server": server.address, "topic": topic_name, "commit": "task"})
    check_topics(settings, streaming=True)
    query = f"{topic_name}-query"
    parts = [
        pa.record_batch(
            {"key": [f"k{i}".encode() for i in range(p * 3, p * 3 + 3)], "value": [b"v"] * 3}
        )
        for p in range(2)
    ]
    done = write_batch_task(settings, iter([parts[0]]), query, 0, 0)
    write_batch_task(settings, iter([parts[1]]), query, 0, 1)  # then its task fails
    assert sum(_read(server.address, topic_name, raw=True).values()) == 6
    assert _held(server.address, topic_name)  # two open transactions
    abort_batch(settings, [done, None])
    assert not _held(server.address, topic_name)  # both ended: aborted, as nothing is read
    assert not _read(server.address, topic_name)
    replay = [write_batch_task(settings, iter([part]), query, 0, p) for p, part in enumerate(parts)]
    assert commit_batch(settings, replay, 0) == 6
    assert _read(server.address, topic_name) == Counter(f"k{i}".encode() for i in range(6))


def test_on_a_cluster_the_sink_commits_each_batch_once_in_transactions(
    tmp_path: Path, s3: MotoS3, bucket: str
) -> None:
    """A cluster serves transactions as one broker does: the sink's commits go in them (a task's
    transaction handed to the driver), and a replayed batch is skipped. The sink's own
    functions, as Spark's workers call them (one broker, etcd, S3)."""
    with running_cluster(tmp_path, s3, bucket, 2000) as cluster:
        cluster.start_broker("b1")
        address = asyncio.run(cluster.address("b1"))

        async def create() -> None:  # and owned: a new topic's first requests may be NOT_OWNER
            async with await headwater.connect(address) as client:
                await client.create_topic("out", partitions=2)
                await client.create_topic(DEFAULT_COMMIT_TOPIC, configs={"last.value": "true"})
            await cluster.wait_owned("out", 2, {"b1"})
            await cluster.wait_owned(DEFAULT_COMMIT_TOPIC, 1, {"b1"})

        asyncio.run(create())
        rows = pa.record_batch({"key": [f"k{i}".encode() for i in range(4)], "value": [b"v"] * 4})
        for commit in ("driver", "task"):
            settings = SinkSettings({"server": address, "topic": "out", "commit": commit})
            assert check_topics(settings, streaming=True)  # a reliable topic
            query = f"{commit}-query"
            if commit == "driver":
                staged = stage_task(str(tmp_path / "staging"), iter([rows]))
                messages: list[Any] = [Staged(staged.path, staged.rows, query)]
            else:
                messages = [write_batch_task(settings, iter([rows]), query, 0, 0)]
                assert messages[0].transaction is not None  # the task's, for the driver
            assert commit_batch(settings, messages, 0) == 4
            assert commit_batch(settings, messages, 0) is None  # a replay: skipped
        assert _read(address, "out") == Counter({f"k{i}".encode(): 2 for i in range(4)})


# 100 micro-batches of 2,000 rows: the five killed drivers must leave stream to the sixth (with
# 50 of 4,000 they ran it all once the Python workers stopped compiling PySpark: "no stream left")
RATE_BATCH_ROWS, RATE_ROWS, KILLS, STOPS_PER_DRIVER = 2000, 200_000, 5, 2


@pytest.mark.timeout(3600)  # six driver JVMs, one after the other, on a loaded 2-core machine
@pytest.mark.parametrize("commit", ["driver", "task"])
def test_ten_graceful_stops_and_five_driver_kills_leave_every_row_of_a_rate_stream_once(
    server: ServerProcess, topic_name: str, tmp_path: Path, commit: str
) -> None:
    """Five drivers, one after the other, each stopping its query twice at random moments and
    starting it again, then killed with kill -9 at a random moment after its query committed
    another micro-batch; a sixth runs the stream to its end (100 micro-batches of 2,000 rows)."""
    created(server.address, topic_name, 2)
    checkpoint = tmp_path / "checkpoint"
    stops = Path(f"{checkpoint}.stops")
    chance = random.Random(commit)  # the kill moments, seeded: a failure can be run again

    def stopped() -> int:
        return len(stops.read_text().splitlines()) if stops.exists() else 0

    plan = ("rate", str(RATE_BATCH_ROWS), str(RATE_ROWS), str(STOPS_PER_DRIVER))
    for kill in range(KILLS):
        driver = _driver(server.address, topic_name, checkpoint, commit, *plan, str(kill))
        try:
            wanted = STOPS_PER_DRIVER * (kill + 1)
            until(
                lambda w=wanted, d=driver: stopped() >= w or d.poll() is not None, 900, "the stops"
            )
            done = commits(checkpoint)
            until(
                lambda n=done, d=driver: commits(checkpoint) > n or d.poll() is not None,
                600,
                "a batch",
            )
            assert driver.poll() is None, Path(f"{checkpoint}.log").read_text()[-3000:]
            time.sleep(chance.uniform(0.0, 2.0))  # not a wait for anything: a random moment
        finally:
            _kill(driver)
    assert commits(checkpoint) < math.ceil(RATE_ROWS / RATE_BATCH_ROWS), "no stream left"
    final = _driver(server.address, topic_name, checkpoint, commit, "rate", *plan[1:3], "0", "5")
    _ended(final, checkpoint, 1500)
    assert stopped() == KILLS * STOPS_PER_DRIVER
    assert _read(server.address, topic_name) == Counter(f"k{i}".encode() for i in range(RATE_ROWS))
