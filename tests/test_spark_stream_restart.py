"""The `headwater` streaming source rides through a server restart (issue 40): a query reading a
live topic while its server stops and starts again on the same port keeps running, without being
restarted by hand, and its sink holds every produced record exactly once; and a server that stays
away fails the query once the bounded retries run out, with the last error."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import headwater
from headwater.spark_compaction import stream
from headwater.spark_compaction.stream import Settings, read_range
from headwater.testing import ServerProcess
from headwater.wire.errors import InvalidRequest
from tests.support.s3 import free_port
from tests.test_spark_stream import (
    PARTITIONS,
    Producing,
    created,
    exactly_once,
    last_offsets,
    query,
    sink_rows,
    until,
)


def test_retry_options_are_checked_and_the_backoff_doubles_to_its_cap() -> None:
    base = {"server": "127.0.0.1:1", "topic": "t"}
    settings = Settings(base)
    assert (settings.max_retries, settings.backoff, settings.max_backoff) == (20, 0.1, 5.0)
    assert [settings.delay(n) for n in (1, 2, 3, 7, 8, 40)] == [0.1, 0.2, 0.4, 5.0, 5.0, 5.0]
    tuned = Settings({**base, "maxRetries": "0", "retryBackoffMs": "50", "retryMaxBackoffMs": "80"})
    assert (tuned.max_retries, tuned.delay(1), tuned.delay(2)) == (0, 0.05, 0.08)
    with pytest.raises(InvalidRequest, match="maxRetries must be at least 0"):
        Settings({**base, "maxRetries": "-1"})
    with pytest.raises(InvalidRequest, match="retryBackoffMs must be an integer"):
        Settings({**base, "retryBackoffMs": "soon"})


def test_a_task_reading_its_range_resumes_after_a_server_restart(
    tmp_path: Path, topic_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task's FETCH loop (what runs on an executor) across a restart: the server stops after
    the first batch was handed over and starts again a second later; the task goes on from the
    offset after its last record, and yields each record of its range once."""
    monkeypatch.setattr(stream, "ROWS_PER_BATCH", 10)
    server = ServerProcess(tmp_path / "data", extra_args=("--port", str(free_port()))).start()
    try:

        async def produce() -> None:
            async with await headwater.connect(server.address) as client:
                await client.create_topic(topic_name, dispatch="reliable")
                async with client.producer(topic_name) as producer:
                    for i in range(100):
                        await (await producer.send(b"v%d" % i))

        asyncio.run(produce())
        settings = Settings({"server": server.address, "topic": topic_name, "fetchMaxBytes": "1"})
        batches = read_range(settings, 0, 0, 100)
        offsets = list(next(batches).column("offset").to_pylist())
        server.stop()
        restart = threading.Timer(1.0, server.start)
        restart.start()
        for batch in batches:
            offsets.extend(batch.column("offset").to_pylist())
        restart.join()
        assert offsets == list(range(100))
    finally:
        if server.alive():
            server.stop()


@pytest.mark.timeout(900)
def test_a_query_rides_through_a_server_restart_exactly_once(
    spark: Any, tmp_path: Path, topic_name: str
) -> None:
    server = ServerProcess(tmp_path / "data", extra_args=("--port", str(free_port()))).start()
    try:
        created(server.address, topic_name)
        before = Producing(server.address, topic_name, 150)
        before.start()
        landed = before.finish()
        sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
        running = query(spark, server.address, topic_name, sink, checkpoint)
        until(lambda: (checkpoint / "commits" / "1").exists(), 300, "two micro-batches")

        address = server.address
        server.stop()
        time.sleep(3)  # the query asks for offsets (or reads) while nothing listens
        assert running.isActive and running.exception() is None
        server.start()
        assert server.address == address

        after = Producing(server.address, topic_name, 100)
        after.start()
        landed.update(after.finish())
        ends = {str(p): 1 + max(o for q, o in landed if q == p) for p in range(PARTITIONS)}

        def caught_up() -> bool:
            assert running.exception() is None, running.exception()
            return (checkpoint / "offsets").exists() and last_offsets(checkpoint) == ends

        until(caught_up, 600, "the query to read everything produced")
        running.processAllAvailable()
        assert running.isActive and running.exception() is None
        running.stop()
        exactly_once(sink_rows(spark, sink), landed)
    finally:
        if server.alive():
            server.stop()


@pytest.mark.timeout(600)
def test_a_server_that_stays_away_fails_the_query_after_the_retries(
    spark: Any, tmp_path: Path, topic_name: str
) -> None:
    server = ServerProcess(tmp_path / "data", extra_args=("--port", str(free_port()))).start()
    created(server.address, topic_name)
    stream = (
        spark.readStream.format("headwater")
        .option("server", server.address)
        .option("topic", topic_name)
        .option("maxRetries", "2")
        .option("retryBackoffMs", "50")
        .load()
    )
    running = (
        stream.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    until(lambda: bool(running.recentProgress), 300, "the query's first trigger")
    server.stop()
    with pytest.raises(Exception, match="CANNOT_CONNECT"):
        running.awaitTermination(300)
    assert not running.isActive
