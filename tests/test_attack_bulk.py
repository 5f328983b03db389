"""Attacks with bulk: one request whose answer is large must not freeze every other client.

A canary connection sends API_VERSIONS in a loop while an attacker's connection makes the server
build a large answer (10,000 topics listed, a topic with thousands of subscriptions described);
the canary's slowest round trip is the stall everyone else saw (printed: on a loaded 2-core
machine it varies too much to assert). What is asserted is that the canary keeps being served
while the large answers are encoded (on a worker thread; the attacker's later frames wait, so its
memory stays bounded): on the loop, each encode froze everyone (1.35 s for 10,000 topics) and the
canary got about one answer between two listings. The attacker only splits the answers into
frames while the canary runs (decoding them in the test process would stall the test's own
loop) and decodes them afterwards.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError
from headwater.wire.frames import Frame, FrameDecoder
from headwater.wire.protocol import decode_response, encode_request
from tests.support.fuzzpeer import FuzzPeer, Outcome


async def _pipelined(peer: FuzzPeer, requests: list[m.Request], timeout: float) -> list[Outcome]:
    futures = []
    data = []
    for request in requests:
        _, encoded, future = peer.encode(request)
        data.append(encoded)
        futures.append(future)
    await peer.send(b"".join(data))
    _, pending = await asyncio.wait(futures, timeout=timeout)
    assert not pending, f"{len(pending)} of {len(requests)} requests unanswered in {timeout}s"
    return [f.result() for f in futures]


async def _bulk(address: str, requests: list[m.Request], timeout: float) -> list[Outcome]:
    """Send `requests` pipelined on a connection of their own; their answers in arrival order,
    decoded only once all have arrived."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"".join(encode_request(r, i + 1) for i, r in enumerate(requests)))
    decoder = FrameDecoder()
    frames: list[Frame] = []
    deadline = time.monotonic() + timeout
    try:
        while len(frames) < len(requests):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{len(frames)} of {len(requests)} answered in {timeout}s"
            data = await asyncio.wait_for(reader.read(1 << 20), remaining)
            assert data, "the server closed the connection"
            frames += [f for f in decoder.feed(data) if isinstance(f, Frame)]
    finally:
        writer.close()
    answers: list[Outcome] = []
    for frame in frames:
        try:
            answers.append(decode_response(frame.header, frame.body))
        except HeadwaterError as exc:
            answers.append(exc)
    return answers


async def _worst_stall(address: str, attack: asyncio.Future[object]) -> tuple[float, int]:
    """The slowest API_VERSIONS round trip of a canary while `attack` runs, and how many round
    trips it completed meanwhile."""
    canary = await FuzzPeer.open(9, address)
    worst = 0.0
    trips = 0
    try:
        for _ in range(100_000):
            if attack.done():
                break
            start = time.monotonic()
            answer = await canary.call(m.ApiVersionsRequest(), 30)
            assert isinstance(answer, m.ApiVersionsResponse), answer
            worst = max(worst, time.monotonic() - start)
            trips += 1
            await asyncio.sleep(0.002)
    finally:
        await canary.close()
    attack.result()
    return worst, trips


@pytest.mark.timeout(300)
def test_listing_many_topics_does_not_stall_others(tmp_path: Path) -> None:
    """LIST_TOPICS over 4,000 topics, five pipelined: encoding each answer took ~0.5 s on the
    loop (1.35 s for 10,000 topics), during which no other client was served."""
    server = ServerProcess(tmp_path / "data").start()

    async def main() -> None:
        peer = await FuzzPeer.open(0, server.address)
        for chunk in range(8):
            creates: list[m.Request] = [
                m.CreateTopicRequest(f"topic.{chunk}.{i}", 1, m.DispatchMode.NON_RELIABLE, ())
                for i in range(500)
            ]
            for answer in await _pipelined(peer, creates, 60):
                assert isinstance(answer, m.EmptyResponse), answer
        attack = asyncio.ensure_future(_bulk(server.address, [m.ListTopicsRequest()] * 5, 60))
        worst, trips = await _worst_stall(server.address, attack)
        print(f"worst canary round trip {worst * 1000:.0f} ms, {trips} round trips")
        # on the loop, each encode froze it: the canary got one answer between two listings
        assert trips >= 15, f"the canary completed {trips} round trips during the listings"
        for answer in attack.result():  # type: ignore[attr-defined]
            assert isinstance(answer, m.ListTopicsResponse) and len(answer.topics) == 4000
        await peer.close()

    try:
        asyncio.run(main())
    finally:
        server.kill()
