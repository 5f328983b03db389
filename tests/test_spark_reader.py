"""Compaction's parts that need no cluster: decoding segment objects (every codec, corrupt data),
finding them among other objects, the row schemas Spark checks, retention, and the snapshot loader
the server will use. One test reads the WAL through the Spark data source itself."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from headwater.spark_compaction.history import (
    Entry,
    Written,
    generate,
    transactional,
    write_batches,
    write_segments,
)
from headwater.spark_compaction.loader import load_snapshot
from headwater.spark_compaction.manifest import (
    Manifest,
    SnapshotFile,
    data_key,
    manifest_key,
    now_iso,
    retention_plan,
)
from headwater.spark_compaction.schema import WAL_DDL, WAL_SCHEMA
from headwater.spark_compaction.store import BlockingStore, StoreSpec
from headwater.spark_compaction.wal_segments import (
    Folder,
    decode_group,
    decode_segment,
    list_segments,
)
from headwater.spark_compaction.writer import encode_parquet
from headwater.storage.objectstore import LocalObjectStore, ObjectInfo
from headwater.wire.errors import StorageError
from headwater.wire.records import BATCH_HEADER_SIZE


def _rows(store: BlockingStore, topic: str) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for segment in list_segments(store, [topic]):
        for batch in decode_segment(segment, store.get(segment.key)):
            rows.extend(batch.to_pylist())
    return rows


def _expected(entries: list[Entry], start: int = 0) -> list[tuple[object, ...]]:
    return [
        (start + i, e.timestamp, e.key, e.value, [{"key": k, "value": v} for k, v in e.headers])
        for i, e in enumerate(entries)
    ]


def _record_tuples(rows: list[dict[str, object]]) -> list[tuple[object, ...]]:
    return [(r["offset"], r["timestamp"], r["key"], r["value"], r["headers"]) for r in rows]


def test_segments_decode_to_every_record_with_every_codec(tmp_path: Path) -> None:
    entries = list(generate(700, 50, seed=3))
    with BlockingStore(StoreSpec.local(tmp_path)) as store:
        end = write_segments(store, "orders", 0, entries, batch_records=20, segment_batches=7)
        rows = _rows(store, "orders")
        segments = list_segments(store, ["orders"])
    assert end == 700
    assert len(segments) == 5  # 35 batches, 7 per segment, each batch codec in turn
    assert _record_tuples(rows) == _expected(entries)
    assert all(r["topic"] == "orders" and r["partition"] == 0 for r in rows)
    assert all(r["corrupt"] is None for r in rows)
    assert any(r["key"] is None for r in rows) and any(r["value"] is None for r in rows)


def test_corrupt_batch_is_skipped_and_reported_not_raised(tmp_path: Path) -> None:
    entries = list(generate(100, 20, seed=4))
    with BlockingStore(StoreSpec.local(tmp_path)) as store:
        write_segments(store, "t", 0, entries, batch_records=10, segment_batches=10)
        (segment,) = list_segments(store, ["t"])
        data = bytearray(store.get(segment.key))
    # the second batch: flip a byte of its records, which its CRC-32C covers
    first_length = 12 + int.from_bytes(data[8:12], "big")
    data[first_length + BATCH_HEADER_SIZE + 3] ^= 0xFF
    rows = [r for b in decode_segment(segment, bytes(data)) for r in b.to_pylist()]
    problems = [r for r in rows if r["corrupt"] is not None]
    assert len(problems) == 1
    assert f"{segment.key} at byte {first_length}" in problems[0]["corrupt"]
    assert "CRC" in problems[0]["corrupt"]
    good = [r for r in rows if r["corrupt"] is None]
    assert [r["offset"] for r in good] == [*range(10), *range(20, 100)]

    # a length field that runs past the end: the rest of the segment cannot be framed
    truncated = bytes(data[: first_length + 100])
    rows = [r for b in decode_segment(segment, truncated) for r in b.to_pylist()]
    assert [r["offset"] for r in rows if r["corrupt"] is None] == list(range(10))
    assert "the rest of the segment is skipped" in rows[-1]["corrupt"]
    # a tail shorter than a batch header
    rows = [
        r for b in decode_segment(segment, bytes(data[: first_length + 7])) for r in b.to_pylist()
    ]
    assert "trailing bytes" in rows[-1]["corrupt"]


def test_a_flipped_length_byte_costs_its_batch_not_the_rest_of_the_segment(
    tmp_path: Path,
) -> None:
    """The walk resynchronises past damage as the server's readers do (it gave up on the rest of
    the segment before, losing 80 intact records here)."""
    entries = list(generate(100, 20, seed=4))
    with BlockingStore(StoreSpec.local(tmp_path)) as store:
        write_segments(store, "t", 0, entries, batch_records=10, segment_batches=10)
        (segment,) = list_segments(store, ["t"])
        data = bytearray(store.get(segment.key))
    first_length = 12 + int.from_bytes(data[8:12], "big")
    data[first_length + 10] ^= 0x40  # the second batch's length field
    rows = [r for b in decode_segment(segment, bytes(data)) for r in b.to_pylist()]
    assert [r["offset"] for r in rows if r["corrupt"] is None] == [*range(10), *range(20, 100)]
    (problem,) = [r["corrupt"] for r in rows if r["corrupt"] is not None]
    assert problem.startswith(f"{segment.key} at byte {first_length}: ")
    assert "bytes skipped up to the next valid batch" in problem


def test_records_below_the_from_offset_are_left_out(tmp_path: Path) -> None:
    entries = list(generate(60, 10, seed=5))
    with BlockingStore(StoreSpec.local(tmp_path)) as store:
        write_segments(store, "t", 2, entries, start_offset=1000, batch_records=25)
        (segment,) = list_segments(store, ["t"])
        rows = [
            r for b in decode_segment(segment, store.get(segment.key), 1030) for r in b.to_pylist()
        ]
    assert [r["offset"] for r in rows] == list(range(1030, 1060))


def test_listing_finds_only_segment_objects(tmp_path: Path) -> None:
    with BlockingStore(StoreSpec.local(tmp_path)) as store:
        write_segments(store, "a", 0, list(generate(10, 5)), batch_records=5, segment_batches=1)
        write_segments(store, "snapshots", 1, list(generate(5, 5)))  # a topic may be so named
        for key in (
            "a/0/00000000000000000000.index",
            "a/0/quarantine/00000000000000000005.log",
            "a/x/00000000000000000000.log",
            "a/0/123.log",
            "snapshots/a/0/00000000000000000010/part-00000.parquet",
            "snapshots/a/0/manifest-00000000000000000010.json",
            "snapshots/a/0/_manifest-00000000000000000010.json",
        ):
            store.put(key, b"not a segment")
        every = [(s.topic, s.partition, s.base_offset) for s in list_segments(store)]
        only_a = [(s.topic, s.partition, s.base_offset) for s in list_segments(store, ["a"])]
    assert every == [("a", 0, 0), ("a", 0, 5), ("snapshots", 1, 0)]
    assert only_a == [("a", 0, 0), ("a", 0, 5)]


def test_arrow_schemas_are_the_ones_spark_derives(spark: object) -> None:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import _parse_datatype_string

    from headwater.spark_compaction.source import SNAPSHOT_READ_DDL, SNAPSHOT_READ_SCHEMA

    assert to_arrow_schema(_parse_datatype_string(WAL_DDL), timezone="UTC") == WAL_SCHEMA
    assert (
        to_arrow_schema(_parse_datatype_string(SNAPSHOT_READ_DDL), timezone="UTC")
        == SNAPSHOT_READ_SCHEMA
    )


def _listing(*keys: str) -> list[ObjectInfo]:
    return [ObjectInfo(k, 1) for k in keys]


def test_retention_never_removes_the_newest_snapshot() -> None:
    keys = [
        manifest_key("t", 0, 10),
        data_key("t", 0, 10, 0),
        manifest_key("t", 0, 20),
        data_key("t", 0, 20, 0),
        data_key("t", 0, 25, 0),  # a run that crashed before its manifest
        manifest_key("t", 0, 30),
        data_key("t", 0, 30, 0),
        data_key("t", 0, 30, 1),
        data_key("t", 0, 40, 0),  # a run in progress
    ]
    created = {
        h: Manifest("t", 0, h, 0, None, (), 0, 0, 0, 0, 0, now_iso(at))
        for h, at in ((10, 1000.0), (20, 2000.0), (30, 3000.0))
    }
    plan = retention_plan("t", 0, _listing(*keys), created, retention=500, now=2600)
    assert plan.manifests == [manifest_key("t", 0, 10)]  # superseded at 2000, 600 s ago
    assert plan.files == [data_key("t", 0, 10, 0)]
    plan = retention_plan("t", 0, _listing(*keys), created, retention=500, now=3500)
    assert plan.manifests == [manifest_key("t", 0, 10), manifest_key("t", 0, 20)]
    assert plan.files == [data_key("t", 0, h, 0) for h in (10, 20, 25)]
    plan = retention_plan("t", 0, _listing(*keys), created, retention=0, now=10**10)
    assert manifest_key("t", 0, 30) not in plan.manifests
    assert not {data_key("t", 0, 30, 0), data_key("t", 0, 30, 1), data_key("t", 0, 40, 0)} & set(
        plan.files
    )


def _snapshot_table(keys: list[bytes], offset: int) -> pa.Table:
    return pa.table(
        {
            "topic": ["t"] * len(keys),
            "partition": [0] * len(keys),
            "key": keys,
            "value": [b"value-" + k for k in keys],
            "offset": list(range(offset, offset + len(keys))),
            "timestamp": [1_700_000_000_000] * len(keys),
            "headers": [[{"key": "h", "value": b"1"}]] + [[]] * (len(keys) - 1),
        }
    )


def _put_snapshot(store: BlockingStore, horizon: int, keys: list[bytes]) -> Manifest:
    data = encode_parquet(_snapshot_table(keys, horizon - len(keys)))
    key = data_key("t", 0, horizon, 0)
    store.put(key, data)
    manifest = Manifest(
        "t", 0, horizon, 0, None, (SnapshotFile(key, len(keys), len(data)),), len(keys),
        len(keys), 0, 0, 0, now_iso(),
    )  # fmt: skip
    assert store.put_if_absent(manifest_key("t", 0, horizon), manifest.encode())
    return manifest


async def test_loader_reads_the_newest_committed_snapshot(tmp_path: Path) -> None:
    spec = StoreSpec.local(tmp_path)
    store = LocalObjectStore(tmp_path)
    assert await load_snapshot(store, "t", 0) is None

    def prepare() -> None:
        with BlockingStore(spec) as blocking:
            _put_snapshot(blocking, 100, [b"a", b"b"])
            _put_snapshot(blocking, 200, [b"a", b"c", b"d"])
            # files of a later run that never wrote its manifest: not visible
            blocking.put(data_key("t", 0, 300, 0), b"garbage")

    await asyncio.to_thread(prepare)
    snapshot = await load_snapshot(store, "t", 0)
    assert snapshot is not None and snapshot.horizon == 200
    rows = [row async for row in snapshot.rows()]
    assert [(r.key, r.value, r.offset) for r in rows] == [
        (b"a", b"value-a", 197),
        (b"c", b"value-c", 198),
        (b"d", b"value-d", 199),
    ]
    assert rows[0].headers == (("h", b"1"),) and rows[1].headers == ()

    # a file that does not match its manifest is an error, never a partial snapshot
    await store.put(data_key("t", 0, 200, 0), encode_parquet(_snapshot_table([b"a"], 5)))
    snapshot = await load_snapshot(store, "t", 0)
    assert snapshot is not None
    with pytest.raises(StorageError, match="its manifest says"):
        _ = [row async for row in snapshot.rows()]


def test_wal_data_source_yields_every_record(spark: object, tmp_path: Path) -> None:
    entries = {p: list(generate(400, 30, seed=p)) for p in range(2)}
    spec = StoreSpec.local(tmp_path)
    with BlockingStore(spec) as store:
        for partition, records in entries.items():
            write_segments(store, "events", partition, records, batch_records=15)
        write_segments(store, "other", 0, list(generate(50, 5)))
    frame = (
        spark.read.format("headwater_wal")  # type: ignore[attr-defined]
        .option("store", spec.to_json())
        .option("topics", "events")
        .option("group_bytes", "4000")  # several input partitions per topic partition
        .load()
    )
    assert frame.rdd.getNumPartitions() > 4
    rows = sorted(frame.collect(), key=lambda r: (r.partition, r.offset))
    for partition, records in entries.items():
        got = [r for r in rows if r.partition == partition]
        assert [(r.offset, r.timestamp, r.key, r.value) for r in got] == [
            (o, e.timestamp, e.key, e.value) for o, e in enumerate(records)
        ]
        assert [tuple((h.key, h.value) for h in r.headers) for r in got] == [
            e.headers for e in records
        ]
    assert {r.topic for r in rows} == {"events"}


@pytest.mark.parametrize("max_keys", [5, 1_000_000])
def test_folder_keeps_the_newest_record_per_key_and_counts_records(
    tmp_path: Path, max_keys: int
) -> None:
    entries = list(generate(500, 30, seed=6))
    with BlockingStore(StoreSpec.local(tmp_path)) as store:
        write_segments(store, "t", 0, entries, batch_records=20, segment_batches=5)
        segments = list_segments(store, ["t"])
        folder = Folder(segments[0], max_keys=max_keys)
        rows = []
        for segment in segments:
            for batch in folder.add(segment, store.get(segment.key), from_offset=40):
                rows.extend(batch.to_pylist())
        rows.extend(r for batch in folder.finish() for r in batch.to_pylist())
    (info,) = [r for r in rows if r["aborted"] is not None]  # the task's row about itself
    assert (info["key"], info["offset"], info["records"]) == (None, 499, 0)
    assert (info["aborted"], info["undecided"]) == (0, None)
    rows.remove(info)
    assert len(rows) > 31 if max_keys == 5 else len(rows) == 31  # 30 keys and the keyless row
    newest: dict[object, dict[str, object]] = {}
    counts: dict[object, int] = {}
    for row in rows:  # what Spark's fold does with the pieces
        if row["key"] not in newest or row["offset"] > newest[row["key"]]["offset"]:
            newest[row["key"]] = row
        counts[row["key"]] = counts.get(row["key"], 0) + row["records"]
    kept = entries[40:]
    assert sum(counts.values()) == len(kept)
    assert counts[None] == sum(e.key is None for e in kept)
    last = {e.key: (40 + i, e.value) for i, e in enumerate(kept)}
    assert {k: (r["offset"], r["value"]) for k, r in newest.items() if k is not None} == {
        k: v for k, v in last.items() if k is not None
    }
    assert newest[None]["offset"] == last[None][0] and newest[None]["value"] is None


def test_a_clusters_partition_is_read_through_its_manifest(tmp_path: Path) -> None:
    """Two owners uploaded objects starting at offset 0 ([0, 60) and [0, 100)), and a third
    upload of an owner that lost the partition was never named: compaction reads each offset
    once, from the objects the newest manifest version names (the larger object replaced the
    one it holds entirely when it was named), never from the unnamed one."""
    from headwater.storage.partition_manifest import Manifest as PartitionManifest
    from headwater.storage.partition_manifest import SegmentEntry, manifest_prefix

    entries = list(generate(100, 20, seed=9))
    with BlockingStore(StoreSpec.local(tmp_path / "staging")) as staging:
        write_segments(staging, "t", 0, entries[:60], batch_records=10, segment_batches=6)
        write_segments(staging, "u", 0, entries, batch_records=10, segment_batches=10)
        short = staging.get(list_segments(staging, ["t"])[0].key)
        long = staging.get(list_segments(staging, ["u"])[0].key)
    with BlockingStore(StoreSpec.local(tmp_path / "store")) as store:
        store.put("t/0/00000000000000000000-00000000000000000003-aa.log", short)
        store.put("t/0/00000000000000000000-00000000000000000007-bb.log", long)
        store.put("t/0/00000000000000000000-00000000000000000005-cc.log", long[: len(long) // 2])
        manifest = PartitionManifest(1, 7, ()).adding(
            SegmentEntry(0, 60, 0, "t/0/00000000000000000000-00000000000000000003-aa", len(short))
        )
        manifest = manifest.adding(
            SegmentEntry(0, 100, 0, "t/0/00000000000000000000-00000000000000000007-bb", len(long))
        )
        store.put(f"{manifest_prefix('t', 0)}{1:020d}", manifest.encode())
        segments = list_segments(store, ["t"])
        assert [(s.base_offset, s.name[-2:]) for s in segments] == [(0, "bb")]
        assert [r["offset"] for r in _rows(store, "t")] == list(range(100))


_REPR_PROBE = """
import signal, sys
from headwater.spark_compaction.store import BlockingStore, StoreSpec

# a PySpark worker's main thread: the default SIGINT handler
signal.signal(signal.SIGINT, signal.default_int_handler)
store = BlockingStore(StoreSpec.local(sys.argv[1]))
store.put("big", b"x" * 1_000_000)
reprs = 0

def count(frame, event, arg):
    global reprs
    if event == "c_call" and arg is repr:
        reprs += 1

sys.setprofile(count)
data = store.get("big")
sys.setprofile(None)
store.close()
print(reprs, len(data))
"""


def test_reading_an_object_never_builds_the_repr_of_what_it_read(tmp_path: Path) -> None:
    """On Python 3.11, asyncio.Runner in a main thread with the default SIGINT handler built
    the repr of each call's finished task, result included: for a 64 MiB segment, more CPU than
    decoding it (docs/BENCHMARKS.md). A worker reads every segment through BlockingStore."""
    result = subprocess.run(
        [sys.executable, "-c", _REPR_PROBE, str(tmp_path / "objects")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.split() == ["0", "1000000"], result.stdout + result.stderr


def _visible(history: list[Written], bases: list[int], below: int | None = None) -> list[tuple]:
    """The reference: the records the generator committed or wrote plainly, by offset."""
    found = []
    for written, base in zip(history, bases, strict=True):
        if written.visible:
            found.extend((base + i, e.key, e.value) for i, e in enumerate(written.entries))
    return [r for r in found if below is None or r[0] < below]


def _transactional_store(tmp_path: Path) -> tuple[BlockingStore, list[Written], list[int], int]:
    history = transactional(1500, 40, seed=11, producers=3, left_open=1)
    store = BlockingStore(StoreSpec.local(tmp_path))
    bases = write_batches(store, "t", 0, history, segment_batches=5)
    first_open = min(b for w, b in zip(history, bases, strict=True) if w.outcome == "open")
    assert {w.outcome for w in history} == {
        "plain",
        "committed",
        "aborted",
        "open",
        "commit",
        "abort",
    }
    return store, history, bases, first_open


@pytest.mark.parametrize("per_group", [1, 3, 1000])
def test_the_raw_reader_sees_committed_records_only_however_segments_are_grouped(
    tmp_path: Path, per_group: int
) -> None:
    """Markers are never rows, aborted and still open transactions' records neither, and a
    transaction a group boundary cuts is decided by reading the next segments' headers."""
    store, history, bases, _ = _transactional_store(tmp_path)
    with store:
        segments = list_segments(store, ["t"])
        rows = []
        for start in range(0, len(segments), per_group):
            group = segments[start : start + per_group]
            following = segments[start + per_group :]
            batches = decode_group(
                ((s, store.get(s.key)) for s in group),
                0,
                ((s, store.get(s.key)) for s in following),
            )
            rows.extend(r for b in batches for r in b.to_pylist())
    assert all(r["corrupt"] is None for r in rows)
    assert [(r["offset"], r["key"], r["value"]) for r in rows] == _visible(history, bases)


@pytest.mark.parametrize("until", [False, True])
def test_the_folder_folds_below_the_first_open_transaction_only(
    tmp_path: Path, until: bool
) -> None:
    """Alone, it finds the open transaction, holds back everything from it on and reports where
    it begins; told to stop there (the job's second pass), it folds the same, every transaction
    below decided by markers past the stop."""
    store, history, bases, first_open = _transactional_store(tmp_path)
    with store:
        segments = list_segments(store, ["t"])
        folder = Folder(segments[0], until=first_open if until else None)
        rows = []
        for segment in segments:
            rows.extend(
                r for b in folder.add(segment, store.get(segment.key), 0) for r in b.to_pylist()
            )
        rows.extend(r for b in folder.finish() for r in b.to_pylist())
    (info,) = [r for r in rows if r["aborted"] is not None]
    below = _visible(history, bases, first_open)
    aborted = sum(
        len(w.entries)
        for w, b in zip(history, bases, strict=True)
        if w.outcome == "aborted" and b < first_open
    )
    assert info["undecided"] == (None if until else first_open)
    assert info["aborted"] == aborted > 0
    # the last batch followed, a marker here (alone), or the last one below the stop
    assert info["offset"] == (first_open - 1 if until else bases[-1])
    newest = {key: (offset, value) for offset, key, value in below if key is not None}
    folded = {r["key"]: (r["offset"], r["value"]) for r in rows if r["key"] is not None}
    assert folded == newest
    assert sum(r["records"] for r in rows) == len(below)


def test_columns_keep_the_offsets_of_their_range_with_each_records_headers() -> None:
    """A batch cut by the range at both ends (a task's first and last FETCHed batches) keeps its
    records in [low, high) only, each with its own headers, after what the columns held."""
    from headwater.spark_compaction.wal_segments import Columns
    from headwater.wire.records import build_batch

    items = [(b"k%d" % i, b"v%d" % i, [("n", b"%d" % i)] if i % 2 else []) for i in range(6)]
    columns = Columns()
    columns.add(build_batch(items[:2], base_offset=0, timestamp=5))
    columns.add(build_batch(items, base_offset=100, timestamp=7), low=102, high=105)
    rows = columns.take("t", 3).to_pylist()
    assert len(columns) == 0
    assert [(r["offset"], r["key"], r["timestamp"], r["partition"]) for r in rows] == [
        (0, b"k0", 5, 3),
        (1, b"k1", 5, 3),
        (102, b"k2", 7, 3),
        (103, b"k3", 7, 3),
        (104, b"k4", 7, 3),
    ]
    assert [r["headers"] for r in rows] == [
        [],
        [{"key": "n", "value": b"1"}],
        [],
        [{"key": "n", "value": b"3"}],
        [],
    ]
