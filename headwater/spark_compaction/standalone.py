"""A standalone Spark cluster on this machine: a master and workers, each a JVM started from the
pyspark wheel's `bin/spark-class`, listening on 127.0.0.1 only.

For trying `headwater compact --master spark://...` without installing Spark, for the tests that
run the job on a real cluster, and for the benchmark that measures how the job scales with
workers (loadtest/compaction_bench.py). `start` launches the daemons, `wait_for_workers` polls the
master's JSON status page until they have registered, `stop` sends SIGTERM and then SIGKILL to
each process it started, by PID. The daemons' logs go to `directory`; `logs` returns their tails
for error messages. Executors the workers start inherit `PYSPARK_PYTHON`, set to this interpreter.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

_START_TIMEOUT = 120.0  # seconds for every worker to register (JVMs on a small, busy machine)


def spark_class() -> Path:
    """The wheel's launcher of Spark's JVM classes."""
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class StandaloneCluster:
    """A master and `workers` workers of `cores` cores and `memory` each."""

    def __init__(
        self, directory: Path, workers: int = 1, cores: int = 2, memory: str = "1g"
    ) -> None:
        self.directory = directory
        self.workers, self.cores, self.memory = workers, cores, memory
        self.port, self.ui_port = _free_port(), _free_port()
        self.processes: list[subprocess.Popen[bytes]] = []
        launcher = spark_class()
        self._launcher = launcher
        self.env = {
            **os.environ,
            "SPARK_HOME": str(launcher.parent.parent),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": "256m",
            "PYSPARK_PYTHON": sys.executable,
        }

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, *arguments: str) -> None:
        with (self.directory / f"{name}.log").open("ab") as log:
            self.processes.append(
                subprocess.Popen(
                    [str(self._launcher), *arguments],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                )
            )

    def start(self) -> StandaloneCluster:
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(self.port)),
            *("--webui-port", str(self.ui_port)),
        )
        for number in range(self.workers):
            work = self.directory / f"work-{number}"
            work.mkdir(parents=True, exist_ok=True)
            self._start(
                f"worker-{number}",
                "org.apache.spark.deploy.worker.Worker",
                self.master_url,
                *("--host", "127.0.0.1", "--cores", str(self.cores), "--memory", self.memory),
                *("--work-dir", str(work), "--webui-port", str(_free_port())),
            )
        return self

    def state(self) -> dict[str, Any] | None:
        """The master's status (workers, applications), or None while it is not up."""
        try:
            url = f"http://127.0.0.1:{self.ui_port}/json/"
            with urllib.request.urlopen(url, timeout=2) as answer:
                state: dict[str, Any] = json.load(answer)
                return state
        except (OSError, ValueError):
            # not up yet; while the master's UI starts, /json/ can answer with the HTML page
            return None

    def wait_for_workers(self, timeout: float = _START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state()
            if state is not None and state.get("aliveworkers", 0) >= self.workers:
                return
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited: {self.logs()}")
            time.sleep(0.25)
        raise RuntimeError(f"{self.workers} workers did not register in {timeout}s: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-2000:] for p in sorted(self.directory.glob("*.log"))
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

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
