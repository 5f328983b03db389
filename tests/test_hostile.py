"""No client can stall the others: hostile clients against a live server.

Each attack runs in a process of its own (tests/support/hostile_peer.py, plain blocking sockets), so
the client whose latency is measured does not share a loop or a GIL with it. While the attack is
under way (between the attacker's `attacking` line and the test's stop) a normal client produces
and consumes one message at a time, `SAMPLES` times: the attack lasts as long as that takes (and
at least `ATTACK_SECONDS`), so a loaded machine makes the test slower, never short of samples.
The p99 of those round trips must stay under `P99_LIMIT`, or under `BASELINE_FACTOR` times the
p99 the same client measured just before the attack if the machine is that slow: a stall (the
server busy with the attacker for seconds) is far above either (one retry of attack and
measurement if it is not: see `under_attack`). Each test also checks that the attack itself was
met the way docs/PROTOCOL.md says (refused with its error code, paused, timed out...).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import headwater
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import (
    ConnectionTimeout,
    DecompressedTooLarge,
    ErrorCode,
    TooManyConnections,
)
from headwater.wire.protocol import decode_response
from headwater.wire.records import build_batch
from tests.support.hostile_peer import MIN_BOMBS, bomb_batch
from tests.support.rawwire import RawPeer

P99_LIMIT = 0.050
BASELINE_FACTOR = 10  # a loaded machine's p99 before the attack, times this, is the limit then
ATTACK_SECONDS = 3.0  # at least: the attacks' own checks need it (e.g. 300 frame timeouts of 1 s)
SAMPLES = 200  # round trips measured under attack


def _config(tmp: Path, **server: Any) -> tuple[str, ...]:
    lines = ["[server]"] + [f"{key} = {json.dumps(value)}" for key, value in server.items()]
    path = tmp / "headwater.toml"
    path.write_text("\n".join(lines) + "\n")
    return ("--config", str(path))


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server of this module's own: attacks must not disturb other tests, nor each other."""
    tmp = tmp_path_factory.mktemp("hostile")
    process = ServerProcess(
        tmp / "data",
        extra_args=_config(tmp, max_connections=1000, frame_timeout=1.0, idle_timeout=60.0),
    ).start()
    # Many long topic names make every LIST_TOPICS answer ~60 KiB: pipelined, they add up fast.
    asyncio.run(_create_topics(process.address, [f"{'t' * 190}-{i}" for i in range(300)]))
    yield process
    process.kill()
    assert "Traceback" not in process.log()
    assert "[error" not in process.log()


async def _create_topics(address: str, names: list[str]) -> None:
    async with await headwater.connect(address) as client:
        await asyncio.gather(
            *(client.create_topic(name, dispatch="non-reliable") for name in names)
        )


class Attack:
    """A hostile peer process: `started` once it says so, `result` once it is done."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.hostile_peer", *args],
            stdin=subprocess.PIPE,  # a line (or its end) tells it to stop
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parent.parent,
        )

    async def started(self, timeout: float = 60.0) -> None:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.process.stdout.readline), timeout)
        assert line.strip() == "attacking", self._failure()

    def running(self) -> bool:
        return self.process.poll() is None

    def result(self, timeout: float = 60.0) -> dict[str, Any]:
        """Stop the attack (once it has lasted its minimum) and read its counts."""
        out, err = self.process.communicate("stop\n", timeout=timeout)
        assert self.process.returncode == 0, err
        parsed: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return parsed

    def output(self) -> str:
        out, err = self.process.communicate(timeout=10)
        return f"exit {self.process.returncode}, stdout {out!r}, stderr {err!r}"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def _failure(self) -> str:
        self.kill()
        _, err = self.process.communicate(timeout=10)
        return err


@pytest.fixture
async def normal(hostile_server: ServerProcess, topic_name: str) -> AsyncIterator[NormalClient]:
    client = await NormalClient.open(hostile_server.address, topic_name)
    yield client
    await client.close()


class NormalClient:
    """Produces one message, waits for its consumer to receive it, and times the round trip."""

    def __init__(
        self, client: headwater.Client, consumer: headwater.Consumer, producer: Any
    ) -> None:
        self.client = client
        self.consumer = consumer
        self.producer = producer

    @classmethod
    async def open(cls, address: str, topic: str, token: str | None = None) -> NormalClient:
        client = await headwater.connect(address, token=token)
        await client.create_topic(topic, dispatch="non-reliable")
        consumer = await client.subscribe(topic, "normal")
        producer = client.producer(topic, linger=0.0)
        self = cls(client, consumer, producer)
        for _ in range(20):  # warm up: connections open, code paths taken
            await self.round_trip()
        return self

    async def round_trip(self) -> float:
        begin = time.perf_counter()
        sent = await self.producer.send(b"ping")
        message = await self.consumer.receive(timeout=30)
        await sent
        assert message.value == b"ping"
        return time.perf_counter() - begin

    async def measure(self, count: int = SAMPLES) -> list[float]:
        samples = []
        for _ in range(count):
            samples.append(await self.round_trip())
            await asyncio.sleep(0.002)  # pacing, so the samples spread over the attack
        return samples

    async def measure_under(self, attack: Attack) -> list[float]:
        """Round trips while `attack` runs (it runs until told to stop: it must be running when
        sampling ends)."""
        await attack.started()
        samples = await self.measure()
        assert attack.running(), f"the attack ended before the measurement: {attack.output()}"
        return samples

    async def close(self) -> None:
        await self.producer.close()
        await self.client.close()


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def describe(samples: list[float]) -> str:
    return (
        f"p99 {p99(samples) * 1000:.1f} ms, p50 {statistics.median(samples) * 1000:.1f} ms, "
        f"max {max(samples) * 1000:.1f} ms, n={len(samples)}"
    )


async def under_attack(
    normal: NormalClient,
    *args: str,
    during: Callable[[], Awaitable[None]] | None = None,
) -> tuple[list[float], dict[str, Any]]:
    """Run the attack and measure the normal client meanwhile; assert its p99 under the limit:
    50 ms, or ten times the p99 it measured just before the attack on a machine that slow.

    The test machine is shared: another process can take the CPU for tens of milliseconds at
    any time. So a p99 over the limit gets one more baseline, attack and measurement; a real
    stall (the server busy with the attacker for seconds) fails both by far. `during` runs after
    the measurement, while the attack is still under way.
    """
    attempts = []
    for _ in range(2):
        before = await normal.measure()
        limit = max(P99_LIMIT, BASELINE_FACTOR * p99(before))
        attack = Attack(*args)
        try:
            samples = await normal.measure_under(attack)
            if during is not None:
                await during()
            result = attack.result()
        finally:
            attack.kill()
        attempts.append(
            f"{describe(samples)}; limit {limit * 1000:.1f} ms (before: {describe(before)})"
        )
        if p99(samples) < limit:
            print(f"{args[0]}: {attempts}")  # shown with pytest -rP
            return samples, result
    raise AssertionError(f"p99 over the limit under attack: {attempts}")


# Compression bomb


def cpu_seconds(server: ServerProcess) -> float:
    """The server process's user + system CPU time so far (Linux: /proc/PID/stat)."""
    assert server.process is not None
    stat = Path(f"/proc/{server.process.pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_compression_bomb_is_refused_quickly_with_bounded_memory(
    fresh_server: ServerProcess, topic_name: str
) -> None:
    peer = await RawPeer.open(fresh_server.address)
    await peer.call(m.CreateTopicRequest(topic_name))
    batch = bomb_batch()  # 96 KiB of zstd that inflates to 3 GiB
    assert len(batch) < 100 * 1024
    before = cpu_seconds(fresh_server)
    answer = await peer.call(m.ProduceRequest(topic_name, -1, batch))
    assert isinstance(answer, DecompressedTooLarge), answer
    assert "67108864-byte limit" in answer.message
    # CPU, not elapsed time (a loaded machine stretches that): inflating the 64 MiB limit costs
    # tens of milliseconds, inflating all 3 GiB seconds
    assert cpu_seconds(fresh_server) - before < 1.0
    assert fresh_server.peak_rss() < 512 * 1024 * 1024
    # the connection carries on
    answer = await peer.call(m.ProduceRequest(topic_name, -1, build_batch([(None, b"ok", [])])))
    assert isinstance(answer, m.ProduceResponse)
    await peer.close()


async def test_compression_bombs_do_not_stall_a_normal_client(
    hostile_server: ServerProcess, normal: NormalClient, topic_name: str
) -> None:
    _, result = await under_attack(
        normal, "bomb", hostile_server.address, str(ATTACK_SECONDS), topic_name
    )
    assert set(result["codes"]) == {str(int(ErrorCode.DECOMPRESSED_TOO_LARGE))}, result
    assert result["codes"][str(int(ErrorCode.DECOMPRESSED_TOO_LARGE))] >= MIN_BOMBS, result


# A client that pipelines and never reads


async def test_never_reading_pipeliner_is_paused_not_buffered(
    hostile_server: ServerProcess, normal: NormalClient
) -> None:
    before = hostile_server.peak_rss()
    _, result = await under_attack(normal, "pipeline", hostile_server.address, str(ATTACK_SECONDS))
    grown = hostile_server.peak_rss() - before
    # 5,000 answers of ~60 KiB would be ~300 MiB; the server stops reading at 4 MiB unsent.
    assert grown < 64 * 1024 * 1024, f"server grew {grown >> 20} MiB"
    assert result["blocked"], result


# Idle sockets, the connection cap, and running out of file descriptors


async def test_idle_sockets_past_the_connection_cap(
    hostile_server: ServerProcess, normal: NormalClient
) -> None:

    async def newcomer_is_refused() -> None:
        """Told why, and closed: not left hanging."""
        late = await RawPeer.open(hostile_server.address)
        frame = await late.frame()
        assert frame.header.correlation_id == 0
        with pytest.raises(TooManyConnections):
            decode_response(frame.header, frame.body)
        assert await late.closed_by_server()
        await late.close()

    _, result = await under_attack(
        normal,
        "idle",
        hostile_server.address,
        str(ATTACK_SECONDS),
        "4200",
        during=newcomer_is_refused,
    )
    refused = result["codes"].get(str(int(ErrorCode.TOO_MANY_CONNECTIONS)), 0)
    assert refused >= 3000, result  # 4,200 tried, the cap is 1,000 (tests hold a few)


def _few_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))


async def test_accept_loop_survives_running_out_of_descriptors(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", preexec_fn=_few_fds).start()
    try:
        attack = Attack("idle", server.address, "3", "400")
        try:
            await attack.started()
            result = attack.result()
        finally:
            attack.kill()
        assert result["open"] + result["failed"] == 400
        assert "server.out_of_fds" in server.log()
        # the attacker's sockets are closed now: the server accepts again, by itself
        async with await headwater.connect(server.address) as client:
            await client.create_topic("after", dispatch="non-reliable")
            assert [t.name for t in await client.list_topics()] == ["after"]
        assert server.alive()
    finally:
        server.kill()


# Incomplete frames and idle connections


async def test_incomplete_frames_do_not_stall_a_normal_client(
    hostile_server: ServerProcess, normal: NormalClient
) -> None:
    _, result = await under_attack(
        normal, "partial", hostile_server.address, str(ATTACK_SECONDS), "300"
    )
    # frame_timeout is 1 s: each connection is closed with CONNECTION_TIMEOUT and replaced
    timed_out = result["codes"].get(str(int(ErrorCode.CONNECTION_TIMEOUT)), 0)
    assert timed_out >= 300, result


async def test_timeouts_close_idle_and_stuck_connections(tmp_path: Path) -> None:
    server = ServerProcess(
        tmp_path / "data", extra_args=_config(tmp_path, idle_timeout=1.0, frame_timeout=1.0)
    ).start()
    try:
        idle = await RawPeer.open(server.address)
        stuck = await RawPeer.open(server.address)
        await stuck.send(b"\x00\x00\x00\x20\x00\x0c")  # 6 bytes of a 36-byte frame
        consumer = await RawPeer.open(server.address)
        await consumer.call(m.CreateTopicRequest("t"))
        subscribed = await consumer.call(
            m.SubscribeRequest("t", "s", m.SubscriptionType.EXCLUSIVE, "c", initial_credits=10)
        )
        assert isinstance(subscribed, m.SubscribeResponse)
        for peer, expected in ((idle, "idle"), (stuck, "frame")):
            frame = await peer.frame(timeout=5)
            assert frame.header.correlation_id == 0
            with pytest.raises(ConnectionTimeout, match=expected):
                decode_response(frame.header, frame.body)
            assert await peer.closed_by_server()
        # a connection with a consumer is not idle, however quiet: it still gets deliveries
        async with (
            await headwater.connect(server.address) as producer_client,
            producer_client.producer("t") as producer,
        ):
            await (await producer.send(b"late"))
        deliveries = await consumer.deliveries(records=1)
        assert len(deliveries) == 1
        await consumer.close()
    finally:
        server.kill()


# A large pipelined read


async def test_large_pipelined_reads_do_not_stall_a_normal_client(
    hostile_server: ServerProcess, normal: NormalClient, topic_name: str
) -> None:
    flooded = f"{topic_name}-flood"
    await normal.client.create_topic(flooded, dispatch="non-reliable")
    _, result = await under_attack(
        normal, "flood", hostile_server.address, str(ATTACK_SECONDS), flooded
    )
    assert result["frames"] > 100_000 and not result["codes"], result


# Bad frames


async def test_bad_frames_are_answered_and_their_logging_rate_limited(
    hostile_server: ServerProcess,
) -> None:
    size_before = hostile_server.log_path.stat().st_size
    attack = Attack("badframes", hostile_server.address, "60", "110000")
    try:
        await attack.started()
        result = attack.result()
    finally:
        attack.kill()
    assert result["codes"] == {str(int(ErrorCode.UNSUPPORTED_API)): 110_000}
    grown = hostile_server.log_path.stat().st_size - size_before
    assert grown < 20_000, f"{grown} bytes of log for 110,000 bad frames"
