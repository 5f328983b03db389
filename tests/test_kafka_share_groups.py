"""Kafka share groups (KIP-932) on the Kafka listener of a real server (docs/KAFKA.md, Share
groups): confluent-kafka's ShareConsumer (librdkafka) against the Shared subscription of the
group's name. Explicit acknowledgement: four members of a two-partition topic each get records
of both partitions and 20,000 records are accepted once each; RELEASE redelivers (delivery count
2), REJECT dead-letters (read back natively from the dead-letter topic), a record never
acknowledged returns once its lock expires, a record released past the delivery limit is
dead-lettered. Implicit acknowledgement: the next poll accepts a poll's records; a member killed
with SIGKILL holding records has them delivered to the others once their lock expires. A native
Shared consumer and two Kafka members split a topic's records. `headwater subscription reset`
moves the group's start. Bad requests get Kafka's codes. On three brokers, two members ride
through kill -9 of a partition's owner and of the group's coordinator: every record accepted."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer

import headwater
from headwater.server.kafka import codec
from headwater.server.kafka import kafka_errors as k
from headwater.server.kafka.apis import SERVED
from headwater.server.kafka.messages import groups as g
from headwater.server.kafka.messages import groups as gr
from headwater.server.kafka.messages import share as sh
from headwater.server.kafka.messages.declare import Message
from headwater.server.kafka.topic_ids import topic_id
from headwater.wire.names import dead_letter_topic
from tests.support.cli_process import hw
from tests.support.cluster_support import running_cluster
from tests.support.kafka_support import KafkaServer, RawKafka
from tests.support.s3 import MotoS3, create_bucket

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    server = KafkaServer(tmp_path_factory.mktemp("kafka-share") / "data").start()
    yield server
    server.stop()


def _native(server: KafkaServer, work: Callable[[headwater.Client], Any]) -> Any:
    async def run() -> Any:
        async with await headwater.connect(server.address) as client:
            return await work(client)

    return asyncio.run(run())


def _share_group(
    server: KafkaServer,
    topic: str,
    group: str,
    partitions: int = 2,
    ack_timeout: float = 30.0,
    max_deliveries: int = 5,
) -> None:
    """A reliable topic and the Shared subscription `group` on it (the share group), made
    natively with the settings a test needs: its record lock, delivery limit and a short fixed
    backoff."""

    async def make(client: headwater.Client) -> None:
        await client.create_topic(topic, partitions=partitions, dispatch="reliable")
        consumer = await client.subscribe(
            topic,
            group,
            type="shared",
            start="earliest",
            ack_timeout=ack_timeout,
            max_deliveries=max_deliveries,
            backoff="fixed",
            backoff_initial=0.1,
            prefetch=1,
        )
        await consumer.close()

    _native(server, make)


def _produce(server: KafkaServer, topic: str, count: int, partitions: int = 2) -> None:
    # batches of at most 500 records: a fetch takes whole batches, so members share a
    # partition's records batch by batch
    producer = Producer(
        {"bootstrap.servers": server.bootstrap, "linger.ms": 5, "batch.num.messages": 500}
    )
    for i in range(count):
        producer.produce(topic, value=b"v%d" % i, partition=i % partitions)
        if i % 1000 == 999:
            producer.poll(0)
    assert producer.flush(30) == 0


def _member(server: KafkaServer, group: str, topic: str, explicit: bool = True) -> ShareConsumer:
    consumer = ShareConsumer(
        {
            "bootstrap.servers": server.bootstrap,
            "group.id": group,
            "share.acknowledgement.mode": "explicit" if explicit else "implicit",
        }
    )
    consumer.subscribe([topic])
    return consumer


def _info(server: KafkaServer, topic: str, group: str) -> Any:
    async def find(client: headwater.Client) -> Any:
        (found,) = [s for s in await client.list_subscriptions(topic) if s.name == group]
        return found

    return _native(server, find)


def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _poll(consumer: ShareConsumer, timeout: float = 1.0) -> list[Any]:
    messages = [m for m in consumer.poll(timeout)]
    for message in messages:
        assert message.error() is None, message.error()
    return messages


def _read_dlq(server: KafkaServer, topic: str, group: str, count: int) -> list[Any]:
    """The dead letters of `group` on `topic`, read natively."""

    async def read(client: headwater.Client) -> list[Any]:
        consumer = await client.subscribe(
            dead_letter_topic(topic, group), "inspect", start="earliest"
        )
        try:
            return [await consumer.receive(timeout=30) for _ in range(count)]
        finally:
            await consumer.close()

    return list(_native(server, read))


def test_four_explicit_members_share_both_partitions_and_accept_each_record_once(
    kafka: KafkaServer, topic_name: str
) -> None:
    total = 20_000
    _share_group(kafka, topic_name, "workers")
    accepted: list[Counter[tuple[int, int]]] = [Counter() for _ in range(4)]
    partitions: list[set[int]] = [set() for _ in range(4)]
    done = threading.Event()
    failures: list[BaseException] = []

    def work(index: int) -> None:
        try:
            consumer = _member(kafka, "workers", topic_name)
            try:
                deadline = time.monotonic() + 120
                while not done.is_set() and time.monotonic() < deadline:
                    for message in _poll(consumer, 0.5):
                        consumer.acknowledge(message, AcknowledgeType.ACCEPT)
                        accepted[index][message.partition(), message.offset()] += 1
                        partitions[index].add(message.partition())
                    consumer.commit_sync(30)
            finally:
                consumer.close()
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        # every member has fetched (its consumer is attached) before the records exist
        _until(lambda: _info(kafka, topic_name, "workers").consumers == 4, 60, "four members")
        _produce(kafka, topic_name, total)
        _until(
            lambda: sum(len(c) for c in accepted) >= total or bool(failures), 120, "every record"
        )
        _until(lambda: _info(kafka, topic_name, "workers").backlog == 0, 60, "all acknowledged")
    finally:
        done.set()
        for thread in threads:
            thread.join(60)
    assert not failures, failures
    overall: Counter[tuple[int, int]] = Counter()
    for counts in accepted:
        overall.update(counts)
    assert len(overall) == total
    assert max(overall.values()) == 1  # accepted exactly once overall
    assert all(p == {0, 1} for p in partitions), partitions  # each member: both partitions
    info = _info(kafka, topic_name, "workers")
    assert (info.unacked, info.dead_lettered) == (0, 0)


def test_release_redelivers_with_delivery_count_2_and_reject_dead_letters(
    kafka: KafkaServer, topic_name: str
) -> None:
    _share_group(kafka, topic_name, "g", partitions=1)
    _produce(kafka, topic_name, 2, partitions=1)
    consumer = _member(kafka, "g", topic_name)
    try:
        first: list[Any] = []
        _until(lambda: bool(first.extend(_poll(consumer))) or len(first) >= 2, 30, "2 records")
        assert [(m.offset(), m.delivery_count()) for m in first] == [(0, 1), (1, 1)]
        consumer.acknowledge(first[0], AcknowledgeType.RELEASE)
        consumer.acknowledge(first[1], AcknowledgeType.REJECT)
        again: list[Any] = []
        _until(lambda: bool(again.extend(_poll(consumer))) or bool(again), 30, "the release")
        assert [(m.offset(), m.delivery_count()) for m in again] == [(0, 2)]
        consumer.acknowledge(again[0], AcknowledgeType.ACCEPT)
        consumer.commit_sync(30)
    finally:
        consumer.close()
    (dead,) = _read_dlq(kafka, topic_name, "g", 1)
    assert dead.value == b"v1"
    assert dict(dead.headers)["headwater.dlq.offset"] == b"1"
    info = _info(kafka, topic_name, "g")
    assert (info.backlog, info.unacked, info.dead_lettered) == (0, 0, 1)
    metrics = kafka.metrics()
    for kind in ("accept", "release", "reject"):
        assert f'headwater_kafka_share_acknowledged_total{{type="{kind}"}}' in metrics


def test_a_record_never_acknowledged_returns_after_the_lock(
    kafka: KafkaServer, topic_name: str
) -> None:
    _share_group(kafka, topic_name, "g", partitions=1, ack_timeout=2.0)
    _produce(kafka, topic_name, 1, partitions=1)
    holder = _member(kafka, "g", topic_name)
    other = _member(kafka, "g", topic_name)
    try:
        held: list[Any] = []
        _until(lambda: bool(held.extend(_poll(holder))) or bool(held), 30, "the record")
        acquired = time.monotonic()
        assert [(m.offset(), m.delivery_count()) for m in held] == [(0, 1)]
        # the holder never acknowledges it (and never polls again): the other gets it once the
        # lock (the subscription's ack timeout) expires
        later: list[Any] = []
        _until(lambda: bool(later.extend(_poll(other))) or bool(later), 30, "the redelivery")
        assert time.monotonic() - acquired >= 1.5
        assert [(m.offset(), m.delivery_count()) for m in later] == [(0, 2)]
        other.acknowledge(later[0], AcknowledgeType.ACCEPT)
        other.commit_sync(30)
    finally:
        other.close()
        holder.close()


def test_released_past_the_delivery_limit_is_dead_lettered(
    kafka: KafkaServer, topic_name: str
) -> None:
    _share_group(kafka, topic_name, "g", partitions=1, max_deliveries=2)
    _produce(kafka, topic_name, 1, partitions=1)
    consumer = _member(kafka, "g", topic_name)
    counts = []
    try:
        for _ in range(2):
            got: list[Any] = []
            _until(lambda got=got: bool(got.extend(_poll(consumer))) or bool(got), 30, "record")
            counts.append(got[0].delivery_count())
            consumer.acknowledge(got[0], AcknowledgeType.RELEASE)
        consumer.commit_sync(30)
        # dead-lettered when the subscription next delivers: while a member fetches
        _until(
            lambda: _poll(consumer, 0.3) == [] and _info(kafka, topic_name, "g").dead_lettered,
            30,
            "the dead letter",
        )
    finally:
        consumer.close()
    assert counts == [1, 2]
    (dead,) = _read_dlq(kafka, topic_name, "g", 1)
    assert dict(dead.headers)["headwater.dlq.deliveries"] == b"2"


def test_implicit_acknowledgement_accepts_a_poll_at_the_next(
    kafka: KafkaServer, topic_name: str
) -> None:
    _share_group(kafka, topic_name, "g", partitions=1)
    _produce(kafka, topic_name, 50, partitions=1)
    consumer = _member(kafka, "g", topic_name, explicit=False)
    try:
        got: list[Any] = []
        _until(lambda: bool(got.extend(_poll(consumer))) or len(got) >= 50, 30, "50 records")
        info = _info(kafka, topic_name, "g")
        assert info.unacked == len(got) or info.backlog > 0  # held, not yet accepted
        _poll(consumer, 0.5)  # accepts the previous poll's records
        _until(lambda: _info(kafka, topic_name, "g").backlog == 0, 30, "all accepted")
    finally:
        consumer.close()


_KILLED_MEMBER = """
import sys, time
from confluent_kafka import ShareConsumer
c = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                   "share.acknowledgement.mode": "explicit"})
c.subscribe([sys.argv[3]])
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    got = [m for m in c.poll(0.5) if m.error() is None]
    if got:
        print(" ".join(str(m.offset()) for m in got), flush=True)
        time.sleep(600)  # mid-batch: killed here, never acknowledging
"""


def test_a_member_killed_mid_batch_has_its_records_delivered_again(
    kafka: KafkaServer, topic_name: str
) -> None:
    total = 200
    _share_group(kafka, topic_name, "g", partitions=1, ack_timeout=3.0)
    _produce(kafka, topic_name, total, partitions=1)
    victim = subprocess.Popen(
        [sys.executable, "-c", _KILLED_MEMBER, kafka.bootstrap, "g", topic_name],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert victim.stdout is not None
        held = {int(o) for o in victim.stdout.readline().split()}
        assert held
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
    finally:
        if victim.poll() is None:
            victim.kill()
    survivor = _member(kafka, "g", topic_name, explicit=False)
    seen: Counter[int] = Counter()
    counts: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 60
        while len(seen) < total and time.monotonic() < deadline:
            for message in _poll(survivor, 0.5):
                seen[message.offset()] += 1
                counts[message.offset()] = message.delivery_count()
        _poll(survivor, 0.5)  # accepts the last poll's records
        _until(lambda: _info(kafka, topic_name, "g").backlog == 0, 30, "all accepted")
    finally:
        survivor.close()
    assert set(seen) == set(range(total))  # every record, the killed member's too
    assert max(seen.values()) == 1  # none twice to the survivor, which accepted each
    assert {counts[o] for o in held} == {2}  # the victim's, delivered again


def test_a_native_shared_consumer_and_two_kafka_members_split_a_topic(
    kafka: KafkaServer, topic_name: str
) -> None:
    total = 3_000
    _share_group(kafka, topic_name, "mixed")
    received: dict[str, Counter[tuple[int, int]]] = {n: Counter() for n in ("native", "k0", "k1")}
    done = threading.Event()
    failures: list[BaseException] = []

    def kafka_member(name: str) -> None:
        try:
            consumer = _member(kafka, "mixed", topic_name)
            try:
                while not done.is_set():
                    for message in _poll(consumer, 0.3):
                        received[name][message.partition(), message.offset()] += 1
                        consumer.acknowledge(message, AcknowledgeType.ACCEPT)
                    consumer.commit_sync(30)
            finally:
                consumer.close()
        except BaseException as exc:
            failures.append(exc)

    async def native_member() -> None:
        async with await headwater.connect(kafka.address) as client:
            consumer = await client.subscribe(topic_name, "mixed", type="shared", prefetch=100)
            try:
                while not done.is_set():
                    try:
                        message = await consumer.receive(timeout=0.3)
                    except TimeoutError:
                        continue
                    received["native"][message.partition, message.offset] += 1
                    await consumer.ack(message)
            finally:
                await consumer.close()

    threads = [threading.Thread(target=kafka_member, args=(n,)) for n in ("k0", "k1")]
    threads.append(threading.Thread(target=lambda: asyncio.run(native_member())))
    for thread in threads:
        thread.start()
    try:
        _until(lambda: _info(kafka, topic_name, "mixed").consumers == 3, 60, "three consumers")
        _produce(kafka, topic_name, total)
        _until(
            lambda: sum(len(c) for c in received.values()) >= total or bool(failures),
            120,
            "every record",
        )
        _until(lambda: _info(kafka, topic_name, "mixed").backlog == 0, 60, "all acknowledged")
    finally:
        done.set()
        for thread in threads:
            thread.join(60)
    assert not failures, failures
    overall: Counter[tuple[int, int]] = Counter()
    for counts in received.values():
        overall.update(counts)
    # each record went to one consumer, once: none was delivered to two (a record is sent again
    # only after its lock expires or it is released, and every one was acknowledged at once)
    assert len(overall) == total and max(overall.values()) == 1
    assert all(received.values()), {n: len(c) for n, c in received.items()}


# Bad requests, through raw frames (flexible versions: header v2, response header v1)


def _call(raw: RawKafka, request: Message, correlation: int = 1) -> Any:
    api = SERVED[request.API_KEY]
    version = api.max_version
    body = codec.encode(api.requests[version], request)
    header = struct.pack(">hhih", request.API_KEY, version, correlation, 3) + b"raw" + b"\x00"
    raw.send_raw(struct.pack(">i", len(header) + len(body)) + header + body)
    got, rest = raw.response()
    assert got == correlation
    return codec.decode_body(codec.Reader(rest, 1), api.responses[version])  # after tags


def test_bad_share_requests_get_kafkas_codes(kafka: KafkaServer, topic_name: str) -> None:
    _share_group(kafka, topic_name, "bad", partitions=1)
    _produce(kafka, topic_name, 3, partitions=1)
    raw = RawKafka(kafka.kafka_port)
    try:
        beat = _call(raw, sh.ShareGroupHeartbeatRequest("bad", "stranger", 3, None, None))
        assert beat.error_code == k.UNKNOWN_MEMBER_ID
        joined = _call(raw, sh.ShareGroupHeartbeatRequest("bad", "m1", 0, None, [topic_name]))
        assert joined.error_code == 0 and joined.member_epoch >= 1
        (assigned,) = joined.assignment.topic_partitions
        assert (assigned.topic_id, list(assigned.partitions)) == (topic_id(topic_name), [0])
        wrong = joined.member_epoch + 5
        fenced = _call(raw, sh.ShareGroupHeartbeatRequest("bad", "m1", wrong, None, None))
        assert fenced.error_code == k.FENCED_MEMBER_EPOCH
        described = _call(raw, sh.ShareGroupDescribeRequest(["bad", "nobody"]))
        found, missing = described.groups
        assert (found.group_state, [m.member_id for m in found.members]) == ("Stable", ["m1"])
        assert missing.error_code == k.GROUP_ID_NOT_FOUND
        # ListGroups v5 lists it as a share group (and only when share groups are asked for)
        shares = _call(raw, g.ListGroupsRequest(types_filter=["share"])).groups
        assert [
            (x.protocol_type, x.group_state, x.group_type) for x in shares if x.group_id == "bad"
        ] == [("share", "Stable", "share")]
        consumers = _call(raw, g.ListGroupsRequest(types_filter=["consumer", "classic"])).groups
        assert "bad" not in {x.group_id for x in consumers}

        partition = [sh.FetchPartition(partition_index=0)]
        topics = [sh.FetchTopic(topic_id=topic_id(topic_name), partitions=partition)]

        def fetch(
            epoch: int, acks: list[sh.AcknowledgementBatch] | None = None, records: int = 1
        ) -> Any:
            asked = topics
            if acks is not None:
                parts = [sh.FetchPartition(partition_index=0, acknowledgement_batches=acks)]
                asked = [sh.FetchTopic(topic_id=topic_id(topic_name), partitions=parts)]
            request = sh.ShareFetchRequest(
                group_id="bad",
                member_id="m1",
                share_session_epoch=epoch,
                max_wait_ms=2000,
                min_bytes=1,
                max_records=records,
                topics=asked,
            )
            return _call(raw, request)

        assert fetch(4).error_code == k.SHARE_SESSION_NOT_FOUND
        accept = [sh.AcknowledgementBatch(first_offset=0, last_offset=0, acknowledge_types=[1])]
        assert fetch(0, accept).error_code == k.INVALID_REQUEST  # acks in a session's start
        opened = fetch(0)
        assert opened.error_code == 0
        (records,) = opened.responses[0].partitions
        ((first, last, count),) = [
            (a.first_offset, a.last_offset, a.delivery_count) for a in records.acquired_records
        ]
        assert first == 0 and count == 1
        # offsets it does not hold (past what it acquired): refused, none of the range applied
        not_held = [
            sh.AcknowledgementBatch(first_offset=0, last_offset=last + 1, acknowledge_types=[1])
        ]
        refused = fetch(1, not_held, records=0)  # acknowledges, fetches nothing
        assert refused.error_code == 0
        (part,) = refused.responses[0].partitions
        assert part.acknowledge_error_code == k.INVALID_RECORD_STATE
        assert _info(kafka, topic_name, "bad").unacked == last - first + 1  # still held
        assert fetch(9).error_code == k.INVALID_SHARE_SESSION_EPOCH
        ack = sh.ShareAcknowledgeRequest(group_id="bad", member_id="m1", share_session_epoch=0)
        assert _call(raw, ack).error_code == k.INVALID_SHARE_SESSION_EPOCH
        unknown = [sh.FetchTopic(topic_id=bytes(range(16)), partitions=partition)]
        request = sh.ShareFetchRequest(
            group_id="bad", member_id="m1", share_session_epoch=0, topics=unknown
        )
        (gone,) = _call(raw, request).responses[0].partitions
        assert gone.error_code == k.UNKNOWN_TOPIC_ID
    finally:
        raw.close()


def _raw_fetch(
    raw: RawKafka,
    topic: str,
    group: str,
    member: str,
    epoch: int,
    max_records: int,
    acks: list[sh.AcknowledgementBatch] | None = None,
) -> Any:
    parts = [sh.FetchPartition(partition_index=0, acknowledgement_batches=acks or [])]
    request = sh.ShareFetchRequest(
        group_id=group,
        member_id=member,
        share_session_epoch=epoch,
        max_wait_ms=5000,
        min_bytes=1,
        max_records=max_records,
        topics=[sh.FetchTopic(topic_id=topic_id(topic), partitions=parts)],
    )
    return _call(raw, request)


def _batches_of(records: bytes) -> list[tuple[int, int]]:
    """(base offset, record count) of each RecordBatch in a fetch's records."""
    found = []
    at = 0
    while at < len(records):
        base, length = struct.unpack_from(">qi", records, at)
        found.append((base, struct.unpack_from(">i", records, at + 57)[0]))
        at += 12 + length
    return found


def test_final_acknowledgements_after_the_leave_heartbeat_are_applied(
    kafka: KafkaServer, topic_name: str
) -> None:
    """librdkafka's close sends the leave heartbeat (epoch -1) and the final ShareAcknowledge
    (epoch -1, the last poll's acknowledgements) together: the leave may come first. The
    session outlives the leave for those: the records are accepted, never delivered again. A
    member that leaves and sends no final request has what it held delivered again after the
    grace (`LEAVE_GRACE`), and its session acquires nothing meanwhile."""
    _share_group(kafka, topic_name, "closing", partitions=1)
    _produce(kafka, topic_name, 20, partitions=1)
    raw = RawKafka(kafka.kafka_port)
    try:
        joined = _call(raw, sh.ShareGroupHeartbeatRequest("closing", "m1", 0, None, [topic_name]))
        assert joined.error_code == 0
        (part,) = _raw_fetch(raw, topic_name, "closing", "m1", 0, 100).responses[0].partitions
        ((first, last),) = [(a.first_offset, a.last_offset) for a in part.acquired_records]
        left = _call(raw, sh.ShareGroupHeartbeatRequest("closing", "m1", -1, None, None))
        assert left.error_code == 0 and left.member_epoch == -1
        accept = [
            sh.AcknowledgementBatch(first_offset=first, last_offset=last, acknowledge_types=[1])
        ]
        topics = [
            sh.AcknowledgeTopic(
                topic_id=topic_id(topic_name),
                partitions=[
                    sh.AcknowledgePartition(partition_index=0, acknowledgement_batches=accept)
                ],
            )
        ]
        final = _call(
            raw,
            sh.ShareAcknowledgeRequest(
                group_id="closing", member_id="m1", share_session_epoch=-1, topics=topics
            ),
        )
        assert final.error_code == 0, final.error_message
        (acked,) = final.responses[0].partitions
        assert acked.error_code == 0, acked.error_message
        info = _info(kafka, topic_name, "closing")
        assert (info.unacked, info.redelivering) == (0, 0)
        assert info.backlog == 20 - (last - first + 1)

        # m2 leaves holding records and sends no final request: its session acquires nothing
        # more, and what it held is delivered again once the grace is over
        _produce(kafka, topic_name, 5, partitions=1)
        _call(raw, sh.ShareGroupHeartbeatRequest("closing", "m2", 0, None, [topic_name]))
        (held,) = _raw_fetch(raw, topic_name, "closing", "m2", 0, 100).responses[0].partitions
        assert held.acquired_records
        _produce(kafka, topic_name, 5, partitions=1)
        _call(raw, sh.ShareGroupHeartbeatRequest("closing", "m2", -1, None, None))
        after = _raw_fetch(raw, topic_name, "closing", "m2", 1, 100)
        assert not [p for t in after.responses for p in t.partitions if p.acquired_records]
        _until(lambda: _info(kafka, topic_name, "closing").unacked == 0, 30, "m2's records back")
    finally:
        raw.close()


def _share_sessions(server: KafkaServer) -> float:
    (line,) = [
        x for x in server.metrics().splitlines() if x.startswith("headwater_kafka_share_sessions ")
    ]
    return float(line.split()[1])


def _acquired(answer: Any) -> list[tuple[int, int]]:
    """(first offset, delivery count) of each range a ShareFetch answer acquired."""
    return [
        (a.first_offset, a.delivery_count)
        for t in answer.responses
        for p in t.partitions
        for a in p.acquired_records
    ]


def test_a_share_session_is_closed_with_its_connection(kafka: KafkaServer, topic_name: str) -> None:
    """A member's connection that drops closes its share session, as Kafka's share session
    cache does: what it acquired goes to the others at once (it stayed held for the 30 s lock),
    and the session's slot and consumer go."""
    _share_group(kafka, topic_name, "drop", partitions=1)
    _produce(kafka, topic_name, 3, partitions=1)
    raw = RawKafka(kafka.kafka_port)
    assert _acquired(_raw_fetch(raw, topic_name, "drop", "m0", 0, 100)) == [(0, 1)]
    raw.close()
    raw = RawKafka(kafka.kafka_port)
    try:
        assert _acquired(_raw_fetch(raw, topic_name, "drop", "m1", 0, 100)) == [(0, 2)]
    finally:
        raw.close()
    _until(lambda: _info(kafka, topic_name, "drop").consumers == 0, 30, "both sessions closed")
    assert _info(kafka, topic_name, "drop").unacked == 0


def test_ten_thousand_dropped_share_sessions_leave_nothing_behind(
    kafka: KafkaServer, topic_name: str
) -> None:
    """10,000 connect/ShareFetch/drop cycles, half dropped before the answer is read: no share
    session or consumer is left (each stayed, a session and a consumer of the subscription), and
    the broker still serves the group."""
    _share_group(kafka, topic_name, "drops", partitions=1)
    _produce(kafka, topic_name, 3, partitions=1)
    parts = [sh.FetchPartition(partition_index=0)]
    topics = [sh.FetchTopic(topic_id=topic_id(topic_name), partitions=parts)]
    for i in range(10_000):
        raw = RawKafka(kafka.kafka_port)
        request = sh.ShareFetchRequest(
            group_id="drops",
            member_id=f"c{i}",
            share_session_epoch=0,
            max_wait_ms=0,
            max_records=100,
            topics=topics,
        )
        if i % 2:
            assert _call(raw, request).error_code == 0
        else:  # dropped before the answer is read
            api = SERVED[request.API_KEY]
            body = codec.encode(api.requests[api.max_version], request)
            header = struct.pack(">hhih", request.API_KEY, api.max_version, 1, 3) + b"raw\x00"
            raw.send_raw(struct.pack(">i", len(header) + len(body)) + header + body)
        raw.close()
    _until(lambda: _share_sessions(kafka) == 0, 30, "every session closed")
    info = _info(kafka, topic_name, "drops")
    assert (info.consumers, info.unacked) == (0, 0)
    raw = RawKafka(kafka.kafka_port)  # and it still serves the group: its records, never acquired
    try:
        assert _acquired(_raw_fetch(raw, topic_name, "drops", "m2", 0, 100)) == [(0, 1)]
    finally:
        raw.close()


def test_a_fetch_takes_whole_batches_past_max_records(kafka: KafkaServer, topic_name: str) -> None:
    """ShareFetch's MaxRecords "can be exceeded for alignment of batch boundaries": the stored
    batch the credit reaches into is acquired whole (sent as stored, not cut), and nothing more;
    the AcquiredRecords range is the batch's, and acknowledging it all accepts it all."""
    _share_group(kafka, topic_name, "whole", partitions=1)

    async def produce(client: headwater.Client) -> None:
        producer = client.producer(topic_name, batch_size=1 << 20)
        for size in (300, 200):  # two produce batches, of 300 and 200 records
            await (await producer.send_batch([b"w%d" % i for i in range(size)], partition=0))
        await producer.close()

    _native(kafka, produce)
    raw = RawKafka(kafka.kafka_port)
    try:
        _call(raw, sh.ShareGroupHeartbeatRequest("whole", "m1", 0, None, [topic_name]))
        (got,) = _raw_fetch(raw, topic_name, "whole", "m1", 0, 10).responses[0].partitions
        acquired = [(a.first_offset, a.last_offset, a.delivery_count) for a in got.acquired_records]
        assert acquired == [(0, 299, 1)]
        assert _batches_of(got.records) == [(0, 300)]
        assert _info(kafka, topic_name, "whole").unacked == 300
        accept = [sh.AcknowledgementBatch(first_offset=0, last_offset=299, acknowledge_types=[1])]
        (nxt,) = _raw_fetch(raw, topic_name, "whole", "m1", 1, 10, accept).responses[0].partitions
        assert nxt.acknowledge_error_code == 0
        assert [(a.first_offset, a.last_offset) for a in nxt.acquired_records] == [(300, 499)]
        assert _batches_of(nxt.records) == [(300, 200)]
        info = _info(kafka, topic_name, "whole")
        assert (info.unacked, info.backlog) == (200, 0)
    finally:
        raw.close()


def test_members_closing_in_turn_never_have_their_accepted_records_redelivered(
    kafka: KafkaServer, topic_name: str
) -> None:
    """Members in turn each accept two polls' records and close (the last poll's
    acknowledgements go in the close's final request, which may reach the server after the
    leave heartbeat): no record a closed member accepted is delivered to a later one. Before
    the session outlived the leave, about a quarter of the closes had their last poll's records
    delivered again."""
    closes, total = 24, 24 * 1_200
    _share_group(kafka, topic_name, "turns", partitions=1)
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap, "linger.ms": 5, "batch.num.messages": 200}
    )
    for i in range(total):
        producer.produce(topic_name, value=b"t%d" % i, partition=0)
        if i % 1000 == 999:
            producer.poll(0)
    assert producer.flush(30) == 0
    accepted: set[int] = set()
    again: list[tuple[int, int]] = []  # (member, offset) delivered after its acceptance
    for index in range(closes):
        consumer = _member(kafka, "turns", topic_name)
        try:
            polls = 0
            deadline = time.monotonic() + 60
            while polls < 2 and len(accepted) < total and time.monotonic() < deadline:
                messages = _poll(consumer, 0.5)
                polls += bool(messages)
                for message in messages:
                    if message.offset() in accepted:
                        again.append((index, message.offset()))
                    consumer.acknowledge(message, AcknowledgeType.ACCEPT)
                    accepted.add(message.offset())
        finally:
            consumer.close()
        if len(accepted) == total:
            break
    assert not again, f"{len(again)} accepted records delivered again: {again[:5]}"
    assert index >= closes // 2, f"only {index + 1} members took the {total} records"
    info = _info(kafka, topic_name, "turns")
    assert info.unacked == 0 and info.redelivering == 0


def test_subscription_reset_moves_a_share_groups_start(kafka: KafkaServer, topic_name: str) -> None:
    """`headwater subscription reset` moves the share group's start: it is the subscription."""
    _share_group(kafka, topic_name, "moved")
    _produce(kafka, topic_name, 10)
    reset = ("subscription", "reset", topic_name, "moved", "--to")
    moved = hw(*reset, "latest", "--format", "json", server=kafka.process)
    assert moved.returncode == 0, moved.stderr
    assert [p["committed"] for p in json.loads(moved.stdout)["partitions"]] == [5, 5]
    _produce(kafka, topic_name, 4)  # offsets 5 and 6 of each partition
    consumer = _member(kafka, "moved", topic_name)
    try:
        got: list[tuple[int, int]] = []
        deadline = time.monotonic() + 60
        while len(got) < 4 and time.monotonic() < deadline:
            for message in _poll(consumer):
                consumer.acknowledge(message, AcknowledgeType.ACCEPT)
                got.append((message.partition(), message.offset()))
        assert sorted(got) == [(0, 5), (0, 6), (1, 5), (1, 6)]  # nothing before the reset
        assert hw(*reset, "earliest", server=kafka.process).returncode == 0
        again: set[tuple[int, int]] = set()
        deadline = time.monotonic() + 60
        while len(again) < 14 and time.monotonic() < deadline:
            for message in _poll(consumer):
                consumer.acknowledge(message, AcknowledgeType.ACCEPT)
                again.add((message.partition(), message.offset()))
        assert again == {(p, o) for p in (0, 1) for o in range(7)}  # all of it, again
    finally:
        consumer.close()


# A cluster: three brokers on etcd and moto's S3 (tests.support.cluster_support)


def test_share_consumers_ride_through_kill_9_of_a_partition_owner_in_a_cluster(
    tmp_path: Path, s3: MotoS3, topic_name: str
) -> None:
    _ride_through_a_kill(tmp_path, s3, topic_name, lambda owners, bootstrap: owners[0])


def test_share_consumers_ride_through_kill_9_of_the_share_coordinator_in_a_cluster(
    tmp_path: Path, s3: MotoS3, topic_name: str
) -> None:
    """The members' heartbeats go to the coordinator another broker is then (FindCoordinator);
    records in flight at the dead broker come back after their lock, none is skipped."""
    _ride_through_a_kill(tmp_path, s3, topic_name, lambda owners, ports: _coordinator(ports, "g"))


def _coordinator(ports: dict[str, int], group: str) -> str:
    """The broker FindCoordinator names for `group` (asked of any broker)."""
    raw = RawKafka(next(iter(ports.values())))
    try:
        api = SERVED[gr.FindCoordinatorRequest.API_KEY]
        raw.request(
            api.key, 1, 1, codec.encode(api.requests[1], gr.FindCoordinatorRequest(key=group))
        )
        _, rest = raw.response()
        found = codec.decode_body(codec.Reader(rest), api.responses[1])
    finally:
        raw.close()
    assert found.error_code == 0, found
    (broker,) = [b for b, port in ports.items() if port == found.port]
    return broker


def _ride_through_a_kill(
    tmp_path: Path,
    s3: MotoS3,
    topic_name: str,
    victim: Callable[[dict[int, str], dict[str, int]], str],
) -> None:
    """Two explicit share consumers of a two-partition topic across three brokers; `victim`
    (of the partitions' owners and the brokers' Kafka ports) is killed with SIGKILL once a
    quarter of the records are accepted: every record is accepted in the end."""
    brokers = ("b1", "b2", "b3")
    total = 3_000
    asyncio.run(create_bucket(s3, "hw-kafka-share"))
    with running_cluster(tmp_path, s3, "hw-kafka-share", 2000, kafka=True) as cluster:
        threads = [threading.Thread(target=cluster.start_broker, args=(b,)) for b in brokers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        bootstrap = ",".join(f"127.0.0.1:{cluster.kafka_ports[b]}" for b in brokers)

        async def make() -> dict[int, str]:
            async with await headwater.connect(await cluster.address("b1")) as client:
                await client.create_topic(topic_name, partitions=2, dispatch="reliable")
                owners = await cluster.wait_owned(topic_name, 2, set(brokers), timeout=60)
                consumer = await client.subscribe(
                    topic_name, "g", type="shared", start="earliest", ack_timeout=3.0, prefetch=1
                )
                await consumer.close()
                return owners

        owners = asyncio.run(make())
        accepted: Counter[tuple[int, int]] = Counter()
        done = threading.Event()
        failures: list[BaseException] = []

        def work() -> None:
            try:
                consumer = ShareConsumer(
                    {
                        "bootstrap.servers": bootstrap,
                        "group.id": "g",
                        "share.acknowledgement.mode": "explicit",
                    }
                )
                consumer.subscribe([topic_name])
                try:
                    while not done.is_set():
                        for message in consumer.poll(0.5):
                            if message.error() is not None:
                                continue
                            consumer.acknowledge(message, AcknowledgeType.ACCEPT)
                            accepted[message.partition(), message.offset()] += 1
                finally:
                    consumer.close()
            except BaseException as exc:
                failures.append(exc)

        members = [threading.Thread(target=work) for _ in range(2)]
        for member in members:
            member.start()
        try:
            producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
            for i in range(total // 2):
                producer.produce(topic_name, value=b"v%d" % i, partition=i % 2)
            assert producer.flush(60) == 0
            _until(lambda: len(accepted) >= total // 4, 90, "a quarter accepted")
            killed = victim(owners, dict(cluster.kafka_ports))
            cluster.brokers[killed].kill()  # mid-stream
            survivors = set(brokers) - {killed}
            asyncio.run(cluster.wait_owned(topic_name, 2, survivors, timeout=60))
            for i in range(total // 2, total):
                producer.produce(topic_name, value=b"v%d" % i, partition=i % 2)
            assert producer.flush(60) == 0
            _until(lambda: len(accepted) >= total or bool(failures), 120, "every record")
        finally:
            done.set()
            for member in members:
                member.join(60)
        assert not failures, failures
        missing = [(p, o) for p in (0, 1) for o in range(total // 2) if (p, o) not in accepted]
        assert not missing, f"{len(missing)} never accepted, from {missing[:5]}"  # none skipped
