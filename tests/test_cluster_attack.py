"""Attacks on the cluster's data path, on real processes (three brokers, etcd, moto's S3, loopback):
kill -9 of brokers (the bootstrap one too) under produce load from the Python client, graceful
restarts racing produce and consume, topics deleted and re-created under the same name (the object
store and etcd are shared, so nothing of the old topic may leak into the new one).

Each test checks the promises: every acknowledged message is delivered at least once, and no
(partition, offset) is ever delivered with two different values.

The default run is short (it is part of `make test`). `HEADWATER_CLUSTER_SOAK=1` runs the longer
variants: more kill rounds and more messages.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import headwater
from headwater.server.tail_commit import TailCommitter
from headwater.storage.cloud_tail import Chunk, CloudTail
from headwater.storage.objectstore import LocalObjectStore
from headwater.wire.records import build_batch, stamp_base_offset
from tests.cluster_support import Cluster
from tests.etcd_support import EtcdServer
from tests.proxy import FaultyProxy
from tests.s3 import MotoS3

LEASE_TTL_MS = 2000
SOAK = os.environ.get("HEADWATER_CLUSTER_SOAK") == "1"
BROKERS = ("b1", "b2", "b3")


@pytest.fixture
def cluster(tmp_path: Path, s3: MotoS3, bucket: str) -> Iterator[Cluster]:
    etcd = EtcdServer(tmp_path / "etcd").start()
    cluster = Cluster(tmp_path, etcd, s3, bucket, LEASE_TTL_MS)
    try:
        yield cluster
    finally:
        cluster.stop_all()
        etcd.kill()


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

        async def produce() -> None:
            i = 0
            stop_at = time.monotonic() + (60 if SOAK else 12) + rounds * 3
            while time.monotonic() < stop_at and i < 200_000:
                await asyncio.gather(*(produce_one(i + j) for j in range(8)))
                i += 8
            done.set()

        producing = asyncio.ensure_future(produce())
        consuming = asyncio.ensure_future(consume_until(consumer, ledger, done, 60))
        # the bootstrap broker first, then at random
        victims = ["b1"] + [rng.choice(BROKERS) for _ in range(rounds - 1)]
        for victim in victims:
            await asyncio.sleep(rng.uniform(0.5, 2.0))
            cluster.brokers[victim].kill()
            await cluster.wait_owned("load", 6, set(BROKERS) - {victim}, timeout=20)
            await asyncio.to_thread(cluster.start_broker, victim)
        try:
            await asyncio.wait_for(asyncio.shield(producing), 60)
        except TimeoutError:
            raise AssertionError(f"the producer is stuck: {stuck(producer)}") from None
        await asyncio.wait_for(consuming, 70)
        assert len(ledger.acked) > 100
        assert not ledger.clashes, f"offsets given to two messages: {ledger.clashes[:5]}"
        lost = ledger.acked - ledger.seen
        assert not lost, await audit(client, "load", lost)
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
        await asyncio.sleep(1)
        await asyncio.to_thread(cluster.start_broker, "b3")
        await cluster.wait_owned("moving", 6, set(BROKERS))
        deadline = time.monotonic() + 20
        while "b3" not in (await cluster.owners("moving")).values():
            assert time.monotonic() < deadline, "no partition moved to the joining broker"
            await asyncio.sleep(0.1)
        for leaving in ("b2", "b1") if not SOAK else ("b2", "b1", "b3", "b2", "b1"):
            await asyncio.sleep(1)
            assert await asyncio.to_thread(cluster.brokers[leaving].stop) == 0
            await cluster.wait_owned("moving", 6, set(BROKERS) - {leaving}, timeout=20)
            await asyncio.to_thread(cluster.start_broker, leaving)
        await asyncio.sleep(1)
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


async def test_a_recreated_topic_has_nothing_of_the_deleted_one(cluster: Cluster) -> None:
    """The object store and etcd are shared: the old topic's tail chunks, epoch markers and cursor
    checkpoints must not come back in a topic re-created under the same name."""
    await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in ("b1", "b2")))
    first = await headwater.connect(await cluster.address("b1"))
    second = await headwater.connect(await cluster.address("b2"))
    try:
        await first.create_topic("t", partitions=2)
        await cluster.wait_owned("t", 2, {"b1", "b2"})
        producer = first.producer("t")
        old = {f"old-{i}".encode() for i in range(40)}
        for value in sorted(old):
            await (await producer.send(value, key=value))
        await producer.close()
        consumer = await first.subscribe("t", "s", start="earliest")
        got: set[bytes] = set()
        deadline = time.monotonic() + 20
        while got != old and time.monotonic() < deadline:
            message = await consumer.receive(timeout=5)
            assert message.value is not None
            got.add(message.value)
            await message.ack()
        assert got == old
        await asyncio.sleep(0.6)  # the acks reach etcd's cursor checkpoints (interval 200 ms)
        await consumer.close()
        await first.delete_topic("t")
        await second.create_topic("t", partitions=2)
        await cluster.wait_owned("t", 2, {"b1", "b2"})
        fresh_producer = second.producer("t")
        new = {f"new-{i}".encode() for i in range(10)}
        for value in sorted(new):
            await (await fresh_producer.send(value, key=value))
        await fresh_producer.close()
        consumer = await second.subscribe("t", "s", start="earliest")
        seen: list[headwater.Message] = []
        deadline = time.monotonic() + 10
        while len(seen) < len(new) and time.monotonic() < deadline:
            try:
                message = await consumer.receive(timeout=1)
            except TimeoutError:
                continue
            seen.append(message)
            await message.ack()
        values = {m.value for m in seen}
        assert not values & old, "the re-created topic served the deleted topic's messages"
        assert values == new, f"missing from the re-created topic: {sorted(new - values)}"
        assert all(m.offset < 10 for m in seen), [(m.partition, m.offset) for m in seen]
        await consumer.close()
    finally:
        await first.close()
        await second.close()


def stamped(values: list[bytes], base: int) -> bytes:
    batch = bytearray(build_batch([(None, v, ()) for v in values]))
    stamp_base_offset(batch, base)
    return bytes(batch)


async def test_a_chunk_failing_when_its_partition_was_lost_is_not_stored_after_a_reacquire(
    tmp_path: Path,
) -> None:
    """An etcd outage fences the owner while its chunk's PUT is being retried; etcd comes back
    with the lease alive and the partition is served again (same epoch), its log rebuilt, and a
    new batch takes the same offset. The old chunk (its producer was answered NOT_OWNER) must not
    land after that: it would give the new, acknowledged batch's offsets to other messages."""
    store = LocalObjectStore(tmp_path / "store")
    tail = CloudTail(store)
    serving = True
    committer = TailCommitter(
        tail,
        0.001,
        lambda topic, partition: serving,
        lambda topic, partition: 7,
        lambda topic, partition: headwater.NotOwner("owner=none"),
    )
    await tail.mark_epoch("t", 0, 7, 0)
    # the first chunk's PUT fails while a directory sits where its object goes
    blocker = tmp_path / "store" / Chunk(0, 1, 7).name("t", 0)
    blocker.mkdir(parents=True)
    old = committer.add("t", 0, 0, stamped([b"old"], 0), 1)
    deadline = time.monotonic() + 10
    while committer.failures == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert committer.failures > 0
    serving = False  # fenced
    committer.reset("t", 0)
    # etcd back within the PUT's retry delay, the lease alive: served again, the log rebuilt at
    # 0 (a take-over waits for the partition's PUT in flight first)
    serving = True
    await asyncio.wait_for(committer.settle("t", 0), 10)
    with pytest.raises(headwater.NotOwner):
        await old
    new = committer.add("t", 0, 0, stamped([b"new-1", b"new-2"], 0), 2)
    blocker.rmdir()
    await asyncio.wait_for(new, 10)
    await asyncio.wait_for(committer.settle("t", 0), 10)
    end, run = (await tail.state("t", 0)).resolve()
    assert end == 2
    assert run == [Chunk(0, 2, 7)]
    assert not (tmp_path / "store" / Chunk(0, 1, 7).name("t", 0)).exists()


async def partition_counts(clients: list[headwater.Client], name: str) -> list[int | None]:
    counts: list[int | None] = []
    for client in clients:
        found = [t.partitions for t in await client.list_topics() if t.name == name]
        counts.append(found[0] if found else None)
    return counts


async def test_a_name_created_on_three_brokers_at_once_exists_once_everywhere(
    cluster: Cluster,
) -> None:
    await start_three(cluster)
    clients = [await headwater.connect(await cluster.address(b)) for b in BROKERS]
    try:
        for round_ in range(20 if SOAK else 8):
            name = f"race-{round_}"
            answers = await asyncio.wait_for(
                asyncio.gather(
                    *(
                        c.create_topic(name, partitions=n)
                        for c, n in zip(clients, (2, 4, 3), strict=True)
                    ),
                    return_exceptions=True,
                ),
                30,
            )
            winners = [i for i, a in enumerate(answers) if a is None]
            assert len(winners) == 1, answers
            assert all(isinstance(a, headwater.TopicExists) for a in answers if a is not None), (
                answers
            )
            count = (2, 4, 3)[winners[0]]
            deadline = time.monotonic() + 10
            while (counts := await partition_counts(clients, name)) != [count] * 3:
                assert time.monotonic() < deadline, f"{name}: brokers see {counts}, not {count}"
                await asyncio.sleep(0.1)
            await cluster.wait_owned(name, count, set(BROKERS), timeout=20)
    finally:
        for client in clients:
            await client.close()


async def test_delete_while_producing_then_recreate_answers_everything_and_mixes_nothing(
    cluster: Cluster,
) -> None:
    await start_three(cluster)
    producing_client = await headwater.connect(await cluster.address("b1"))
    admin = await headwater.connect(await cluster.address("b2"))
    other = await headwater.connect(await cluster.address("b3"))
    try:
        await admin.create_topic("dp", partitions=3)
        await cluster.wait_owned("dp", 3, set(BROKERS))
        producer = producing_client.producer("dp")
        phase = "old"
        acked: dict[str, set[bytes]] = {"old": set(), "between": set(), "new": set()}
        errors: list[BaseException] = []
        stop = asyncio.Event()

        async def send(i: int) -> None:
            started = phase
            value = f"{started}-{i}".encode()
            try:
                await asyncio.wait_for(await producer.send(value, key=value), 45)
            except headwater.HeadwaterError as exc:
                errors.append(exc)
                return
            acked[started if started == phase else "between"].add(value)

        async def produce() -> None:
            i = 0
            while not stop.is_set() and i < 100_000:
                await asyncio.gather(*(send(i + j) for j in range(4)))
                i += 4
                await asyncio.sleep(0.01)

        producing = asyncio.ensure_future(produce())
        await asyncio.sleep(1.5)
        phase = "between"
        await asyncio.wait_for(other.delete_topic("dp"), 30)
        await asyncio.sleep(0.5)
        await asyncio.wait_for(admin.create_topic("dp", partitions=2), 30)
        await cluster.wait_owned("dp", 2, set(BROKERS))
        phase = "new"
        deadline = time.monotonic() + 30
        while len(acked["new"]) < 40:
            assert time.monotonic() < deadline, (
                f"after re-create only {len(acked['new'])} acked; errors: "
                f"{collections.Counter(repr(e)[:80] for e in errors).most_common(4)}"
            )
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(producing, 60)  # every send was answered
        with contextlib.suppress(headwater.UnknownTopic):  # flush reports the failed sends
            await producer.close()
        clients = [producing_client, admin, other]
        deadline = time.monotonic() + 10
        while (counts := await partition_counts(clients, "dp")) != [2, 2, 2]:
            assert time.monotonic() < deadline, f"brokers see {counts} partitions"
            await asyncio.sleep(0.1)
        consumer = await admin.subscribe("dp", "check", start="earliest")
        seen: set[bytes] = set()
        deadline = time.monotonic() + 30
        while not acked["new"] <= seen and time.monotonic() < deadline:
            try:
                message = await consumer.receive(timeout=0.5)
            except TimeoutError:
                continue
            assert message.value is not None
            seen.add(message.value)
            await message.ack()
        assert not seen & acked["old"], "the re-created topic holds the deleted topic's messages"
        assert acked["new"] <= seen, f"{len(acked['new'] - seen)} acknowledged never delivered"
        await consumer.close()
    finally:
        for client in (producing_client, admin, other):
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
            await asyncio.sleep(1)
            proxy.drop_requests = proxy.drop_responses = 0.15
            victim = next(b for b in ("b2", "b3") if b in owner_of.values())
            cluster.brokers[victim].kill()
            await asyncio.sleep(LEASE_TTL_MS / 1000 + 0.5)  # its lease runs out: take-overs start
            proxy.pause()
            await asyncio.sleep(2)
            proxy.resume()
            await cluster.wait_owned("flaky", 3, set(BROKERS) - {victim}, timeout=30)
            await asyncio.sleep(1)
            proxy.drop_requests = proxy.drop_responses = 0.0
            await asyncio.sleep(1)
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
        await asyncio.sleep(1)
        victim = next(b for b in ("b2", "b3") if b in owner_of.values())
        cluster.brokers[victim].kill()
        await cluster.wait_owned("kv", 3, set(BROKERS) - {victim}, timeout=20)
        await asyncio.sleep(1)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*writing), 60)
        for key in keys:
            found = await kv.get(key)
            assert found is not None and found.value is not None, key
            value = int(found.value)
            assert acked[key] <= value <= tried[key], (key, value, acked[key], tried[key])
    finally:
        await client.close()


async def test_a_segment_uploaded_as_its_partition_moved_collects_no_later_owners_chunk(
    tmp_path: Path,
) -> None:
    """Epoch 5 owned the partition up to 100 and had appended [100, 110) that it never stored;
    its upload of the segment [0, 110) began before epoch 9 took over at 100 and ended after
    epoch 9 had stored (and acknowledged) [100, 105) and [105, 108). Collecting for that segment
    must not delete epoch 9's chunks: the next take-over would read offsets 100..104 from the
    segment, which holds other messages there."""
    tail = CloudTail(LocalObjectStore(tmp_path / "store"))
    await tail.mark_epoch("t", 0, 5, 0)
    for first, end, epoch in ((0, 50, 5), (50, 100, 5)):
        await tail.put("t", 0, Chunk(first, end, epoch), stamped([b"a"] * (end - first), first))
    await tail.mark_epoch("t", 0, 9, 100)
    for first, end in ((100, 105), (105, 108)):
        await tail.put("t", 0, Chunk(first, end, 9), stamped([b"b"] * (end - first), first))
    assert await tail.collect("t", 0, 0, 110, epoch=5) == 2
    end, run = (await tail.state("t", 0)).resolve()
    assert end == 108
    assert run == [Chunk(100, 105, 9), Chunk(105, 108, 9)]


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
        await asyncio.sleep(1)  # the second leg (b2) subscribes too
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


async def test_a_batch_for_a_partition_past_the_count_fails_at_once_and_blocks_nothing(
    cluster: Cluster,
) -> None:
    """A batch for a partition the topic no longer has (it was deleted and re-created with fewer
    partitions while the batch waited) waited the whole owner backoff (30 s) with every batch
    queued behind it, then failed them all with NOT_OWNER."""
    await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in ("b1", "b2")))
    client = await headwater.connect(await cluster.address("b1"))
    try:
        await client.create_topic("few", partitions=2)
        await cluster.wait_owned("few", 2, {"b1", "b2"})
        await client.lookup("few")
        producer = client.producer("few")
        started = time.monotonic()
        bad = await producer.send(b"nowhere", partition=5)
        good = await producer.send(b"somewhere", partition=1)
        with pytest.raises(headwater.InvalidPartition):
            await asyncio.wait_for(bad, 10)
        await asyncio.wait_for(good, 10)
        assert time.monotonic() - started < 5
        with contextlib.suppress(headwater.InvalidPartition):
            await producer.close()
    finally:
        await client.close()


async def test_the_purge_of_a_deleted_topic_spares_a_recreated_ones_tail(tmp_path: Path) -> None:
    """The deleting broker purges the tail after the delete; a topic re-created under the name
    meanwhile (epochs above the delete's revision) has already written its marker and chunks
    under the same prefix, and must keep them."""
    tail = CloudTail(LocalObjectStore(tmp_path / "store"))
    await tail.mark_epoch("t", 0, 5, 0)
    await tail.put("t", 0, Chunk(0, 3, 5), stamped([b"old"] * 3, 0))
    await tail.put("t", 0, Chunk(3, 4, 5), stamped([b"old"], 3))
    await tail.mark_epoch("t", 0, 21, 0)  # re-created: the delete happened at revision 17
    await tail.put("t", 0, Chunk(0, 2, 21), stamped([b"new"] * 2, 0))
    assert await tail.purge("t", 17) == 3
    state = await tail.state("t", 0)
    assert state.markers == {21: 0}
    assert state.resolve() == (2, [Chunk(0, 2, 21)])
    assert (await tail.state("t", 0)).since(21).resolve() == (2, [Chunk(0, 2, 21)])
