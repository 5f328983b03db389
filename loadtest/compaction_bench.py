"""Compaction throughput: the Spark job on local[2] against a single-process pure-Python fold.

For each size, a history of N records with 100-byte values over 100,000 keys (four partitions of
25,000 keys, 1% tombstones, uncompressed batches of 500 records, segments of about 64 MiB as the
server cuts them by default) is written to a local object store (not timed). Then:

- the pure-Python fold, in this process: list the segment objects, fetch each, decode its batches
  with `wire.records`, fold into a dict (last offset wins, tombstones delete), sort each partition
  by key and write it as Parquet the way the job does. Each phase is timed.
- the Spark job (`spark_compaction.job.run`) on local[2], the session started and warmed up by a
  small run beforehand (both reported apart): `phases` says how long reading, decoding and folding
  took (one Spark job ending in the per-partition counts) and how long the shuffle by partition,
  the sort and the Parquet writes took.

Both results are checked to hold the same number of live keys. Figures are records/s and MB/s of
WAL (segment bytes read). Results go to stdout as JSON and, with `--chart FILE`, to an SVG chart.

    python -m loadtest.compaction_bench --records 1000000 10000000 --chart docs/compaction.svg
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KEYS = 100_000
PARTITIONS = 4
VALUE_SIZE = 100


def write_history(root: Path, records: int) -> int:
    from headwater.spark_compaction.history import generate, write_segments
    from headwater.spark_compaction.store import BlockingStore, StoreSpec
    from headwater.wire.records import Compression

    per_partition = records // PARTITIONS
    with BlockingStore(StoreSpec.local(root)) as store:
        for partition in range(PARTITIONS):
            entries = generate(
                per_partition,
                KEYS // PARTITIONS,
                seed=partition,
                tombstones=0.01,
                keyless=0.0,
                headers=0.0,
                value_size=VALUE_SIZE,
            )
            write_segments(
                store,
                "bench",
                partition,
                entries,
                batch_records=500,
                segment_batches=1100,  # ~64 MiB of 100-byte records
                codecs=(Compression.NONE,),
            )
    return sum(p.stat().st_size for p in root.rglob("*.log"))


def python_fold(root: Path, output: Path) -> dict[str, Any]:
    """The single-process baseline, phase by phase."""
    import pyarrow as pa

    from headwater.spark_compaction.store import BlockingStore, StoreSpec
    from headwater.spark_compaction.wal_segments import iter_batches, list_segments
    from headwater.spark_compaction.writer import encode_parquet

    phases = dict.fromkeys(("list", "fetch", "decode", "fold", "write"), 0.0)
    records = 0
    state: dict[tuple[int, bytes], tuple[int, int, bytes]] = {}
    with BlockingStore(StoreSpec.local(root)) as store:
        clock = time.monotonic()
        segments = list_segments(store, ["bench"])
        phases["list"] = time.monotonic() - clock
        for segment in segments:
            clock = time.monotonic()
            data = store.get(segment.key)
            phases["fetch"] += time.monotonic() - clock
            clock = time.monotonic()
            partition = segment.partition
            # batch by batch, as a streaming fold would: holding a whole segment's decoded
            # records at once costs more in garbage collection than the fold itself
            for problem, rows in iter_batches(segment, data):
                decoded = time.monotonic()
                phases["decode"] += decoded - clock
                if problem is None:
                    records += len(rows)
                    for offset, timestamp, key, value, _headers in rows:
                        if key is None:
                            continue
                        if value is None:
                            state.pop((partition, key), None)
                        else:
                            state[(partition, key)] = (offset, timestamp, value)
                clock = time.monotonic()
                phases["fold"] += clock - decoded
    clock = time.monotonic()
    output.mkdir(parents=True, exist_ok=True)
    for partition in range(PARTITIONS):
        keys = sorted(k for p, k in state if p == partition)
        rows = [state[(partition, k)] for k in keys]
        table = pa.table(
            {
                "topic": ["bench"] * len(keys),
                "partition": pa.array([partition] * len(keys), pa.int32()),
                "key": keys,
                "value": [r[2] for r in rows],
                "offset": [r[0] for r in rows],
                "timestamp": [r[1] for r in rows],
                "headers": [[]] * len(keys),
            }
        )
        (output / f"{partition}.parquet").write_bytes(encode_parquet(table))
    phases["write"] = time.monotonic() - clock
    return {"records": records, "keys_out": len(state), "phases": phases}


def tree_cpu_seconds() -> float:
    """CPU time of this process and every descendant (the JVM, its Python workers), from /proc.

    Wall time on a machine shared with other work says little; CPU seconds per record say how
    much work each engine does, whatever else is running. Exited workers count through their
    parent's cutime/cstime.
    """
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        parents[pid] = int(fields[1])
        cpu[pid] = sum(int(f) for f in fields[11:15]) / ticks
    total, frontier = 0.0, [os.getpid()]
    while frontier:
        pid = frontier.pop()
        total += cpu.get(pid, 0.0)
        frontier.extend(child for child, parent in parents.items() if parent == pid)
    return total


def spark_fold(spark: Any, root: Path) -> dict[str, Any]:
    from headwater.spark_compaction.job import CompactionSettings, run
    from headwater.spark_compaction.store import StoreSpec

    summary = run(lambda: spark, CompactionSettings(StoreSpec.local(root), ("bench",)))
    return summary.as_dict()


def svg_chart(rows: list[dict[str, Any]], path: Path) -> None:
    """Horizontal bars, records/s: one group per input size, Spark and pure Python."""
    colors = {"spark local[2]": "#4c78a8", "python, one process": "#f58518"}
    peak = max(r["records_per_s"] for r in rows)
    bar, gap, left, width = 16, 14, 120, 480
    sizes = sorted({r["records"] for r in rows})
    height = len(sizes) * (2 * bar + gap) + 70
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 260}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="16" font-size="13">'
        "Compaction throughput, WAL records/s, wall clock (2 shared cores, 100-byte values, "
        "100,000 keys)</text>",
    ]
    y = 32
    for size in sizes:
        label = f"{size / 1e6:g}M records"
        parts.append(f'<text x="{left - 6}" y="{y + bar + 4}" text-anchor="end">{label}</text>')
        for engine, color in colors.items():
            row = next((r for r in rows if r["records"] == size and r["engine"] == engine), None)
            rate = row["records_per_s"] if row else 0.0
            length = width * rate / peak
            parts.append(
                f'<rect x="{left}" y="{y}" width="{length:.1f}" height="{bar - 2}" fill="{color}"/>'
            )
            note = (
                f"{rate:,.0f}/s, {row['mb_per_s']:.1f} MB/s, {row['cpu_seconds']:.1f} CPU-s"
                if row
                else "not run"
            )
            parts.append(f'<text x="{left + length + 4:.1f}" y="{y + bar - 4}">{note}</text>')
            y += bar
        y += gap
    for i, (engine, color) in enumerate(colors.items()):
        parts.append(
            f'<rect x="{left + 200 * i}" y="{y + 4}" width="10" height="10" fill="{color}"/>'
        )
        parts.append(f'<text x="{left + 200 * i + 14}" y="{y + 13}">{engine}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--chart", type=Path, help="write an SVG bar chart here")
    parser.add_argument("--scratch", type=Path, help="directory for the stores (default: /tmp)")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--warmup", type=int, default=100_000, help="records of the warm-up run")
    args = parser.parse_args(argv)
    from headwater.spark_compaction.session import spark_session

    clock = time.monotonic()
    spark = spark_session(
        "local[2]",
        {"spark.driver.memory": args.driver_memory, "spark.sql.shuffle.partitions": "4"},
    )
    spark_start = time.monotonic() - clock
    rows: list[dict[str, Any]] = []
    cold = 0.0
    try:
        # the first job of a session pays for JIT compilation and Python worker start-up: run
        # one small history first and report it apart, so the sizes compare steady states
        with tempfile.TemporaryDirectory(prefix="compaction-bench-", dir=args.scratch) as tmp:
            write_history(Path(tmp) / "objects", args.warmup)
            clock = time.monotonic()
            spark_fold(spark, Path(tmp) / "objects")
            cold = time.monotonic() - clock
            log(f"warm-up: {args.warmup:,} records in {cold:.1f} s (first job of the session)")
        for count in args.records:
            with tempfile.TemporaryDirectory(prefix="compaction-bench-", dir=args.scratch) as tmp:
                root = Path(tmp) / "objects"
                clock = time.monotonic()
                wal_bytes = write_history(root, count)
                generated = time.monotonic() - clock
                log(f"{count:,} records, {wal_bytes / 1e6:,.0f} MB of WAL in {generated:.0f} s")

                clock, cpu = time.monotonic(), tree_cpu_seconds()
                baseline = python_fold(root, Path(tmp) / "python-snapshot")
                python_seconds = time.monotonic() - clock
                python_cpu = tree_cpu_seconds() - cpu
                phases = baseline["phases"]
                log(f"  python {python_seconds:6.1f} s {python_cpu:6.1f} cpu-s {phases}")
                shutil.rmtree(Path(tmp) / "python-snapshot")

                clock, cpu = time.monotonic(), tree_cpu_seconds()
                summary = spark_fold(spark, root)
                spark_seconds = time.monotonic() - clock
                spark_cpu = tree_cpu_seconds() - cpu
                log(f"  spark  {spark_seconds:6.1f} s {spark_cpu:6.1f} cpu-s {summary['phases']}")
                if summary["keys_out"] != baseline["keys_out"]:
                    raise RuntimeError(f"spark {summary['keys_out']} keys, python {baseline}")
                for engine, seconds, cpu_seconds, phases in (
                    ("spark local[2]", spark_seconds, spark_cpu, summary["phases"]),
                    ("python, one process", python_seconds, python_cpu, baseline["phases"]),
                ):
                    rows.append(
                        {
                            "engine": engine,
                            "records": count,
                            "wal_mb": round(wal_bytes / 1e6, 1),
                            "keys_out": summary["keys_out"],
                            "seconds": round(seconds, 2),
                            "cpu_seconds": round(cpu_seconds, 2),
                            "load_average": round(os.getloadavg()[0], 1),
                            "records_per_s": round(count / seconds),
                            "mb_per_s": round(wal_bytes / 1e6 / seconds, 1),
                            "phases": {k: round(v, 2) for k, v in phases.items()},
                        }
                    )
    finally:
        spark.stop()
    if args.chart:
        svg_chart(rows, args.chart)
    report = {
        "benchmark": "compaction throughput",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "spark_start_seconds": round(spark_start, 1),
        "warmup": {"records": args.warmup, "seconds": round(cold, 1)},
        "results": rows,
    }
    print(json.dumps(report, indent=2))
    return 0


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
