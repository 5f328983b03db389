"""What native readers see of transactions: subscriptions of every type, last values and maps.

Transactions are written on the Kafka port: with confluent-kafka's transactional producer, or a
step at a time in raw frames (`tests.support.raw_transactions`) where a test needs one left open
while other writes go on, or across a kill -9. A read_committed reader (every native one: docs/
DURABLES.md, "Transactions") is sent a committed transaction's records once, an aborted one's
never, a marker never, and nothing past an open transaction until it ends; a key's value is its
last record by offset among the committed ones, and a commit's keys change at once.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

import headwater
from headwater.client.client import SubscriptionTypeName
from headwater.wire.keys import partition_for_key
from tests.support.helpers import HANG, drain, drain_spread, eventually, nothing_at_hand
from tests.support.kafka_support import KafkaServer
from tests.support.raw_transactions import RawTransaction

_ids = itertools.count()


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    server = KafkaServer(tmp_path_factory.mktemp("txn-readers") / "data").start()
    yield server
    server.stop()


@pytest.fixture
async def native(kafka: KafkaServer) -> AsyncIterator[headwater.Client]:
    client = await headwater.connect(kafka.address)
    yield client
    await client.close()


def _transaction(server: KafkaServer, timeout_ms: int = 60_000) -> RawTransaction:
    return RawTransaction(server.kafka_port, f"txn-{next(_ids)}", timeout_ms).init()


async def _plain(client: headwater.Client, topic: str, partition: int, value: bytes) -> int:
    """A non-transactional record, acknowledged (appended) before this returns: its offset."""
    producer = client.producer(topic)
    sent = await producer.send(value, key=value, partition=partition)
    await producer.flush()
    return (await sent).offset


def _values(messages: list[headwater.Message]) -> list[bytes | None]:
    return [m.value for m in messages]


# Subscriptions


SUBSCRIPTION_TYPES: list[SubscriptionTypeName] = ["exclusive", "shared", "failover", "key_shared"]


async def test_every_subscription_type_is_sent_committed_records_once_and_never_aborted_ones(
    kafka: KafkaServer, native: headwater.Client, topic_name: str
) -> None:
    """A stock transactional producer writes two partitions: committed, aborted, plain, and
    committed again. Each subscription type (several consumers where the type spreads, and a
    durable `none` one fed batches as they pass) is sent exactly the committed and the plain
    records, each once: no aborted record, no marker."""
    await native.create_topic(topic_name, partitions=2, dispatch="reliable")
    groups: dict[str, list[headwater.Consumer]] = {}
    for sub_type in SUBSCRIPTION_TYPES:
        count = 1 if sub_type == "exclusive" else 2
        groups[sub_type] = [
            await native.subscribe(topic_name, sub_type, type=sub_type, start="earliest")
            for _ in range(count)
        ]
    live = await native.subscribe(topic_name, "live", durable="none")
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap, "transactional.id": f"stock-{topic_name}"}
    )
    producer.init_transactions(HANG)

    def transaction(prefix: str, commit: bool) -> list[bytes]:
        producer.begin_transaction()
        values = [f"{prefix}-{i}".encode() for i in range(20)]
        for i, value in enumerate(values):
            producer.produce(topic_name, value, key=value, partition=i % 2)
        if commit:
            producer.commit_transaction(HANG)
        else:
            producer.flush(HANG)  # the batches are in the log before the abort
            producer.abort_transaction(HANG)
        return values

    expected = transaction("committed", True)
    transaction("aborted", False)
    for i in range(10):
        expected.append(f"plain-{i}".encode())
        await _plain(native, topic_name, i % 2, expected[-1])
    expected += transaction("later", True)

    for sub_type, consumers in groups.items():
        received = await drain_spread(consumers, len(expected))
        values = [m.value for batch in received for m in batch]
        assert sorted(values) == sorted(expected), sub_type  # (sorted: each once)
        for batch in received:  # in offset order per partition
            for partition in (0, 1):
                offsets = [m.offset for m in batch if m.partition == partition]
                assert offsets == sorted(offsets), sub_type
    passed = await drain(live, len(expected))
    assert sorted(_values(passed)) == sorted(expected)


@pytest.mark.parametrize("sub_type", SUBSCRIPTION_TYPES)
async def test_a_subscription_waits_at_an_open_transaction_and_goes_on_after_its_commit(
    kafka: KafkaServer, native: headwater.Client, topic_name: str, sub_type: SubscriptionTypeName
) -> None:
    """Nothing past the last stable offset is sent: a plain record appended after an open
    transaction's batch waits with it, and both come, in offset order, once it commits; also to
    a subscription started at latest while the transaction was open (at the LSO, as Kafka)."""
    await native.create_topic(topic_name, dispatch="reliable")
    consumer = await native.subscribe(topic_name, "s", type=sub_type, start="earliest")
    await _plain(native, topic_name, 0, b"before")
    assert _values(await drain(consumer, 1)) == [b"before"]
    txn = _transaction(kafka)
    opened = txn.produce(topic_name, 0, [(b"t", b"in-the-transaction")])
    late = await native.subscribe(topic_name, "late", type=sub_type)  # at latest
    after = await _plain(native, topic_name, 0, b"after")
    assert after > opened
    with pytest.raises(TimeoutError):  # (a bounded look for what must not come)
        await consumer.receive(timeout=1.0)
    await nothing_at_hand(late)
    txn.end(commit=True)
    expected = [(opened, b"in-the-transaction"), (after, b"after")]
    assert [(m.offset, m.value) for m in await drain(consumer, 2)] == expected
    assert [(m.offset, m.value) for m in await drain(late, 2)] == expected
    txn.close()


@pytest.mark.parametrize("sub_type", ["exclusive", "key_shared"])
async def test_a_long_aborted_transaction_does_not_stall_the_partition(
    kafka: KafkaServer, native: headwater.Client, topic_name: str, sub_type: SubscriptionTypeName
) -> None:
    """5,000 aborted records in 50 batches (reads of nothing but hidden batches) and the abort
    marker are stepped over: the next record comes, and nothing is left in the backlog."""
    await native.create_topic(topic_name, dispatch="reliable")
    consumer = await native.subscribe(topic_name, "s", type=sub_type, start="earliest")
    txn = _transaction(kafka)
    for batch in range(50):
        txn.produce(topic_name, 0, [(b"k%d" % i, b"aborted") for i in range(batch, batch + 100)])
    txn.end(commit=False)
    offset = await _plain(native, topic_name, 0, b"next")
    assert offset == 5_001  # after the records and the marker
    (message,) = await drain(consumer, 1)
    assert (message.offset, message.value) == (offset, b"next")
    await message.ack()

    async def settled() -> bool:
        (detail,) = await native.list_subscriptions(topic_name)
        return detail.backlog == 0 and detail.lag == 0

    await eventually(settled, what="an empty backlog")
    txn.close()


# Last values and maps


async def _last_value_topic(client: headwater.Client, name: str, partitions: int = 1) -> None:
    await client.create_topic(
        name, partitions=partitions, dispatch="reliable", configs={"last.value": "true"}
    )


async def _get(client: headwater.Client, topic: str, keys: list[str]) -> list[bytes | None]:
    found = await client.map(topic).get_many(keys)
    return [None if v is None else v.value for v in found]


async def test_an_aborted_set_never_becomes_the_value_and_a_committed_one_appears_at_once(
    kafka: KafkaServer, native: headwater.Client, topic_name: str
) -> None:
    """Ten keys of a map: an aborted transaction's values never show, neither in gets nor to a
    last-value subscription; a committed one's (in two batches) show all at once: every get of
    the ten keys while the commit is written sees all old or all new."""
    await _last_value_topic(native, topic_name)
    keys = [f"k{i}" for i in range(10)]
    prices = native.map(topic_name)
    for key in keys:
        await prices.set(key, "old")
    watcher = await native.subscribe(topic_name, "watch", durable="last-value", key_prefix="k")
    assert _values(await drain(watcher, 10)) == [b"old"] * 10

    aborted = _transaction(kafka)
    aborted.produce(topic_name, 0, [(k.encode(), b"aborted") for k in keys])
    aborted.end(commit=False)
    committed = _transaction(kafka)
    committed.produce(topic_name, 0, [(k.encode(), b"new") for k in keys[:5]])
    committed.produce(topic_name, 0, [(k.encode(), b"new") for k in keys[5:]])
    assert await _get(native, topic_name, keys) == [b"old"] * 10

    seen: list[list[bytes | None]] = []
    done = asyncio.Event()

    async def watch() -> None:
        for _ in range(100_000):
            seen.append(await _get(native, topic_name, keys))
            if seen[-1][0] == b"new" or done.is_set():
                return

    watching = asyncio.create_task(watch())
    await asyncio.to_thread(committed.end, True)
    done.set()
    await asyncio.wait_for(watching, HANG)
    assert all(s in ([b"old"] * 10, [b"new"] * 10) for s in seen), seen
    assert await _get(native, topic_name, keys) == [b"new"] * 10
    assert _values(await drain(watcher, 10)) == [b"new"] * 10  # never b"aborted"
    aborted.close()
    committed.close()


async def _write_history(
    kafka: KafkaServer, client: headwater.Client, topic: str
) -> dict[str, bytes | None]:
    """Transactions interleaved with plain writes of the same keys (1 partition); the value of
    each key the rule gives: the last record by offset among the committed ones."""

    async def plain(key: str, value: bytes | None) -> None:
        producer = client.producer(topic)
        sent = await producer.send(value, key=key.encode(), partition=0)
        await producer.flush()
        await sent

    first = _transaction(kafka)
    first.produce(topic, 0, [(b"a", b"txn"), (b"b", b"txn"), (b"c", b"txn")])
    await plain("a", b"plain-after")  # later by offset than the transaction's: wins
    await plain("b", None)  # a deletion after it: the key stays deleted
    await plain("d", b"plain-before")  # before the next transaction's record: loses
    first.end(commit=True)
    second = _transaction(kafka)
    second.produce(topic, 0, [(b"d", b"txn"), (b"e", b"older")])
    third = _transaction(kafka)
    third.produce(topic, 0, [(b"e", b"newer"), (b"f", b"third")])
    third.end(commit=True)  # committed first, with the later record of e
    second.end(commit=True)
    await plain("c", b"plain-after-commit")  # after the commit: wins
    fourth = _transaction(kafka)
    fourth.produce(topic, 0, [(b"a", b"aborted"), (b"g", b"aborted")])
    fourth.end(commit=False)
    for txn in (first, second, third, fourth):
        txn.close()
    return {
        "a": b"plain-after",
        "b": None,
        "c": b"plain-after-commit",
        "d": b"txn",
        "e": b"newer",
        "f": b"third",
        "g": None,
    }


async def test_a_keys_value_is_its_last_committed_record_by_offset_live_and_rebuilt(
    kafka: KafkaServer, native: headwater.Client, topic_name: str
) -> None:
    """The same history of transactions and plain writes gives the same values to a map that
    follows it as it is written and to one built afterwards from the log (the catch-up), and a
    compare-and-set is not held back by an open transaction."""
    live, rebuilt = f"{topic_name}-live", f"{topic_name}-rebuilt"
    await _last_value_topic(native, live)
    await native.create_topic(rebuilt, dispatch="reliable")
    expected = await _write_history(kafka, native, live)
    assert expected == await _write_history(kafka, native, rebuilt)
    await native.alter_topic(rebuilt, last_value=True)
    keys = sorted(expected)
    for topic in (live, rebuilt):
        assert dict(zip(keys, await _get(native, topic, keys), strict=True)) == expected, topic

    cas = _transaction(kafka)
    cas.produce(live, 0, [(b"a", b"open")])
    values = native.map(live)
    current = await values.get("a")
    assert current is not None
    revision = await values.set("a", "cas-1", revision=current.revision)
    await values.set("a", "cas-2", revision=revision)
    cas.end(commit=True)  # its record is older than both sets: they stay
    assert await _get(native, live, ["a"]) == [b"cas-2"]
    cas.close()


async def test_a_commit_in_several_partitions_reaches_each_partitions_keys(
    kafka: KafkaServer, native: headwater.Client, topic_name: str
) -> None:
    """Each key in its partition (crc32(key) % 3), one transaction over the three: committed,
    every key has its value; the markers of a last-value topic are appended (not refused as
    keys of the wrong partition)."""
    await _last_value_topic(native, topic_name, partitions=3)
    keys = [f"key-{i}" for i in range(30)]
    txn = _transaction(kafka)
    for partition in range(3):
        mine = [k for k in keys if partition_for_key(k.encode(), 3) == partition]
        txn.produce(topic_name, partition, [(k.encode(), k.encode()) for k in mine])
    assert await _get(native, topic_name, keys) == [None] * 30
    txn.end(commit=True)
    assert await _get(native, topic_name, keys) == [k.encode() for k in keys]
    txn.close()


# Across a kill -9


async def test_transactions_open_across_a_kill_9_end_as_decided_after_the_restart(
    tmp_path: Path,
) -> None:
    """Two transactions open in a map and a subscribed topic when the server is killed; after
    the restart one commits and the other aborts: the committed one's values and records show,
    the aborted one's never, and the plain writes made while both were open stay."""
    server = KafkaServer(tmp_path / "data").start()
    try:
        async with await headwater.connect(server.address) as client:
            for topic in ("events", "prices"):
                await client.create_topic(
                    topic,
                    dispatch="reliable",
                    configs={"fsync": "always"}
                    | ({"last.value": "true"} if topic == "prices" else {}),
                )
            consumer = await client.subscribe("events", "s", start="earliest", prefetch=10)
            await consumer.close()
            kept = _transaction(server)
            dropped = _transaction(server)
            kept.produce("prices", 0, [(b"k1", b"kept"), (b"k3", b"kept")])
            kept.produce("events", 0, [(None, b"kept")])
            dropped.produce("prices", 0, [(b"k2", b"dropped")])
            dropped.produce("events", 0, [(None, b"dropped")])
            await client.map("prices").set("k3", "plain")  # after kept's record of k3
            await _plain(client, "events", 0, b"plain")
        server.kill()
        server.start()
        kept.reconnect(server.kafka_port)
        dropped.reconnect(server.kafka_port)
        async with await headwater.connect(server.address) as client:
            assert await _get(client, "prices", ["k1", "k2", "k3"]) == [None, None, b"plain"]
            consumer = await client.subscribe("events", "s", prefetch=10)
            with pytest.raises(TimeoutError):  # (a bounded look for what must not come)
                await consumer.receive(timeout=1.0)
            kept.end(commit=True)
            dropped.end(commit=False)
            assert await _get(client, "prices", ["k1", "k2", "k3"]) == [b"kept", None, b"plain"]
            assert _values(await drain(consumer, 2)) == [b"kept", b"plain"]
        server.kill()  # and the state as the commit left it is the one found again
        server.start()
        async with await headwater.connect(server.address) as client:
            assert await _get(client, "prices", ["k1", "k2", "k3"]) == [b"kept", None, b"plain"]
        kept.close()
        dropped.close()
    finally:
        server.kill()
