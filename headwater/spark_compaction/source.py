"""Spark data sources (pyspark.sql.datasource) over the object store: the WAL and the snapshots.

`headwater_wal` yields one row per WAL record (schema.WAL_DDL). On the driver, `partitions()` lists
the segment objects (or takes the pinned list the compaction job passes, so what it reads is exactly
what it planned) and makes one input partition per group of consecutive segments of a partition,
about `group_bytes` each. On the executors, `read()` fetches each segment whole, decodes it with
`wire` (spark_compaction/wal_segments.py) and yields Arrow record batches, which Spark takes without
converting row by row. Options (all strings, as Spark passes them):

- `store`: the object store, `StoreSpec.to_json()`
- `topics`: comma-separated topics (default: every topic in the store), or
- `segments`: a JSON list of [topic, partition, base_offset, size] to read exactly those
- `from_offsets`: JSON {"<topic>/<partition>": offset}: records below it are left out
- `until_offsets`: JSON {"<topic>/<partition>": offset}: batches at or past it are left out (the
  job's second pass over a partition whose horizon an open transaction stops)
- `group_bytes`: target bytes of segments per input partition (default 64 MiB)
- `fold`: "true" to fold inside each task (wal.Folder): one row per key seen, newest record, with
  a `records` column counting the records it stands for, and one row about the task
  (schema.FOLDED_DDL). The compaction job reads this way; Spark then folds the tasks' rows, far
  fewer than the records.

Rows are transaction-aware (wal_segments.DecidedBatches): markers are never rows, nor records of
aborted transactions, nor (without `fold`) those of a transaction still open at the end of the
listed segments. A task whose segments end inside a transaction reads the headers of its
partition's next listed segments for its marker, so each input partition also carries those.

`headwater_snapshot` reads snapshots through the same store code, since the pyspark wheel has no S3
file system: `topics` gives the newest snapshot of every partition of those topics, one input
partition each, its layers merged (one row per live key); `files`, a JSON list of [key, rows,
bytes] as a manifest lists them, gives those files' rows as they are, one input partition per
file (a delta file's deletions as rows with a null value: the job folds them with the rest). It
also writes snapshot files, from Arrow batches (`DataSourceArrowWriter`; `deltas`, a JSON list
of "<topic>/<partition>", marks the partitions that get a delta layer). The compaction job runs
these readers and this writer directly, by `mapInArrow` (compact.py), not through the data
source API, whose roles each start a Python process of their own.

This module imports pyspark; only the compaction job imports it, never the server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from headwater.spark_compaction.loader import Overlay, decode_snapshot_file, newest_manifest
from headwater.spark_compaction.manifest import Manifest, SnapshotFile
from headwater.spark_compaction.schema import FOLDED_DDL, WAL_DDL
from headwater.spark_compaction.store import BlockingStore, StoreSpec, open_store
from headwater.spark_compaction.wal_segments import (
    Folder,
    SegmentObject,
    decode_group,
    group_segments,
    list_segments,
)
from headwater.spark_compaction.writer import ROWS_PER_FILE, write_snapshot_files
from headwater.wire.errors import InvalidRequest

DEFAULT_GROUP_BYTES = 64 * 1024 * 1024

SNAPSHOT_READ_DDL = (
    "topic string, partition int, key binary, value binary, offset bigint, timestamp bigint, "
    "headers array<struct<key: string, value: binary>>"
)
SNAPSHOT_READ_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.int64()),
        pa.field(
            "headers",
            pa.list_(
                pa.field(
                    "element",
                    pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]),
                )
            ),
        ),
    ]
)


def store_option(options: dict[str, str], source: str) -> StoreSpec:
    """The `store` option every `headwater_wal`/`headwater_snapshot` read and write needs, with an
    error naming it (Spark's own errors would say only `KeyError: 'store'`)."""
    text = options.get("store")
    if not text:
        raise InvalidRequest(
            f"{source} needs the option store: the object store, as StoreSpec.to_json() "
            '(e.g. {"backend": "local", "path": "/var/lib/headwater/objects"})'
        )
    return StoreSpec.from_json(text)


class SegmentGroup(InputPartition):
    """One task: consecutive `segments` of a partition; `following`, the partition's listed
    segments after them (read only for the markers of a transaction left open)."""

    def __init__(
        self,
        segments: Sequence[SegmentObject],
        from_offset: int,
        following: Sequence[SegmentObject] = (),
        until: int | None = None,
    ) -> None:
        super().__init__(tuple(segments))
        self.segments = tuple(segments)
        self.from_offset = from_offset
        self.following = tuple(following)
        self.until = until


class WalReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.spec = store_option(options, "headwater_wal")
        self.topics = [t for t in options.get("topics", "").split(",") if t]
        pinned = options.get("segments")
        self.pinned = None
        if pinned is not None:
            self.pinned = [SegmentObject(t, p, b, s, n) for t, p, b, s, n in json.loads(pinned)]
        self.from_offsets: dict[str, int] = json.loads(options.get("from_offsets", "{}"))
        self.until_offsets: dict[str, int] = json.loads(options.get("until_offsets", "{}"))
        self.group_bytes = int(options.get("group_bytes", DEFAULT_GROUP_BYTES))
        self.fold = options.get("fold", "false").lower() == "true"

    def partitions(self) -> Sequence[InputPartition]:
        segments = self.pinned
        if segments is None:
            with BlockingStore(self.spec) as store:
                segments = list_segments(store, self.topics)
        groups = group_segments(segments, self.group_bytes)
        if not groups:
            return [SegmentGroup((), 0)]
        parts = []
        for index, group in enumerate(groups):
            name = f"{group[0].topic}/{group[0].partition}"
            following: list[SegmentObject] = []
            for later in groups[index + 1 :]:
                if f"{later[0].topic}/{later[0].partition}" != name:
                    break
                following.extend(later)
            parts.append(
                SegmentGroup(
                    group,
                    self.from_offsets.get(name, 0),
                    following,
                    self.until_offsets.get(name),
                )
            )
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SegmentGroup)
        if not partition.segments:
            return
        store = BlockingStore(self.spec)
        try:
            fetched = ((s, store.get(s.key)) for s in partition.segments)
            following = ((s, store.get(s.key)) for s in partition.following)  # only if needed
            if not self.fold:
                yield from decode_group(fetched, partition.from_offset, following)
                return
            folder = Folder(partition.segments[0], until=partition.until)
            for segment, data in fetched:
                yield from folder.add(segment, data, partition.from_offset)
            yield from folder.finish(following)
        finally:
            store.close()


class WalDataSource(DataSource):
    """`spark.read.format("headwater_wal").option("store", spec.to_json()).load()`"""

    @classmethod
    def name(cls) -> str:
        return "headwater_wal"

    def schema(self) -> str:
        return FOLDED_DDL if self.options.get("fold", "false").lower() == "true" else WAL_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return WalReader(dict(self.options))


class SnapshotReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.spec = store_option(options, "headwater_snapshot")
        files = options.get("files")
        self.files = None if files is None else [SnapshotFile(*f) for f in json.loads(files)]
        self.topics = [t for t in options.get("topics", "").split(",") if t]

    def partitions(self) -> Sequence[InputPartition]:
        parts: Sequence[SnapshotFile | Manifest]
        if self.files is not None:
            parts = self.files
        else:
            parts = asyncio.run(_newest_manifests(self.spec, self.topics))
        return [InputPartition(p) for p in parts] or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        part = partition.value
        if part is None:
            return
        with BlockingStore(self.spec) as store:
            if isinstance(part, SnapshotFile):
                tables = iter([decode_snapshot_file(part, store.get(part.key))])
            else:
                tables = merged_snapshot(store, part)
            for table in tables:
                yield from table.cast(SNAPSHOT_READ_SCHEMA).to_batches()


class SnapshotWriterTask(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str]) -> None:
        self.spec = store_option(options, "headwater_snapshot")
        self.horizons = {
            (topic, int(partition)): horizon
            for name, horizon in json.loads(options["horizons"]).items()
            for topic, partition in [name.rsplit("/", 1)]
        }
        self.rows_per_file = int(options.get("rows_per_file", ROWS_PER_FILE))
        self.deltas = frozenset(
            (topic, int(partition))
            for name in json.loads(options.get("deltas", "[]"))
            for topic, partition in [name.rsplit("/", 1)]
        )

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        self.write_files(iterator)
        return WriterCommitMessage()

    def write_files(self, iterator: Iterator[pa.RecordBatch]) -> int:
        """Store the files of the rows fed (sorted by topic, partition, key); how many."""
        with BlockingStore(self.spec) as store:
            return sum(
                1
                for _ in write_snapshot_files(
                    store, self.horizons, iterator, self.rows_per_file, self.deltas
                )
            )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # the job's driver commits, with one manifest per partition (manifest.py)


class SnapshotDataSource(DataSource):
    """Read: `spark.read.format("headwater_snapshot").option("store", ...).option("topics", "t")`.

    Write (the compaction job): rows of SNAPSHOT_SCHEMA, hash-partitioned by (topic, partition)
    and sorted by key within each task, with options `store`, `horizons` (JSON
    {"<topic>/<partition>": horizon}) and `rows_per_file`. Writes data files only, no manifest.
    """

    @classmethod
    def name(cls) -> str:
        return "headwater_snapshot"

    def schema(self) -> str:
        return SNAPSHOT_READ_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return SnapshotReader(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return SnapshotWriterTask(dict(self.options))


def merged_snapshot(store: BlockingStore, manifest: Manifest) -> Iterator[pa.Table]:
    """A snapshot's live rows in key order, its layers merged (the loader's `Overlay`)."""
    full, *deltas = manifest.all_layers
    overlay = None
    if deltas:
        changes = [decode_snapshot_file(f, store.get(f.key)) for d in deltas for f in d.files]
        overlay = Overlay(changes)
    for file in full.files:
        table = decode_snapshot_file(file, store.get(file.key))
        yield table if overlay is None else overlay.merge(table)
    if overlay is not None:
        yield overlay.rest()


async def _newest_manifests(spec: StoreSpec, topics: list[str]) -> list[Manifest]:
    store = await open_store(spec)
    try:
        partitions: set[tuple[str, int]] = set()
        for topic in topics:
            for info in await store.list(f"snapshots/{topic}/"):
                parts = info.key.split("/")
                if len(parts) >= 4 and parts[2].isdigit():
                    partitions.add((topic, int(parts[2])))
        manifests = []
        for topic, partition in sorted(partitions):
            manifest = await newest_manifest(store, topic, partition)
            if manifest is not None:
                manifests.append(manifest)
        return manifests
    finally:
        await store.close()


def segments_option(segments: Sequence[SegmentObject]) -> str:
    return json.dumps([[s.topic, s.partition, s.base_offset, s.size, s.name] for s in segments])


def files_option(files: Sequence[SnapshotFile]) -> str:
    return json.dumps([[f.key, f.rows, f.bytes] for f in files])


def register(spark: Any) -> None:
    from headwater.spark_compaction.sink import HeadwaterDataSource

    spark.dataSource.register(WalDataSource)
    spark.dataSource.register(SnapshotDataSource)
    spark.dataSource.register(HeadwaterDataSource)
