"""Failover as a producer sees it (issue 42), on a real cluster: three brokers, etcd, moto's S3,
the default 2 s lease, one idempotent producer with one record in flight per partition of a
6-partition topic, bootstrapped at b1, whose victim is always another broker.

- kill -9 of an owner: acknowledgements resume on each of its partitions (the new owner's), and
  the other brokers' partitions are not held up meanwhile (no ack gap past `GAP_BOUND`): the
  sender waits for a partition's owner in the background, and counts `max_in_flight` per
  connection, so the dead broker's partitions hold up nothing else.
- SIGSTOP of an owner for `FREEZE` s: its connection stays open and its requests unanswered, so
  nothing but the client's own check tells it; the batches unanswered past `owner_check` (1 s)
  make it ask the other brokers, which name the new owner once the frozen broker's lease has
  expired and its partitions were taken over: they are acknowledged again long before the
  freeze ends (SIGCONT only after the assertions).
- Every acknowledged record is read back once: at the offset it was acknowledged with, and no
  value stored twice (the idempotent producer's resends to the new owner were recognised).
- Consumers (the consumer's side of issue 42): a consumer of the topic, records flowing, while
  the owner of some partitions (another broker, or the consumer's bootstrap broker) is frozen
  for `FREEZE` s: the frozen broker's partitions are delivered by their new owner before it
  wakes, its leg there is dropped (checked after `owner_check`, through the other brokers'
  lookups) while it is still stopped, and every acknowledged record is received at least once.

- The `BlockingClient` (plain sockets, one request at a time) follows a kill -9 and a freeze
  of an owner the same way; LOOKUP answers carry the brokers' lease, and `owner_check` is half
  of it.

The timings asserted are generous bounds (a loaded 2-core machine): the benchmark
(loadtest/failover_bench.py) measures them, docs/BENCHMARKS.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import headwater
from headwater.client.blocking import BlockingClient
from headwater.client.consumer import Consumer
from headwater.client.consumer_legs import ClusterLegs
from headwater.server.cluster.coordinator import Coordinator
from headwater.server.cluster.coordinator_state import Held, State
from headwater.server.cluster.etcd import Entry
from headwater.server.kafka import codec
from headwater.server.kafka.apis import SERVED
from headwater.server.kafka.kafka_nodes import ClusterNodes
from headwater.server.kafka.messages import produce as kafka_messages
from headwater.server.requests.partition_ownership import BrokerAddress, not_owner
from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError
from headwater.wire.records import BatchBuilder
from tests.support.cluster_support import Cluster, running_cluster
from tests.support.kafka_support import RawKafka
from tests.support.rawwire import RawPeer
from tests.support.s3 import MotoS3

LEASE_TTL_MS = 2000  # the brokers' default
TOPIC = "orders"
PARTITIONS = 6
FREEZE = 12.0
# the longest a partition of a live, unfrozen broker may go without an ack while another broker
# dies or freezes: 0.5 s is the goal (issue 42), measured by the benchmark; the bound is wide
# for a loaded machine, and still below the 1.5 s the sender's head-of-line wait caused
GAP_BOUND = 1.2
# how soon after the kill or the freeze the victim's partitions must be acknowledged again: the
# lease (1.3-2.5 s to expire), the take-over and the client's check; wide for a loaded machine
RECOVERY_BOUND = 9.0


@pytest.fixture
def cluster(tmp_path: Path, s3: MotoS3, bucket: str) -> Iterator[Cluster]:
    with running_cluster(tmp_path, s3, bucket, LEASE_TTL_MS) as cluster:
        yield cluster


class Acks:
    """What the producer saw: per partition, each ack's time and (value, offset)."""

    def __init__(self) -> None:
        self.times: dict[int, list[float]] = {p: [] for p in range(PARTITIONS)}
        self.records: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset)
        self.changed = asyncio.Event()

    def add(self, partition: int, value: bytes, offset: int) -> None:
        self.times[partition].append(time.monotonic())
        self.records[value] = (partition, offset)
        self.changed.set()

    async def until(self, condition: object, timeout: float) -> None:
        assert callable(condition)
        async with asyncio.timeout(timeout):
            while not condition():
                self.changed.clear()
                await self.changed.wait()

    def acked_since(self, partition: int, since: float) -> float | None:
        """The first ack of the partition after `since` (None: none yet)."""
        return next((t for t in self.times[partition] if t > since), None)

    def longest_gap(self, partitions: list[int], since: float, until: float) -> float:
        """The longest time without an ack on one of `partitions` within [since, until]."""
        longest = 0.0
        for partition in partitions:
            inside = [t for t in self.times[partition] if since <= t <= until]
            points = [since, *inside, until]
            longest = max(longest, *(b - a for a, b in itertools.pairwise(points)))
        return longest


async def start(cluster: Cluster) -> tuple[headwater.Client, dict[int, str]]:
    await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in ("b1", "b2", "b3")))
    client = await headwater.connect(await cluster.address("b1"))
    await client.create_topic(TOPIC, partitions=PARTITIONS)
    owners = await cluster.wait_owned(TOPIC, PARTITIONS, {"b1", "b2", "b3"})
    return client, owners


async def produce(producer: headwater.Producer, acks: Acks, stop: asyncio.Event) -> None:
    async def one(partition: int) -> None:
        count = 0
        while not stop.is_set():
            value = f"p{partition}-{count}".encode()
            sent = await (await producer.send(value, partition=partition))
            assert sent.offset is not None
            acks.add(partition, value, sent.offset)
            count += 1

    await asyncio.gather(*(one(p) for p in range(PARTITIONS)))


async def read_back(client: headwater.Client, acks: Acks, once: bool = True) -> None:
    """Every acknowledged record read back at its offset, and (`once`) no value stored twice."""
    info = await client.describe_topic(TOPIC)
    ends = info.next_offsets
    consumer = await client.subscribe(TOPIC, "check", start="earliest")
    seen: dict[tuple[int, int], bytes] = {}
    async with asyncio.timeout(120):
        while any(
            len([o for (p, o) in seen if p == partition]) < ends[partition]
            for partition in range(PARTITIONS)
        ):
            message = await consumer.receive()
            assert message.value is not None
            seen[(message.partition, message.offset)] = message.value
            await message.ack()
    await consumer.close()
    by_value: dict[bytes, list[tuple[int, int]]] = {}
    for place, value in seen.items():
        by_value.setdefault(value, []).append(place)
    doubled = {v: places for v, places in by_value.items() if len(places) > 1}
    assert not doubled or not once, f"values stored twice: {list(doubled.items())[:5]}"
    for value, place in acks.records.items():
        found = seen.get(place)
        assert found == value, f"{value!r} acknowledged at {place}, read {found!r}"


def victim_of(owners: dict[int, str]) -> tuple[str, list[int], list[int]]:
    """A broker other than the bootstrap one owning partitions; its partitions; the others."""
    victim = next(b for b in ("b2", "b3") if b in owners.values())
    mine = sorted(p for p, b in owners.items() if b == victim)
    return victim, mine, sorted(set(owners) - set(mine))


async def test_kill9_of_an_owner_holds_up_only_its_own_partitions(cluster: Cluster) -> None:
    client, owners = await start(cluster)
    try:
        producer = client.producer(TOPIC, idempotent=True)
        acks, stop = Acks(), asyncio.Event()
        producing = asyncio.ensure_future(produce(producer, acks, stop))
        await acks.until(lambda: all(len(t) >= 20 for t in acks.times.values()), 60)
        victim, mine, others = victim_of(owners)
        killed = time.monotonic()
        cluster.brokers[victim].kill()
        await acks.until(lambda: all(acks.acked_since(p, killed) for p in mine), RECOVERY_BOUND)
        recovered = max(acks.acked_since(p, killed) or 0.0 for p in mine)
        # a little traffic on every partition after the recovery, then stop
        await acks.until(
            lambda: all(len([t for t in acks.times[p] if t > recovered]) >= 5 for p in mine), 30
        )
        stop.set()
        await asyncio.wait_for(producing, 60)
        await producer.close()
        gap = acks.longest_gap(others, killed, recovered)
        print(
            f"kill -9 of {victim}: its partitions {mine} acked again "
            f"{[round((acks.acked_since(p, killed) or 0) - killed, 2) for p in mine]} s after; "
            f"longest gap on {others}: {gap:.2f} s"
        )
        assert gap < GAP_BOUND, f"the other brokers' partitions went {gap:.2f} s without an ack"
        await read_back(client, acks)
    finally:
        await client.close()


@pytest.mark.parametrize("frozen_broker", ["owner", "bootstrap"])
async def test_frozen_owner_partitions_are_acknowledged_again_before_it_wakes(
    cluster: Cluster, frozen_broker: str
) -> None:
    """ "bootstrap": the frozen owner is the producer's bootstrap broker, whose connection the
    client's lookups go through first: they are asked of the other brokers once it leaves one
    unanswered for `owner_check`, not after the request timeout."""
    client, owners = await start(cluster)
    if frozen_broker == "owner":
        victim, mine, others = victim_of(owners)
    else:
        victim = "b1"
        mine = sorted(p for p, b in owners.items() if b == "b1")
        others = sorted(set(owners) - set(mine))
        assert mine, f"b1 owns no partition: {owners}"
    pid = cluster.brokers[victim].process.pid
    frozen = False
    try:
        producer = client.producer(TOPIC, idempotent=True)
        acks, stop = Acks(), asyncio.Event()
        producing = asyncio.ensure_future(produce(producer, acks, stop))
        await acks.until(lambda: all(len(t) >= 20 for t in acks.times.values()), 60)
        os.kill(pid, signal.SIGSTOP)
        frozen = True
        stopped = time.monotonic()
        await acks.until(lambda: all(acks.acked_since(p, stopped) for p in mine), RECOVERY_BOUND)
        recovered = max(acks.acked_since(p, stopped) or 0.0 for p in mine)
        gap = acks.longest_gap(others, stopped, recovered)
        print(
            f"SIGSTOP of {victim}: its partitions {mine} acked again "
            f"{[round((acks.acked_since(p, stopped) or 0) - stopped, 2) for p in mine]} s after; "
            f"longest gap on {others}: {gap:.2f} s"
        )
        assert time.monotonic() - stopped < FREEZE  # still frozen: the cluster told the client
        assert gap < GAP_BOUND, f"the other brokers' partitions went {gap:.2f} s without an ack"
        # the fault's length, not a synchronisation: the producer goes on against the frozen
        # broker's open connections until the freeze ends
        await asyncio.sleep(max(0.0, stopped + FREEZE - time.monotonic()))
        os.kill(pid, signal.SIGCONT)
        frozen = False
        woke = time.monotonic()
        # the woken broker refuses what it lost: acks go on on every partition after it woke
        await acks.until(
            lambda: all(len([t for t in acks.times[p] if t > woke]) >= 5 for p in range(6)), 30
        )
        stop.set()
        await asyncio.wait_for(producing, 60)
        await producer.close()
        await read_back(client, acks)
    finally:
        if frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await client.close()


@pytest.mark.parametrize("protocol", ["native", "kafka"])
async def test_a_long_poll_names_the_new_owner_whose_first_produce_waits_for_its_take_over(
    tmp_path: Path, s3: MotoS3, bucket: str, protocol: str
) -> None:
    """kill -9 of an owner. A LOOKUP long poll (version 1) through another broker, waiting on
    one of its partitions with the epoch it had, is answered with the new owner under a newer
    epoch: not at once (the dead broker is named until its lease expires), not at its 20 s.
    The answer comes as soon as that broker sees the new owner's key, before the new owner
    serves (its take-over claims the partition in the object store first): a produce sent there
    the moment the answer comes is acknowledged, having waited for the take-over, where it was
    refused NOT_OWNER (owner=none) and the client had to look up and retry. The same on the
    Kafka port (one rule in the broker's produce): a Kafka Produce sent there then is answered
    without NOT_LEADER_OR_FOLLOWER."""
    with running_cluster(tmp_path, s3, bucket, LEASE_TTL_MS, kafka=True) as cluster:
        await _long_poll_then_produce(cluster, protocol)


async def _long_poll_then_produce(cluster: Cluster, protocol: str) -> None:
    client, owners = await start(cluster)
    peer = await RawPeer.open(await cluster.address("b1"))
    try:
        victim, mine, _ = victim_of(owners)
        partition = mine[0]
        for _ in range(300):  # b1's watches may show the owner a moment after etcd has it
            before = await peer.call(m.LookupRequest((TOPIC,)))
            assert isinstance(before, m.LookupResponse)
            known = before.topics[0].partitions[partition]
            if known.broker_id == victim:
                break
            await asyncio.sleep(0.1)  # a bounded poll of b1's view
        assert known.broker_id == victim, known
        cluster.brokers[victim].kill()
        killed = time.monotonic()
        wait = m.LookupWait(TOPIC, partition, known.epoch)
        await peer.request(m.LookupRequest((TOPIC,), 20_000, (wait,)))
        answer = await peer.response(timeout=30)
        waited = time.monotonic() - killed
        assert isinstance(answer, m.LookupResponse), answer
        moved = answer.topics[0].partitions[partition]
        assert moved.broker_id not in ("", victim) and moved.epoch > known.epoch, moved
        assert waited < 15.0, f"answered after {waited:.1f} s: at its timeout, not the take-over"
        batch = BatchBuilder()
        batch.append(None, b"first at the new owner")
        if protocol == "kafka":
            code = kafka_produce(cluster.kafka_ports[moved.broker_id], partition, batch.build())
            assert code == 0, f"Kafka Produce answered error {code}"
            return
        owner = await RawPeer.open(await cluster.address(moved.broker_id))
        try:
            produced = await owner.call(m.ProduceRequest(TOPIC, partition, batch.build()))
        finally:
            await owner.close()
        assert isinstance(produced, m.ProduceResponse), produced
        assert produced.partition == partition
    finally:
        await peer.close()
        await client.close()


def kafka_produce(port: int, partition: int, batch: bytes) -> int:
    """One Kafka Produce (v3, acks all) of `batch` to the partition at the broker's Kafka
    port: its partition's error code."""
    api = SERVED[kafka_messages.ProduceRequest.API_KEY]
    request = kafka_messages.ProduceRequest(
        acks=-1,
        timeout_ms=30_000,
        topic_data=[
            kafka_messages.TopicProduceData(
                TOPIC, [kafka_messages.PartitionProduceData(partition, batch)]
            )
        ],
    )
    raw = RawKafka(port, timeout=30)
    try:
        raw.request(api.key, 3, 1, codec.encode(api.requests[3], request))
        _, rest = raw.response()
        answer = codec.decode_body(codec.Reader(rest), api.responses[3])
    finally:
        raw.close()
    (topic,) = answer.responses
    (found,) = topic.partition_responses
    return int(found.error_code)


async def test_lookup_carries_the_lease_and_the_client_checks_owners_at_half_of_it(
    tmp_path: Path, s3: MotoS3, bucket: str
) -> None:
    """Every broker's LOOKUP answer carries the lease etcd granted it (3 s here, not the
    default): the client's `owner_check` becomes half of it, unless the application set it."""
    with running_cluster(tmp_path, s3, bucket, 3000) as cluster:
        await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in ("b1", "b2")))
        async with await headwater.connect(await cluster.address("b1")) as client:
            await client.create_topic(TOPIC, partitions=2)
            assert client.owner_check == 1.0  # before any answer: half the default lease
            peer = await RawPeer.open(await cluster.address("b2"))
            try:
                response = await peer.call(m.LookupRequest((TOPIC,)))
            finally:
                await peer.close()
            assert isinstance(response, m.LookupResponse) and response.lease_ms == 3000
            await client.lookup(TOPIC)
            assert client.owner_check == 1.5
        async with await headwater.connect(await cluster.address("b1")) as client:
            client.owner_check = 0.7
            await client.lookup(TOPIC)
            assert client.owner_check == 0.7


@pytest.mark.parametrize("fault", ["kill", "freeze"])
async def test_blocking_client_follows_a_dead_or_frozen_owner(cluster: Cluster, fault: str) -> None:
    """The `BlockingClient` (one request at a time, plain sockets) follows a failover as the
    asyncio client does: one client per partition, bootstrapped at b1, each producing to its
    partition; a kill -9 (its connection lost) or a freeze (SIGSTOP: its connection open, its
    requests unanswered, noticed after `owner_check`) of another owner: the victim's partitions
    are acknowledged again, by their new owner, long before the client's 30 s timeout (and, the
    freeze, before the broker wakes). Every acknowledged record is read back at its offset;
    the resends are at-least-once (this client has no idempotent producer), so a value may be
    stored twice."""
    client, owners = await start(cluster)
    victim, mine, _ = victim_of(owners)
    address = await cluster.address("b1")
    pid = cluster.brokers[victim].process.pid
    loop = asyncio.get_running_loop()
    acks, stop = Acks(), threading.Event()
    errors: list[BaseException] = []

    def produce_blocking(partition: int) -> None:
        try:
            with BlockingClient(address, timeout=30) as blocking:
                for count in itertools.count():
                    if stop.is_set():
                        return
                    value = f"p{partition}-{count}".encode()
                    offset = blocking.produce(TOPIC, [(None, value, ())], partition=partition)
                    loop.call_soon_threadsafe(acks.add, partition, value, offset)
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)
            loop.call_soon_threadsafe(acks.changed.set)

    threads = [
        asyncio.ensure_future(asyncio.to_thread(produce_blocking, p)) for p in range(PARTITIONS)
    ]
    frozen = False
    try:
        await acks.until(lambda: errors or all(len(t) >= 20 for t in acks.times.values()), 60)
        assert not errors, errors
        faulted = time.monotonic()
        if fault == "kill":
            cluster.brokers[victim].kill()
        else:
            os.kill(pid, signal.SIGSTOP)
            frozen = True
        await acks.until(
            lambda: errors or all(acks.acked_since(p, faulted) for p in mine), RECOVERY_BOUND
        )
        assert not errors, errors
        back = [round((acks.acked_since(p, faulted) or 0) - faulted, 2) for p in mine]
        print(f"{fault} of {victim}: its partitions {mine} acked again {back} s after")
        if frozen:
            assert time.monotonic() - faulted < FREEZE  # still frozen: the client moved on
            await asyncio.sleep(max(0.0, faulted + FREEZE - time.monotonic()))  # its length
            os.kill(pid, signal.SIGCONT)
            frozen = False
        woke = time.monotonic()
        await acks.until(
            lambda: (
                errors
                or all(len([t for t in acks.times[p] if t > woke]) >= 5 for p in range(PARTITIONS))
            ),
            30,
        )
        assert not errors, errors
        stop.set()
        await asyncio.wait_for(asyncio.gather(*threads), 60)
        await read_back(client, acks, once=False)
    finally:
        stop.set()
        if frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await asyncio.gather(*threads, return_exceptions=True)
        await client.close()


def test_a_broker_woken_past_its_lease_names_no_owner_of_what_it_held() -> None:
    """A frozen broker that wakes has not yet run its watchdog nor read its watches: until then
    its coordinator still holds the partition SERVING and its copy of the owner keys names it.
    Once the serving deadline has passed it serves nothing (requests refused NOT_OWNER before
    any append) and names no owner of it, itself included (LOOKUP, Kafka's Metadata): clients
    go to the other brokers, which name the new owner."""
    this = BrokerAddress("b2", "127.0.0.1", 1)
    other = BrokerAddress("b3", "127.0.0.1", 2)
    coordinator = Coordinator("etcd://127.0.0.1:1", this, kafka=("127.0.0.1", 11))
    coordinator._brokers = {"b2": this, "b3": other}
    coordinator._kafka_addresses = {"b3": ("127.0.0.1", 12)}
    coordinator._held[(TOPIC, 0)] = Held(7, State.SERVING)
    coordinator._owners[(TOPIC, 0)] = Entry(b"b2", 7, 7, 1)
    coordinator._owners[(TOPIC, 1)] = Entry(b"b3", 8, 8, 2)
    nodes = ClusterNodes(coordinator)
    coordinator._deadline = time.monotonic() + 60  # its lease confirmed: it serves
    assert coordinator.serves(TOPIC, 0) and coordinator.owner(TOPIC, 0) == this
    leaders = nodes.leaders(TOPIC, 2)
    assert [n.broker_id if n else None for n in leaders] == ["b2", "b3"]
    coordinator._deadline = time.monotonic() - 0.1  # woken from a freeze past the deadline
    assert not coordinator.serves(TOPIC, 0)
    assert coordinator.owner(TOPIC, 0) is None
    assert not_owner(coordinator, TOPIC, 0).message.endswith("owner=none")
    leaders = nodes.leaders(TOPIC, 2)
    assert [n.broker_id if n else None for n in leaders] == [None, "b3"]


class Received:
    """What the consumer saw: per partition, each message's time and the leg it came from."""

    def __init__(self) -> None:
        self.times: dict[int, list[tuple[float, object]]] = {p: [] for p in range(PARTITIONS)}
        self.values: set[bytes] = set()
        self.changed = asyncio.Event()

    def add(self, message: headwater.Message) -> None:
        assert message.value is not None
        self.times[message.partition].append((time.monotonic(), message._consumer))
        self.values.add(message.value)
        self.changed.set()

    async def until(self, condition: object, timeout: float) -> None:
        assert callable(condition)
        async with asyncio.timeout(timeout):
            while not condition():
                self.changed.clear()
                await self.changed.wait()

    def first_since(self, partition: int, since: float, not_from: object) -> float | None:
        """The first message of the partition after `since` from a leg other than `not_from`."""
        return next(
            (t for t, leg in self.times[partition] if t > since and leg is not not_from), None
        )


async def consume(consumer: headwater.Consumer, received: Received) -> None:
    while True:
        message = await consumer.receive()
        received.add(message)
        await message.ack()


@pytest.mark.parametrize("frozen_broker", ["owner", "bootstrap"])
async def test_frozen_owner_subscriptions_move_to_the_new_owner_before_it_wakes(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, frozen_broker: str
) -> None:
    """A consumer's leg at a frozen owner answers nothing and delivers nothing, and its
    connection stays open: the consumer's own check (`owner_check`) asks the other brokers, and
    once they name another owner (or none) the leg is dropped and one placed at the new owner,
    which delivers the frozen broker's partitions long before the freeze ends. Every
    acknowledged record is received at least once (what the frozen leg delivered and was not
    acknowledged comes again from the new owner). "bootstrap": the frozen owner is the
    consumer's bootstrap broker (its own leg, and the broker its lookups go to first); the
    records are produced through another client, bootstrapped at a live broker."""
    client, owners = await start(cluster)
    clients = [client]
    if frozen_broker == "owner":
        victim, mine, _ = victim_of(owners)
        producing_client = client
    else:
        victim, mine = "b1", sorted(p for p, b in owners.items() if b == "b1")
        assert mine, f"b1 owns no partition: {owners}"
        producing_client = await headwater.connect(await cluster.address("b2"))
        clients.append(producing_client)
    pid = cluster.brokers[victim].process.pid
    frozen = False
    try:
        consumer = await client.subscribe(TOPIC, "failover", start="earliest")
        received = Received()
        consuming = asyncio.ensure_future(consume(consumer, received))
        producer = producing_client.producer(TOPIC, idempotent=True)
        acks, stop = Acks(), asyncio.Event()
        producing = asyncio.ensure_future(produce(producer, acks, stop))
        await received.until(lambda: all(len(t) >= 20 for t in received.times.values()), 60)
        legs = consumer._cluster
        assert isinstance(legs, ClusterLegs)
        if frozen_broker == "owner":
            host, port = (await cluster.address(victim)).rsplit(":", 1)
            frozen_leg = legs.legs[(host, int(port))]
        else:
            frozen_leg = consumer  # the leg at the bootstrap broker is the consumer itself
        dropped = asyncio.Event()  # the frozen leg given up, while its broker sleeps
        dropped_at: list[float] = []
        leg_lost = legs.leg_lost

        def lost(leg: Consumer, error: HeadwaterError) -> None:
            if leg is frozen_leg and not dropped.is_set():
                dropped_at.append(time.monotonic())
                dropped.set()
            leg_lost(leg, error)

        monkeypatch.setattr(legs, "leg_lost", lost)
        os.kill(pid, signal.SIGSTOP)
        frozen = True
        stopped = time.monotonic()
        await received.until(
            lambda: all(received.first_since(p, stopped, frozen_leg) for p in mine),
            RECOVERY_BOUND,
        )
        moved = [
            round((received.first_since(p, stopped, frozen_leg) or 0) - stopped, 2) for p in mine
        ]
        print(f"SIGSTOP of {victim}: its partitions {mine} delivered again {moved} s after")
        # the leg at the frozen broker is given up once the others name the new owners (the
        # new owners may have delivered before: they had legs of this consumer already)
        await asyncio.wait_for(dropped.wait(), RECOVERY_BOUND)
        print(f"the leg at the frozen {victim} was dropped {dropped_at[0] - stopped:.2f} s after")
        assert not legs._alive(frozen_leg)
        assert time.monotonic() - stopped < FREEZE  # still frozen: the consumer moved on its own
        # the fault's length, not a synchronisation
        await asyncio.sleep(max(0.0, stopped + FREEZE - time.monotonic()))
        os.kill(pid, signal.SIGCONT)
        frozen = False
        woke = time.monotonic()
        await acks.until(
            lambda: all(len([t for t in acks.times[p] if t > woke]) >= 5 for p in range(6)), 30
        )
        stop.set()
        await asyncio.wait_for(producing, 60)
        await producer.close()
        # at least once: what the frozen leg delivered unacknowledged came again from the new owner
        await received.until(lambda: received.values >= set(acks.records), 60)
        consuming.cancel()
        await consumer.close()
    finally:
        if frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for each in clients:
            await each.close()
