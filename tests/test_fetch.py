"""FETCH on a real server: reads by offset from the start, the middle and the end, a long poll woken
by a produce, every refusal with its precise code, and the `consume` grant it needs; its wire
vectors (quoted in docs/PROTOCOL.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import headwater
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import (
    InvalidPartition,
    InvalidRequest,
    NotAuthorized,
    NotSupported,
    OffsetOutOfRange,
    UnknownTopic,
)
from headwater.wire.limits import MAX_FETCH_BYTES
from headwater.wire.protocol import encode_request, encode_response
from headwater.wire.records import build_batch
from tests.support.rawwire import RawPeer
from tests.support.secure import SecureServer, secure_server


async def produced(client: headwater.Client, topic: str, batches: int, per_batch: int) -> None:
    """`batches` batches of `per_batch` records each to partition 0, values `v<offset>`."""
    producer = client.producer(topic)
    offset = 0
    for _ in range(batches):
        values = [f"v{offset + i}".encode() for i in range(per_batch)]
        await (await producer.send_batch(values, partition=0))
        offset += per_batch
    await producer.close()


@pytest.fixture
async def reliable(client: headwater.Client, topic_name: str) -> str:
    await client.create_topic(topic_name, partitions=2, dispatch="reliable")
    await produced(client, topic_name, 3, 10)
    return topic_name


async def test_fetch_from_the_start_the_middle_and_the_end(
    client: headwater.Client, reliable: str
) -> None:
    whole = await client.fetch(reliable, 0, 0)
    assert (whole.start_offset, whole.end_offset, whole.next_offset) == (0, 30, 30)
    assert [r.value for r in whole.records()] == [f"v{i}".encode() for i in range(30)]
    assert [r.offset for r in whole.records()] == list(range(30))
    assert len(whole.batches()) == 3

    middle = await client.fetch(reliable, 0, 15)  # inside the second batch
    assert [r.offset for r in middle.records()] == list(range(15, 30))
    assert middle.batches()[0] == whole.batches()[1]  # the batch holding 15, whole

    one = await client.fetch(reliable, 0, 0, max_bytes=1)  # at least one batch, however small
    assert [r.offset for r in one.records()] == list(range(10))
    assert one.next_offset == 10

    end = await client.fetch(reliable, 0, 30)
    assert (end.data, end.records(), end.next_offset, end.end_offset) == (b"", [], 30, 30)
    empty = await client.fetch(reliable, 1, 0)  # a partition with nothing yet
    assert (empty.data, empty.start_offset, empty.end_offset) == (b"", 0, 0)


async def test_a_long_poll_at_the_end_is_woken_by_a_produce(
    client: headwater.Client, reliable: str
) -> None:
    started = time.monotonic()
    quiet = await client.fetch(reliable, 0, 30, max_wait=0.3)
    assert quiet.data == b""
    assert time.monotonic() - started >= 0.29  # it waited, and answered nothing

    waiting = asyncio.ensure_future(client.fetch(reliable, 0, 30, max_wait=15))
    await asyncio.sleep(0.2)  # the poll is in (nothing can signal its arrival)
    assert not waiting.done()
    started = time.monotonic()
    producer = client.producer(reliable)
    await (await producer.send(b"late", partition=0))
    await producer.close()
    answer = await asyncio.wait_for(waiting, 10)
    assert time.monotonic() - started < 5  # woken by the append, not by its 15 s
    assert [(r.offset, r.value) for r in answer.records()] == [(30, b"late")]
    assert answer.end_offset == 31


async def test_two_thousand_long_polls_on_four_connections_are_all_woken_by_one_append(
    server: ServerProcess, topic_name: str
) -> None:
    """Long polls pipelined at a partition's end, 500 on each of four connections: another
    client's produce is acknowledged meanwhile, and its one append wakes every poll, each
    answered with that record (none lost in the append signal, none left to its timeout)."""
    clients = [await headwater.connect(server.address) for _ in range(4)]
    try:
        await clients[0].create_topic(topic_name, partitions=2, dispatch="reliable")
        polls = [
            asyncio.ensure_future(client.fetch(topic_name, 1, 0, max_wait=15))
            for client in clients
            for _ in range(500)
        ]
        async with await headwater.connect(server.address) as other:
            producer = other.producer(topic_name)
            acked = await asyncio.wait_for(await producer.send(b"wake", partition=1), 30)
            assert (acked.partition, acked.offset) == (1, 0)
            await producer.close()
        answers = await asyncio.wait_for(asyncio.gather(*polls), 60)  # bounds a hang only
        assert {tuple((r.offset, r.value) for r in a.records()) for a in answers} == {
            ((0, b"wake"),)
        }
        assert len(answers) == 2000
    finally:
        for client in clients:
            await client.close()


async def test_refusals_have_precise_codes(
    client: headwater.Client, reliable: str, topic_name: str
) -> None:
    with pytest.raises(OffsetOutOfRange, match="start=0 next=30"):
        await client.fetch(reliable, 0, -1)
    with pytest.raises(OffsetOutOfRange, match="start=0 next=30"):
        await client.fetch(reliable, 0, 31)
    with pytest.raises(InvalidPartition):
        await client.fetch(reliable, 2, 0)
    with pytest.raises(UnknownTopic):
        await client.fetch(topic_name + "-missing", 0, 0)
    with pytest.raises(InvalidRequest):
        await client.fetch(reliable, 0, 0, max_bytes=0)
    with pytest.raises(InvalidRequest):
        await client.fetch(reliable, 0, 0, max_bytes=MAX_FETCH_BYTES + 1)
    with pytest.raises(InvalidRequest):
        await client.fetch(reliable, 0, 0, max_wait=21)
    await client.create_topic(topic_name + "-live", dispatch="non-reliable")
    with pytest.raises(NotSupported):
        await client.fetch(topic_name + "-live", 0, 0)
    assert (await client.fetch(reliable, 0, 29)).records()[0].value == b"v29"  # still serving


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[SecureServer]:
    with secure_server(tmp_path) as server:
        yield server


async def test_fetch_needs_the_consume_grant(secure: SecureServer) -> None:
    async with await headwater.connect(secure.address, token=secure.admin) as admin:
        await admin.create_topic("ledger", dispatch="reliable")
        await produced(admin, "ledger", 1, 3)
        writer = await headwater.connect(secure.address, token=secure.token("w", "produce:*"))
        reader = await headwater.connect(secure.address, token=secure.token("r", "consume:led*"))
        try:
            with pytest.raises(NotAuthorized):
                await writer.fetch("ledger", 0, 0)
            fetched = await reader.fetch("ledger", 0, 0)
            assert [r.value for r in fetched.records()] == [b"v0", b"v1", b"v2"]
        finally:
            await writer.close()
            await reader.close()


def test_fetch_vectors() -> None:
    request = encode_request(m.FetchRequest("t", 0, 5, 65536, 1000), 7)
    assert request.hex() == (
        "0000002200090001000000070000"  # size, FETCH, version 1, correlation id 7, flags
        "000174"  # topic "t"
        "00000000"  # partition 0
        "0000000000000005"  # offset 5
        "00010000"  # max_bytes 65536
        "000003e8"  # max_wait_ms 1000
        "00"  # isolation 0: committed
    )
    response = encode_response(m.ApiKey.FETCH, 7, m.FetchResponse(0, 6, b"BATCH", 6))
    assert response.hex() == (
        "0000002d00090000000000070001"  # size, FETCH, version 0, correlation id 7, RESPONSE
        "0000"  # error code 0
        "0000000000000000"  # start_offset 0
        "0000000000000006"  # end_offset 6
        "00000005"
        + b"BATCH".hex()  # records (whole batches in a real answer)
        + "0000000000000006"  # next_offset 6
    )


async def test_offset_for_time_finds_where_a_reader_starts(
    client: headwater.Client, server: ServerProcess, topic_name: str
) -> None:
    """OFFSET_FOR_TIME (the request added with its message and its handler only): batches of
    five records at timestamps 1000, 2000, ... 10000; a time inside a batch's span gives that
    batch's first offset, a time past every record the readable end, -2 and -1 the start and
    the end, and reading from the answer with FETCH starts at the batch asked for."""
    await client.create_topic(topic_name, partitions=2, dispatch="reliable")
    peer = await RawPeer.open(server.address)
    try:
        for i in range(10):
            batch = build_batch(
                [(None, b"t%d-%d" % (i, j), []) for j in range(5)], timestamp=1000 * (i + 1)
            )
            answer = await peer.call(m.ProduceRequest(topic_name, 0, batch))
            assert answer == m.ProduceResponse(0, 5 * i)
    finally:
        await peer.close()
    assert await client.offset_for_time(topic_name, 0, 0) == 0
    assert await client.offset_for_time(topic_name, 0, 3000) == 10
    assert await client.offset_for_time(topic_name, 0, 3001) == 15
    assert await client.offset_for_time(topic_name, 0, 10_000) == 45
    assert await client.offset_for_time(topic_name, 0, 10_001) == 50  # nothing that recent
    assert await client.offset_for_time(topic_name, 0, 2**63 - 1) == 50  # the largest time
    assert await client.offset_for_time(topic_name, 0, -2) == 0
    assert await client.offset_for_time(topic_name, 0, -1) == 50
    assert await client.offset_for_time(topic_name, 1, 5000) == 0  # an empty partition: its end
    fetched = await client.fetch(topic_name, 0, await client.offset_for_time(topic_name, 0, 7500))
    assert fetched.records()[0].value == b"t7-0"
    with pytest.raises(InvalidPartition):
        await client.offset_for_time(topic_name, 2, 0)
    with pytest.raises(InvalidRequest, match="timestamp -3"):
        await client.offset_for_time(topic_name, 0, -3)
    with pytest.raises(UnknownTopic):
        await client.offset_for_time(topic_name + "-missing", 0, 0)
    await client.create_topic(topic_name + "-live", dispatch="non-reliable")
    with pytest.raises(NotSupported):
        await client.offset_for_time(topic_name + "-live", 0, 0)
