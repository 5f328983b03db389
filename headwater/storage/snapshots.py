"""Per-key snapshots in the object store: their names, their manifests, and reading them back.

The compaction job (`spark_compaction`) writes snapshots; the server reads them (last-value
rebuild, the `snapshot` start position, `describe`). Both use this module, so the server never
imports the job's package (nor pyspark). Layout, per topic and partition:

    snapshots/<topic>/<partition>/<horizon, 20 digits>/part-00000.parquet, part-00001.parquet, ...
    snapshots/<topic>/<partition>/manifest-<horizon, 20 digits>.json

The horizon is the offset after the last record folded in: the snapshot holds, for every live key,
the newest record below it. The manifest is written last with a conditional put: it is the commit.
Readers look only for manifests, take the one with the highest horizon, and read the files it
lists. Each file is checked against its manifest (size, row count, schema) as it is read, and one
that does not check raises `StorageError` rather than yield part of a snapshot; files are decoded
off the event loop. docs/COMPACTION.md documents the schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

import structlog

from headwater.storage.objectstore import ObjectInfo, ObjectStore
from headwater.wire.errors import StorageError

if TYPE_CHECKING:
    import pyarrow as pa

ROOT = "snapshots"
# changes whenever storage.snapshot_schema.SNAPSHOT_SCHEMA changes (that module imports pyarrow,
# which only the functions reading files import: not the server's start-up)
SCHEMA_VERSION: Final = 1

log = structlog.get_logger("headwater.snapshots")

_MANIFEST_PREFIX = "manifest-"
_MANIFEST_SUFFIX = ".json"


def topic_prefix(topic: str) -> str:
    return f"{ROOT}/{topic}/"


def partition_prefix(topic: str, partition: int) -> str:
    return f"{ROOT}/{topic}/{partition}/"


def manifest_key(topic: str, partition: int, horizon: int) -> str:
    return f"{partition_prefix(topic, partition)}{_MANIFEST_PREFIX}{horizon:020d}{_MANIFEST_SUFFIX}"


def data_prefix(topic: str, partition: int, horizon: int) -> str:
    return f"{partition_prefix(topic, partition)}{horizon:020d}/"


def data_key(topic: str, partition: int, horizon: int, index: int) -> str:
    return f"{data_prefix(topic, partition, horizon)}part-{index:05d}.parquet"


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    key: str
    rows: int
    bytes: int


@dataclass(frozen=True, slots=True)
class Manifest:
    topic: str
    partition: int
    horizon: int  # every record below this offset is folded in
    last_segment: int  # base offset of the last WAL segment folded in; the next run reads past it
    previous_horizon: int | None  # the snapshot this one was merged with, if any
    files: tuple[SnapshotFile, ...]
    rows: int  # live keys
    records_in: int  # WAL records read by the run that made this snapshot
    tombstones_dropped: int
    keyless_skipped: int
    corrupt_batches: int
    created_at: str  # ISO 8601, UTC: the only field that depends on the clock
    schema_version: int = SCHEMA_VERSION

    def encode(self) -> bytes:
        document = asdict(self)
        document["files"] = [asdict(f) for f in self.files]
        return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def decode(cls, key: str, data: bytes) -> Manifest:
        try:
            document = json.loads(data)
            files = tuple(SnapshotFile(**f) for f in document.pop("files"))
            manifest = cls(files=files, **document)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise StorageError(f"snapshot manifest {key} is not valid: {exc}") from None
        if manifest.schema_version != SCHEMA_VERSION:
            raise StorageError(
                f"snapshot manifest {key} has schema version {manifest.schema_version}; "
                f"this version reads {SCHEMA_VERSION}"
            )
        return manifest

    @property
    def created_at_seconds(self) -> float:
        return datetime.fromisoformat(self.created_at).timestamp()


def now_iso(now: float | None = None) -> str:
    moment = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    return moment.isoformat(timespec="milliseconds")


def parse_manifest_key(key: str) -> int | None:
    name = key.rsplit("/", 1)[-1]
    if not (name.startswith(_MANIFEST_PREFIX) and name.endswith(_MANIFEST_SUFFIX)):
        return None
    digits = name[len(_MANIFEST_PREFIX) : -len(_MANIFEST_SUFFIX)]
    return int(digits) if len(digits) == 20 and digits.isdigit() else None


def manifest_horizons(listing: Sequence[ObjectInfo]) -> list[int]:
    """Horizons of the manifests in a partition's listing, lowest first."""
    return sorted(h for h in (parse_manifest_key(i.key) for i in listing) if h is not None)


async def newest_horizons(store: ObjectStore, topic: str) -> dict[int, int]:
    """The newest manifest's horizon of each partition of `topic` that has one (one listing)."""
    found: dict[int, int] = {}
    prefix = topic_prefix(topic)
    for info in await store.list(prefix):
        parts = info.key[len(prefix) :].split("/")
        horizon = parse_manifest_key(info.key)
        if horizon is None or len(parts) != 2 or not parts[0].isdigit():
            continue
        partition = int(parts[0])
        found[partition] = max(horizon, found.get(partition, -1))
    return found


class HorizonCache:
    """Each topic's newest snapshot horizons, for `describe`: listed at most every `ttl` seconds.
    A caller waits at most `wait` seconds for a listing (then gets what was known before, and the
    listing goes on for the next caller), so the object store being slow or down never makes a
    describe slow or fail."""

    def __init__(self, store: ObjectStore, ttl: float = 5.0, wait: float = 1.0) -> None:
        self._store = store
        self._ttl = ttl
        self._wait = wait
        self._known: dict[str, tuple[float, dict[int, int]]] = {}
        self._listing: dict[str, asyncio.Task[None]] = {}

    async def get(self, topic: str) -> dict[int, int]:
        loop = asyncio.get_running_loop()
        known = self._known.get(topic)
        if known is not None and loop.time() - known[0] < self._ttl:
            return known[1]
        task = self._listing.get(topic)
        if task is None:
            task = self._listing[topic] = loop.create_task(self._list(topic))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._wait):
                await asyncio.shield(task)
        known = self._known.get(topic)
        return known[1] if known is not None else {}

    async def _list(self, topic: str) -> None:
        try:
            horizons = await newest_horizons(self._store, topic)
        except Exception as exc:  # StorageError, or anything else: describe must still answer
            log.warning("snapshots.list_failed", topic=topic, error=str(exc))
            return
        finally:
            self._listing.pop(topic, None)
        self._known[topic] = (asyncio.get_running_loop().time(), horizons)


# Reading


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
            for row in batch_rows(batch):
                yield row

    async def table(self) -> pa.Table:
        """Every row, in one table (key order)."""
        import pyarrow as pa

        from headwater.storage.snapshot_schema import SNAPSHOT_SCHEMA

        tables = [await read_snapshot_file(self.store, f) for f in self.manifest.files]
        return pa.concat_tables(tables) if tables else SNAPSHOT_SCHEMA.empty_table()


def batch_rows(batch: pa.RecordBatch | pa.Table) -> list[SnapshotRow]:
    columns = batch.to_pydict()
    return [
        SnapshotRow(key, value, offset, timestamp, tuple((h["key"], h["value"]) for h in headers))
        for key, value, offset, timestamp, headers in zip(
            columns["key"],
            columns["value"],
            columns["offset"],
            columns["timestamp"],
            columns["headers"],
            strict=True,
        )
    ]


async def read_manifest(store: ObjectStore, topic: str, partition: int, horizon: int) -> Manifest:
    key = manifest_key(topic, partition, horizon)
    manifest = Manifest.decode(key, await store.get(key))
    if (manifest.topic, manifest.partition, manifest.horizon) != (topic, partition, horizon):
        raise StorageError(
            f"snapshot manifest {key} describes {manifest.topic!r} partition "
            f"{manifest.partition} horizon {manifest.horizon}, not what its name says"
        )
    return manifest


async def newest_manifest(store: ObjectStore, topic: str, partition: int) -> Manifest | None:
    horizons = manifest_horizons(await store.list(partition_prefix(topic, partition)))
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
    import pyarrow as pa
    import pyarrow.parquet as pq

    from headwater.storage.snapshot_schema import SNAPSHOT_SCHEMA

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
