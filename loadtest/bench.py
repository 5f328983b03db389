"""The benchmark matrix: every Headwater workload, each row run three times (latency rows five),
median reported.

One server (`python -m headwater serve`, its own process, data in a temporary directory on the
same disk as the project) and client processes for every row (loadtest/harness.py):

- non-reliable and reliable with fsync never, interval and always; 1 and 8 producers (connections
  in one producer process); 100 B and 1 KiB values; one consumer process;
- map get and map set (50 requests in flight), last-value fan-out to 100 subscribers;
- end-to-end latency p50/p99/p999 at 10,000, 50,000 and 100,000 msgs/s, non-reliable and reliable
  with fsync always, recorded into HDR histograms, five runs a row (their histograms merged as
  `all_runs`); during these rows the server traces every `TRACE_EVERY`-th offset (turned on and
  off through GET /debug/stages?every=N, so the throughput rows run untraced), and each row says
  where its time went, stage by stage, for the p99 and p999 messages (loadtest/stages.py); beside
  each fsync `always` row a probe process times the disk's own fsyncs (a 4 KiB write and an fsync
  every 10 ms in the server's data directory), and the row gives its p99 over theirs; each
  latency row also counts its client processes' garbage collections by generation, with the
  longest (`client_gc`, loadtest/harness.py `GcPauses`): the server's stall report cannot see a
  client held by its collector.

Each row gives its main figure (msgs/s delivered for non-reliable, acknowledged for reliable; ops/s;
deliveries/s; p99), every run's figure and their spread, and the user+system CPU seconds per
million messages of the server and of each client process: CPU per message is the steadier figure
on a shared machine. `--quick` runs each row once with small counts (about a minute). Progress
goes to stderr when it is a terminal; the report to stdout (a table, `--format json` or
`--format markdown`); PNG charts with `--charts DIR`.

    python -m loadtest.bench --quick
    python -m loadtest.bench --format json --output loadtest/results/matrix.json --charts docs/
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from headwater.testing import ServerProcess
from loadtest import rows as r
from loadtest import stages
from loadtest.harness import run_options, say

RATES = (10_000, 50_000, 100_000)
# during the latency rows the server traces every 100th offset's stages
# (server/net/stage_trace.py): at 10,000 msgs/s for 5 s, 500 sampled messages per run
TRACE_EVERY = 100
LATENCY_RUNS = 5  # a latency row's tail moves more between runs than a rate does


def matrix(
    server: ServerProcess, quick: bool, http_address: str, trace_every: int = TRACE_EVERY
) -> list[r.Row]:
    scale = 5 if quick else 1
    seconds = 1.5 if quick else 5.0
    counts = {  # messages per run, by (reliable, size)
        (False, 100): 600_000,
        (False, 1024): 200_000,
        (True, 100): 400_000,
        (True, 1024): 150_000,
    }
    rows: list[r.Row] = []
    for fsync in (None, "never", "interval", "always"):
        for producers in (1, 8):
            for size in (100, 1024):
                count = counts[(fsync is not None, size)] // scale
                rows.append(r.hw_stream(server, fsync, producers, size, count))
    ops = 100_000 // scale
    rows.append(r.hw_map(server, "get", ops, 50, 10_000, 100))
    rows.append(r.hw_map(server, "set", ops, 50, 10_000, 100))
    rows.append(r.hw_fanout(server, 100, 2_000 // scale))
    for fsync in (None, "always"):
        for rate in RATES:
            rows.append(
                r.hw_latency(
                    server,
                    fsync,
                    rate,
                    seconds,
                    100,
                    trace_every,
                    lambda every: stages.fetch(http_address, every),
                )
            )
    return rows


def machine() -> dict[str, Any]:
    memory = ""
    try:
        with open("/proc/meminfo") as meminfo:
            memory = meminfo.readline().split(":", 1)[1].strip()
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "memory": memory,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def client_gc_line(by_client: dict[str, dict[str, dict[str, float]]]) -> str:
    """The clients' collections in a row's median run: "client collections: producer: gen0 20
    (longest 0.2 ms), gen1 2 (longest 1.3 ms); consumer: ..."."""
    parts = []
    for name, generations in by_client.items():
        counts = ", ".join(
            f"{generation} {g['count']:g} (longest {g['longest_ms']} ms)"
            for generation, g in generations.items()
        )
        parts.append(f"{name}: {counts or 'none'}")
    return "client collections: " + "; ".join(parts)


def table(results: list[dict[str, Any]]) -> str:
    """A plain-text table: the main figure, spread, loss and CPU-s per million per process."""
    lines = [
        f"{'workload':<40} {'system':<28} {'figure':>14} {'spread':>6} {'lost':>7}  "
        "CPU-s per million msgs"
    ]
    for row in results:
        if "error" in row:
            lines.append(f"{row['workload']:<40} {row['system'][:28]:<28} failed: {row['error']}")
            continue
        key = r.MAIN_FIGURE[row["kind"]]
        figure = row.get(key)
        unit = " ms p99" if row["kind"] == "latency" else "/s"
        text = f"{figure:,.3f}{unit}" if row["kind"] == "latency" else f"{figure:,.0f}{unit}"
        lost = f"{row['lost_pct']}%" if "lost_pct" in row else ""
        cpu = ", ".join(
            f"{name} {value:.2f}" if value is not None else f"{name} -"
            for name, value in row["cpu_s_per_million"].items()
        )
        spread = f"{row['spread']:.0%}" if "spread" in row else ""
        lines.append(
            f"{row['workload']:<40} {row['system'][:28]:<28} {text:>14} {spread:>6} {lost:>7}"
            f"  {cpu}"
        )
        if row["kind"] == "latency":
            lines.append(
                f"{'':<69}p50 {row['p50_ms']} p999 {row['p999_ms']} max {row['max_ms']} ms, "
                f"sent at {row['producer_msgs_per_s']:,}/s"
            )
            if "disk_fsync_p99_ms" in row:
                lines.append(
                    f"{'':<69}the disk's own fsync beside it: p50 {row['disk_fsync_p50_ms']} "
                    f"p99 {row['disk_fsync_p99_ms']} ms; p99 / fsync p99 "
                    f"{row['p99_over_disk_fsync_p99']}"
                )
            if "all_runs" in row:
                every = row["all_runs"]
                lines.append(
                    f"{'':<69}all runs: p50 {every['p50_ms']} p99 {every['p99_ms']} "
                    f"p999 {every['p999_ms']} max {every['max_ms']} ms"
                )
            if "stages" in row:
                lines += [f"{'':<69}{line}" for line in stages.lines(row["stages"])]
            if "client_gc" in row:
                lines.append(f"{'':<69}{client_gc_line(row['client_gc'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = run_options(__doc__, "rows with a workload", "bench-throughput.png, bench-latency.png")
    parser.add_argument(
        "--trace-every",
        type=int,
        default=TRACE_EVERY,
        metavar="N",
        help=f"during the latency rows, the server traces every N-th offset (default {TRACE_EVERY};"
        " 0: no stage breakdown)",
    )
    args = parser.parse_args(argv)
    r.CLIENT_API = args.api
    repeats = args.repeats or (1 if args.quick else 3)
    report: dict[str, Any] = {
        "benchmark": "matrix",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "quick": args.quick,
        "api": args.api,
        "repeats": repeats,
        "trace_every": args.trace_every,
        "machine": machine(),
    }
    started = time.monotonic()
    # not /tmp, which may be a tmpfs where fsync costs nothing
    with tempfile.TemporaryDirectory(prefix="headwater-bench-", dir=_scratch_parent()) as scratch:
        http_port_file = Path(scratch) / "http.port"
        server = ServerProcess(
            Path(scratch) / "data",
            extra_args=("--http-port", "0", "--http-port-file", str(http_port_file)),
        ).start()
        try:
            http_address = f"127.0.0.1:{http_port_file.read_text().strip()}"
            rows = [
                row
                for row in matrix(server, args.quick, http_address, args.trace_every)
                if not args.only or args.only in row.workload
            ]
            results = []
            for index, row in enumerate(rows, 1):
                say(f"[{index}/{len(rows)}] {row.workload}")
                latency = row.kind == "latency" and not args.quick
                results.append(r.measure(row, max(repeats, LATENCY_RUNS) if latency else repeats))
        finally:
            server.stop()
    report["seconds"] = round(time.monotonic() - started, 1)
    report["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    report["results"] = results
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n")
    if args.charts:
        write_charts(results, args.charts, report)
    if args.format == "json":
        print(json.dumps(report, indent=2))
    elif args.format == "markdown":
        from loadtest.report import matrix_markdown

        print(matrix_markdown(report["results"]))
    else:
        print(
            f"{report['date']}, {repeats} run(s) per row, {report['seconds']} s, "
            f"load {report['machine']['load_average']}"
        )
        print(table(results))
    return 0


def write_charts(results: list[dict[str, Any]], directory: Path, report: dict[str, Any]) -> None:
    from loadtest.charts import latency_chart, throughput_chart

    directory.mkdir(parents=True, exist_ok=True)
    stamp = (
        f"{report['date'][:10]}, {report['machine']['cpus']} cores, median of {report['repeats']}"
    )
    throughput_chart(results, directory / "bench-throughput.png", f"Headwater throughput ({stamp})")
    latency_chart(results, directory / "bench-latency.png", f"End-to-end latency by rate ({stamp})")


def _scratch_parent() -> str | None:
    """A directory on a real disk for data: $HEADWATER_BENCH_DIR, else /var/tmp."""
    parent = os.environ.get("HEADWATER_BENCH_DIR", "/var/tmp")
    return parent if os.path.isdir(parent) else None


if __name__ == "__main__":
    sys.exit(main())
