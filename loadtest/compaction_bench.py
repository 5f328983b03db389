"""Compaction throughput: the Spark job on local[2] against a single-process pure-Python fold.

For each size, a history of N records with 100-byte values over 100,000 keys (four partitions of
25,000 keys, 1% tombstones, uncompressed batches of 500 records, segments of about 64 MiB as the
server cuts them by default) is written to a local object store (not timed). Then:

- the pure-Python fold, in this process: list the segment objects, fetch each, decode its batches
  with `wire.records`, fold into a dict (last offset wins, tombstones delete), sort each partition
  by key and write it as Parquet the way the job does. Each phase is timed.
- the Spark job (`spark_compaction.job.run`) on local[2], the session started and warmed up by a
  small run beforehand (the warm-up reported apart): `phases` says how long reading, decoding
  and folding took (one Spark job ending in the per-partition counts) and how long the shuffle by
  partition, the sort and the Parquet writes took.

With `--standalone N ...` the Spark job runs, for each N in turn, on a standalone cluster of N
one-core workers started on 127.0.0.1 for it (`spark_compaction.standalone`; 0 is local[2]), so
one run shows how the job scales with workers. Every Spark run folds a fresh copy of the history
(the job is incremental: a second run over a compacted store would find nothing to do).

Each result is checked to hold the same number of live keys as the one-process fold. Figures are
records/s, MB/s of WAL (segment bytes read) and CPU per record, split into this process (the
driver's Python, or the one-process fold), the JVMs and PySpark's Python workers. Results go to
stdout as JSON and, with `--chart FILE`, to an SVG chart.

    python -m loadtest.compaction_bench --records 1000000 10000000 --chart docs/compaction.svg
    python -m loadtest.compaction_bench --records 10000000 --standalone 0 1 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
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


def tree_cpu_seconds() -> dict[str, float]:
    """CPU time of this process and every descendant, from /proc, by kind: "driver" (this
    process: the one-process fold, or Spark's driver-side Python), "jvm" (java processes: the
    driver's JVM, a standalone cluster's daemons and executors) and "python workers" (the other
    Python processes: PySpark's workers and planning processes).

    Wall time on a machine shared with other work says little; CPU seconds per record say how
    much work each engine does, whatever else is running. Exited workers count through their
    parent's cutime/cstime.
    """
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    names: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        head, fields = text.rsplit(")", 1)[0], text.rsplit(")", 1)[1].split()
        pid = int(stat.parent.name)
        names[pid] = head.split("(", 1)[1]
        parents[pid] = int(fields[1])
        cpu[pid] = sum(int(f) for f in fields[11:15]) / ticks
    me = os.getpid()
    totals = {"driver": cpu.get(me, 0.0), "jvm": 0.0, "python workers": 0.0}
    frontier = [child for child, parent in parents.items() if parent == me]
    while frontier:
        pid = frontier.pop()
        kind = "jvm" if names.get(pid) == "java" else "python workers"
        totals[kind] += cpu.get(pid, 0.0)
        frontier.extend(child for child, parent in parents.items() if parent == pid)
    return totals


def cpu_since(before: dict[str, float]) -> dict[str, float]:
    return {kind: round(seconds - before[kind], 2) for kind, seconds in tree_cpu_seconds().items()}


def spark_fold(spark: Any, root: Path) -> dict[str, Any]:
    from headwater.spark_compaction.job import CompactionSettings, run
    from headwater.spark_compaction.store import StoreSpec

    summary = run(lambda: spark, CompactionSettings(StoreSpec.local(root), ("bench",)))
    return summary.as_dict()


def svg_chart(rows: list[dict[str, Any]], path: Path) -> None:
    """Horizontal bars, records/s: one group per input size, a bar per engine."""
    palette = ("#f58518", "#4c78a8", "#54a24b", "#b279a2", "#e45756")
    engines = list(dict.fromkeys(r["engine"] for r in rows))  # the python fold first
    colors = dict(zip(engines, palette * len(engines), strict=False))
    peak = max(r["records_per_s"] for r in rows)
    bar, gap, left, width = 16, 14, 120, 480
    sizes = sorted({r["records"] for r in rows})
    height = len(sizes) * (len(engines) * bar + gap) + 70
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
            f'<rect x="{left + 220 * i}" y="{y + 4}" width="10" height="10" fill="{color}"/>'
        )
        parts.append(f'<text x="{left + 220 * i + 14}" y="{y + 13}">{engine}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


@contextlib.contextmanager
def engine_session(engine: str, workers: int, scratch: Path, driver_memory: str) -> Iterator[Any]:
    """A Spark session for `engine`: local[2], or a standalone cluster of `workers` workers of
    one core each, started for the session and stopped after it."""
    from headwater.spark_compaction.session import spark_session
    from headwater.spark_compaction.standalone import StandaloneCluster

    conf = {"spark.driver.memory": driver_memory, "spark.sql.shuffle.partitions": "4"}
    if not workers:
        spark = spark_session("local[2]", conf)
        try:
            yield spark
        finally:
            spark.stop()
        return
    directory = Path(tempfile.mkdtemp(prefix="compaction-bench-cluster-", dir=scratch))
    try:
        with StandaloneCluster(directory, workers=workers, cores=1, memory="2g") as cluster:
            cluster.wait_for_workers()
            spark = spark_session(
                cluster.master_url,
                conf
                | {
                    "spark.driver.host": "127.0.0.1",
                    "spark.executor.memory": "1g",
                    "spark.cores.max": str(workers),
                },
            )
            try:
                yield spark
            finally:
                spark.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def fresh_copy(history: Path) -> Iterator[Path]:
    """A copy of a history's store for one run (not timed): the job is incremental, so a second
    run over the same store would find nothing new to fold."""
    root = history.with_name(history.name + "-run")
    shutil.copytree(history, root)
    try:
        yield root
    finally:
        shutil.rmtree(root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--chart", type=Path, help="write an SVG bar chart here")
    parser.add_argument("--scratch", type=Path, help="directory for the stores (default: /tmp)")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--warmup", type=int, default=100_000, help="records of the warm-up run")
    parser.add_argument(
        "--standalone",
        type=int,
        nargs="+",
        metavar="WORKERS",
        help="run Spark on a standalone cluster of this many one-core workers, each count in "
        "turn (0: local[2]); default: local[2] only",
    )
    args = parser.parse_args(argv)
    engines = [
        (f"spark standalone, {n} x 1 core" if n else "spark local[2]", n)
        for n in args.standalone or [0]
    ]
    rows: list[dict[str, Any]] = []
    warmups: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="compaction-bench-", dir=args.scratch) as tmp:
        histories: dict[int, tuple[Path, int]] = {}
        for count in [args.warmup, *args.records]:
            clock = time.monotonic()
            root = Path(tmp) / f"objects-{count}"
            wal_bytes = write_history(root, count)
            histories[count] = (root, wal_bytes)
            took = time.monotonic() - clock
            log(f"{count:,} records, {wal_bytes / 1e6:,.0f} MB of WAL in {took:.0f} s")
        live_keys: dict[int, int] = {}
        for count in args.records:
            root, wal_bytes = histories[count]
            clock, cpu = time.monotonic(), tree_cpu_seconds()
            baseline = python_fold(root, Path(tmp) / "python-snapshot")
            seconds, cpu_seconds = time.monotonic() - clock, cpu_since(cpu)
            log(f"  python {seconds:6.1f} s, cpu-s {cpu_seconds}, {baseline['phases']}")
            shutil.rmtree(Path(tmp) / "python-snapshot")
            live_keys[count] = baseline["keys_out"]
            rows.append(
                row("python, one process", count, wal_bytes, baseline, seconds, cpu_seconds)
            )
        for engine, workers in engines:
            with engine_session(engine, workers, Path(tmp), args.driver_memory) as spark:
                # the first job of a session pays for JIT compilation and Python worker
                # start-up: run a small history first and report it apart, so the sizes
                # compare steady states
                clock = time.monotonic()
                with fresh_copy(histories[args.warmup][0]) as root:
                    spark_fold(spark, root)
                warmups[engine] = round(time.monotonic() - clock, 1)
                log(f"{engine}: warm-up of {args.warmup:,} records in {warmups[engine]} s")
                for count in args.records:
                    history, wal_bytes = histories[count]
                    with fresh_copy(history) as root:
                        clock, cpu = time.monotonic(), tree_cpu_seconds()
                        summary = spark_fold(spark, root)
                        seconds, cpu_seconds = time.monotonic() - clock, cpu_since(cpu)
                    log(f"  {engine} {seconds:6.1f} s, cpu-s {cpu_seconds}, {summary['phases']}")
                    if summary["keys_out"] != live_keys[count]:
                        raise RuntimeError(
                            f"{engine}: {summary['keys_out']} keys, python {live_keys[count]}"
                        )
                    rows.append(row(engine, count, wal_bytes, summary, seconds, cpu_seconds))
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
        "warmup": {"records": args.warmup, "seconds": warmups},
        "results": rows,
    }
    print(json.dumps(report, indent=2))
    return 0


def row(
    engine: str,
    count: int,
    wal_bytes: int,
    result: dict[str, Any],
    seconds: float,
    cpu: dict[str, float],
) -> dict[str, Any]:
    total = sum(cpu.values())
    return {
        "engine": engine,
        "records": count,
        "wal_mb": round(wal_bytes / 1e6, 1),
        "keys_out": result["keys_out"],
        "seconds": round(seconds, 2),
        "cpu_seconds": round(total, 2),
        "cpu_us_per_record": round(total / count * 1e6, 2),
        "cpu_us_per_record_by_kind": {k: round(v / count * 1e6, 2) for k, v in cpu.items()},
        "load_average": round(os.getloadavg()[0], 1),
        "records_per_s": round(count / seconds),
        "mb_per_s": round(wal_bytes / 1e6 / seconds, 1),
        "phases": {k: round(v, 2) for k, v in result["phases"].items()},
    }


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
