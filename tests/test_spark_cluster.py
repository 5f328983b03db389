"""A real Spark cluster: a standalone master and worker started from the pyspark distribution
(`bin/spark-class`), `headwater compact --master spark://127.0.0.1:PORT` run against it in a child
process, and the snapshot it writes equal, manifest and bytes, to the one local[2] writes from a
copy of the same store. `spark_compaction.standalone` starts the master and worker and stops them
by PID."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headwater.spark_compaction.history import generate, write_segments
from headwater.spark_compaction.job import CompactionSettings, run
from headwater.spark_compaction.standalone import StandaloneCluster
from headwater.spark_compaction.store import BlockingStore, StoreSpec
from tests.test_spark_compaction import _store_files, _without_clock, python_fold, snapshot


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[StandaloneCluster]:
    directory = tmp_path / "cluster"
    directory.mkdir()
    with StandaloneCluster(directory) as standalone:
        yield standalone


@pytest.mark.timeout(480)  # four JVMs on a small shared machine
def test_standalone_cluster_writes_the_same_snapshot_as_local(
    spark: Any, cluster: StandaloneCluster, tmp_path: Path
) -> None:
    # the cluster boots while the same history is compacted on the shared local[2] session
    local = StoreSpec.local(tmp_path / "local" / "objects")
    history = {p: list(generate(1500, 200, seed=20 + p)) for p in range(3)}
    with BlockingStore(local) as store:
        for partition, entries in history.items():
            write_segments(store, "t", partition, entries, batch_records=40)
    shutil.copytree(tmp_path / "local", tmp_path / "remote")
    run(lambda: spark, CompactionSettings(local))
    cluster.wait_for_workers()

    result = subprocess.run(
        [
            sys.executable,
            *("-m", "headwater", "compact", "--format", "json"),
            *("--data-dir", str(tmp_path / "remote"), "--master", cluster.master_url),
            *("--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.memory=512m"),
            *("--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2"),
        ],
        capture_output=True,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
        timeout=400,
    )

    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    summary = json.loads(result.stdout)
    assert summary["records_in"] == 4500 and summary["segments"] == 3 * 5
    remote = StoreSpec.local(tmp_path / "remote" / "objects")
    assert _without_clock(_store_files(remote)) == _without_clock(_store_files(local))
    for partition, entries in history.items():
        assert snapshot(remote, "t", partition) == (1500, python_fold(entries))
    state = cluster.state()
    assert state is not None  # the job really ran on the cluster's executors
    assert [app["name"] for app in state["completedapps"]] == ["headwater-compact"]
