"""Many topics: how long creating, stopping and restarting take, and how long others wait meanwhile.

A server is started in a temporary directory; N reliable topics are created over one connection
(64 requests in flight), while a second connection sends API_VERSIONS every 10 ms and records its
round trips (the stall other clients see). Then the server is stopped gracefully (SIGTERM), started
again (recovery of N topics) and stopped again. Each phase is timed, along with the server's CPU
seconds, read from /proc before it exits.

    python -m loadtest.lifecycle_bench --topics 10000 [--format json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import headwater
from headwater.testing import ServerProcess


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stop(server: ServerProcess) -> tuple[float, float]:
    """Seconds from SIGTERM to exit, and the server's CPU seconds up to the signal."""
    assert server.process is not None
    cpu = _cpu_seconds(server.process.pid)
    started = time.monotonic()
    server.stop(timeout=600)
    return time.monotonic() - started, cpu


async def _create(address: str, topics: int, progress: bool) -> tuple[float, list[float]]:
    probe = await headwater.connect(address)
    lags: list[float] = []
    done = asyncio.Event()

    async def ping() -> None:
        while not done.is_set():
            sent = time.monotonic()
            await probe.api_versions()
            lags.append(time.monotonic() - sent)
            await asyncio.sleep(0.01)

    pinger = asyncio.create_task(ping())
    slots = asyncio.Semaphore(64)
    created = 0
    async with await headwater.connect(address) as client:

        async def one(index: int) -> None:
            nonlocal created
            async with slots:
                await client.create_topic(f"t{index}", dispatch="reliable")
            created += 1
            if progress and created % 500 == 0:
                print(f"\rcreated {created}/{topics}", end="", file=sys.stderr, flush=True)

        started = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(topics)))
        elapsed = time.monotonic() - started
    if progress:
        print(file=sys.stderr)
    done.set()
    await pinger
    await probe.close()
    return elapsed, lags


def run(topics: int, progress: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="hw-lifecycle-") as directory:
        server = ServerProcess(Path(directory) / "data").start()
        try:
            create_s, lags = asyncio.run(_create(server.address, topics, progress))
            stop_s, create_cpu = _stop(server)
            started = time.monotonic()
            server.start(timeout=600)
            start_s = time.monotonic() - started
            restart_stop_s, restart_cpu = _stop(server)
        finally:
            server.kill()
    lags.sort()
    return {
        "topics": topics,
        "create_s": round(create_s, 2),
        "create_and_stop_cpu_s": round(create_cpu, 2),
        "probe_p99_ms": round(lags[int(len(lags) * 0.99)] * 1000, 1) if lags else None,
        "probe_max_ms": round(lags[-1] * 1000, 1) if lags else None,
        "stop_s": round(stop_s, 2),
        "restart_s": round(start_s, 2),
        "restart_cpu_s": round(restart_cpu, 2),
        "stop_after_restart_s": round(restart_stop_s, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=10_000, help="reliable topics to create")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output")
    args = parser.parse_args(argv)
    if args.topics < 1:
        parser.error("--topics must be at least 1")
    result = run(args.topics, progress=sys.stderr.isatty())
    if args.format == "json":
        print(json.dumps(result))
    else:
        for name, value in result.items():
            print(f"{name:24} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
