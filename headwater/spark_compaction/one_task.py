"""A partition whose new segments fit one task: read, folded, decided and written by that task.

Most partitions' new segments fit one reading task (`group_bytes`, 64 MiB by default). For those,
the Spark fold (compact.py: an aggregation over the tasks' rows, its per-partition counts, then
the write's shuffle and sort, two Spark jobs) has nothing to merge: the reading task's `Folder`
already holds each key's newest record. So the job runs one task per such partition, all in one
Spark job without a shuffle (compact.fold_in_one_task), and the task does the rest in Arrow: it
folds the partition's new segments (wal_segments.Folder, and `newest_per_key` again if the folder
handed its rows over in pieces), counts them as `compact.partition_stats` does, sets the horizon
and chooses between a delta layer and a full snapshot by the same rules as job.py, sorts the rows
by key (Arrow's order of binary keys is Spark's: unsigned bytes, a prefix first) and writes the
files with `SnapshotWriter`, and returns its counts. That cut the JVM's CPU of a cold 1M-record
run by more than half (docs/BENCHMARKS.md).

A partition whose changes are too many for a delta layer needs its earlier layers folded in: the
task writes nothing and says so (`MERGE`), and the job takes the partition through the Spark path,
which reads its segments again. A task holds its partition's folded rows: at most what its
segments, `group_bytes` of them, hold.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from headwater.spark_compaction.schema import FOLDED_SCHEMA, SNAPSHOT_SCHEMA
from headwater.spark_compaction.store import BlockingStore
from headwater.spark_compaction.wal_segments import Folder, SegmentObject, newest_per_key
from headwater.spark_compaction.writer import SnapshotWriter

FULL, DELTA, MERGE, NOTHING = "full", "delta", "merge", "nothing"


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
    aborted: int = 0  # records of aborted transactions left out (counted in records_in)
    undecided: int | None = None  # the first offset of a transaction still open, if any


@dataclass(frozen=True, slots=True)
class OneTask:
    """A partition's new segments (one reading group) and what the driver decided beforehand:
    `budget`, the changed keys a delta layer may hold (None: no delta over `previous`), and
    `fresh`, no snapshot yet."""

    topic: str
    partition: int
    segments: tuple[SegmentObject, ...]
    from_offset: int
    fresh: bool
    budget: int | None


@dataclass(frozen=True, slots=True)
class Written:
    """What a task did: `kind` FULL or DELTA (files of `rows` rows under `horizon`), MERGE (wrote
    nothing: too many changes for a delta) or NOTHING (no new record)."""

    stats: PartitionStats
    kind: str
    horizon: int | None = None
    rows: int = 0

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, text: str) -> Written:
        found: dict[str, Any] = json.loads(text)
        stats = found.pop("stats")
        stats["corrupt"] = tuple(stats["corrupt"])
        return cls(PartitionStats(**stats), **found)


def fold_partition(store: BlockingStore, task: OneTask, rows_per_file: int) -> Written:
    """Fold `task`'s segments, and write its snapshot files unless it needs the Spark path."""
    folder = Folder(task.segments[0])
    pieces: list[pa.RecordBatch] = []
    for segment in task.segments:
        pieces.extend(folder.add(segment, store.get(segment.key), task.from_offset))
    pieces.extend(folder.finish())
    table = pa.Table.from_batches(pieces, schema=FOLDED_SCHEMA)
    uncorrupt = table.filter(pc.is_null(table["corrupt"]))
    keyed = uncorrupt.filter(pc.is_valid(uncorrupt["key"]))
    if len(pieces) > 1:  # the folder handed over pieces (past its max_keys): fold them together
        keyed = newest_per_key(keyed)
    live = keyed.filter(pc.is_valid(keyed["value"]))
    stats = PartitionStats(
        task.topic,
        task.partition,
        records_in=_sum(uncorrupt["records"]) + _sum(table["aborted"]),
        keyless=_sum(uncorrupt.filter(pc.is_null(uncorrupt["key"]))["records"]),
        live=live.num_rows,
        tombstones=keyed.num_rows - live.num_rows,
        max_offset=pc.max(table["offset"]).as_py(),
        corrupt=tuple(sorted(c for c in table["corrupt"].to_pylist() if c is not None)),
        aborted=_sum(table["aborted"]),
        undecided=pc.min(table["undecided"]).as_py(),
    )
    if stats.records_in == 0 or stats.max_offset is None:
        return Written(stats, NOTHING)
    # as job.compute: an open transaction's first offset (the LSO of what was uploaded) stops it
    horizon = stats.undecided
    if horizon is None:
        horizon = max(stats.max_offset + 1, task.from_offset)
    if horizon <= task.from_offset:
        return Written(stats, NOTHING)
    if task.fresh:
        kind, rows = FULL, live
    elif task.budget is not None and keyed.num_rows <= task.budget:
        kind, rows = DELTA, keyed
    else:
        return Written(stats, MERGE)
    name = (task.topic, task.partition)
    deltas = frozenset([name]) if kind == DELTA else frozenset()
    writer = SnapshotWriter(store, {name: horizon}, rows_per_file, deltas)
    ordered = rows.sort_by("key").select(SNAPSHOT_SCHEMA.names)
    for batch in ordered.to_batches():
        for _ in writer.feed(batch):
            pass
    for _ in writer.finish():
        pass
    return Written(stats, kind, horizon, rows.num_rows)


def _sum(column: pa.ChunkedArray) -> int:
    return int(pc.sum(column).as_py() or 0)
