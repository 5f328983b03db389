"""The fold, in Spark: per (topic, partition, key) the record with the highest offset wins.

Input is the new WAL records (`headwater_wal`, above the previous horizon) and the previous
snapshot's rows (`headwater_snapshot`), which are records too, with their original offsets, so
merging is the same fold. The WAL is read with `fold=true`: each reading task already keeps only
the newest record per key of its segments (wal.Folder, in the Python worker, where the records
are decoded anyway), with a count of the records each row stands for; Spark's sort-based
aggregation (`max_by` over a struct holding binary values cannot use its hash aggregation) then
sorts one row per key and task instead of one per record. One aggregation groups by (topic,
partition, key, corrupt) and keeps, per group, the winner (`max_by` offset), the highest offset,
and how many WAL records it stands for (snapshot rows count zero). Keyless records all land in the
key-null group of their partition and corrupt stretches each in a group of their own, so the same
pass counts them.

The grouped result is persisted and used twice: first a small per-partition summary comes back to
the driver (records in, keyless, tombstones, highest offset, corrupt stretches) from which the job
sets each partition's new horizon; then the live winners are hash-partitioned by (topic,
partition), sorted by key within each task, and written by `SnapshotWriter` (writer.py) inside
the `headwater_snapshot` data source's Arrow writer; the driver knows the files from the counts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from headwater.spark_compaction.manifest import SnapshotFile
from headwater.spark_compaction.source import files_option, segments_option
from headwater.spark_compaction.store import StoreSpec
from headwater.spark_compaction.wal_segments import SegmentObject


@dataclass(frozen=True, slots=True)
class PartitionStats:
    topic: str
    partition: int
    records_in: int
    keyless: int
    live: int
    tombstones: int
    max_offset: int | None
    corrupt: tuple[str, ...]


def read_inputs(
    spark: SparkSession,
    spec: StoreSpec,
    segments: Sequence[SegmentObject],
    from_offsets: dict[str, int],
    previous_files: Sequence[SnapshotFile],
    group_bytes: int,
) -> DataFrame:
    wal = (
        spark.read.format("headwater_wal")
        .option("store", spec.to_json())
        .option("segments", segments_option(segments))
        .option("from_offsets", _json(from_offsets))
        .option("group_bytes", str(group_bytes))
        .option("fold", "true")
        .load()
    )
    if not previous_files:
        return wal
    previous = (
        spark.read.format("headwater_snapshot")
        .option("store", spec.to_json())
        .option("files", files_option(previous_files))
        .load()
        .withColumn("corrupt", F.lit(None).cast("string"))
        .withColumn("records", F.lit(0).cast("bigint"))
    )
    return wal.unionByName(previous)


def fold(records: DataFrame) -> DataFrame:
    return records.groupBy("topic", "partition", "key", "corrupt").agg(
        F.max_by(F.struct("offset", "timestamp", "value", "headers"), "offset").alias("winner"),
        F.max("offset").alias("max_offset"),
        F.sum("records").alias("records"),
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
                int(r["records_in"] or 0),
                int(r["keyless"] or 0),
                int(r["live"] or 0),
                int(r["tombstones"] or 0),
                r["max_offset"],
                tuple(r["corrupt"]),
            )
            for r in rows
        ),
        key=lambda s: (s.topic, s.partition),
    )


def write(
    groups: DataFrame,
    spec: StoreSpec,
    horizons: dict[tuple[str, int], int],
    rows_per_file: int,
    tasks: int,
) -> None:
    """Write the live winners of the partitions in `horizons` as snapshot files (no manifest)."""
    if not horizons:
        return
    live = groups.where(F.col("key").isNotNull() & F.col("winner.value").isNotNull()).select(
        "topic",
        "partition",
        "key",
        F.col("winner.value").alias("value"),
        F.col("winner.offset").alias("offset"),
        F.col("winner.timestamp").alias("timestamp"),
        F.col("winner.headers").alias("headers"),
    )
    spread = live.repartition(max(1, min(len(horizons), tasks)), "topic", "partition")
    ordered = spread.sortWithinPartitions("topic", "partition", "key")
    (
        ordered.write.format("headwater_snapshot")
        .option("store", spec.to_json())
        .option("horizons", _json({f"{t}/{p}": h for (t, p), h in horizons.items()}))
        .option("rows_per_file", str(rows_per_file))
        .mode("append")
        .save()
    )


def persisted(frame: DataFrame) -> DataFrame:
    return frame.persist(StorageLevel.MEMORY_AND_DISK)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
