"""Attacks on a cluster's topics, on real processes (three brokers, etcd, moto's S3, loopback): the
same name created on three brokers at once, a topic deleted while producers send to it and
re-created (the object store and etcd are shared: nothing of the old topic may leak into the new
one), and a producer's batch for a partition the re-created topic no longer has. The data-path
attacks (kill -9, hand-offs, a failing object store) are in tests/test_cluster_attack.py.

`HEADWATER_CLUSTER_SOAK=1` runs more rounds of the create race.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable

import pytest

import headwater
from tests.support.cluster_support import Cluster
from tests.test_cluster_attack import BROKERS, SOAK, cluster, start_three

__all__ = ["cluster"]  # the fixture, shared with tests.test_cluster_attack


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
            message = await consumer.receive(timeout=30)
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
        deadline = time.monotonic() + 30  # bounds a hang only
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

        answered = 0  # sends answered (acked or failed)

        async def until(condition: Callable[[], bool], what: str) -> None:
            deadline = time.monotonic() + 60  # bounds a hang only
            while not condition():
                assert time.monotonic() < deadline, f"{what}: errors {errors[-3:]}"
                await asyncio.sleep(0.01)

        async def send(i: int) -> None:
            nonlocal answered
            started = phase
            value = f"{started}-{i}".encode()
            try:
                await asyncio.wait_for(await producer.send(value, key=value), 45)
            except headwater.HeadwaterError as exc:
                errors.append(exc)
                return
            finally:
                answered += 1
            acked[started if started == phase else "between"].add(value)

        async def produce() -> None:
            i = 0
            while not stop.is_set() and i < 100_000:
                await asyncio.gather(*(send(i + j) for j in range(4)))
                i += 4
                await asyncio.sleep(0.01)

        producing = asyncio.ensure_future(produce())
        await until(lambda: len(acked["old"]) >= 40, "messages acked in the old topic")
        phase = "between"
        await asyncio.wait_for(other.delete_topic("dp"), 30)
        gone = answered
        await until(lambda: answered >= gone + 8, "sends answered after the delete")
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
        deadline = time.monotonic() + 30  # bounds a hang only
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
