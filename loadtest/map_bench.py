"""Map durable get/set against Redis GET/SET and NATS JetStream KV, on the same machine.

Each server runs in its own process on 127.0.0.1 (started here: Debian's `redis-server` and
`nats-server -js`, so install them first, see docs/BENCHMARKS.md). One Python client per system,
on uvloop, keeps `--depth` requests in flight (pipelining: the next round is sent when the
previous one is answered) over `--keys` existing keys with 100-byte values. Reported: ops/s and
the p99 latency of a round (what one pipelined request waited). Then last-value fan-out: 100
subscribers follow one key while a producer updates it `--updates` times.

Headwater's topic is reliable with `fsync=never` (acknowledged once written to the OS), like Redis
without AOF and NATS with its default (no fsync per write).

    python -m loadtest.map_bench --ops 100000 --depth 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import headwater
from headwater.testing import ServerProcess

VALUE = b"v" * 100


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


async def rounds(
    name: str, operation: Callable[[int], Awaitable[Any]], ops: int, depth: int
) -> dict[str, Any]:
    """`ops` operations, `depth` at a time; returns ops/s and round latency percentiles."""
    latencies = []
    started = time.monotonic()
    next_report = started + 1
    done = 0
    while done < ops:
        count = min(depth, ops - done)
        begin = time.perf_counter()
        await asyncio.gather(*(operation(done + i) for i in range(count)))
        latencies.append(time.perf_counter() - begin)
        done += count
        if time.monotonic() >= next_report:
            rate = done / (time.monotonic() - started)
            print(f"  {name}: {done:,}/{ops:,} ({rate:,.0f} ops/s)", file=sys.stderr, flush=True)
            next_report += 1
    elapsed = time.monotonic() - started
    latencies.sort()
    return {
        "ops_per_s": round(ops / elapsed),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 3),
        "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, 3),
    }


async def bench_headwater(address: str, keys: int, ops: int, depth: int) -> dict[str, Any]:
    async with await headwater.connect(address) as client:
        await client.create_topic(
            "kv", dispatch="reliable", configs={"fsync": "never", "last.value": "true"}
        )
        table = client.map("kv")
        for start in range(0, keys, 1000):
            await table.set_many({f"key{i}": VALUE for i in range(start, min(keys, start + 1000))})
        get = await rounds("headwater get", lambda i: table.get(f"key{i % keys}"), ops, depth)
        put = await rounds(
            "headwater set", lambda i: table.set(f"key{i % keys}", VALUE), ops, depth
        )
        return {"get": get, "set": put}


async def bench_redis(port: int, keys: int, ops: int, depth: int) -> dict[str, Any]:
    import redis.asyncio as redis

    client = redis.Redis(host="127.0.0.1", port=port)
    for start in range(0, keys, 1000):
        await client.mset({f"key{i}": VALUE for i in range(start, min(keys, start + 1000))})

    async def pipelined(command: str, ops_: int) -> dict[str, Any]:
        latencies = []
        started = time.monotonic()
        done = 0
        while done < ops_:
            count = min(depth, ops_ - done)
            pipe = client.pipeline(transaction=False)
            for i in range(done, done + count):
                if command == "get":
                    pipe.get(f"key{i % keys}")
                else:
                    pipe.set(f"key{i % keys}", VALUE)
            begin = time.perf_counter()
            await pipe.execute()
            latencies.append(time.perf_counter() - begin)
            done += count
        elapsed = time.monotonic() - started
        latencies.sort()
        print(f"  redis {command}: {ops_ / elapsed:,.0f} ops/s", file=sys.stderr, flush=True)
        return {
            "ops_per_s": round(ops_ / elapsed),
            "p50_ms": round(latencies[len(latencies) // 2] * 1000, 3),
            "p99_ms": round(
                latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, 3
            ),
        }

    result = {"get": await pipelined("get", ops), "set": await pipelined("set", ops)}
    await client.aclose()
    return result


async def bench_nats(port: int, keys: int, ops: int, depth: int) -> dict[str, Any]:
    import nats

    connection = await nats.connect(f"nats://127.0.0.1:{port}")
    jetstream = connection.jetstream()
    kv = await jetstream.create_key_value(bucket="bench")
    for i in range(keys):
        await kv.put(f"key{i}", VALUE)
    get = await rounds("nats get", lambda i: kv.get(f"key{i % keys}"), ops, depth)
    put = await rounds("nats put", lambda i: kv.put(f"key{i % keys}", VALUE), ops, depth)
    await connection.close()
    return {"get": get, "set": put}


async def fan_out(address: str, subscribers: int, updates: int) -> dict[str, Any]:
    """`subscribers` last-value subscribers on one key, `updates` sets of it: how long until
    every subscriber holds the final value, and how many updates reached them in all."""
    clients = [await headwater.connect(address) for _ in range(10)]
    await clients[0].create_topic("fan", dispatch="reliable", configs={"fsync": "never"})
    table = clients[0].map("fan")
    await table.set("k", b"0")
    consumers = [
        await clients[i % 10].subscribe("fan", f"s{i}", durable="last-value", keys=["k"])
        for i in range(subscribers)
    ]
    final = str(updates).encode()
    received = [0]

    async def follow(consumer: headwater.Consumer) -> None:
        while True:
            message = await consumer.receive(timeout=30)
            received[0] += 1
            if message.value == final:
                return

    followers = [asyncio.create_task(follow(c)) for c in consumers]
    started = time.monotonic()
    for i in range(1, updates + 1):
        await table.set("k", str(i).encode())
    await asyncio.gather(*followers)
    elapsed = time.monotonic() - started
    for client in clients:
        await client.close()
    return {
        "subscribers": subscribers,
        "updates": updates,
        "seconds_to_converge": round(elapsed, 3),
        "deliveries": received[0],
        "deliveries_per_s": round(received[0] / elapsed),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", type=int, default=100_000)
    parser.add_argument("--depth", type=int, default=50)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--updates", type=int, default=2_000)
    args = parser.parse_args(argv)
    import uvloop

    report: dict[str, Any] = {
        "benchmark": "map get/set vs Redis and NATS KV",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "ops": args.ops,
        "depth": args.depth,
        "keys": args.keys,
    }
    processes: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="headwater-map-bench-") as scratch:
        server = ServerProcess(Path(scratch) / "data").start()
        try:
            report["headwater"] = uvloop.run(
                bench_headwater(server.address, args.keys, args.ops, args.depth)
            )
            report["fan_out"] = uvloop.run(fan_out(server.address, 100, args.updates))
            if shutil.which("redis-server"):
                port = free_port()
                processes.append(
                    subprocess.Popen(
                        [
                            "redis-server",
                            "--bind",
                            "127.0.0.1",
                            "--port",
                            str(port),
                            "--save",
                            "",
                            "--appendonly",
                            "no",
                        ],
                        stdout=subprocess.DEVNULL,
                    )
                )
                wait_port(port)
                report["redis"] = uvloop.run(bench_redis(port, args.keys, args.ops, args.depth))
            else:
                print("redis-server not installed: skipped", file=sys.stderr)
            if shutil.which("nats-server"):
                port = free_port()
                processes.append(
                    subprocess.Popen(
                        [
                            "nats-server",
                            "-a",
                            "127.0.0.1",
                            "-p",
                            str(port),
                            "-js",
                            "-sd",
                            str(Path(scratch) / "nats"),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
                wait_port(port)
                report["nats"] = uvloop.run(bench_nats(port, args.keys, args.ops, args.depth))
            else:
                print("nats-server not installed: skipped", file=sys.stderr)
        finally:
            server.stop()
            for process in processes:
                process.terminate()
                process.wait(10)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
