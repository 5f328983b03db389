"""What a consumer costs per message, in-process: CPU and garbage collections (issue 27).

A `Consumer` is fed deliveries as its connection would feed them (record batches of 1,000
100-byte records without headers, no network, no server) and the application takes them in each
of the client's ways: `async for` with an ack per message, `receive_batch(5000)` (the soak's
consumer), and `next_batch()` reading `values()`. Beside it the application keeps a heap of its
own (110,000 small objects: a full collection walks them too, as it would a real application's).
Reported per way, the median of `--repeats` runs: the loop thread's CPU time per message (not wall
time: on a shared machine, time waiting for a core is not the consumer's cost) and the number of
collections of each generation per million messages, with the longest full one (`full ms`).

The connection is a stand-in that drops what the consumer sends (credit, acks): this measures the
client's own work per message, which the end-to-end rows (loadtest.bench) add the network to.

    python -m loadtest.consumer_cost_bench --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from headwater.client.consumer import Consumer
from headwater.wire import messages as m
from headwater.wire.records import build_batch

RECORDS_PER_BATCH = 1000


class _DroppingConnection:
    """What a `Consumer` asks of its connection, doing nothing with what it is sent."""

    closed = False

    def __init__(self) -> None:
        self.before_request: list[Callable[[], None]] = []
        self.consumers: dict[int, Consumer] = {}

    def send_nowait(self, request: object) -> None:
        pass


async def _async_for(consumer: Consumer, count: int) -> None:
    taken = 0
    async for message in consumer:
        len(message.value or b"")
        await consumer.ack(message)
        taken += 1
        if taken == count:
            return


async def _receive_batch(consumer: Consumer, count: int) -> None:
    taken = 0
    while taken < count:
        messages = await consumer.receive_batch(5000)
        sum(len(message.value or b"") for message in messages)
        taken += len(messages)


async def _next_batch(consumer: Consumer, count: int) -> None:
    taken = 0
    while taken < count:
        batch = await consumer.next_batch()
        sum(len(value or b"") for value in batch.values())
        taken += len(batch)


WAYS: dict[str, Callable[[Consumer, int], Awaitable[None]]] = {
    "async for + ack": _async_for,
    "receive_batch(5000)": _receive_batch,
    "next_batch().values()": _next_batch,
}


async def _run(
    take: Callable[[Consumer, int], Awaitable[None]], batches: list[bytes]
) -> dict[str, Any]:
    consumer = Consumer(_DroppingConnection(), "t", "s", prefetch=len(batches) * RECORDS_PER_BATCH)  # type: ignore[arg-type]
    consumer.consumer_id = 1
    for batch in batches:
        consumer.on_delivery(m.Delivery(0, 1, batch))
    ballast: list[list[dict[str, int]]] = [[{} for _ in range(10)] for _ in range(10_000)]
    collections = [0, 0, 0]
    longest_full = 0.0
    started = 0.0

    def count(phase: str, info: dict[str, int]) -> None:
        nonlocal started, longest_full
        if phase == "start":
            started = time.perf_counter()
            return
        collections[info["generation"]] += 1
        if info["generation"] == 2:
            longest_full = max(longest_full, time.perf_counter() - started)

    messages = len(batches) * RECORDS_PER_BATCH  # ballast: the application's own heap
    gc.collect()
    gc.callbacks.append(count)
    cpu = time.thread_time()
    try:
        await take(consumer, messages)
    finally:
        cpu = time.thread_time() - cpu
        gc.callbacks.remove(count)
    del ballast
    per_million = 1_000_000 / messages
    return {
        "cpu_us_per_message": cpu / messages * 1e6,
        "young_per_million": collections[0] * per_million,
        "gen1_per_million": collections[1] * per_million,
        "full_per_million": collections[2] * per_million,
        "longest_full_ms": longest_full * 1e3,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--format", choices=["table", "json"], default="table")
    args = parser.parse_args(argv)
    value = b"x" * 100
    batches = [
        build_batch([(None, value, [])] * RECORDS_PER_BATCH, base_offset=i * RECORDS_PER_BATCH)
        for i in range(max(1, args.messages // RECORDS_PER_BATCH))
    ]
    results: dict[str, dict[str, float]] = {}
    for name, take in WAYS.items():
        runs = [asyncio.run(_run(take, batches)) for _ in range(args.repeats)]
        results[name] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    if args.format == "json":
        print(json.dumps(results, indent=2))
        return
    print(
        f"{'way':24} {'CPU µs/msg':>10} {'young/M':>8} {'gen1/M':>7} {'full/M':>7} {'full ms':>8}"
    )
    for name, r in results.items():
        print(
            f"{name:24} {r['cpu_us_per_message']:10.3f} {r['young_per_million']:8.0f} "
            f"{r['gen1_per_million']:7.0f} {r['full_per_million']:7.0f} {r['longest_full_ms']:8.1f}"
        )


if __name__ == "__main__":
    main()
