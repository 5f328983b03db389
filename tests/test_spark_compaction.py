"""The compaction job on the shared local[2] Spark session: its snapshots equal a plain-Python fold
of the same records, incremental runs equal one run, a run killed before its manifest is invisible
and a rerun gives the same manifest and files, corrupt batches are skipped and reported; on a
local directory and on S3 (moto's standalone server)."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pyarrow.parquet as pq
import pytest

from headwater.spark_compaction.history import (
    Entry,
    Written,
    generate,
    transactional,
    write_batches,
    write_segments,
)
from headwater.spark_compaction.job import CompactionSettings, apply_retention, compute, plan, run
from headwater.spark_compaction.loader import load_snapshot
from headwater.spark_compaction.manifest import Manifest, manifest_horizons
from headwater.spark_compaction.source import DEFAULT_GROUP_BYTES
from headwater.spark_compaction.store import BlockingStore, StoreSpec, open_store
from headwater.spark_compaction.wal_segments import list_segments
from headwater.wire.records import Compression
from tests.support.s3 import MotoS3, create_bucket

Folded = dict[bytes, tuple[bytes, int, int, tuple[tuple[str, bytes | None], ...]]]


def python_fold(entries: list[Entry], state: Folded | None = None, start: int = 0) -> Folded:
    """The reference: replay every record in offset order; the last value of a key stays."""
    folded = dict(state or {})
    for offset, entry in enumerate(entries, start):
        if entry.key is None:
            continue
        if entry.value is None:
            folded.pop(entry.key, None)
        else:
            folded[entry.key] = (entry.value, offset, entry.timestamp, entry.headers)
    return folded


def snapshot(spec: StoreSpec, topic: str, partition: int) -> tuple[int, Folded]:
    async def load() -> tuple[int, Folded]:
        store = await open_store(spec)
        try:
            loaded = await load_snapshot(store, topic, partition)
            assert loaded is not None, f"no snapshot of {topic}/{partition}"
            rows = [row async for row in loaded.rows()]
        finally:
            await store.close()
        keys = [r.key for r in rows]
        assert keys == sorted(keys), "snapshot rows are in key order"
        return loaded.horizon, {r.key: (r.value, r.offset, r.timestamp, r.headers) for r in rows}

    return asyncio.run(load())


def session(spark: Any) -> Any:
    return lambda: spark


@pytest.fixture(params=["local", "s3"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreSpec]:
    if request.param == "local":
        yield StoreSpec.local(tmp_path / "objects")
        return
    s3: MotoS3 = request.getfixturevalue("s3")
    bucket = "spark-" + re.sub(r"[^a-z0-9]", "-", request.node.name.lower())[-40:].strip("-")
    asyncio.run(create_bucket(s3, bucket))
    yield StoreSpec("s3", bucket=bucket, prefix="wal", endpoint_url=s3.endpoint_url)


def _history(seed: int, count: int) -> dict[int, list[Entry]]:
    return {p: list(generate(count, 250, seed=seed * 10 + p)) for p in range(3)}


def _write(spec: StoreSpec, topic: str, history: dict[int, list[Entry]], start: int = 0) -> None:
    with BlockingStore(spec) as store:
        for partition, entries in history.items():
            write_segments(store, topic, partition, entries, start_offset=start, batch_records=40)


def test_snapshot_equals_a_python_fold_of_the_history(spark: Any, any_store: StoreSpec) -> None:
    history = _history(1, 2400)  # 60 batches per partition, 8 segments, every codec
    _write(any_store, "orders", history)
    _write(any_store, "ignored", {0: list(generate(30, 5))})

    summary = run(session(spark), CompactionSettings(any_store, ("orders",), rows_per_file=100))

    everything = [e for entries in history.values() for e in entries]
    expected = {p: python_fold(entries) for p, entries in history.items()}
    assert summary.segments == 24
    assert summary.records_in == len(everything)
    assert summary.keyless_skipped == sum(e.key is None for e in everything)
    assert summary.keys_out == sum(len(f) for f in expected.values())
    tombstoned = {
        p: {e.key for e in entries if e.key is not None} - set(expected[p])
        for p, entries in history.items()
    }
    assert summary.tombstones_dropped == sum(len(t) for t in tombstoned.values()) > 0
    assert summary.corrupt_batches == 0
    for partition, folded in expected.items():
        horizon, rows = snapshot(any_store, "orders", partition)
        assert horizon == 2400
        assert rows == folded
    assert all(s["files"] == 3 for s in summary.snapshots)  # ~240 keys, 100 rows a file
    with BlockingStore(any_store) as store:
        assert manifest_horizons(store.list("snapshots/ignored/")) == []

    if any_store.backend == "local":  # plain Parquet: pyarrow and Spark SQL read it as it is
        directory = Path(any_store.path) / "snapshots/orders/0/00000000000000002400"
        table = pq.read_table(directory)
        assert sorted(table.column("key").to_pylist()) == sorted(expected[0])
        assert spark.read.parquet(str(directory)).count() == len(expected[0])


def test_two_runs_with_writes_between_equal_one_run(spark: Any, tmp_path: Path) -> None:
    first, second = _history(2, 1200), _history(3, 800)
    twice, once = StoreSpec.local(tmp_path / "twice"), StoreSpec.local(tmp_path / "once")
    settings = CompactionSettings(twice, retention=3600)

    _write(twice, "t", first)
    run(session(spark), settings)
    _write(twice, "t", second, start=1200)
    summary = run(session(spark), settings)
    assert summary.segments == 3 * 3  # only the new segments were read
    assert summary.records_in == 3 * 800

    _write(once, "t", first)
    _write(once, "t", second, start=1200)
    run(session(spark), CompactionSettings(once))

    for partition in range(3):
        expected = python_fold(first[partition] + second[partition])
        assert snapshot(twice, "t", partition) == (2000, expected)
        assert snapshot(once, "t", partition) == (2000, expected)

    # nothing new: nothing read, no new manifest, Spark not even asked for
    summary = run(lambda: pytest.fail("no Spark session needed"), settings)
    assert (summary.segments, summary.snapshots) == (0, [])

    # both snapshots are kept until the superseded one has been so for `retention` seconds
    with BlockingStore(twice) as store:
        assert manifest_horizons(store.list("snapshots/t/0/")) == [1200, 2000]
        assert apply_retention(store, (), retention=3600) == 0
        assert apply_retention(store, ("t",), retention=0) == 3 * 2  # manifest and file each
        assert manifest_horizons(store.list("snapshots/t/0/")) == [2000]
        assert [i.key for i in store.list("snapshots/t/0/00000000000000001200/")] == []
    assert snapshot(twice, "t", 0) == (2000, python_fold(first[0] + second[0]))


@pytest.mark.parametrize("one_task", [True, False], ids=["one_task", "spark_fold"])
def test_small_runs_write_deltas_that_read_like_one_full_fold(
    spark: Any, tmp_path: Path, one_task: bool
) -> None:
    """Runs over a trickle write only the keys that changed (deletions included), laid over the
    full snapshot; readers merge the layers; a run past `max_deltas` folds everything into a new
    full snapshot; retention then keeps nothing the newest snapshot does not read. The same
    whether each partition is done by one task (one_task.py; the full merge then goes through
    the Spark fold) or every partition through the Spark fold."""
    spec = StoreSpec.local(tmp_path)
    settings = CompactionSettings(
        spec, rows_per_file=100, delta_ratio=0.25, max_deltas=2, one_task=one_task
    )
    histories = [_history(6, 2400)]
    _write(spec, "t", histories[0])
    first = run(session(spark), settings)
    assert [s["delta"] for s in first.snapshots] == [False] * 3
    offset = 2400
    for round_, (count, delta) in enumerate([(30, True), (20, True), (20, False)]):
        new = {p: list(generate(count, 250, seed=100 + 10 * round_ + p)) for p in range(3)}
        _write(spec, "t", new, start=offset)
        with BlockingStore(spec) as store:
            new_bytes = sum(s.size for s in list_segments(store, ["t"]) if s.base_offset >= offset)
        offset += count
        histories.append(new)

        summary = run(session(spark), settings)

        assert [s["delta"] for s in summary.snapshots] == [delta] * 3
        assert [s["layers"] for s in summary.snapshots] == [round_ + 2 if delta else 1] * 3
        expected = {p: python_fold([e for h in histories for e in h[p]]) for p in range(3)}
        for partition in range(3):
            assert snapshot(spec, "t", partition) == (offset, expected[partition])
        if delta:  # only the new segments read, only the changed keys written
            assert summary.bytes_read == new_bytes
            assert summary.keys_out == sum(
                len({e.key for e in new[p] if e.key is not None}) for p in range(3)
            )
            # (at this size a file's fixed Parquet overhead weighs: the 1,000,000-record test
            # below measures the bytes at scale)
            assert summary.keys_out < first.keys_out / 4
            assert summary.bytes_written < first.bytes_written / 2
            # Spark's reader of the newest snapshots merges the layers too
            rows = (
                spark.read.format("headwater_snapshot")
                .option("store", spec.to_json())
                .option("topics", "t")
                .load()
                .collect()
            )
            read = {
                p: {r["key"]: r["value"] for r in rows if r["partition"] == p} for p in range(3)
            }
            assert read == {p: {k: v[0] for k, v in expected[p].items()} for p in range(3)}
        else:  # the full layer and both deltas were read again, and one full snapshot written
            assert summary.bytes_read > new_bytes
            assert summary.keys_out == sum(len(f) for f in expected.values())

    with BlockingStore(spec) as store:
        assert apply_retention(store, ("t",), retention=0) > 0
        left = sorted(i.key for i in store.list("snapshots/t/0/"))
    assert left[-1] == f"snapshots/t/0/_manifest-{offset:020d}.json"
    assert left[:-1] and all(k.startswith(f"snapshots/t/0/{offset:020d}/part-") for k in left[:-1])
    assert snapshot(spec, "t", 0) == (offset, python_fold([e for h in histories for e in h[0]]))


def test_one_percent_new_records_cost_a_few_percent_of_a_full_run(
    spark: Any, tmp_path: Path
) -> None:
    """1,000,000 records over 100,000 keys (four partitions), compacted; then 1% more: the run
    over them reads and writes under 5% of the bytes the full run did, and the merged snapshot
    equals a fold of everything (`make spark-long`: the history alone is 122 MB)."""
    spec = StoreSpec.local(tmp_path)
    settings = CompactionSettings(spec)  # delta_ratio 0.25
    partitions, keys, count = 4, 25_000, 250_000

    def entries(seed: int, records: int) -> list[Entry]:
        return list(generate(records, keys, seed=seed, tombstones=0.01, value_size=100))

    history = {p: entries(p, count) for p in range(partitions)}
    trickle = {p: entries(100 + p, count // 100) for p in range(partitions)}

    def write(part: dict[int, list[Entry]], start: int) -> int:
        with BlockingStore(spec) as store:
            for partition in range(partitions):
                write_segments(
                    store, "t", partition, part[partition], start_offset=start,
                    batch_records=500, segment_batches=100, codecs=(Compression.NONE,),
                )  # fmt: skip
            return sum(s.size for s in list_segments(store, ["t"]) if s.base_offset >= start)

    history_bytes = write(history, 0)
    full = run(session(spark), settings)
    assert full.records_in == partitions * count and full.bytes_read == history_bytes
    trickle_bytes = write(trickle, count)

    delta = run(session(spark), settings)

    assert [s["delta"] for s in delta.snapshots] == [True] * partitions
    assert delta.records_in == partitions * count // 100 and delta.bytes_read == trickle_bytes
    moved = delta.bytes_read + delta.bytes_written
    assert moved < 0.05 * (full.bytes_read + full.bytes_written), (delta.as_dict(), full.as_dict())
    for partition in range(partitions):
        expected = python_fold(history[partition] + trickle[partition])
        assert snapshot(spec, "t", partition) == (count + count // 100, expected)


def _store_files(spec: StoreSpec) -> dict[str, bytes]:
    with BlockingStore(spec) as store:
        return {i.key: store.get(i.key) for i in store.list("snapshots/")}


def _without_clock(files: dict[str, bytes]) -> dict[str, Any]:
    """Manifests with `created_at`, their one clock-dependent field, blanked; files as they are."""
    return {
        key: dataclasses.replace(Manifest.decode(key, data), created_at="")
        if key.endswith(".json")
        else data
        for key, data in files.items()
    }


def test_run_killed_before_its_manifest_is_invisible_and_rerun_is_identical(
    spark: Any, tmp_path: Path
) -> None:
    first, second = _history(4, 600), _history(5, 600)
    spec = StoreSpec.local(tmp_path)
    settings = CompactionSettings(spec, rows_per_file=100)
    _write(spec, "t", first)
    run(session(spark), settings)
    _write(spec, "t", second, start=600)
    before = snapshot(spec, "t", 1)

    # the run dies after writing its data files, before any manifest: what a kill there leaves
    with BlockingStore(spec) as store:
        outcomes = compute(spark, store, settings, plan(store, settings), lambda _: None)
    manifests = {(o.plan.topic, o.plan.partition): o.manifest for o in outcomes}
    assert [m.horizon for m in manifests.values() if m] == [1200, 1200, 1200]
    crashed = _store_files(spec)
    new_files = [k for k in crashed if "/00000000000000001200/" in k]
    assert len(new_files) == 3 * 3
    assert snapshot(spec, "t", 1) == before  # no reader sees any of it
    # ... and had it died in the middle of writing them, one would be missing
    (tmp_path / new_files[4]).unlink()

    summary = run(session(spark), settings)

    assert summary.records_in == 3 * 600
    after = _store_files(spec)
    assert {k: after[k] for k in crashed} == crashed  # the same files, byte for byte
    committed = {k: Manifest.decode(k, v) for k, v in after.items() if k not in crashed}
    assert sorted(committed) == [f"snapshots/t/{p}/_manifest-{1200:020d}.json" for p in range(3)]
    for manifest in committed.values():  # the manifests the killed run would have written
        expected = manifests[(manifest.topic, manifest.partition)]
        assert expected is not None
        assert dataclasses.replace(manifest, created_at="") == dataclasses.replace(
            expected, created_at=""
        )
        assert snapshot(spec, "t", manifest.partition) == (
            1200,
            python_fold(first[manifest.partition] + second[manifest.partition]),
        )

    # run again: nothing new, so the same manifests and files, byte for byte
    assert run(session(spark), settings).segments == 0
    assert _store_files(spec) == after


def test_corrupt_batches_are_skipped_counted_and_reported(spark: Any, tmp_path: Path) -> None:
    spec = StoreSpec.local(tmp_path)
    entries = list(generate(400, 40, seed=7))
    with BlockingStore(spec) as store:
        write_segments(store, "t", 0, entries, batch_records=50, segment_batches=4)
        segment = list_segments(store, ["t"])[1]  # offsets 200..399, batches of 50
        data = bytearray(store.get(segment.key))
        data[100] ^= 0xFF  # inside its first batch's records: offsets 200..249
        store.put(segment.key, bytes(data))

    summary = run(session(spark), CompactionSettings(spec))

    assert summary.corrupt_batches == 1
    assert summary.corrupt[0].startswith(f"{segment.key} at byte 0: ")
    assert summary.records_in == 350
    assert snapshot(spec, "t", 0) == (400, python_fold(entries[:200] + [
        Entry(None, None, (), 0)] * 50 + entries[250:]))  # fmt: skip


def _committed_fold(histories: list[tuple[list[Written], list[int]]], below: int) -> Folded:
    """The reference for a transactional history: replay the records the generator committed or
    wrote plainly, in offset order, up to `below`; nothing else."""
    folded: Folded = {}
    for history, bases in histories:
        for written, base in zip(history, bases, strict=True):
            if not written.visible:
                continue
            for offset, entry in enumerate(written.entries, base):
                if offset >= below or entry.key is None:
                    continue
                if entry.value is None:
                    folded.pop(entry.key, None)
                else:
                    folded[entry.key] = (entry.value, offset, entry.timestamp, entry.headers)
    return folded


def _decided(history: list[Written], outcome: Literal["committed", "aborted"]) -> list[Written]:
    return [
        Written(w.entries, outcome, w.producer_id) if w.outcome == "open" else w for w in history
    ]


@pytest.mark.parametrize(
    ("group_bytes", "twice"),
    [(6000, True), (DEFAULT_GROUP_BYTES, False)],
    ids=["spark_fold", "one_task"],
)
def test_aborted_and_open_transactions_never_reach_a_snapshot(
    spark: Any, tmp_path: Path, group_bytes: int, twice: bool
) -> None:
    """Three partitions of interleaved plain batches and transactions (three producers,
    tombstones, keyless records, a third aborted), read by several Spark tasks each (transactions
    cut by a task boundary are decided by reading ahead), or each by one task (one_task.py).
    Partition 0 has a transaction open from early on: its horizon stops at that transaction's
    first offset and, read by several tasks, since later tasks folded past it, it is read a
    second time up to there. Partition 1's open transaction is in
    its last task: one pass. Partition 2 has none: its horizon is its end. Each snapshot equals
    a fold of the committed and plain records below its horizon. Then markers end the open
    transactions (0 commits, 1 aborts) and more is written: the next run folds them, and every
    snapshot equals the fold of everything committed."""
    spec = StoreSpec.local(tmp_path)
    settings = CompactionSettings(spec, ("t",), group_bytes=group_bytes)
    histories = {p: transactional(400, 60, seed=20 + p) for p in range(3)}
    histories[0].insert(8, Written(tuple(generate(4, 60, seed=98)), "open", 9))
    histories[1].append(Written(tuple(generate(4, 60, seed=99)), "open", 9))
    with BlockingStore(spec) as store:
        bases = {p: write_batches(store, "t", p, histories[p], segment_batches=4) for p in range(3)}
        sizes = {
            p: sum(s.size for s in list_segments(store, ["t"]) if s.partition == p)
            for p in range(3)
        }
    ends = {p: bases[p][-1] + max(1, len(histories[p][-1].entries)) for p in range(3)}
    opened = {
        p: bases[p][histories[p].index(next(w for w in histories[p] if w.outcome == "open"))]
        for p in (0, 1)
    }
    horizons = {0: opened[0], 1: opened[1], 2: ends[2]}

    summary = run(session(spark), settings)

    # partition 0 read twice by the Spark fold, once by one task
    assert summary.bytes_read == (2 if twice else 1) * sizes[0] + sizes[1] + sizes[2]
    for p in range(3):
        assert snapshot(spec, "t", p) == (
            horizons[p],
            _committed_fold([(histories[p], bases[p])], horizons[p]),
        )
    below = [
        (w, b)
        for p in range(3)
        for w, b in zip(histories[p], bases[p], strict=True)
        if b < horizons[p]
    ]
    assert (
        summary.aborted_skipped
        == sum(len(w.entries) for w, _ in below if w.outcome == "aborted")
        > 0
    )
    assert summary.records_in == sum(len(w.entries) for w, _ in below)

    more = {p: transactional(150, 60, seed=30 + p) for p in range(3)}
    more[0].insert(3, Written((), "commit", 9))
    more[1].insert(5, Written((), "abort", 9))
    with BlockingStore(spec) as store:
        later = {
            p: write_batches(store, "t", p, more[p], start_offset=ends[p], segment_batches=4)
            for p in range(3)
        }
    final = {
        0: _decided(histories[0], "committed"),
        1: _decided(histories[1], "aborted"),
        2: histories[2],
    }

    run(session(spark), settings)

    for p in range(3):
        end = later[p][-1] + max(1, len(more[p][-1].entries))
        expected = _committed_fold([(final[p], bases[p]), (more[p], later[p])], end)
        assert snapshot(spec, "t", p) == (end, expected)
