"""Every request gets an answer: the share group (KIP-932) and consumer group (KIP-848) APIs
with hostile field values, pipelined on one connection.

ShareGroupHeartbeat, ShareFetch, ShareAcknowledge, ConsumerGroupHeartbeat,
ConsumerGroupDescribe and ShareGroupDescribe are sent with negative epochs, 10,000 topics or
groups, empty and 64 KiB member ids, unknown topic ids and partitions, all at once on one
connection: each is answered, in order, with the Kafka error code for what is wrong (top-level,
or for each partition or group named; a 64 KiB member id is taken, as Kafka takes any), and the
broker answers another connection meanwhile and afterwards. A ShareGroupHeartbeat is checked as
Kafka's coordinator checks it, before anything is made: an empty group id made the share
group's subscription "" on the topic, and an epoch of -5 was UNKNOWN_MEMBER_ID.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import headwater
from headwater.server.kafka import codec
from headwater.server.kafka import kafka_errors as k
from headwater.server.kafka.apis import SERVED
from headwater.server.kafka.messages import consumer_protocol as cp
from headwater.server.kafka.messages import share as sh
from headwater.server.kafka.messages.declare import Message
from headwater.server.kafka.messages.metadata import ApiVersionsRequest
from headwater.server.kafka.topic_ids import topic_id
from tests.support.kafka_support import KafkaServer, RawKafka

TOPIC = "hostile"
MANY = 10_000
HUGE = "m" * 65_536
UNKNOWN_ID = bytes(range(16))


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    server = KafkaServer(tmp_path_factory.mktemp("kafka-hostile") / "data").start()

    async def make() -> None:
        async with await headwater.connect(server.address) as client:
            await client.create_topic(TOPIC, partitions=2, dispatch="reliable")

    asyncio.run(make())
    yield server
    server.stop()


def _frame(request: Message, correlation: int) -> bytes:
    api = SERVED[request.API_KEY]
    version = api.max_version
    body = codec.encode(api.requests[version], request)
    header = struct.pack(">hhih", request.API_KEY, version, correlation, 3) + b"raw"
    if api.flexible(version):
        header += b"\x00"  # the request header v2's empty tagged fields
    return struct.pack(">i", len(header) + len(body)) + header + body


def _decode(request: Message, rest: bytes) -> Any:
    api = SERVED[request.API_KEY]
    version = api.max_version
    skip = 1 if api.flexible(version) else 0  # the response header v1's tagged fields
    return codec.decode_body(codec.Reader(rest, skip), api.responses[version])


def _fetch(member: str, epoch: int, topics: list[sh.FetchTopic], **more: Any) -> Any:
    return sh.ShareFetchRequest(
        group_id="g", member_id=member, share_session_epoch=epoch, topics=topics, **more
    )


def _partition_codes(answer: Any) -> set[int]:
    return {p.error_code for t in answer.responses for p in t.partitions}


# (what is hostile, the request, what its answer must say)
Case = tuple[str, Message, Callable[[Any], bool]]


def _cases() -> list[Case]:
    known = topic_id(TOPIC)
    many_ids = [struct.pack(">QQ", 1, i) for i in range(MANY)]
    partition = [sh.FetchPartition(partition_index=0)]
    ack = [
        sh.AcknowledgePartition(
            partition_index=0,
            acknowledgement_batches=[
                sh.AcknowledgementBatch(first_offset=0, last_offset=0, acknowledge_types=[1])
            ],
        )
    ]
    return [
        (
            "share heartbeat, negative epoch",
            sh.ShareGroupHeartbeatRequest("g", "m1", -5, None, [TOPIC]),
            lambda a: a.error_code == k.INVALID_REQUEST,
        ),
        (
            "share heartbeat, empty member id",
            sh.ShareGroupHeartbeatRequest("g", "", 0, None, [TOPIC]),
            lambda a: a.error_code == k.INVALID_REQUEST,
        ),
        (
            "share heartbeat, empty group id",
            sh.ShareGroupHeartbeatRequest("", "m1", 0, None, [TOPIC]),
            lambda a: a.error_code == k.INVALID_REQUEST,
        ),
        (
            "share heartbeat, 64 KiB member id (Kafka takes any)",
            sh.ShareGroupHeartbeatRequest("g", HUGE, 0, None, [TOPIC]),
            lambda a: a.error_code == 0 and a.member_id == HUGE,
        ),
        (
            "share heartbeat, 10,000 unknown topics",
            sh.ShareGroupHeartbeatRequest("g", "m2", 0, None, [f"none-{i}" for i in range(MANY)]),
            lambda a: a.error_code == k.INVALID_REQUEST,  # past MAX_SUBSCRIBED_TOPICS
        ),
        (
            "share fetch, negative epoch",
            _fetch("m1", -5, [sh.FetchTopic(topic_id=known, partitions=partition)]),
            lambda a: a.error_code in (k.SHARE_SESSION_NOT_FOUND, k.INVALID_SHARE_SESSION_EPOCH),
        ),
        (
            "share fetch, empty member id",
            _fetch("", 0, [sh.FetchTopic(topic_id=known, partitions=partition)]),
            lambda a: a.error_code == k.INVALID_REQUEST,
        ),
        (
            "share fetch, 64 KiB member id (Kafka takes any)",
            _fetch(HUGE, 0, [sh.FetchTopic(topic_id=known, partitions=partition)]),
            lambda a: a.error_code == 0,
        ),
        (
            "share fetch, unknown topic id",
            _fetch("m3", 0, [sh.FetchTopic(topic_id=UNKNOWN_ID, partitions=partition)]),
            lambda a: a.error_code == 0 and _partition_codes(a) == {k.UNKNOWN_TOPIC_ID},
        ),
        (
            "share fetch, negative and unknown partitions",
            _fetch(
                "m4",
                0,
                [
                    sh.FetchTopic(
                        topic_id=known,
                        partitions=[
                            sh.FetchPartition(partition_index=-1),
                            sh.FetchPartition(partition_index=99),
                        ],
                    )
                ],
                max_wait_ms=-1,
                max_records=-1,
            ),
            lambda a: a.error_code == 0 and _partition_codes(a) == {k.UNKNOWN_TOPIC_OR_PARTITION},
        ),
        (
            "share fetch, 10,000 unknown topic ids",
            _fetch("m5", 0, [sh.FetchTopic(topic_id=i, partitions=partition) for i in many_ids]),
            lambda a: (
                a.error_code == 0
                and len(a.responses) == MANY
                and _partition_codes(a) == {k.UNKNOWN_TOPIC_ID}
            ),
        ),
        (
            "share acknowledge, negative epoch",
            sh.ShareAcknowledgeRequest(
                group_id="g",
                member_id="m1",
                share_session_epoch=-7,
                topics=[sh.AcknowledgeTopic(topic_id=known, partitions=ack)],
            ),
            lambda a: a.error_code in (k.SHARE_SESSION_NOT_FOUND, k.INVALID_SHARE_SESSION_EPOCH),
        ),
        (
            "share acknowledge, no session, unknown topic",
            sh.ShareAcknowledgeRequest(
                group_id="g",
                member_id="m6",
                share_session_epoch=3,
                topics=[sh.AcknowledgeTopic(topic_id=UNKNOWN_ID, partitions=ack)],
            ),
            lambda a: a.error_code == k.SHARE_SESSION_NOT_FOUND,
        ),
        (
            "share acknowledge, empty member id",
            sh.ShareAcknowledgeRequest(group_id="g", member_id="", share_session_epoch=1),
            lambda a: a.error_code == k.INVALID_REQUEST,
        ),
        (
            "consumer heartbeat, negative epoch",
            cp.ConsumerGroupHeartbeatRequest("c", "c1", -5, None, None, 30_000, [TOPIC]),
            lambda a: a.error_code == k.INVALID_REQUEST,
        ),
        (
            "consumer heartbeat, empty group id",
            cp.ConsumerGroupHeartbeatRequest("", "c1", 0, None, None, 30_000, [TOPIC]),
            lambda a: a.error_code == k.INVALID_REQUEST,
        ),
        (
            "consumer heartbeat, empty member id",
            cp.ConsumerGroupHeartbeatRequest("c", "", 0, None, None, 30_000, [TOPIC]),
            lambda a: a.error_code == k.INVALID_REQUEST,
        ),
        (
            "consumer heartbeat, 64 KiB member id (Kafka takes any)",
            cp.ConsumerGroupHeartbeatRequest("c", HUGE, 0, None, None, 30_000, [TOPIC]),
            lambda a: a.error_code == 0 and a.member_id == HUGE,
        ),
        (
            "consumer heartbeat, negative rebalance timeout at join",
            cp.ConsumerGroupHeartbeatRequest("c", "c2", 0, None, None, -5, [TOPIC]),
            lambda a: a.error_code == k.INVALID_REQUEST,
        ),
        (
            "consumer heartbeat, 10,000 unknown topics",
            cp.ConsumerGroupHeartbeatRequest(
                "c", "c3", 0, None, None, 30_000, [f"none-{i}" for i in range(MANY)]
            ),
            lambda a: a.error_code == 0,
        ),
        (
            "consumer heartbeat, unknown owned topic ids",
            cp.ConsumerGroupHeartbeatRequest(
                "c",
                "c3",
                1,
                topic_partitions=[
                    cp.OwnedTopicPartitions(topic_id=i, partitions=[0]) for i in many_ids
                ],
            ),
            lambda a: a.error_code in (0, k.FENCED_MEMBER_EPOCH),
        ),
        (
            "consumer group describe, 10,000 unknown groups and an empty one",
            cp.ConsumerGroupDescribeRequest([*(f"none-{i}" for i in range(MANY)), ""]),
            lambda a: (
                len(a.groups) == MANY + 1
                and {g.error_code for g in a.groups[:-1]} == {k.GROUP_ID_NOT_FOUND}
                and a.groups[-1].error_code in (k.INVALID_GROUP_ID, k.GROUP_ID_NOT_FOUND)
            ),
        ),
        (
            "share group describe, 10,000 unknown groups and an empty one",
            sh.ShareGroupDescribeRequest([*(f"none-{i}" for i in range(MANY)), ""]),
            lambda a: (
                len(a.groups) == MANY + 1
                and {g.error_code for g in a.groups[:-1]} == {k.GROUP_ID_NOT_FOUND}
                and a.groups[-1].error_code in (k.INVALID_GROUP_ID, k.GROUP_ID_NOT_FOUND)
            ),
        ),
    ]


def test_hostile_group_requests_pipelined_are_each_answered_precisely(kafka: KafkaServer) -> None:
    cases = _cases()
    hostile = RawKafka(kafka.kafka_port, timeout=60)
    other = RawKafka(kafka.kafka_port, timeout=60)
    try:
        hostile.send_raw(b"".join(_frame(r, n) for n, (_, r, _) in enumerate(cases, 1)))
        # another connection is served while those are handled
        started = time.monotonic()
        other.send_raw(_frame(ApiVersionsRequest(), 1))
        assert other.response()[0] == 1
        assert time.monotonic() - started < 30
        wrong = []
        for n, (what, request, right) in enumerate(cases, 1):
            correlation, rest = hostile.response()
            assert correlation == n, f"{what}: answered out of order ({correlation})"
            answer = _decode(request, rest)
            if not right(answer):
                wrong.append(f"{what}: {_summary(answer)}")
        assert not wrong, "\n".join(wrong)
        other.send_raw(_frame(ApiVersionsRequest(), 2))  # and afterwards
        assert other.response()[0] == 2
    finally:
        hostile.close()
        other.close()
    assert "Traceback" not in kafka.process.log()


def _summary(answer: Any) -> str:
    """The answer's codes and messages, short."""
    codes = [getattr(answer, "error_code", None), getattr(answer, "error_message", None)]
    for part in (getattr(answer, "responses", None) or getattr(answer, "groups", None) or [])[:2]:
        inner = getattr(part, "partitions", None) or [part]
        codes += [
            (getattr(p, "error_code", None), getattr(p, "error_message", None)) for p in inner
        ]
    return repr(codes)[:300]
