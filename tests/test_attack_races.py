"""Attacks by pipelining: admin requests racing acks and each other on one reliable topic.

Each test writes its requests in one `write` (FuzzPeer), so the server reads them together, and
then requires every request answered within a bound and the server still serving.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from pathlib import Path

import pytest

from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError
from headwater.wire.records import build_batch
from tests.support.fuzzpeer import FuzzPeer, Outcome

ANSWER_S = 5.0


def _reliable(name: str) -> m.CreateTopicRequest:
    return m.CreateTopicRequest(
        name, 1, m.DispatchMode.RELIABLE, (m.ConfigEntry("fsync", "always"),)
    )


def _subscribe(topic: str, sub: str, credits: int = 100) -> m.SubscribeRequest:
    return m.SubscribeRequest(
        topic,
        sub,
        m.SubscriptionType.SHARED,
        "c",
        0,
        credits,
        m.SubscriptionSettings(start=m.StartPosition.EARLIEST, ack_timeout_ms=500),
    )


async def _pipelined(peer: FuzzPeer, requests: list[m.Request]) -> list[Outcome]:
    futures = []
    data = []
    for request in requests:
        _, encoded, future = peer.encode(request)
        data.append(encoded)
        futures.append(future)
    await peer.send(b"".join(data))
    _, pending = await asyncio.wait(futures, timeout=ANSWER_S)
    assert not pending, (
        f"{len(pending)} of {len(requests)} pipelined requests unanswered within {ANSWER_S}s: "
        + ", ".join(
            type(r).__name__ for r, f in zip(requests, futures, strict=True) if not f.done()
        )
    )
    return [f.result() for f in futures]


def _ok(outcome: Outcome) -> bool:
    return not isinstance(outcome, HeadwaterError)


@pytest.mark.timeout(120)
def test_seek_delete_subscription_and_acks_pipelined(tmp_path: Path) -> None:
    """SEEK, DELETE_SUBSCRIPTION, ACKs, re-SUBSCRIBE in every order, pipelined, while records are
    delivered: every request answered, and afterwards the topic still serves a new subscriber."""
    server = ServerProcess(tmp_path / "data").start()

    async def main() -> None:
        peer = await FuzzPeer.open(0, server.address)
        other = await FuzzPeer.open(1, server.address)
        assert _ok(await peer.call(_reliable("t"), ANSWER_S))
        batch = build_batch([(None, f"v{i}".encode(), ()) for i in range(20)])
        assert _ok(await peer.call(m.ProduceRequest("t", 0, batch), ANSWER_S))
        kinds = ["seek", "delete", "ack", "nack", "subscribe"]
        for round_, order in enumerate(itertools.permutations(kinds, 4)):
            if round_ >= 40:
                break
            sub = await peer.call(_subscribe("t", "s"), ANSWER_S)
            assert isinstance(sub, m.SubscribeResponse), sub
            cid = sub.consumer_id
            deadline = asyncio.get_running_loop().time() + ANSWER_S
            while not peer.pushes_for(cid).records:  # something delivered, unacked
                assert asyncio.get_running_loop().time() < deadline, "nothing delivered"
                await peer.arrival(0.5)
            entries = tuple(m.AckEntry(p, r.offset) for p, _, r in peer.pushes_for(cid).records)
            requests: dict[str, m.Request] = {
                "seek": m.SeekRequest("t", "s", m.StartPosition.EARLIEST),
                "delete": m.DeleteSubscriptionRequest("t", "s"),
                "ack": m.AckRequest(cid, entries[:5]),
                "nack": m.NackRequest(cid, entries[5:8], 10),
                "subscribe": _subscribe("t", "s"),
            }
            await _pipelined(peer, [requests[k] for k in order])
            # a second connection races a seek of its own against the first one's
            await _pipelined(other, [m.SeekRequest("t", "s", m.StartPosition.LATEST)])
            await _pipelined(peer, [m.DeleteSubscriptionRequest("t", "s")])
        # the server still serves: a fresh subscription reads all 20 from earliest
        sub = await other.call(_subscribe("t", "fresh"), ANSWER_S)
        assert isinstance(sub, m.SubscribeResponse), sub
        deadline = asyncio.get_running_loop().time() + ANSWER_S
        while len({r.offset for _, _, r in other.pushes_for(sub.consumer_id).records}) < 20:
            assert asyncio.get_running_loop().time() < deadline, "fresh subscriber starved"
            await other.arrival(0.5)
        await peer.close()
        await other.close()

    try:
        asyncio.run(main())
        assert "Traceback" not in server.log()
    finally:
        server.kill()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.timeout(120)
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_subscription_left_with_unacked_messages_stays_idle(tmp_path: Path) -> None:
    """Reliable subscriptions whose consumer left holding unacked messages, after a kill -9 and
    restart, have redeliveries due and nobody to send them to: the server must stay idle (the
    kill -9 attack's log showed such a subscription's pump waking every ~2 ms; not reproduced
    in this smaller setting, which passes)."""
    server = ServerProcess(tmp_path / "data").start()

    async def main() -> None:
        peer = await FuzzPeer.open(0, server.address)
        assert _ok(await peer.call(_reliable("t"), ANSWER_S))
        batch = build_batch([(None, f"v{i}".encode(), ()) for i in range(50)])
        assert _ok(await peer.call(m.ProduceRequest("t", 0, batch), ANSWER_S))
        for name in ("a", "b", "c"):
            subscribe = m.SubscribeRequest(
                "t",
                name,
                m.SubscriptionType.EXCLUSIVE,
                "c",
                0,
                100,
                m.SubscriptionSettings(start=m.StartPosition.EARLIEST),
            )
            sub = await peer.call(subscribe, ANSWER_S)
            assert isinstance(sub, m.SubscribeResponse), sub
            deadline = asyncio.get_running_loop().time() + ANSWER_S
            while len(peer.pushes_for(sub.consumer_id).records) < 50:
                assert asyncio.get_running_loop().time() < deadline, "nothing delivered"
                await peer.arrival(0.5)
        await peer.close()

    try:
        asyncio.run(main())
        server.kill()
        server.start()  # the subscriptions come back with their unacked messages, no consumer
        assert server.process is not None
        before = _cpu_seconds(server.process.pid)
        time.sleep(2.0)  # the measurement window, not a synchronisation
        used = _cpu_seconds(server.process.pid) - before
        assert used < 0.4, f"an idle server used {used:.2f} s of CPU in 2 s"
    finally:
        server.kill()
