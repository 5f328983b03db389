"""Benchmark rows: what one line of a results table is, how it is measured and summarised.

A `Row` names a workload (the same name for Headwater and its peers, so loadtest/peers.py can
pair them), the system, its kind, a `setup(run)` that prepares a fresh topic/stream/bucket for
each run and returns the client processes to start, and the server process whose CPU is charged
to it. `measure` runs a row `repeats` times and reports the median run (by the row's main figure)
with every run's figure and their spread.

Kinds and their main figure:
- "stream": producers -> one consumer. Non-reliable: messages delivered per second (first send to
  last receive) and what was lost; reliable: messages acknowledged per second (plus delivered).
- "latency": a producer at a fixed rate, the consumer's receive - send time: p50/p99/p999/max.
- "map": one client, `depth` requests per round: operations per second.
- "fanout": one process setting a key, last-value followers in another: deliveries per second.

CPU seconds per million messages are given for the server and for each client process, from the
CPU each spent between the start barrier and its end (loadtest/harness.py).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import headwater
from loadtest import hw_clients as hw
from loadtest import stages
from loadtest.harness import Client, cpu_per_million, median_run, run_row, say

MAIN_FIGURE = {
    "stream": "msgs_per_s",
    "latency": "p99_ms",
    "map": "ops_per_s",
    "fanout": "deliveries_per_s",
}


@dataclass
class Row:
    workload: str  # e.g. "reliable fsync=always 8p 100B": the key peers are paired on
    system: str  # "headwater", "redis streams (AOF everysec)", ...
    kind: str
    setup: Callable[[int], list[Client]]
    server_pid: Callable[[], int | None]
    params: dict[str, Any] = field(default_factory=dict)
    fsync: str = ""  # what this side fsyncs, in words
    reliable: bool = False
    timeout: float = 600.0
    # latency rows of a server started with --trace-every: its GET /debug/stages (loadtest/stages)
    stages: Callable[[], dict[str, Any]] | None = None


_CLIENT_ORDER = ["producer", "consumer", "client", "setter", "followers", "disk"]


def summarize(row: Row, outcome: dict[str, Any]) -> dict[str, Any]:
    clients = outcome["clients"]
    result: dict[str, Any] = {}
    if row.kind in ("stream", "latency"):
        produced, consumed = clients["producer"], clients["consumer"]
        delivered = consumed["received"]
        span = (consumed["last"] - produced["started"]) if delivered else 0.0
        result = {
            "sent": produced["sent"],
            "delivered": delivered,
            "lost": produced["sent"] - delivered,
            "lost_pct": round(100 * (produced["sent"] - delivered) / (produced["sent"] or 1), 2),
            "delivered_msgs_per_s": round(delivered / span) if span > 0 else 0,
            "producer_msgs_per_s": round(
                produced["sent"] / max(1e-9, produced["finished"] - produced["started"])
            ),
        }
        if row.kind == "latency":
            result |= consumed["latency"]
            result["histogram"] = consumed.get("histogram")
            if "disk" in clients:  # fsync `always`: the disk's own fsync, measured beside
                disk = clients["disk"]
                result["disk_fsync_p50_ms"] = disk["p50_ms"]
                result["disk_fsync_p99_ms"] = disk["p99_ms"]
                result["p99_over_disk_fsync_p99"] = round(
                    result["p99_ms"] / max(disk["p99_ms"], 1e-6), 2
                )
            if row.stages is not None:
                result["stages"] = stages.breakdown(
                    row.stages(), consumed["topic"], consumed["subscription"], consumed["samples"]
                )
        else:
            # reliable: what the producers got acknowledged; non-reliable: what arrived
            result["msgs_per_s"] = result[
                "producer_msgs_per_s" if row.reliable else "delivered_msgs_per_s"
            ]
        for key in ("dropped_notified", "slow_consumer_errors"):
            if key in consumed:
                result[key] = consumed[key]
        messages = delivered
    elif row.kind == "map":
        run = clients["client"]
        messages = run["ops"]
        result = {
            "ops": messages,
            "ops_per_s": round(messages / (run["finished"] - run["started"])),
            "round_p50_ms": run["round_p50_ms"],
            "round_p99_ms": run["round_p99_ms"],
        }
    else:  # fanout
        followers = clients["followers"]
        messages = followers["deliveries"]
        seconds = followers["converged"] - clients["setter"]["started"]
        result = {
            "deliveries": messages,
            "seconds_to_converge": round(seconds, 3),
            "deliveries_per_s": round(messages / seconds),
            "sets_per_s": round(
                clients["setter"]["sets"]
                / (clients["setter"]["finished"] - clients["setter"]["started"])
            ),
        }
    cpu = {"server": cpu_per_million(outcome["server_cpu_s"], messages)}
    for name in sorted(clients, key=_CLIENT_ORDER.index):
        cpu[name] = cpu_per_million(clients[name]["cpu_s"], messages)
    result["cpu_s_per_million"] = cpu
    if row.kind == "latency":
        result["client_gc"] = {name: clients[name]["gc"] for name in sorted(clients)}
    return result


def measure(row: Row, repeats: int) -> dict[str, Any]:
    """The median of `repeats` runs; a run that fails makes the row an error (the other rows
    still run), with the failure's text. A latency row also gets `all_runs`: the percentiles of
    every run's messages together (their HDR histograms merged)."""
    head = {"workload": row.workload, "system": row.system, "kind": row.kind, "fsync": row.fsync}
    runs = []
    for run in range(repeats):
        say(f"  {row.system}: {row.workload} (run {run + 1}/{repeats})")
        try:
            clients = row.setup(run)
            runs.append(summarize(row, run_row(row.server_pid(), clients, row.timeout)))
        except Exception as exc:
            say(f"  failed: {exc}")
            return head | row.params | {"error": f"{type(exc).__name__}: {exc}"}
    together = {}
    if row.kind == "latency":
        histograms = [run.pop("histogram", None) for run in runs]
        if all(histograms):
            together["all_runs"] = stages.summary(stages.merged(h for h in histograms if h))
    return head | row.params | median_run(runs, MAIN_FIGURE[row.kind]) | together


# Headwater rows

# Which client API Headwater's client processes use (loadtest/hw_clients.py): "batch" (send_batch,
# lazily decoded receive batches, one map request per round) or "record" (one call per value or
# map operation); `--api` of loadtest.bench and loadtest.peers sets it before rows are made.
CLIENT_API = "batch"

FSYNC_WORDS = {
    "never": "never (acked once written to the OS)",
    "interval": "every 100 ms (fsync.interval.ms), acked before the fsync",
    "always": "before every ack (group commit)",
}


def _topic(address: str, name: str, dispatch: str, configs: dict[str, str] | None) -> None:
    async def create() -> None:
        async with await headwater.connect(address) as client:
            await client.create_topic(name, dispatch=dispatch, configs=configs)  # type: ignore[arg-type]

    asyncio.run(create())


def _name(*parts: object) -> str:
    """A fresh topic name per run: only the characters topic names allow."""
    text = "-".join(["bench", *(str(p) for p in parts), str(time.monotonic_ns())])
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def hw_stream(server: Any, fsync: str | None, producers: int, size: int, messages: int) -> Row:
    """Non-reliable when `fsync` is None, else reliable with that policy."""
    reliable = fsync is not None
    api = CLIENT_API
    workload = (f"reliable fsync={fsync}" if reliable else "non-reliable") + (
        f" {producers}p {size}B"
    )

    def setup(run: int) -> list[Client]:
        topic = _name(workload, run)
        _topic(
            server.address,
            topic,
            "reliable" if reliable else "non-reliable",
            {"fsync": fsync} if fsync else None,
        )
        common = {"address": server.address, "topic": topic, "api": api}
        return [
            Client(
                "producer",
                hw.produce,
                common
                | {
                    "total": messages,
                    "size": size,
                    "producers": producers,
                    "flush_every": 1000 if reliable else 0,
                },
            ),
            Client(
                "consumer",
                hw.consume,
                common
                | {
                    "expected": messages // producers * producers,
                    "quiet": 2.0 if reliable else 0.5,
                },
            ),
        ]

    return Row(
        workload,
        "headwater",
        "stream",
        setup,
        lambda: server.process.pid,
        {"producers": producers, "size": size, "api": api},
        FSYNC_WORDS[fsync] if fsync else "nothing (not stored)",
        reliable,
    )


def hw_latency(
    server: Any,
    fsync: str | None,
    rate: int,
    seconds: float,
    size: int,
    trace_every: int = 0,
    trace: Callable[[int], dict[str, Any]] | None = None,
) -> Row:
    """With `trace_every` and `trace` (the server's GET /debug/stages?every=N), the server traces
    every `trace_every`-th offset during each run, and the row says where its latency went
    (loadtest/stages.py); the other rows run untraced."""
    reliable = fsync is not None
    api = CLIENT_API
    workload = (f"latency reliable fsync={fsync}" if reliable else "latency non-reliable") + (
        f" {rate // 1000}k/s"
    )

    def setup(run: int) -> list[Client]:
        topic = _name(workload, run)
        _topic(
            server.address,
            topic,
            "reliable" if reliable else "non-reliable",
            {"fsync": fsync} if fsync else None,
        )
        if trace is not None and trace_every:
            trace(trace_every)  # from now on (what was traced before is dropped)
        common = {"address": server.address, "topic": topic, "api": api}
        expected = max(1, rate // 1000) * int(seconds * 1000)
        clients = [
            Client(
                "producer",
                hw.produce_at_rate,
                common | {"rate": rate, "seconds": seconds, "size": size},
            ),
            Client(
                "consumer",
                hw.consume,
                common
                | {
                    "expected": expected,
                    "latency": True,
                    "quiet": 1.0,
                    "trace_every": trace_every,
                },
            ),
        ]
        if fsync == "always":  # its goal is relative to the disk's own fsync, measured beside
            probe = {"directory": str(server.data_dir), "seconds": seconds}
            clients.append(Client("disk", hw.fsync_probe, probe))
        return clients

    return Row(
        workload,
        "headwater",
        "latency",
        setup,
        lambda: server.process.pid,
        {"rate": rate, "size": size, "api": api},
        FSYNC_WORDS[fsync] if fsync else "nothing (not stored)",
        reliable,
        # what the run traced, and no more tracing
        stages=(lambda: trace(0)) if trace is not None and trace_every else None,
    )


def hw_map(server: Any, op: str, ops: int, depth: int, keys: int, size: int) -> Row:
    topic = _name("map", op)
    api = CLIENT_API
    filled: list[bool] = []

    def setup(run: int) -> list[Client]:
        if not filled:
            asyncio.run(hw.fill_map(server.address, topic, keys, size))
            filled.append(True)
        args = {"address": server.address, "topic": topic, "op": op, "ops": ops, "api": api}
        return [Client("client", hw.map_ops, args | {"depth": depth, "keys": keys, "size": size})]

    return Row(
        f"map {op}",
        "headwater",
        "map",
        setup,
        lambda: server.process.pid,
        {"depth": depth, "keys": keys, "size": size, "api": api},
        FSYNC_WORDS["interval"] if op == "set" else "",
        True,
    )


def hw_fanout(server: Any, subscribers: int, updates: int) -> Row:
    def setup(run: int) -> list[Client]:
        topic = _name("fanout", run)
        _topic(server.address, topic, "reliable", {"fsync": "interval"})

        async def first_value() -> None:
            async with await headwater.connect(server.address) as client:
                await client.map(topic).set("k", b"0")

        asyncio.run(first_value())
        common = {"address": server.address, "topic": topic, "updates": updates}
        return [
            Client("setter", hw.fanout_setter, common),
            Client("followers", hw.fanout_followers, common | {"subscribers": subscribers}),
        ]

    return Row(
        f"last-value fan-out {subscribers} subscribers",
        "headwater",
        "fanout",
        setup,
        lambda: server.process.pid,
        {"subscribers": subscribers, "updates": updates},
        FSYNC_WORDS["interval"],
        True,
    )
