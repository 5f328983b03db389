"""Issue 37's bounds on what one native connection makes the server hold, over real TCP to a real
server (`serve` on this test's loop, an ephemeral port) whose own counters are read: bytes read
per connection, requests waiting, the memory budget, a topic's stored messages.

- A producer pipelining 10,000 produces into a topic held busy (as a delete or a take-over holds
  it) is back-pressured: at MAX_WAITING_REQUESTS waiting the connection is not read, and it
  resumes and every produce is answered once the topic is free.

No step waits for time to pass: each waits for an event (an answer, the connection's pause), and
"nothing more was read" is checked after a round trip on another connection, which the server
answers only after handling every read already at hand.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import headwater
from headwater.server.config import ServerConfig
from headwater.wire import messages as m
from headwater.wire.limits import MAX_WAITING_REQUESTS
from headwater.wire.protocol import encode_request
from headwater.wire.records import build_batch
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
