"""Incremental compaction: delta layers against full rewrites, on the same history (issue 24).

A history of N records (100-byte values over 100,000 keys in four partitions, as
`compaction_bench` writes it) is compacted once. The store is then copied, and each round adds
the same trickle (1% of N by default) to both copies and compacts each: one with delta layers
(`delta_ratio` 0.25, the default), one with every run a full snapshot (`delta_ratio` 0, the
behaviour before deltas). Which copy runs first alternates by round. Per run: wall seconds, CPU
seconds of the whole process tree (the JVM and its Python workers), object bytes read and
written, and what the run wrote (a delta over how many layers, or a full snapshot). After each
run its snapshots are loaded without Spark (the loader, as the server does; timed: what the layers
cost a reader), and the two copies' rows are compared, row for row.

    python -m loadtest.incremental_bench --records 1000000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtest.compaction_bench import KEYS, PARTITIONS, VALUE_SIZE, tree_cpu_seconds, write_history


def add_trickle(root: Path, starts: list[int], count: int, seed: int) -> list[int]:
    """`count` records over the same keys after each partition's `starts`; the next offsets."""
    from headwater.spark_compaction.history import generate, write_segments
    from headwater.spark_compaction.store import BlockingStore, StoreSpec
    from headwater.wire.records import Compression

    with BlockingStore(StoreSpec.local(root)) as store:
        return [
            write_segments(
                store,
                "bench",
                partition,
                generate(
                    count // PARTITIONS,
                    KEYS // PARTITIONS,
                    seed=seed + partition,
                    tombstones=0.01,
                    keyless=0.0,
                    headers=0.0,
                    value_size=VALUE_SIZE,
                ),
                start_offset=starts[partition],
                batch_records=500,
                segment_batches=1100,
                codecs=(Compression.NONE,),
            )
            for partition in range(PARTITIONS)
        ]


def compact(spark: Any, root: Path, delta_ratio: float) -> dict[str, Any]:
    from headwater.spark_compaction.job import CompactionSettings, run
    from headwater.spark_compaction.store import StoreSpec

    settings = CompactionSettings(StoreSpec.local(root), ("bench",), delta_ratio=delta_ratio)
    clock, cpu = time.monotonic(), tree_cpu_seconds()
    summary = run(lambda: spark, settings).as_dict()
    return {
        "seconds": round(time.monotonic() - clock, 2),
        "cpu_seconds": round(tree_cpu_seconds() - cpu, 2),
        "bytes_read": summary["bytes_read"],
        "bytes_written": summary["bytes_written"],
        "records_in": summary["records_in"],
        "keys_out": summary["keys_out"],
        "wrote": sorted(
            {
                f"delta over {s['layers'] - 1}" if s["delta"] else "full"
                for s in summary["snapshots"]
            }
        ),
        "phases": summary["phases"],
    }


def load_everything(root: Path) -> tuple[float, dict[int, dict[bytes, bytes]]]:
    """Every partition's snapshot through the loader: seconds, and the rows."""
    from headwater.spark_compaction.loader import load_snapshot
    from headwater.storage.objectstore import LocalObjectStore

    async def load() -> dict[int, dict[bytes, bytes]]:
        store = LocalObjectStore(root)
        found = {}
        for partition in range(PARTITIONS):
            snapshot = await load_snapshot(store, "bench", partition)
            assert snapshot is not None
            found[partition] = {row.key: row.value async for row in snapshot.rows()}
        return found

    clock = time.monotonic()
    rows = asyncio.run(load())
    return time.monotonic() - clock, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000, help="records of the history")
    parser.add_argument("--trickle", type=float, default=0.01, help="each round, this fraction")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scratch", type=Path, help="directory for the stores (default: /tmp)")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--output", type=Path, help="also write the JSON report here")
    args = parser.parse_args(argv)
    from headwater.spark_compaction.session import spark_session

    spark = spark_session(
        "local[2]",
        {"spark.driver.memory": args.driver_memory, "spark.sql.shuffle.partitions": "4"},
    )
    runs: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="incremental-bench-", dir=args.scratch) as tmp:
            layered, rewritten = Path(tmp) / "layered", Path(tmp) / "rewritten"
            wal_bytes = write_history(layered, args.records)
            log(f"history: {args.records:,} records, {wal_bytes / 1e6:,.0f} MB")
            first = compact(spark, layered, 0.25)  # warms the session up, too
            log(f"first full run: {first}")
            runs.append({"round": 0, "mode": "first run", **first})
            shutil.copytree(layered, rewritten)
            starts = [args.records // PARTITIONS] * PARTITIONS
            trickle = int(args.records * args.trickle)
            for round_ in range(1, args.rounds + 1):
                for root in (layered, rewritten):
                    next_starts = add_trickle(root, starts, trickle, seed=1000 * round_)
                starts = next_starts
                order = [("deltas", layered, 0.25), ("full rewrites", rewritten, 0.0)]
                loaded = {}
                for mode, root, ratio in order if round_ % 2 else order[::-1]:
                    result = compact(spark, root, ratio)
                    result["load_seconds"], loaded[mode] = load_everything(root)
                    result["load_seconds"] = round(result["load_seconds"], 2)
                    log(f"round {round_} {mode}: {result}")
                    runs.append({"round": round_, "mode": mode, **result})
                if loaded["deltas"] != loaded["full rewrites"]:
                    raise RuntimeError(f"round {round_}: the two snapshots differ")
    finally:
        spark.stop()
    report = {
        "benchmark": "incremental compaction, delta layers against full rewrites",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average": round(os.getloadavg()[0], 1),
        },
        "records": args.records,
        "trickle_records": int(args.records * args.trickle),
        "keys": KEYS,
        "wal_mb": round(wal_bytes / 1e6, 1),
        "runs": runs,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
