"""Key_Shared subscriptions: the hash ring and key holds (unit), and end to end over TCP."""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict

import pytest

import headwater
from headwater.durables.keyshared import DUE, HashRing, KeyHolds, key_hash
from headwater.testing import ServerProcess
from headwater.wire.errors import InvalidRequest
from tests.support.helpers import drain_spread

KEYS = [f"key-{i}".encode() for i in range(2000)]


def owners(ring: HashRing) -> dict[bytes, int | None]:
    return {k: ring.owner(key_hash(k)) for k in KEYS}


def test_ring_same_key_same_owner_and_even_spread() -> None:
    ring = HashRing()
    for consumer_id, name in enumerate(["a", "b", "c", "d"], 1):
        ring.add(consumer_id, name)
    first = owners(ring)
    assert owners(ring) == first
    spread = Counter(first.values())
    assert set(spread) == {1, 2, 3, 4}
    assert min(spread.values()) > len(KEYS) / 4 / 2  # no consumer gets under half its share


def test_ring_join_and_leave_move_only_the_keys_they_must() -> None:
    ring = HashRing()
    ring.add(1, "a")
    ring.add(2, "b")
    before = owners(ring)
    ring.add(3, "c")
    joined = owners(ring)
    moved = [k for k in KEYS if before[k] != joined[k]]
    assert moved and all(joined[k] == 3 for k in moved)  # only to the newcomer
    ring.remove(1)
    left = owners(ring)
    moved = [k for k in KEYS if joined[k] != left[k]]
    assert moved and all(joined[k] == 1 for k in moved)  # only the leaver's keys
    ring.remove(2)
    ring.remove(3)
    assert ring.owner(key_hash(b"x")) is None


def test_ring_reconnect_under_the_same_name_gets_the_same_keys() -> None:
    ring = HashRing()
    ring.add(1, "a")
    ring.add(2, "b")
    before = {k: v for k, v in owners(ring).items() if v == 1}
    ring.remove(1)
    ring.add(7, "a")
    after = owners(ring)
    assert all(after[k] == 7 for k in before)


def test_ring_consumers_sharing_a_name_both_get_keys() -> None:
    ring = HashRing()
    ring.add(1, "same")
    ring.add(2, "same")
    assert set(owners(ring).values()) == {1, 2}


def test_holds_block_other_consumers_until_acked_or_returned() -> None:
    holds = KeyHolds()
    k = key_hash(b"k")
    assert not holds.blocked(k, 1)
    holds.hold(0, 10, k, 1)
    holds.hold(0, 11, k, 1)
    assert not holds.blocked(k, 1)  # the holder itself may take more of the key
    assert holds.blocked(k, 2)
    holds.release(0, 10)
    assert holds.blocked(k, 2)
    holds.returned(0, 11)  # its consumer left: it waits for redelivery
    assert holds.blocked(k, 2)  # a new record of the key waits for the redelivery
    assert not holds.blocked(k, 2, redelivery=True)  # the redelivery itself may go
    holds.hold(0, 11, k, 2)
    assert holds.blocked(k, 1)
    holds.release(0, 11)
    assert not holds.blocked(k, 1) and len(holds) == 0


def test_holds_returned_all() -> None:
    holds = KeyHolds()
    holds.hold(0, 1, 5, 1)
    holds.hold(1, 2, 6, 2)
    holds.returned_all(1)
    assert holds.blocked(5, 2) and not holds.blocked(5, 2, redelivery=True)
    assert holds.blocked(6, 1)
    assert DUE == -1


@pytest.mark.parametrize("span", [3, 50, 10**12], ids=["short", "wide", "hostile"])
def test_release_range_is_release_of_each_offset(span: int) -> None:
    """`release_range` leaves the holds as `release` of each offset does, short range or long,
    and a hostile range (10^12 offsets) costs what is held, not its length."""
    by_offset, by_range = KeyHolds(), KeyHolds()
    for holds in (by_offset, by_range):
        for offset in range(0, 40, 2):
            for partition in (0, 1):
                holds.hold(partition, offset, offset % 5, offset % 3)
    first = 7
    end = first + span
    by_range.release_range(0, first, end)
    for offset in range(first, min(end, 40)):
        by_offset.release(0, offset)
    assert by_range._records == by_offset._records and by_range._keys == by_offset._keys
    kept = [o for o in range(0, 40, 2) if not first <= o < end]
    assert len(by_range) == 20 + len(kept) < 40  # partition 1 whole, partition 0 outside it


# End to end


async def _produce(client: headwater.Client, topic: str, keys: int, per_key: int) -> None:
    producer = client.producer(topic)
    for seq in range(per_key):
        for k in range(keys):
            await producer.send(f"{k}:{seq}".encode(), key=f"k{k}".encode())
    await producer.flush()
    await producer.close()


class KeyLog:
    """What each consumer received; checks per key that no consumer receives while another
    still holds (received and not yet acked) a record of the same key."""

    def __init__(self) -> None:
        self.unacked: dict[str, Counter[str]] = defaultdict(Counter)
        self.seen: dict[str, list[int]] = defaultdict(list)  # key -> seqs in first-seen order
        self.delivered: set[str] = set()
        self.violations: list[str] = []
        self.by_consumer: dict[str, set[str]] = defaultdict(set)

    def received(self, consumer: str, value: bytes) -> str:
        key, seq = value.decode().split(":")
        others = [c for c, n in self.unacked[key].items() if n and c != consumer]
        if others:
            self.violations.append(f"{key} to {consumer} while {others} hold it")
        self.unacked[key][consumer] += 1
        if value.decode() not in self.delivered:
            self.delivered.add(value.decode())
            self.seen[key].append(int(seq))
        self.by_consumer[consumer].add(key)
        return key

    def acked(self, consumer: str, key: str) -> None:
        self.unacked[key][consumer] -= 1

    def closed(self, consumer: str) -> None:
        for counts in self.unacked.values():
            counts[consumer] = 0


async def _consume(
    consumer: headwater.Consumer, name: str, log: KeyLog, stop: asyncio.Event, rng: random.Random
) -> None:
    while not stop.is_set():
        try:
            message = await consumer.receive(timeout=0.2)
        except TimeoutError:
            continue
        assert message.value is not None
        key = log.received(name, message.value)
        if rng.random() < 0.2:
            await asyncio.sleep(rng.random() * 0.005)  # processing time: holds get exercised
        log.acked(name, key)
        await message.ack()


@pytest.mark.parametrize("partitions", [1, 3])
async def test_key_shared_one_consumer_per_key_order_kept_through_joins_and_leaves(
    server: ServerProcess, topic_name: str, partitions: int
) -> None:
    keys, per_key = 24, 60
    rng = random.Random(12)
    async with await headwater.connect(server.address) as admin:
        await admin.create_topic(topic_name, partitions=partitions, dispatch="reliable")
        log = KeyLog()
        clients = {n: await headwater.connect(server.address) for n in ("a", "b", "c")}
        stops = {n: asyncio.Event() for n in clients}
        tasks: dict[str, asyncio.Task[None]] = {}
        consumers: dict[str, headwater.Consumer] = {}

        async def start(name: str) -> None:
            consumers[name] = await clients[name].subscribe(
                topic_name, "ks", type="key_shared", name=name, prefetch=20, start="earliest"
            )
            tasks[name] = asyncio.create_task(
                _consume(consumers[name], name, log, stops[name], rng)
            )

        await start("a")
        await start("b")
        producing = asyncio.create_task(_produce(admin, topic_name, keys, per_key))
        deadline = asyncio.get_running_loop().time() + 30
        while len(log.delivered) < keys * per_key // 3:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        await start("c")  # a join: some keys move to c
        while len(log.delivered) < keys * per_key * 2 // 3:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        stops["a"].set()  # a leave: a's keys (and anything it had unacked) move
        await tasks["a"]
        await clients["a"].close()
        log.closed("a")
        await producing
        while len(log.delivered) < keys * per_key:
            assert asyncio.get_running_loop().time() < deadline, len(log.delivered)
            await asyncio.sleep(0.01)
        for name in ("b", "c"):
            stops[name].set()
            await tasks[name]
            await clients[name].close()
    assert log.violations == []
    for key, seqs in log.seen.items():
        assert seqs == list(range(per_key)), key  # per-key order, nothing lost
    assert log.by_consumer["c"]  # the newcomer got keys


async def test_key_shared_non_reliable_routes_each_key_to_one_consumer(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, partitions=2)
    a = await client.subscribe(topic_name, "ks", type="key_shared", name="a")
    b = await client.subscribe(topic_name, "ks", type="key_shared", name="b")
    await _produce(client, topic_name, 30, 5)
    from_a, from_b = await drain_spread([a, b], 150)  # 30 keys x 5, spread by key
    got = {
        name: [(m.value or b"").decode() for m in batch]
        for name, batch in (("a", from_a), ("b", from_b))
    }
    assert len(got["a"]) + len(got["b"]) == 150
    keys_a = {v.split(":")[0] for v in got["a"]}
    keys_b = {v.split(":")[0] for v in got["b"]}
    assert keys_a and keys_b and not keys_a & keys_b
    for values in got.values():
        by_key: dict[str, list[int]] = defaultdict(list)
        for value in values:
            key, seq = value.split(":")
            by_key[key].append(int(seq))
        assert all(seqs == sorted(seqs) for seqs in by_key.values())


async def test_key_shared_refuses_a_standard_durable_and_describes_its_type(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, dispatch="reliable")
    with pytest.raises(InvalidRequest):
        await client.subscribe(topic_name, "x", type="key_shared", durable="standard")
    consumer = await client.subscribe(topic_name, "y", type="key_shared", start="earliest")
    await _produce(client, topic_name, 1, 1)
    message = await consumer.receive(timeout=30)
    assert message.value == b"0:0"
    description = await client.describe_topic(topic_name)
    assert description.subscriptions[0].sub_type == 3
    assert description.subscriptions[0].consumers[0].active


async def test_key_shared_after_kill_9_redelivers_the_unacked_first_and_loses_nothing(
    fresh_server: ServerProcess,
) -> None:
    keys, per_key = 10, 20
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("ks9", partitions=2, dispatch="reliable")
        a = await client.subscribe("ks9", "ks", type="key_shared", name="a", start="earliest")
        await _produce(client, "ks9", keys, per_key // 2)
        acked: set[str] = set()
        for _ in range(keys * per_key // 4):  # ack about half of what was produced
            message = await a.receive(timeout=30)
            assert message.value is not None
            await message.ack()
            acked.add(message.value.decode())
        await client.describe_topic("ks9")  # the acks are sent before this request
        fresh_server.kill()
    fresh_server.start()
    log = KeyLog()
    async with await headwater.connect(fresh_server.address) as client:
        consumers = {
            n: await client.subscribe("ks9", "ks", type="key_shared", name=n) for n in "ab"
        }
        stop = asyncio.Event()
        rng = random.Random(3)
        tasks = [asyncio.create_task(_consume(c, n, log, stop, rng)) for n, c in consumers.items()]
        producer = client.producer("ks9")
        for seq in range(per_key // 2, per_key):
            for k in range(keys):
                await producer.send(f"{k}:{seq}".encode(), key=f"k{k}".encode())
        await producer.close()
        deadline = asyncio.get_running_loop().time() + 30
        while len(log.delivered | acked) < keys * per_key:
            assert asyncio.get_running_loop().time() < deadline, len(log.delivered)
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.gather(*tasks)
    assert log.violations == []
    for key, seqs in log.seen.items():
        # in order from where the stored cursor was (an ack the crash caught before its cursor
        # write reached RocksDB is redelivered: at-least-once), the old unacked ones first
        assert seqs == list(range(seqs[0], per_key)), key
        assert all(f"{key}:{s}" in acked for s in range(seqs[0])), key
