"""Stage traces and the loop's stall report (server/net/stage_trace.py, server/loop_lag.py) and the
benchmarks' breakdown of them (loadtest/stages.py): a real server started with --trace-every, real
produces and consumers, GET /debug/stages on its operator port. No timing is asserted, only that
every sampled message has its stages, in order, and that the breakdown adds up."""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import headwater
from headwater.server.loop_lag import TICK, LoopLag
from headwater.server.net.stage_trace import PER_BATCH, StageTrace
from headwater.testing import ServerProcess
from loadtest import stages
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
