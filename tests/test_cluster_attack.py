"""Attacks on the cluster's data path, on real processes (three brokers, etcd, moto's S3, loopback):
kill -9 of brokers (the bootstrap one too) under produce load from the Python client, a broker
joining and graceful restarts racing produce and consume, a take-over through an object store
that cuts connections and pauses, map sets racing a kill -9, and a subscription's consumer coming
back to a broker that took its partitions over. Topic create/delete races are in
tests/test_cluster_attack_topics.py, the object-store level ones in
tests/test_cluster_attack_tail.py.

Each test checks the promises: every acknowledged message is delivered at least once, and no
(partition, offset) is ever delivered with two different values.

The default run is short (it is part of `make test`). `HEADWATER_CLUSTER_SOAK=1` runs the longer
variants: more kill rounds and restarts, more messages (run it with `-p no:timeout` or
`--timeout 900`: a soak run takes minutes).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import headwater
from tests.support.cluster_support import Cluster, running_cluster
from tests.support.etcd_support import EtcdServer
from tests.support.proxy import FaultyProxy
from tests.support.s3 import MotoS3

LEASE_TTL_MS = 2000
SOAK = os.environ.get("HEADWATER_CLUSTER_SOAK") == "1"
BROKERS = ("b1", "b2", "b3")


@pytest.fixture
def cluster(tmp_path: Path, s3: MotoS3, bucket: str) -> Iterator[Cluster]:
    with running_cluster(tmp_path, s3, bucket, LEASE_TTL_MS) as cluster:
        yield cluster


async def start_three(cluster: Cluster) -> None:
    await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in BROKERS))


class Ledger:
    """What was acknowledged to producers and what consumers were given, by (partition, offset)."""

    def __init__(self) -> None:
        self.acked: set[bytes] = set()
        self.seen: set[bytes] = set()
        self.at: dict[tuple[int, int], bytes] = {}
        self.clashes: list[tuple[int, int, bytes, bytes]] = []

    def delivered(self, message: headwater.Message) -> None:
        assert message.value is not None
        place = (message.partition, message.offset)
        before = self.at.setdefault(place, message.value)
        if before != message.value:
            self.clashes.append((*place, before, message.value))
        self.seen.add(message.value)

    async def more_acked(self, count: int, what: str, timeout: float = 60.0) -> None:
        """Until `count` more messages were acknowledged than now: the traffic a phase of a test
        must see, whatever the machine's speed (`timeout` bounds a hang only)."""
        target = len(self.acked) + count
        deadline = time.monotonic() + timeout
        while len(self.acked) < target:
            assert time.monotonic() < deadline, f"{what}: {target - len(self.acked)} acks short"
            await asyncio.sleep(0.05)


async def consume_until(
    consumer: headwater.Consumer, ledger: Ledger, done: asyncio.Event, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (done.is_set() and ledger.acked <= ledger.seen):
        try:
            message = await consumer.receive(timeout=0.5)
        except TimeoutError:
            continue
        except headwater.HeadwaterError:
            await asyncio.sleep(0.1)  # a leg's broker went away; the consumer re-routes
            continue
        ledger.delivered(message)
        with contextlib.suppress(headwater.HeadwaterError):  # its broker went: delivered again
            await message.ack()


async def audit(client: headwater.Client, topic: str, wanted: set[bytes]) -> str:
    """Why `wanted` was not delivered: read the topic afresh (a new subscription from the
    earliest offset) to tell lost messages from a consumer that stopped getting them."""
    consumer = await client.subscribe(topic, f"audit-{time.monotonic_ns()}", start="earliest")
    found: dict[bytes, tuple[int, int]] = {}
    deadline = time.monotonic() + 15
    while not wanted <= found.keys() and time.monotonic() < deadline:
        try:
            message = await consumer.receive(timeout=0.5)
        except TimeoutError:
            continue
        if message.value in wanted:
            found[message.value] = (message.partition, message.offset)
        await message.ack()
    await consumer.close()
    missing = sorted(wanted - found.keys())
    return (
        f"{len(wanted)} undelivered; in the log now: {sorted(found.items())[:8]}; "
        f"not in the log: {missing[:8]}"
    )


def stuck(producer: headwater.Producer) -> str:
    """What a producer that does not finish is waiting for (for the failure message)."""
    sender, accumulator = producer._sender, producer._accumulator
    router = producer._router
    batches = [
        (b.partition, b.attempts, round(b.not_before - time.monotonic(), 2))
        for b in [*accumulator.queue, *accumulator.in_flight]
    ]
    routes = router.table.topics.get(producer.topic) if router is not None else None
    brokers = router.table.brokers if router is not None else None
    return (
        f"batches (partition, attempts, due in s): {batches[:10]}; routes: {routes}; "
        f"brokers: {brokers}; peers: {list(sender.peers)}; task: {sender._task}"
    )


async def test_kill9_rounds_under_load_lose_nothing_and_never_reuse_an_offset(
    cluster: Cluster,
) -> None:
    rounds = 6 if SOAK else 2
    rng = random.Random(16)
    await start_three(cluster)
    client = await headwater.connect(await cluster.address("b1"))
    try:
        await client.create_topic("load", partitions=6)
        await cluster.wait_owned("load", 6, set(BROKERS))
        consumer = await client.subscribe("load", "s", start="earliest")
        producer = client.producer("load")
        ledger = Ledger()
        done = asyncio.Event()
        failed: list[BaseException] = []

        async def produce_one(i: int) -> None:
            value = f"m-{i}".encode()
            try:
                await (await producer.send(value, key=str(i).encode()))
            except headwater.HeadwaterError as exc:
                failed.append(exc)  # not acknowledged: may or may not be delivered
                return
            ledger.acked.add(value)

        stop_producing = asyncio.Event()

        async def produce() -> None:
            i = 0
            while not stop_producing.is_set() and i < 200_000:
                await asyncio.gather(*(produce_one(i + j) for j in range(8)))
                i += 8
            done.set()

        producing = asyncio.ensure_future(produce())
        consuming = asyncio.ensure_future(consume_until(consumer, ledger, done, 120))
        # the bootstrap broker first, then at random; each kill after a random number of acks
        # (a random moment in the stream, whatever the machine's speed)
        victims = ["b1"] + [rng.choice(BROKERS) for _ in range(rounds - 1)]
        for victim in victims:
            await ledger.more_acked(rng.randint(20, 150), f"traffic before killing {victim}")
            cluster.brokers[victim].kill()
            await cluster.wait_owned("load", 6, set(BROKERS) - {victim}, timeout=30)
            await asyncio.to_thread(cluster.start_broker, victim)
        await ledger.more_acked(200 if SOAK else 100, "traffic after the last restart")
        stop_producing.set()
        try:
            await asyncio.wait_for(asyncio.shield(producing), 150 if SOAK else 60)
        except TimeoutError:
            raise AssertionError(f"the producer is stuck: {stuck(producer)}") from None
        await asyncio.wait_for(consuming, 130)
        assert len(ledger.acked) > 100
        assert not ledger.clashes, f"offsets given to two messages: {ledger.clashes[:5]}"
        lost = ledger.acked - ledger.seen
        if lost:  # why: read afresh on a new connection (the first one's broker was killed)
            async with await headwater.connect(await cluster.address("b1")) as fresh:
                raise AssertionError(await audit(fresh, "load", lost))
        await producer.close()
        await consumer.close()
    finally:
        await client.close()


async def test_joins_and_graceful_restarts_under_load_lose_nothing(cluster: Cluster) -> None:
    """b3 joins while the producer runs (partitions move to it by hand-off), then b2 and b1 (the
    bootstrap broker) are stopped gracefully and started again, under produce and consume."""
    await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in ("b1", "b2")))
    client = await headwater.connect(await cluster.address("b1"))
    try:
        await client.create_topic("moving", partitions=6)
        await cluster.wait_owned("moving", 6, {"b1", "b2"})
        consumer = await client.subscribe("moving", "s", start="earliest")
        producer = client.producer("moving")
        ledger = Ledger()
        done = asyncio.Event()

        async def produce_one(i: int) -> None:
            value = f"m-{i}".encode()
            with contextlib.suppress(headwater.HeadwaterError):  # not acknowledged
                await (await producer.send(value, key=str(i).encode()))
                ledger.acked.add(value)

        async def produce() -> None:
            i = 0
            while not stop_producing.is_set() and i < 200_000:
                await asyncio.gather(*(produce_one(i + j) for j in range(8)))
                i += 8
            done.set()

        stop_producing = asyncio.Event()
        producing = asyncio.ensure_future(produce())
        consuming = asyncio.ensure_future(consume_until(consumer, ledger, done, 120))
        await ledger.more_acked(50, "traffic before the join")
        await asyncio.to_thread(cluster.start_broker, "b3")
        await cluster.wait_owned("moving", 6, set(BROKERS))
        deadline = time.monotonic() + 20
        while "b3" not in (await cluster.owners("moving")).values():
            assert time.monotonic() < deadline, "no partition moved to the joining broker"
            await asyncio.sleep(0.1)
        for leaving in ("b1",) if not SOAK else ("b2", "b1", "b3", "b2", "b1"):
            await ledger.more_acked(50, f"traffic before {leaving} restarts")
            assert await asyncio.to_thread(cluster.brokers[leaving].stop) == 0
            await cluster.wait_owned("moving", 6, set(BROKERS) - {leaving}, timeout=20)
            await asyncio.to_thread(cluster.start_broker, leaving)
        await ledger.more_acked(50, "traffic after the restarts")
        stop_producing.set()
        await asyncio.wait_for(producing, 60)
        await asyncio.wait_for(consuming, 130)
        assert len(ledger.acked) > 100
        assert not ledger.clashes, f"offsets given to two messages: {ledger.clashes[:5]}"
        lost = ledger.acked - ledger.seen
        assert not lost, f"{len(lost)} acknowledged messages never delivered: {sorted(lost)[:5]}"
        await producer.close()
        await consumer.close()
    finally:
        await client.close()


async def test_a_take_over_through_a_failing_object_store_serves_nothing_wrong(
    tmp_path: Path, s3: MotoS3, bucket: str
) -> None:
    """kill -9 of an owner while the object store cuts connections at random (requests and
    responses), then stops answering for a while: the take-over waits or retries, and then
    serves exactly the acknowledged log."""
    proxy = await FaultyProxy(int(s3.endpoint_url.rsplit(":", 1)[1]), seed=16).start()
    etcd = EtcdServer(tmp_path / "etcd").start()
    cluster = Cluster(tmp_path, etcd, s3, bucket, LEASE_TTL_MS, f"http://{proxy.address}")
    try:
        await start_three(cluster)
        client = await headwater.connect(await cluster.address("b1"))
        try:
            await client.create_topic("flaky", partitions=3)
            owner_of = await cluster.wait_owned("flaky", 3, set(BROKERS))
            consumer = await client.subscribe("flaky", "s", start="earliest")
            producer = client.producer("flaky")
            ledger = Ledger()
            done = asyncio.Event()
            stop = asyncio.Event()

            async def produce_one(i: int) -> None:
                value = f"m-{i}".encode()
                with contextlib.suppress(headwater.HeadwaterError):  # not acknowledged
                    await (await producer.send(value, key=str(i).encode()))
                    ledger.acked.add(value)

            async def produce() -> None:
                i = 0
                while not stop.is_set() and i < 100_000:
                    await asyncio.gather(*(produce_one(i + j) for j in range(4)))
                    i += 4
                done.set()

            producing = asyncio.ensure_future(produce())
            consuming = asyncio.ensure_future(consume_until(consumer, ledger, done, 120))
            await ledger.more_acked(20, "traffic before the faults")
            proxy.drop_requests = proxy.drop_responses = 0.15
            victim = next(b for b in ("b2", "b3") if b in owner_of.values())
            cluster.brokers[victim].kill()
            await asyncio.sleep(LEASE_TTL_MS / 1000 + 0.5)  # its lease runs out: take-overs start
            proxy.pause()
            await asyncio.sleep(2)
            proxy.resume()
            await cluster.wait_owned("flaky", 3, set(BROKERS) - {victim}, timeout=30)
            await ledger.more_acked(5, "traffic through the failing store after the take-over")
            proxy.drop_requests = proxy.drop_responses = 0.0
            await ledger.more_acked(20, "traffic once the store is healthy")
            stop.set()
            await asyncio.wait_for(producing, 90)
            await asyncio.wait_for(consuming, 130)
            assert proxy.cuts > 0
            assert len(ledger.acked) > 20
            assert not ledger.clashes, f"offsets given to two messages: {ledger.clashes[:5]}"
            lost = ledger.acked - ledger.seen
            assert not lost, f"{len(lost)} acknowledged never delivered: {sorted(lost)[:5]}"
            with contextlib.suppress(headwater.HeadwaterError):
                await producer.close()
            await consumer.close()
        finally:
            await client.close()
    finally:
        cluster.stop_all()
        etcd.kill()
        await proxy.close()


async def test_map_sets_racing_a_kill9_read_back_the_last_acknowledged_or_newer(
    cluster: Cluster,
) -> None:
    await start_three(cluster)
    client = await headwater.connect(await cluster.address("b1"))
    try:
        await client.create_topic("kv", partitions=3, configs={"last.value": "true"})
        owner_of = await cluster.wait_owned("kv", 3, set(BROKERS))
        kv = client.map("kv")
        keys = [f"key-{i}" for i in range(9)]
        acked = dict.fromkeys(keys, -1)
        tried = dict.fromkeys(keys, -1)
        stop = asyncio.Event()

        async def writer(key: str) -> None:
            for i in range(100_000):
                if stop.is_set():
                    return
                tried[key] = i
                try:
                    await kv.set(key, str(i))
                except headwater.HeadwaterError:
                    await asyncio.sleep(0.05)  # not acknowledged; the next set goes on
                    continue
                acked[key] = i

        writing = [asyncio.ensure_future(writer(k)) for k in keys]

        async def every_key_acked_past(marks: dict[str, int], what: str) -> None:
            deadline = time.monotonic() + 60  # bounds a hang only
            while any(acked[k] <= marks[k] for k in keys):
                assert time.monotonic() < deadline, f"{what}: {acked} (marks {marks})"
                await asyncio.sleep(0.05)

        await every_key_acked_past(dict.fromkeys(keys, 3), "sets before the kill")
        victim = next(b for b in ("b2", "b3") if b in owner_of.values())
        cluster.brokers[victim].kill()
        await cluster.wait_owned("kv", 3, set(BROKERS) - {victim}, timeout=30)
        await every_key_acked_past(dict(acked), "sets after the take-over")
        stop.set()
        await asyncio.wait_for(asyncio.gather(*writing), 60)
        for key in keys:
            found = await kv.get(key)
            assert found is not None and found.value is not None, key
            value = int(found.value)
            assert acked[key] <= value <= tried[key], (key, value, acked[key], tried[key])
    finally:
        await client.close()


async def test_a_latest_subscription_reaching_a_joined_broker_keeps_its_cursors(
    cluster: Cluster,
) -> None:
    """A `latest` subscription has unread messages in partitions that move by hand-off to a
    broker that joins: its consumer, back, subscribes there too (a new leg), which must continue
    from the cursors the previous owners checkpointed, not create the subscription afresh at the
    latest offset (skipping the unread messages)."""
    await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in ("b1", "b2")))
    client = await headwater.connect(await cluster.address("b1"))
    try:
        await client.create_topic("late", partitions=6)
        await cluster.wait_owned("late", 6, {"b1", "b2"})
        consumer = await client.subscribe("late", "s", start="latest")
        async with await headwater.connect(await cluster.address("b2")) as b2:
            deadline = time.monotonic() + 30  # bounds a hang only
            while not await b2.list_subscriptions("late"):  # the second leg (b2) subscribes too
                assert time.monotonic() < deadline, "no leg at b2"
                await asyncio.sleep(0.05)
        await consumer.close()  # the subscription stays; its consumer comes back later
        producer = client.producer("late")
        unread = {f"unread-{i}".encode() for i in range(60)}
        for value in sorted(unread):
            await (await producer.send(value, key=value))
        await asyncio.to_thread(cluster.start_broker, "b3")
        deadline = time.monotonic() + 20
        while "b3" not in (await cluster.owners("late")).values():
            assert time.monotonic() < deadline, "no partition moved to the joining broker"
            await asyncio.sleep(0.1)
        await cluster.wait_owned("late", 6, set(BROKERS))
        consumer = await client.subscribe("late", "s", start="latest")
        seen: set[bytes] = set()
        deadline = time.monotonic() + 30
        while not unread <= seen and time.monotonic() < deadline:
            try:
                message = await consumer.receive(timeout=0.5)
            except TimeoutError:
                continue
            assert message.value is not None
            seen.add(message.value)
            await message.ack()
        assert unread <= seen, f"{len(unread - seen)} unread messages skipped after the move"
        await producer.close()
        await consumer.close()
    finally:
        await client.close()
