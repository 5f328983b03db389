"""LOOKUP: its wire round trip, and a real single server answering it (every partition owned by
the one broker, an unknown topic reported in its entry) through a raw peer and the client."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

import headwater
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import ErrorCode, InvalidRequest, UnknownTopic
from headwater.wire.frames import Frame, FrameDecoder, FrameHeader, encode_frame
from headwater.wire.limits import MAX_LOOKUP_TOPICS, MAX_TOPIC_NAME_LENGTH, MAX_WAITING_REQUESTS
from headwater.wire.protocol import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from tests.support.rawwire import RawPeer

names = st.text(max_size=30)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
i16 = st.integers(-(2**15), 2**15 - 1)
lookup_responses = st.builds(
    m.LookupResponse,
    st.lists(st.builds(m.LookupBroker, names, names, i32), max_size=4).map(tuple),
    st.lists(
        st.builds(
            m.LookupTopic,
            names,
            i16,
            names,
            st.lists(st.builds(m.LookupPartition, i32, names, i64), max_size=4).map(tuple),
        ),
        max_size=3,
    ).map(tuple),
    st.integers(0, 2**31 - 1),
)


def _one_frame(data: bytes) -> Frame:
    (frame,) = FrameDecoder().feed(data)
    assert isinstance(frame, Frame)
    return frame


lookup_requests = st.builds(
    m.LookupRequest,
    st.lists(names, max_size=5).map(tuple),
    st.integers(0, 2**31 - 1),
    st.lists(st.builds(m.LookupWait, names, i32, i64), max_size=3).map(tuple),
)


@given(lookup_requests, i32)
def test_lookup_request_round_trip(request: m.LookupRequest, correlation_id: int) -> None:
    frame = _one_frame(encode_request(request, correlation_id))
    assert frame.header.api_key == m.ApiKey.LOOKUP
    assert decode_request(frame.header, frame.body) == request


@given(lookup_responses, i32)
def test_lookup_response_round_trip(response: m.LookupResponse, correlation_id: int) -> None:
    frame = _one_frame(encode_response(m.ApiKey.LOOKUP, correlation_id, response))
    assert decode_response(frame.header, frame.body) == response


def test_the_lease_added_at_the_end_keeps_both_sides_working() -> None:
    """LOOKUP's answer gained `lease_ms` at its end: a client that predates it reads a newer
    answer, ignoring the bytes after its fields, and this client reads an older server's
    shorter answer with lease 0 (its `owner_check` then stays at its default)."""
    from construct import Struct

    from headwater.wire.api import cluster

    api = next(a for a in cluster.APIS if a.key == m.ApiKey.LOOKUP)
    fields = api.response.subcon.subcons
    assert [f.name for f in fields][-1] == "lease_ms"
    older = Struct(*fields[:-1])
    answer = m.LookupResponse(
        (m.LookupBroker("b1", "h", 1),),
        (m.LookupTopic("t", 0, "", (m.LookupPartition(0, "b1", 3),)),),
        2000,
    )
    body = api.response.build(answer)
    assert older.parse(body).brokers[0].broker_id == "b1"  # the older client's parse
    short = older.build(older.parse(body))  # an older server's answer
    assert len(body) == len(short) + 4
    assert api.response.parse(short) == replace(answer, lease_ms=0)
    assert api.response.parse(body) == answer


async def test_single_broker_owns_every_partition(server: ServerProcess, topic_name: str) -> None:
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic_name, partitions=3)
        peer = await RawPeer.open(server.address)
        try:
            response = await peer.call(m.LookupRequest((topic_name, f"{topic_name}-missing")))
        finally:
            await peer.close()
    assert isinstance(response, m.LookupResponse)
    (broker,) = response.brokers
    assert broker.broker_id == "local" and broker.host == "127.0.0.1"
    assert response.lease_ms == 0  # no cluster, no lease
    found, missing = response.topics
    assert found.name == topic_name and found.error_code == 0
    assert [(p.partition, p.broker_id, p.epoch) for p in found.partitions] == [
        (0, "local", 0),
        (1, "local", 0),
        (2, "local", 0),
    ]
    assert missing.error_code == ErrorCode.UNKNOWN_TOPIC
    assert "does not exist" in missing.error_message and missing.partitions == ()


async def test_lookup_of_too_many_topics_is_refused(server: ServerProcess) -> None:
    peer = await RawPeer.open(server.address)
    try:
        topics = tuple(f"t{i}" for i in range(MAX_LOOKUP_TOPICS + 1))
        refused = await peer.call(m.LookupRequest(topics))
        assert isinstance(refused, InvalidRequest)
        assert f"at most {MAX_LOOKUP_TOPICS}" in refused.message
        # the connection still serves
        assert isinstance(await peer.call(m.LookupRequest(())), m.LookupResponse)
    finally:
        await peer.close()


async def test_client_lookup(server: ServerProcess, topic_name: str) -> None:
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic_name, partitions=2)
        owners = await client.lookup(topic_name)
        assert sorted(owners) == [0, 1]
        for owner in owners.values():
            assert owner is not None
            assert (owner.broker_id, owner.host, owner.port) == ("local", "127.0.0.1", server.port)
        try:
            await client.lookup(f"{topic_name}-missing")
        except UnknownTopic:
            pass
        else:
            raise AssertionError("lookup of a missing topic succeeded")
        assert [b.broker_id for b in client.brokers] == ["local"]


async def test_a_lookup_nobody_waits_for_leaves_no_unretrieved_error(
    server: ServerProcess, topic_name: str
) -> None:
    """A consumer's background LOOKUP still in flight when its client closes (the CLI's consume
    does that) must not end in asyncio's "Task exception was never retrieved" on stderr: the
    task is cancelled, or its error marked seen (asyncio's `_log_traceback`, what it reports)."""
    client = await headwater.connect(server.address)
    waiter = asyncio.ensure_future(client._router.refresh(topic_name))
    await asyncio.sleep(0)  # the lookup task exists
    task = client._router._pending[topic_name]
    waiter.cancel()  # its only waiter goes away (shield then stops watching it)
    await asyncio.sleep(0)
    await client.close()
    await asyncio.gather(waiter, return_exceptions=True)
    await asyncio.wait([task], timeout=5)  # (waits without taking its result)
    assert task.done()
    assert task.cancelled() or not task._log_traceback  # type: ignore[attr-defined]


@given(st.lists(names, max_size=5).map(tuple))
def test_a_version_0_lookup_reads_as_no_wait(topics: tuple[str, ...]) -> None:
    """Version 0 is the topic names alone: it reads as a LOOKUP answered at once."""
    body = struct.pack(">i", len(topics))
    for name in topics:
        raw = name.encode()
        body += struct.pack(">H", len(raw)) + raw
    decoded = decode_request(FrameHeader(m.ApiKey.LOOKUP, 0, 1, 0), body)
    assert decoded == m.LookupRequest(topics)


def test_lookup_names_and_counts_are_checked_before_they_are_read() -> None:
    """In both versions: more topics than MAX_LOOKUP_TOPICS, or a name longer than any topic
    name, is INVALID_REQUEST from its count or length (nothing after it is parsed); version 1's
    `wait_for` is bounded the same way."""
    over = struct.pack(">iH", 1, MAX_TOPIC_NAME_LENGTH + 1) + b"a" * (MAX_TOPIC_NAME_LENGTH + 1)
    for version in (0, 1):
        header = FrameHeader(m.ApiKey.LOOKUP, version, 1, 0)
        tail = struct.pack(">ii", 0, 0) if version == 1 else b""
        try:
            decode_request(header, struct.pack(">i", MAX_LOOKUP_TOPICS + 1) + tail)
        except InvalidRequest as exc:
            assert f"at most {MAX_LOOKUP_TOPICS}" in exc.message
        else:
            raise AssertionError("too many topics decoded")
        try:
            decode_request(header, over + tail)
        except InvalidRequest as exc:
            assert f"at most {MAX_TOPIC_NAME_LENGTH}" in exc.message
        else:
            raise AssertionError("a name longer than any topic's decoded")
    waits = struct.pack(">iii", 0, 100, 1_000_000)  # no topics, 100 ms, a million waits
    try:
        decode_request(FrameHeader(m.ApiKey.LOOKUP, 1, 1, 0), waits)
    except InvalidRequest as exc:
        assert "wait_for holds 1000000 entries; at most 1000" in exc.message
    else:
        raise AssertionError("a million waits decoded")


async def test_a_huge_lookup_is_refused_before_its_names_are_parsed(server: ServerProcess) -> None:
    """Two million one-byte names (6 MB): refused from the count, in well under a second, and
    the connection goes on; parsing them all would hold the server's loop for seconds."""
    count = 2_000_000
    body = struct.pack(">i", count) + b"\x00\x01a" * count
    frame = encode_frame(m.ApiKey.LOOKUP, 0, 1, 0, body)
    peer = await RawPeer.open(server.address)
    try:
        started = asyncio.get_running_loop().time()
        await peer.send(frame)
        refused = await peer.response(timeout=10)
        elapsed = asyncio.get_running_loop().time() - started
        assert isinstance(refused, InvalidRequest), refused
        assert f"at most {MAX_LOOKUP_TOPICS}" in refused.message
        assert elapsed < 2.0, elapsed  # the transfer of 6 MB over loopback, nothing more
        assert isinstance(await peer.call(m.LookupRequest(())), m.LookupResponse)
    finally:
        await peer.close()


async def test_a_long_poll_waits_its_time_holds_nothing_and_checks_its_arguments(
    server: ServerProcess, topic_name: str
) -> None:
    """LOOKUP version 1 on a single broker, whose owners never change: a long poll on a
    partition it owns under epoch 0 waits its `max_wait_ms` and then answers as version 0;
    a request sent after it on the same connection is answered first (the wait holds no turn);
    one waiting on a partition that can never be owned (an unknown topic, past the count) is
    answered at once; out-of-range arguments are INVALID_REQUEST."""
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic_name, partitions=2)
    peer = await RawPeer.open(server.address)
    try:
        plain = await peer.call(m.LookupRequest((topic_name,)))
        assert isinstance(plain, m.LookupResponse)
        loop = asyncio.get_running_loop()
        started = loop.time()
        waiting = m.LookupRequest((topic_name,), 600, (m.LookupWait(topic_name, 1, 0),))
        polled = await peer.request(waiting)
        other = await peer.request(m.ListTopicsRequest())
        frames = [await peer.frame(timeout=10), await peer.frame(timeout=10)]
        assert [f.header.correlation_id for f in frames] == [other, polled]
        answer = decode_response(frames[1].header, frames[1].body)
        assert loop.time() - started >= 0.6
        assert answer == plain
        for wait in (m.LookupWait(f"{topic_name}-missing", 0, 0), m.LookupWait(topic_name, 2, 0)):
            started = loop.time()
            at_once = await peer.call(m.LookupRequest((topic_name,), 20_000, (wait,)))
            assert at_once == plain, wait
            assert loop.time() - started < 5.0, wait  # not the 20 s: the partition has no owner
        for bad, said in [
            (m.LookupRequest((topic_name,), 20_001, (m.LookupWait(topic_name, 0, 0),)), "0..20000"),
            (m.LookupRequest((topic_name,), -1, ()), "0..20000"),
            (m.LookupRequest((topic_name,), 100, (m.LookupWait(topic_name, -1, 0),)), "-1"),
        ]:
            refused = await peer.call(bad)
            assert isinstance(refused, InvalidRequest), (bad, refused)
            assert said in refused.message
    finally:
        await peer.close()


async def test_pipelined_long_polls_wait_a_few_at_a_time_and_stall_no_one(
    server: ServerProcess, topic_name: str
) -> None:
    """1,000 long polls pipelined on one connection: they count among its waiting requests,
    so at most MAX_WAITING_REQUESTS wait at once and the rest are read as those end (50,000
    uncounted held 72 MiB of the server); another connection is answered meanwhile, and every
    long poll gets its answer."""
    count, wait_ms = 1000, 100
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic_name, partitions=1)
    poll = m.LookupRequest((topic_name,), wait_ms, (m.LookupWait(topic_name, 0, 0),))
    peer = await RawPeer.open(server.address)
    other = await RawPeer.open(server.address)
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        await peer.send(b"".join(encode_request(poll, i + 1) for i in range(count)))
        assert isinstance(await other.call(m.LookupRequest((topic_name,))), m.LookupResponse)
        answered = [await peer.frame(timeout=60) for _ in range(count)]
        took = loop.time() - started
    finally:
        await peer.close()
        await other.close()
    assert sorted(f.header.correlation_id for f in answered) == list(range(1, count + 1))
    # at most MAX_WAITING_REQUESTS at a time, each its 100 ms: a lower bound, whatever the load
    rounds = count // MAX_WAITING_REQUESTS
    assert took >= rounds * wait_ms / 1000 * 0.9, f"{count} long polls answered in {took:.2f} s"
