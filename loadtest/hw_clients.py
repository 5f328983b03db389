"""Headwater's side of each benchmark: the client processes' workloads (see loadtest/harness.py).

Each function runs in its own client process on uvloop with the public asyncio client: it sets up,
awaits `ctx.start()` (every client of the row is then ready), does its work within a deadline, and
returns a dict with its own CPU seconds (`ctx.cpu()`).

- `produce`: `producers` connections in this process send `total` values; a reliable run flushes
  (waits for every ack) each `flush_every` records per producer, a non-reliable one only at the end.
- `produce_at_rate`: a fixed rate in 1 ms ticks, each value starting with its send time.
- `consume`: one consumer, one cumulative ack per batch (each message acked with the "record"
  API); it stops when it has `expected` messages
  or, once the producers are done, when nothing came for `quiet` seconds.
- `map_ops`: map get or set, `depth` operations per round.
- `fsync_probe`: the disk's own fsync latency beside a latency row: a 4 KiB write and an fsync
  of a file in the server's data directory every 10 ms while the row runs.

`api` picks the client API: "batch" (the default) uses `Producer.send_batch` (1,000 values per
call), `Consumer.next_batch` (values read from a lazily decoded `MessageBatch`) and one
`get_many`/`set_many` request per map round; "record" uses `send` per value, `async for message
in consumer` with each message acknowledged, and one request per map operation, pipelined: the
per-record API as an application writes it.
- `fanout_followers` / `fanout_setter`: last-value subscribers following one key that another
  process sets `updates` times.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from pathlib import Path
from typing import Any

import headwater
from loadtest import stages
from loadtest.harness import Context, latency_histogram, percentile, say, ticks

STAMP = struct.Struct(">q")  # CLOCK_MONOTONIC nanoseconds, the same clock in every process
SUBSCRIPTION = "bench"


async def produce(
    ctx: Context,
    address: str,
    topic: str,
    total: int,
    size: int,
    producers: int = 1,
    flush_every: int = 0,
    deadline: float = 300.0,
    api: str = "batch",
) -> dict[str, Any]:
    value = b"x" * size
    chunk = [value] * 1000
    share = total // producers
    clients = [await headwater.connect(address) for _ in range(producers)]
    sent = [0]
    started = await ctx.start()
    stop_at = started + deadline

    async def one(client: headwater.Client) -> None:
        producer = client.producer(topic, batch_size=256 * 1024 if flush_every else 64 * 1024)
        step = flush_every or share
        for begin in range(0, share, step):
            if api == "batch":
                for part in range(begin, min(begin + step, share), len(chunk)):
                    await producer.send_batch(chunk[: min(len(chunk), share - part)])
            else:
                for _ in range(min(step, share - begin)):
                    await producer.send(value)
            await producer.flush()
            sent[0] += min(step, share - begin)
            if time.monotonic() > stop_at:
                break

    await _with_progress(asyncio.gather(*(one(c) for c in clients)), "sent", sent, total)
    finished = time.monotonic()
    ctx.produced.set()
    for client in clients:
        await client.close()
    return {"started": started, "finished": finished, "sent": sent[0], "cpu_s": ctx.cpu()}


async def _with_progress(work: Any, label: str, counter: list[int], total: int) -> None:
    async def report() -> None:
        while True:
            await asyncio.sleep(1)
            say(f"    {label} {counter[0]:,}/{total:,}")

    reporter = asyncio.create_task(report())
    try:
        await work
    finally:
        reporter.cancel()


async def produce_at_rate(
    ctx: Context,
    address: str,
    topic: str,
    rate: int,
    seconds: float,
    size: int,
    api: str = "batch",
) -> dict[str, Any]:
    """`rate` msgs/s in 1 ms ticks for `seconds`; each value carries its send time (with the
    batch API, one time per tick: the tick's values go out in one call)."""
    async with await headwater.connect(address) as client:
        producer = client.producer(topic)
        padding = b"x" * max(0, size - STAMP.size)
        per_tick = max(1, rate // 1000)
        started = await ctx.start()
        sent = 0
        async for _ in ticks(started, seconds):
            if api == "batch":
                stamp = STAMP.pack(time.monotonic_ns()) + padding
                await producer.send_batch([stamp] * per_tick)
            else:
                for _ in range(per_tick):
                    await producer.send(STAMP.pack(time.monotonic_ns()) + padding)
            sent += per_tick
        await producer.flush()
        finished = time.monotonic()
    ctx.produced.set()
    return {"started": started, "finished": finished, "sent": sent, "cpu_s": ctx.cpu()}


async def consume(
    ctx: Context,
    address: str,
    topic: str,
    expected: int,
    latency: bool = False,
    quiet: float = 0.5,
    deadline: float = 300.0,
    api: str = "batch",
    trace_every: int = 0,
) -> dict[str, Any]:
    """With `latency`, each value's receive - send time, into an HDR histogram once the run is
    over (recording into it as messages arrive costs 5 us a value in pure Python: a batch of
    thousands delayed the next one by tens of milliseconds, which the histogram then measured);
    with `trace_every` too, the messages at offsets the server traces (multiples of it) are kept
    as stage samples (loadtest/stages.py): send, frame read and taken times."""
    async with await headwater.connect(address) as client:
        consumer = await client.subscribe(topic, SUBSCRIPTION, prefetch=20_000)
        started = await ctx.start()
        received, first, last = 0, 0.0, started
        latencies: list[int] = []
        samples: list[stages.Sample] = []
        unpack = STAMP.unpack_from
        if api == "record":
            received, first, last = await _take_messages(
                ctx,
                consumer,
                expected,
                started,
                quiet,
                deadline,
                latencies if latency else None,
                samples,
                trace_every,
            )
        while api == "batch" and received < expected and time.monotonic() < started + deadline:
            try:
                batch = await consumer.next_batch(timeout=0.25)
            except TimeoutError:
                if ctx.produced.is_set() and time.monotonic() - last > quiet:
                    break
                continue
            now_ns = time.monotonic_ns()
            last = now_ns / 1e9
            first = first or last
            received += len(batch)
            values = batch.values()
            await batch.ack_cumulative()  # one ack per batch (one partition)
            if latency:
                latencies.extend(now_ns - unpack(v)[0] for v in values if v)
                if trace_every:
                    _sample(samples, trace_every, batch, now_ns)
            else:
                sum(len(v) for v in values if v)  # touch every value
        dropped = consumer.dropped
    result: dict[str, Any] = {
        "received": received,
        "first": first,
        "last": last,
        "dropped_notified": dropped,
        "cpu_s": ctx.cpu(),
    }
    if latency:
        recorded = latency_histogram(latencies)
        result["latency"] = stages.summary(recorded)
        result["histogram"] = recorded.encode().decode()
        result["samples"] = samples
        result["topic"], result["subscription"] = topic, SUBSCRIPTION
    return result


async def _take_messages(
    ctx: Context,
    consumer: headwater.Consumer,
    expected: int,
    started: float,
    quiet: float,
    deadline: float,
    latencies: list[int] | None,
    samples: list[stages.Sample],
    trace_every: int,
) -> tuple[int, float, float]:
    """The per-record API as an application writes it: `async for message in consumer`, each
    message acknowledged. `async for` has no timeout, so a watchdog closes the consumer (which
    ends the loop) when the producers are done and nothing came for `quiet` seconds, or at the
    deadline. Returns (messages taken, first and last taken times)."""
    taken, first, last = 0, 0.0, started

    async def watchdog() -> None:
        while taken < expected:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            if now > started + deadline or (ctx.produced.is_set() and now - last > quiet):
                break
        await consumer.close()

    closer = asyncio.create_task(watchdog())
    unpack = STAMP.unpack_from
    async for message in consumer:
        now_ns = time.monotonic_ns()
        last = now_ns / 1e9
        first = first or last
        value = message.value
        if latencies is None:
            len(value or b"")  # touch the value
        elif value:
            latencies.append(now_ns - unpack(value)[0])
            if trace_every and message.offset % trace_every == 0:
                # the batch's frame read time is not kept on a message: 0
                samples.append((message.partition, message.offset, unpack(value)[0], 0, now_ns))
        await consumer.ack(message)
        taken += 1
        if taken >= expected:
            break
    await closer
    return taken, first, last


def _sample(
    into: list[stages.Sample], every: int, batch: headwater.MessageBatch, now_ns: int
) -> None:
    """The traced messages of a batch the application just took (offsets that are multiples of
    `every`): partition, offset, send time, frame read time, taken time."""
    for offset, value in zip(batch.offsets(), batch.values(), strict=True):
        if offset % every == 0 and value:
            taken = (
                batch.partition,
                offset,
                STAMP.unpack_from(value)[0],
                batch.received_ns,
                now_ns,
            )
            into.append(taken)


async def map_ops(
    ctx: Context,
    address: str,
    topic: str,
    op: str,
    ops: int,
    depth: int,
    keys: int,
    size: int,
    api: str = "batch",
) -> dict[str, Any]:
    """`ops` gets or sets over `keys` keys, `depth` per round (one request, or `depth` pipelined
    requests with api "record"); rounds' latency percentiles."""
    value = b"v" * size
    async with await headwater.connect(address) as client:
        table = client.map(topic)
        started = await ctx.start()
        rounds: list[float] = []
        done = 0
        while done < ops:
            count = min(depth, ops - done)
            begin = time.perf_counter()
            names = [f"key{(done + i) % keys}" for i in range(count)]
            if api == "batch" and op == "get":
                await table.get_many(names)
            elif api == "batch":
                await table.set_many(dict.fromkeys(names, value))
            elif op == "get":
                await asyncio.gather(*(table.get(f"key{(done + i) % keys}") for i in range(count)))
            else:
                await asyncio.gather(
                    *(table.set(f"key{(done + i) % keys}", value) for i in range(count))
                )
            rounds.append(time.perf_counter() - begin)
            done += count
        finished = time.monotonic()
    return {"started": started, "finished": finished, "ops": done, "cpu_s": ctx.cpu()} | (
        round_summary(rounds)
    )


def round_summary(rounds: list[float]) -> dict[str, float]:
    rounds.sort()
    return {
        "round_p50_ms": round(percentile(rounds, 0.5) * 1000, 3),
        "round_p99_ms": round(percentile(rounds, 0.99) * 1000, 3),
    }


async def fill_map(address: str, topic: str, keys: int, size: int) -> None:
    """Create the map topic and its keys (run by the parent before the row)."""
    async with await headwater.connect(address) as client:
        await client.create_topic(
            topic, dispatch="reliable", configs={"fsync": "interval", "last.value": "true"}
        )
        table = client.map(topic)
        for start in range(0, keys, 1000):
            await table.set_many(
                {f"key{i}": b"v" * size for i in range(start, min(keys, start + 1000))}
            )


async def fanout_followers(
    ctx: Context, address: str, topic: str, subscribers: int, updates: int, deadline: float = 120
) -> dict[str, Any]:
    """`subscribers` last-value consumers of key "k" on 10 connections; each stops when it holds
    the final value. Returns deliveries and when the last subscriber converged."""
    clients = [await headwater.connect(address) for _ in range(10)]
    consumers = [
        await clients[i % 10].subscribe(topic, f"s{i}", durable="last-value", keys=["k"])
        for i in range(subscribers)
    ]
    final = str(updates).encode()
    deliveries = [0]

    async def follow(consumer: headwater.Consumer) -> None:
        while True:
            messages = await consumer.receive_batch(1000, timeout=deadline)
            deliveries[0] += len(messages)
            if messages[-1].value == final:
                return

    started = await ctx.start()
    await asyncio.wait_for(asyncio.gather(*(follow(c) for c in consumers)), deadline)
    converged = time.monotonic()
    for client in clients:
        await client.close()
    return {
        "started": started,
        "converged": converged,
        "deliveries": deliveries[0],
        "cpu_s": ctx.cpu(),
    }


async def fanout_setter(ctx: Context, address: str, topic: str, updates: int) -> dict[str, Any]:
    async with await headwater.connect(address) as client:
        table = client.map(topic)
        started = await ctx.start()
        for i in range(1, updates + 1):
            await table.set("k", str(i).encode())
        finished = time.monotonic()
    ctx.produced.set()
    return {"started": started, "finished": finished, "sets": updates, "cpu_s": ctx.cpu()}


async def fsync_probe(
    ctx: Context, directory: str, seconds: float, every: float = 0.01
) -> dict[str, Any]:
    """What one fsync costs on the server's disk while the row runs (the fsync `always` goal
    is a p99 within twice the disk's): a 4 KiB write and an fsync of a file of its own in
    `directory`, every `every` seconds for `seconds`, timed."""
    path = Path(directory) / f"fsync-probe-{os.getpid()}"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    durations: list[float] = []
    block = b"\xa5" * 4096
    try:
        started = await ctx.start()
        tick = started
        while tick < started + seconds:  # bounded by the row's duration
            os.pwrite(descriptor, block, 0)
            begin = time.perf_counter()
            os.fsync(descriptor)
            durations.append(time.perf_counter() - begin)
            tick += every
            await asyncio.sleep(max(0.0, tick - time.monotonic()))
    finally:
        os.close(descriptor)
        path.unlink(missing_ok=True)
    durations.sort()
    return {
        "fsyncs": len(durations),
        "p50_ms": round(percentile(durations, 0.5) * 1000, 3),
        "p99_ms": round(percentile(durations, 0.99) * 1000, 3),
        "cpu_s": ctx.cpu(),
    }
