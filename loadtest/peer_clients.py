"""The peers' side of each benchmark: Redis and NATS client workloads, shaped like Headwater's
(loadtest/hw_clients.py): one process per producer side and per consumer side, on uvloop, with
Python clients (redis-py, nats-py), setting up before `ctx.start()` and returning their own CPU.

- Redis pub/sub: PUBLISH pipelined `batch` at a time; the subscriber iterates `listen()`.
- Redis Streams: XADD pipelined `flush_every` at a time (the pipeline's replies are the acks);
  the consumer reads with XREADGROUP and acknowledges each batch with one XACK.
- Redis GET/SET: a non-transactional pipeline of `depth` commands per round.
- NATS core: `publish` (nats-py buffers and flushes), a subscription with a counting callback.
- JetStream: `depth` concurrent `js.publish` per round (each waits for its ack); a pull consumer
  fetching batches and acking the last of each (AckPolicy.ALL: cumulative, like Headwater's).
- NATS KV: `depth` concurrent get or put per round.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from loadtest import stages
from loadtest.harness import Context, latency_histogram, ticks
from loadtest.hw_clients import STAMP, round_summary

# Redis


def _redis(port: int) -> Any:
    import redis.asyncio as redis

    return redis.Redis(host="127.0.0.1", port=port)


async def redis_publish(
    ctx: Context,
    port: int,
    channel: str,
    total: int,
    size: int,
    producers: int = 1,
    batch: int = 1000,
) -> dict[str, Any]:
    value = b"x" * size
    clients = [_redis(port) for _ in range(producers)]
    for client in clients:
        await client.ping()
    share = total // producers
    started = await ctx.start()

    async def one(client: Any) -> None:
        for begin in range(0, share, batch):
            pipe = client.pipeline(transaction=False)
            for _ in range(min(batch, share - begin)):
                pipe.publish(channel, value)
            await pipe.execute()

    await asyncio.gather(*(one(c) for c in clients))
    finished = time.monotonic()
    ctx.produced.set()
    for client in clients:
        await client.aclose()
    return {"started": started, "finished": finished, "sent": share * producers, "cpu_s": ctx.cpu()}


async def redis_publish_at_rate(
    ctx: Context, port: int, channel: str, rate: int, seconds: float, size: int
) -> dict[str, Any]:
    client = _redis(port)
    await client.ping()
    padding = b"x" * max(0, size - STAMP.size)
    per_tick = max(1, rate // 1000)
    started = await ctx.start()
    sent = 0
    async for _ in ticks(started, seconds):
        pipe = client.pipeline(transaction=False)
        for _ in range(per_tick):
            pipe.publish(channel, STAMP.pack(time.monotonic_ns()) + padding)
        await pipe.execute()
        sent += per_tick
    finished = time.monotonic()
    ctx.produced.set()
    await client.aclose()
    return {"started": started, "finished": finished, "sent": sent, "cpu_s": ctx.cpu()}


async def redis_subscribe(
    ctx: Context,
    port: int,
    channel: str,
    expected: int,
    latency: bool = False,
    quiet: float = 0.5,
    deadline: float = 300.0,
) -> dict[str, Any]:
    """A reader task iterates `pubsub.listen()` (one parse per message, no timeout per call:
    `get_message(timeout=...)` sets up a timeout per message and ran 5x slower)."""
    client = _redis(port)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(channel)
    await pubsub.get_message(timeout=1.0)  # the subscribe confirmation
    state = {"received": 0, "first": 0.0, "last": 0.0}
    latencies: list[int] = []
    done = asyncio.Event()

    async def read() -> None:
        async for message in pubsub.listen():
            if message["type"] != "message":
                continue
            now_ns = time.monotonic_ns()
            state["last"] = now_ns / 1e9
            state["first"] = state["first"] or state["last"]
            state["received"] += 1
            if latency:
                latencies.append(now_ns - STAMP.unpack_from(message["data"])[0])
            if state["received"] >= expected:
                done.set()
                return

    started = await ctx.start()
    state["last"] = started
    reader = asyncio.create_task(read())
    await _until_done_or_quiet(ctx, done, state, quiet, started + deadline)
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    await pubsub.aclose()
    await client.aclose()
    result: dict[str, Any] = {**state, "cpu_s": ctx.cpu()}
    if latency:
        recorded = latency_histogram(latencies)
        result["latency"] = stages.summary(recorded)
        result["histogram"] = recorded.encode().decode()
    return result


async def _until_done_or_quiet(
    ctx: Context, done: asyncio.Event, state: dict[str, Any], quiet: float, deadline: float
) -> None:
    """Until `done`, or the producers are done and nothing came for `quiet` s, or `deadline`."""
    while not done.is_set() and time.monotonic() < deadline:
        try:
            await asyncio.wait_for(done.wait(), 0.25)
        except TimeoutError:
            if ctx.produced.is_set() and time.monotonic() - state["last"] > quiet:
                return


async def redis_xadd(
    ctx: Context, port: int, stream: str, total: int, size: int, producers: int, flush_every: int
) -> dict[str, Any]:
    value = b"r" * size
    clients = [_redis(port) for _ in range(producers)]
    for client in clients:
        await client.ping()
    share = total // producers
    started = await ctx.start()

    async def one(client: Any) -> None:
        for begin in range(0, share, flush_every):
            pipe = client.pipeline(transaction=False)
            for _ in range(min(flush_every, share - begin)):
                pipe.xadd(stream, {"v": value})
            await pipe.execute()

    await asyncio.gather(*(one(c) for c in clients))
    finished = time.monotonic()
    ctx.produced.set()
    for client in clients:
        await client.aclose()
    return {"started": started, "finished": finished, "sent": share * producers, "cpu_s": ctx.cpu()}


async def redis_xread(
    ctx: Context, port: int, stream: str, expected: int, quiet: float = 2.0, deadline: float = 300
) -> dict[str, Any]:
    client = _redis(port)
    await client.xgroup_create(stream, "bench", id="$", mkstream=True)
    started = await ctx.start()
    received, first, last = 0, 0.0, started
    while received < expected and time.monotonic() < started + deadline:
        answer = await client.xreadgroup("bench", "c", {stream: ">"}, count=5000, block=250)
        if not answer:
            if ctx.produced.is_set() and time.monotonic() - last > quiet:
                break
            continue
        entries = answer[0][1]
        last = time.monotonic()
        first = first or last
        received += len(entries)
        await client.xack(stream, "bench", *(entry_id for entry_id, _ in entries))
    await client.aclose()
    return {"received": received, "first": first, "last": last, "cpu_s": ctx.cpu()}


async def redis_fill(port: int, keys: int, size: int) -> None:
    client = _redis(port)
    for start in range(0, keys, 1000):
        await client.mset({f"key{i}": b"v" * size for i in range(start, min(keys, start + 1000))})
    await client.aclose()


async def redis_map(
    ctx: Context, port: int, op: str, ops: int, depth: int, keys: int, size: int
) -> dict[str, Any]:
    value = b"v" * size
    client = _redis(port)
    await client.ping()
    started = await ctx.start()
    rounds: list[float] = []
    done = 0
    while done < ops:
        count = min(depth, ops - done)
        pipe = client.pipeline(transaction=False)
        for i in range(done, done + count):
            if op == "get":
                pipe.get(f"key{i % keys}")
            else:
                pipe.set(f"key{i % keys}", value)
        begin = time.perf_counter()
        await pipe.execute()
        rounds.append(time.perf_counter() - begin)
        done += count
    finished = time.monotonic()
    await client.aclose()
    return {"started": started, "finished": finished, "ops": done, "cpu_s": ctx.cpu()} | (
        round_summary(rounds)
    )


# NATS


async def _nats(port: int, **options: Any) -> Any:
    import nats

    return await nats.connect(f"nats://127.0.0.1:{port}", allow_reconnect=False, **options)


async def nats_publish(
    ctx: Context, port: int, subject: str, total: int, size: int, producers: int = 1
) -> dict[str, Any]:
    value = b"x" * size
    connections = [await _nats(port) for _ in range(producers)]
    share = total // producers
    started = await ctx.start()

    async def one(connection: Any) -> None:
        for _ in range(share):
            await connection.publish(subject, value)
        await connection.flush(timeout=60)

    await asyncio.gather(*(one(c) for c in connections))
    finished = time.monotonic()
    ctx.produced.set()
    for connection in connections:
        await connection.close()
    return {"started": started, "finished": finished, "sent": share * producers, "cpu_s": ctx.cpu()}


async def nats_publish_at_rate(
    ctx: Context, port: int, subject: str, rate: int, seconds: float, size: int
) -> dict[str, Any]:
    connection = await _nats(port)
    padding = b"x" * max(0, size - STAMP.size)
    per_tick = max(1, rate // 1000)
    started = await ctx.start()
    sent = 0
    async for _ in ticks(started, seconds):
        for _ in range(per_tick):
            await connection.publish(subject, STAMP.pack(time.monotonic_ns()) + padding)
        await connection.flush(timeout=10)  # one tick's messages go out now, not when buffered
        sent += per_tick
    finished = time.monotonic()
    ctx.produced.set()
    await connection.close()
    return {"started": started, "finished": finished, "sent": sent, "cpu_s": ctx.cpu()}


async def nats_subscribe(
    ctx: Context,
    port: int,
    subject: str,
    expected: int,
    latency: bool = False,
    quiet: float = 0.5,
    deadline: float = 300.0,
) -> dict[str, Any]:
    errors = [0]

    async def on_error(_: Exception) -> None:
        errors[0] += 1  # slow-consumer drops, counted rather than logged one by one

    connection = await _nats(port, error_cb=on_error)
    state = {"received": 0, "first": 0.0, "last": 0.0}
    latencies: list[int] = []
    done = asyncio.Event()

    async def on_message(message: Any) -> None:
        now_ns = time.monotonic_ns()
        state["last"] = now_ns / 1e9
        state["first"] = state["first"] or state["last"]
        state["received"] += 1
        if latency:
            latencies.append(now_ns - STAMP.unpack_from(message.data)[0])
        if state["received"] >= expected:
            done.set()

    await connection.subscribe(subject, cb=on_message)
    await connection.flush()
    started = await ctx.start()
    state["last"] = started
    await _until_done_or_quiet(ctx, done, state, quiet, started + deadline)
    await connection.close()
    result: dict[str, Any] = {**state, "slow_consumer_errors": errors[0], "cpu_s": ctx.cpu()}
    if latency:
        recorded = latency_histogram(latencies)
        result["latency"] = stages.summary(recorded)
        result["histogram"] = recorded.encode().decode()
    return result


async def js_setup(port: int, stream: str, subject: str) -> None:
    from nats.js.api import StorageType

    connection = await _nats(port)
    await connection.jetstream().add_stream(
        name=stream, subjects=[subject], storage=StorageType.FILE
    )
    await connection.close()


async def js_publish(
    ctx: Context, port: int, subject: str, total: int, size: int, producers: int, flush_every: int
) -> dict[str, Any]:
    value = b"r" * size
    connections = [await _nats(port) for _ in range(producers)]
    share = total // producers
    started = await ctx.start()

    async def one(connection: Any) -> None:
        jetstream = connection.jetstream(timeout=30)
        for begin in range(0, share, flush_every):
            count = min(flush_every, share - begin)
            await asyncio.gather(*(jetstream.publish(subject, value) for _ in range(count)))

    await asyncio.gather(*(one(c) for c in connections))
    finished = time.monotonic()
    ctx.produced.set()
    for connection in connections:
        await connection.close()
    return {"started": started, "finished": finished, "sent": share * producers, "cpu_s": ctx.cpu()}


async def js_consume(
    ctx: Context, port: int, subject: str, expected: int, quiet: float = 2.0, deadline: float = 300
) -> dict[str, Any]:
    import nats.errors
    from nats.js.api import AckPolicy, ConsumerConfig

    connection = await _nats(port)
    jetstream = connection.jetstream()
    subscription = await jetstream.pull_subscribe(
        subject, "bench", config=ConsumerConfig(ack_policy=AckPolicy.ALL, max_ack_pending=-1)
    )
    started = await ctx.start()
    received, first, last = 0, 0.0, started
    while received < expected and time.monotonic() < started + deadline:
        try:
            messages = await subscription.fetch(2000, timeout=0.25)
        except (TimeoutError, nats.errors.TimeoutError):  # nats-py raises either
            if ctx.produced.is_set() and time.monotonic() - last > quiet:
                break
            continue
        if not messages:
            continue
        last = time.monotonic()
        first = first or last
        received += len(messages)
        await messages[-1].ack()
    await connection.close()
    return {"received": received, "first": first, "last": last, "cpu_s": ctx.cpu()}


async def kv_fill(port: int, bucket: str, keys: int, size: int) -> None:
    connection = await _nats(port)
    kv = await connection.jetstream().create_key_value(bucket=bucket)
    for start in range(0, keys, 500):
        await asyncio.gather(
            *(kv.put(f"key{i}", b"v" * size) for i in range(start, min(keys, start + 500)))
        )
    await connection.close()


async def nats_kv(
    ctx: Context, port: int, bucket: str, op: str, ops: int, depth: int, keys: int, size: int
) -> dict[str, Any]:
    value = b"v" * size
    connection = await _nats(port)
    kv = await connection.jetstream().key_value(bucket)
    started = await ctx.start()
    rounds: list[float] = []
    done = 0
    while done < ops:
        count = min(depth, ops - done)
        begin = time.perf_counter()
        if op == "get":
            await asyncio.gather(*(kv.get(f"key{(done + i) % keys}") for i in range(count)))
        else:
            await asyncio.gather(*(kv.put(f"key{(done + i) % keys}", value) for i in range(count)))
        rounds.append(time.perf_counter() - begin)
        done += count
    finished = time.monotonic()
    await connection.close()
    return {"started": started, "finished": finished, "ops": done, "cpu_s": ctx.cpu()} | (
        round_summary(rounds)
    )
