"""A real etcd (Debian's etcd-server) on 127.0.0.1, as a child process of the test.

`EtcdServer` picks free loopback ports for the client and peer URLs, keeps its data in a directory
of the test's, and is stopped by its PID: `kill` is kill -9 (an outage), `pause`/`resume` blackhole
it (SIGSTOP/SIGCONT), `start` again on the same data dir and ports brings the same cluster back
(its keys, revisions and leases). `etcd_server` makes a fixture of it;
`python -m tests.etcd_support ENDPOINT ID PORT TTL` runs one coordinator alone in a process, for
kill -9.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.s3 import free_port


class EtcdServer:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._log = data_dir.parent / f"{data_dir.name}.log"

    @property
    def endpoint(self) -> str:
        return f"etcd://127.0.0.1:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self, timeout: float = 20.0) -> EtcdServer:
        binary = shutil.which("etcd") or "/usr/bin/etcd"
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        with self._log.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    binary,
                    "--name=test",
                    f"--data-dir={self.data_dir}",
                    f"--listen-client-urls={client}",
                    f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=test={peer}",
                    "--log-level=warn",
                    # one member: elect itself fast after a restart (default 1 s of silence)
                    "--heartbeat-interval=50",
                    "--election-timeout=300",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"etcd exited at start: see {self._log}")
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1.0) as answer:
                    if b'"true"' in answer.read():
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"etcd not healthy within {timeout}s: see {self._log}")

    def kill(self) -> None:
        """kill -9 by PID (an outage: nothing is flushed beyond what etcd already fsynced)."""
        if self._process is not None:
            self._process.kill()
            self._process.wait(10)
            self._process = None

    def pause(self) -> None:
        """SIGSTOP: etcd blackholed (connections open, no answers) until `resume`."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None


def etcd_server(data_dir: Path) -> Iterator[EtcdServer]:
    """For a fixture: an etcd started in `data_dir`, killed by PID afterwards."""
    server = EtcdServer(data_dir).start()
    try:
        yield server
    finally:
        server.kill()


async def run_broker(endpoint: str, broker_id: str, topic_port: int, ttl: float) -> None:
    """A coordinator alone in a process (for kill -9 tests): prints "ready" once started."""
    import asyncio

    from headwater.server.cluster import Coordinator
    from headwater.server.ownership import BrokerAddress

    coordinator = Coordinator(
        endpoint,
        BrokerAddress(broker_id, "127.0.0.1", topic_port),
        lease_ttl=ttl,
        rebalance_interval=0.2,
    )
    await coordinator.start()
    print("ready", flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    import asyncio
    import sys

    asyncio.run(run_broker(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
