"""Headwater and its peers side by side, in one run: the ratio Headwater/peer per workload.

Starts a Headwater server, Debian's `redis-server` and `nats-server` (loadtest/peer_servers.py),
each in its own process on a free 127.0.0.1 port with data in a temporary directory, and runs
the same workloads against each with the same client-process setup (loadtest/harness.py: one
producer process, one consumer process, or one client process for maps; Python clients on uvloop
everywhere: headwater, redis-py, nats-py):

| workload | Headwater | Redis | NATS |
|---|---|---|---|
| non-reliable 1p 100B | non-reliable topic | pub/sub | core |
| reliable fsync=interval 1p/8p 100B | reliable, fsync every 100 ms | Streams, AOF everysec | JetStream file store |
| map get / map set | map durable, 50 in flight | GET / SET, pipeline of 50 | KV get / put, 50 in flight |
| latency non-reliable 10k/50k/100k/s | non-reliable topic | pub/sub | core |

Each row runs three times (`--quick`: once, small counts) and the median run is reported with
user+system CPU seconds per million messages for each server and client process. Rates vary
from run to run on a shared machine; ratios within one run and CPU per message much less. The
report says what each side fsyncs. Servers are stopped by PID at the end, whatever happens.

    python -m loadtest.peers                   # or: make bench-peers
    python -m loadtest.peers --quick --only map
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from headwater.testing import ServerProcess
from loadtest import peer_clients as pc
from loadtest import peer_servers, rows
from loadtest.bench import _scratch_parent, machine
from loadtest.harness import Client, say
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
    pid: int,
    fsync: str,
    reliable: bool,
    setup: Any,
    producer: Any,
    consumer: Any,
    params: dict[str, Any],
    kind: str = "stream",
) -> Row:
    """A peer row: `setup(run)` returns (producer kwargs, consumer kwargs) for a fresh run."""

    def clients(run: int) -> list[Client]:
        produce_args, consume_args = setup(run)
        return [Client("producer", producer, produce_args), Client("consumer", consumer, consume_args)]

    return Row(workload, system, kind, clients, lambda: pid, params, fsync, reliable)


def peer_rows(redis: peer_servers.PeerServer, nats: peer_servers.PeerServer, quick: bool) -> list[Row]:
    scale = 5 if quick else 1
    seconds = 1.5 if quick else 5.0
    out: list[Row] = []
    tag = time.monotonic_ns()

    def pubsub(count: int, producers: int) -> Any:
        return lambda run: (
            {"port": redis.port, "channel": f"c{tag}-{run}-{producers}", "total": count, "size": 100, "producers": producers},
            {"port": redis.port, "channel": f"c{tag}-{run}-{producers}", "expected": count // producers * producers},
        )

    def core(count: int, producers: int) -> Any:
        return lambda run: (
            {"port": nats.port, "subject": f"core.{tag}.{run}.{producers}", "total": count, "size": 100, "producers": producers},
            {"port": nats.port, "subject": f"core.{tag}.{run}.{producers}", "expected": count // producers * producers},
        )

    out.append(_stream_row(
        "non-reliable 1p 100B", "redis pub/sub", redis.pid, NOT_STORED, False,
        pubsub(300_000 // scale, 1), pc.redis_publish, pc.redis_subscribe, {"producers": 1, "size": 100},
    ))  # fmt: skip
    out.append(_stream_row(
        "non-reliable 1p 100B", "nats core", nats.pid, NOT_STORED, False,
        core(600_000 // scale, 1), pc.nats_publish, pc.nats_subscribe, {"producers": 1, "size": 100},
    ))  # fmt: skip

    for producers in (1, 8):
        def streams(run: int, producers: int = producers) -> Any:
            count = 200_000 // scale
            stream = f"s{tag}-{run}-{producers}"
            return (
                {"port": redis.port, "stream": stream, "total": count, "size": 100, "producers": producers, "flush_every": 1000},
                {"port": redis.port, "stream": stream, "expected": count // producers * producers},
            )

        def jetstream(run: int, producers: int = producers) -> Any:
            count = 100_000 // scale
            subject = f"js.{tag}.{run}.{producers}"
            asyncio.run(pc.js_setup(nats.port, f"S{tag}_{run}_{producers}", subject))
            return (
                {"port": nats.port, "subject": subject, "total": count, "size": 100, "producers": producers, "flush_every": 1000},
                {"port": nats.port, "subject": subject, "expected": count // producers * producers},
            )

        workload = f"reliable fsync=interval {producers}p 100B"
        params = {"producers": producers, "size": 100}
        out.append(_stream_row(
            workload, "redis streams (AOF everysec)", redis.pid, REDIS_AOF, True,
            streams, pc.redis_xadd, pc.redis_xread, params,
        ))  # fmt: skip
        out.append(_stream_row(
            workload, "nats jetstream (file)", nats.pid, NATS_FILE, True,
            jetstream, pc.js_publish, pc.js_consume, params,
        ))  # fmt: skip

    ops = 100_000 // scale
    asyncio.run(pc.redis_fill(redis.port, 10_000, 100))
    asyncio.run(pc.kv_fill(nats.port, "bench", 10_000, 100))
    for op in ("get", "set"):
        common = {"op": op, "ops": ops, "depth": 50, "keys": 10_000, "size": 100}
        params = {"depth": 50, "keys": 10_000, "size": 100}
        out.append(Row(
            f"map {op}", "redis (pipelined)", "map",
            lambda run, common=common: [Client("client", pc.redis_map, {"port": redis.port} | common)],
            lambda: redis.pid, params, REDIS_AOF if op == "set" else "", True,
        ))  # fmt: skip
        out.append(Row(
            f"map {op}", "nats kv", "map",
            lambda run, common=common: [Client("client", pc.nats_kv, {"port": nats.port, "bucket": "bench"} | common)],
            lambda: nats.pid, params, NATS_FILE if op == "set" else "", True,
        ))  # fmt: skip

    for rate in RATES:
        workload = f"latency non-reliable {rate // 1000}k/s"
        expected = max(1, rate // 1000) * int(seconds * 1000)

        def at_rate(key: str, port: int, prefix: str, rate: int = rate, expected: int = expected) -> Any:
            return lambda run: (
                {"port": port, key: f"{prefix}{tag}.{run}.{rate}", "rate": rate, "seconds": seconds, "size": 100},
                {"port": port, key: f"{prefix}{tag}.{run}.{rate}", "expected": expected, "latency": True, "quiet": 1.0},
            )

        params = {"rate": rate, "size": 100}
        out.append(_stream_row(
            workload, "redis pub/sub", redis.pid, NOT_STORED, False,
            at_rate("channel", redis.port, "lat"), pc.redis_publish_at_rate, pc.redis_subscribe,
            params, "latency",
        ))  # fmt: skip
        out.append(_stream_row(
            workload, "nats core", nats.pid, NOT_STORED, False,
            at_rate("subject", nats.port, "lat."), pc.nats_publish_at_rate, pc.nats_subscribe,
            params, "latency",
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
        f"{'workload':<32} {'peer':<29} {'headwater':>13} {'peer':>13} {'ratio':>6}  server CPU-s/M hw|peer"
    ]
    for pair in pairs:
        latency = pair["figure"] == "p99_ms"
        fmt = "{:,.3f} ms" if latency else "{:,.0f}/s"
        cpu = pair["server_cpu_s_per_million"]
        lines.append(
            f"{pair['workload']:<32} {pair['peer'][:29]:<29} "
            f"{fmt.format(pair['headwater'] or 0):>13} {fmt.format(pair['peer_value']):>13} "
            f"{pair['ratio'] if pair['ratio'] is not None else '-':>6}  {cpu['headwater']} | {cpu['peer']}"
        )
    lines.append("ratio = headwater / peer (for p99 latency, below 1 means Headwater's is lower)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="each row once, small counts")
    parser.add_argument("--repeats", type=int, help="runs per row (default 3, 1 with --quick)")
    parser.add_argument("--only", help="run only the workloads containing this text")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    parser.add_argument("--output", type=Path, help="also write the JSON report here")
    parser.add_argument("--charts", type=Path, help="write peers-throughput.png, peers-latency.png here")
    args = parser.parse_args(argv)
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
            every.sort(key=lambda row: (row.kind, row.workload.split(" ")[:-1], row.params.get("rate", 0), row.system != "headwater"))
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
        throughput_chart(results, args.charts / "peers-throughput.png", f"Headwater and peers ({stamp})")
        latency_chart(results, args.charts / "peers-latency.png", f"Latency, Headwater and peers ({stamp})")
    if args.format == "json":
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['date']}, {repeats} run(s) per row, {report['seconds']} s, load {report['machine']['load_average']}")
        print(f"peers: {report['versions']['redis']}; {report['versions']['nats']}")
        print(ratio_table(report["ratios"]))
        print("what each side fsyncs:")
        for system, fsync in sorted({(r["system"], r["fsync"]) for r in results if r["fsync"]}):
            print(f"  {system}: {fsync}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
