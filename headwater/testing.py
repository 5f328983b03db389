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
from collections.abc import Callable
from pathlib import Path


class StopTimedOut(subprocess.TimeoutExpired):
    """A graceful stop that did not end in time; the message ends with the server's log."""

    def __str__(self) -> str:
        tail = "\n".join(line[:400] for line in str(self.output).splitlines()[-40:])
        return f"the server did not stop within {self.timeout}s of SIGTERM; its log ends:\n{tail}"


class ServerProcess:
    def __init__(
        self,
        data_dir: Path,
        log_path: Path | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        preexec_fn: Callable[[], object] | None = None,
    ) -> None:
        """`preexec_fn` runs in the child before the server starts (e.g. to lower a resource
        limit with `resource.setrlimit`)."""
        self.extra_args = extra_args
        self.env = env
        self.preexec_fn = preexec_fn
        self.data_dir = data_dir
        self.port_file = data_dir.parent / f"{data_dir.name}.port"
        self.log_path = log_path or data_dir.parent / f"{data_dir.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> ServerProcess:
        """Starts the server and waits until it listens; `timeout` only bounds a hang (starts
        on a loaded 2-core machine took more than 30 s)."""
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
            preexec_fn=self.preexec_fn,
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

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit status; `StopTimedOut` (the server killed, the end of its log
        in the message) when it has not exited within `timeout`."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise StopTimedOut(self.process.args, timeout, self.log()) from None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def peak_rss(self) -> int:
        """The server process's peak resident memory so far, in bytes (Linux: VmHWM)."""
        assert self.process is not None
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
