"""Issue 40's rough edges: `headwater_snapshot` without `store` names the option; `compact --topic`
of a topic with nothing in the store and `--delta-ratio` out of range exit non-zero with one line;
a sink whose topic does not exist fails before any task runs; a partition's snapshot directory
reads as plain Parquet (the manifests start with `_`), and a manifest of the old name is still
read and expires."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from headwater.cli.main import main
from headwater.spark_compaction.history import generate, write_segments
from headwater.spark_compaction.job import CompactionSettings, apply_retention, plan, run
from headwater.spark_compaction.loader import load_snapshot
from headwater.spark_compaction.manifest import legacy_manifest_key, manifest_key
from headwater.spark_compaction.store import BlockingStore, StoreSpec, open_store
from headwater.testing import ServerProcess


def test_the_snapshot_source_without_store_names_the_option(spark: Any) -> None:
    reader = spark.read.format("headwater_snapshot").option("topics", "t")
    with pytest.raises(Exception, match="headwater_snapshot needs the option store") as raised:
        reader.load().collect()
    assert "KeyError" not in str(raised.value)
    with pytest.raises(Exception, match="headwater_wal needs the option store"):
        spark.read.format("headwater_wal").load().collect()


@pytest.mark.parametrize("ratio", ["2", "-0.5", "nan", "1.5"])
def test_a_delta_ratio_outside_0_to_1_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ratio: str
) -> None:
    (tmp_path / "objects").mkdir()
    status = main(["compact", "--data-dir", str(tmp_path), f"--delta-ratio={ratio}"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.strip().splitlines() == [
        f"headwater: error: --delta-ratio takes a fraction from 0 to 1, not {float(ratio)}"
    ]


def test_compacting_a_topic_with_nothing_in_the_store_exits_1_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    objects = tmp_path / "objects"
    objects.mkdir()
    with BlockingStore(StoreSpec.local(objects)) as store:
        write_segments(store, "real", 0, list(generate(10, 5)))
    status = main(["compact", "--data-dir", str(tmp_path), "--topic", "nosuch"])
    captured = capsys.readouterr()
    assert status == 1
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("headwater: error: compaction failed: topic 'nosuch' has nothing")
    # a named topic that has segments plans as before; one with only snapshots is not unknown
    with BlockingStore(StoreSpec.local(objects)) as store:
        assert [p.topic for p in plan(store, CompactionSettings(store.spec, ("real",)))] == ["real"]
        store.put("snapshots/old/0/_manifest-00000000000000000001.json", b"{}")
        assert plan(store, CompactionSettings(store.spec, ("old",))) == []


def test_a_missing_sink_topic_fails_before_any_task_runs(
    spark: Any, server: ServerProcess, topic_name: str, tmp_path: Path
) -> None:
    frame = spark.range(4).selectExpr("cast(id as string) as value").repartition(4)
    tasks = spark.sparkContext.accumulator(0)

    def counted(value: str) -> str:
        tasks.add(1)
        return value

    counting = spark.createDataFrame(
        frame.rdd.map(lambda row: (counted(row.value),)), "value string"
    )
    says = f"the headwater sink's topic '{topic_name}' does not exist: create it first"
    for commit in ("driver", "task"):
        with pytest.raises(Exception, match=says):
            (
                counting.write.format("headwater")
                .mode("append")
                .option("server", server.address)
                .option("topic", topic_name)
                .option("commit", commit)
                .save()
            )
    with pytest.raises(Exception, match=says):
        (
            spark.readStream.format("rate")
            .load()
            .selectExpr("cast(value as string) as value")
            .writeStream.format("headwater")
            .option("server", server.address)
            .option("topic", topic_name)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
            .awaitTermination(120)
        )
    assert tasks.value == 0  # no task staged or produced a row


def test_a_snapshot_directory_reads_as_parquet_and_old_manifests_still_count(
    spark: Any, tmp_path: Path
) -> None:
    spec = StoreSpec.local(tmp_path / "objects")
    entries = list(generate(400, 50, seed=3))
    with BlockingStore(spec) as store:
        write_segments(store, "t", 0, entries, batch_records=40)
    settings = CompactionSettings(spec, ("t",), retention=0)
    first = run(lambda: spark, settings)
    assert len(first.snapshots) == 1
    horizon = first.snapshots[0]["horizon"]
    partition_dir = tmp_path / "objects" / "snapshots" / "t" / "0"
    assert (tmp_path / "objects" / manifest_key("t", 0, horizon)).exists()
    assert not list(partition_dir.glob("manifest-*"))  # only the `_` name is written

    rows = spark.read.parquet(str(partition_dir), recursiveFileLookup=True)
    assert rows.count() == first.keys_out
    assert {r.topic for r in rows.select("topic").collect()} == {"t"}

    # a snapshot committed under the old name is still found, read, and superseded in time
    old = tmp_path / "objects" / legacy_manifest_key("t", 0, horizon)
    (tmp_path / "objects" / manifest_key("t", 0, horizon)).rename(old)

    async def loaded() -> int | None:
        store = await open_store(spec)
        try:
            snapshot = await load_snapshot(store, "t", 0)
            return None if snapshot is None else snapshot.horizon
        finally:
            await store.close()

    assert asyncio.run(loaded()) == horizon
    with BlockingStore(spec) as store:
        write_segments(
            store, "t", 0, list(generate(100, 50, seed=4)), start_offset=400, batch_records=40
        )
    second = run(lambda: spark, settings)  # builds on the old-named snapshot, then expires it
    assert second.records_in == 100
    assert not old.exists()
    with BlockingStore(spec) as store:
        assert apply_retention(store, ("t",), retention=0) == 0
    assert asyncio.run(loaded()) == second.snapshots[0]["horizon"]
