"""A real Headwater server in a child process, on 127.0.0.1 and a port the OS picks.

For tests and benchmarks, ours and users': they talk to it over TCP exactly as applications do.
`start` waits for the port file the server writes once it listens; `stop` sends SIGTERM (a graceful
shutdown) and `kill` sends SIGKILL. The server runs as `python -m headwater serve`, so this module
imports nothing of the server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


class ServerProcess:
    def __init__(
        self,
        data_dir: Path,
        log_path: Path | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.extra_args = extra_args
        self.env = env
        self.data_dir = data_dir
        self.port_file = data_dir.parent / f"{data_dir.name}.port"
        self.log_path = log_path or data_dir.parent / f"{data_dir.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerProcess:
        self.port_file.unlink(missing_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "headwater",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--data-dir",
                str(self.data_dir),
                "--port-file",
                str(self.port_file),
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env} if self.env else None,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.port_file.exists():
                self.port = int(self.port_file.read_text())
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}: {self.log()}")
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"server did not start in {timeout}s: {self.log()}")

    def stop(self, timeout: float = 15.0) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
