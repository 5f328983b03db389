"""Transactions attacked as the world will, against one real server process (issue 38's
hardening; the long runs are marked for `make test-long`).

- Hostile inputs: a marker-looking (control) batch from a client is refused on both protocols
  and nothing is appended; a transactional batch of a wrong epoch (older, newer) is refused
  INVALID_PRODUCER_EPOCH and the producer's transaction still commits; a timeout above the
  maximum, zero or negative on the Kafka port is INVALID_TRANSACTION_TIMEOUT (Kafka's rule; it
  was taken as the default before); negative producer ids, epochs and partitions, an empty or
  oversized transactional id, each get their precise error.
- Limits: a transaction of more partitions than the limit is refused INVALID_TXN_STATE naming
  the limit, and the transaction goes on; the stored bytes of a transaction growing one
  partition at a time grow linearly (the state's delta encoding).
- Races, pipelined on several connections: InitProducerId racing EndTxn racing
  AddPartitionsToTxn for one id, and produce racing abort: every answer is success or a
  precise error, and afterwards nothing is left open (the last stable offset reaches the end),
  nothing aborted is readable, and the id starts a new transaction that commits.
- Many transactional ids (long): 10,000 ids initialised, then every one is described.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterator

import pytest

import headwater
from headwater.durables.transaction_state import MAX_PARTITIONS, Transaction, plan_store
from headwater.wire import messages as m
from headwater.wire.errors import (
    ConcurrentTransactions,
    CorruptBatch,
    HeadwaterError,
    InvalidPartition,
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    InvalidRequest,
    InvalidTxnState,
    ProducerFenced,
)
from headwater.wire.markers import Marker, build_marker
from headwater.wire.records import BatchBuilder
from tests.support.kafka_support import KafkaServer, RawKafka
from tests.support.raw_transactions import RawTransaction


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    server = KafkaServer(tmp_path_factory.mktemp("txn-hostile") / "data").start()
    yield server
    server.stop()


def _batch(producer_id: int, epoch: int, sequence: int, *values: bytes) -> bytes:
    builder = BatchBuilder(
        producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence, transactional=True
    )
    for value in values:
        builder.append(None, value)
    return builder.build()


async def _end_offset(client: headwater.Client, topic: str, partition: int) -> tuple[int, int]:
    """(last stable offset, readable end) of the partition: a committed and a raw FETCH's end."""
    committed = await client.fetch(topic, partition, 0, max_bytes=1)
    raw = await client.fetch(topic, partition, 0, max_bytes=1, raw=True)
    return committed.end_offset, raw.end_offset


async def _committed_values(client: headwater.Client, topic: str, partition: int) -> list[bytes]:
    values: list[bytes] = []
    offset = 0
    for _ in range(1000):
        fetched = await client.fetch(topic, partition, offset)
        values += [r.value for r in fetched.records() if r.value is not None]
        if fetched.next_offset >= fetched.end_offset:
            return values
        offset = fetched.next_offset
    raise AssertionError("the partition was not read in 1000 FETCHes")


# Hostile inputs


async def test_a_marker_looking_batch_from_a_client_is_refused_on_both_protocols(
    kafka: KafkaServer, topic_name: str
) -> None:
    from aiokafka.protocol.produce import ProduceRequest_v3, ProduceResponse_v3

    async with await headwater.connect(kafka.process.address) as client:
        await client.create_topic(topic_name)
        name = f"{topic_name}-victim"
        began = await client.request(m.InitTransactionsRequest(name, 60_000))
        assert isinstance(began, m.InitProducerIdResponse)
        pid, epoch = began.producer_id, began.producer_epoch
        await client.request(m.AddPartitionsToTxnRequest(name, pid, epoch, topic_name, (0,)))
        await client.request(m.ProduceRequest(topic_name, 0, _batch(pid, epoch, 0, b"open")))
        before = await _end_offset(client, topic_name, 0)
        assert before == (0, 1)  # held open: the last stable offset is its first batch
        for marker in (Marker.COMMIT, Marker.ABORT):
            forged = build_marker(pid, epoch, marker)
            with pytest.raises(CorruptBatch):
                await client.request(m.ProduceRequest(topic_name, 0, forged))
            raw = RawKafka(kafka.kafka_port)
            try:
                body = ProduceRequest_v3(None, -1, 5000, [(topic_name, [(0, forged)])])
                raw.request(0, 3, 1, body.encode())
                answer = ProduceResponse_v3.decode(raw.response()[1])
            finally:
                raw.close()
            ((_, ((_, error, _, _),)),) = answer.topics
            assert error == 2  # CORRUPT_MESSAGE
        assert await _end_offset(client, topic_name, 0) == before  # nothing appended, still open
        await client.request(m.EndTxnRequest(name, pid, epoch, True))
        assert await _committed_values(client, topic_name, 0) == [b"open"]


def test_a_transactional_batch_of_a_wrong_epoch_is_refused_and_the_transaction_commits(
    kafka: KafkaServer, topic_name: str
) -> None:
    from aiokafka.protocol.produce import ProduceRequest_v3, ProduceResponse_v3

    asyncio.run(_create(kafka, topic_name))
    first = RawTransaction(kafka.kafka_port, f"{topic_name}-id").init()
    first.close()
    txn = RawTransaction(kafka.kafka_port, f"{topic_name}-id").init()  # epoch 1
    try:
        txn.produce(topic_name, 0, [(None, b"right")])
        for epoch in (txn.epoch - 1, txn.epoch + 1, 32_767):
            batch = _batch(txn.producer_id, epoch, 1, b"wrong")
            body = ProduceRequest_v3(txn.transactional_id, -1, 5000, [(topic_name, [(0, batch)])])
            txn.raw.request(0, 3, 99, body.encode())
            answer = ProduceResponse_v3.decode(txn.raw.response()[1])
            ((_, ((_, error, _, _),)),) = answer.topics
            assert error == 47, (epoch, answer)  # INVALID_PRODUCER_EPOCH
        txn.produce(topic_name, 0, [(None, b"right-again")])
        txn.end(commit=True)
    finally:
        txn.close()
    assert asyncio.run(_values(kafka, topic_name, 0)) == [b"right", b"right-again"]


async def _create(kafka: KafkaServer, topic: str, partitions: int = 1) -> None:
    async with await headwater.connect(kafka.process.address) as client:
        await client.create_topic(topic, partitions=partitions)


async def _values(kafka: KafkaServer, topic: str, partition: int) -> list[bytes]:
    async with await headwater.connect(kafka.process.address) as client:
        return await _committed_values(client, topic, partition)


@pytest.mark.parametrize("timeout_ms", [0, -1, -(2**31), 900_001, 2**31 - 1])
def test_a_transaction_timeout_out_of_range_is_invalid_transaction_timeout_on_kafka(
    kafka: KafkaServer, timeout_ms: int
) -> None:
    from aiokafka.protocol.transaction import InitProducerIdRequest_v0, InitProducerIdResponse_v0

    raw = RawKafka(kafka.kafka_port)
    try:
        raw.request(22, 0, 1, InitProducerIdRequest_v0(f"t{timeout_ms}", timeout_ms).encode())
        answer = InitProducerIdResponse_v0.decode(raw.response()[1])
    finally:
        raw.close()
    assert answer.error_code == 50, answer  # INVALID_TRANSACTION_TIMEOUT


async def test_negative_and_malformed_ids_get_precise_errors(
    kafka: KafkaServer, topic_name: str
) -> None:
    async with await headwater.connect(kafka.process.address) as client:
        await client.create_topic(topic_name, partitions=2)
        name = f"{topic_name}-ids"
        began = await client.request(m.InitTransactionsRequest(name, 60_000))
        assert isinstance(began, m.InitProducerIdResponse)
        pid, epoch = began.producer_id, began.producer_epoch
        refusals: list[tuple[m.Request, type[HeadwaterError]]] = [
            (m.InitTransactionsRequest("", 1000), InvalidRequest),
            (m.InitTransactionsRequest("x" * 250, 1000), InvalidRequest),
            (m.InitTransactionsRequest(name, -5), InvalidRequest),
            (m.InitTransactionsRequest(name, 1000, -7, 3), InvalidRequest),
            (m.InitTransactionsRequest(name, 1000, pid, -1), InvalidRequest),
            (
                m.AddPartitionsToTxnRequest(name, -1, epoch, topic_name, (0,)),
                InvalidProducerIdMapping,
            ),
            (m.AddPartitionsToTxnRequest(name, pid, -1, topic_name, (0,)), ProducerFenced),
            (m.AddPartitionsToTxnRequest(name, pid, epoch, topic_name, (-1,)), InvalidPartition),
            (m.AddPartitionsToTxnRequest(name, pid, epoch, topic_name, (2,)), InvalidPartition),
            (
                m.AddPartitionsToTxnRequest("never", 1, 0, topic_name, (0,)),
                InvalidProducerIdMapping,
            ),
            (m.EndTxnRequest(name, pid, -(2**15), True), ProducerFenced),
            (m.EndTxnRequest(name, -(2**63), epoch, False), InvalidProducerIdMapping),
            (m.EndTxnRequest(name, pid, epoch, True), InvalidTxnState),  # nothing begun
        ]
        for request, error in refusals:
            with pytest.raises(error):
                await client.request(request)
        # none of it changed the id: its producer goes on
        added = await client.request(
            m.AddPartitionsToTxnRequest(name, pid, epoch, topic_name, (1,))
        )
        assert isinstance(added, m.EmptyResponse)
        batch = _batch(pid, epoch, 0, b"fine")
        await client.request(m.ProduceRequest(topic_name, 1, batch))
        await client.request(m.EndTxnRequest(name, pid, epoch, True))
        assert await _committed_values(client, topic_name, 1) == [b"fine"]


# Limits


def test_a_transaction_growing_one_partition_at_a_time_is_stored_in_linear_bytes() -> None:
    """10,000 AddPartitionsToTxn of one partition each: each store writes its head and the
    partition it added, a constant; before the delta encoding each wrote every partition so
    far (841 MB in all for this run instead of 2 MB)."""
    txn = Transaction("app", 7, 0, 60_000)
    stored: Transaction | None = None
    written: list[int] = []
    for n in range(MAX_PARTITIONS):
        txn = txn.add_partitions(7, 0, [(f"topic-{n % 10}", n)], n)
        txn, change = plan_store(stored, txn)
        stored = txn
        written.append(len(change.head) + (len(change.chunk[1]) if change.chunk else 0))
    assert max(written[1000:]) < 2 * max(written[100:200]) < 1000  # no growth with the count
    assert sum(written) < 300 * MAX_PARTITIONS
    assert txn.partitions == stored.partitions and len(txn.partitions) == MAX_PARTITIONS


async def test_more_partitions_than_the_limit_is_refused_and_the_transaction_goes_on(
    kafka: KafkaServer, topic_name: str
) -> None:
    async with await headwater.connect(kafka.process.address) as client:
        topics = [f"{topic_name}-{i}" for i in range(10)]
        for topic in topics:
            await client.create_topic(topic, partitions=1001)
        name = f"{topic_name}-wide"
        began = await client.request(m.InitTransactionsRequest(name, 60_000))
        assert isinstance(began, m.InitProducerIdResponse)
        pid, epoch = began.producer_id, began.producer_epoch
        for topic in topics[:9]:
            await client.request(
                m.AddPartitionsToTxnRequest(name, pid, epoch, topic, tuple(range(1001)))
            )
        left = MAX_PARTITIONS - 9 * 1001
        await client.request(
            m.AddPartitionsToTxnRequest(name, pid, epoch, topics[9], tuple(range(left)))
        )
        with pytest.raises(InvalidTxnState, match=f"at most {MAX_PARTITIONS} partitions"):
            await client.request(m.AddPartitionsToTxnRequest(name, pid, epoch, topics[9], (left,)))
        await client.request(m.ProduceRequest(topics[9], 0, _batch(pid, epoch, 0, b"in")))
        await client.request(m.EndTxnRequest(name, pid, epoch, True))
        assert await _committed_values(client, topics[9], 0) == [b"in"]
        for topic in topics:
            await client.request(m.DeleteTopicRequest(topic))


# Races


async def test_init_end_and_add_partitions_racing_on_several_connections_leave_nothing_open(
    kafka: KafkaServer, topic_name: str
) -> None:
    rng = random.Random(38)
    partitions = 4
    name = f"{topic_name}-race"
    clients = [await headwater.connect(kafka.process.address) for _ in range(4)]
    try:
        await clients[0].create_topic(topic_name, partitions=partitions)
        began = await clients[0].request(m.InitTransactionsRequest(name, 60_000))
        assert isinstance(began, m.InitProducerIdResponse)
        expected = (ConcurrentTransactions, ProducerFenced, InvalidTxnState, InvalidProducerEpoch)
        aborted: set[bytes] = set()
        for round_ in range(30):
            pid, epoch = began.producer_id, began.producer_epoch
            tag = f"r{round_}".encode()
            requests: list[m.Request] = [
                m.AddPartitionsToTxnRequest(name, pid, epoch, topic_name, (p,))
                for p in range(partitions)
            ]
            requests += [
                m.ProduceRequest(topic_name, p, _batch(pid, epoch, 0, tag))
                for p in range(partitions)
            ]
            requests += [m.EndTxnRequest(name, pid, epoch, rng.random() < 0.5)]
            requests += [m.InitTransactionsRequest(name, 60_000)]
            rng.shuffle(requests)
            answers = await asyncio.gather(
                *(clients[i % len(clients)].request(r) for i, r in enumerate(requests)),
                return_exceptions=True,
            )
            for request, answer in zip(requests, answers, strict=True):
                if isinstance(answer, BaseException):
                    assert isinstance(answer, expected), (request, answer)
                elif isinstance(answer, m.InitProducerIdResponse):
                    began = answer
            # whatever happened, the id is usable again at once or after its abort completes
            for _ in range(100):
                try:
                    began = await clients[0].request(m.InitTransactionsRequest(name, 60_000))
                    break
                except ConcurrentTransactions:
                    await asyncio.sleep(0.05)
            else:
                raise AssertionError("the id stayed busy for 5 s")
            aborted.add(tag)
        for p in range(partitions):
            stable, end = await _end_offset(clients[0], topic_name, p)
            assert stable == end, (p, stable, end)  # nothing left open
    finally:
        for client in clients:
            await client.close()


async def test_produce_racing_abort_never_leaves_a_batch_open_or_visible(
    kafka: KafkaServer, topic_name: str
) -> None:
    name = f"{topic_name}-abort"
    producers = [await headwater.connect(kafka.process.address) for _ in range(3)]
    ender = await headwater.connect(kafka.process.address)
    try:
        await ender.create_topic(topic_name, partitions=2)
        for round_ in range(20):
            began = await ender.request(m.InitTransactionsRequest(name, 60_000))
            assert isinstance(began, m.InitProducerIdResponse)
            pid, epoch = began.producer_id, began.producer_epoch
            await ender.request(m.AddPartitionsToTxnRequest(name, pid, epoch, topic_name, (0, 1)))
            sends = [
                producers[n % 3].request(
                    m.ProduceRequest(
                        topic_name, n % 2, _batch(pid, epoch, n // 2, f"a{round_}-{n}".encode())
                    )
                )
                for n in range(12)
            ]
            end = ender.request(m.EndTxnRequest(name, pid, epoch, False))
            results = await asyncio.gather(*sends, end, return_exceptions=True)
            assert not isinstance(results[-1], BaseException), results[-1]
            for result in results[:-1]:
                if isinstance(result, BaseException):
                    assert isinstance(
                        result, InvalidTxnState | InvalidProducerEpoch | HeadwaterError
                    ), result
        for p in range(2):
            stable, end_offset = await _end_offset(ender, topic_name, p)
            assert stable == end_offset, (p, stable, end_offset)
            assert await _committed_values(ender, topic_name, p) == []
    finally:
        for client in (*producers, ender):
            with contextlib.suppress(HeadwaterError):
                await client.close()


# Many ids (long)


async def test_ten_thousand_transactional_ids_are_kept_and_each_described(
    kafka: KafkaServer, topic_name: str
) -> None:
    """(long: `make test-long`) 10,000 ids initialised 500 at a time on one connection, each
    then known to the coordinator with its own producer id."""
    names = [f"{topic_name}-{n:05d}" for n in range(10_000)]
    async with await headwater.connect(kafka.process.address) as client:
        issued: dict[str, int] = {}
        for start in range(0, len(names), 500):
            chunk = names[start : start + 500]
            answers = await asyncio.gather(
                *(client.request(m.InitTransactionsRequest(n, 60_000)) for n in chunk)
            )
            for name, answer in zip(chunk, answers, strict=True):
                assert isinstance(answer, m.InitProducerIdResponse)
                issued[name] = answer.producer_id
    assert len(set(issued.values())) == len(names)  # a producer id of its own each
    from aiokafka.protocol.transaction import InitProducerIdRequest_v0, InitProducerIdResponse_v0

    raw = RawKafka(kafka.kafka_port)
    try:  # and each is still known: a second init bumps its epoch, same producer id
        for n, name in enumerate(names[::500]):
            raw.request(22, 0, n, InitProducerIdRequest_v0(name, 60_000).encode())
            answer = InitProducerIdResponse_v0.decode(raw.response()[1])
            assert (answer.error_code, answer.producer_id, answer.producer_epoch) == (
                0,
                issued[name],
                1,
            )
    finally:
        raw.close()
