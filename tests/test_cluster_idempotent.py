"""Idempotent producers in a cluster: three brokers, a real etcd and moto's S3 on loopback.

Producer ids come from a counter in etcd, so ids issued through different brokers never collide
and every broker accepts an id any of them issued. A partition's producer sequences travel with
its batches in the object store: after a kill -9 of its owner, the new owner rebuilds them from
the batch headers, so a batch the producer resends there with the same sequence is answered with
its original offset and not stored again (docs/CLUSTER.md, "Idempotent producers").
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

import headwater
from headwater.client.producer_config import AtLeastOnce, ProducerConfig, RetryPolicy
from headwater.durables.producers import ProducerEntry, ProducerTable
from headwater.server.cluster.cluster_partitions import _rebuild_start
from headwater.server.topics.topic import LogTopic
from headwater.storage.partition_manifest import Manifest, SegmentEntry
from headwater.storage.segments import IndexEntry
from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError, OutOfOrderSequence
from headwater.wire.records import BatchBuilder
from tests.support.cluster_support import Cluster, running_cluster
from tests.support.rawwire import RawPeer
from tests.support.s3 import MotoS3

LEASE_TTL_MS = 2000
TAKE_OVER_S = LEASE_TTL_MS / 1000 + 20
BROKERS = ("b1", "b2", "b3")


@pytest.fixture
def cluster(tmp_path: Path, s3: MotoS3, bucket: str) -> Iterator[Cluster]:
    with running_cluster(tmp_path, s3, bucket, LEASE_TTL_MS) as cluster:
        yield cluster


class Peers:
    """A raw connection per broker (no client logic: the test sends exact batches)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.peers: dict[str, RawPeer] = {}

    async def peer(self, broker_id: str) -> RawPeer:
        if broker_id not in self.peers:
            self.peers[broker_id] = await RawPeer.open(await self.cluster.address(broker_id))
        return self.peers[broker_id]

    async def call(self, broker_id: str, request: m.Request) -> m.Response | HeadwaterError:
        peer = await self.peer(broker_id)
        await peer.request(request)
        return await peer.response(timeout=30)

    def forget(self, broker_id: str) -> None:
        peer = self.peers.pop(broker_id, None)
        if peer is not None:
            peer.writer.close()

    async def close(self) -> None:
        for broker_id in list(self.peers):
            self.forget(broker_id)


@pytest.fixture
async def peers(cluster: Cluster) -> AsyncIterator[Peers]:
    found = Peers(cluster)
    try:
        yield found
    finally:
        await found.close()


async def start_three(cluster: Cluster) -> None:
    await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in BROKERS))


async def producer_id(peers: Peers, broker_id: str) -> int:
    response = await peers.call(broker_id, m.InitProducerIdRequest())
    assert isinstance(response, m.InitProducerIdResponse), response
    return response.producer_id


def batch(pid: int, sequence: int, *values: bytes) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=0, base_sequence=sequence)
    for value in values:
        builder.append(None, value)
    return builder.build()


async def produce_at_owner(
    peers: Peers, topic: str, partition: int, data: bytes, timeout: float = TAKE_OVER_S
) -> int:
    """The batch sent to the partition's owner as etcd names it; NOT_OWNER (between owners)
    and STORAGE_ERROR (the new owner's producer table not rebuilt yet) retried with the SAME
    bytes, as a producer retries (bounded); its base offset."""
    deadline = time.monotonic() + timeout
    while True:
        owner = (await peers.cluster.owners(topic)).get(partition)
        answer: m.Response | HeadwaterError | None = None
        if owner is not None:
            try:
                answer = await peers.call(owner, m.ProduceRequest(topic, partition, data))
            except (OSError, EOFError, TimeoutError):
                peers.forget(owner)
        if isinstance(answer, m.ProduceResponse):
            return answer.base_offset
        if isinstance(answer, HeadwaterError) and not answer.retriable:
            raise answer
        assert time.monotonic() < deadline, f"not stored in {timeout}s: {answer}"
        await asyncio.sleep(0.1)


async def read_all(client: headwater.Client, topic: str, count: int) -> list[bytes]:
    """Every message of the topic from earliest, in order, once `count` have come (bounded)."""
    consumer = await client.subscribe(topic, "check", start="earliest")
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < count:
        assert time.monotonic() < deadline, f"only {len(values)} of {count} read back"
        try:
            message = await consumer.receive(timeout=1)
        except TimeoutError:
            continue
        values.append(message.value)
        await message.ack()
    await consumer.close()
    return values


async def test_a_batch_resent_to_the_new_owner_after_a_kill9_is_recognised(
    cluster: Cluster, peers: Peers
) -> None:
    await start_three(cluster)
    admin = await headwater.connect(await cluster.address("b1"))
    try:
        await admin.create_topic("ids", partitions=3)
        owner_of = await cluster.wait_owned("ids", 3, set(BROKERS))
        victim = owner_of[0]
        # ids issued through two brokers that are not the owner: each accepted there
        others = [b for b in BROKERS if b != victim]
        pids = [await producer_id(peers, others[0]), await producer_id(peers, others[1])]
        assert pids[0] != pids[1]
        sent: dict[tuple[int, int], bytes] = {}
        acked: dict[tuple[int, int], int] = {}
        for sequence in range(5):
            for pid in pids:
                data = batch(pid, sequence * 2, f"{pid}-{sequence}-a".encode(), b"%d" % pid)
                sent[pid, sequence] = data
                acked[pid, sequence] = await produce_at_owner(peers, "ids", 0, data)
        end = max(acked.values()) + 2
        assert sorted(acked.values()) == list(range(0, end, 2))
        # a retry at the same owner, before any failover, is a duplicate (as on one broker)
        assert await produce_at_owner(peers, "ids", 0, sent[pids[0], 4]) == acked[pids[0], 4]

        cluster.brokers[victim].kill()  # kill -9: nothing handed over but the object store
        peers.forget(victim)
        survivors = set(BROKERS) - {victim}
        await cluster.wait_owned("ids", 3, survivors, timeout=TAKE_OVER_S)
        # the producers resend their last batches with the same sequences, as after a lost
        # answer: the new owner knows them from the object store
        for pid in pids:
            for sequence in (3, 4):
                resent = await produce_at_owner(peers, "ids", 0, sent[pid, sequence])
                assert resent == acked[pid, sequence], (pid, sequence)
        rebuilt = sum(
            cluster.metrics(b).get("headwater_cluster_producer_tables_rebuilt_total", 0)
            for b in survivors
        )
        assert rebuilt >= 1  # the new owner rebuilt partition 0's table from the object store
        # and the next batch follows directly: nothing was appended by the resends
        following = await produce_at_owner(peers, "ids", 0, batch(pids[0], 10, b"next"))
        assert following == end
        # a gap in a known producer's sequence is still refused
        gap = await peers.call(
            (await cluster.owners("ids"))[0],
            m.ProduceRequest("ids", 0, batch(pids[1], 99, b"gap")),
        )
        assert isinstance(gap, headwater.HeadwaterError) and "expected 10" in gap.message

        reader = await headwater.connect(await cluster.address(sorted(survivors)[0]))
        try:
            values = await read_all(reader, "ids", end + 1)
        finally:
            await reader.close()
        expected = [
            v for s in range(5) for pid in pids for v in (f"{pid}-{s}-a".encode(), b"%d" % pid)
        ]
        assert values == [*expected, b"next"]
    finally:
        await admin.close()


async def test_producer_ids_issued_through_several_brokers_never_collide(
    cluster: Cluster, peers: Peers
) -> None:
    await start_three(cluster)
    clients = {b: await headwater.connect(await cluster.address(b)) for b in BROKERS}
    try:
        # more than a block (100) per broker, all at once: the brokers race for blocks
        async def issue(broker_id: str) -> int:
            response = await clients[broker_id]._request(m.InitProducerIdRequest())
            assert isinstance(response, m.InitProducerIdResponse)
            return response.producer_id

        ids = await asyncio.gather(*(issue(b) for b in BROKERS for _ in range(150)))
        duplicates = [i for i, n in Counter(ids).items() if n > 1]
        assert not duplicates, f"issued twice: {duplicates[:10]}"
        assert len(ids) == 450
        # every broker accepts an id another one issued (the newest: above what it knew)
        await clients["b1"].create_topic("any", partitions=3)
        owner_of = await cluster.wait_owned("any", 3, set(BROKERS))
        for partition, owner in owner_of.items():
            pid = await issue(next(b for b in BROKERS if b != owner))
            offset = await produce_at_owner(peers, "any", partition, batch(pid, 0, b"x"))
            assert offset == 0
        # an id nobody issued is refused
        refused = await peers.call(
            owner_of[0], m.ProduceRequest("any", 0, batch(max(ids) + 10_000, 0, b"x"))
        )
        assert isinstance(refused, headwater.UnknownProducerId)
    finally:
        for client in clients.values():
            await client.close()


async def test_an_idempotent_client_producer_rides_out_a_kill9_without_duplicates(
    cluster: Cluster,
) -> None:
    await start_three(cluster)
    client = await headwater.connect(await cluster.address("b1"))
    try:
        await client.create_topic("orders", partitions=3)
        owner_of = await cluster.wait_owned("orders", 3, set(BROKERS))
        victim = next(b for b in BROKERS if b != "b1" and b in owner_of.values())
        config = ProducerConfig(
            idempotent=True,
            max_in_flight=8,
            delivery=AtLeastOnce(RetryPolicy(max_retries=20, timeout=60)),
        )
        producer = client.producer("orders", config)
        values = [f"m-{i}".encode() for i in range(300)]
        futures = []
        for i, value in enumerate(values):
            futures.append(await producer.send(value, key=f"k{i % 7}".encode()))
            if i == 150:
                cluster.brokers[victim].kill()
        await producer.flush()
        for future in futures:
            await future
        read = await read_all(client, "orders", len(values))
        counts = Counter(read)
        assert set(counts) == set(values)
        assert all(n == 1 for n in counts.values()), [v for v, n in counts.items() if n > 1][:5]
    finally:
        await client.close()


def test_a_rebuilt_table_lets_unseen_producers_start_anywhere_and_checks_known_ones() -> None:
    """A new owner's table holds only the producers of the newest part of the log: one it has
    not seen (it wrote only earlier) continues at its own sequence; a known one is checked as on
    one broker (a retry is a duplicate, a gap refused). A complete table (one broker) still
    wants 0 first."""
    table = ProducerTable()
    table.reset(complete=False)
    table.recover(7, 40, 2, 100)  # seen by the rebuild: sequences 40-41 at offsets 100-101
    assert table.check(7, 40, 2) == 100  # a retry
    assert table.check(7, 42, 1) is None  # the next one
    with pytest.raises(OutOfOrderSequence):
        table.check(7, 50, 1)
    assert table.check(8, 1234, 3) is None  # not seen: new here, at its own sequence
    complete = ProducerTable()
    with pytest.raises(OutOfOrderSequence):
        complete.check(8, 1234, 3)


def _entries(table: ProducerTable) -> dict[int, tuple[int, list[tuple[int, int, int]]]]:
    return {p: (e.epoch, list(e.recent)) for p, e in table.producers.items()}


def _outcome(table: ProducerTable, batch: tuple[int, int, int, int]) -> object:
    producer_id, sequence, count, epoch = batch
    try:
        return table.check(producer_id, sequence, count, epoch)
    except HeadwaterError as exc:
        return type(exc)


def test_a_table_filled_newest_first_answers_what_the_whole_rebuild_answers() -> None:
    """A new owner's table filled from the newest batches down (`add_older`) says it answers a
    batch (`answers`) only when the table rebuilt from every batch, oldest first (`recover`),
    answers it the same (a retry with the same offset, the next batch, a gap, an old epoch),
    at every point of the filling; and completed by that table (`adopt`) it is that table. Logs
    of three producers (epochs that grow, sequences from 0 in each) drawn with a fixed seed."""
    rng = random.Random(42)
    for _ in range(25):
        log: list[tuple[int, int, int, int, int]] = []  # producer, sequence, count, offset, epoch
        state = {p: [0, 0] for p in (1, 2, 3)}  # producer -> [epoch, next sequence]
        offset = 0
        for _ in range(rng.randrange(1, 90)):
            producer = rng.choice((1, 1, 1, 2, 3))
            if rng.random() < 0.05:
                state[producer] = [state[producer][0] + 1, 0]
            epoch, sequence = state[producer]
            count = rng.randrange(1, 4)
            log.append((producer, sequence, count, offset, epoch))
            state[producer][1] += count
            offset += count
        whole = ProducerTable()
        whole.reset(complete=False)
        for producer, sequence, count, at, epoch in log:
            whole.recover(producer, sequence, count, at, epoch)
        candidates = {
            (producer, sequence + shift, count, epoch + bump)
            for producer, sequence, count, _, epoch in log
            for shift in (0, 1, 3)
            for bump in (-1, 0, 1)
        } | {(p, s, 1, e) for p, (e, s) in state.items()}
        filling = ProducerTable()
        filling.reset(complete=False)
        for found in range(len(log) + 1):
            for batch in candidates if found % 4 == 0 or found == len(log) else ():
                if filling.answers(*batch):
                    assert _outcome(filling, batch) == _outcome(whole, batch), (found, batch)
            # completed by the whole table at this point, it is that table
            done = ProducerTable()
            for producer, entry in filling.producers.items():
                done.producers[producer] = ProducerEntry.decode(entry.encode())
            done.adopt(whole)
            assert _entries(done) == _entries(whole), found
            if found < len(log):
                producer, sequence, count, at, epoch = log[-1 - found]
                filling.add_older(producer, sequence, count, at, epoch)
        # the producer's newest batch found is enough for its retry and its next batch
        producer, sequence, count, _, epoch = log[-1]
        newest = ProducerTable()
        newest.reset(complete=False)
        newest.add_older(*log[-1][:4], epoch)
        assert newest.answers(producer, sequence, count, epoch)
        assert newest.answers(producer, sequence + count, 1, epoch)


class _Archive:
    def __init__(self, entries: list[IndexEntry]) -> None:
        self.entries = entries

    async def segment_index(
        self, topic: str, partition: int, offset: int
    ) -> tuple[int, list[IndexEntry]] | None:
        return 0, self.entries


async def test_a_rebuild_reads_a_bounded_tail_of_the_newest_segments() -> None:
    mib = 1 << 20
    small = [SegmentEntry(i * 10, i * 10 + 10, i * 10, f"s{i}", 2 * mib) for i in range(3)]
    topic = cast(LogTopic, SimpleNamespace(name="t", archive=_Archive([])))
    # all of them when they hold less than the bound
    assert await _rebuild_start(topic, 0, Manifest(1, 1, tuple(small))) == 0
    assert await _rebuild_start(topic, 0, Manifest(1, 1, ())) == 0
    # a large last segment: from its index entry where its last REBUILD_BYTES begin
    big = SegmentEntry(30, 5000, 25, "big", 64 * mib)
    index = [IndexEntry(25 + k * 100, k * 4 * mib, 0) for k in range(16)]
    topic = cast(LogTopic, SimpleNamespace(name="t", archive=_Archive(index)))
    start = await _rebuild_start(topic, 0, Manifest(1, 1, (*small, big)))
    assert start == 25 + 12 * 100  # position 48 MiB = 64 - 16
    # several: the bound counts the newer ones first
    newer = SegmentEntry(5000, 5100, 5000, "newer", 10 * mib)
    start = await _rebuild_start(topic, 0, Manifest(1, 1, (*small, big, newer)))
    assert start == 25 + 15 * 100  # 6 MiB more of `big`: from 58 MiB, its entry at 60 MiB
