"""The sink writes a micro-batch once per query and batch id (issue 40): a query left in the state
a graceful stop during the sink's commit leaves (batch N's records in the topic, `commits/N`
missing from the checkpoint) and restarted runs batch N again, and the sink skips it, so the topic
holds every row once; with `commit=driver` and with `commit=task`."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import headwater
from headwater.spark_compaction.sink import DEFAULT_COMMIT_TOPIC
from headwater.testing import ServerProcess
from tests.test_spark_sink import created, topic_rows

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
