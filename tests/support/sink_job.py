"""A batch write through the `headwater` sink whose tasks fail once each, in a driver of its own.

    python -m tests.support.sink_job SERVER MARKS ROWS TOPIC=COMMIT ...

For each TOPIC=COMMIT in turn, writes ROWS rows (`key` `k<i>`, `value` `v<i>` padded to
`VALUE_BYTES`) in 4 Spark partitions to TOPIC with the sink's `commit` option COMMIT (driver or
task). A Python UDF computing the value raises once per partition and write, 50 rows before the
partition's end (row 1,450 of 1,500 for ROWS 6,000): MARKS/TOPIC, a directory, remembers which
partitions failed already, so the retried attempt goes through. The values are large because
Spark hands a UDF's output to the writer through buffers of several MB (with small rows the UDF
is done with its whole partition before the writer sees a row): by row 1,450 (14 MB) the first
attempt has handed the sink most of its rows, and with `commit=task` it has produced them
(Spark ends the writer's input normally when the UDF fails: docs/COMPACTION.md, "Sink").

Its own process because retries need `local[2,4]` (local masters retry a task only when the master
names a failure count; `spark.task.maxFailures` does not apply to them), and one process holds one
Spark session: the test suite's is `local[2]`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from headwater.spark_compaction.session import spark_session

PARTITIONS = 4
VALUE_BYTES = 10_000


def main(server: str, marks: str, rows: str, *writes: str) -> None:
    spark = spark_session(
        "local[2,4]",
        {
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.execution.arrow.maxRecordsPerBatch": "100",
            "spark.sql.execution.pythonUDF.arrow.enabled": "false",
        },
    )
    count = int(rows)
    for write in writes:
        topic, commit = write.split("=")
        folder = Path(marks) / topic
        folder.mkdir(parents=True)
        frame(spark, count, folder).write.format("headwater").mode("append").option(
            "server", server
        ).option("topic", topic).option("commit", commit).save()
    spark.stop()


def value(i: int) -> bytes:
    return f"v{i}".encode().ljust(VALUE_BYTES, b".")


def frame(spark: Any, count: int, folder: Path) -> Any:
    from pyspark.sql.functions import col, concat, lit, udf
    from pyspark.sql.types import BinaryType

    per_partition = count // PARTITIONS

    @udf(BinaryType())
    def flaky(i: int) -> bytes:
        if i % per_partition == per_partition - 50:
            mark = folder / str(i // per_partition)
            if not mark.exists():
                mark.touch()
                raise RuntimeError(f"injected failure at row {i}")
        return value(i)

    return spark.range(0, count, numPartitions=PARTITIONS).select(
        flaky(col("id")).alias("value"), concat(lit("k"), col("id").cast("string")).alias("key")
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
