"""Exactly-once on the native protocol in a cluster under failure (issue 38): the consume-transform-
produce application of tests/support/native_eos_app.py (a Exclusive subscription in, a
transactional producer out, each message's acknowledgement sent in the transaction that writes
its output: ADD_ACKS_TO_TXN ranges, applied by each input partition's owner at the commit) runs
against three brokers, a real etcd and moto's S3. Brokers are killed with kill -9 at moments its
committed output reaches, each restarted at once: the one the application bootstrapped at (which
serves its transactional id; its transaction goes on through another broker) and one owning
input partitions but not serving the id, twice each, in a random order. The output a transaction-
aware reader reads holds exactly one record per input message, in input order per key, and the
subscription's cursors in etcd acknowledge every input message.

Long (40-50 s): in the Makefile's LONG_TESTS.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import headwater
from tests.support.cluster_support import Cluster, running_cluster
from tests.support.native_eos_app import committed_outputs
from tests.support.s3 import MotoS3
from tests.test_cluster_transactions import BROKERS, checkpoint, committed

LEASE_TTL_MS = 2000
PARTITIONS = 6
RECORDS = 4_000
KEYS = 40
DEADLINE = 420.0  # seconds the whole run may take (a bound on a hang only)


@pytest.fixture
def cluster(tmp_path: Path, s3: MotoS3, bucket: str) -> Iterator[Cluster]:
    with running_cluster(tmp_path, s3, bucket, LEASE_TTL_MS) as cluster:
        yield cluster


async def _done(address: str, topic: str) -> int | None:
    """How many outputs are committed (None while the cluster cannot say)."""
    try:
        async with await headwater.connect(address, timeout=5.0) as client:
            return await asyncio.wait_for(committed_outputs(client, topic), 30.0)
    except (headwater.HeadwaterError, OSError, TimeoutError):
        return None


async def test_a_native_exactly_once_loop_survives_kills_of_its_brokers(
    cluster: Cluster, tmp_path: Path, topic_name: str
) -> None:
    rng = random.Random(3838)
    await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in BROKERS))
    source, output, subscription = f"{topic_name}-in", f"{topic_name}-out", "eos"
    async with await headwater.connect(cluster.brokers["b1"].address) as client:
        await client.create_topic(source, partitions=PARTITIONS)
        await client.create_topic(output, partitions=PARTITIONS)
        await cluster.wait_owned(source, PARTITIONS, set(BROKERS), timeout=60)
        await cluster.wait_owned(output, PARTITIONS, set(BROKERS), timeout=60)
        producer = client.producer(source)
        sent = [
            await producer.send(f"v{i}".encode(), key=f"k{i % KEYS}".encode())
            for i in range(RECORDS)
        ]
        await producer.flush()
        await producer.close()
        inputs = {(s.result().partition, s.result().offset) for s in sent}
    kinds = ["id", "id", "owner", "owner"]
    rng.shuffle(kinds)
    plan = sorted((int(rng.uniform(0.1, 0.85) * RECORDS), kind) for kind in kinds)
    app: subprocess.Popen[bytes] | None = None
    bootstrap = "b1"
    instances = 0
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if app is None:
            instances += 1
            assert instances < 40, "too many application instances"
            command = [
                sys.executable, "-m", "tests.support.native_eos_app",
                cluster.brokers[bootstrap].address, source, output, subscription,
                f"{topic_name}-txn", str(RECORDS), "--every", "50",
            ]  # fmt: skip
            with (tmp_path / f"app-{instances}.log").open("wb") as log:
                app = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        code = app.poll()
        if code is not None:
            app = None
            if code == 0 and not plan:
                break
            bootstrap = rng.choice(BROKERS)  # the next instance starts elsewhere
            continue
        reader = next(b for b in BROKERS if b != bootstrap)
        done = await _done(cluster.brokers[reader].address, output) if plan else None
        if plan and done is not None and done >= plan[0][0]:
            _, kind = plan.pop(0)
            owners = await cluster.owners(source)
            if kind == "id":
                victim = bootstrap
            else:
                victim = rng.choice(sorted({b for b in owners.values() if b != bootstrap}))
            cluster.brokers[victim].kill()
            await asyncio.to_thread(cluster.restart_broker, victim)
        await asyncio.sleep(0.1)  # a bounded poll of the application's progress
    else:
        raise AssertionError(f"the application did not finish in {DEADLINE:g} s")
    assert not plan, f"kills not done: {plan}"
    async with await headwater.connect(cluster.brokers["b2"].address) as client:
        outputs = [await committed(client, output, p) for p in range(PARTITIONS)]
    seen: list[tuple[int, int]] = []
    for partition, values in enumerate(outputs):
        last_by_key: dict[bytes, int] = {}
        for value in values:
            assert value is not None
            from_partition, offset, original = value.split(b":", 2)
            assert int(from_partition) == partition
            seen.append((partition, int(offset)))
            key = f"k{int(original[1:]) % KEYS}".encode()
            assert last_by_key.get(key, -1) < int(offset), "out of order for its key"
            last_by_key[key] = int(offset)
    assert len(seen) == len(set(seen)), "an input message's output committed twice"
    assert set(seen) == inputs, "an input message's output missing"
    ends = [
        1 + max((o for p, o in inputs if p == partition), default=-1)
        for partition in range(PARTITIONS)
    ]
    floors = [await checkpoint(cluster, source, subscription, p) for p in range(PARTITIONS)]
    assert floors == ends, "an input message left unacknowledged"
