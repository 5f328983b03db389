"""Loading a partition's newest snapshot without Spark: for the server, and for anyone with pyarrow.

`load_snapshot(store, topic, partition)` finds the manifest with the highest horizon (the commit
of the newest complete snapshot; see manifest.py) and returns a `Snapshot`: its horizon and an
async iterator of its rows, one per live key, in key order. A server rebuilding a partition's
last-value state applies these rows and then replays the WAL from `horizon`. Files are fetched
one at a time and decoded off the event loop; each is checked against the manifest (size and row
count), and a snapshot that does not check raises `StorageError` rather than yield part of itself.

It takes the server's async `ObjectStore` and imports only pyarrow, `storage` and `wire`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from headwater.spark_compaction.manifest import (
    Manifest,
    SnapshotFile,
    manifest_horizons,
    manifest_key,
)
from headwater.spark_compaction.manifest import partition_prefix as _partition_prefix
from headwater.spark_compaction.schema import SNAPSHOT_SCHEMA
from headwater.storage.objectstore import ObjectStore
from headwater.wire.errors import StorageError


@dataclass(frozen=True, slots=True)
class SnapshotRow:
    key: bytes
    value: bytes
    offset: int
    timestamp: int
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    store: ObjectStore
    manifest: Manifest

    @property
    def horizon(self) -> int:
        return self.manifest.horizon

    async def batches(self) -> AsyncIterator[pa.RecordBatch]:
        for file in self.manifest.files:
            table = await read_snapshot_file(self.store, file)
            for batch in table.to_batches():
                yield batch

    async def rows(self) -> AsyncIterator[SnapshotRow]:
        async for batch in self.batches():
            columns = batch.to_pydict()
            for key, value, offset, timestamp, headers in zip(
                columns["key"],
                columns["value"],
                columns["offset"],
                columns["timestamp"],
                columns["headers"],
                strict=True,
            ):
                yield SnapshotRow(
                    key, value, offset, timestamp, tuple((h["key"], h["value"]) for h in headers)
                )


async def read_manifest(store: ObjectStore, topic: str, partition: int, horizon: int) -> Manifest:
    key = manifest_key(topic, partition, horizon)
    return Manifest.decode(key, await store.get(key))


async def newest_manifest(store: ObjectStore, topic: str, partition: int) -> Manifest | None:
    horizons = manifest_horizons(await store.list(_partition_prefix(topic, partition)))
    if not horizons:
        return None
    return await read_manifest(store, topic, partition, horizons[-1])


async def load_snapshot(store: ObjectStore, topic: str, partition: int) -> Snapshot | None:
    """The newest committed snapshot of a partition, or None if it has none."""
    manifest = await newest_manifest(store, topic, partition)
    return None if manifest is None else Snapshot(store, manifest)


async def read_snapshot_file(store: ObjectStore, file: SnapshotFile) -> pa.Table:
    data = await store.get(file.key)
    return await asyncio.to_thread(decode_snapshot_file, file, data)


def decode_snapshot_file(file: SnapshotFile, data: bytes) -> pa.Table:
    if len(data) != file.bytes:
        raise StorageError(
            f"snapshot file {file.key} is {len(data)} bytes, its manifest says {file.bytes}"
        )
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as exc:
        raise StorageError(f"snapshot file {file.key} does not decode: {exc}") from None
    if table.num_rows != file.rows:
        raise StorageError(
            f"snapshot file {file.key} holds {table.num_rows} rows, its manifest says {file.rows}"
        )
    if not table.schema.equals(SNAPSHOT_SCHEMA):
        raise StorageError(f"snapshot file {file.key} has schema {table.schema}, not the expected")
    return table
