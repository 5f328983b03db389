"""Transactions in a cluster (issue 38 item 5): three broker processes, a real etcd and moto's S3.

A transactional id's state lives in etcd and any broker serves its requests; each partition's
owner writes its markers (WRITE_TXN_MARKER over a peer link) and keeps its aborted ranges in the
object store for the next owner (docs/CLUSTER.md, "Transactions"). These tests write partitions
owned by all three brokers in one transaction, read them back with the native FETCH (committed
by default) and a Kafka read_committed consumer, fence a producer through another broker, and
kill brokers with kill -9: the one serving the transactional id, mid-transaction and after the
decision, and a partition's owner with a transaction open and aborted ones in its history.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import headwater
from headwater.client.message_batch import Message
from headwater.durables.cursor import PartitionCursor
from headwater.server.cluster.cluster_transactions import parse_aborted
from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError, InvalidTxnState, ProducerFenced
from headwater.wire.markers import peek
from headwater.wire.records import BatchBuilder
from tests.support import txn_clients
from tests.support.cluster_support import Cluster, running_cluster
from tests.support.rawwire import RawPeer
from tests.support.s3 import MotoS3

LEASE_TTL_MS = 2000
PER_PARTITION = 5  # input messages a partition of the acknowledgement tests holds
BROKERS = ("b1", "b2", "b3")
PARTITIONS = 6  # two per broker
DEADLINE = 60.0  # seconds any wait for the cluster may take (a bound on a hang only)


@pytest.fixture
def cluster(tmp_path: Path, s3: MotoS3, bucket: str) -> Iterator[Cluster]:
    with running_cluster(tmp_path, s3, bucket, LEASE_TTL_MS, kafka=True) as cluster:
        yield cluster


async def start_three(cluster: Cluster) -> None:
    await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in BROKERS))


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[headwater.Client]:
    await start_three(cluster)
    connected = await headwater.connect(cluster.brokers["b1"].address)
    try:
        yield connected
    finally:
        await connected.close()


async def spread_topic(cluster: Cluster, client: headwater.Client, name: str) -> dict[int, str]:
    await client.create_topic(name, partitions=PARTITIONS)
    owners = await cluster.wait_owned(name, PARTITIONS, set(BROKERS), timeout=DEADLINE)
    assert set(owners.values()) == set(BROKERS), owners  # every broker owns some
    return owners


async def committed(client: headwater.Client, topic: str, partition: int) -> list[bytes | None]:
    """What a transaction-aware reader reads of the partition to its end (NOT_OWNER between
    owners followed by the client)."""
    values: list[bytes | None] = []
    offset = 0
    for _ in range(1000):
        fetched = await client.fetch(topic, partition, offset)
        values += [r.value for r in fetched.records()]
        if fetched.next_offset >= fetched.end_offset:
            return values
        assert fetched.next_offset > offset, "a FETCH that does not move on"
        offset = fetched.next_offset
    raise AssertionError("the partition was not read in 1000 FETCHes")


async def settled(
    client: headwater.Client,
    topic: str,
    expected: dict[int, list[bytes]],
    never: frozenset[bytes] = frozenset(),
) -> dict[int, list[bytes | None]]:
    """Each partition's committed values, read until they are `expected` or the deadline (an
    open transaction's LSO, a take-over in progress); the last reading. No reading on the way
    may hold a value of `never` (an aborted or open transaction's)."""
    deadline = time.monotonic() + DEADLINE
    seen: dict[int, list[bytes | None]] = {}
    while True:
        for partition in expected:
            try:
                seen[partition] = await committed(client, topic, partition)
            except HeadwaterError as exc:
                if not exc.retriable:
                    raise
            shown = set(seen.get(partition, ())) & never
            assert not shown, f"partition {partition} showed {shown}"
        if seen == expected or time.monotonic() > deadline:
            return seen
        await asyncio.sleep(0.2)


async def aborted_objects(s3: MotoS3, bucket: str, topic: str) -> dict[int, list[str]]:
    """Partition -> the names of its aborted-range objects, listed in the bucket itself."""
    from aiobotocore.session import get_session

    found: dict[int, list[str]] = {}
    async with get_session().create_client(
        "s3", endpoint_url=s3.endpoint_url, region_name="us-east-1"
    ) as s3_client:
        answer = await s3_client.list_objects_v2(Bucket=bucket)
        for item in answer.get("Contents", []):
            # (under the object store's prefix) <topic>/<partition>/txn-aborted/<name>
            parts = item["Key"].split("/")
            if len(parts) >= 4 and parts[-4] == topic and parts[-2] == "txn-aborted":
                found.setdefault(int(parts[-3]), []).append(parts[-1])
    return found


def values(prefix: str) -> frozenset[bytes]:
    return frozenset(f"{prefix}-{p}".encode() for p in range(PARTITIONS))


async def state_of(cluster: Cluster, transactional_id: str) -> dict[str, object]:
    """The transactional id's state as etcd holds it (read here, not through a broker)."""
    async with await cluster._etcd() as etcd:
        found = await etcd.get(f"/headwater/txn/{transactional_id}".encode())
    return {} if found is None else dict(json.loads(found.value))


async def until_state(cluster: Cluster, transactional_id: str, state: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while (await state_of(cluster, transactional_id)).get("state") != state:
        assert time.monotonic() < deadline, f"{transactional_id} never reached {state}"
        await asyncio.sleep(0.05)


async def kill_tests_open_transaction(
    client: headwater.Client, topic: str, transactional_id: str, timeout: float = 60.0
) -> tuple[headwater.Producer, Any]:
    """A committed transaction ("c1-<p>"), an aborted one ("a-<p>", stored before the abort),
    then one left open ("open-<p>", every batch acknowledged by its owner): the producer and
    the open transaction's context."""
    producer = client.producer(
        topic, transactional_id=transactional_id, transaction_timeout=timeout
    )
    async with producer.transaction():
        for partition in range(PARTITIONS):
            await producer.send(f"c1-{partition}".encode(), partition=partition)
    with pytest.raises(RuntimeError):
        async with producer.transaction():
            for partition in range(PARTITIONS):
                await producer.send(f"a-{partition}".encode(), partition=partition)
            await producer.flush()
            raise RuntimeError("aborted")
    transaction = producer.transaction()
    await transaction.__aenter__()
    for partition in range(PARTITIONS):
        await (await producer.send(f"open-{partition}".encode(), partition=partition))
    return producer, transaction


async def test_a_transaction_over_partitions_of_three_brokers_commits_and_aborts_as_one(
    cluster: Cluster, client: headwater.Client, topic_name: str
) -> None:
    """One transaction writes the six partitions (two per broker) through a producer
    bootstrapped at b1, the transactional id served there and the markers written by each
    owner: the committed ones are read by the native FETCH and a Kafka read_committed consumer,
    the aborted ones by neither (but by a raw FETCH and read_uncommitted)."""
    await spread_topic(cluster, client, topic_name)
    producer = client.producer(topic_name, transactional_id=f"{topic_name}-app")
    async with producer.transaction():
        for partition in range(PARTITIONS):
            await producer.send(f"ok-{partition}".encode(), partition=partition)
    with pytest.raises(RuntimeError):
        async with producer.transaction():
            for partition in range(PARTITIONS):
                await producer.send(f"no-{partition}".encode(), partition=partition)
            await producer.flush()  # stored at every owner before the abort
            raise RuntimeError("the application fails")
    async with producer.transaction():
        for partition in range(PARTITIONS):
            await producer.send(f"ok2-{partition}".encode(), partition=partition)
    expected = {p: [f"ok-{p}".encode(), f"ok2-{p}".encode()] for p in range(PARTITIONS)}
    assert await settled(client, topic_name, expected) == expected
    for partition in range(PARTITIONS):
        everything = await client.fetch(topic_name, partition, 0, raw=True)
        assert [peek(b).control for b in everything.batches()].count(True) == 3
        assert f"no-{partition}".encode() in [r.value for r in everything.records()]
    bootstrap = ",".join(f"127.0.0.1:{cluster.kafka_ports[b]}" for b in BROKERS)
    wanted = [(topic_name, p) for p in range(PARTITIONS)]
    seen = await asyncio.to_thread(txn_clients.read, "confluent", bootstrap, wanted, True)
    assert txn_clients.values(seen) == {(topic_name, p): expected[p] for p in expected}
    raw = await asyncio.to_thread(txn_clients.read, "confluent", bootstrap, wanted, False)
    assert all(len(v) == 3 for v in txn_clients.values(raw).values())  # the aborted too
    await producer.close()


async def test_a_kafka_transactional_producer_commits_and_aborts_over_three_brokers(
    cluster: Cluster, client: headwater.Client, topic_name: str
) -> None:
    """librdkafka's transactional producer, its coordinator found with FindCoordinator (key type
    1) and its batches sent to each partition's leader: a committed transaction, an aborted one
    and a second committed one, read back by a read_committed consumer."""
    await spread_topic(cluster, client, topic_name)
    bootstrap = ",".join(f"127.0.0.1:{cluster.kafka_ports[b]}" for b in BROKERS)

    def run() -> None:
        producer = txn_clients.producer("confluent", bootstrap, f"{topic_name}-kafka")
        try:
            for outcome in ("ok", "no", "ok2"):
                producer.begin()
                producer.send((topic_name, p, f"{outcome}-{p}".encode()) for p in range(PARTITIONS))
                producer.flush()
                if outcome == "no":
                    producer.abort()
                else:
                    producer.commit()
        finally:
            producer.close()

    await asyncio.to_thread(run)
    wanted = [(topic_name, p) for p in range(PARTITIONS)]
    seen = await asyncio.to_thread(txn_clients.read, "confluent", bootstrap, wanted, True)
    assert txn_clients.values(seen) == {
        (topic_name, p): [f"ok-{p}".encode(), f"ok2-{p}".encode()] for p in range(PARTITIONS)
    }


async def test_an_init_through_another_broker_fences_the_producer_it_replaces(
    cluster: Cluster, client: headwater.Client, topic_name: str
) -> None:
    """The first instance (bootstrapped at b1) has a transaction open; a second instance of the
    same transactional id starts through b2: the open transaction is aborted, the first
    instance's later batches and its commit are refused at the owners and at b1, and only the
    second's records are ever read."""
    await spread_topic(cluster, client, topic_name)
    first = client.producer(topic_name, transactional_id=f"{topic_name}-app")
    other = await headwater.connect(cluster.brokers["b2"].address)
    try:
        with pytest.raises(ProducerFenced):
            async with first.transaction():
                for partition in range(PARTITIONS):
                    await (await first.send(f"old-{partition}".encode(), partition=partition))
                second = other.producer(topic_name, transactional_id=f"{topic_name}-app")
                async with second.transaction():  # its start aborts the first one's
                    for partition in range(PARTITIONS):
                        await second.send(f"new-{partition}".encode(), partition=partition)
                await first.send(b"zombie", partition=0)  # refused: INVALID_PRODUCER_EPOCH
        session = first._session
        assert session is not None
        for broker in BROKERS:  # every broker refuses the old epoch, whatever the client does
            peer = await RawPeer.open(cluster.brokers[broker].address)
            try:
                await peer.request(
                    m.EndTxnRequest(
                        session.transactional_id, session.producer_id, session.epoch, True
                    )
                )
                assert isinstance(await peer.response(timeout=30), ProducerFenced)
            finally:
                peer.writer.close()
        expected = {p: [f"new-{p}".encode()] for p in range(PARTITIONS)}
        assert await settled(client, topic_name, expected) == expected
        for partition in range(PARTITIONS):
            everything = await client.fetch(topic_name, partition, 0, raw=True)
            values = [r.value for r in everything.records()]
            assert f"old-{partition}".encode() in values and b"zombie" not in values
        await second.close()
    finally:
        await other.close()
    await first.close()


async def test_an_owner_refuses_a_marker_no_transaction_decided(
    cluster: Cluster, client: headwater.Client, topic_name: str
) -> None:
    """WRITE_TXN_MARKER from anyone but for an end the state does not hold is refused: a
    client cannot commit (or abort) a transaction by asking an owner directly."""
    owners = await spread_topic(cluster, client, topic_name)
    producer = client.producer(topic_name, transactional_id=f"{topic_name}-app")
    transaction = producer.transaction()
    await transaction.__aenter__()
    await (await producer.send(b"open", partition=0))
    session = producer._session
    assert session is not None
    peer = await RawPeer.open(cluster.brokers[owners[0]].address)
    try:
        request = m.WriteTxnMarkerRequest(
            topic_name, 0, session.producer_id, session.epoch, commit=True
        )
        await peer.request(request)
        answer = await peer.response(timeout=30)
        assert isinstance(answer, InvalidTxnState), answer
    finally:
        peer.writer.close()
    assert await committed(client, topic_name, 0) == []  # still open: nothing readable
    await transaction.__aexit__(None, None, None)
    assert await settled(client, topic_name, {0: [b"open"]}) == {0: [b"open"]}
    await producer.close()


async def test_a_transactional_batch_of_no_transaction_is_refused_at_any_owner(
    cluster: Cluster, client: headwater.Client, topic_name: str
) -> None:
    """An owner checks a transactional batch against the state (read again from etcd when it
    does not know the producer): a partition the transaction never added is refused."""
    owners = await spread_topic(cluster, client, topic_name)
    producer = client.producer(topic_name, transactional_id=f"{topic_name}-app")
    async with producer.transaction():
        await producer.send(b"one", partition=0)
    session = producer._session
    assert session is not None
    builder = BatchBuilder(
        producer_id=session.producer_id,
        producer_epoch=session.epoch,
        base_sequence=0,
        transactional=True,
    )
    builder.append(None, b"stray")
    peer = await RawPeer.open(cluster.brokers[owners[1]].address)
    try:
        await peer.request(m.ProduceRequest(topic_name, 1, builder.build()))
        answer = await peer.response(timeout=30)
        assert isinstance(answer, InvalidTxnState), answer
    finally:
        peer.writer.close()
    await producer.close()


async def test_a_kill_of_the_broker_serving_the_id_mid_transaction_aborts_it_everywhere(
    cluster: Cluster, client: headwater.Client, topic_name: str
) -> None:
    """b1 serves the transactional id (the producer's bootstrap) and owns two of the partitions;
    it is killed with a transaction open at every partition and an aborted one in their
    history. The new owners of its partitions hide the aborted one and hold the open one; the
    broker that now has the id's duties aborts it when its timeout passes; then every partition
    reads the committed transaction and what follows, and never the aborted or open one."""
    await spread_topic(cluster, client, topic_name)
    tid = f"{topic_name}-app"
    producer, _ = await kill_tests_open_transaction(client, topic_name, tid, timeout=4.0)
    cluster.brokers["b1"].kill()
    survivors = {"b2", "b3"}
    await cluster.wait_owned(topic_name, PARTITIONS, survivors, timeout=DEADLINE)
    reader = await headwater.connect(cluster.brokers["b2"].address)
    try:
        hidden = values("a") | values("open")
        first = {p: [f"c1-{p}".encode()] for p in range(PARTITIONS)}
        assert await settled(reader, topic_name, first, hidden) == first
        await until_state(cluster, tid, "CompleteAbort")  # its timeout, at the duty broker
        plain = reader.producer(topic_name)
        for partition in range(PARTITIONS):
            await (await plain.send(f"after-{partition}".encode(), partition=partition))
        after = {p: [f"c1-{p}".encode(), f"after-{p}".encode()] for p in range(PARTITIONS)}
        assert await settled(reader, topic_name, after, hidden) == after
        for partition in range(PARTITIONS):
            everything = await reader.fetch(topic_name, partition, 0, raw=True)
            assert f"open-{partition}".encode() in [r.value for r in everything.records()]
        await plain.close()
    finally:
        await reader.close()
    with contextlib.suppress(HeadwaterError, OSError):
        await producer.close()


async def test_a_kill_of_the_broker_serving_the_id_after_the_commit_decision_commits_it_all(
    cluster: Cluster, client: headwater.Client, topic_name: str
) -> None:
    """b2 is frozen (SIGSTOP) so that b1, serving the transactional id, cannot finish the
    commit's markers; once etcd holds PrepareCommit (the decision), b1 is killed with kill -9
    and b2 woken. The broker with the id's duties finishes the end: every partition, whoever
    owns it now, reads the committed records (a new owner holds the open transaction until its
    marker), and the aborted transaction before it never."""
    owners = await spread_topic(cluster, client, topic_name)
    tid = f"{topic_name}-app"
    producer, transaction = await kill_tests_open_transaction(client, topic_name, tid)
    frozen = cluster.brokers["b2"].process.pid
    os.kill(frozen, signal.SIGSTOP)
    try:
        ending = asyncio.ensure_future(transaction.__aexit__(None, None, None))
        await until_state(cluster, tid, "PrepareCommit")
        cluster.brokers["b1"].kill()
    finally:
        os.kill(frozen, signal.SIGCONT)
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(ending, DEADLINE)
    assert "b2" in owners.values()
    reader = await headwater.connect(cluster.brokers["b3"].address)
    try:
        expected = {p: [f"c1-{p}".encode(), f"open-{p}".encode()] for p in range(PARTITIONS)}
        assert await settled(reader, topic_name, expected, values("a")) == expected
        await until_state(cluster, tid, "CompleteCommit")
    finally:
        await reader.close()
    with contextlib.suppress(HeadwaterError, OSError):
        await producer.close()


async def test_a_kill_of_a_partition_owner_keeps_its_open_transaction_held_until_its_end(
    cluster: Cluster, client: headwater.Client, topic_name: str, s3: MotoS3, bucket: str
) -> None:
    """The owner of two partitions (not the broker serving the transactional id) is killed with
    a transaction open there and an aborted one in their history: their new owner hides the
    aborted one (its ranges from the object store) and holds the open one (nothing of it, nor
    after it, is read) until the producer commits it, through the broker it always used."""
    owners = await spread_topic(cluster, client, topic_name)
    tid = f"{topic_name}-app"
    producer, transaction = await kill_tests_open_transaction(client, topic_name, tid)
    session = producer._session
    assert session is not None
    kept = await aborted_objects(s3, bucket, topic_name)  # one per partition, by its owner
    assert sorted(kept) == list(range(PARTITIONS)), kept
    for names in kept.values():
        assert len(names) == 1
        parsed = parse_aborted(names[0])
        assert parsed is not None and parsed[0].producer_id == session.producer_id
        assert parsed[0].first_offset < parsed[0].last_offset
    victim = next(b for b in ("b2", "b3") if b in owners.values())
    moved = [p for p, b in owners.items() if b == victim]
    cluster.brokers[victim].kill()
    survivors = set(BROKERS) - {victim}
    await cluster.wait_owned(topic_name, PARTITIONS, survivors, timeout=DEADLINE)
    plain = client.producer(topic_name)
    for partition in moved:  # after the open transaction: held with it
        await (await plain.send(f"plain-{partition}".encode(), partition=partition))
    hidden = values("a") | values("open") | values("plain")
    held = {p: [f"c1-{p}".encode()] for p in moved}
    assert await settled(client, topic_name, held, hidden) == held
    await transaction.__aexit__(None, None, None)  # the commit: markers by the new owners
    expected = {p: [f"c1-{p}".encode(), f"open-{p}".encode()] for p in range(PARTITIONS)}
    for partition in moved:
        expected[partition].append(f"plain-{partition}".encode())
    assert await settled(client, topic_name, expected, values("a")) == expected
    await plain.close()
    await producer.close()


async def test_a_transaction_of_more_partitions_than_its_head_holds_is_stored_in_chunks(
    cluster: Cluster, client: headwater.Client, topic_name: str
) -> None:
    """90 partitions added one at a time (past `HEAD_PARTITIONS`, so the state in etcd is a head
    and chunks of partitions, each store writing only what it added): every owner's replica reads
    the chunks and takes the batches, the commit writes every marker; then the id fenced through
    another broker (its refresh reads the chunks there) aborts a second transaction of the 90,
    and nothing of it is read."""
    wide = 90
    await client.create_topic(topic_name, partitions=wide)
    await cluster.wait_owned(topic_name, wide, set(BROKERS), timeout=DEADLINE)
    producer = client.producer(topic_name, transactional_id=f"{topic_name}-wide")
    async with producer.transaction():
        for partition in range(wide):
            await (await producer.send(f"ok-{partition}".encode(), partition=partition))
    other = await headwater.connect(cluster.brokers["b2"].address)
    try:
        fenced = other.producer(topic_name, transactional_id=f"{topic_name}-wide")
        with pytest.raises(RuntimeError):
            async with fenced.transaction():
                for partition in range(wide):
                    await (await fenced.send(f"no-{partition}".encode(), partition=partition))
                raise RuntimeError("the application fails")
        await fenced.close()
    finally:
        await other.close()
    expected = {p: [f"ok-{p}".encode()] for p in range(wide)}
    never = frozenset(f"no-{p}".encode() for p in range(wide))
    assert await settled(client, topic_name, expected, never) == expected
    with contextlib.suppress(HeadwaterError):
        await producer.close()


# Native acknowledgements by ranges (ADD_ACKS_TO_TXN) in a cluster: applied by each input
# partition's owner at the commit (WRITE_TXN_ACKS), its cursor checkpoints in etcd before the
# commit is answered.


async def checkpoint(cluster: Cluster, topic: str, subscription: str, partition: int) -> int:
    """The floor of the subscription's cursor checkpoint in etcd (every offset below it
    acknowledged: what a partition's next owner starts from); 0 when there is none."""
    async with await cluster._etcd() as etcd:
        found = await etcd.get(
            f"/headwater/checkpoints/{topic}/{subscription}/{partition}".encode()
        )
    return 0 if found is None else PartitionCursor.decode(bytes(found.value)).floor


async def floors(cluster: Cluster, topic: str, subscription: str) -> list[int]:
    return [await checkpoint(cluster, topic, subscription, p) for p in range(PARTITIONS)]


async def delivered_inputs(
    client: headwater.Client, cluster: Cluster, name: str
) -> tuple[str, str, headwater.Consumer, list[Message]]:
    """An input topic (`PER_PARTITION` messages a partition, spread over the three brokers)
    and an output topic; a Shared consumer that received every input message (none acked, a
    long ack timeout): (input, output, consumer, messages, each once)."""
    source, output = f"{name}-in", f"{name}-out"
    await spread_topic(cluster, client, source)
    await spread_topic(cluster, client, output)
    plain = client.producer(source)
    for partition in range(PARTITIONS):
        for index in range(PER_PARTITION):
            await plain.send(f"in-{partition}-{index}".encode(), partition=partition)
    await plain.flush()
    await plain.close()
    consumer = await client.subscribe(
        source, "eos", type="shared", start="earliest", ack_timeout=120.0
    )
    # every message once: a partition moving owners meanwhile (a lease late under load)
    # delivers what was unacknowledged again, at-least-once, and the transaction acks by offset
    taken: dict[tuple[int, int], Message] = {}
    for _ in range(4 * PARTITIONS * PER_PARTITION):
        if len(taken) == PARTITIONS * PER_PARTITION:
            break
        message = await consumer.receive(timeout=DEADLINE)
        taken[message.partition, message.offset] = message
    assert len(taken) == PARTITIONS * PER_PARTITION, sorted(taken)
    return source, output, consumer, list(taken.values())


async def transform(
    producer: headwater.Producer, consumer: headwater.Consumer, taken: list[Message]
) -> None:
    for message in taken:
        await producer.send(b"out-" + (message.value or b""), partition=message.partition)
    await producer.send_acks(consumer, taken)


async def only_new_messages(client: headwater.Client, source: str) -> None:
    """A new consumer of the subscription (the old one closed: what it held unacked is due at
    once) gets the sentinel written to each partition now, and nothing before it: no
    committed input comes back, from any owner."""
    plain = client.producer(source)
    for partition in range(PARTITIONS):
        await plain.send(b"sentinel", partition=partition)
    await plain.flush()
    await plain.close()
    consumer = await client.subscribe(source, "eos", type="shared", ack_timeout=120.0)
    try:
        got = [await consumer.receive(timeout=DEADLINE) for _ in range(PARTITIONS)]
        assert [m.value for m in got] == [b"sentinel"] * PARTITIONS, [m.value for m in got]
    finally:
        await consumer.close()


async def test_native_acks_by_ranges_commit_at_each_owner_and_abort_to_nothing(
    cluster: Cluster, client: headwater.Client, topic_name: str
) -> None:
    """A consume-transform-produce transaction over three brokers acknowledges the input
    messages it read (ranges, from partitions of all three owners): aborted, no cursor moves;
    committed, every input partition's checkpoint in etcd holds the acks when the commit is
    answered (no wait), its outputs are committed, and no input comes back."""
    source, output, consumer, messages = await delivered_inputs(client, cluster, topic_name)
    producer = client.producer(output, transactional_id=f"{topic_name}-app")
    with pytest.raises(RuntimeError):
        async with producer.transaction():
            await transform(producer, consumer, messages)
            await producer.flush()
            raise RuntimeError("aborted")
    assert await floors(cluster, source, "eos") == [0] * PARTITIONS
    async with producer.transaction():  # (the messages are still delivered: acked now)
        await transform(producer, consumer, messages)
    assert await floors(cluster, source, "eos") == [PER_PARTITION] * PARTITIONS
    expected = {
        p: [f"out-in-{p}-{i}".encode() for i in range(PER_PARTITION)] for p in range(PARTITIONS)
    }
    assert await settled(client, output, expected) == expected
    await consumer.close()
    await only_new_messages(client, source)
    await producer.close()


async def frozen_commit(
    cluster: Cluster, client: headwater.Client, topic_name: str, frozen: str
) -> tuple[str, headwater.Consumer, headwater.Producer, asyncio.Future[Any]]:
    """Input messages read and sent in a transaction (bootstrapped at b1, which serves the id),
    whose commit starts with `frozen` stopped (SIGSTOP): it cannot apply its partitions'
    acknowledgements, so etcd holds PrepareCommit (the decision) and the commit waits. The
    input topic, the consumer, the producer, the commit's future."""
    source, output, consumer, messages = await delivered_inputs(client, cluster, topic_name)
    tid = f"{topic_name}-app"
    producer = client.producer(output, transactional_id=tid)
    transaction = producer.transaction()
    await transaction.__aenter__()
    await transform(producer, consumer, messages)
    await producer.flush()
    os.kill(cluster.brokers[frozen].process.pid, signal.SIGSTOP)
    ending = asyncio.ensure_future(transaction.__aexit__(None, None, None))
    await until_state(cluster, tid, "PrepareCommit")
    return source, consumer, producer, ending


async def test_native_acks_survive_a_kill_of_the_broker_ending_the_commit(
    cluster: Cluster, client: headwater.Client, topic_name: str
) -> None:
    """b1 decides the commit while b2 (owning input partitions) is frozen, and is killed with
    kill -9; b2 wakes. The broker now doing the id's duties completes the commit: every input
    partition's acknowledgements are applied by its owner (b1's by their new owners, which
    acknowledge what b1 delivered), and no input comes back."""
    source, consumer, producer, ending = await frozen_commit(cluster, client, topic_name, "b2")
    try:
        cluster.brokers["b1"].kill()
    finally:
        os.kill(cluster.brokers["b2"].process.pid, signal.SIGCONT)
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(ending, DEADLINE)
    await until_state(cluster, f"{topic_name}-app", "CompleteCommit")
    await cluster.wait_owned(source, PARTITIONS, {"b2", "b3"}, timeout=DEADLINE)
    assert await floors(cluster, source, "eos") == [PER_PARTITION] * PARTITIONS
    with contextlib.suppress(HeadwaterError, OSError):
        await asyncio.wait_for(consumer.close(), DEADLINE)
    reader = await headwater.connect(cluster.brokers["b3"].address)
    try:
        await only_new_messages(reader, source)
    finally:
        await reader.close()
    with contextlib.suppress(HeadwaterError, OSError):
        await producer.close()


async def test_native_acks_survive_a_kill_of_an_owner_while_it_applies_them(
    cluster: Cluster, client: headwater.Client, topic_name: str
) -> None:
    """b2, owning input partitions, is frozen when the commit is decided and then killed with
    kill -9: b1 asks their new owner, which applies the acknowledgements over the cursor b2
    left in etcd; the commit completes through b1 and no input comes back."""
    source, consumer, producer, ending = await frozen_commit(cluster, client, topic_name, "b2")
    cluster.brokers["b2"].kill()
    await asyncio.wait_for(ending, DEADLINE)  # answered once every owner applied them
    assert (await state_of(cluster, f"{topic_name}-app"))["state"] == "CompleteCommit"
    assert await floors(cluster, source, "eos") == [PER_PARTITION] * PARTITIONS
    await consumer.close()
    await only_new_messages(client, source)
    await producer.close()


async def test_a_pipelined_end_racing_acks_commits_them_or_leaves_them_unacked(
    cluster: Cluster, client: headwater.Client, topic_name: str
) -> None:
    """ADD_ACKS_TO_TXN and END_TXN (commit) sent back to back on one connection, without
    waiting: whichever the id's lock takes first, the acknowledgements are applied only with
    a committed transaction: in it (its cursors moved when it is answered), or in the next one,
    still open, then aborted (no cursor moves)."""
    source, output, consumer, _ = await delivered_inputs(client, cluster, topic_name)
    tid = f"{topic_name}-app"
    producer = client.producer(output, transactional_id=tid)
    async with producer.transaction():
        await producer.send(b"begun", partition=0)
    session = producer._session
    assert session is not None
    pid, epoch = session.producer_id, session.epoch
    peer = await RawPeer.open(cluster.brokers["b2"].address)
    try:
        await peer.request(m.AddPartitionsToTxnRequest(tid, pid, epoch, output, (0,)))
        assert isinstance(await peer.response(timeout=30), m.EmptyResponse)
        ranges = tuple(m.AckRange(p, 0, PER_PARTITION) for p in range(PARTITIONS))
        await peer.request(m.AddAcksToTxnRequest(tid, pid, epoch, source, "eos", ranges))
        await peer.request(m.EndTxnRequest(tid, pid, epoch, True))
        answers = [await peer.response(timeout=DEADLINE) for _ in range(2)]
        assert all(isinstance(a, m.EmptyResponse) for a in answers), answers
        state = await state_of(cluster, tid)
        if state["state"] == "CompleteCommit":  # the acks came first: committed with it
            assert await floors(cluster, source, "eos") == [PER_PARTITION] * PARTITIONS
        else:  # the end came first: the acks began the next transaction
            assert state["state"] == "Ongoing", state
            assert await floors(cluster, source, "eos") == [0] * PARTITIONS
            await peer.request(m.EndTxnRequest(tid, pid, epoch, False))
            assert isinstance(await peer.response(timeout=DEADLINE), m.EmptyResponse)
            assert await floors(cluster, source, "eos") == [0] * PARTITIONS
    finally:
        peer.writer.close()
    await consumer.close()
    await producer.close()


async def test_a_native_transaction_goes_on_through_another_broker_when_its_bootstrap_dies(
    cluster: Cluster, client: headwater.Client, topic_name: str
) -> None:
    """The producer's bootstrap broker b1, which served its transactional id, is killed with
    kill -9 mid-transaction (records acknowledged in half the partitions). The transaction goes
    on with the same producer id and epoch: its next partitions are added, and its commit
    decided, through another broker; every record is read committed, once."""
    await spread_topic(cluster, client, topic_name)
    producer = client.producer(topic_name, transactional_id=f"{topic_name}-app")
    half = PARTITIONS // 2
    async with producer.transaction() as handle:
        for partition in range(half):
            await (await producer.send(f"before-{partition}".encode(), partition=partition))
        cluster.brokers["b1"].kill()
        for partition in range(half, PARTITIONS):
            await producer.send(f"after-{partition}".encode(), partition=partition)
    session = producer._session
    assert session is not None and (session.producer_id, session.epoch) == (
        handle.producer_id,
        handle.epoch,
    )
    assert (await state_of(cluster, f"{topic_name}-app"))["state"] == "CompleteCommit"
    reader = await headwater.connect(cluster.brokers["b2"].address)
    try:
        expected = {
            p: [f"{'before' if p < half else 'after'}-{p}".encode()] for p in range(PARTITIONS)
        }
        assert await settled(reader, topic_name, expected) == expected
    finally:
        await reader.close()
    await producer.close()
