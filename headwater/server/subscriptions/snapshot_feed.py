"""The `snapshot` start position: a reliable subscription's partitions read from a snapshot first.

A subscription created (or moved by a seek) at `snapshot` keeps, per partition that has a
snapshot, that snapshot's horizon (in its definition, so it survives a restart). Below the
horizon its pump reads from this feed instead of the log: the snapshot's rows, one per live key,
in offset order, each with its original offset, key, value, timestamp and headers, as batches of
consecutive offsets. The offsets in between (records a later one of the same key superseded,
tombstones, keyless records) hold nothing for it, and the cursor steps over them as it steps over
any gap; once the rows are exhausted the cursor moves to the horizon and the pump reads the log
from there. So the consumer gets one current value per live key, then every record after the
horizon, and acknowledgements, redelivery and restarts work as on the log (Pulsar's compacted
reads do the same).

A partition's rows are loaded on first use (the manifest of that horizon and its files), kept
as one Arrow table sorted by offset, and dropped once the cursor's floor passes the horizon. A
snapshot that cannot be read (removed by retention, damaged) is dropped with an error log: the
partition is then read from the log, which holds the same records and the ones they superseded.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from headwater.durables.delivery import runs
from headwater.storage.objectstore import ObjectStore
from headwater.storage.snapshots import Snapshot, batch_rows, read_manifest
from headwater.wire.errors import StorageError
from headwater.wire.records import Record, rebuild_batch

if TYPE_CHECKING:
    import pyarrow as pa  # the tables come from storage.snapshots, which imports it when reading

log = structlog.get_logger(__name__)

READ_ROWS = 1000  # rows per read, like a read of the log returns about a megabyte


@dataclass(slots=True)
class _Rows:
    table: pa.Table  # sorted by offset
    offsets: list[int]


class SnapshotFeed:
    def __init__(self, store: ObjectStore, topic: str, horizons: dict[int, int]) -> None:
        self._store = store
        self.topic = topic
        self.horizons = dict(horizons)  # partition -> horizon, for partitions read from one
        self._rows: dict[int, _Rows] = {}

    def covers(self, partition: int, offset: int) -> bool:
        return offset < self.horizons.get(partition, 0)

    def horizon(self, partition: int) -> int:
        return self.horizons.get(partition, 0)

    def release(self, partition: int, floor: int) -> None:
        """Forget a partition's rows once everything below its horizon is acknowledged."""
        if partition in self.horizons and floor >= self.horizons[partition]:
            self._rows.pop(partition, None)

    async def read(self, partition: int, offset: int) -> list[bytes] | None:
        """Batches of the rows from `offset` on (below the horizon); [] once there are none
        left; None when the snapshot cannot be read (the partition is then read from the log)."""
        rows = await self._load(partition)
        if rows is None:
            return None
        start = bisect.bisect_left(rows.offsets, offset)
        records = _records(rows.table.slice(start, READ_ROWS))
        return [rebuild_batch(run) for run in runs(records)]

    async def records(self, partition: int, offsets: list[int]) -> list[Record] | None:
        """The rows at `offsets` (for redelivery); None when the snapshot cannot be read."""
        rows = await self._load(partition)
        if rows is None:
            return None
        found = []
        for offset in offsets:
            index = bisect.bisect_left(rows.offsets, offset)
            if index < len(rows.offsets) and rows.offsets[index] == offset:
                found.extend(_records(rows.table.slice(index, 1)))
        return found

    async def start(self, partition: int) -> int | None:
        """Load a partition's rows now, and say where its cursor starts: the first row's offset
        (the horizon when the snapshot has no rows); None (and the partition dropped) when the
        snapshot cannot be read."""
        rows = await self._load(partition)
        if rows is None:
            return None
        return rows.offsets[0] if rows.offsets else self.horizons[partition]

    async def _load(self, partition: int) -> _Rows | None:
        rows = self._rows.get(partition)
        if rows is not None:
            return rows
        horizon = self.horizons.get(partition)
        if horizon is None:
            return None
        try:
            manifest = await read_manifest(self._store, self.topic, partition, horizon)
            table = await Snapshot(self._store, manifest).table()
        except StorageError as exc:
            log.error(
                "subscription.snapshot_unreadable",
                topic=self.topic,
                partition=partition,
                horizon=horizon,
                error=str(exc),
                fallback="read from the log",
            )
            del self.horizons[partition]
            return None
        table = table.sort_by("offset")
        rows = self._rows[partition] = _Rows(table, table.column("offset").to_pylist())
        return rows


def _records(table: pa.Table) -> list[Record]:
    return [Record(r.offset, r.timestamp, r.key, r.value, r.headers) for r in batch_rows(table)]
