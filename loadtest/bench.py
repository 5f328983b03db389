"""End-to-end benchmark: a server process, a producer process and a consumer process on loopback.

Two measurements on a fresh non-reliable topic:

- throughput: the producer sends `--messages` values of `--size` bytes as fast as the client
  batches them; the consumer counts what arrives. Rate = messages / (last received - first sent).
- latency: the producer sends at a fixed `--rate` for `--seconds`, each value carrying its send time
  (CLOCK_MONOTONIC, shared by the processes); the consumer records receive - send: p50, p99, max.

Progress goes to stderr once a second; the result is one JSON object on stdout (append it to
loadtest/results/ and quote it in docs/BENCHMARKS.md). Everything runs on 127.0.0.1 and every
loop is bounded by a message count and a deadline.

    python -m loadtest.bench --messages 2000000 --size 100 --rate 50000 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import headwater
from headwater.testing import ServerProcess

_STAMP = struct.Struct(">q")
IDLE_STOP = 3.0  # seconds without a message after which a consumer stops counting


def _progress(label: str, done: int, total: int, started: float) -> None:
    elapsed = time.monotonic() - started
    rate = done / elapsed if elapsed else 0.0
    print(f"  {label}: {done:,}/{total:,} ({rate:,.0f} msg/s)", file=sys.stderr, flush=True)


async def _consume(
    address: str,
    topic: str,
    total: int,
    deadline: float,
    ready: Any,
    out: Any,
    measure_latency: bool,
) -> None:
    """Receive until `total` arrived, nothing came for IDLE_STOP seconds, or the deadline."""
    async with await headwater.connect(address) as client:
        consumer = await client.subscribe(topic, "bench", prefetch=20_000)
        ready.set()
        received = 0
        latencies: list[int] = []
        first = 0.0
        started = time.monotonic()
        next_report = started + 1
        while received < total and time.monotonic() < deadline:
            try:
                messages = await consumer.receive_batch(5000, timeout=IDLE_STOP)
            except TimeoutError:
                break
            now = time.monotonic_ns()
            if not received:
                first = now / 1e9
            received += len(messages)
            await consumer.ack_cumulative(messages[-1])  # one ack per batch (single partition)
            if measure_latency:
                unpack = _STAMP.unpack_from
                latencies.extend(now - unpack(m.value)[0] for m in messages if m.value)
            else:
                # touch every value, as an application would
                sum(len(m.value) for m in messages if m.value)
            if time.monotonic() >= next_report:
                _progress("consumed", received, total, started)
                next_report += 1
        last = time.monotonic() if received >= total else time.monotonic() - IDLE_STOP
        out.put({"received": received, "first": first, "last": last, "latencies_ns": latencies})


def _consumer_main(*args: Any) -> None:
    _run(_consume(*args))


def _start_consumer(
    address: str, topic: str, messages: int, seconds: float, measure_latency: bool
) -> tuple[Any, Any]:
    """A consumer process, subscribed before this returns; its result comes on the queue."""
    ready, out = mp.Event(), mp.Queue()
    consumer = mp.Process(
        target=_consumer_main,
        args=(address, topic, messages, time.monotonic() + seconds, ready, out, measure_latency),
    )
    consumer.start()
    if not ready.wait(30):
        raise RuntimeError("consumer did not subscribe")
    return consumer, out


def _run(coroutine: Any) -> Any:
    """Clients run on uvloop, as a throughput-minded application would."""
    import uvloop

    return uvloop.run(coroutine)


async def _produce_throughput(address: str, topic: str, total: int, size: int) -> dict[str, Any]:
    async with await headwater.connect(address) as client:
        producer = client.producer(topic, batch_size=64 * 1024)
        value = b"x" * size
        started = time.monotonic()
        next_report = started + 1
        last_future = None
        for i in range(total):
            last_future = await producer.send(value)
            if i % 1024 == 0 and time.monotonic() >= next_report:
                _progress("produced", i, total, started)
                next_report += 1
        await producer.flush()
        assert last_future is not None
        await last_future
        return {"started": started, "finished": time.monotonic()}


async def _produce_at_rate(address: str, topic: str, rate: int, seconds: float, size: int) -> int:
    """Send `rate` msgs/s in 1 ms ticks; returns how many were sent."""
    async with await headwater.connect(address) as client:
        producer = client.producer(topic)
        padding = b"x" * max(0, size - _STAMP.size)
        per_tick = max(1, rate // 1000)
        ticks = int(seconds * 1000)
        started = time.monotonic()
        sent = 0
        for tick in range(ticks):
            for _ in range(per_tick):
                await producer.send(_STAMP.pack(time.monotonic_ns()) + padding)
            sent += per_tick
            delay = started + (tick + 1) / 1000 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await producer.flush()
        return sent


def _percentile(sorted_values: list[int], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, int(fraction * len(sorted_values)))
    return sorted_values[index] / 1e6


def run_throughput(address: str, messages: int, size: int) -> dict[str, Any]:
    topic = f"bench-throughput-{os.getpid()}-{time.time_ns()}"
    asyncio.run(_create_topic(address, topic))
    consumer, out = _start_consumer(address, topic, messages, 300, False)
    produced = _run(_produce_throughput(address, topic, messages, size))
    result = out.get(timeout=330)
    consumer.join(30)
    elapsed = result["last"] - produced["started"]
    return {
        "messages": messages,
        "received": result["received"],
        "lost": messages - result["received"],
        "value_size": size,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(result["received"] / elapsed),
        "mb_per_s": round(result["received"] * size / elapsed / 1e6, 1),
        "producer_msgs_per_s": round(messages / (produced["finished"] - produced["started"])),
    }


def run_latency(address: str, rate: int, seconds: float, size: int) -> dict[str, Any]:
    topic = f"bench-latency-{os.getpid()}-{time.time_ns()}"
    asyncio.run(_create_topic(address, topic))
    expected = (max(1, rate // 1000)) * int(seconds * 1000)
    consumer, out = _start_consumer(address, topic, expected, seconds + 30, True)
    sent = _run(_produce_at_rate(address, topic, rate, seconds, size))
    result = out.get(timeout=seconds + 60)
    consumer.join(30)
    latencies = sorted(result["latencies_ns"])
    return {
        "rate": rate,
        "seconds": seconds,
        "sent": sent,
        "received": result["received"],
        "lost": sent - result["received"],
        "p50_ms": round(_percentile(latencies, 0.50), 3),
        "p99_ms": round(_percentile(latencies, 0.99), 3),
        "max_ms": round(_percentile(latencies, 1.0), 3),
    }


async def _create_topic(
    address: str, topic: str, dispatch: str = "non-reliable", fsync: str | None = None
) -> None:
    async with await headwater.connect(address) as client:
        configs = {"fsync": fsync} if fsync else None
        await client.create_topic(topic, dispatch=dispatch, configs=configs)  # type: ignore[arg-type]


async def _produce_reliable(
    address: str, topic: str, total: int, size: int, producers: int, flush_every: int
) -> dict[str, Any]:
    """`producers` connections, each sending its share and waiting for acks every `flush_every`."""
    value = b"r" * size
    share = total // producers
    started = time.monotonic()
    done = [0]

    async def one_producer() -> None:
        async with await headwater.connect(address) as client:
            producer = client.producer(topic, batch_size=1 << 20)
            for start in range(0, share, flush_every):
                for _ in range(min(flush_every, share - start)):
                    await producer.send(value)
                await producer.flush()
                done[0] += min(flush_every, share - start)

    async def report() -> None:
        while True:
            await asyncio.sleep(1)
            _progress("acked", done[0], share * producers, started)

    reporter = asyncio.create_task(report())
    await asyncio.gather(*(one_producer() for _ in range(producers)))
    reporter.cancel()
    finished = time.monotonic()
    return {"started": started, "finished": finished, "sent": share * producers}


def run_reliable(
    address: str, fsync: str, producers: int, messages: int, size: int, flush_every: int
) -> dict[str, Any]:
    topic = f"bench-reliable-{fsync}-{producers}-{time.time_ns()}"
    asyncio.run(_create_topic(address, topic, "reliable", fsync))
    consumer, out = _start_consumer(address, topic, messages, 300, False)
    produced = _run(_produce_reliable(address, topic, messages, size, producers, flush_every))
    result = out.get(timeout=330)
    consumer.join(30)
    acked_seconds = produced["finished"] - produced["started"]
    delivered_seconds = result["last"] - produced["started"]
    return {
        "fsync": fsync,
        "producers": producers,
        "messages": produced["sent"],
        "flush_every": flush_every,
        "acked_msgs_per_s": round(produced["sent"] / acked_seconds),
        "delivered": result["received"],
        "delivered_msgs_per_s": round(result["received"] / delivered_seconds),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rate", type=int, default=50_000, help="latency test rate, msgs/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="latency test duration")
    parser.add_argument("--server", help="use a running server instead of starting one")
    parser.add_argument(
        "--suite", choices=["all", "non-reliable", "reliable"], default="all", help="what to run"
    )
    parser.add_argument(
        "--reliable-messages", type=int, default=500_000, help="messages per reliable run"
    )
    parser.add_argument(
        "--flush-every", type=int, default=1000, help="reliable: records per producer flush"
    )
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "benchmark": "end to end",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
    }

    with tempfile.TemporaryDirectory(prefix="headwater-bench-") as scratch:
        server = None
        address = args.server
        if address is None:
            server = ServerProcess(Path(scratch) / "data").start()
            address = server.address
        try:
            if args.suite in ("all", "non-reliable"):
                print(f"non-reliable: {args.messages:,} x {args.size} B", file=sys.stderr)
                report["throughput"] = run_throughput(address, args.messages, args.size)
                print(f"latency: {args.rate:,} msg/s for {args.seconds}s", file=sys.stderr)
                report["latency"] = run_latency(address, args.rate, args.seconds, args.size)
            if args.suite in ("all", "reliable"):
                report["reliable"] = []
                for fsync in ("never", "interval", "always"):
                    for producers in (1, 8):
                        print(f"reliable: fsync {fsync}, {producers} producer(s)", file=sys.stderr)
                        report["reliable"].append(
                            run_reliable(
                                address,
                                fsync,
                                producers,
                                args.reliable_messages,
                                args.size,
                                args.flush_every,
                            )
                        )
        finally:
            if server is not None:
                server.stop()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
