"""The fold, in Spark: per (topic, partition, key) the record with the highest offset wins.

(A partition whose new segments fit one reading task skips it: `fold_in_one_task` runs
one_task.py's task per partition, which folds and writes in Arrow; what follows is the path of
larger partitions and of full merges with earlier layers.)

Input is the new WAL records (the `headwater_wal` reader, above the previous horizon). A full
snapshot then folds the winners again with the previous snapshot's layers (the `headwater_snapshot`
reader), whose rows are records too, with their original offsets (a delta's deletions as
tombstones), so merging is the same fold; a delta layer is the first fold's winners, deletions
included. The job runs those readers, and the snapshot writer, by `mapInArrow` over a range of
task numbers rather than as Python data sources: every Python step of the job then runs in one
pool of reused Python workers, where the data sources would start a Python process pair for each
of their roles (`_tasks`; docs/COMPACTION.md, "What a run costs").

The WAL is read with `fold=true`: each reading task already keeps only the newest record per key of
its segments (wal.Folder, in the Python worker, where the records are decoded anyway), with a count
of the records each row stands for; Spark's sort-based aggregation (`max_by` over a struct holding
binary values cannot use its hash aggregation) then sorts one row per key and task instead of one
per record. One aggregation groups by (topic, partition, key, corrupt) and keeps, per group, the
winner (`max_by` offset), the highest offset, and how many WAL records it stands for (snapshot rows
count zero). Keyless records all land in the key-null group of their partition and corrupt
stretches each in a group of their own, so the same pass counts them; so does each reading task's
row about itself (key null, no record: wal_segments.info_batch), whose offset (its last batch,
a marker or an aborted one included), `aborted` and `undecided` (where a transaction left open
begins) the pass keeps as the highest, the sum and the lowest. Markers and aborted records never
reach Spark as rows: the reading tasks decide transactions (wal_segments.DecidedBatches).

The grouped result is persisted and used twice: first a small per-partition summary comes back to
the driver (records in, keyless, tombstones, highest offset, corrupt stretches) from which the job
sets each partition's new horizon and chooses between a delta and a full snapshot (job.py); then
the rows to write (`winners`, of the first fold or of the second) are hash-partitioned by (topic,
partition), sorted by key within each task, and written by `SnapshotWriter` (writer.py) in an
Arrow map over each task's rows; the driver knows the files from the counts.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from headwater.spark_compaction.manifest import SnapshotFile
from headwater.spark_compaction.one_task import OneTask, PartitionStats, Written, fold_partition
from headwater.spark_compaction.schema import FOLDED_DDL
from headwater.spark_compaction.source import (
    SNAPSHOT_READ_DDL,
    SnapshotReader,
    SnapshotWriterTask,
    WalReader,
    files_option,
    segments_option,
)
from headwater.spark_compaction.store import BlockingStore, StoreSpec
from headwater.spark_compaction.wal_segments import SegmentObject


def read_wal(
    spark: SparkSession,
    spec: StoreSpec,
    segments: Sequence[SegmentObject],
    from_offsets: dict[str, int],
    group_bytes: int,
    until_offsets: dict[str, int] | None = None,
) -> DataFrame:
    """The new segments' records, already folded within each reading task (below
    `until_offsets` where given): the `headwater_wal` reader's groups and reading, run by
    `mapInArrow` (`_tasks`)."""
    reader = WalReader(
        {
            "store": spec.to_json(),
            "segments": segments_option(segments),
            "from_offsets": _json(from_offsets),
            "until_offsets": _json(until_offsets or {}),
            "group_bytes": str(group_bytes),
            "fold": "true",
        }
    )
    return _tasks(spark, reader, reader.partitions(), FOLDED_DDL)


def fold_in_one_task(
    spark: SparkSession, spec: StoreSpec, tasks: Sequence[OneTask], rows_per_file: int
) -> list[Written]:
    """Each of `tasks` folded, decided and written by one Spark task (one_task.py), all in one
    Spark job without a shuffle; what each did, in the order of `tasks`."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with BlockingStore(spec) as store:
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    done = fold_partition(store, tasks[index], rows_per_file)
                    yield pa.RecordBatch.from_pydict(
                        {"task": [index], "written": [done.encode()]}, WRITTEN_SCHEMA
                    )

    frame = spark.range(0, len(tasks), 1, len(tasks))
    rows = map_in_arrow(frame, run, "task bigint, written string").collect()
    found = {row["task"]: Written.decode(row["written"]) for row in rows}
    return [found[index] for index in range(len(tasks))]


WRITTEN_SCHEMA = pa.schema([("task", pa.int64()), ("written", pa.string())])


def read_layers(spark: SparkSession, spec: StoreSpec, files: Sequence[SnapshotFile]) -> DataFrame:
    """Earlier snapshot layers' rows as records (deletions of a delta as null values) that count
    for no WAL record, to fold with the new ones (one task per file)."""
    reader = SnapshotReader({"store": spec.to_json(), "files": files_option(files)})
    return as_records(_tasks(spark, reader, reader.partitions(), SNAPSHOT_READ_DDL))


def _tasks(spark: SparkSession, reader: Any, parts: Sequence[Any], ddl: str) -> DataFrame:
    """`reader.read(part)` for each of `parts`, one Spark task each. `mapInArrow` over a range
    runs them in the Python workers every other step of the job uses (one daemon, reused),
    where the same reader as a Python data source would start a Python process (a daemon and a
    forked worker, each importing pyspark) for each of its roles: lookup, creation, planning,
    reading (docs/COMPACTION.md, "What a run costs")."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from reader.read(parts[index])

    return map_in_arrow(spark.range(0, len(parts), 1, len(parts)), run, ddl)


def map_in_arrow(frame: DataFrame, func: Any, ddl: str) -> DataFrame:
    """`frame.mapInArrow(func, ddl)` without its check that pandas is installed (pyspark 4.3's
    `mapInArrow` goes through `pandas_udf`, which requires pandas on the driver, though neither
    the driver nor the workers use it for an Arrow map): the same UDF and the same plan."""
    from pyspark.sql.pandas.functions import vectorized_udf  # type: ignore[attr-defined]
    from pyspark.util import PythonEvalType

    udf = vectorized_udf(func, ddl, PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
    column = udf(*[frame[name] for name in frame.columns])
    return DataFrame(frame._jdf.mapInArrow(column._jc, False, None), frame.sparkSession)


def fold(records: DataFrame) -> DataFrame:
    return records.groupBy("topic", "partition", "key", "corrupt").agg(
        F.max_by(F.struct("offset", "timestamp", "value", "headers"), "offset").alias("winner"),
        F.max("offset").alias("max_offset"),
        F.sum("records").alias("records"),
        F.sum("aborted").alias("aborted"),
        F.min("undecided").alias("undecided"),
    )


def winners(groups: DataFrame, partitions: Collection[str], deletions: bool) -> DataFrame:
    """The newest row of each key of `partitions` ("<topic>/<partition>"), as snapshot rows: live
    keys, and with `deletions` the keys whose newest record is a tombstone (null value) too."""
    name = F.concat_ws("/", F.col("topic"), F.col("partition").cast("string"))
    keep = F.col("key").isNotNull() & F.col("corrupt").isNull() & name.isin(sorted(partitions))
    if not deletions:
        keep = keep & F.col("winner.value").isNotNull()
    return groups.where(keep).select(
        "topic",
        "partition",
        "key",
        F.col("winner.value").alias("value"),
        F.col("winner.offset").alias("offset"),
        F.col("winner.timestamp").alias("timestamp"),
        F.col("winner.headers").alias("headers"),
    )


def replaced(groups: DataFrame, again: DataFrame, partitions: Collection[str]) -> DataFrame:
    """`groups` with the groups of `partitions` ("<topic>/<partition>") taken from `again`."""
    name = F.concat_ws("/", F.col("topic"), F.col("partition").cast("string"))
    return groups.where(~name.isin(sorted(partitions))).unionByName(again)


def as_records(rows: DataFrame) -> DataFrame:
    """Snapshot rows (`winners`, a layer's) in the shape `fold` takes, counting for no WAL
    record."""
    return rows.withColumns(
        {
            "corrupt": F.lit(None).cast("string"),
            "records": F.lit(0).cast("bigint"),
            "aborted": F.lit(None).cast("bigint"),
            "undecided": F.lit(None).cast("bigint"),
        }
    )


def partition_stats(groups: DataFrame) -> list[PartitionStats]:
    keyed = F.col("key").isNotNull()
    tombstone = F.col("winner.value").isNull()
    rows = (
        groups.groupBy("topic", "partition")
        .agg(
            F.sum(F.when(F.col("corrupt").isNull(), F.col("records")).otherwise(0)).alias(
                "records_in"
            ),
            F.sum("aborted").alias("aborted"),
            F.min("undecided").alias("undecided"),
            F.sum(F.when(~keyed & F.col("corrupt").isNull(), F.col("records")).otherwise(0)).alias(
                "keyless"
            ),
            F.sum(F.when(keyed & ~tombstone, 1).otherwise(0)).alias("live"),
            F.sum(F.when(keyed & tombstone, 1).otherwise(0)).alias("tombstones"),
            F.max("max_offset").alias("max_offset"),
            F.sort_array(F.collect_list("corrupt")).alias("corrupt"),
        )
        .collect()
    )
    return sorted(
        (
            PartitionStats(
                r["topic"],
                r["partition"],
                int(r["records_in"] or 0) + int(r["aborted"] or 0),
                int(r["keyless"] or 0),
                int(r["live"] or 0),
                int(r["tombstones"] or 0),
                r["max_offset"],
                tuple(r["corrupt"]),
                int(r["aborted"] or 0),
                r["undecided"],
            )
            for r in rows
        ),
        key=lambda s: (s.topic, s.partition),
    )


def write(
    rows: DataFrame,
    spec: StoreSpec,
    horizons: dict[tuple[str, int], int],
    deltas: Collection[tuple[str, int]],
    rows_per_file: int,
    tasks: int,
) -> None:
    """Write snapshot rows (`winners`) of the partitions in `horizons` as snapshot files, a delta
    layer for those in `deltas` (no manifest)."""
    if not horizons:
        return
    spread = rows.repartition(max(1, min(len(horizons), tasks)), "topic", "partition")
    ordered = spread.sortWithinPartitions("topic", "partition", "key")
    writer = SnapshotWriterTask(
        {
            "store": spec.to_json(),
            "horizons": _json({f"{t}/{p}": h for (t, p), h in horizons.items()}),
            "deltas": _json(sorted(f"{t}/{p}" for t, p in deltas)),
            "rows_per_file": str(rows_per_file),
        }
    )

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        files = writer.write_files(batches)
        yield pa.RecordBatch.from_pydict({"files": [files]}, pa.schema([("files", pa.int64())]))

    # the data source's Arrow writer, run by `mapInArrow` for the reason `_tasks` gives
    map_in_arrow(ordered, run, "files bigint").collect()


def persisted(frame: DataFrame) -> DataFrame:
    return frame.persist(StorageLevel.MEMORY_AND_DISK)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
