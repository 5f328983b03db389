"""Kafka transactions through stock clients against one real server process (issue 38).

Each of confluent-kafka (librdkafka), kafka-python and aiokafka is a transactional producer:
transactions committed and aborted across 3 topics x 3 partitions are read by read_committed
consumers exactly as committed (each record once, in order, no marker), and by read_uncommitted
ones with the aborted records too, as Kafka documents; offsets sent in a transaction move the
group's committed offsets only when it commits; a second producer of the same transactional id
fences the first, none of whose later writes is ever visible; a transaction left open is aborted
after its timeout, the last stable offset moves on and its producer is fenced; the coordinator's
states are listed and described through kafka-python's admin client.

Under kill -9 (a server of the test's own, restarted on the same Kafka port): markers and aborted
ranges across segment rolls, uploads and local retention; an end cut after its decision is
completed on start, and one whose producer went mid-commit goes on; a consume-transform-produce
application over 20,000 records killed three times and its server twice is exactly once. The long
runs are tests/test_transactions_attack.py.
"""

from __future__ import annotations

import contextlib
import random
import struct
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient

from headwater.server.kafka import codec
from headwater.server.kafka.apis import SERVED
from headwater.server.kafka.messages.produce import InitProducerIdRequest
from headwater.server.kafka.messages.transactions import EndTxnRequest
from tests.support.kafka_support import KafkaServer, RawKafka
from tests.support.txn_attack import create, exactly_once_run, restarts
from tests.support.txn_clients import (
    CLIENTS,
    Partition,
    Record,
    TxnProducer,
    fenced,
    produce_plain,
    producer,
    read,
    seal,
    timeout_config,
    values,
)


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    server = KafkaServer(tmp_path_factory.mktemp("kafka-txn") / "data").start()
    yield server
    server.stop()


def _nine(server: KafkaServer, topic_name: str) -> list[Partition]:
    """3 topics x 3 partitions."""
    return create(server, [f"{topic_name}-{i}" for i in range(3)])


def _records(partitions: list[Partition], tag: str, per_partition: int = 3) -> list[Record]:
    return [
        (topic, index, f"{tag}-{topic[-1]}{index}-{n}".encode())
        for n in range(per_partition)
        for topic, index in partitions
    ]


def _by_partition(records: list[Record]) -> dict[Partition, list[bytes]]:
    out: dict[Partition, list[bytes]] = {}
    for topic, index, value in records:
        out.setdefault((topic, index), []).append(value)
    return out


def _expect(partitions: list[Partition], *groups: list[Record]) -> dict[Partition, list[bytes]]:
    """Each partition's values, the groups' records in the order given."""
    expected: dict[Partition, list[bytes]] = {tp: [] for tp in partitions}
    for group in groups:
        for tp, found in _by_partition(group).items():
            expected[tp] += found
    return expected


# A flexible version's answer has the response header v1 (found: kafka-python could not init)


def test_a_flexible_answer_has_the_response_header_tagged_fields(kafka: KafkaServer) -> None:
    """InitProducerId v4 is flexible: its answer's header ends with an empty tagged-fields
    byte, which kafka-python and aiokafka read before the body (without it kafka-python's
    init_transactions timed out and librdkafka read the producer id shifted by a byte)."""
    raw = RawKafka(kafka.kafka_port)
    try:
        layout = SERVED[22].requests[4]
        body = codec.encode(layout, InitProducerIdRequest(None, 60_000, -1, -1))
        client = b"raw"
        header = struct.pack(">hhih", 22, 4, 9, len(client)) + client + b"\x00"
        raw.send_raw(struct.pack(">i", len(header) + len(body)) + header + body)
        correlation, rest = raw.response()
    finally:
        raw.close()
    assert correlation == 9
    assert rest[:1] == b"\x00"  # the header's tagged fields
    throttle, error, producer_id, epoch = struct.unpack_from(">ihqh", rest, 1)
    assert (throttle, error, epoch) == (0, 0, 0) and producer_id >= 0
    assert rest[1 + 16 :] == b"\x00"  # the body's tagged fields, and nothing after


# 1. Commit and abort across 3 topics x 3 partitions


@pytest.mark.parametrize("client", CLIENTS)
def test_read_committed_sees_exactly_the_committed_records_and_uncommitted_the_aborted_too(
    kafka: KafkaServer, topic_name: str, client: str
) -> None:
    partitions = _nine(kafka, topic_name)
    first, aborted, last = (_records(partitions, tag) for tag in ("c1", "a2", "c3"))
    txn = producer(client, kafka.bootstrap, f"{topic_name}-txn")
    try:
        txn.begin()
        txn.send(first)
        txn.commit()
        txn.begin()
        txn.send(aborted)
        txn.flush()  # in the log before the abort: read_uncommitted sees them
        txn.abort()
        txn.begin()
        txn.send(last)
        txn.commit()
    finally:
        txn.close()
    committed = _expect(partitions, first, last)
    for reader in ("confluent", "kafka-python", "aiokafka"):
        assert values(read(reader, kafka.bootstrap, partitions, committed=True)) == committed
    # read_uncommitted: every record written, aborted ones included, in log order; no marker
    everything = _expect(partitions, first, aborted, last)
    for reader in ("confluent", "kafka-python"):
        seen = read(reader, kafka.bootstrap, partitions, committed=False)
        assert values(seen) == everything
        # each transaction's marker takes an offset, never read as a record
        markers = {3, 7, 11}
        assert all(
            [offset for offset, _, _ in records] == sorted(set(range(12)) - markers)
            for records in seen.values()
        )


def test_two_producers_interleaved_on_the_same_partitions_are_told_apart(
    kafka: KafkaServer, topic_name: str
) -> None:
    """A librdkafka and a kafka-python transactional producer and plain records interleaved in
    the same partitions: read_committed stops at the oldest open transaction, drops the aborted
    one's records wherever they fall between the committed ones, and reads on once it ends."""
    partitions = create(kafka, [topic_name])
    a = producer("confluent", kafka.bootstrap, f"{topic_name}-a")
    b = producer("kafka-python", kafka.bootstrap, f"{topic_name}-b")
    log: list[list[Record]] = []  # every write, in the log's order

    def write(txn: TxnProducer | None, tag: str) -> list[Record]:
        records = _records(partitions, tag, 1)
        if txn is None:
            produce_plain(kafka.bootstrap, records)
        else:
            txn.send(records)
            txn.flush()
        log.append(records)
        return records

    try:
        a.begin()
        b.begin()
        a1, _b1, a2, plain1 = write(a, "a1"), write(b, "b1"), write(a, "a2"), write(None, "p1")
        a.commit()
        write(b, "b2")
        b.abort()
        a.begin()
        a3 = write(a, "a3")  # left open for now
        b.begin()
        b3 = write(b, "b3")
        b.commit()
        everything = _expect(partitions, *log)
        assert values(read("aiokafka", kafka.bootstrap, partitions, committed=False)) == everything
        for reader in ("confluent", "kafka-python"):
            # up to a3's open transaction: b3, committed after it, waits
            seen = read(reader, kafka.bootstrap, partitions, committed=True)
            assert values(seen) == _expect(partitions, a1, a2, plain1), reader
        a.commit()
        for reader in CLIENTS:
            seen = read(reader, kafka.bootstrap, partitions, committed=True)
            assert values(seen) == _expect(partitions, a1, a2, plain1, a3, b3), reader
    finally:
        a.close()
        b.close()


# Offsets sent in a transaction


def _committed_offsets(server: KafkaServer, group: str, partitions: list[Partition]) -> dict:
    """The group's committed offsets through OffsetFetch: kafka-python's admin client and
    librdkafka's committed() must agree."""
    from confluent_kafka import Consumer, TopicPartition
    from kafka import TopicPartition as KafkaTopicPartition

    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=10_000)
    try:
        through_admin = {
            (tp.topic, tp.partition): meta.offset
            for tp, meta in admin.list_group_offsets(
                {group: [KafkaTopicPartition(t, p) for t, p in partitions]}
            )[group].items()
            if meta.offset >= 0
        }
    finally:
        admin.close()
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": group})
    try:
        through_librdkafka = {
            (tp.topic, tp.partition): tp.offset
            for tp in consumer.committed([TopicPartition(t, p) for t, p in partitions], 30)
            if tp.offset >= 0
        }
    finally:
        consumer.close()
    assert through_admin == through_librdkafka
    return through_admin


@pytest.mark.parametrize("client", CLIENTS)
def test_offsets_sent_in_a_transaction_move_the_group_only_when_it_commits(
    kafka: KafkaServer, topic_name: str, client: str
) -> None:
    inputs = create(kafka, [f"{topic_name}-in"])
    outputs = create(kafka, [f"{topic_name}-out"])
    group = f"{topic_name}-group"
    # the offsets sent are within what the partitions hold (a group's cursor stops at the end)
    produce_plain(kafka.bootstrap, _records(inputs, "input", 10))
    txn = producer(client, kafka.bootstrap, f"{topic_name}-txn")
    try:
        assert _committed_offsets(kafka, group, inputs) == {}
        txn.begin()
        txn.send(_records(outputs, "aborted", 1))
        txn.send_offsets(group, {tp: 5 for tp in inputs})
        txn.abort()
        assert _committed_offsets(kafka, group, inputs) == {}
        txn.begin()
        txn.send(_records(outputs, "committed", 1))
        txn.send_offsets(group, {tp: 7 + tp[1] for tp in inputs})
        # not yet: the offsets wait for the commit
        assert _committed_offsets(kafka, group, inputs) == {}
        txn.commit()
        assert _committed_offsets(kafka, group, inputs) == {tp: 7 + tp[1] for tp in inputs}
        # a later aborted transaction does not move them back or on
        txn.begin()
        txn.send(_records(outputs, "aborted-too", 1))
        txn.send_offsets(group, {tp: 10 for tp in inputs})
        txn.abort()
        assert _committed_offsets(kafka, group, inputs) == {tp: 7 + tp[1] for tp in inputs}
    finally:
        txn.close()
    assert values(read("confluent", kafka.bootstrap, outputs, committed=True)) == _expect(
        outputs, _records(outputs, "committed", 1)
    )


# 2. Fencing


def _fenced_end(txn: TxnProducer, records: list[Record]) -> list[Exception]:
    """A fenced producer's writes and commit: what each refusal raised. The Python clients are
    refused the Produce (INVALID_PRODUCER_EPOCH, Kafka's answer to a batch of an older epoch) and
    abort, which the coordinator then refuses (PRODUCER_FENCED); librdkafka's first refusal is
    a fatal "fenced" error already, as every one after it."""
    failures: list[Exception] = []
    try:
        txn.send(records)
        txn.flush()
        txn.commit()
    except Exception as exc:  # the client's own error type: `fenced` checks it
        failures.append(exc)
        if fenced(exc):
            return failures
        try:
            txn.abort()
        except Exception as again:
            failures.append(again)
    return failures


@pytest.mark.parametrize("client", CLIENTS)
def test_a_second_producer_of_the_same_id_fences_the_first_whose_writes_never_show(
    kafka: KafkaServer, topic_name: str, client: str
) -> None:
    partitions = _nine(kafka, topic_name)
    transactional_id = f"{topic_name}-txn"
    old = producer(client, kafka.bootstrap, transactional_id)
    new = None
    try:
        old.begin()
        before = _records(partitions, "old-before")
        old.send(before)
        old.flush()
        # the new instance's init aborts the old one's transaction and bumps the epoch
        new = producer(client, kafka.bootstrap, transactional_id)
        failures = _fenced_end(old, _records(partitions, "old-after"))
        assert failures, "the fenced producer's commit succeeded"
        assert fenced(failures[-1]), repr(failures)
        new.begin()
        fresh = _records(partitions, "new")
        new.send(fresh)
        new.commit()
    finally:
        for instance in (old, new):
            if instance is not None:
                with contextlib.suppress(Exception):  # a fenced producer may refuse to close
                    instance.close()
    assert values(read("confluent", kafka.bootstrap, partitions, committed=True)) == _expect(
        partitions, fresh
    )
    assert values(read("kafka-python", kafka.bootstrap, partitions, committed=True)) == _expect(
        partitions, fresh
    )


def _end_unanswered(
    server: KafkaServer, admin: KafkaAdminClient, transactional_id: str, commit: bool
) -> RawKafka:
    """EndTxn of the id's transaction in progress, sent on a connection of its own and not
    waited for (the caller closes it)."""
    held = admin.describe_transactions([transactional_id])[transactional_id]
    raw = RawKafka(server.kafka_port)
    end = EndTxnRequest(transactional_id, held.producer_id, held.producer_epoch, commit)
    raw.request(26, 1, 1, codec.encode(SERVED[26].requests[1], end))
    return raw


def _state_after(admin: KafkaAdminClient, transactional_id: str, state: Any) -> Any:
    """The id's state once it is no longer `state` (DescribeTransactions polled, 10 s at most)."""
    deadline = time.monotonic() + 10
    found = state
    while found == state and time.monotonic() < deadline:
        found = admin.describe_transactions([transactional_id])[transactional_id].state
    return found


def test_a_commit_whose_producer_went_mid_way_is_completed_and_the_next_instance_starts(
    kafka: KafkaServer, topic_name: str
) -> None:
    """Found: EndTxn's end ran in the request's task, which the connection's close cancels: a
    producer gone while its commit's markers were being written left the id in PrepareCommit
    until a restart, and every later instance was refused CONCURRENT_TRANSACTIONS."""
    from kafka.admin._transactions import TransactionState

    partitions = create(kafka, [f"{topic_name}-{i}" for i in range(2)], partitions=32)
    transactional_id = f"{topic_name}-txn"
    txn = producer("confluent", kafka.bootstrap, transactional_id)
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap, request_timeout_ms=10_000)
    try:
        txn.begin()
        decided = _records(partitions, "decided", 1)
        txn.send(decided)
        txn.flush()
        raw = _end_unanswered(kafka, admin, transactional_id, commit=True)
        # 64 markers take a while: the producer goes once the commit is decided
        state = _state_after(admin, transactional_id, TransactionState.ONGOING)
        raw.close()
        assert state == TransactionState.PREPARE_COMMIT, state
        state = _state_after(admin, transactional_id, TransactionState.PREPARE_COMMIT)
        assert state == TransactionState.COMPLETE_COMMIT, state
        started = time.monotonic()
        producer("confluent", kafka.bootstrap, transactional_id).close()
        assert time.monotonic() - started < 10
    finally:
        admin.close()
        with contextlib.suppress(Exception):
            txn.close()
    assert values(read("confluent", kafka.bootstrap, partitions, committed=True)) == _expect(
        partitions, decided
    )


# An abandoned transaction


def _last_stable(server: KafkaServer, partitions: list[Partition]) -> dict[Partition, int]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, isolation_level="read_committed")
    try:
        ends = consumer.end_offsets([TopicPartition(t, p) for t, p in partitions])
        return {(tp.topic, tp.partition): offset for tp, offset in ends.items()}
    finally:
        consumer.close()


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_a_transaction_left_open_is_aborted_after_its_timeout_and_its_producer_fenced(
    kafka: KafkaServer, topic_name: str, client: str
) -> None:
    partitions = create(kafka, [topic_name])
    txn = producer(client, kafka.bootstrap, f"{topic_name}-txn", **timeout_config(client, 3000))
    try:
        started = time.monotonic()
        txn.begin()
        abandoned = _records(partitions, "abandoned")
        txn.send(abandoned)
        txn.flush()
        # records after the open transaction's first: read_committed stops before all of them
        after = _records(partitions, "after")
        produce_plain(kafka.bootstrap, after)
        assert _last_stable(kafka, partitions) == {tp: 0 for tp in partitions}
        assert values(read("confluent", kafka.bootstrap, partitions, committed=True)) == {
            tp: [] for tp in partitions
        }
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and 0 in _last_stable(kafka, partitions).values():
            time.sleep(0.1)
        waited = time.monotonic() - started
        # aborted by the timeout (3 s; the coordinator looks every second), not before it
        assert 3.0 <= waited < 30, waited
        # the abort marker is the last offset: the stable end is the high watermark
        assert _last_stable(kafka, partitions) == {tp: 3 + 3 + 1 for tp in partitions}
        expected = _expect(partitions, after)
        assert values(read("confluent", kafka.bootstrap, partitions, committed=True)) == expected
        assert values(read("aiokafka", kafka.bootstrap, partitions, committed=True)) == expected
        failures = _fenced_end(txn, [])
        assert failures, "the timed-out producer's commit succeeded"
        assert fenced(failures[-1]), repr(failures)
    finally:
        with contextlib.suppress(Exception):  # a fenced producer may refuse to close
            txn.close()


# 5. DescribeTransactions and ListTransactions


def test_transactions_are_listed_and_described_through_kafka_python_admin(
    kafka: KafkaServer, topic_name: str
) -> None:
    from kafka.admin._transactions import TransactionState
    from kafka.errors import TransactionalIdNotFoundError

    partitions = create(kafka, [topic_name])
    transactional_id = f"{topic_name}-txn"
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap, request_timeout_ms=10_000)
    txn = None

    def listed(**filters: Any) -> dict[str, tuple[int, TransactionState]]:
        return {
            t.transactional_id: (t.producer_id, t.state)
            for rows in admin.list_transactions(**filters).values()
            for t in rows
        }

    try:
        with pytest.raises(TransactionalIdNotFoundError):
            admin.describe_transactions([transactional_id])
        txn = producer(
            "confluent", kafka.bootstrap, transactional_id, **{"transaction.timeout.ms": 45_000}
        )
        empty = admin.describe_transactions([transactional_id])[transactional_id]
        assert (empty.state, empty.producer_epoch, empty.transaction_timeout_ms) == (
            TransactionState.EMPTY,
            0,
            45_000,
        )
        assert empty.transaction_start_time_ms == -1 and empty.topic_partitions == set()
        began = time.time() * 1000
        txn.begin()
        txn.send(_records(partitions[:2], "open", 1))
        txn.flush()
        ongoing = admin.describe_transactions([transactional_id])[transactional_id]
        assert ongoing.state == TransactionState.ONGOING
        assert ongoing.producer_id == empty.producer_id
        assert began - 1000 <= ongoing.transaction_start_time_ms <= time.time() * 1000
        assert {(tp.topic, tp.partition) for tp in ongoing.topic_partitions} == set(partitions[:2])
        assert listed()[transactional_id] == (empty.producer_id, TransactionState.ONGOING)
        assert transactional_id in listed(state_filters=["Ongoing"])
        assert transactional_id not in listed(state_filters=["CompleteCommit"])
        assert transactional_id in listed(producer_id_filters=[empty.producer_id])
        assert transactional_id not in listed(producer_id_filters=[empty.producer_id + 1_000])
        txn.commit()
        done = admin.describe_transactions([transactional_id])[transactional_id]
        assert (done.state, done.topic_partitions) == (TransactionState.COMPLETE_COMMIT, set())
        assert transactional_id in listed(state_filters=["CompleteCommit"])
    finally:
        admin.close()
        if txn is not None:
            txn.close()


# 3. Storage: markers and aborted ranges across kill -9 and segment rolls


def _segments(server: KafkaServer, topic: str, partition: int) -> int:
    return len(list((server.process.data_dir / "topics" / topic / str(partition)).glob("*.log")))


def test_markers_and_aborted_ranges_survive_kill_9_and_segment_rolls(
    tmp_path: Path, topic_name: str
) -> None:
    """Found: recovery took every marker for a corrupt batch (`inspect_batch` refuses control
    batches) and quarantined it, so after a kill -9 every transaction was open again and
    aborted as hanging, committed ones included; a sealed segment's markers were unreadable."""
    server = KafkaServer(tmp_path / "data", same_port=True).start()
    try:
        topics = [f"{topic_name}-{i}" for i in range(3)]
        partitions = create(server, topics, {"segment.bytes": "1024"})
        txn = producer("confluent", server.bootstrap, f"{topic_name}-txn")
        groups: list[tuple[bool, list[Record]]] = []
        try:
            for number in range(12):
                records = _records(partitions, f"t{number}")
                commit = number % 3 != 1
                txn.begin()
                txn.send(records)
                txn.flush()
                txn.commit() if commit else txn.abort()
                groups.append((commit, records))
        finally:
            txn.close()
        committed = _expect(partitions, *(r for commit, r in groups if commit))
        everything = _expect(partitions, *(r for _, r in groups))
        assert all(_segments(server, t, p) > 1 for t, p in partitions)
        server.kill()
        server.start()
        seal(server.bootstrap, partitions)
        for reader in ("confluent", "kafka-python"):
            assert values(read(reader, server.bootstrap, partitions, committed=True)) == committed
        assert (
            values(read("confluent", server.bootstrap, partitions, committed=False)) == everything
        )
        log = server.process.log_path.read_text()
        assert "wal.quarantined" not in log and "transactions.hanging_aborted" not in log
        # the same id goes on after the restart
        txn = producer("confluent", server.bootstrap, f"{topic_name}-txn")
        try:
            txn.begin()
            after = _records(partitions, "after")
            txn.send(after)
            txn.commit()
        finally:
            txn.close()
        assert values(read("confluent", server.bootstrap, partitions, committed=True)) == _expect(
            partitions, *(r for commit, r in groups if commit), after
        )
    finally:
        server.stop()


def test_segments_read_back_from_the_object_store_keep_their_transactions(
    tmp_path: Path, topic_name: str
) -> None:
    """Segments uploaded and deleted locally by retention (`retention.bytes`): read_committed
    readers of the object store's copies still drop the aborted transactions and read the
    committed ones, and so after a kill -9."""
    server = KafkaServer(tmp_path / "data", same_port=True).start()
    try:
        configs = {"segment.bytes": "1024", "retention.bytes": "1024"}
        partitions = create(server, [topic_name], configs)
        txn = producer("confluent", server.bootstrap, f"{topic_name}-txn")
        groups: list[tuple[bool, list[Record]]] = []
        try:
            for number in range(12):
                records = _records(partitions, f"t{number}")
                txn.begin()
                txn.send(records)
                txn.flush()
                commit = number % 3 != 1
                txn.commit() if commit else txn.abort()
                groups.append((commit, records))
        finally:
            txn.close()
        first = [
            server.process.data_dir / "topics" / t / str(p) / f"{0:020d}.log" for t, p in partitions
        ]
        deadline = time.monotonic() + 30
        while any(path.exists() for path in first) and time.monotonic() < deadline:
            time.sleep(0.1)  # housekeeping runs once a second: a bounded poll of its effect
        assert not any(path.exists() for path in first), "retention kept the first segments"
        committed = _expect(partitions, *(r for commit, r in groups if commit))
        everything = _expect(partitions, *(r for _, r in groups))
        for restarted in (False, True):
            if restarted:
                server.kill()
                server.start()
                seal(server.bootstrap, partitions)
            for reader in ("confluent", "aiokafka"):
                seen = read(reader, server.bootstrap, partitions, committed=True)
                assert values(seen) == committed
            seen = read("kafka-python", server.bootstrap, partitions, committed=False)
            assert values(seen) == everything
    finally:
        server.stop()


def test_an_aborted_transaction_stays_hidden_after_a_kill_9_with_the_next_one_open(
    tmp_path: Path, topic_name: str
) -> None:
    """Found (by the kill loop of tests/test_transactions_attack.py): on start the last
    segment's batches were followed again on top of the stored state, so the first
    transaction's abort marker closed the open second one: its aborted range was stored again
    from the second's first offset, which hides nothing, and after the next start the aborted
    records showed."""
    server = KafkaServer(tmp_path / "data", same_port=True).start()
    try:
        partitions = create(server, [topic_name])
        transactional_id = f"{topic_name}-txn"
        txn = producer("confluent", server.bootstrap, transactional_id)
        aborted, left_open = _records(partitions, "aborted"), _records(partitions, "open")
        try:
            txn.begin()
            txn.send(aborted)
            txn.flush()
            txn.abort()
            txn.begin()
            txn.send(left_open)
            txn.flush()
            server.kill()
        finally:
            with contextlib.suppress(Exception):
                txn.close()
        server.start()
        server.kill()  # what the first start stored is all the second has
        server.start()
        # a new instance aborts the transaction the kill left open
        producer("confluent", server.bootstrap, transactional_id).close()
        seal(server.bootstrap, partitions)
        for committed in (True, False):
            expected = (
                {tp: [] for tp in partitions}
                if committed
                else _expect(partitions, aborted, left_open)
            )
            assert values(read("confluent", server.bootstrap, partitions, committed)) == expected
    finally:
        server.stop()


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_an_end_cut_by_kill_9_is_completed_on_start(
    tmp_path: Path, topic_name: str, commit: bool
) -> None:
    """The server is killed -9 while it writes the markers of a transaction over 64
    partitions (its decision stored: PrepareCommit or PrepareAbort seen); on start the
    coordinator completes it: all of it readable, or none, and the last stable offset moves.
    Whether the kill lands before the last marker is a race (the markers are written 256 at a
    time, in parallel): a run whose end completed first still checks all or nothing, and runs
    go on, a bounded number, until one's end was cut (`transactions.resuming_end` for its id)."""
    from kafka.admin._transactions import TransactionState

    server = KafkaServer(tmp_path / "data", same_port=True).start()
    cut = False
    try:
        for attempt in range(6):
            partitions = create(
                server, [f"{topic_name}-{attempt}-{i}" for i in range(2)], partitions=32
            )
            transactional_id = f"{topic_name}-txn-{attempt}"
            txn = producer("confluent", server.bootstrap, transactional_id)
            admin = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=10_000)
            ended = _records(partitions, "ended", 1)
            try:
                txn.begin()
                txn.send(ended)
                txn.flush()
                raw = _end_unanswered(server, admin, transactional_id, commit)
                state = _state_after(admin, transactional_id, TransactionState.ONGOING)
                server.kill()
                raw.close()
                prepared = "PrepareCommit" if commit else "PrepareAbort"
                assert state == TransactionState(prepared), state
            finally:
                admin.close()
                with contextlib.suppress(Exception):
                    txn.close()
            server.start()
            resumed = [
                line
                for line in server.process.log_path.read_text().splitlines()
                if "transactions.resuming_end" in line and transactional_id in line
            ]
            seal(server.bootstrap, partitions)
            expected = _expect(partitions, ended if commit else [])
            got = read("confluent", server.bootstrap, partitions, committed=True)
            assert values(got) == expected
            # nothing left open: the stable end is the end (each partition's seal the last record)
            ends = read("confluent", server.bootstrap, partitions, committed=False)
            assert _last_stable(server, partitions) == {tp: r[-1][0] + 1 for tp, r in ends.items()}
            if resumed:
                cut = True
                break
        assert cut, "no kill in six landed before the end's last marker"
    finally:
        server.stop()


# 4. Exactly once under kill -9 (the long run is tests/test_transactions_attack.py)


def test_a_consume_transform_produce_loop_killed_and_its_server_killed_is_exactly_once(
    tmp_path: Path, topic_name: str
) -> None:
    server = KafkaServer(tmp_path / "data", same_port=True).start()
    try:
        run = exactly_once_run(
            server.bootstrap,
            tmp_path,
            topic_name,
            records=20_000,
            kinds=["app"] * 3 + ["server"] * 2,
            kill=restarts(server),
            rng=random.Random(38),
            deadline_s=240,
        )
    finally:
        server.stop()
    assert run.kills == Counter(app=3, server=2), run
