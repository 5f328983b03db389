"""The plumbing every benchmark here shares: client processes, CPU accounting, percentiles.

A benchmark row runs one server (Headwater, Redis or NATS, each in its own process) and one or more
client processes. `run_row` starts the client processes from a fork server (a fresh interpreter
that imported the client library, nothing else: see `CLIENT_MODULES`); each sets up (connects,
subscribes) and waits on a barrier, so the clock and the CPU counters start only when every
client is ready. Each client measures its own user+system CPU time (`time.process_time()`) from
the barrier to its end; the server's is read from /proc/<pid>/stat before and after (in clock
ticks, 10 ms: a row should give the server a second of work or more). Dividing by the messages
that went through gives CPU seconds per million messages: on this shared 2-core machine a rate
can vary 2x from run to run, while CPU per message is far steadier, so that is the figure to
compare commits with.

Clients talk to each other only through a multiprocessing `Event` ("the producers are done") and
report one dict each on a queue. Times are `time.monotonic()` (CLOCK_MONOTONIC, the same clock in
every process), so the parent can combine a producer's start with a consumer's last receive.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from loadtest import stages

TICKS = os.sysconf("SC_CLK_TCK")
SETUP_TIMEOUT = 60.0  # seconds a client may take to connect and subscribe

Workload = Callable[..., Coroutine[Any, Any, dict[str, Any]]]


def progress_enabled() -> bool:
    """Progress lines only when a person watches (stderr is a terminal)."""
    return sys.stderr.isatty()


def say(text: str) -> None:
    if progress_enabled():
        print(text, file=sys.stderr, flush=True)


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


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # after the ")" closing the command name: state is field 3, utime 14 and stime 15
    return (int(fields[11]) + int(fields[12])) / TICKS


def process_rss(pid: int) -> int:
    """Resident set size in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def process_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def latency_summary(latencies_ns: Iterable[int]) -> dict[str, float]:
    """p50/p99/p999/max in milliseconds, through an HDR histogram (3 significant digits)."""
    return stages.summary(latency_histogram(latencies_ns))


def latency_histogram(latencies_ns: Iterable[int]) -> Any:
    """The latencies in an HDR histogram (microseconds): `.encode()` carries it to the parent,
    which merges a row's runs (loadtest/rows.py)."""
    recorded = stages.histogram()
    for nanoseconds in latencies_ns:
        stages.record_ns(recorded, nanoseconds)
    return recorded


@dataclass
class Client:
    """One client process: `workload(ctx, **kwargs)` run on uvloop."""

    name: str
    workload: Workload
    kwargs: dict[str, Any] = field(default_factory=dict)


def run_options(description: str | None, rows: str, charts: str) -> argparse.ArgumentParser:
    """The options loadtest/bench.py and loadtest/peers.py share; `rows` says what `--only`
    filters, `charts` which PNG files `--charts` writes."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="each row once, small counts")
    parser.add_argument("--repeats", type=int, help="runs per row (default 3, 1 with --quick)")
    parser.add_argument("--only", help=f"run only the {rows} containing this text")
    parser.add_argument("--format", choices=["table", "json", "markdown"], default="table")
    parser.add_argument(
        "--api",
        choices=["batch", "record"],
        default="batch",
        help="Headwater's client API: batch calls (default) or one call per record",
    )
    parser.add_argument("--output", type=Path, help="also write the JSON report here")
    parser.add_argument("--charts", type=Path, help=f"write {charts} here")
    return parser


async def ticks(started: float, seconds: float) -> AsyncIterator[int]:
    """The 1 ms ticks of a paced sender, from `started` for `seconds`: yields each tick's number,
    then sleeps until the next one is due (a late sender catches up without sleeping)."""
    for tick in range(int(seconds * 1000)):
        yield tick
        delay = started + (tick + 1) / 1000 - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


class GcPauses:
    """The client process's garbage collections from `start` on, each with its generation and
    how long it held the process (`gc.callbacks`): a client's tail is often one of them, and the
    server's stall report cannot see it."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []  # (generation, seconds)
        self._began = 0.0
        self._reported = 0  # pauses already given by `longest_since_last`

    def start(self) -> None:
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._began = now
        else:
            self.pauses.append((info["generation"], now - self._began))

    def longest_since_last(self) -> dict[str, float] | None:
        """The longest collection since the last call: {"ms", "generation"}, None if none ran."""
        recent, self._reported = self.pauses[self._reported :], len(self.pauses)
        if not recent:
            return None
        generation, seconds = max(recent, key=lambda pause: pause[1])
        return {"ms": round(seconds * 1000, 2), "generation": generation}

    def summary(self) -> dict[str, dict[str, float]]:
        """Per generation: how many collections ran, the longest and their total, in ms."""
        by_generation: dict[int, list[float]] = {}
        for generation, seconds in self.pauses:
            by_generation.setdefault(generation, []).append(seconds * 1000)
        return {
            f"gen{generation}": {
                "count": len(times),
                "longest_ms": round(max(times), 2),
                "total_ms": round(sum(times), 2),
            }
            for generation, times in sorted(by_generation.items())
        }


class Context:
    """What a client workload gets: `await ctx.start()` after its setup, `ctx.cpu()` at its end,
    the shared "producers done" event, and its process's collections from the start (`gc`)."""

    def __init__(self, barrier: Any, produced: Any) -> None:
        self._barrier = barrier
        self.produced = produced
        self._cpu_start = 0.0
        self.gc = GcPauses()

    async def start(self) -> float:
        """Wait until every client of the row is ready; returns the start time."""
        await asyncio.to_thread(self._barrier.wait, SETUP_TIMEOUT)
        self._cpu_start = time.process_time()  # user + system, all threads, ns resolution
        self.gc.start()
        return time.monotonic()

    def cpu(self) -> float:
        return round(time.process_time() - self._cpu_start, 4)


# Client processes come from a fork server, not from a fork of the benchmark: a forked child
# inherited the parent's heap (every earlier row's results), and its first full garbage collection
# walked all of it, touching copy-on-write pages: 30-60 ms in which a consumer read nothing, which
# the first latency row reported as its p99 (docs/BENCHMARKS.md, "The benchmark's own tail").
# The fork server imports these once; each client forks from it, a process like a user's.
CLIENT_MODULES: Final = ["uvloop", "headwater.client.client", "loadtest.hw_clients"]


def _client_main(client: Client, barrier: Any, produced: Any, out: Any) -> None:
    import uvloop

    context = Context(barrier, produced)
    try:
        result = uvloop.run(client.workload(context, **client.kwargs))
    except BaseException as exc:
        barrier.abort()  # nobody waits forever for a client that failed in its setup
        out.put((client.name, {"error": f"{type(exc).__name__}: {exc}"}))
        raise
    result["gc"] = context.gc.summary()
    out.put((client.name, result))


def run_row(
    server_pid: int | None,
    clients: Sequence[Client],
    timeout: float,
    on_tick: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run the clients at once; returns {"clients": {name: result}, "server_cpu_s": ...}.

    Each result carries the client's "cpu_s". Every wait is bounded by `timeout`. `on_tick` is
    called about once a second while the clients run (the soak samples the server with it)."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(CLIENT_MODULES)
    barrier = context.Barrier(len(clients) + 1)
    produced = context.Event()
    out = context.Queue()
    processes = [
        context.Process(target=_client_main, args=(c, barrier, produced, out), daemon=True)
        for c in clients
    ]
    for process in processes:
        process.start()
    results: dict[str, dict[str, Any]] = {}
    try:
        try:
            barrier.wait(SETUP_TIMEOUT)
        except Exception:
            raise RuntimeError(_errors(out, results) or "a client did not get ready") from None
        server_before = process_cpu(server_pid) if server_pid else 0.0
        deadline = time.monotonic() + timeout
        while len(results) < len(clients):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"row timed out after {timeout:.0f}s: {sorted(results)} done")
            if on_tick is not None:
                on_tick()
            try:
                name, result = out.get(timeout=min(1.0, remaining))
            except Exception:
                if any(p.exitcode not in (None, 0) for p in processes):
                    raise RuntimeError(_errors(out, results) or "a client died") from None
                continue
            if "error" in result:
                raise RuntimeError(f"client {name}: {result['error']}")
            results[name] = result
        server_cpu = process_cpu(server_pid) - server_before if server_pid else 0.0
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)
    return {"clients": results, "server_cpu_s": round(server_cpu, 3)}


def _errors(out: Any, results: dict[str, Any]) -> str:
    errors = []
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        try:
            name, result = out.get(timeout=0.2)
        except Exception:
            break
        if "error" in result:
            errors.append(f"client {name}: {result['error']}")
        else:
            results[name] = result
    return "; ".join(errors)


def cpu_per_million(seconds: float, messages: int) -> float | None:
    return round(seconds / messages * 1e6, 2) if messages else None


def median_run(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run whose `key` is the median (the lower middle for an even count): its other figures
    stay consistent with each other, which a per-field median would not be."""
    ordered = sorted(runs, key=lambda r: r.get(key) or 0)
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["runs"] = [r.get(key) for r in runs]
    if len(runs) > 1:
        values = [r.get(key) or 0 for r in runs]
        chosen["spread"] = round((max(values) - min(values)) / (statistics.median(values) or 1), 2)
    return chosen
