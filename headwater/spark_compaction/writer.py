"""Writing snapshot Parquet files: rows of a partition, sorted by key, cut into fixed-size files.

The writer runs inside a Spark write task (the `headwater_snapshot` data source's Arrow writer,
source.py) that holds whole partitions, their rows sorted by (topic, partition, key). It takes
Arrow batches as Spark hands them over, cuts them at partition boundaries, and writes a file
every `rows_per_file` rows (and one for the rest), named `part-00000.parquet`,
`part-00001.parquet`, ... under the partition's horizon directory. File boundaries therefore
depend only on the rows, never on how Spark happened to batch them, and a rerun produces the same
names with the same bytes (same rows, same order, same writer settings).

A partition named in `deltas` gets a delta layer: `delta-00000.parquet`, ... with DELTA_SCHEMA,
its rows the keys the run changed, a deletion as a null value.

Because files are cut at fixed row counts, the driver knows the names and row counts of a
partition's files from its number of live keys alone (`expected_files`), and needs nothing back
from the tasks but success. Each file is built in memory and stored with one put (the object
store API is whole-object), so a task holds about one file of rows; `rows_per_file` bounds it.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from headwater.spark_compaction.manifest import SnapshotFile, data_key
from headwater.spark_compaction.schema import DELTA_SCHEMA, SNAPSHOT_SCHEMA
from headwater.spark_compaction.store import BlockingStore

ROWS_PER_FILE = 1_000_000
ROW_GROUP_ROWS = 128 * 1024
COMPRESSION = "zstd"


def encode_parquet(table: pa.Table, delta: bool = False) -> bytes:
    sink = io.BytesIO()
    pq.write_table(
        table.cast(DELTA_SCHEMA if delta else SNAPSHOT_SCHEMA),
        sink,
        compression=COMPRESSION,
        row_group_size=ROW_GROUP_ROWS,
        write_statistics=True,
    )
    return sink.getvalue()


@dataclass
class _Pending:
    topic: str
    partition: int
    horizon: int
    delta: bool
    tables: list[pa.Table]
    rows: int = 0
    index: int = 0


class SnapshotWriter:
    """Writes the snapshot files of the partitions whose rows it is fed, in order."""

    def __init__(
        self,
        store: BlockingStore,
        horizons: dict[tuple[str, int], int],
        rows_per_file: int,
        deltas: frozenset[tuple[str, int]] = frozenset(),
    ) -> None:
        self._store = store
        self._horizons = horizons
        self._rows_per_file = rows_per_file
        self._deltas = deltas
        self._pending: _Pending | None = None

    def feed(self, batch: pa.RecordBatch) -> Iterator[SnapshotFile]:
        """Take one batch of rows (columns of SNAPSHOT_SCHEMA, any nullability)."""
        if batch.num_rows == 0:
            return
        table = pa.Table.from_batches([batch]).select(SNAPSHOT_SCHEMA.names)
        topics = table.column("topic").to_pylist()
        partitions = table.column("partition").to_pylist()
        start = 0
        for row in range(1, len(topics) + 1):
            if row == len(topics) or (topics[row], partitions[row]) != (
                topics[start],
                partitions[start],
            ):
                rows = table.slice(start, row - start)
                yield from self._add(topics[start], partitions[start], rows)
                start = row

    def _add(self, topic: str, partition: int, rows: pa.Table) -> Iterator[SnapshotFile]:
        pending = self._pending
        if pending is None or (pending.topic, pending.partition) != (topic, partition):
            yield from self.finish()
            horizon = self._horizons.get((topic, partition))
            if horizon is None:  # nothing new was read for it: its snapshot stays as it is
                return
            delta = (topic, partition) in self._deltas
            pending = self._pending = _Pending(topic, partition, horizon, delta, [])
        pending.tables.append(rows)
        pending.rows += rows.num_rows
        while pending.rows >= self._rows_per_file:
            yield self._write(pending, self._rows_per_file)

    def finish(self) -> Iterator[SnapshotFile]:
        pending, self._pending = self._pending, None
        if pending is not None and pending.rows:
            yield self._write(pending, pending.rows)

    def _write(self, pending: _Pending, count: int) -> SnapshotFile:
        combined = pa.concat_tables(pending.tables)
        table = combined.slice(0, count)
        rest = combined.slice(count)
        pending.tables = [rest] if rest.num_rows else []
        pending.rows = rest.num_rows
        key = data_key(
            pending.topic, pending.partition, pending.horizon, pending.index, pending.delta
        )
        pending.index += 1
        data = encode_parquet(table, pending.delta)
        self._store.put(key, data)
        return SnapshotFile(key, table.num_rows, len(data))


def write_snapshot_files(
    store: BlockingStore,
    horizons: dict[tuple[str, int], int],
    batches: Iterable[pa.RecordBatch],
    rows_per_file: int = ROWS_PER_FILE,
    deltas: frozenset[tuple[str, int]] = frozenset(),
) -> Iterator[tuple[str, int, SnapshotFile]]:
    """Feed sorted batches to a writer; yields (topic, partition, file) per file stored."""
    writer = SnapshotWriter(store, horizons, rows_per_file, deltas)
    for batch in batches:
        for written in writer.feed(batch):
            yield (*_owner(written), written)
    for written in writer.finish():
        yield (*_owner(written), written)


def expected_files(
    topic: str, partition: int, horizon: int, rows: int, rows_per_file: int, delta: bool = False
) -> list[tuple[str, int]]:
    """(key, rows) of each file a writer makes for a partition of `rows` rows."""
    count = -(-rows // rows_per_file)
    return [
        (
            data_key(topic, partition, horizon, i, delta),
            min(rows_per_file, rows - i * rows_per_file),
        )
        for i in range(count)
    ]


def _owner(written: SnapshotFile) -> tuple[str, int]:
    _, topic, partition, _ = written.key.split("/", 3)
    return topic, int(partition)
