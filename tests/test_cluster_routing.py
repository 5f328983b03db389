"""The Python client's routing heals itself on a real cluster (three brokers, etcd, moto's S3,
loopback): a request for an explicit partition finds its owner (issue 21, failure 4), a client
without `reconnect` gets back to a bootstrap broker that was killed and restarted on its address
(failure 3), and a consumer leg that cannot be placed ends the consumer with an error after the
router's backoff instead of waiting silently.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import headwater
from headwater.client.routing_table import LookupBackoff
from tests.support.cluster_support import Cluster, running_cluster
from tests.support.s3 import MotoS3

LEASE_TTL_MS = 2000
BROKERS = ("b1", "b2", "b3")


@pytest.fixture
def cluster(tmp_path: Path, s3: MotoS3, bucket: str) -> Iterator[Cluster]:
    with running_cluster(tmp_path, s3, bucket, LEASE_TTL_MS) as cluster:
        yield cluster


async def start_three(cluster: Cluster) -> None:
    await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in BROKERS))


async def test_send_to_an_explicit_partition_goes_to_its_owner(cluster: Cluster) -> None:
    """Failure 4: a fresh producer's `send(partition=P)` went to the bootstrap broker without a
    lookup and got NOT_OWNER for every partition that broker does not own; so did
    `headwater produce --partition`."""
    await start_three(cluster)
    bootstrap = await cluster.address("b1")
    async with await headwater.connect(bootstrap) as admin:
        await admin.create_topic("direct", partitions=6)
    owners = await cluster.wait_owned("direct", 6, set(BROKERS))
    elsewhere = [p for p, owner in owners.items() if owner != "b1"]
    assert elsewhere, f"b1 owns every partition: {owners}"  # balanced: 2 each
    async with await headwater.connect(bootstrap) as client:
        producer = client.producer("direct")
        for partition in range(6):
            future = await producer.send(f"to-{partition}".encode(), partition=partition)
            meta = await asyncio.wait_for(future, 60)
            assert meta.partition == partition
        await producer.close()
    for partition in elsewhere:
        cli = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "headwater", "--server", bootstrap, "produce", "direct",
             f"cli-{partition}", "--partition", str(partition)],
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
    async with await headwater.connect(bootstrap) as reader:
        consumer = await reader.subscribe("direct", "check", start="earliest")
        wanted = {(p, f"to-{p}".encode()) for p in range(6)}
        wanted |= {(p, f"cli-{p}".encode()) for p in elsewhere}
        seen: set[tuple[int, bytes | None]] = set()
        deadline = time.monotonic() + 60
        while not wanted <= seen and time.monotonic() < deadline:
            with_timeout = await _receive(consumer, 0.5)
            if with_timeout is not None:
                seen.add((with_timeout.partition, with_timeout.value))
                await with_timeout.ack()
        assert wanted <= seen, f"missing: {sorted(wanted - seen)}"


@pytest.mark.timeout(300)  # a kill, a restart and two graceful stops of brokers, under load
async def test_a_restarted_bootstrap_broker_is_reached_again_without_reconnect(
    cluster: Cluster,
) -> None:
    """Failure 3: the bootstrap broker killed with kill -9 and restarted on its address, then
    the only broker serving the topics: a client made without `reconnect=True` never reached
    it again (its consumer got nothing, with no error; map sets failed with ConnectionLost)."""
    await start_three(cluster)
    bootstrap = await cluster.address("b1")
    client = await headwater.connect(bootstrap)  # no reconnect policy
    try:
        await client.create_topic("events", partitions=6)
        await client.create_topic("kv", partitions=3, configs={"last.value": "true"})
        await cluster.wait_owned("events", 6, set(BROKERS))
        await cluster.wait_owned("kv", 3, set(BROKERS))
        consumer = await client.subscribe("events", "s", start="earliest")
        kv = client.map("kv")
        await kv.set("before", "kill")
        cluster.brokers["b1"].kill()
        await cluster.wait_owned("events", 6, {"b2", "b3"}, timeout=30)
        await asyncio.to_thread(cluster.restart_broker, "b1")
        assert await cluster.address("b1") == bootstrap
        # b2 and b3 leave gracefully: b1, back on the bootstrap address, serves everything
        await asyncio.gather(
            *(asyncio.to_thread(cluster.brokers[b].stop, 30) for b in ("b2", "b3"))
        )
        await cluster.wait_owned("events", 6, {"b1"}, timeout=30)
        await cluster.wait_owned("kv", 3, {"b1"}, timeout=30)

        producer = client.producer("events")
        sent = {f"after-{i}".encode() for i in range(60)}
        for value in sorted(sent):
            await asyncio.wait_for(await producer.send(value, key=value), 60)
        seen: set[bytes | None] = set()
        deadline = time.monotonic() + 60
        while not sent <= seen and time.monotonic() < deadline:
            message = await _receive(consumer, 0.5)
            if message is not None:
                seen.add(message.value)
                await message.ack()
        assert sent <= seen, f"{len(sent - seen)} of {len(sent)} never delivered"

        for i in range(6):
            await asyncio.wait_for(kv.set(f"key-{i}", f"value-{i}"), 60)
        for i in range(6):
            found = await asyncio.wait_for(kv.get(f"key-{i}"), 60)
            assert found is not None and found.value == f"value-{i}".encode()
        names = {t.name for t in await asyncio.wait_for(client.list_topics(), 60)}
        assert {"events", "kv"} <= names
        await producer.close()
        await consumer.close()
    finally:
        await client.close()


async def test_a_leg_that_cannot_be_placed_ends_the_consumer_after_the_backoff(
    cluster: Cluster,
) -> None:
    """Every broker but the bootstrap one gone for good (and the bootstrap one not taking their
    partitions: it is stopped too, after the consumer saw the topic): the consumer does not wait
    silently for ever, its `receive` raises once the router's backoff ran out."""
    await start_three(cluster)
    client = await headwater.connect(await cluster.address("b1"))
    try:
        await client.create_topic("stranded", partitions=6)
        await cluster.wait_owned("stranded", 6, set(BROKERS))
        client._router.backoff = LookupBackoff(initial=0.05, maximum=0.5, timeout=3.0)
        await _known(client, "stranded")  # routes known: the consumer gets its legs at once
        consumer = await client.subscribe("stranded", "s", start="earliest")
        assert consumer._cluster is not None  # a cluster consumer, with legs
        for broker in BROKERS:
            cluster.brokers[broker].kill()
        deadline = time.monotonic() + 60  # bounds a hang only: the backoff is 3 s
        with pytest.raises(headwater.HeadwaterError) as raised:
            while time.monotonic() < deadline:
                await _receive(consumer, 0.5)
        assert "stranded" in raised.value.message
    finally:
        await client.close()


async def _receive(consumer: headwater.Consumer, timeout: float) -> headwater.Message | None:
    try:
        return await consumer.receive(timeout=timeout)
    except TimeoutError:
        return None


async def test_exclusive_is_exclusive_across_brokers(cluster: Cluster) -> None:
    """Failure 2: two clients subscribing to one Exclusive subscription at the same moment
    through two brokers both succeeded (each broker saw only its own consumers); both got
    messages, then both CONSUMER_BUSY with their legs still attached. Now the subscription has
    one holder in the whole cluster: one subscribe wins, the other gets CONSUMER_BUSY, the winner
    gets every message, and once it closes the other can subscribe."""
    await start_three(cluster)
    first = await headwater.connect(await cluster.address("b1"))
    second = await headwater.connect(await cluster.address("b2"))
    try:
        await first.create_topic("solo", partitions=6)
        await cluster.wait_owned("solo", 6, set(BROKERS))
        await _known(first, "solo")  # routes known: each consumer gets its legs at subscribe
        await _known(second, "solo")
        producer = first.producer("solo")
        for round_ in range(3):
            name = f"sub-{round_}"
            results = await asyncio.gather(
                first.subscribe("solo", name, type="exclusive", start="earliest"),
                second.subscribe("solo", name, type="exclusive", start="earliest"),
                return_exceptions=True,
            )
            won = [r for r in results if isinstance(r, headwater.Consumer)]
            refused = [r for r in results if isinstance(r, headwater.ConsumerBusy)]
            assert len(won) == 1 and len(refused) == 1, f"round {round_}: {results}"
            winner = won[0]
            sent = {f"{name}-{i}".encode() for i in range(60)}
            for value in sorted(sent):
                await asyncio.wait_for(await producer.send(value, key=value), 60)
            seen: set[bytes | None] = set()
            deadline = time.monotonic() + 60
            while not sent <= seen and time.monotonic() < deadline:
                message = await _receive(winner, 0.5)
                if message is not None:
                    seen.add(message.value)
                    await message.ack()
            assert sent <= seen, f"round {round_}: {len(sent - seen)} never reached the holder"
            loser = second if results[0] is winner else first
            await winner.close()
            # the holder gone, the other client takes the subscription over (bounded retries:
            # the release reaches etcd after the close)
            deadline = time.monotonic() + 30
            while True:
                try:
                    taken = await loser.subscribe("solo", name, type="exclusive")
                    break
                except headwater.ConsumerBusy:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
            await taken.close()
        await producer.close()
    finally:
        await first.close()
        await second.close()


async def test_key_shared_gives_a_key_to_one_consumer_on_every_broker(cluster: Cluster) -> None:
    """The Key_Shared ring is built from consumer names, which a consumer's legs share: every
    broker with the same consumers attached computes the same ring, so records of one key sent
    to partitions of three different owners all reach the same one of two consumers."""
    await start_three(cluster)
    one = await headwater.connect(await cluster.address("b1"))
    two = await headwater.connect(await cluster.address("b2"))
    try:
        await one.create_topic("keyed", partitions=6)
        owners = await cluster.wait_owned("keyed", 6, set(BROKERS))
        await _known(one, "keyed")
        await _known(two, "keyed")
        # one partition per owner: a key's records go to three brokers
        spread = sorted({owner: p for p, owner in owners.items()}.values())
        assert len(spread) == 3, owners
        consumers = {
            name: await client.subscribe("keyed", "ks", type="key_shared", start="earliest")
            for name, client in (("one", one), ("two", two))
        }
        deadline = time.monotonic() + 60
        while any(len(_legs(c)) < 3 for c in consumers.values()):  # a leg at every owner
            assert time.monotonic() < deadline, "legs not placed in 60s"
            await asyncio.sleep(0.1)
        producer = one.producer("keyed")
        sent = set()
        for key in range(20):
            for partition in spread:
                value = f"k{key}-p{partition}".encode()
                await asyncio.wait_for(
                    await producer.send(value, key=f"k{key}".encode(), partition=partition), 60
                )
                sent.add(value)
        got: dict[bytes, set[str]] = {}
        received: set[bytes | None] = set()
        deadline = time.monotonic() + 60
        while not sent <= received and time.monotonic() < deadline:
            for name, consumer in consumers.items():
                message = await _receive(consumer, 0.2)
                if message is not None:
                    received.add(message.value)
                    assert message.key is not None
                    got.setdefault(message.key, set()).add(name)
                    await message.ack()
        assert sent <= received, f"{len(sent - received)} never delivered"
        split = {key: names for key, names in got.items() if len(names) > 1}
        assert not split, f"keys given to both consumers: {split}"
        assert len({n for names in got.values() for n in names}) == 2  # both had keys
        await producer.close()
    finally:
        await one.close()
        await two.close()


def _legs(consumer: headwater.Consumer) -> list[object]:
    legs = consumer._cluster.legs if consumer._cluster is not None else {}
    return [leg for leg in legs.values() if leg.consumer_id >= 0 and leg._error is None]


async def test_partitions_added_in_a_cluster_are_owned_served_and_consumed(
    cluster: Cluster,
) -> None:
    """CREATE_PARTITIONS was refused in a cluster (NOT_SUPPORTED). Now the count grows in etcd,
    every broker grows its copy, the new partitions get owners, and a consumer subscribed before
    the growth gets what is produced to them (its cursors there start at their beginning)."""
    await start_three(cluster)
    client = await headwater.connect(await cluster.address("b1"))
    other = await headwater.connect(await cluster.address("b3"))
    try:
        await client.create_topic("growing", partitions=3)
        await cluster.wait_owned("growing", 3, set(BROKERS))
        await _known(client, "growing")
        consumer = await client.subscribe("growing", "s", start="earliest")
        await client.create_partitions("growing", 6)
        await client.create_partitions("growing", 6)  # again: nothing to do, no error
        with pytest.raises(headwater.InvalidRequest):
            await client.create_partitions("growing", 4)  # never fewer
        await cluster.wait_owned("growing", 6, set(BROKERS), timeout=60)
        await _known(other, "growing", 6)  # b3 grows its copy from the watch
        assert len(await other.lookup("growing")) == 6
        producer = other.producer("growing")
        sent = set()
        for partition in range(6):
            for i in range(5):
                value = f"p{partition}-{i}".encode()
                meta = await asyncio.wait_for(await producer.send(value, partition=partition), 60)
                assert meta.partition == partition
                sent.add(value)
        seen: dict[bytes | None, int] = {}
        deadline = time.monotonic() + 60
        while not sent <= seen.keys() and time.monotonic() < deadline:
            message = await _receive(consumer, 0.5)
            if message is not None:
                seen[message.value] = message.partition
                await message.ack()
        assert sent <= seen.keys(), f"never delivered: {sorted(sent - seen.keys())}"
        assert {seen[v] for v in sent} == set(range(6))
        await producer.close()
        await consumer.close()
    finally:
        await client.close()
        await other.close()


async def _known(client: headwater.Client, topic: str, partitions: int = 0) -> None:
    """Until the client's bootstrap broker knows the topic (with at least `partitions`
    partitions) with an owner for every partition: its watch of etcd may lag the broker that
    created or grew it by a moment; bounded."""
    deadline = time.monotonic() + 30
    while True:
        try:
            owners = await client.lookup(topic)
        except headwater.UnknownTopic:
            owners = {}
        if len(owners) >= max(partitions, 1) and all(o is not None for o in owners.values()):
            return
        assert time.monotonic() < deadline, f"{topic} not known with owners: {owners}"
        await asyncio.sleep(0.1)
