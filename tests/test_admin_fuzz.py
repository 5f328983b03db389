"""A randomized test of admin requests pipelined on several connections against a live server.

Each example runs rounds of create / delete / produce / map set on two topic names, every request
of a round sent at once: the requests on one name go down one connection (so a model can predict
each answer exactly: requests on a topic keep their order), while a third connection subscribes
and reads maps on either name at the same time (its answers must only be valid ones). Between
rounds the server may be stopped gracefully or killed. After every round: every request was
answered as the model says, the topics listed are the model's (a deleted topic stays deleted
across restarts), every acknowledged message of a live topic is there, and the server logged no
error. HEADWATER_FUZZ_EXAMPLES raises the number of examples (`make fuzz`).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import headwater
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import (
    ConsumerBusy,
    HeadwaterError,
    InvalidRequest,
    SubscriptionTypeMismatch,
    TopicExists,
    UnknownTopic,
)
from headwater.wire.protocol import decode_response, encode_request
from headwater.wire.records import build_batch
from tests.support.rawwire import RawPeer

NAMES = ("a", "b")
PARTITIONS = 2
_ids = itertools.count(1)

operation = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(NAMES)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES)),
    st.tuples(st.just("produce"), st.sampled_from(NAMES), st.integers(0, PARTITIONS - 1)),
    st.tuples(st.just("map_set"), st.sampled_from(NAMES), st.sampled_from(["k1", "k2", "k3"])),
    st.tuples(st.just("subscribe"), st.sampled_from(NAMES), st.sampled_from(["s1", "s2"])),
    st.tuples(st.just("map_get"), st.sampled_from(NAMES), st.just("k1")),
)
rounds = st.lists(
    st.tuples(
        st.lists(operation, min_size=1, max_size=12),
        st.sampled_from(["none", "none", "stop", "kill"]),
    ),
    min_size=1,
    max_size=4,
)


@dataclass
class _Topic:
    acked: list[tuple[int, int, bytes]] = field(default_factory=list)


async def _send_round(peers: list[RawPeer], ops: list[tuple[object, ...]]) -> None:
    """Pipeline one round and check each answer against the model."""
    model: dict[str, _Topic] = _MODEL
    outgoing: list[list[bytes]] = [[] for _ in peers]
    expected: dict[int, tuple[RawPeer, object]] = {}
    for op in ops:
        kind, name = str(op[0]), str(op[1])
        value = f"{kind}-{next(_ids)}".encode()
        if kind in ("subscribe", "map_get"):
            peer_index = 2
            if kind == "subscribe":
                request: m.Request = m.SubscribeRequest(
                    name,
                    str(op[2]),
                    m.SubscriptionType.SHARED,
                    "c",
                    0,
                    5,
                    m.SubscriptionSettings(start=m.StartPosition.EARLIEST),
                )
            else:
                request = m.MapGetRequest(name, (b"k1",))
            check: object = "any" if kind == "subscribe" else "map_get"
        else:
            peer_index = NAMES.index(name)
            exists = name in model
            if kind == "create":
                request = m.CreateTopicRequest(name, PARTITIONS, m.DispatchMode.RELIABLE)
                check = TopicExists if exists else m.EmptyResponse
                if not exists:
                    model[name] = _Topic()
            elif kind == "delete":
                request = m.DeleteTopicRequest(name)
                check = m.EmptyResponse if exists else UnknownTopic
                model.pop(name, None)
            elif kind == "produce":
                request = m.ProduceRequest(name, int(op[2]), build_batch([(None, value, ())]))  # type: ignore[call-overload]
                check = ("produce", model[name], value) if exists else UnknownTopic
            else:
                key = str(op[2]).encode()
                request = m.MapSetRequest(name, (m.MapWrite(key, value),))
                partition = zlib.crc32(key) % PARTITIONS
                check = ("map_set", model[name], value, partition) if exists else UnknownTopic
        correlation = next(_ids)
        outgoing[peer_index].append(encode_request(request, correlation))
        expected[correlation] = (peers[peer_index], check)
    for peer, frames in zip(peers, outgoing, strict=True):
        if frames:
            await peer.send(b"".join(frames))
    answers: dict[int, m.Response | HeadwaterError] = {}
    for peer in peers:
        wanted = {c for c, (p, _) in expected.items() if p is peer}
        while not wanted <= set(answers):
            frame = await peer.frame(timeout=20)  # every request is answered
            if frame.header.is_push:
                continue
            try:
                answers[frame.header.correlation_id] = decode_response(frame.header, frame.body)
            except HeadwaterError as exc:
                answers[frame.header.correlation_id] = exc
    # Answers are checked in request order. An ack goes to the incarnation of the topic its
    # request was made against (captured above): by now a later op of this round may have
    # deleted and re-created the topic, and the new one never held that record.
    for correlation, (_, check) in expected.items():
        answer = answers[correlation]
        if check == "map_get":
            # a read never switches last-value state on: refused until a map_set of a round did
            assert isinstance(answer, m.MapGetResponse | UnknownTopic | InvalidRequest), answer
        elif check == "any":
            assert isinstance(
                answer,
                m.SubscribeResponse
                | m.MapGetResponse
                | UnknownTopic
                | ConsumerBusy
                | SubscriptionTypeMismatch,
            ), answer
        elif isinstance(check, tuple) and check[0] == "produce":
            assert isinstance(answer, m.ProduceResponse), answer
            check[1].acked.append((answer.partition, answer.base_offset, check[2]))
        elif isinstance(check, tuple):
            assert isinstance(answer, m.MapSetResponse), answer
            check[1].acked.append((check[3], answer.revisions[0], check[2]))
        elif isinstance(check, type) and issubclass(check, HeadwaterError):
            assert isinstance(answer, check), (check, answer)
        else:
            assert answer == m.EmptyResponse(), answer


_MODEL: dict[str, _Topic] = {}


async def _verify(server: ServerProcess) -> None:
    async with await headwater.connect(server.address) as client:
        assert sorted(t.name for t in await client.list_topics()) == sorted(_MODEL)
        for name, topic in _MODEL.items():
            if not topic.acked:
                continue
            reader = f"verify-{next(_ids)}"
            consumer = await client.subscribe(name, reader, type="shared", start="earliest")
            found: dict[tuple[int, int], bytes | None] = {}
            want = {(p, o): v for p, o, v in topic.acked}
            while not set(want) <= set(found):
                message = await consumer.receive(timeout=30)
                found[(message.partition, message.offset)] = message.value
                await message.ack()
            await consumer.close()
            await client.delete_subscription(name, reader)
            for position, value in want.items():
                assert found[position] == value, (name, position)


@settings(
    max_examples=int(os.environ.get("HEADWATER_FUZZ_EXAMPLES", "6")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=rounds)
def test_pipelined_admin_requests_against_a_model(tmp_path: Path, plan: list) -> None:  # type: ignore[type-arg]
    data_dir = tmp_path / f"fuzz-{next(_ids)}"
    server = ServerProcess(data_dir).start()
    _MODEL.clear()
    try:
        asyncio.run(_run(server, plan))
    finally:
        server.kill()
    log = server.log()
    assert "[error" not in log and "Traceback" not in log, log[-4000:]


async def _run(server: ServerProcess, plan: list) -> None:  # type: ignore[type-arg]
    for ops, restart in plan:
        peers = [await RawPeer.open(server.address) for _ in range(3)]
        try:
            await _send_round(peers, ops)
        finally:
            for peer in peers:
                await peer.close()
        if restart == "stop":
            assert server.stop() == 0
            server.start()
        elif restart == "kill":
            server.kill()
            server.start()
        await _verify(server)


# Found by this fuzzer on 2026-11-29 (failing at 19c67b6 already): after a graceful restart and a
# kill -9 (offsets skipped to the lease), a new subscription's pump met, on one partition, a gap
# reaching the end with nothing after it, and went idle without sending the other partitions'
# acknowledged records. Replayed here on every run, not left to the random examples.
KNOWN_PLAN = [
    (
        [("create", "a"), ("create", "a"), ("create", "a"), ("delete", "a"),
         ("map_set", "b", "k3"), ("delete", "a"), ("map_get", "b", "k1"),
         ("map_set", "a", "k1"), ("create", "b"), ("produce", "b", 0)],
        "stop",
    ),
    (
        [("delete", "a"), ("subscribe", "a", "s2"), ("map_get", "a", "k1"), ("create", "a"),
         ("subscribe", "b", "s2"), ("map_get", "a", "k1"), ("subscribe", "b", "s2"),
         ("subscribe", "b", "s1"), ("create", "a"), ("map_set", "b", "k2"),
         ("map_get", "a", "k1"), ("map_set", "b", "k2")],
        "stop",
    ),
    (
        [("create", "b"), ("create", "b"), ("map_set", "b", "k1"), ("map_set", "a", "k3"),
         ("create", "a"), ("subscribe", "b", "s1"), ("map_get", "b", "k1"),
         ("map_set", "b", "k1")],
        "kill",
    ),
]  # fmt: skip


def test_records_after_a_restart_and_a_kill_are_delivered_to_a_new_subscription(
    tmp_path: Path,
) -> None:
    server = ServerProcess(tmp_path / "known").start()
    _MODEL.clear()
    try:
        asyncio.run(_run(server, KNOWN_PLAN))
    finally:
        server.kill()
