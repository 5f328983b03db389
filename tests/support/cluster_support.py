"""Brokers of a real cluster for tests: etcd (tests.support.etcd_support), moto's S3 and N
`headwater serve
--cluster` processes on loopback, each stopped by its PID.

`Cluster.owners(topic)` reads the ownership keys straight from etcd (the coordinator's layout,
`server.cluster.layout`), so tests can check who owns what independently of the brokers' answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aetcd

from headwater.testing import ServerProcess
from tests.support.etcd_support import EtcdServer
from tests.support.s3 import MotoS3

PREFIX = "/headwater"


class Cluster:
    def __init__(
        self,
        root: Path,
        etcd: EtcdServer,
        s3: MotoS3,
        bucket: str,
        lease_ttl_ms: int = 3000,
        s3_endpoint: str | None = None,
        handoff_after_ms: int = 0,
        cluster_settings: str = "",
        kafka: bool = False,
    ) -> None:
        """`handoff_after_ms` 0 (not the default of `serve`): a broker that joins or comes back
        gets its share at once, which most tests of moving partitions want. `kafka`: each
        broker opens a Kafka port too (`kafka_ports`), the same one again on a restart."""
        self.root = root
        self.kafka = kafka
        self.kafka_ports: dict[str, int] = {}
        self.etcd = etcd
        self.etcd_endpoint = etcd.endpoint  # what brokers are given (a fault proxy's, say)
        self.brokers: dict[str, ServerProcess] = {}
        self._advertised: dict[str, str] = {}
        self._config = root / "cluster.toml"
        # HEADWATER_TEST_TAIL_LAYOUT=broker runs a cluster test module on the per-broker tail
        # layout (a `tail_layout` in `cluster_settings` wins: TOML refuses a key twice)
        chosen = os.environ.get("HEADWATER_TEST_TAIL_LAYOUT")
        explicit = "tail_layout" in cluster_settings
        layout = f'tail_layout = "{chosen}"' if chosen and not explicit else ""
        self._config.write_text(
            f"""
[object_store]
backend = "s3"
bucket = "{bucket}"
endpoint_url = "{s3_endpoint or s3.endpoint_url}"
region = "us-east-1"
retry_initial_ms = 50
retry_max_ms = 500

[cluster]
lease_ttl_ms = {lease_ttl_ms}
checkpoint_interval_ms = 200
handoff_after_ms = {handoff_after_ms}
{layout}
{cluster_settings}
"""
        )

    def start_broker(
        self, broker_id: str, port: int = 0, advertise: str | None = None
    ) -> ServerProcess:
        """Start broker `broker_id` on `port` (0: one the OS picks), telling clients to reach it
        at `advertise` (default: where it listens; a fault proxy in front of it, say)."""
        if advertise is not None:
            self._advertised[broker_id] = advertise
        advertise = self._advertised.get(broker_id)
        kafka_file = self.root / f"{broker_id}.kafka"
        kafka: tuple[str, ...] = ()
        if self.kafka:
            kafka_file.unlink(missing_ok=True)
            kafka_port = str(self.kafka_ports.get(broker_id, 0))
            kafka = ("--kafka-port", kafka_port, "--kafka-port-file", str(kafka_file))
        process = ServerProcess(
            self.root / broker_id,
            extra_args=(
                "--config",
                str(self._config),
                "--cluster",
                self.etcd_endpoint,
                "--broker-id",
                broker_id,
                "--log-format",
                "json",
                "--http-port",
                "0",
                "--http-port-file",
                str(self.root / f"{broker_id}.http"),
                *(("--port", str(port)) if port else ()),
                *(("--advertise", advertise) if advertise else ()),
                *kafka,
            ),
        ).start(timeout=120)  # a hang bound: a loaded machine took over 60 s
        self.brokers[broker_id] = process
        if self.kafka:  # written before the native port's file, which start() waited for
            self.kafka_ports[broker_id] = int(kafka_file.read_text())
        return process

    def restart_broker(self, broker_id: str) -> ServerProcess:
        """Start a stopped (or killed) broker again on the port it had: the address clients
        bootstrapped at comes back, as when an operator restarts a machine's broker."""
        return self.start_broker(broker_id, self.brokers[broker_id].port)

    def metrics(self, broker_id: str) -> dict[str, float]:
        """The broker's /metrics, unlabelled samples only: name -> value."""
        port = int((self.root / f"{broker_id}.http").read_text())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        found = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if line and not line.startswith("#") and "{" not in name:
                found[name] = float(value)
        return found

    def stop_all(self) -> None:
        for process in self.brokers.values():
            process.kill()

    async def _etcd(self) -> aetcd.Client:
        return aetcd.Client(host="127.0.0.1", port=self.etcd.client_port)

    async def owners(self, topic: str) -> dict[int, str]:
        """partition -> the broker id holding its ownership key now."""
        async with await self._etcd() as client:
            found = await client.get_prefix(f"{PREFIX}/owners/{topic}/".encode())
        return {int(kv.key.decode().rsplit("/", 1)[1]): kv.value.decode() for kv in found}

    async def address(self, broker_id: str) -> str:
        async with await self._etcd() as client:
            found = await client.get(f"{PREFIX}/brokers/{broker_id}".encode())
        data = json.loads(found.value)
        return f"{data['host']}:{data['port']}"

    async def wait_owned(
        self, topic: str, partitions: int, among: set[str], timeout: float = 30.0
    ) -> dict[int, str]:
        """Until every partition is owned by one of `among` (bounded); the owners."""
        deadline = time.monotonic() + timeout
        owners: dict[int, str] = {}
        while time.monotonic() < deadline:
            owners = await self.owners(topic)
            if len(owners) == partitions and set(owners.values()) <= among:
                return owners
            await asyncio.sleep(0.1)
        raise AssertionError(f"partitions of {topic} not owned by {among} in {timeout}s: {owners}")


@contextlib.contextmanager
def running_cluster(
    root: Path,
    s3: MotoS3,
    bucket: str,
    lease_ttl_ms: int,
    s3_endpoint: str | None = None,
    handoff_after_ms: int = 0,
    cluster_settings: str = "",
    kafka: bool = False,
) -> Iterator[Cluster]:
    """etcd started, a `Cluster` to start brokers in; every broker and etcd killed at the end.
    `cluster_settings`: more lines of the brokers' `[cluster]` section."""
    etcd = EtcdServer(root / "etcd").start()
    cluster = Cluster(
        root,
        etcd,
        s3,
        bucket,
        lease_ttl_ms,
        s3_endpoint,
        handoff_after_ms,
        cluster_settings,
        kafka,
    )
    try:
        yield cluster
    finally:
        cluster.stop_all()
        etcd.kill()
