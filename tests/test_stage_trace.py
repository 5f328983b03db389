"""Stage traces and the loop's stall report (server/net/stage_trace.py, server/loop_lag.py) and the
benchmarks' breakdown of them (loadtest/stages.py): a real server started with --trace-every, real
produces and consumers, GET /debug/stages on its operator port. No timing is asserted, only that
every sampled message has its stages, in order, and that the breakdown adds up."""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import headwater
from headwater.server.loop_lag import TICK, LoopLag
from headwater.server.net.stage_trace import PER_BATCH, StageTrace
from headwater.testing import ServerProcess
from headwater.wire.messages import ProduceResponse
from loadtest import stages
from loadtest.harness import GcPauses
from tests.support.cli_process import hw

EVERY = 10
MESSAGES = 400  # in batches of 7: most batches hold no traced offset, none holds two


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    directory = tmp_path_factory.mktemp("traced")
    port_file = directory / "http.port"
    server = ServerProcess(
        directory / "data",
        extra_args=(
            *("--trace-every", str(EVERY)),
            *("--http-port", "0", "--http-port-file", str(port_file)),
        ),
    ).start()
    yield server, f"127.0.0.1:{port_file.read_text().strip()}"
    server.stop()


async def _round_trip(address: str, topic: str, dispatch: str) -> list[stages.Sample]:
    """MESSAGES values stamped with their send time, consumed; the sampled ones as the benchmark
    consumer keeps them."""
    samples: list[stages.Sample] = []
    async with await headwater.connect(address) as client:
        configs = {"fsync": "always"} if dispatch == "reliable" else None
        await client.create_topic(topic, dispatch=dispatch, configs=configs)  # type: ignore[arg-type]
        consumer = await client.subscribe(topic, "s")
        producer = client.producer(topic)
        for start in range(0, MESSAGES, 7):
            now = time.monotonic_ns().to_bytes(8, "big")
            await producer.send_batch([now] * min(7, MESSAGES - start))
            await producer.flush()
        received = 0
        while received < MESSAGES:
            batch = await consumer.next_batch(timeout=30)
            taken = time.monotonic_ns()
            received += len(batch)
            for offset, value in zip(batch.offsets(), batch.values(), strict=True):
                if offset % EVERY == 0:
                    assert value is not None
                    sent = int.from_bytes(value, "big")
                    samples.append((batch.partition, offset, sent, batch.received_ns, taken))
            await batch.ack_cumulative()
    return samples


@pytest.mark.parametrize("dispatch", ["reliable", "non-reliable"])
async def test_every_sampled_message_has_its_stages_in_order(
    traced: tuple[ServerProcess, str], dispatch: str
) -> None:
    server, http = traced
    topic = f"traced-{dispatch}"
    samples = await _round_trip(server.address, topic, dispatch)
    report = await asyncio.to_thread(stages.fetch, http)
    assert report["every"] == EVERY and report["dropped"] == 0
    times = stages.server_times(report, topic, "s")
    assert sorted(times) == [(0, offset) for offset in range(0, MESSAGES, EVERY)]
    for key, seen in times.items():
        assert {"read", "answered", "dispatched"} <= set(seen), key
        assert seen["read"] <= seen["answered"] and seen["read"] <= seen["dispatched"]
        if "appended" in seen:
            assert seen["read"] <= seen["appended"] <= seen["answered"]
    for _, offset, sent, received, taken in samples:
        seen = times[(0, offset)]
        assert sent <= seen["read"] and seen["dispatched"] <= received <= taken

    result = stages.breakdown(report, topic, "s", samples)
    assert result["joined"] == result["samples"] == MESSAGES // EVERY
    chain = [name for name in result["stages"] if name != stages.ACK]
    assert chain[0].startswith("enqueue->") and chain[-1] == "received->taken"
    for left, right in itertools.pairwise(chain):  # each stage ends where the next starts
        assert left.split("->")[1] == right.split("->")[0]
    for figures in result["stages"].values():
        assert figures["count"] == MESSAGES // EVERY
        assert (
            0 <= figures["p50_ms"] <= figures["p99_ms"] <= figures["p999_ms"] <= figures["max_ms"]
        )
    for tail in result["tail"].values():  # the stages of the chain add up to the end-to-end time
        spent = sum(ms for name, ms in tail["stages_ms"].items() if name != stages.ACK)
        assert spent == pytest.approx(tail["end_to_end_ms"], abs=0.01)
    # taken and emptied
    again = await asyncio.to_thread(stages.fetch, http)
    assert stages.server_times(again, topic, "s") == {}


async def test_the_stall_report_names_a_collection_inside_a_hold() -> None:
    lag = LoopLag()
    lag.start()
    try:
        await asyncio.sleep(0.05)
        lag.take_worst()  # start from nothing

        def hold() -> None:
            # 80 ms of this thread's CPU (not of the wall clock: a busy machine may preempt it),
            # a full collection inside
            until = time.thread_time() + 0.08
            gc.collect()
            while time.thread_time() < until:
                pass

        asyncio.get_running_loop().call_soon(hold)
        await asyncio.sleep(0.1)
    finally:
        lag.close()
    worst = lag.take_worst()
    assert worst == sorted(worst, key=lambda stall: stall["held_ms"], reverse=True)
    longest = worst[0]
    # the tick may fall due up to one TICK (10 ms) into the hold
    assert longest["held_ms"] >= 70 and longest["late_ms"] >= longest["held_ms"]
    # the collection ran inside the hold, which may have begun up to a TICK before the tick's
    # due time (from which `late` counts)
    assert longest["gc_generation"] == 2
    assert 0 < longest["gc_ms"] <= longest["late_ms"] + TICK * 1000
    assert lag.take_worst() == []


def test_sampled_offsets_and_the_bound() -> None:
    trace = StageTrace(10, limit=3)
    assert list(trace.sampled(0, 1)) == [0]
    assert list(trace.sampled(1, 9)) == []
    assert list(trace.sampled(5, 30)) == [10, 20, 30]
    # a batch's declared count is the client's word: the first PER_BATCH offsets at most
    assert len(trace.sampled(0, 2**31 - 1)) == PER_BATCH
    assert StageTrace(1).sampled(7, 2**31 - 1) == range(7, 7 + PER_BATCH)
    for offset in range(5):
        trace._add(("read", "t", 0, offset, 0, ""))
    events, dropped = trace.take()
    assert [event[3] for event in events] == [2, 3, 4] and dropped == 2
    assert trace.take() == ([], 0)
    with pytest.raises(ValueError, match="positive"):
        StageTrace(0)


def test_a_produce_read_before_tracing_began_has_no_read_time() -> None:
    """Tracing turned on between a frame's read and its handling: the connection's read time is
    0 (it was not taken), and the produce gets its later stages but no `read` of another time."""
    trace = StageTrace(10)
    batch = bytes(57) + (3).to_bytes(4, "big")  # a header declaring 3 records
    reply = ProduceResponse(partition=0, base_offset=9)  # offsets 9..11: 10 is traced
    for read_ns, stages_seen in (
        (0, ["appended", "answered"]),
        (5, ["read", "appended", "answered"]),
    ):
        produce = trace.produced("t", batch, reply, read_ns)
        assert produce is not None
        produce.answered(reply)
        events, _ = trace.take()
        assert [e[0] for e in events] == stages_seen and {e[3] for e in events} == {10}


def test_a_negative_trace_every_is_refused(tmp_path: Path) -> None:
    done = hw("serve", "--data-dir", str(tmp_path), "--port", "0", "--trace-every", "-1")
    assert done.returncode == 2, done.stderr
    assert "headwater: error: command line: server.trace_every must be >= 0" in done.stderr
    config = tmp_path / "headwater.toml"
    config.write_text("[server]\ntrace_every = -5\n")
    done = hw("serve", "--config", str(config))
    assert done.returncode == 2, done.stderr
    assert "server.trace_every must be >= 0 (0: off), not -5" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.fixture(scope="module")
def untraced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    directory = tmp_path_factory.mktemp("untraced")
    port_file = directory / "http.port"
    server = ServerProcess(
        directory / "data", extra_args=("--http-port", "0", "--http-port-file", str(port_file))
    ).start()
    yield server, f"127.0.0.1:{port_file.read_text().strip()}"
    server.stop()


def _get(http: str, query: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://{http}/debug/stages{query}", timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def test_tracing_is_turned_on_and_off_on_a_live_server(
    untraced: tuple[ServerProcess, str],
) -> None:
    server, http = untraced
    async with await headwater.connect(server.address) as client:
        await client.create_topic("live", dispatch="non-reliable")
        producer = client.producer("live")

        async def produce(count: int) -> None:
            for _ in range(count):
                await producer.send_batch([b"v"])
            await producer.flush()

        await produce(5)
        first = await asyncio.to_thread(stages.fetch, http, 5)  # nothing traced so far
        assert first["every"] == 0 and first["events"] == []
        await produce(20)  # offsets 5..24: 5, 10, 15 and 20 traced
        traced = await asyncio.to_thread(stages.fetch, http, 0)
        assert traced["every"] == 5
        offsets = sorted(o for _, o in stages.server_times(traced, "live", "s"))
        assert offsets == [5, 10, 15, 20]
        await produce(10)
        after = await asyncio.to_thread(stages.fetch, http)
        assert after["every"] == 0 and after["events"] == []
    # a refused query changes nothing
    assert (await asyncio.to_thread(stages.fetch, http, 7))["every"] == 0
    for query in (
        "?every=abc",
        "?every=-1",
        "?every=%C2%B2",  # a digit to str.isdigit, not to int()
        "?every=1&every=2",
        "?every=",
        "?x=1",
        "?every=1&x=1",
        "?every=9999999999999999999",
    ):
        status, body = await asyncio.to_thread(_get, http, query)
        assert status == 400 and b"every=N" in body, (query, status, body)
    assert (await asyncio.to_thread(stages.fetch, http))["every"] == 7


def test_a_client_collection_is_reported_with_its_generation() -> None:
    pauses = GcPauses()
    pauses.start()
    try:
        gc.collect(2)
        gc.collect(0)
        longest = pauses.longest_since_last()
        assert longest is not None and longest["ms"] >= 0
        assert {generation for generation, _ in pauses.pauses} >= {0, 2}
        assert pauses.longest_since_last() is None  # each collection is reported once
        summary = pauses.summary()
        assert summary["gen2"]["count"] >= 1 and summary["gen0"]["count"] >= 1
        for generation in summary.values():
            assert 0 <= generation["longest_ms"] <= generation["total_ms"]
    finally:
        gc.callbacks.remove(pauses._callback)
