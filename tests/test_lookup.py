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
from headwater.wire.api.cluster import decode_lookup_request
from headwater.wire.errors import ErrorCode, HeadwaterError, InvalidRequest, UnknownTopic
from headwater.wire.frames import Frame, FrameDecoder, encode_frame
from headwater.wire.limits import MAX_LOOKUP_TOPICS
from headwater.wire.protocol import (
    SCHEMAS,
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


@given(st.builds(m.LookupRequest, st.lists(names, max_size=5).map(tuple)), i32)
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


@given(st.binary(max_size=64))
def test_lookup_decoder_agrees_with_the_schema(body: bytes) -> None:
    schema = SCHEMAS[m.ApiKey.LOOKUP][0]
    try:
        expected: object = schema.parse(body)
    except Exception:
        expected = None
    try:
        got: object = decode_lookup_request(body)
    except InvalidRequest:
        assert expected is None or len(expected.topics) > MAX_LOOKUP_TOPICS  # type: ignore[attr-defined]
        return
    except HeadwaterError:
        got = None
    assert got == expected


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
