"""Kafka 4's consumer group protocol (KIP-848) on a real server with stock clients: confluent-kafka
consumers with `group.protocol=consumer` on 12 partitions, 3 then 4 then 2 members: after each
change every partition has exactly one owner, only the partitions that had to move moved, and
the others were consumed all through the hand-over (each partition's longest gap between
records, compared within the run); the group's committed offsets are the cursor of the
subscription of its name; a member killed with SIGKILL is fenced after the session timeout and
its partitions move; bad heartbeats get Kafka's error codes, and a group is of one protocol at a
time (docs/KAFKA.md)."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import statistics
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupType,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

import headwater
from headwater.server.kafka import codec
from headwater.server.kafka import kafka_errors as k
from headwater.server.kafka.apis import CONSUMER_GROUP_HEARTBEAT, SERVED, TXN_OFFSET_COMMIT
from headwater.server.kafka.messages import consumer_protocol as cp
from headwater.server.kafka.messages import transactions as tx
from headwater.server.kafka.topic_ids import topic_id
from tests.support.kafka_support import KafkaServer, RawKafka

PARTITIONS = 12
CONFIG = "[kafka]\nconsumer_session_timeout_ms = 6000\nconsumer_heartbeat_interval_ms = 500\n"


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    server = KafkaServer(tmp_path_factory.mktemp("kip848") / "data", config=CONFIG).start()
    yield server
    server.stop()


async def _create(server: KafkaServer, topic: str, partitions: int = PARTITIONS) -> None:
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic, partitions=partitions, dispatch="reliable")


def _config(server: KafkaServer, group: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": server.bootstrap,
        "group.id": group,
        "group.protocol": "consumer",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        **extra,
    }


class Member:
    """A consumer polling on its own thread: which partitions it holds, and when it received a
    record of each (the receiving times, per partition)."""

    def __init__(self, server: KafkaServer, topic: str, group: str, name: str) -> None:
        self.name = name
        self.consumer = Consumer(_config(server, group, **{"client.id": name}))
        self.consumer.subscribe([topic])
        self.received: dict[int, list[float]] = {}
        self.assigned: frozenset[int] = frozenset()
        self.history: list[tuple[float, frozenset[int]]] = []  # (since when, assignment)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 300
        while not self._stop.is_set() and time.monotonic() < deadline:
            message = self.consumer.poll(0.05)
            if message is not None:
                if message.error():
                    if message.error().code() != KafkaError._PARTITION_EOF:
                        self.errors.append(str(message.error()))
                else:
                    self.received.setdefault(message.partition(), []).append(time.monotonic())
            assigned = frozenset(tp.partition for tp in self.consumer.assignment())
            if assigned != self.assigned:
                self.history.append((time.monotonic(), assigned))
                self.assigned = assigned

    def stop_polling(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def commit(self) -> None:
        """Synchronously, from its own thread's view (after it stops polling)."""
        self.stop_polling()
        self.consumer.commit(asynchronous=False)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.consumer.close()  # leaves the group (epoch -1)


class Stream:
    """Records into every partition every 10 ms, until stopped."""

    def __init__(self, server: KafkaServer, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 2})
        self.topic = topic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 300
        while not self._stop.is_set() and time.monotonic() < deadline:
            for partition in range(PARTITIONS):
                self.producer.produce(self.topic, b"x", partition=partition)
            self.producer.poll(0)
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.producer.flush(30)


def _owners(members: list[Member]) -> dict[int, list[str]]:
    owners: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for member in members:
        for partition in member.assigned:
            owners[partition].append(member.name)
    return owners


def _settled(members: list[Member], timeout: float = 60.0) -> dict[int, str]:
    """Wait until every partition has exactly one owner, each member some; the owners."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        owners = _owners(members)
        if all(len(o) == 1 for o in owners.values()) and all(m.assigned for m in members):
            time.sleep(1.0)  # still so a moment later: not a snapshot between two steps
            if _owners(members) == owners:
                return {p: o[0] for p, o in owners.items()}
        time.sleep(0.05)
    raise AssertionError(f"no settled assignment: {_owners(members)}")


def _gaps(members: list[Member], start: float, end: float) -> dict[int, float]:
    """Each partition's longest time without a record received, between `start` and `end`."""
    gaps = {}
    for partition in range(PARTITIONS):
        times = sorted(
            t for m in members for t in m.received.get(partition, []) if start <= t <= end
        )
        marks = [start, *times, end]
        gaps[partition] = max(b - a for a, b in itertools.pairwise(marks))
    return gaps


def _held_all_along(member: Member, partition: int, start: float) -> bool:
    """Whether `member` had `partition` in its assignment at `start` and every moment since."""
    at_start = [a for t, a in member.history if t <= start][-1:]
    since = [a for t, a in member.history if t > start]
    return all(partition in a for a in at_start + since) and bool(at_start)


def _check_change(
    members: list[Member],
    before: dict[int, str],
    after: dict[int, str],
    start: float,
    must_move: int,
) -> None:
    moved = {p for p in range(PARTITIONS) if before.get(p) != after[p]}
    assert len(moved) == must_move, (before, after)
    by_name = {m.name: m for m in members}
    for partition in set(range(PARTITIONS)) - moved:  # never left its consumer's assignment
        assert _held_all_along(by_name[after[partition]], partition, start), partition
    gaps = _gaps(members, start, time.monotonic())
    stayed = [gaps[p] for p in range(PARTITIONS) if p not in moved]
    went = [gaps[p] for p in moved]
    # the partitions that stayed were consumed all through (gaps of tens of milliseconds, the
    # stream's pace); those that moved waited for their old owner to give them up and for their
    # new owner's next heartbeat (hundreds). Compared within the run: a loaded machine slows both
    assert statistics.median(stayed) < statistics.median(went), gaps


async def test_members_join_and_leave_moving_only_what_must_move(
    kafka: KafkaServer, topic_name: str
) -> None:
    await _create(kafka, topic_name)
    group = f"{topic_name}-g"
    stream = Stream(kafka, topic_name)
    members = [Member(kafka, topic_name, group, f"m{i}") for i in range(3)]
    try:
        three = await asyncio.to_thread(_settled, members)
        assert sorted(list(three.values()).count(m.name) for m in members) == [4, 4, 4]
        start = time.monotonic()
        members.append(Member(kafka, topic_name, group, "m3"))
        four = await asyncio.to_thread(_settled, members)
        _check_change(members, three, four, start, must_move=3)
        start = time.monotonic()
        for leaving in members[:2]:
            leaving.close()
        members = members[2:]
        two = await asyncio.to_thread(_settled, members)
        # the leavers' six partitions move; the stayers' keep flowing
        _check_change(members, four, two, start, must_move=6)
        stream.stop()
        # committed offsets are the subscription's cursor, as for a classic group
        ends = await _ends(kafka, topic_name)
        for member in members:
            await asyncio.to_thread(_drain, member, ends)
            member.commit()
        assert await _committed(kafka, topic_name, group) == ends
        assert all(not m.errors for m in members), [m.errors for m in members]
    finally:
        stream.stop()
        for member in members:
            member.close()


async def _ends(server: KafkaServer, topic: str) -> list[int]:
    async with await headwater.connect(server.address) as client:
        described = await client.describe_topic(topic)
        return list(described.next_offsets)


def _drain(member: Member, ends: list[int], timeout: float = 60.0) -> None:
    """Until the member has read each of its partitions to its end: its polling thread stopped
    first, the consumer polled here (a `position()` from another thread while one polls hung
    librdkafka's consumer of this protocol for minutes once)."""
    member.stop_polling()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        member.consumer.poll(0.05)
        positions = member.consumer.position(
            [TopicPartition(tp.topic, tp.partition) for tp in member.consumer.assignment()]
        )
        if all(tp.offset == ends[tp.partition] for tp in positions):
            return
    raise AssertionError(f"{member.name} did not reach the ends {ends}")


async def _committed(server: KafkaServer, topic: str, group: str) -> list[int]:
    async with await headwater.connect(server.address) as client:
        (detail,) = [s for s in await client.list_subscriptions(topic) if s.name == group]
        return [p.committed for p in detail.partitions]


_VICTIM = textwrap.dedent(
    """
    import sys, time
    from confluent_kafka import Consumer
    bootstrap, group, topic = sys.argv[1:4]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "group.protocol": "consumer", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        consumer.poll(0.1)
        if consumer.assignment():
            print(",".join(str(tp.partition) for tp in consumer.assignment()), flush=True)
            break
    while time.monotonic() < deadline:
        consumer.poll(0.1)
    """
)


async def test_a_member_killed_with_sigkill_is_fenced_and_its_partitions_move(
    kafka: KafkaServer, topic_name: str, tmp_path: Path
) -> None:
    await _create(kafka, topic_name)
    group = f"{topic_name}-g"
    script = tmp_path / "victim.py"
    script.write_text(_VICTIM)
    victim = subprocess.Popen(
        [sys.executable, str(script), kafka.bootstrap, group, topic_name],
        stdout=subprocess.PIPE,
        text=True,
    )
    members = [Member(kafka, topic_name, group, "m0")]
    try:
        assert victim.stdout is not None
        held = {int(p) for p in (await asyncio.to_thread(victim.stdout.readline)).split(",")}
        assert held
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=30)
        killed = time.monotonic()
        owners = await asyncio.to_thread(_settled, members, 60.0)
        assert set(owners) == set(range(PARTITIONS))  # the survivor has them all now
        # not before the session timeout (6 s): a silent member keeps its partitions till then
        assert time.monotonic() - killed > 5.0
    finally:
        if victim.poll() is None:
            victim.kill()
        for member in members:
            member.close()


def _flexible(port: int, key: int, version: int, request: Any) -> Any:
    """One request of a flexible version, its decoded answer."""
    api = SERVED[key]
    raw = RawKafka(port)
    try:
        # request header v2: the client id, then no tagged fields
        raw.request(api.key, version, 7, b"\x00" + codec.encode(api.requests[version], request))
        correlation, body = raw.response()
    finally:
        raw.close()
    assert correlation == 7
    # response header v1: no tagged fields
    return codec.decode_body(codec.Reader(body[1:]), api.responses[version])


def _heartbeat(port: int, request: cp.ConsumerGroupHeartbeatRequest, version: int = 1) -> Any:
    return _flexible(port, CONSUMER_GROUP_HEARTBEAT, version, request)


def _join(group: str, member: str, topic: str, **extra: Any) -> cp.ConsumerGroupHeartbeatRequest:
    return cp.ConsumerGroupHeartbeatRequest(
        group_id=group,
        member_id=member,
        member_epoch=0,
        rebalance_timeout_ms=30_000,
        subscribed_topic_names=[topic],
        **extra,
    )


async def test_bad_heartbeats_get_kafkas_error_codes(kafka: KafkaServer, topic_name: str) -> None:
    await _create(kafka, topic_name, partitions=2)
    group = f"{topic_name}-g"
    port = kafka.kafka_port
    joined = _heartbeat(port, _join(group, "member-a", topic_name))
    assert joined.error_code == 0 and joined.member_epoch > 0
    assert joined.heartbeat_interval_ms == 500
    assert joined.assignment is not None
    (assigned,) = joined.assignment.topic_partitions
    assert assigned.topic_id == topic_id(topic_name) and sorted(assigned.partitions) == [0, 1]

    def code(request: cp.ConsumerGroupHeartbeatRequest) -> int:
        return int(_heartbeat(port, request).error_code)

    epoch = joined.member_epoch
    assert code(cp.ConsumerGroupHeartbeatRequest(group, "nobody", 5)) == k.UNKNOWN_MEMBER_ID
    assert code(cp.ConsumerGroupHeartbeatRequest(group, "member-a", epoch + 1)) == (
        k.FENCED_MEMBER_EPOCH
    )
    assert code(_join(group, "member-b", topic_name, server_assignor="sticky")) == (
        k.UNSUPPORTED_ASSIGNOR
    )
    assert code(cp.ConsumerGroupHeartbeatRequest(group, "member-a", -5)) == k.INVALID_REQUEST
    assert code(cp.ConsumerGroupHeartbeatRequest("", "member-a", 0)) == k.INVALID_REQUEST
    assert code(_join(group, "", topic_name)) == k.INVALID_REQUEST
    assert (
        code(
            cp.ConsumerGroupHeartbeatRequest(
                group, "member-c", 0, rebalance_timeout_ms=1000, subscribed_topic_regex="^t.*"
            )
        )
        == k.INVALID_REGULAR_EXPRESSION
    )
    # a live consumer group takes no classic member
    classic = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": group, "session.timeout.ms": 6000}
    )
    classic.subscribe([topic_name])
    try:
        deadline = time.monotonic() + 30
        error = None
        while error is None and time.monotonic() < deadline:
            message = await asyncio.to_thread(classic.poll, 0.2)
            if message is not None and message.error():
                error = message.error()
        assert error is not None and error.code() == KafkaError.INCONSISTENT_GROUP_PROTOCOL
    finally:
        classic.close()
    left = _heartbeat(port, cp.ConsumerGroupHeartbeatRequest(group, "member-a", -1))
    assert left.error_code == 0 and left.member_epoch == -1


async def test_a_classic_group_with_members_is_not_a_consumer_group(
    kafka: KafkaServer, topic_name: str
) -> None:
    await _create(kafka, topic_name, partitions=2)
    group = f"{topic_name}-g"
    classic = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
        }
    )
    classic.subscribe([topic_name])
    try:
        deadline = time.monotonic() + 30
        while not classic.assignment() and time.monotonic() < deadline:
            await asyncio.to_thread(classic.poll, 0.2)
        assert classic.assignment()
        answer = _heartbeat(kafka.kafka_port, _join(group, "member-x", topic_name))
        assert answer.error_code == k.GROUP_ID_NOT_FOUND
        assert answer.error_message == f"Group {group} is not a consumer group."
    finally:
        classic.close()
    # once empty, the group takes the other protocol
    deadline = time.monotonic() + 30
    answer = None
    while time.monotonic() < deadline:
        answer = _heartbeat(kafka.kafka_port, _join(group, "member-x", topic_name))
        if answer.error_code == 0:
            break
        await asyncio.sleep(0.2)
    assert answer is not None and answer.error_code == 0


def test_heartbeat_bytes_are_what_the_spec_lays_out() -> None:
    """Our codec against a hand-laid v1 request and response (kafka-python has no class for
    this API to check it against)."""
    request = cp.ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="m",
        member_epoch=3,
        rebalance_timeout_ms=-1,
        topic_partitions=[cp.OwnedTopicPartitions(topic_id=bytes(range(16)), partitions=[1])],
    )
    laid = (
        b"\x02g"  # group id: compact string
        + b"\x02m"
        + struct.pack(">i", 3)
        + b"\x00\x00"  # instance id, rack id: null
        + struct.pack(">i", -1)
        + b"\x00\x00\x00"  # topic names, regex, assignor: null
        + b"\x02"  # one owned topic
        + bytes(range(16))
        + b"\x02"
        + struct.pack(">i", 1)
        + b"\x00"  # its tags
        + b"\x00"  # the request's tags
    )
    api = SERVED[CONSUMER_GROUP_HEARTBEAT]
    assert codec.encode(api.requests[1], request) == laid
    response = cp.ConsumerGroupHeartbeatResponse(member_id="m", member_epoch=4)
    assert codec.encode(api.responses[1], response) == (
        struct.pack(">ih", 0, 0) + b"\x00\x02m" + struct.pack(">ii", 4, 0) + b"\xff\x00"
    )


async def test_a_coordinator_killed_and_restarted_takes_its_members_back_as_they_were(
    tmp_path: Path, topic_name: str
) -> None:
    """The group's state is in memory: after a kill -9 the new coordinator rebuilds it from the
    members' heartbeats (each reports its epoch, subscription and partitions), so no partition
    moves; /metrics shows the group's members and epoch."""
    server = KafkaServer(tmp_path / "data", same_port=True, config=CONFIG).start()
    members: list[Member] = []
    try:
        await _create(server, topic_name)
        group = f"{topic_name}-g"
        members = [Member(server, topic_name, group, f"m{i}") for i in range(3)]
        before = await asyncio.to_thread(_settled, members)
        assert _metric(server, "members", group) == 3
        epoch = _metric(server, "epoch", group)
        server.kill()
        server.start()
        deadline = time.monotonic() + 60
        while _metric(server, "members", group) != 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert await asyncio.to_thread(_settled, members) == before
        # taken back with their epochs (a group made anew would count from 1 again)
        assert _metric(server, "epoch", group) > epoch
    finally:
        for member in members:
            member.close()
        server.stop()


def _metric(server: KafkaServer, name: str, group: str) -> float | None:
    """headwater_kafka_consumer_group_<name> of `group` on /metrics, None when absent."""
    wanted = f'headwater_kafka_consumer_group_{name}{{group="{group}"}} '
    for line in server.metrics().splitlines():
        if line.startswith(wanted):
            return float(line[len(wanted) :])
    return None


async def test_list_groups_filters_by_type_and_state_as_a_stock_admin_client_asks(
    kafka: KafkaServer, topic_name: str
) -> None:
    """confluent-kafka's `list_consumer_groups(types=..., states=...)` asks ListGroups v5 (with
    v2 only it got every group, the filter dropped): a consumer group is listed with type
    consumer and its state, a classic one (here: committed offsets, no members) classic."""
    await _create(kafka, topic_name)
    modern, classic = f"{topic_name}-new", f"{topic_name}-old"
    member = Member(kafka, topic_name, modern, "m0")
    committer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": classic})
    try:
        await asyncio.to_thread(_settled, [member])
        committer.commit(offsets=[TopicPartition(topic_name, 0, 0)], asynchronous=False)
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})

        def listed(**filters: Any) -> dict[str, tuple[ConsumerGroupType, ConsumerGroupState]]:
            found = admin.list_consumer_groups(request_timeout=10, **filters).result()
            assert not found.errors
            return {
                group.group_id: (group.type, group.state)
                for group in found.valid
                if group.group_id in (modern, classic)
            }

        new = {modern: (ConsumerGroupType.CONSUMER, ConsumerGroupState.STABLE)}
        old = {classic: (ConsumerGroupType.CLASSIC, ConsumerGroupState.EMPTY)}
        assert listed() == new | old
        assert listed(types={ConsumerGroupType.CONSUMER}) == new
        assert listed(types={ConsumerGroupType.CLASSIC}) == old
        assert listed(states={ConsumerGroupState.EMPTY}) == old
        assert listed(states={ConsumerGroupState.STABLE}, types={ConsumerGroupType.CLASSIC}) == {}
    finally:
        committer.close()
        member.close()


async def test_a_transactional_consume_transform_produce_loop_commits_as_a_member(
    kafka: KafkaServer, topic_name: str
) -> None:
    """A KIP-848 consumer and a transactional producer: each batch's transform is produced and
    its offsets sent in one transaction (TxnOffsetCommit with the member id and its epoch as
    generation). Every input record appears once in the output (read committed) and the group's
    committed offsets are the input's ends. A transactional commit from no member of the group,
    or at an epoch the member is not at, is refused as OffsetCommit's."""
    await _create(kafka, topic_name, partitions=2)
    output = f"{topic_name}-out"
    await _create(kafka, output, partitions=2)
    group = f"{topic_name}-g"
    source = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 2})
    values = [f"v{i}".encode() for i in range(300)]
    for i, value in enumerate(values):
        source.produce(topic_name, value, partition=i % 2)
    assert source.flush(30) == 0
    await asyncio.to_thread(_transform, kafka, topic_name, output, group, len(values))
    ends = await _ends(kafka, topic_name)
    assert await _committed(kafka, topic_name, group) == ends
    reader = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": f"{group}-reader",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    reader.assign([TopicPartition(output, p, 0) for p in range(2)])
    seen: list[bytes] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + 60
    try:
        while len(at_end) < 2 and time.monotonic() < deadline:
            for message in reader.consume(500, 0.5):
                if message.error() is None:
                    seen.append(message.value())
                elif message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
    finally:
        reader.close()
    assert sorted(seen) == sorted(v.upper() for v in values)


def _transform(kafka: KafkaServer, source: str, output: str, group: str, count: int) -> None:
    consumer = Consumer(_config(kafka, group, **{"isolation.level": "read_committed"}))
    consumer.subscribe([source])
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"{group}-t"})
    producer.init_transactions(30)
    done = 0
    deadline = time.monotonic() + 120
    try:
        while done < count and time.monotonic() < deadline:
            messages = [m for m in consumer.consume(100, 0.5) if m.error() is None]
            if not messages:
                continue
            producer.begin_transaction()
            for message in messages:
                producer.produce(output, message.value().upper(), partition=message.partition())
            positions = consumer.position(consumer.assignment())
            metadata = consumer.consumer_group_metadata()
            producer.send_offsets_to_transaction(positions, metadata, 30)
            producer.commit_transaction(30)
            done += len(messages)
        assert done == count
        _refused_commits(kafka, group, source, consumer.memberid())
    finally:
        consumer.close()


def _refused_commits(kafka: KafkaServer, group: str, topic: str, member: str) -> None:
    """TxnOffsetCommit v3 from no member, and from the member at an epoch ahead or behind its
    own: refused before any transaction is looked at."""

    def commit(member_id: str, epoch: int) -> int:
        request = tx.TxnOffsetCommitRequest(
            transactional_id="nobody",
            group_id=group,
            producer_id=1,
            producer_epoch=0,
            generation_id=epoch,
            member_id=member_id,
            topics=[
                tx.TxnOffsetCommitRequestTopic(
                    name=topic,
                    partitions=[
                        tx.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=0)
                    ],
                )
            ],
        )
        answer = _flexible(kafka.kafka_port, TXN_OFFSET_COMMIT, 3, request)
        return int(answer.topics[0].partitions[0].error_code)

    assert commit("no-such-member", 1) == k.UNKNOWN_MEMBER_ID
    assert commit("", -1) == k.UNKNOWN_MEMBER_ID  # no membership, and the group has members
    assert commit(member, 1_000_000) == k.FENCED_MEMBER_EPOCH
    assert commit(member, 0) == k.STALE_MEMBER_EPOCH
