"""Redis and NATS servers from Debian's packages, started for one benchmark and stopped by PID.

Each runs in its own process on a free 127.0.0.1 port with its data in a directory of the
benchmark's scratch space (removed with it). Redis runs with `appendonly yes` and `appendfsync
everysec` (the AOF fsynced once a second, writes acknowledged before that), no RDB snapshots, and
no output-buffer limit for pub/sub subscribers: by default Redis disconnects a subscriber that
falls 32 MB behind, which would end the measurement instead of showing the subscriber's pace.
NATS runs with JetStream on (`-js`) and its file store in the scratch directory.

`missing()` names the binaries not installed; `make bench-peers` installs them
(`apt-get install redis-server nats-server`) before it runs.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

from loadtest.harness import free_port, wait_port

BINARIES = {"redis": "redis-server", "nats": "nats-server"}


def _binary(name: str) -> str | None:
    # Debian puts nats-server in /usr/sbin, which a non-root PATH may lack
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/local/sbin")


def missing() -> list[str]:
    return [binary for binary in BINARIES.values() if _binary(binary) is None]


class PeerServer:
    def __init__(self, name: str, command: list[str], port: int, log: Path) -> None:
        self.name = name
        self.command = command
        self.port = port
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> PeerServer:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_port(self.port)
        except RuntimeError:
            self.stop()
            raise RuntimeError(
                f"{self.name} did not start: {self.log.read_text()[-2000:]}"
            ) from None
        return self

    def version(self) -> str:
        output = subprocess.run(
            [self.command[0], "--version"], capture_output=True, text=True, timeout=10
        )
        return (output.stdout or output.stderr).strip().splitlines()[0]

    def stop(self) -> None:
        """SIGTERM to our own child by PID, SIGKILL if it has not exited after 10 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def redis(scratch: Path) -> PeerServer:
    port = free_port()
    data = scratch / "redis"
    data.mkdir()
    command = [
        _binary(BINARIES["redis"]) or BINARIES["redis"],
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--dir", str(data),
        "--save", "",
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--client-output-buffer-limit", "pubsub 0 0 0",
        "--daemonize", "no",
    ]  # fmt: skip
    return PeerServer("redis-server", command, port, scratch / "redis.log").start()


def nats(scratch: Path) -> PeerServer:
    port = free_port()
    data = scratch / "nats"
    data.mkdir()
    command = [
        _binary(BINARIES["nats"]) or BINARIES["nats"],
        "-a",
        "127.0.0.1",
        "-p",
        str(port),
        "-js",
        "-sd",
        str(data),
    ]
    return PeerServer("nats-server", command, port, scratch / "nats.log").start()
