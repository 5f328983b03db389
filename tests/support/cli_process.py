"""The `headwater` command as a subprocess against a live server, for the CLI tests. Every bound
here only bounds a hang: a CLI process takes seconds to start on a loaded machine."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from headwater.testing import ServerProcess


def hw(
    *args: str,
    server: ServerProcess | None = None,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "headwater", *args]
    if server is not None:
        command += ["--server", server.address]
    return subprocess.run(
        command,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def start_consumer(server: ServerProcess, *args: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "headwater", "consume", *args, "--server", server.address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return process


def wait_for_consumers(server: ServerProcess, topic: str, count: int) -> None:
    deadline = time.monotonic() + 60  # a hang bound: a CLI process takes seconds under load
    while time.monotonic() < deadline:
        out = hw("topic", "describe", topic, server=server).stdout
        if out.count("    consumer ") >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"{count} consumers never attached to {topic}")
