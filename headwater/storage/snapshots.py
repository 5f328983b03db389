"""Per-key snapshots in the object store: their names, their manifests, and reading them back.

The compaction job (`spark_compaction`) writes snapshots; the server reads them (last-value
rebuild, the `snapshot` start position, `describe`). Both use this module, so the server never
imports the job's package (nor pyspark). Layout, per topic and partition:

    snapshots/<topic>/<partition>/<horizon, 20 digits>/part-00000.parquet, part-00001.parquet, ...
    snapshots/<topic>/<partition>/<horizon, 20 digits>/delta-00000.parquet, ...
    snapshots/<topic>/<partition>/_manifest-<horizon, 20 digits>.json

The manifest's name starts with `_` so that Parquet readers pointed at a partition's directory
(`spark.read.parquet(dir, recursiveFileLookup=True)`, `pyarrow.dataset`) skip it, as they skip
`_SUCCESS` and `_delta_log`; snapshots written before that are named `manifest-<horizon>.json`
and are still found and read (`read_manifest` falls back to the old name).

The horizon is the offset after the last record folded in: the snapshot holds, for every live key,
the newest record below it. The manifest is written last with a conditional put: it is the commit.
Readers look only for manifests, take the one with the highest horizon, and read the files it
lists. Each file is checked against its manifest (size, row count, schema) as it is read, and one
that does not check raises `StorageError` rather than yield part of a snapshot; files are decoded
off the event loop. docs/COMPACTION.md documents the schema.

A snapshot is a full layer (`part-` files: every live key) or a delta over one: a manifest with
`delta` set lists, in `layers`, the full layer and the earlier deltas it lies over, oldest first,
and its own files hold only the keys its run changed, a deletion as a row with a null value.
Every row of a delta is newer than every row below it, since each layer only folds records above
the horizon of the one before. Reading merges the layers as it streams the full layer: the
deltas (small: the job folds them into a new full layer once they pass a fraction of it) become one
sorted `Overlay`, newest row per key, and each batch of full-layer rows, which come in key order,
gives way to the overlay's rows of its key range.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

import structlog

from headwater.storage.objectstore import ObjectInfo, ObjectStore
from headwater.wire.errors import ObjectNotFound, StorageError

if TYPE_CHECKING:
    import pyarrow as pa

ROOT = "snapshots"
# changes whenever storage.snapshot_schema.SNAPSHOT_SCHEMA changes (that module imports pyarrow,
# which only the functions reading files import: not the server's start-up)
SCHEMA_VERSION: Final = 1
# a manifest with delta layers says 2, so a reader that knows only full snapshots refuses it
# rather than read a delta's changed keys as the whole state; a full snapshot still says 1
LAYERED_SCHEMA_VERSION: Final = 2

log = structlog.get_logger(__name__)

_MANIFEST_PREFIX = "_manifest-"
_LEGACY_MANIFEST_PREFIX = "manifest-"  # before the leading `_`: still read, never written
_MANIFEST_SUFFIX = ".json"


def topic_prefix(topic: str) -> str:
    return f"{ROOT}/{topic}/"


def partition_prefix(topic: str, partition: int) -> str:
    return f"{ROOT}/{topic}/{partition}/"


def manifest_key(topic: str, partition: int, horizon: int) -> str:
    return f"{partition_prefix(topic, partition)}{_MANIFEST_PREFIX}{horizon:020d}{_MANIFEST_SUFFIX}"


def data_prefix(topic: str, partition: int, horizon: int) -> str:
    return f"{partition_prefix(topic, partition)}{horizon:020d}/"


def data_key(topic: str, partition: int, horizon: int, index: int, delta: bool = False) -> str:
    kind = _DELTA_FILE if delta else _FULL_FILE
    return f"{data_prefix(topic, partition, horizon)}{kind}{index:05d}.parquet"


_FULL_FILE = "part-"
_DELTA_FILE = "delta-"


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    key: str
    rows: int
    bytes: int

    @property
    def delta(self) -> bool:
        """A delta layer's file: changed keys, deletions as null values (DELTA_SCHEMA)."""
        return self.key.rsplit("/", 1)[-1].startswith(_DELTA_FILE)


@dataclass(frozen=True, slots=True)
class Layer:
    """One horizon's files as a reader merges them: a full layer, or a delta over the ones below."""

    horizon: int
    delta: bool
    files: tuple[SnapshotFile, ...]

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)


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
    delta: bool = False  # `files` hold the keys this run changed, laid over `layers`
    layers: tuple[Layer, ...] = ()  # a delta's full layer and earlier deltas, oldest first

    def encode(self) -> bytes:
        document = asdict(self)
        if not self.delta:  # a full snapshot's manifest is the same as before deltas existed
            del document["delta"], document["layers"]
        return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def decode(cls, key: str, data: bytes) -> Manifest:
        try:
            document = json.loads(data)
            files = tuple(SnapshotFile(**f) for f in document.pop("files"))
            layers = tuple(
                Layer(
                    layer["horizon"],
                    layer["delta"],
                    tuple(SnapshotFile(**f) for f in layer["files"]),
                )
                for layer in document.pop("layers", ())
            )
            manifest = cls(files=files, layers=layers, **document)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise StorageError(f"snapshot manifest {key} is not valid: {exc}") from None
        expected = LAYERED_SCHEMA_VERSION if manifest.delta else SCHEMA_VERSION
        if manifest.schema_version != expected:
            raise StorageError(
                f"snapshot manifest {key} has schema version {manifest.schema_version}; "
                f"this version reads {SCHEMA_VERSION} (full) and {LAYERED_SCHEMA_VERSION} (delta)"
            )
        problem = manifest.layering_problem()
        if problem:
            raise StorageError(f"snapshot manifest {key} is not valid: {problem}")
        return manifest

    def layering_problem(self) -> str | None:
        """Why the layers cannot be merged as they are listed, or None."""
        layers = self.all_layers
        if layers[0].delta:
            return "its lowest layer is a delta, not a full snapshot"
        if any(not layer.delta for layer in layers[1:]):
            return "a full layer lies over another layer"
        horizons = [layer.horizon for layer in layers]
        if horizons != sorted(set(horizons)):
            return f"its layers' horizons {horizons} do not rise"
        if any(f.delta != layer.delta for layer in layers for f in layer.files):
            return "a layer lists a file of the other kind"
        return None

    @property
    def all_layers(self) -> tuple[Layer, ...]:
        """What a reader merges, oldest first: the layers below, then this manifest's own files."""
        return (*self.layers, Layer(self.horizon, self.delta, self.files))

    @property
    def rows_to_read(self) -> int:
        """Rows a reader reads to load this snapshot: every layer's (`rows` is this run's)."""
        return sum(layer.rows for layer in self.all_layers)

    @property
    def created_at_seconds(self) -> float:
        return datetime.fromisoformat(self.created_at).timestamp()


def now_iso(now: float | None = None) -> str:
    moment = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    return moment.isoformat(timespec="milliseconds")


def legacy_manifest_key(topic: str, partition: int, horizon: int) -> str:
    """A manifest's name before manifests started with `_` (still read, never written)."""
    name = f"{_LEGACY_MANIFEST_PREFIX}{horizon:020d}{_MANIFEST_SUFFIX}"
    return f"{partition_prefix(topic, partition)}{name}"


def parse_manifest_key(key: str) -> int | None:
    name = key.rsplit("/", 1)[-1]
    if not name.endswith(_MANIFEST_SUFFIX):
        return None
    for prefix in (_MANIFEST_PREFIX, _LEGACY_MANIFEST_PREFIX):
        if name.startswith(prefix):
            digits = name[len(prefix) : -len(_MANIFEST_SUFFIX)]
            return int(digits) if len(digits) == 20 and digits.isdigit() else None
    return None


def manifest_keys(listing: Sequence[ObjectInfo]) -> dict[int, str]:
    """The key of each manifest in a partition's listing, by horizon (the current name when a
    horizon has both)."""
    found: dict[int, str] = {}
    for info in listing:
        horizon = parse_manifest_key(info.key)
        if horizon is not None and not found.get(horizon, "").endswith(
            f"/{_MANIFEST_PREFIX}{horizon:020d}{_MANIFEST_SUFFIX}"
        ):
            found[horizon] = info.key
    return found


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
        """Every live key's row, in key order, the layers merged (SNAPSHOT_SCHEMA)."""
        full, *deltas = self.manifest.all_layers
        overlay = None
        if deltas:
            changes = [await read_snapshot_file(self.store, f) for d in deltas for f in d.files]
            overlay = await asyncio.to_thread(Overlay, changes)
        for file in full.files:
            table = await read_snapshot_file(self.store, file)
            for batch in table.to_batches():
                if overlay is None:
                    yield batch
                    continue
                for merged in (await asyncio.to_thread(overlay.merge, batch)).to_batches():
                    yield merged
        if overlay is not None:
            for merged in overlay.rest().to_batches():
                yield merged

    async def rows(self) -> AsyncIterator[SnapshotRow]:
        async for batch in self.batches():
            for row in batch_rows(batch):
                yield row

    async def table(self) -> pa.Table:
        """Every row, in one table (key order)."""
        import pyarrow as pa

        from headwater.storage.snapshot_schema import SNAPSHOT_SCHEMA

        batches = [batch async for batch in self.batches()]
        return pa.Table.from_batches(batches, SNAPSHOT_SCHEMA)


class Overlay:
    """The delta layers of a snapshot as one sorted table: the newest row of each changed key,
    deletions included, laid over the full layer's rows batch by batch (`merge`), which must come
    in key order; `rest` gives the changed keys above the last batch. Keys compare as unsigned
    bytes, in Arrow's sort and in Python's `bytes` alike."""

    def __init__(self, deltas: Sequence[pa.Table]) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        from headwater.storage.snapshot_schema import DELTA_SCHEMA

        tables = [DELTA_SCHEMA.empty_table(), *(t.cast(DELTA_SCHEMA) for t in deltas)]
        changes = pa.concat_tables(tables).combine_chunks()
        changes = changes.sort_by([("key", "ascending"), ("offset", "descending")])
        keys = changes.column("key")
        if len(changes) > 1:  # the first row of each key is its newest
            differs = pc.not_equal(keys.slice(1), keys.slice(0, len(changes) - 1))
            changes = changes.filter(pa.concat_arrays([pa.array([True]), differs.combine_chunks()]))
        self._changes = changes
        self._keys: list[bytes] = changes.column("key").to_pylist()
        self._next = 0  # the first change not merged yet

    def merge(self, batch: pa.RecordBatch | pa.Table) -> pa.Table:
        """The full-layer rows of `batch` with the changes up to its last key, live rows only."""
        if batch.num_rows == 0:
            return self._lay(batch, self._next)
        upper = bisect.bisect_right(self._keys, batch.column("key")[-1].as_py(), lo=self._next)
        return self._lay(batch, upper)

    def rest(self) -> pa.Table:
        return self._lay(None, len(self._keys))

    def _lay(self, batch: pa.RecordBatch | pa.Table | None, upper: int) -> pa.Table:
        import pyarrow as pa
        import pyarrow.compute as pc

        from headwater.storage.snapshot_schema import DELTA_SCHEMA

        changes = self._changes.slice(self._next, upper - self._next)
        self._next = upper
        if batch is None:
            return self._live(changes)
        rows = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        if changes.num_rows == 0:
            return rows
        unchanged = rows.filter(pc.invert(pc.is_in(rows.column("key"), changes.column("key"))))
        merged = pa.concat_tables([unchanged.cast(DELTA_SCHEMA), changes])
        return self._live(merged.sort_by("key"))

    @staticmethod
    def _live(rows: pa.Table) -> pa.Table:
        import pyarrow.compute as pc

        from headwater.storage.snapshot_schema import SNAPSHOT_SCHEMA

        return rows.filter(pc.is_valid(rows.column("value"))).cast(SNAPSHOT_SCHEMA)


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
    try:
        data = await store.get(key)
    except ObjectNotFound:  # written before manifests' names started with `_`
        key = legacy_manifest_key(topic, partition, horizon)
        data = await store.get(key)
    manifest = Manifest.decode(key, data)
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

    from headwater.storage.snapshot_schema import DELTA_SCHEMA, SNAPSHOT_SCHEMA

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
    if not table.schema.equals(DELTA_SCHEMA if file.delta else SNAPSHOT_SCHEMA):
        raise StorageError(f"snapshot file {file.key} has schema {table.schema}, not the expected")
    return table
