"""Issue 37's bounds on what one native connection makes the server hold, over real TCP to a real
server (`serve` on this test's loop, an ephemeral port) whose own counters are read: bytes read
per connection, requests waiting, the memory budget, a topic's stored messages.

- A producer pipelining 10,000 produces into a topic held busy (as a delete or a take-over holds
  it) is back-pressured: at MAX_WAITING_REQUESTS waiting the connection is not read, and it
  resumes and every produce is answered once the topic is free.
- A principal over its produce quota is muted: none of its connections is read for the throttle
  time, a new one not past its AUTHENTICATE; the others were each read a batch, each a burst.

No step waits for time to pass: each waits for an event (an answer, the connection's pause), and
"nothing more was read" is checked after a round trip on another connection, which the server
answers only after handling every read already at hand.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import headwater
from headwater.server.catalog.topic_catalog import REFREEZE_PARTITIONS
from headwater.server.config import SecurityConfig, ServerConfig
from headwater.server.security.tokens import create
from headwater.wire import messages as m
from headwater.wire.limits import MAX_WAITING_REQUESTS
from headwater.wire.protocol import decode_response, encode_request
from headwater.wire.records import Compression, build_batch
from tests.support.helpers import eventually
from tests.support.in_process import InProcessServer, in_process_server
from tests.support.rawwire import RawPeer

PRODUCES = 10_000
VALUE = 2048  # 10,000 produces: 20 MB, far more than the sockets' buffers hold


def _vm_hwm() -> int:
    """This process's peak resident memory (the server runs in it), in bytes."""
    status = Path("/proc/self/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


async def _open(server: InProcessServer) -> tuple[RawPeer, str]:
    """A raw connection and its name on the server's side (host:port of the client's end)."""
    peer = await RawPeer.open(server.address)
    host, port = peer.writer.get_extra_info("sockname")[:2]
    return peer, f"{host}:{port}"


@pytest.fixture
async def plain(tmp_path: Path) -> AsyncIterator[InProcessServer]:
    async with in_process_server(ServerConfig(data_dir=tmp_path / "data")) as server:
        yield server


async def test_a_producer_pipelining_into_a_busy_topic_is_back_pressured(
    plain: InProcessServer,
) -> None:
    async with await headwater.connect(plain.address) as admin:
        await admin.create_topic("busy", dispatch="non-reliable")
        turn = plain.catalog.turn("busy")  # held, as a delete in progress holds it
        await turn.__aenter__()
        peer, name = await _open(plain)
        assert isinstance(await peer.call(m.ApiVersionsRequest()), m.ApiVersionsResponse)
        connection = plain.connection(name)
        request = m.ProduceRequest("busy", 0, build_batch([(None, b"x" * VALUE, ())]))
        frame = len(encode_request(request, 1))
        peak_before = _vm_hwm()

        async def pipeline() -> None:
            for correlation in range(2, PRODUCES + 2):
                peer.writer.write(encode_request(request, correlation))
                await peer.writer.drain()

        sending = asyncio.create_task(pipeline())
        paused = asyncio.create_task(
            eventually(
                lambda: connection.waiting >= MAX_WAITING_REQUESTS and not connection.reading,
                what="the connection paused at its waiting requests' cap",
            )
        )
        await asyncio.wait([sending, paused], return_when=asyncio.FIRST_COMPLETED)
        assert not sending.done(), "every produce was read while its topic was busy"
        await paused
        await admin.list_topics()  # the server has handled whatever it had read by now
        assert connection.waiting == MAX_WAITING_REQUESTS
        assert not connection.reading
        # the waiting produces, one read's frames queued behind them, a frame in part
        assert connection.bytes_read <= (MAX_WAITING_REQUESTS + 2) * frame + 256 * 1024
        assert plain.broker.memory.used >= MAX_WAITING_REQUESTS * (frame - 64)  # charged
        assert _vm_hwm() - peak_before < 16 * 1024 * 1024
        assert plain.catalog.topics["busy"].messages_in == 0

        await turn.__aexit__(None, None, None)
        await asyncio.wait_for(sending, 120)  # a hang bound
        answers = [await peer.response(timeout=60) for _ in range(PRODUCES)]
        assert all(isinstance(a, m.ProduceResponse) for a in answers)
        assert plain.catalog.topics["busy"].messages_in == PRODUCES
        await eventually(lambda: connection.waiting == 0, what="no request left waiting")
        assert plain.broker.memory.used == 0
        await peer.close()


QUOTA = 100_000  # bytes per second: a 1 MiB batch puts the principal ~10 s in debt
BATCH = 1024 * 1024


@pytest.fixture
async def secure(tmp_path: Path) -> AsyncIterator[tuple[InProcessServer, Path, str]]:
    tokens = tmp_path / "tokens.json"
    _, admin = create(tokens, "admin", ("all:*",))
    assert admin is not None
    config = ServerConfig(data_dir=tmp_path / "data", security=SecurityConfig(auth_tokens=tokens))
    async with in_process_server(config) as server:
        yield server, tokens, admin


async def _authenticated(server: InProcessServer, token: str) -> tuple[RawPeer, str]:
    peer, name = await _open(server)
    answer = await peer.call(m.AuthenticateRequest("token", token.encode()))
    assert isinstance(answer, m.AuthenticateResponse), answer
    return peer, name


async def test_a_principal_over_its_produce_quota_is_muted_on_every_connection(
    secure: tuple[InProcessServer, Path, str],
) -> None:
    server, tokens, admin_token = secure
    _, token = create(tokens, "slow", ("produce:q",), quotas={"produce_bytes_per_second": QUOTA})
    assert token is not None
    async with await headwater.connect(server.address, token=admin_token) as admin:
        await admin.create_topic("q", dispatch="non-reliable")
        first, _ = await _authenticated(server, token)
        others = [await _authenticated(server, token) for _ in range(4)]
        batch = build_batch([(None, b"x" * BATCH, ())])
        request = m.ProduceRequest("q", 0, batch)
        # the burst is spent and more: ~10 s of debt
        assert isinstance(await first.call(request), m.ProduceResponse)
        topic = server.catalog.topics["q"]
        assert topic.messages_in == 1
        read_before = {name: server.connection(name).bytes_read for _, name in others}
        for peer, _ in others:  # clients that ignore THROTTLE: 4 MiB each, not drained
            for correlation in range(2, 6):
                peer.writer.write(encode_request(request, correlation))
        late, late_name = await _authenticated(server, token)  # a connection opened meanwhile
        late.writer.write(encode_request(request, 2))
        await admin.list_topics()  # the server has handled whatever it had read by now
        for _, name in others:
            connection = server.connection(name)
            assert connection.bytes_read == read_before[name], f"{name} was read while muted"
            assert not connection.reading
        late_connection = server.connection(late_name)
        assert late_connection.bytes_read < 1024  # its AUTHENTICATE, nothing more
        assert topic.messages_in == 1  # nothing stored past the first batch
        for peer, _ in [*others, (late, late_name), (first, "")]:
            peer.writer.transport.abort()


async def test_a_muted_principal_is_read_again_once_its_debt_is_paid(
    secure: tuple[InProcessServer, Path, str],
) -> None:
    server, tokens, admin_token = secure
    rate = 1024 * 1024  # the debt below lasts ~0.25 s
    _, token = create(tokens, "brief", ("produce:q",), quotas={"produce_bytes_per_second": rate})
    assert token is not None
    async with await headwater.connect(server.address, token=admin_token) as admin:
        await admin.create_topic("q", dispatch="non-reliable")
    first, _ = await _authenticated(server, token)
    second, second_name = await _authenticated(server, token)
    big = m.ProduceRequest("q", 0, build_batch([(None, b"x" * (rate + rate // 4), ())]))
    assert isinstance(await first.call(big), m.ProduceResponse)
    small = m.ProduceRequest("q", 0, build_batch([(None, b"y", ())]))
    answer = await second.call(small)  # held while muted, then read and answered
    assert isinstance(answer, m.ProduceResponse), answer
    assert server.connection(second_name).reading
    assert server.catalog.topics["q"].messages_in == 2
    await first.close()
    await second.close()


async def test_a_compressed_produce_waits_behind_the_busy_topics_line_in_order(
    plain: InProcessServer,
) -> None:
    """A compressed batch is validated by the connection itself and handed to the broker past
    `handle`: it appended at once while the producer's earlier plain batch waited in the busy
    topic's line, overtaking it (and appending to a topic a delete held)."""
    async with await headwater.connect(plain.address) as admin:
        await admin.create_topic("ordered", dispatch="reliable")
        turn = plain.catalog.turn("ordered")  # held, as a delete in progress holds it
        await turn.__aenter__()
        peer, _ = await _open(plain)
        first = m.ProduceRequest("ordered", 0, build_batch([(None, b"first", ())]))
        second = m.ProduceRequest(
            "ordered", 0, build_batch([(None, b"second", ())], compression=Compression.GZIP)
        )
        peer.writer.write(
            encode_request(first, 1)
            + encode_request(second, 2)
            + encode_request(m.ApiVersionsRequest(), 3)  # answered once both were handled
        )
        await peer.writer.drain()
        answers: dict[int, m.Response] = {}
        while 3 not in answers:
            frame = await peer.frame(60)
            answers[frame.header.correlation_id] = decode_response(frame.header, frame.body)
        assert plain.catalog.topics["ordered"].messages_in == 0  # both wait for the topic
        await turn.__aexit__(None, None, None)
        while len(answers) < 3:
            frame = await peer.frame(60)
            answers[frame.header.correlation_id] = decode_response(frame.header, frame.body)
        one, two = answers[1], answers[2]
        assert isinstance(one, m.ProduceResponse) and isinstance(two, m.ProduceResponse)
        assert one.base_offset < two.base_offset
        await peer.close()


async def test_partitions_made_after_start_up_are_frozen_out_of_the_collector(
    plain: InProcessServer,
) -> None:
    """What a partition holds lives as long as it; start-up froze what it built out of the
    cyclic collector (gc.freeze), and 10,000 partitions created afterwards made every full
    collection walk them again: 300-400 ms stalls of every client (loadtest/hostile_bench.py).
    Every REFREEZE_PARTITIONS partitions created or added, what the server holds is frozen."""
    async with await headwater.connect(plain.address) as admin:
        await admin.create_topic(
            "wide", partitions=REFREEZE_PARTITIONS - 1, dispatch="non-reliable"
        )
        wide = plain.catalog.topics["wide"]
        assert gc.is_tracked(wide)
        assert any(o is wide for o in gc.get_objects())  # in a generation: walked by collections
        await admin.create_partitions("wide", REFREEZE_PARTITIONS)
        assert not any(o is wide for o in gc.get_objects())  # in none: frozen
