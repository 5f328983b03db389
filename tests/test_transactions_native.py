"""Transactions on the native protocol, against real server processes (issue 38, item 4): the
asyncio producer's `transaction()` across 3 topics x 3 partitions (commit, abort), what FETCH
reads of them (committed by default, markers and aborted batches with `raw`, a version 0 FETCH
as committed), fencing of an older instance, acknowledgements of a subscription's messages in a
transaction (applied at commit, redelivered after an abort), a transaction handed off and ended
by another client, the blocking client, and a kill -9 of the server between the sends and the
commit (all or nothing after the restart), and `headwater produce --transactional-id`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

import headwater
from headwater.client.blocking import BlockingClient
from headwater.client.fetched import Fetched
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError, InvalidTxnState, ProducerFenced
from headwater.wire.frames import encode_frame
from headwater.wire.markers import peek
from headwater.wire.protocol import decode_response, encode_request
from headwater.wire.records import BatchBuilder
from tests.support.cli_process import hw
from tests.support.rawwire import RawPeer

PARTITIONS = 3


async def topics(client: headwater.Client, name: str, count: int = 3) -> list[str]:
    names = [f"{name}-{i}" for i in range(count)]
    for topic in names:
        await client.create_topic(topic, partitions=PARTITIONS)
    return names


async def committed(client: headwater.Client, topic: str, partition: int) -> list[bytes | None]:
    """The values a transaction-aware reader reads of the partition, read to its end."""
    values: list[bytes | None] = []
    offset = 0
    for _ in range(1000):  # each round moves on, or the partition is read
        fetched = await client.fetch(topic, partition, offset)
        values += [r.value for r in fetched.records()]
        if fetched.next_offset >= fetched.end_offset:
            return values
        assert fetched.next_offset > offset, "a FETCH that does not move on"
        offset = fetched.next_offset
    raise AssertionError("the partition was not read in 1000 FETCHes")


async def raw(client: headwater.Client, topic: str, partition: int) -> list[bytes]:
    """Every batch of the partition, markers and aborted ones included (one FETCH: small)."""
    return (await client.fetch(topic, partition, 0, raw=True)).batches()


async def test_commit_and_abort_across_three_topics_of_three_partitions(
    client: headwater.Client, topic_name: str
) -> None:
    names = await topics(client, topic_name)
    producers = [client.producer(t, transactional_id=f"{topic_name}-app") for t in names]
    async with producers[0].transaction():  # one transaction: every producer of the id
        for producer in producers:
            for partition in range(PARTITIONS):
                await producer.send(f"ok-{partition}".encode(), partition=partition)
    with pytest.raises(RuntimeError):
        async with producers[1].transaction():
            for producer in producers:
                for partition in range(PARTITIONS):
                    await producer.send(f"no-{partition}".encode(), partition=partition)
            await producers[2].flush()  # some of it acknowledged before the abort
            raise RuntimeError("the application fails")
    async with producers[2].transaction():
        for producer in producers:
            for partition in range(PARTITIONS):
                await (await producer.send(f"ok2-{partition}".encode(), partition=partition))
    for topic in names:
        for partition in range(PARTITIONS):
            expected = [f"ok-{partition}".encode(), f"ok2-{partition}".encode()]
            assert await committed(client, topic, partition) == expected
            batches = await raw(client, topic, partition)
            markers = [b for b in batches if peek(b).control]
            assert len(markers) == 3  # commit, abort, commit
            fetched = await client.fetch(topic, partition, 0, raw=True)
            assert f"no-{partition}".encode() in [r.value for r in fetched.records()]
    for producer in producers:
        await producer.close()


async def test_a_fetch_reads_committed_records_only_and_raw_reads_everything(
    client: headwater.Client, server: ServerProcess, topic_name: str
) -> None:
    """An open transaction holds a committed read at its first offset (the LSO); a long poll
    there answers once it commits; raw reads see it at once; a version 0 FETCH (no isolation
    field) reads as a committed one."""
    await client.create_topic(topic_name)
    plain = client.producer(topic_name)
    await (await plain.send(b"before", partition=0))
    producer = client.producer(topic_name, transactional_id=f"{topic_name}-app")
    async with producer.transaction():
        await (await producer.send(b"in", partition=0))
        held = await client.fetch(topic_name, 0, 0)
        assert [r.value for r in held.records()] == [b"before"]
        assert held.end_offset == 1  # the last stable offset: the open transaction's first
        seen = await client.fetch(topic_name, 0, 0, raw=True)
        assert [r.value for r in seen.records()] == [b"before", b"in"]
        polled = asyncio.ensure_future(client.fetch(topic_name, 0, 1, max_wait=10.0))
        await asyncio.sleep(0)  # (the poll is sent; the commit below answers it)
    answer = await asyncio.wait_for(polled, 15)
    assert [r.value for r in answer.records()] == [b"in"]
    assert answer.next_offset == 2  # after "in"; the marker at 2 is stepped over next
    await (await plain.send(b"after", partition=0))
    assert await committed(client, topic_name, 0) == [b"before", b"in", b"after"]

    peer = await RawPeer.open(server.address)
    try:
        frame = encode_request(m.FetchRequest(topic_name, 0, 0, 65536, 0), 9)
        body = frame[14:-1]  # version 0's layout: without the isolation field
        await peer.send(encode_frame(m.ApiKey.FETCH, 0, 9, 0, body))
        reply = await peer.frame()
        response = decode_response(reply.header, reply.body)
        assert isinstance(response, m.FetchResponse)
        fetched = Fetched(
            topic_name, 0, 0, 0, response.end_offset, response.records, response.next_offset
        )
        assert [r.value for r in fetched.records()] == [b"before", b"in", b"after"]
        assert not any(peek(b).control for b in fetched.batches())
    finally:
        peer.writer.close()
    await plain.close()
    await producer.close()


async def test_a_newer_instance_fences_the_older_whose_later_writes_are_never_visible(
    server: ServerProcess, topic_name: str
) -> None:
    first = await headwater.connect(server.address)
    second = await headwater.connect(server.address)
    try:
        await first.create_topic(topic_name, partitions=2)
        old = first.producer(topic_name, transactional_id=f"{topic_name}-app")
        with pytest.raises(ProducerFenced):
            async with old.transaction():
                await (await old.send(b"old-1", partition=0))
                new = second.producer(topic_name, transactional_id=f"{topic_name}-app")
                async with new.transaction():  # its start aborts the old one's transaction
                    await new.send(b"new", partition=0)
                await old.send(b"old-2", partition=0)  # refused: INVALID_PRODUCER_EPOCH
        with pytest.raises(ProducerFenced):
            await old.send(b"old-3", partition=1)
        with pytest.raises(ProducerFenced):
            async with old.transaction():
                pass
        # the server refuses the old epoch too, whatever the client does
        session = old._session
        assert session is not None
        with pytest.raises(ProducerFenced):
            await first.request(
                m.AddPartitionsToTxnRequest(
                    session.transactional_id,
                    session.producer_id,
                    session.epoch,
                    topic_name,
                    (1,),
                )
            )
        assert await committed(first, topic_name, 0) == [b"new"]
        assert await committed(first, topic_name, 1) == []
        everything = await first.fetch(topic_name, 0, 0, raw=True)
        values = [r.value for r in everything.records()]
        assert b"old-1" in values and b"old-2" not in values  # aborted; never appended
        assert [r.value for r in (await first.fetch(topic_name, 1, 0, raw=True)).records()] == []
        await new.close()
    finally:
        await first.close()
        await second.close()


async def test_init_transactions_returns_once_the_predecessors_transaction_is_settled(
    server: ServerProcess, topic_name: str
) -> None:
    """`init_transactions` (Kafka's) waits until the new instance holds its epoch, which the
    server grants only once the old instance's open transaction is aborted: afterwards a
    transaction-aware read is past it (the partition's last stable offset no longer held at
    the old batch) without waiting for anything else."""
    first = await headwater.connect(server.address)
    second = await headwater.connect(server.address)
    try:
        await first.create_topic(topic_name, partitions=1)
        old = first.producer(topic_name, transactional_id=f"{topic_name}-app")
        async with old.transaction(hand_off=True):  # left open at the server
            await (await old.send(b"old", partition=0))
        held = await first.fetch(topic_name, 0, 0)
        assert held.end_offset == 0  # an open transaction holds readers at its first offset
        new = second.producer(topic_name, transactional_id=f"{topic_name}-app")
        await new.init_transactions()
        session = new._session
        assert session is not None and session.producer_id >= 0
        settled = await first.fetch(topic_name, 0, 0)
        assert settled.end_offset == 2  # the old batch and its abort marker
        assert settled.records() == []
        await new.close()
    finally:
        await first.close()
        await second.close()


async def test_a_transaction_handed_off_is_ended_by_another_client_until_fenced(
    server: ServerProcess, topic_name: str
) -> None:
    """`transaction(hand_off=True)` leaves the transaction open, unseen, for another client to
    commit by its handle (Spark's sink: tasks write, the driver commits); an end again is done;
    a newer instance of the id aborts a handed-off transaction and its handle is fenced."""
    writer = await headwater.connect(server.address)
    ender = await headwater.connect(server.address)
    try:
        await writer.create_topic(topic_name)
        producer = writer.producer(topic_name, transactional_id=f"{topic_name}-task")
        async with producer.transaction(hand_off=True) as handle:
            for i in range(3):
                await producer.send(f"v{i}".encode())
        await producer.close()
        assert handle.transactional_id == f"{topic_name}-task"
        assert await committed(ender, topic_name, 0) == []  # open: nothing visible
        await ender.end_transaction(handle, commit=True)
        assert await committed(ender, topic_name, 0) == [b"v0", b"v1", b"v2"]
        await ender.end_transaction(handle, commit=True)  # again (a lost answer): done

        retried = writer.producer(topic_name, transactional_id=f"{topic_name}-task")
        async with retried.transaction(hand_off=True) as stale:
            await retried.send(b"failed attempt")
        with pytest.raises(InvalidTxnState, match="handed off"):
            async with retried.transaction():
                pass
        await retried.close()
        retry = writer.producer(topic_name, transactional_id=f"{topic_name}-task")
        async with retry.transaction(hand_off=True) as fresh:  # its start aborts the stale one
            await retry.send(b"retry")
        with pytest.raises(ProducerFenced):
            await ender.end_transaction(stale, commit=True)
        await ender.end_transaction(fresh, commit=True)
        assert await committed(ender, topic_name, 0) == [b"v0", b"v1", b"v2", b"retry"]
        with pytest.raises(InvalidTxnState, match="sent nothing"):
            async with writer.producer(
                topic_name, transactional_id=f"{topic_name}-empty"
            ).transaction(hand_off=True):
                pass
    finally:
        await writer.close()
        await ender.close()


async def test_acks_in_a_transaction_apply_at_commit_and_not_at_abort(
    client: headwater.Client, topic_name: str
) -> None:
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    await client.create_topic(source)
    await client.create_topic(sink)
    feeder = client.producer(source)
    for i in range(4):
        await (await feeder.send(f"m{i}".encode(), partition=0))
    consumer = await client.subscribe(
        source, "worker", type="shared", start="earliest", ack_timeout=2.0
    )
    received = [await consumer.receive(10) for _ in range(4)]
    assert [r.value for r in received] == [b"m0", b"m1", b"m2", b"m3"]
    producer = client.producer(sink, transactional_id=f"{topic_name}-app")
    async with producer.transaction():
        await producer.send(b"out-0", partition=0)
        await producer.send_acks(consumer, received[:2])
    with pytest.raises(RuntimeError):
        async with producer.transaction():
            await producer.send(b"out-1", partition=0)
            await producer.send_acks(consumer, received[2:])
            raise RuntimeError("the application fails before its commit")
    [detail] = await client.list_subscriptions(source)
    assert detail.partitions[0].committed == 2  # m0, m1: acknowledged by the commit
    started = time.monotonic()
    again = [await consumer.receive(10) for _ in range(2)]  # after their ack timeout
    assert [(r.value, r.delivery_count) for r in again] == [(b"m2", 2), (b"m3", 2)]
    assert time.monotonic() - started < 9
    assert await committed(client, sink, 0) == [b"out-0"]
    with pytest.raises(InvalidTxnState):  # acks go in a transaction
        await producer.send_acks(consumer, again)
    async with producer.transaction():
        await producer.send_acks(consumer, again)
    [detail] = await client.list_subscriptions(source)
    assert detail.partitions[0].committed == 4
    await consumer.close()
    await producer.close()
    await feeder.close()


async def test_the_blocking_client_commits_and_aborts(
    client: headwater.Client, server: ServerProcess, topic_name: str
) -> None:
    names = await topics(client, topic_name, 2)
    with BlockingClient(server.address) as blocking:
        producer = blocking.transactional_producer(f"{topic_name}-app")
        with producer.transaction():
            for topic in names:
                producer.produce(topic, [(None, b"a", ()), (b"k", b"b", ())], partition=1)
        with pytest.raises(RuntimeError), producer.transaction():
            producer.produce(names[0], [(None, b"no", ())], partition=1)
            raise RuntimeError("abort")
        with producer.transaction():  # after the abort: a bumped epoch, sequences from 0
            producer.produce(names[0], [(None, b"c", ())], partition=1)
        newer = blocking.transactional_producer(f"{topic_name}-app")
        with pytest.raises(ProducerFenced):
            producer.produce(names[1], [(None, b"fenced", ())], partition=1)
        with pytest.raises(ProducerFenced), producer.transaction():
            pass
        with newer.transaction():
            newer.produce(names[1], [(None, b"d", ())], partition=1)
    assert await committed(client, names[0], 1) == [b"a", b"b", b"c"]
    assert await committed(client, names[1], 1) == [b"a", b"b", b"d"]


async def test_produce_with_a_transactional_id_commits_all_or_nothing(
    client: headwater.Client, server: ServerProcess, topic_name: str
) -> None:
    await client.create_topic(topic_name)
    tid = f"{topic_name}-cli"
    done = hw("produce", topic_name, "a", "b", "c", "--transactional-id", tid, server=server)
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"produced 3 messages to {topic_name} in one transaction, committed\n"
    assert await committed(client, topic_name, 0) == [b"a", b"b", b"c"]
    assert sum(peek(b).control for b in await raw(client, topic_name, 0)) == 1

    # two lines sent, the third refused by the producer: the transaction is aborted
    lines = b"d\ne\n" + b"x" * (2 * 1024 * 1024) + b"\n"
    failed = hw("produce", topic_name, "--transactional-id", tid, stdin=lines, server=server)
    assert failed.returncode == 1
    assert failed.stderr.startswith("headwater: error: RECORD_TOO_LARGE: ")
    assert failed.stderr.endswith(
        "; the transaction was aborted: none of the 2 messages sent is committed\n"
    )
    assert await committed(client, topic_name, 0) == [b"a", b"b", b"c"]
    aborted = await client.fetch(topic_name, 0, 0, raw=True)
    assert [r.value for r in aborted.records()] == [b"a", b"b", b"c", b"d", b"e"]

    await client.create_topic(f"{topic_name}-live", dispatch="non-reliable")
    live = hw("produce", f"{topic_name}-live", "v", "--transactional-id", tid, server=server)
    assert live.returncode == 1 and "NOT_SUPPORTED" in live.stderr, live.stderr


def _transactional_batch(producer_id: int, epoch: int, sequence: int, value: bytes) -> bytes:
    builder = BatchBuilder(
        producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence, transactional=True
    )
    builder.append(None, value)
    return builder.build()


async def test_a_server_killed_between_the_sends_and_the_commit_ends_all_or_nothing(
    tmp_path: Path, topic_name: str
) -> None:
    """kill -9 once the records of a transaction over 3 x 3 partitions are acknowledged and its
    END_TXN is sent (unanswered): after the restart, every partition has all of them or none
    (a transaction left open is aborted by the next instance's start), and the next transaction
    commits. Then a transaction whose commit was answered: a second kill -9 keeps all of it, the
    acknowledgements it carried included."""
    server = ServerProcess(tmp_path / "data").start()
    tid = f"{topic_name}-app"
    try:
        client = await headwater.connect(server.address)
        names = await topics(client, topic_name)
        started = await client.request(m.InitTransactionsRequest(tid, 30_000))
        assert isinstance(started, m.InitProducerIdResponse)
        ids = (tid, started.producer_id, started.producer_epoch)
        for topic in names:
            await client.request(m.AddPartitionsToTxnRequest(*ids, topic, (0, 1, 2)))
            for partition in range(PARTITIONS):
                batch = _transactional_batch(*ids[1:], 0, b"first")
                await client.request(m.ProduceRequest(topic, partition, batch))
        ending = client.send_request(m.EndTxnRequest(*ids, True))  # not waited for
        server.kill()
        with contextlib.suppress(HeadwaterError):
            await ending  # answered before the kill, or lost with the connection
        server.start()
        await client.close()

        client = await headwater.connect(server.address)
        producer = client.producer(names[0], transactional_id=tid)
        async with producer.transaction():  # its start settles the one the kill left
            await producer.send(b"second", partition=0)
        found = {
            (topic, partition): await committed(client, topic, partition)
            for topic in names
            for partition in range(PARTITIONS)
        }
        firsts = {where for where, values in found.items() if b"first" in values}
        assert firsts in (set(), set(found)), f"half a transaction: {sorted(firsts)}"
        assert found[(names[0], 0)][-1:] == [b"second"]
        source = f"{topic_name}-in"
        await client.create_topic(source)
        await (await client.producer(source).send(b"input", partition=0))
        consumer = await client.subscribe(source, "worker", start="earliest", ack_timeout=60)
        message = await consumer.receive(10)
        async with producer.transaction():
            await producer.send(b"third", partition=1)
            await producer.send_acks(consumer, [message])
        await client.close()

        server.kill()  # the commit was answered: its records and its acks survive
        server.start()
        client = await headwater.connect(server.address)
        assert (await committed(client, names[0], 1))[-1:] == [b"third"]
        assert (await committed(client, names[0], 0))[-1:] == [b"second"]
        [detail] = await client.list_subscriptions(source)
        assert detail.partitions[0].committed == 1
        await client.close()
    finally:
        server.kill()
