"""A streaming query into the `headwater` sink, in a driver process of its own: for tests that kill
the driver with kill -9, or need a master that retries tasks.

    python -m tests.support.sink_query SERVER TARGET CHECKPOINT COMMIT topic SOURCE
    python -m tests.support.sink_query SERVER TARGET CHECKPOINT COMMIT flaky SOURCE
    python -m tests.support.sink_query SERVER TARGET CHECKPOINT COMMIT rate ROWS TOTAL STOPS SEED

Each writes `key` and `value` to TARGET with the sink's `commit` option COMMIT (driver or task):

- `topic`: SOURCE read with the `headwater` source from earliest, 50 records a trigger, until
  everything readable at the start is written (Trigger.AvailableNow), then exit 0. With
  HEADWATER_TEST_SINK_PAUSE set, the sink's first commit waits there to be killed (sink.py).
- `flaky`: SOURCE read whole, each value padded to VALUE_BYTES by a Python UDF that fails the
  first attempt of every task at its FAIL_AT-th row, on `local[2,4]` (a local master retries a
  task only when it names a failure count), so each task is retried once. The values are large
  because Spark hands a UDF's output to the writer in buffers of several MB: by row FAIL_AT the
  failed attempt has handed the sink most of its rows, and with `commit=task` produced them.
- `rate`: the `rate-micro-batch` source, ROWS rows a micro-batch, its values below TOTAL written
  (key `k<value>`, value the value in decimal), a trigger every 100 ms. The query is stopped
  gracefully (`query.stop()`) STOPS times, each after a random 0.5-5 s (seeded by SEED), and
  started again from the checkpoint; each stop appends a line to CHECKPOINT.stops. Then it runs
  until the micro-batch after the last one with rows is committed (exit 0), unless killed first.
"""

from __future__ import annotations

import math
import random
import sys
import time
from pathlib import Path
from typing import Any

from headwater.spark_compaction.session import spark_session

TRIGGER_ROWS = 50
VALUE_BYTES = 10_000
FAIL_AT = 1_000
RUN_LIMIT = 1_200.0  # seconds a `rate` run may take at most (a hang bound)
_seen: dict[int, int] = {}  # rows per task attempt, in this Python worker


def padded_or_failing(value: bytes) -> bytes:
    """The value padded to VALUE_BYTES; raises at the FAIL_AT-th row of a task's first attempt."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None and context.attemptNumber() == 0:
        attempt = context.taskAttemptId()
        _seen[attempt] = _seen.get(attempt, 0) + 1
        if _seen[attempt] == FAIL_AT:
            raise RuntimeError(f"injected failure at row {FAIL_AT} of task attempt {attempt}")
    return value.ljust(VALUE_BYTES, b".")


def main(server: str, target: str, checkpoint: str, commit: str, plan: str, *args: str) -> None:
    if plan == "rate":
        rate(server, target, checkpoint, commit, *(int(a) for a in args))
        return
    (source,) = args
    flaky = plan == "flaky"
    conf = {"spark.sql.shuffle.partitions": "2"}
    if flaky:
        conf |= {
            "spark.sql.execution.arrow.maxRecordsPerBatch": "100",
            "spark.sql.execution.pythonUDF.arrow.enabled": "false",
        }
    spark = spark_session("local[2,4]" if flaky else "local[2]", conf)
    reader = (
        spark.readStream.format("headwater")
        .option("server", server)
        .option("topic", source)
        .option("startingOffsets", "earliest")
    )
    if not flaky:
        reader = reader.option("maxRecordsPerTrigger", str(TRIGGER_ROWS))
    frame = reader.load()
    if flaky:
        from pyspark.sql.functions import col, udf
        from pyspark.sql.types import BinaryType

        padded = udf(padded_or_failing, BinaryType())
        frame = frame.select("key", padded(col("value")).alias("value"))
    query = (
        frame.select("key", "value")
        .writeStream.format("headwater")
        .option("server", server)
        .option("topic", target)
        .option("commit", commit)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    failed = query.exception()
    spark.stop()
    if failed is not None:
        raise SystemExit(f"the query failed: {failed}")


def rate(server: str, target: str, checkpoint: str, commit: str, *numbers: int) -> None:
    rows, total, stops, seed = numbers
    spark = spark_session("local[2]", {"spark.sql.shuffle.partitions": "2"})
    chance = random.Random(seed)
    last = Path(checkpoint) / "commits" / str(math.ceil(total / rows))

    def start() -> Any:
        return (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", str(rows))
            .option("numPartitions", "2")
            .load()
            .where(f"value < {total}")
            .selectExpr("concat('k', value) as key", "cast(value as string) as value")
            .writeStream.format("headwater")
            .option("server", server)
            .option("topic", target)
            .option("commit", commit)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="100 milliseconds")
            .start()
        )

    for stop in range(stops):
        query = start()
        query.awaitTermination(chance.uniform(0.5, 5.0))  # a random moment, or its failure
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
        query.stop()
        with open(f"{checkpoint}.stops", "a") as status:
            status.write(f"stopped {stop + 1}\n")
    query = start()
    deadline = time.monotonic() + RUN_LIMIT
    while not last.exists():  # polls a file Spark writes; bounded
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise SystemExit(f"batch {last.name} was not committed in {RUN_LIMIT:.0f} s")
        time.sleep(0.2)
    query.stop()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
