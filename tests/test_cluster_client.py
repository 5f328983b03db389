"""The Python client on a real cluster (three brokers, etcd, moto's S3): a producer and a consumer
keep going through a kill -9 of a broker with no intervention, every acknowledged message is
delivered at least once, and map values set before the kill read back through the client."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import headwater
from tests.support.cluster_support import Cluster, running_cluster
from tests.support.s3 import MotoS3

LEASE_TTL_MS = 2000


@pytest.fixture
def cluster(tmp_path: Path, s3: MotoS3, bucket: str) -> Iterator[Cluster]:
    with running_cluster(tmp_path, s3, bucket, LEASE_TTL_MS) as cluster:
        yield cluster


async def test_client_producer_and_consumer_ride_through_a_kill9(cluster: Cluster) -> None:
    await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in ("b1", "b2", "b3")))
    client = await headwater.connect(await cluster.address("b1"))
    try:
        await client.create_topic("orders", partitions=6)
        await client.create_topic("kv", partitions=3, configs={"last.value": "true"})
        owner_of = await cluster.wait_owned("orders", 6, {"b1", "b2", "b3"})
        await cluster.wait_owned("kv", 3, {"b1", "b2", "b3"})
        kv = client.map("kv")
        values = {f"key-{i}": f"value-{i}" for i in range(12)}
        for key, value in values.items():
            await kv.set(key, value)
        consumer = await client.subscribe("orders", "s", start="earliest")
        producer = client.producer("orders")
        acked: set[bytes] = set()
        seen: set[bytes] = set()
        killed = asyncio.Event()
        done = asyncio.Event()

        async def produce() -> None:
            for i in range(100_000):  # bounded: stops once enough went through after the kill
                value = f"m-{i}".encode()
                await (await producer.send(value, key=str(i).encode()))
                acked.add(value)
                if killed.is_set() and len(acked) >= after_kill_target:
                    break
                if len(acked) == 150:
                    kill_now.set()
            done.set()

        async def consume() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not (done.is_set() and acked <= seen):
                try:
                    message = await consumer.receive(timeout=0.5)
                except TimeoutError:
                    continue
                seen.add(message.value)
                await message.ack()

        kill_now = asyncio.Event()
        after_kill_target = 450
        producing = asyncio.ensure_future(produce())
        consuming = asyncio.ensure_future(consume())
        await asyncio.wait_for(kill_now.wait(), 60)
        victim = next(b for b in ("b2", "b3") if b in owner_of.values())
        cluster.brokers[victim].kill()
        killed.set()
        await cluster.wait_owned("orders", 6, {"b1", "b2", "b3"} - {victim}, timeout=20)
        await asyncio.wait_for(producing, 90)
        await asyncio.wait_for(consuming, 130)
        assert len(acked) >= after_kill_target
        assert acked <= seen, f"{len(acked - seen)} acknowledged messages never delivered"
        await producer.close()
        await consumer.close()
        # map values set before the kill, read through the client from whoever owns them now
        for key, value in values.items():
            found = await kv.get(key)
            assert found is not None and found.value == value.encode()
        # the command line, bootstrapped at one broker, reads every partition to its end (it
        # took the end offsets from that broker alone, which knows only its own partitions)
        cli = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "headwater", "--server", await cluster.address("b1"),
             "consume", "orders", "-s", "cli", "--from", "earliest", "--exit-at-end",
             "--format", "json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        printed = {json.loads(line)["value"].encode() for line in cli.stdout.splitlines()}
        assert acked <= printed
    finally:
        await client.close()


async def test_a_receive_waiting_at_a_broker_that_owns_nothing_gets_the_owners_messages(
    cluster: Cluster,
) -> None:
    """Subscribed through a broker that serves none of the topic, before the client knew the
    topic's routes: `receive` began waiting on the bootstrap broker's leg alone, and the legs
    attached at the owners a moment later were never looked at (every message was delivered to
    the owner's leg and none handed out)."""
    for broker_id in ("b1", "b2", "b3"):
        cluster.start_broker(broker_id)
    async with await headwater.connect(await cluster.address("b1")) as client:
        await client.create_topic("one", dispatch="reliable")
        owner = (await cluster.wait_owned("one", 1, {"b1", "b2", "b3"}))[0]
        async with client.producer("one") as producer:
            sent = [await producer.send(f"v{i}".encode()) for i in range(5)]
            await producer.flush()
        assert [(await future).offset for future in sent] == list(range(5))
    elsewhere = next(b for b in ("b1", "b2", "b3") if b != owner)
    async with await headwater.connect(await cluster.address(elsewhere)) as client:
        consumer = await client.subscribe("one", "s", start="earliest")
        received = [(await consumer.receive(timeout=30)).value for _ in range(5)]
        assert received == [f"v{i}".encode() for i in range(5)]
