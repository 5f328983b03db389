"""Delta layers of snapshots without Spark: merging a full layer with its deltas gives what
replaying their rows gives, through the `Overlay` and through real files in a local object store;
manifests with layers encode, decode and are refused when their layers cannot be merged; retention
keeps every directory a kept manifest lists; the job's choice between a delta and a full
snapshot."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.spark_compaction.job import CompactionSettings, takes_delta
from headwater.spark_compaction.manifest import (
    LAYERED_SCHEMA_VERSION,
    Layer,
    Manifest,
    SnapshotFile,
    data_key,
    manifest_key,
    now_iso,
    retention_plan,
)
from headwater.spark_compaction.store import BlockingStore, StoreSpec
from headwater.spark_compaction.writer import write_snapshot_files
from headwater.storage.objectstore import LocalObjectStore, ObjectInfo
from headwater.storage.snapshot_schema import DELTA_SCHEMA, SNAPSHOT_SCHEMA
from headwater.storage.snapshots import Overlay, Snapshot
from headwater.wire.errors import StorageError

State = dict[bytes, tuple[bytes, int]]  # key -> (value, offset)
Changes = dict[bytes, bytes | None]  # key -> new value, None: deleted


def _table(rows: list[tuple[bytes, bytes | None, int]], delta: bool) -> pa.Table:
    rows = sorted(rows)
    return pa.table(
        {
            "topic": ["t"] * len(rows),
            "partition": [0] * len(rows),
            "key": [k for k, _, _ in rows],
            "value": [v for _, v, _ in rows],
            "offset": [o for _, _, o in rows],
            "timestamp": [1_700_000_000_000 + o for _, _, o in rows],
            "headers": [[{"key": "o", "value": str(o).encode()}] for _, _, o in rows],
        },
        schema=DELTA_SCHEMA if delta else SNAPSHOT_SCHEMA,
    )


def _layers(base: dict[bytes, bytes], deltas: list[Changes]) -> tuple[pa.Table, list[pa.Table]]:
    """The full layer and delta tables, offsets rising layer after layer; and the replay."""
    offset = 0
    full = []
    for key, value in base.items():
        full.append((key, value, offset))
        offset += 1
    tables = []
    for changes in deltas:
        rows = []
        for key, value in changes.items():
            rows.append((key, value, offset))
            offset += 1
        tables.append(_table(rows, delta=True))
    return _table(full, delta=False), tables


def _replay(base: dict[bytes, bytes], deltas: list[Changes]) -> dict[bytes, bytes]:
    state = dict(base)
    for changes in deltas:
        for key, value in changes.items():
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    return state


# few and awkward keys, so that deltas hit the full layer's keys, each other's, and the edges of
# its batches: the empty key, 0xff, and keys that are prefixes of others
_keys = st.sampled_from([b"", b"\x00", b"a", b"ab", b"abc", b"b", b"\x7f", b"\x80", b"\xff"]) | (
    st.binary(min_size=1, max_size=3)
)
_values = st.binary(max_size=4).map(lambda v: b"v" + v)


@settings(max_examples=300, deadline=None)
@given(
    base=st.dictionaries(_keys, _values, max_size=30),
    deltas=st.lists(st.dictionaries(_keys, st.none() | _values, max_size=12), max_size=4),
    batch_rows=st.integers(min_value=1, max_value=8),
)
def test_merging_the_layers_equals_replaying_them(
    base: dict[bytes, bytes], deltas: list[Changes], batch_rows: int
) -> None:
    full, changes = _layers(base, deltas)
    overlay = Overlay(changes)
    merged = [overlay.merge(batch) for batch in full.to_batches(max_chunksize=batch_rows)]
    merged.append(overlay.rest())
    table = pa.concat_tables(merged)

    assert table.schema == SNAPSHOT_SCHEMA
    keys = table.column("key").to_pylist()
    assert keys == sorted(set(keys)), "one row per key, in unsigned byte order"
    assert dict(zip(keys, table.column("value").to_pylist(), strict=True)) == _replay(base, deltas)


def _write_layer(
    store: BlockingStore, horizon: int, table: pa.Table, delta: bool, rows_per_file: int
) -> Layer:
    written = write_snapshot_files(
        store,
        {("t", 0): horizon},
        table.to_batches(max_chunksize=3),
        rows_per_file,
        frozenset({("t", 0)}) if delta else frozenset(),
    )
    return Layer(horizon, delta, tuple(f for _, _, f in written))


def _manifest(layers: list[Layer]) -> Manifest:
    *below, own = layers
    return Manifest(
        "t", 0, own.horizon, own.horizon - 1, below[-1].horizon if below else None, own.files,
        sum(f.rows for f in own.files), 0, 0, 0, 0, now_iso(),
        schema_version=LAYERED_SCHEMA_VERSION if own.delta else 1,
        delta=own.delta, layers=tuple(below),
    )  # fmt: skip


async def test_a_snapshot_read_from_its_files_merges_its_layers(tmp_path: Path) -> None:
    base = {f"key-{i:03d}".encode(): f"base-{i}".encode() for i in range(40)}
    deltas: list[Changes] = [
        {b"key-000": None, b"key-005": b"new-5", b"key-039": None, b"key-100": b"added"},
        {b"key-005": None, b"key-100": b"added again", b"a-first": b"before every key"},
    ]
    full, changes = _layers(base, deltas)

    def write() -> list[Layer]:
        with BlockingStore(StoreSpec.local(tmp_path)) as store:
            layers = [_write_layer(store, 40, full, delta=False, rows_per_file=7)]
            horizon = 40
            for table in changes:
                horizon += table.num_rows
                layers.append(_write_layer(store, horizon, table, delta=True, rows_per_file=2))
        return layers

    layers = await asyncio.to_thread(write)
    manifest = _manifest(layers)
    assert Manifest.decode("m", manifest.encode()) == manifest
    assert [f.key.rsplit("/", 1)[1] for f in manifest.files] == [
        "delta-00000.parquet",
        "delta-00001.parquet",
    ]
    assert all(f.delta for f in manifest.files) and not any(f.delta for f in layers[0].files)

    snapshot = Snapshot(LocalObjectStore(tmp_path), manifest)
    rows = [row async for row in snapshot.rows()]
    expected = _replay(base, deltas)
    assert [r.key for r in rows] == sorted(expected)
    assert {r.key: r.value for r in rows} == expected
    assert {r.key: r.headers for r in rows}[b"key-100"] == (("o", b"%d" % (40 + 4 + 1)),)
    table = await snapshot.table()
    assert table.column("key").to_pylist() == sorted(expected)
    assert manifest.rows_to_read == 40 + 4 + 3


def test_a_full_manifest_is_written_as_before_deltas_and_a_delta_one_says_version_2() -> None:
    full = _manifest([Layer(10, False, (SnapshotFile(data_key("t", 0, 10, 0), 5, 100),))])
    document = json.loads(full.encode())
    assert document["schema_version"] == 1 and "layers" not in document and "delta" not in document
    assert Manifest.decode("m", full.encode()) == full

    own = Layer(20, True, (SnapshotFile(data_key("t", 0, 20, 0, delta=True), 2, 50),))
    delta = _manifest([*full.all_layers, own])
    document = json.loads(delta.encode())
    assert document["schema_version"] == LAYERED_SCHEMA_VERSION and document["delta"] is True
    assert [layer["horizon"] for layer in document["layers"]] == [10]
    assert Manifest.decode("m", delta.encode()) == delta


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema_version": 1}, "schema version 1"),
        ({"layers": ()}, "lowest layer is a delta"),
        ("full file in the delta", "a layer lists a file of the other kind"),
        ("horizons", "do not rise"),
        ("two full layers", "a full layer lies over another layer"),
    ],
)
def test_a_manifest_whose_layers_cannot_be_merged_is_refused(
    change: dict[str, object] | str, message: str
) -> None:
    full = Layer(10, False, (SnapshotFile(data_key("t", 0, 10, 0), 5, 100),))
    own = Layer(20, True, (SnapshotFile(data_key("t", 0, 20, 0, delta=True), 2, 50),))
    manifest = _manifest([full, own])
    if change == "full file in the delta":
        manifest = dataclasses.replace(
            manifest, files=(SnapshotFile(data_key("t", 0, 20, 0), 2, 50),)
        )
    elif change == "horizons":
        manifest = dataclasses.replace(manifest, layers=(dataclasses.replace(full, horizon=30),))
    elif change == "two full layers":
        manifest = dataclasses.replace(manifest, layers=(full, full))
    else:
        assert isinstance(change, dict)
        manifest = dataclasses.replace(manifest, **change)  # type: ignore[arg-type]
    with pytest.raises(StorageError, match=message):
        Manifest.decode("snapshots/t/0/manifest.json", manifest.encode())


def test_retention_keeps_the_layers_a_kept_manifest_lies_over() -> None:
    full = Layer(10, False, (SnapshotFile(data_key("t", 0, 10, 0), 5, 100),))
    first = Layer(20, True, (SnapshotFile(data_key("t", 0, 20, 0, delta=True), 1, 10),))
    second = Layer(30, True, (SnapshotFile(data_key("t", 0, 30, 0, delta=True), 1, 10),))
    manifests = {
        10: dataclasses.replace(_manifest([full]), created_at=now_iso(1000)),
        20: dataclasses.replace(_manifest([full, first]), created_at=now_iso(2000)),
        30: dataclasses.replace(_manifest([full, first, second]), created_at=now_iso(3000)),
    }
    keys = [manifest_key("t", 0, h) for h in manifests] + [
        f.key for layer in (full, first, second) for f in layer.files
    ]
    listing = [ObjectInfo(k, 1) for k in keys]

    plan = retention_plan("t", 0, listing, manifests, retention=0, now=10**10)
    # the manifests at 10 and 20 go; their files stay: the newest manifest reads them
    assert plan.manifests == [manifest_key("t", 0, 10), manifest_key("t", 0, 20)]
    assert plan.files == []

    # a full snapshot at 40 supersedes the chain: once it is old enough, all of it goes
    manifests[40] = dataclasses.replace(
        _manifest([Layer(40, False, (SnapshotFile(data_key("t", 0, 40, 0), 5, 100),))]),
        created_at=now_iso(4000),
    )
    listing += [ObjectInfo(manifest_key("t", 0, 40), 1), ObjectInfo(data_key("t", 0, 40, 0), 1)]
    plan = retention_plan("t", 0, listing, manifests, retention=500, now=4200)
    assert plan.manifests == [manifest_key("t", 0, 10), manifest_key("t", 0, 20)]
    assert plan.files == []  # the manifest at 30 is kept (superseded 200 s ago), with its layers
    plan = retention_plan("t", 0, listing, manifests, retention=500, now=4600)
    assert plan.manifests == [manifest_key("t", 0, h) for h in (10, 20, 30)]
    assert plan.files == sorted(f.key for layer in (full, first, second) for f in layer.files)


def test_a_run_writes_a_delta_while_the_deltas_stay_small_beside_the_full_layer() -> None:
    settings = CompactionSettings(StoreSpec.local("/nowhere"), delta_ratio=0.25, max_deltas=2)
    full = Layer(10, False, (SnapshotFile(data_key("t", 0, 10, 0), 100, 1000),))
    first = Layer(20, True, (SnapshotFile(data_key("t", 0, 20, 0, delta=True), 20, 100),))
    second = Layer(30, True, (SnapshotFile(data_key("t", 0, 30, 0, delta=True), 1, 10),))

    assert not takes_delta(None, 1, settings)  # a first snapshot is full
    assert takes_delta(_manifest([full]), 25, settings)
    assert not takes_delta(_manifest([full]), 26, settings)
    assert takes_delta(_manifest([full, first]), 5, settings)  # 20 + 5 of 100
    assert not takes_delta(_manifest([full, first]), 6, settings)
    assert not takes_delta(_manifest([full, first, second]), 0, settings)  # max_deltas
    assert not takes_delta(_manifest([full]), 0, dataclasses.replace(settings, delta_ratio=0))
    empty = Layer(10, False, ())
    assert not takes_delta(_manifest([empty]), 1, settings)  # nothing to lie over
