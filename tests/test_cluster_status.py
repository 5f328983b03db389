"""`headwater cluster status` (run as a subprocess) against a real etcd and two coordinators:
brokers, lease remaining, partitions per broker, unowned partitions, table and JSON, and the exit
statuses when etcd does not answer or the endpoint is malformed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.etcd_support import (
    PARTITIONS,
    TOPIC,
    TTL,
    EtcdServer,
    Layout,
    etcd_server,
    make,
    until,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    yield from etcd_server(tmp_path / "etcd")


def headwater_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headwater", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )


async def test_cluster_status_command(etcd: EtcdServer) -> None:
    brokers = [make(etcd, f"s{i}") for i in (1, 2)]
    coordinators = [c for c, _ in brokers]
    for coordinator in coordinators:
        await coordinator.start()
    try:
        await coordinators[0].create_topic(TOPIC, {"partitions": PARTITIONS})
        await coordinators[0].create_topic("idle", {"partitions": 1})
        await until(
            lambda: sum(len(c.owned()) for c in coordinators) == PARTITIONS + 1, 10, "all served"
        )
        answer = await asyncio.to_thread(
            headwater_cli, "cluster", "status", "--cluster", etcd.endpoint, "--format", "json"
        )
        assert answer.returncode == 0, answer.stderr
        found = json.loads(answer.stdout)
        assert [b["id"] for b in found["brokers"]] == ["s1", "s2"]
        for broker, coordinator in zip(found["brokers"], coordinators, strict=True):
            assert broker["port"] == coordinator.this_broker.port
            assert 0 <= broker["lease_remaining"] <= TTL
            owned = [(p["topic"], p["partition"]) for p in broker["partitions"]]
            assert sorted(owned) == coordinator.owned()
        assert found["unowned"] == []
        assert len(found["partitions"]) == PARTITIONS + 1

        table = await asyncio.to_thread(
            headwater_cli, "cluster", "status", "--cluster", etcd.endpoint
        )
        assert table.returncode == 0, table.stderr
        assert "BROKER" in table.stdout and "s1" in table.stdout and "s2" in table.stdout
        assert "unowned partitions: none" in table.stdout
        assert f"{TOPIC}  " in table.stdout

        await coordinators[0].delete_topic("idle")
        await coordinators[0]._session.call(
            lambda c: c.put(Layout().topic("fresh"), b'{"partitions": 1}')
        )
    finally:
        for coordinator in coordinators:
            await coordinator.stop()
    # nobody left to take "fresh": it shows as unowned
    answer = await asyncio.to_thread(
        headwater_cli, "cluster", "status", "--cluster", etcd.endpoint, "--format", "json"
    )
    found = json.loads(answer.stdout)
    assert found["brokers"] == []
    assert {"topic": "fresh", "partition": 0} in found["unowned"]

    etcd.kill()
    down = await asyncio.to_thread(
        headwater_cli, "cluster", "status", "--cluster", etcd.endpoint, "--timeout", "1"
    )
    assert down.returncode == 1
    assert "cannot reach etcd" in down.stderr and "Traceback" not in down.stderr
    bad = await asyncio.to_thread(headwater_cli, "cluster", "status", "--cluster", "localhost")
    assert bad.returncode == 2 and "etcd://HOST:PORT" in bad.stderr
