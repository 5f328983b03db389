"""Three brokers, a real etcd and moto's S3 on loopback: partitions spread, NOT_OWNER, kill -9
failover with nothing acknowledged lost, map values read back from the new owner, and a graceful
hand-off that redelivers nothing acked.

Each test talks to the owner of each partition, found from etcd's ownership keys
(`tests.support.cluster_support`), so the data path is checked independently of the client's
routing.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import headwater
from headwater.server.cluster.layout import balanced
from headwater.wire import messages as m
from headwater.wire.protocol import decode_push
from headwater.wire.records import build_batch, read_records
from tests.support.cluster_support import Cluster, running_cluster
from tests.support.etcd_support import EtcdServer, assert_never_overwritten, owner_history
from tests.support.proxy import FaultyProxy
from tests.support.rawwire import RawPeer
from tests.support.s3 import MotoS3

PARTITIONS = 6
LEASE_TTL_MS = 2000
TAKE_OVER_S = LEASE_TTL_MS / 1000 + 10  # the lease runs out, a rebalance round, the rebuild


@pytest.fixture
def cluster(tmp_path: Path, s3: MotoS3, bucket: str) -> Iterator[Cluster]:
    with running_cluster(tmp_path, s3, bucket, LEASE_TTL_MS) as cluster:
        yield cluster


class Owners:
    """A connection per broker, and the owner of each partition as etcd says."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.clients: dict[str, headwater.Client] = {}

    async def client(self, broker_id: str) -> headwater.Client:
        if broker_id not in self.clients:
            address = await self.cluster.address(broker_id)
            self.clients[broker_id] = await headwater.connect(address)
        return self.clients[broker_id]

    def forget(self, broker_id: str) -> None:
        self.clients.pop(broker_id, None)

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()


@pytest.fixture
async def owners(cluster: Cluster) -> AsyncIterator[Owners]:
    found = Owners(cluster)
    try:
        yield found
    finally:
        await found.close()


async def start_three(cluster: Cluster) -> None:
    await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in ("b1", "b2", "b3")))


async def produce(client: headwater.Client, topic: str, value: bytes, partition: int) -> int:
    """One acknowledged message to `partition` of this broker; its offset (no retries here:
    an error is the broker's answer)."""
    batch = build_batch([(None, value, ())])
    response = await client._request(m.ProduceRequest(topic, partition, batch))
    assert isinstance(response, m.ProduceResponse)
    return response.base_offset


async def produce_each(
    owners: Owners, topic: str, owner_of: dict[int, str], tag: str, count: int
) -> dict[int, list[bytes]]:
    """`count` acknowledged messages to every partition, each sent to its owner; a NOT_OWNER
    (the key is held but the take-over is not finished, or it moved) is retried at the owner
    etcd names then, as a client does (bounded)."""
    acked: dict[int, list[bytes]] = {}
    for partition, broker_id in sorted(owner_of.items()):
        values = [f"{tag}-{partition}-{i}".encode() for i in range(count)]
        for value in values:
            deadline = time.monotonic() + 30
            while True:
                try:
                    await produce(await owners.client(broker_id), topic, value, partition)
                    break
                except headwater.NotOwner:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)
                    broker_id = (await owners.cluster.owners(topic)).get(partition, broker_id)
        acked[partition] = values
    return acked


async def consume_all(
    owners: Owners,
    topic: str,
    brokers: list[str],
    wanted: set[bytes],
    timeout: float = 30.0,
    seen_before: frozenset[bytes] = frozenset(),
) -> set[bytes]:
    """Subscribe `s` on every broker and ack until `wanted` is all seen, counting what was seen
    (and acked) before (bounded): the values received."""
    consumers = [
        await (await owners.client(b)).subscribe(topic, "s", type="shared", start="earliest")
        for b in brokers
    ]
    seen: set[bytes] = set()
    deadline = time.monotonic() + timeout

    async def drain(consumer: headwater.Consumer) -> None:
        while not wanted <= seen | seen_before and time.monotonic() < deadline:
            try:
                message = await consumer.receive(timeout=0.5)
            except TimeoutError:
                continue
            seen.add(message.value)
            await message.ack()

    await asyncio.gather(*(drain(c) for c in consumers))
    for consumer in consumers:
        await consumer.close()
    return seen


async def test_partitions_spread_and_a_non_owner_answers_not_owner(
    cluster: Cluster, owners: Owners
) -> None:
    await start_three(cluster)
    first = await owners.client("b1")
    await first.create_topic("orders", partitions=PARTITIONS)
    # spread evenly (a broker that saw the topic before the others may take more first, and
    # hand the extra off: wait for the balance, bounded)
    deadline = time.monotonic() + 20
    while True:
        owner_of = await cluster.wait_owned("orders", PARTITIONS, {"b1", "b2", "b3"})
        if sorted(Counter(owner_of.values()).values()) == [2, 2, 2]:
            break
        assert time.monotonic() < deadline, f"not balanced: {owner_of}"
        await asyncio.sleep(0.2)
    await produce_each(owners, "orders", owner_of, "x", 1)  # each owner serves its own
    for _ in range(20):  # (a hand-off between reading etcd and producing: read again)
        partition, owner = next(iter(sorted((await cluster.owners("orders")).items())))
        stranger = next(b for b in ("b1", "b2", "b3") if b != owner)
        try:
            await produce(await owners.client(stranger), "orders", b"x", partition)
        except headwater.NotOwner as refused:
            host, port = refused.owner_address or ("", 0)
            if f"{host}:{port}" == await cluster.address(owner):
                break
    else:
        raise AssertionError("no NOT_OWNER naming the owner from a broker that is not it")
    # every broker knows the topic, and says in its metrics what it serves
    for broker_id in ("b1", "b2", "b3"):
        served = (await cluster.owners("orders")).values()
        metrics = cluster.metrics(broker_id)
        assert metrics["headwater_cluster_brokers"] == 3
        assert metrics["headwater_cluster_partitions_served"] == list(served).count(broker_id)
        assert metrics["headwater_cluster_serving_seconds"] > 0
    for broker_id in ("b1", "b2", "b3"):
        names = [t.name for t in await (await owners.client(broker_id)).list_topics()]
        assert "orders" in names


async def test_kill9_moves_partitions_and_loses_nothing_acknowledged(
    cluster: Cluster, owners: Owners
) -> None:
    await start_three(cluster)
    first = await owners.client("b1")
    await first.create_topic("orders", partitions=PARTITIONS)
    await first.create_topic("kv", partitions=3, configs={"last.value": "true"})
    owner_of = await cluster.wait_owned("orders", PARTITIONS, {"b1", "b2", "b3"})
    kv_owner = await cluster.wait_owned("kv", 3, {"b1", "b2", "b3"})
    before = await produce_each(owners, "orders", owner_of, "before", 20)
    # map values, each set at its key's owner
    keys = {f"key-{i}".encode(): f"value-{i}".encode() for i in range(12)}
    for key, value in keys.items():
        partition = headwater_partition(key, 3)
        await (await owners.client(kv_owner[partition])).map("kv").set(key, value)
    # consume part of it, acking, so cursors have moved before the kill
    seen = await consume_all(
        owners, "orders", ["b1", "b2", "b3"], {v for vs in before.values() for v in vs[:10]}
    )
    victim = owner_of[0]
    survivors = {"b1", "b2", "b3"} - {victim}
    cluster.brokers[victim].kill()
    owners.forget(victim)
    # within the lease timeout (and a rebalance round) the others own its partitions
    moved = await cluster.wait_owned("orders", PARTITIONS, survivors, timeout=TAKE_OVER_S)
    after = await produce_each(owners, "orders", moved, "after", 10)
    wanted = {v for vs in (*before.values(), *after.values()) for v in vs}
    seen |= await consume_all(
        owners, "orders", sorted(survivors), wanted, seen_before=frozenset(seen)
    )
    assert wanted <= seen, f"lost {len(wanted - seen)} acknowledged messages"
    # map values set before the kill read back from the new owner
    kv_moved = await cluster.wait_owned("kv", 3, survivors, timeout=TAKE_OVER_S)
    for key, value in keys.items():
        owner = kv_moved[headwater_partition(key, 3)]
        found = await (await owners.client(owner)).map("kv").get(key)
        assert found is not None and found.value == value


async def test_graceful_stop_hands_off_without_redelivering_acked(
    cluster: Cluster, owners: Owners
) -> None:
    await start_three(cluster)
    first = await owners.client("b1")
    await first.create_topic("orders", partitions=PARTITIONS)
    owner_of = await cluster.wait_owned("orders", PARTITIONS, {"b1", "b2", "b3"})
    acked = await produce_each(owners, "orders", owner_of, "one", 20)
    everything = {v for vs in acked.values() for v in vs}
    assert await consume_all(owners, "orders", ["b1", "b2", "b3"], everything) >= everything
    leaving = owner_of[0]
    staying = sorted({"b1", "b2", "b3"} - {leaving})
    await owners.clients.pop(leaving).close()
    assert cluster.brokers[leaving].stop() == 0
    moved = await cluster.wait_owned("orders", PARTITIONS, set(staying), timeout=20)
    fresh = await produce_each(owners, "orders", moved, "two", 5)
    wanted = {v for vs in fresh.values() for v in vs}
    consumers = [
        await (await owners.client(b)).subscribe("orders", "s", type="shared", start="earliest")
        for b in staying
    ]
    received: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(received) < len(wanted) and time.monotonic() < deadline:
        for consumer in consumers:
            try:
                message = await consumer.receive(timeout=0.2)
            except TimeoutError:
                continue
            received.append(message.value)
            await message.ack()
    assert sorted(received) == sorted(wanted)  # nothing acked came again


async def test_a_lost_object_store_holds_acks_and_deliveries_until_it_returns(
    tmp_path: Path, s3: MotoS3, bucket: str
) -> None:
    """Nothing is acknowledged, nor delivered, before it is in the object store: a consumer that
    acked a message the object store never got could skip another message given its offset
    after a take-over."""
    proxy = await FaultyProxy(int(s3.endpoint_url.rsplit(":", 1)[1])).start()
    etcd = EtcdServer(tmp_path / "etcd").start()
    cluster = Cluster(tmp_path, etcd, s3, bucket, LEASE_TTL_MS, f"http://{proxy.address}")
    try:
        cluster.start_broker("b1")
        async with await headwater.connect(await cluster.address("b1")) as client:
            await client.create_topic("orders")
            await cluster.wait_owned("orders", 1, {"b1"})
            await produce_each(Owners(cluster), "orders", {0: "b1"}, "up", 1)  # served, stored
            consumer = await client.subscribe("orders", "s", start="earliest")
            assert (await consumer.receive(timeout=30)).value == b"up-0-0"
            proxy.pause()
            produced = asyncio.ensure_future(produce(client, "orders", b"held", 0))
            with pytest.raises(TimeoutError):
                await consumer.receive(timeout=2)  # appended here, not yet stored: not sent
            assert not produced.done()
            proxy.resume()
            assert await asyncio.wait_for(produced, 60) == 1
            assert (await consumer.receive(timeout=30)).value == b"held"
    finally:
        cluster.stop_all()
        etcd.kill()
        await proxy.close()


async def test_etcd_outage_short_keeps_serving_long_fences_then_recovers(
    tmp_path: Path, s3: MotoS3, bucket: str
) -> None:
    """Real brokers: etcd away for less than the lease, they keep serving the partitions they
    hold; away for longer, they stop (NOT_OWNER, no owner) and take nothing new; back, they serve
    again with every acknowledged message there, no offset given twice, and etcd's history shows
    no partition ever held by two brokers."""
    etcd = EtcdServer(tmp_path / "etcd").start()
    # the lease is the behaviour: a 6 s lease served for at least 2.5 s after etcd went (TTL less
    # a renewal interval and the fencing margin), and producing 12 acked messages meanwhile took
    # longer under CPU pressure (NOT_OWNER mid-outage); 20 s leaves over 8 s
    cluster = Cluster(tmp_path, etcd, s3, bucket, lease_ttl_ms=20_000)
    owners = Owners(cluster)
    try:
        await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in ("b1", "b2")))
        await (await owners.client("b1")).create_topic("orders", partitions=4)
        owner_of = await cluster.wait_owned("orders", 4, {"b1", "b2"})
        acked = await produce_each(owners, "orders", owner_of, "before", 3)
        etcd.kill()  # short: well inside the lease (20 s, fenced before it ends)
        during = await produce_each(owners, "orders", owner_of, "short", 3)
        etcd.start()
        etcd.kill()  # long: past the lease
        deadline = time.monotonic() + 60  # the 20 s lease runs out, then a hang bound
        while any(
            cluster.metrics(b)["headwater_cluster_serving_seconds"] > 0 for b in ("b1", "b2")
        ):
            assert time.monotonic() < deadline, "still serving without etcd past the lease"
            await asyncio.sleep(0.2)
        with pytest.raises(headwater.NotOwner):
            await produce(await owners.client(owner_of[0]), "orders", b"fenced", 0)
        etcd.start()
        owner_of = await cluster.wait_owned("orders", 4, {"b1", "b2"}, timeout=40)
        after = await produce_each(owners, "orders", owner_of, "after", 3)
        wanted = {v for batch in (acked, during, after) for vs in batch.values() for v in vs}
        consumers = [
            await (await owners.client(b)).subscribe("orders", "s", type="shared", start="earliest")
            for b in ("b1", "b2")
        ]
        offsets: dict[int, list[int]] = {}
        seen: set[bytes] = set()
        deadline = time.monotonic() + 30
        while not wanted <= seen and time.monotonic() < deadline:
            for consumer in consumers:
                try:
                    message = await consumer.receive(timeout=0.2)
                except TimeoutError:
                    continue
                seen.add(message.value)
                offsets.setdefault(message.partition, []).append(message.offset)
                await message.ack()
        assert wanted <= seen
        for partition, found in offsets.items():
            assert len(found) == len(set(found)), f"an offset of {partition} given twice"
        assert_never_overwritten(await owner_history(etcd))
    finally:
        await owners.close()
        cluster.stop_all()
        etcd.kill()


def test_first_choices_are_balanced_and_stable() -> None:
    brokers = frozenset({"b1", "b2", "b3"})
    for topic in ("orders", "bench", "kv", "t0", "t1"):
        for partitions in (1, 3, 6, 7, 100):
            choices = balanced(brokers, topic, partitions)
            load = Counter(c[0] for c in choices)
            assert max(load.values()) <= -(-partitions // 3)
            assert all(sorted(c) == sorted(brokers) for c in choices)
    # a fourth broker moves few partitions: about a quarter, not all
    before = balanced(brokers, "orders", 100)
    after = balanced(brokers | {"b4"}, "orders", 100)
    moved = sum(b[0] != a[0] for b, a in zip(before, after, strict=True))
    assert moved <= 50


def test_a_leaving_broker_moves_only_its_own_partitions_and_a_joining_one_only_its_share() -> None:
    """With the owners given, first choices are sticky: when a broker leaves, every partition a
    survivor owns keeps it as first choice (only the leaver's move); when one joins, only the
    partitions it gets move, each from a broker over its new share. Without the owners (plain
    bounded-load rendezvous) a departure re-placed survivors' partitions too: a hand-off each,
    and an ack gap on partitions whose owner never failed."""
    three = frozenset({"b1", "b2", "b3"})
    for topic in ("orders", "bench", "kv", "t0", "t1", "t2"):
        for partitions in (2, 3, 6, 7, 12, 100):
            owners = tuple((p, c[0]) for p, c in enumerate(balanced(three, topic, partitions)))
            survivors = tuple((p, b) for p, b in owners if b != "b1")
            after = balanced(three - {"b1"}, topic, partitions, survivors)
            for partition, broker in survivors:
                assert after[partition][0] == broker, (topic, partitions, partition)
            assert max(Counter(c[0] for c in after).values()) <= -(-partitions // 2)
            # b1 back (or a fourth broker): it takes its share, nothing else moves
            owners_two = tuple((p, c[0]) for p, c in enumerate(after))
            for joining in ("b1", "b4"):
                joined = balanced(three - {"b1"} | {joining}, topic, partitions, owners_two)
                moved = [p for p, b in owners_two if joined[p][0] != b]
                assert all(joined[p][0] == joining for p in moved)
                assert len(moved) == Counter(c[0] for c in joined)[joining]
                assert max(Counter(c[0] for c in joined).values()) <= -(-partitions // 3)


def headwater_partition(key: bytes, partitions: int) -> int:
    from headwater.wire.keys import partition_for_key

    return partition_for_key(key, partitions)


@pytest.mark.parametrize(
    ("shared", "args", "message"),
    [
        (False, (), "a cluster needs a shared object store"),  # each broker's own objects/
        (True, ("--advertise", "nowhere"), "cluster.advertise must be HOST:PORT"),
    ],
)
def test_serve_refuses_a_cluster_it_could_not_keep_safe(
    tmp_path: Path, shared: bool, args: tuple[str, ...], message: str
) -> None:
    """A cluster on each broker's private object store would lose acknowledged messages at the
    first take-over: refused at start (exit 2), with one line, like every bad setting."""
    config = tmp_path / "headwater.toml"
    config.write_text(f'[object_store]\npath = "{tmp_path / "shared"}"\n' if shared else "")
    answer = subprocess.run(
        [sys.executable, "-m", "headwater", "serve", "--config", str(config), "--port", "0",
         "--data-dir", str(tmp_path / "data"), "--cluster", "etcd://127.0.0.1:9", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert answer.returncode == 2
    assert message in answer.stderr and "Traceback" not in answer.stderr


async def test_a_subscription_deleted_through_one_broker_is_gone_from_all(
    cluster: Cluster, owners: Owners
) -> None:
    """DELETE_SUBSCRIPTION at one broker: every broker closes its consumers and drops it (they
    kept delivering to theirs and checkpointing its cursors, a stale start for a re-created one)."""
    await start_three(cluster)
    await (await owners.client("b1")).create_topic("orders", partitions=PARTITIONS)
    owner_of = await cluster.wait_owned("orders", PARTITIONS, {"b1", "b2", "b3"})
    await produce_each(owners, "orders", owner_of, "x", 1)
    consumer = await (await owners.client("b2")).subscribe("orders", "s", start="earliest")
    deadline = time.monotonic() + 20
    for broker_id in ("b1", "b2", "b3"):  # a leg at every owner (added once routes are known)
        while not await (await owners.client(broker_id)).list_subscriptions("orders"):
            assert time.monotonic() < deadline, f"no leg at {broker_id}"
            await asyncio.sleep(0.1)
    await consumer.close()
    await (await owners.client("b1")).delete_subscription("orders", "s")
    deadline = time.monotonic() + 20
    for broker_id in ("b1", "b2", "b3"):
        while await (await owners.client(broker_id)).list_subscriptions("orders"):
            assert time.monotonic() < deadline, f"{broker_id} still has the subscription"
            await asyncio.sleep(0.1)


async def test_racing_creators_of_a_subscription_agree_on_its_start(
    cluster: Cluster, owners: Owners
) -> None:
    """Two clients create the same reliable subscription at once through two brokers, one from
    the earliest offset, one from the latest: the first creator's definition (put-if-absent in
    etcd) is the one both brokers make it from, so every partition starts alike (each broker
    wrote its own start before, and half the partitions skipped what the other half delivered).
    """
    await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in ("b1", "b2")))
    await (await owners.client("b1")).create_topic("orders", partitions=4)
    owner_of = await cluster.wait_owned("orders", 4, {"b1", "b2"})
    assert set(owner_of.values()) == {"b1", "b2"}, owner_of
    before = await produce_each(owners, "orders", owner_of, "before", 1)
    names = [f"s{i}" for i in range(4)]
    peers = {
        (b, s): await RawPeer.open(await cluster.address(b)) for b in ("b1", "b2") for s in names
    }
    try:

        async def subscribe(broker_id: str, name: str, start: m.StartPosition) -> None:
            request = m.SubscribeRequest(
                "orders",
                name,
                m.SubscriptionType.SHARED,
                f"{broker_id}-{start.name}",
                initial_credits=100,
                settings=m.SubscriptionSettings(start=start),
            )
            answer = await peers[broker_id, name].call(request)
            assert isinstance(answer, m.SubscribeResponse), answer

        # every pair at once, on a connection each: half the names earliest through b1 and
        # latest through b2, the other half the other way round
        await asyncio.gather(
            *(
                subscribe(
                    b,
                    s,
                    m.StartPosition.EARLIEST
                    if (b == "b1") == (i % 2 == 0)
                    else m.StartPosition.LATEST,
                )
                for i, s in enumerate(names)
                for b in ("b1", "b2")
            )
        )
        after = await produce_each(owners, "orders", owner_of, "after", 1)
        last = {v for values in after.values() for v in values}
        for name in names:
            seen: set[bytes] = set()
            for broker_id in ("b1", "b2"):
                mine = {after[p][0] for p, b in owner_of.items() if b == broker_id}
                got: set[bytes] = set()
                # each partition delivers in offset order: its `after` record comes last
                deadline = time.monotonic() + 30
                while not mine <= got:
                    assert time.monotonic() < deadline, f"{name} at {broker_id}: {got}"
                    frame = await peers[broker_id, name].frame(timeout=30)
                    push = decode_push(frame.header, frame.body)
                    if isinstance(push, m.Delivery):
                        got |= {record.value for record in read_records(push.batch)}
                seen |= got
            old = seen - last
            assert old in (set(), {v for values in before.values() for v in values}), (
                f"{name}: partitions started apart, {sorted(old)} of the earlier records"
            )
    finally:
        for peer in peers.values():
            await peer.close()
