"""Headwater and its peers side by side, in one run: the ratio Headwater/peer per workload.

Starts a Headwater server, Debian's `redis-server` and `nats-server` (loadtest/peer_servers.py),
each in its own process on a free 127.0.0.1 port with data in a temporary directory, and runs
the same workloads against each with the same client-process setup (loadtest/harness.py: one
producer process, one consumer process, or one client process for maps; Python clients on uvloop
everywhere: headwater, redis-py, nats-py):

| workload | Headwater | Redis | NATS |
|---|---|---|---|
| non-reliable 1p 100B | non-reliable topic | pub/sub | core |
| reliable fsync=interval 1p/8p 100B | fsync every 100 ms | Streams, AOF everysec | JetStream |
| map get / map set | map, 50 in flight | GET / SET, pipelines of 50 | KV, 50 in flight |
| latency non-reliable 10k/50k/100k/s | non-reliable topic | pub/sub | core |

Each row runs three times (`--quick`: once, small counts) and the median run is reported with
user+system CPU seconds per million messages for each server and client process. Rates vary
from run to run on a shared machine; ratios within one run and CPU per message much less. The
report says what each side fsyncs. Servers are stopped by PID at the end, whatever happens.

    python -m loadtest.peers                   # or: make bench-peers
    python -m loadtest.peers --quick --only map
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from headwater.testing import ServerProcess
from loadtest import peer_clients as pc
from loadtest import peer_servers, rows
from loadtest.bench import _scratch_parent, machine
from loadtest.harness import Client, Workload, run_options, say
from loadtest.rows import MAIN_FIGURE, Row

NOT_STORED = "nothing (not stored)"
REDIS_AOF = "the AOF once a second (appendfsync everysec); acked before the fsync"
NATS_FILE = (
    "JetStream file store: written to the OS as it comes, fsync only by a timer "
    "(nats-server 2.9's default, minutes); acked before the fsync"
)
RATES = (10_000, 50_000, 100_000)


def _stream_row(
    workload: str,
    system: str,
    server: peer_servers.PeerServer,
    fsync: str,
    clients: tuple[Workload, Workload],
    args: Callable[[str], tuple[dict[str, Any], dict[str, Any]]],
    params: dict[str, Any],
    kind: str = "stream",
) -> Row:
    """A producer/consumer row of a peer: `args(name)` gives both processes' arguments for a
    fresh channel, stream or subject `name` per run."""
    tag = time.monotonic_ns()

    def setup(run: int) -> list[Client]:
        produce_args, consume_args = args(f"b{tag}_{run}")
        return [
            Client("producer", clients[0], {"port": server.port} | produce_args),
            Client("consumer", clients[1], {"port": server.port} | consume_args),
        ]

    reliable = fsync != NOT_STORED
    return Row(workload, system, kind, setup, lambda: server.pid, params, fsync, reliable)


def _map_row(op: str, system: str, server: peer_servers.PeerServer, client: Workload,
             fsync: str, args: dict[str, Any]) -> Row:  # fmt: skip
    params = {"depth": 50, "keys": 10_000, "size": 100}
    kwargs = {"port": server.port, "op": op} | params | args
    return Row(
        f"map {op}", system, "map", lambda run: [Client("client", client, kwargs)],
        lambda: server.pid, params, fsync if op == "set" else "", True,
    )  # fmt: skip


def peer_rows(
    redis: peer_servers.PeerServer, nats: peer_servers.PeerServer, quick: bool
) -> list[Row]:
    scale = 5 if quick else 1
    seconds = 1.5 if quick else 5.0
    out: list[Row] = []

    def flood(key: str, total: int, producers: int = 1, flush_every: int = 0) -> Any:
        """Arguments for `total` messages from `producers` to a fresh `key` (channel, ...)."""
        extra = {"flush_every": flush_every} if flush_every else {}
        expected = total // producers * producers
        return lambda name: (
            {key: name, "total": total, "size": 100, "producers": producers} | extra,
            {key: name, "expected": expected},
        )

    def jetstream(total: int, producers: int) -> Any:
        def args(name: str) -> Any:
            asyncio.run(pc.js_setup(nats.port, name, f"js.{name}"))
            return flood("subject", total, producers, 1000)(f"js.{name}")

        return args

    params = {"producers": 1, "size": 100}
    out.append(_stream_row(
        "non-reliable 1p 100B", "redis pub/sub", redis, NOT_STORED,
        (pc.redis_publish, pc.redis_subscribe), flood("channel", 300_000 // scale), params,
    ))  # fmt: skip
    out.append(_stream_row(
        "non-reliable 1p 100B", "nats core", nats, NOT_STORED,
        (pc.nats_publish, pc.nats_subscribe), flood("subject", 600_000 // scale), params,
    ))  # fmt: skip
    for producers in (1, 8):
        workload = f"reliable fsync=interval {producers}p 100B"
        params = {"producers": producers, "size": 100}
        out.append(_stream_row(
            workload, "redis streams (AOF everysec)", redis, REDIS_AOF,
            (pc.redis_xadd, pc.redis_xread),
            flood("stream", 200_000 // scale, producers, 1000), params,
        ))  # fmt: skip
        out.append(_stream_row(
            workload, "nats jetstream (file)", nats, NATS_FILE,
            (pc.js_publish, pc.js_consume), jetstream(100_000 // scale, producers), params,
        ))  # fmt: skip

    asyncio.run(pc.redis_fill(redis.port, 10_000, 100))
    asyncio.run(pc.kv_fill(nats.port, "bench", 10_000, 100))
    for op in ("get", "set"):
        ops = {"ops": 100_000 // scale}
        out.append(_map_row(op, "redis (pipelined)", redis, pc.redis_map, REDIS_AOF, ops))
        out.append(_map_row(op, "nats kv", nats, pc.nats_kv, NATS_FILE, ops | {"bucket": "bench"}))

    for rate in RATES:
        expected = max(1, rate // 1000) * int(seconds * 1000)

        def steady(key: str, rate: int = rate, expected: int = expected) -> Any:
            return lambda name: (
                {key: name, "rate": rate, "seconds": seconds, "size": 100},
                {key: name, "expected": expected, "latency": True, "quiet": 1.0},
            )

        workload = f"latency non-reliable {rate // 1000}k/s"
        params = {"rate": rate, "size": 100}
        out.append(_stream_row(
            workload, "redis pub/sub", redis, NOT_STORED,
            (pc.redis_publish_at_rate, pc.redis_subscribe), steady("channel"), params, "latency",
        ))  # fmt: skip
        out.append(_stream_row(
            workload, "nats core", nats, NOT_STORED,
            (pc.nats_publish_at_rate, pc.nats_subscribe), steady("subject"), params, "latency",
        ))  # fmt: skip
    return out


def headwater_rows(server: ServerProcess, quick: bool) -> list[Row]:
    scale = 5 if quick else 1
    seconds = 1.5 if quick else 5.0
    out = [rows.hw_stream(server, None, 1, 100, 600_000 // scale)]
    out += [rows.hw_stream(server, "interval", p, 100, 400_000 // scale) for p in (1, 8)]
    out += [rows.hw_map(server, op, 100_000 // scale, 50, 10_000, 100) for op in ("get", "set")]
    out += [rows.hw_latency(server, None, rate, seconds, 100) for rate in RATES]
    return out


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Headwater/peer for every workload both ran: rates (higher is better for Headwater when
    above 1) and p99 latency (below 1 means Headwater's is lower)."""
    ours = {r["workload"]: r for r in results if r["system"] == "headwater"}
    table = []
    for peer in results:
        mine = ours.get(peer["workload"])
        if peer["system"] == "headwater" or mine is None or "error" in peer or "error" in mine:
            continue
        key = MAIN_FIGURE[peer["kind"]]
        theirs = peer.get(key) or 0
        table.append({
            "workload": peer["workload"],
            "peer": peer["system"],
            "figure": key,
            "headwater": mine.get(key),
            "peer_value": theirs,
            "ratio": round(mine.get(key, 0) / theirs, 2) if theirs else None,
            "server_cpu_s_per_million": {
                "headwater": mine["cpu_s_per_million"]["server"],
                "peer": peer["cpu_s_per_million"]["server"],
            },
            "fsync": {"headwater": mine["fsync"], "peer": peer["fsync"]},
        })  # fmt: skip
    return table


def ratio_table(pairs: list[dict[str, Any]]) -> str:
    lines = [
        f"{'workload':<32} {'peer':<29} {'headwater':>13} {'peer':>13} {'ratio':>6}  "
        "server CPU-s/M hw|peer"
    ]
    for pair in pairs:
        latency = pair["figure"] == "p99_ms"
        fmt = "{:,.3f} ms" if latency else "{:,.0f}/s"
        cpu = pair["server_cpu_s_per_million"]
        lines.append(
            f"{pair['workload']:<32} {pair['peer'][:29]:<29} "
            f"{fmt.format(pair['headwater'] or 0):>13} {fmt.format(pair['peer_value']):>13} "
            f"{pair['ratio'] if pair['ratio'] is not None else '-':>6}  "
            f"{cpu['headwater']} | {cpu['peer']}"
        )
    lines.append("ratio = headwater / peer (for p99 latency, below 1 means Headwater's is lower)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = run_options(__doc__, "workloads", "peers-throughput.png, peers-latency.png")
    args = parser.parse_args(argv)
    rows.CLIENT_API = args.api
    absent = peer_servers.missing()
    if absent:
        print(
            f"not installed: {', '.join(absent)}. Install Debian's packages "
            "(`apt-get install redis-server nats-server`, or `make bench-peers`).",
            file=sys.stderr,
        )
        return 2
    repeats = args.repeats or (1 if args.quick else 3)
    report: dict[str, Any] = {
        "benchmark": "headwater and peers",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "quick": args.quick,
        "api": args.api,
        "repeats": repeats,
        "machine": machine(),
    }
    started = time.monotonic()
    servers: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="headwater-peers-", dir=_scratch_parent()) as scratch:
        try:
            server = ServerProcess(Path(scratch) / "data").start()
            servers.append(server)
            redis = peer_servers.redis(Path(scratch))
            servers.append(redis)
            nats = peer_servers.nats(Path(scratch))
            servers.append(nats)
            report["versions"] = {"redis": redis.version(), "nats": nats.version()}
            every = headwater_rows(server, args.quick) + peer_rows(redis, nats, args.quick)
            every = [row for row in every if not args.only or args.only in row.workload]
            every.sort(
                key=lambda row: (
                    row.kind,
                    row.workload.split(" ")[:-1],
                    row.params.get("rate", 0),
                    row.system != "headwater",
                )
            )
            results = []
            for index, row in enumerate(every, 1):
                say(f"[{index}/{len(every)}] {row.workload}: {row.system}")
                results.append(rows.measure(row, repeats))
        finally:
            for process in reversed(servers):
                process.stop()
    report["seconds"] = round(time.monotonic() - started, 1)
    report["machine"]["load_average_after"] = machine()["load_average"]
    report["results"] = results
    report["ratios"] = ratios(results)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n")
    if args.charts:
        from loadtest.charts import latency_chart, throughput_chart

        args.charts.mkdir(parents=True, exist_ok=True)
        stamp = f"{report['date'][:10]}, median of {repeats}"
        throughput_chart(
            results, args.charts / "peers-throughput.png", f"Headwater and peers ({stamp})"
        )
        latency_chart(
            results, args.charts / "peers-latency.png", f"Latency, Headwater and peers ({stamp})"
        )
    if args.format == "json":
        print(json.dumps(report, indent=2))
    elif args.format == "markdown":
        from loadtest.report import ratios_markdown

        print(ratios_markdown(report["ratios"]))
    else:
        print(
            f"{report['date']}, {repeats} run(s) per row, {report['seconds']} s, "
            f"load {report['machine']['load_average']}"
        )
        print(f"peers: {report['versions']['redis']}; {report['versions']['nats']}")
        print(ratio_table(report["ratios"]))
        print("what each side fsyncs:")
        for system, fsync in sorted({(r["system"], r["fsync"]) for r in results if r["fsync"]}):
            print(f"  {system}: {fsync}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
