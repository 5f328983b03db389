"""A real Spark cluster: a standalone master and worker started from the pyspark distribution
(`bin/spark-class`), `headwater compact --master spark://127.0.0.1:PORT` run against it in a child
process, and the snapshot it writes equal, manifest and bytes, to the one local[2] writes from a
copy of the same store. Master and worker are stopped by PID."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest

from headwater.spark_compaction.history import generate, write_segments
from headwater.spark_compaction.job import CompactionSettings, run
from headwater.spark_compaction.store import BlockingStore, StoreSpec
from tests.support.s3 import free_port
from tests.test_spark_compaction import _store_files, _without_clock, python_fold, snapshot

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"


class Standalone:
    """A standalone Spark master and one worker on 127.0.0.1, each a `spark-class` JVM."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port, self.ui_port, self.worker_ui_port = free_port(), free_port(), free_port()
        self.processes: list[subprocess.Popen[bytes]] = []
        self.env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_CLASS.parent.parent),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": "256m",
            "PYSPARK_PYTHON": sys.executable,
        }

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, *arguments: str) -> None:
        log = (self.directory / f"{name}.log").open("ab")
        self.processes.append(
            subprocess.Popen(
                [str(SPARK_CLASS), *arguments], stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        )
        log.close()

    def start(self) -> Standalone:
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(self.port)),
            *("--webui-port", str(self.ui_port)),
        )
        (self.directory / "work").mkdir()
        self._start(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            self.master_url,
            *("--host", "127.0.0.1", "--cores", "2", "--memory", "1g"),
            *("--work-dir", str(self.directory / "work")),
            *("--webui-port", str(self.worker_ui_port)),
        )
        return self

    def state(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                state: dict[str, Any] = json.load(r)
                return state
        except (OSError, ValueError):
            # not up yet; while the master's UI starts, /json/ can answer with the HTML page
            return None

    def wait_for_worker(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state()
            if state is not None and state.get("aliveworkers", 0) >= 1:
                return
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited: {self.logs()}")
            time.sleep(0.25)
        raise RuntimeError(f"no worker registered in {timeout}s: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-2000:] for p in self.directory.glob("*.log")
        )

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Standalone]:
    directory = tmp_path / "cluster"
    directory.mkdir()
    standalone = Standalone(directory).start()
    yield standalone
    standalone.stop()


@pytest.mark.timeout(480)  # four JVMs on a small shared machine
def test_standalone_cluster_writes_the_same_snapshot_as_local(
    spark: Any, cluster: Standalone, tmp_path: Path
) -> None:
    # the cluster boots while the same history is compacted on the shared local[2] session
    local = StoreSpec.local(tmp_path / "local" / "objects")
    history = {p: list(generate(1500, 200, seed=20 + p)) for p in range(3)}
    with BlockingStore(local) as store:
        for partition, entries in history.items():
            write_segments(store, "t", partition, entries, batch_records=40)
    shutil.copytree(tmp_path / "local", tmp_path / "remote")
    run(lambda: spark, CompactionSettings(local))
    cluster.wait_for_worker()

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
