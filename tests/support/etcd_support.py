"""A real etcd (Debian's etcd-server) on 127.0.0.1, as a child process of the test.

`EtcdServer` picks free loopback ports for the client and peer URLs, keeps its data in a directory
of the test's, and is stopped by its PID: `kill` is kill -9 (an outage), `pause`/`resume` blackhole
it (SIGSTOP/SIGCONT), `start` again on the same data dir and ports brings the same cluster back (its
keys, revisions and leases). `etcd_server` makes a fixture of it; `python -m
tests.support.etcd_support ENDPOINT ID PORT TTL` runs one coordinator alone in a process, for kill
-9. Below them, the coordinator tests' helpers: a recording PartitionHandler, a sampler of serves()
that catches two brokers serving one partition, and etcd's history of the owner keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aetcd

from headwater.server.cluster import Coordinator, Layout
from headwater.server.requests.partition_ownership import BrokerAddress
from tests.support.s3 import free_port


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
        """SIGSTOP: etcd blackholed (connections open, no answers) until `resume`. Returns once
        every thread of it has stopped: a thread busy in a disk write stops only when the write
        returns, and under load one answered a request sent after SIGSTOP (a stress run,
        2026-11-26)."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)
        # the stop is reported (WUNTRACED) once the group stop is complete: every thread
        os.waitpid(self._process.pid, os.WUNTRACED)

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


# the coordinator tests' helpers (tests/test_cluster_coordinator.py)

TTL = 2.0
# a wait for something that should happen, beyond which it is a hang: never reached when it works
HANG = 30.0
REBALANCE = 0.2
TOPIC = "orders"
PARTITIONS = 6


@dataclass
class Recorder:
    """A PartitionHandler that records every call, in order, with a monotonic time."""

    name: str
    calls: list[tuple[float, str, str, int, int | None]] = field(default_factory=list)
    fail_acquire: bool = False
    on_release: Callable[[str, int], Awaitable[None]] | None = None
    on_acquire: Callable[[str, int], Awaitable[None]] | None = None

    async def acquire(self, topic: str, partition: int, epoch: int) -> None:
        self.calls.append((time.monotonic(), "acquire", topic, partition, epoch))
        if self.fail_acquire:
            raise RuntimeError("cannot take it now")
        if self.on_acquire is not None:
            await self.on_acquire(topic, partition)

    async def release(self, topic: str, partition: int) -> None:
        if self.on_release is not None:
            await self.on_release(topic, partition)
        self.calls.append((time.monotonic(), "release", topic, partition, None))

    def lost(self, topic: str, partition: int) -> None:
        self.calls.append((time.monotonic(), "lost", topic, partition, None))

    def count(self, kind: str) -> int:
        return sum(1 for call in self.calls if call[1] == kind)


def make(
    etcd: EtcdServer, broker_id: str, ttl: float = TTL, handoff_after: float = 0.0
) -> tuple[Coordinator, Recorder]:
    coordinator = Coordinator(
        etcd.endpoint,
        BrokerAddress(broker_id, "127.0.0.1", free_port()),
        lease_ttl=ttl,
        rebalance_interval=REBALANCE,
        handoff_after=handoff_after,
    )
    recorder = Recorder(broker_id)
    coordinator.handler = recorder
    return coordinator, recorder


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.05)


def servers_of(coordinators: list[Coordinator], partition: int) -> list[str]:
    return [c.this_broker.broker_id for c in coordinators if c.serves(TOPIC, partition)]


def settled(coordinators: list[Coordinator]) -> bool:
    """Every partition served by exactly one, and every broker serving at least one."""
    return all(len(servers_of(coordinators, p)) == 1 for p in range(PARTITIONS)) and all(
        c.owned() for c in coordinators
    )


class DoubleServing:
    """Samples every coordinator's serves() for every partition: on entry, every few
    milliseconds while the block runs, and on exit.

    A hand-off on an idle machine can finish within one sampling period, so the number of
    samples says nothing about the machine; what the check needs is that the background
    sampler ran inside the window at least once, besides the samples at its two ends.
    """

    def __init__(self, coordinators: list[Coordinator]) -> None:
        self.coordinators = coordinators
        self.seen: list[tuple[int, list[str]]] = []
        self.background_samples = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> DoubleServing:
        self._check()
        self._task = asyncio.get_running_loop().create_task(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._check()
        assert not self.seen, f"partitions served by two brokers at once: {self.seen[:5]}"
        assert self.background_samples > 0, "the sampler never ran inside the block"

    def _check(self) -> None:
        for partition in range(PARTITIONS):
            serving = servers_of(self.coordinators, partition)
            if len(serving) > 1:
                self.seen.append((partition, serving))

    async def _sample(self) -> None:
        while True:
            self._check()
            self.background_samples += 1
            await asyncio.sleep(0.005)


async def owner_history(etcd: EtcdServer) -> list[Any]:
    """Every event ever seen on the owner keys, from revision 1 (etcd keeps the history)."""
    client = aetcd.Client("127.0.0.1", etcd.client_port, timeout=5)
    try:
        prefix = Layout().root("owners")
        current = (await client.get_prefix(b"/")).header.revision
        events: list[Any] = []
        if current <= 1:
            return events
        watch = await client.watch_prefix(prefix, start_revision=1)
        deadline = time.monotonic() + 10
        last = 0
        iterator = aiter(watch)
        while last < current and time.monotonic() < deadline:
            try:
                event = await asyncio.wait_for(anext(iterator), 1.0)
            except TimeoutError:
                break  # no more events on the owner keys up to now
            events.append(event)
            last = event.kv.mod_revision
        await watch.cancel()
        return events
    finally:
        await client.close()


def assert_never_overwritten(events: list[Any]) -> None:
    """An owner key is only ever created (version 1) or deleted, never put over itself."""
    puts = [e for e in events if e.kind == aetcd.EventKind.PUT]
    assert puts, "no owner key was ever written"
    overwritten = [(e.kv.key, e.kv.version) for e in puts if e.kv.version != 1]
    assert not overwritten, f"owner keys put while they existed: {overwritten}"


async def run_broker(endpoint: str, broker_id: str, topic_port: int, ttl: float) -> None:
    """A coordinator alone in a process (for kill -9 tests): prints "ready" once started."""
    import asyncio

    from headwater.server.cluster import Coordinator
    from headwater.server.requests.partition_ownership import BrokerAddress

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
