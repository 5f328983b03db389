"""What a commit window costs: a tail object per partition, or one per broker (issue 21 item 2).

    python -m loadtest.batching_probe [--partitions 1,6,24] [--windows 200] [--bytes 16384]

Starts etcd and moto's S3 server on 127.0.0.1 (stopped by PID) and, for each partition count N,
plays `--windows` commit windows, one after the other, each holding `--bytes` of batches per
partition:

- `per partition` (today, `cluster/tail_commit.py`): N PUTs of `--bytes` each, all in flight at
  once (each partition flushes on its own);
- `per broker` (the design in docs/DECISIONS.md): one PUT of N x `--bytes`, then the window's
  index in one etcd transaction: for every partition a compare of its ownership key's
  create_revision and a put of its index entry (the design's acknowledgement path), then the
  entries deleted again (a fold's clean-up, not timed).

Reported per mode and N: PUTs per window, and the window's latency (from its start to the moment
its acknowledgements could be sent) p50/p99 in ms, with the etcd transaction's share for `per
broker`. Loopback moto and etcd on a shared 2-core machine: relative figures, not S3's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import aetcd

from headwater.storage.objectstore import S3ObjectStore
from loadtest.harness import free_port, say, wait_port

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "x",
    "AWS_SECRET_ACCESS_KEY": "x",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * p))], 2)


async def probe(
    store: S3ObjectStore, etcd: aetcd.Client, partitions: int, windows: int, size: int
) -> list[dict[str, Any]]:
    slice_ = os.urandom(size)
    owners = [f"/probe/owners/t/{p}".encode() for p in range(partitions)]
    for key in owners:
        await etcd.put(key, b"b1")
    revisions = [(await etcd.get(key)).create_revision for key in owners]
    per_partition: list[float] = []
    for window in range(windows):
        started = time.perf_counter()
        await asyncio.gather(
            *(store.put(f"t/{p}/tail/{window:020d}.log", slice_) for p in range(partitions))
        )
        per_partition.append((time.perf_counter() - started) * 1000)
    per_broker: list[float] = []
    txn: list[float] = []
    for window in range(windows):
        started = time.perf_counter()
        name = f"shared/b1/{window:020d}-{uuid.uuid4().hex[:8]}.log"
        await store.put(name, slice_ * partitions)
        put_done = time.perf_counter()
        entries = [
            (f"/probe/tail/t/{p}/{window:020d}".encode(), json.dumps([name, p * size, size]))
            for p in range(partitions)
        ]
        committed, _ = await etcd.transaction(
            compare=[
                etcd.transactions.create(key) == revision
                for key, revision in zip(owners, revisions, strict=True)
            ],
            success=[etcd.transactions.put(key, value.encode()) for key, value in entries],
            failure=[],
        )
        if not committed:
            raise RuntimeError("the index transaction's compares failed")
        done = time.perf_counter()
        per_broker.append((done - started) * 1000)
        txn.append((done - put_done) * 1000)
    await etcd.delete_prefix(b"/probe/tail/")
    return [
        {
            "mode": "per partition",
            "partitions": partitions,
            "puts_per_window": partitions,
            "window_p50_ms": percentile(per_partition, 0.5),
            "window_p99_ms": percentile(per_partition, 0.99),
        },
        {
            "mode": "per broker",
            "partitions": partitions,
            "puts_per_window": 1,
            "window_p50_ms": percentile(per_broker, 0.5),
            "window_p99_ms": percentile(per_broker, 0.99),
            "etcd_txn_p50_ms": percentile(txn, 0.5),
            "etcd_txn_p99_ms": percentile(txn, 0.99),
            "etcd_txn_mean_ms": round(statistics.fmean(txn), 2),
        },
    ]


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="hw-batching-probe-"))
    etcd_port, s3_port, peer = free_port(), free_port(), free_port()
    client = f"http://127.0.0.1:{etcd_port}"
    etcd_binary = shutil.which("etcd") or "/usr/bin/etcd"
    processes = [
        subprocess.Popen(
            [etcd_binary, f"--data-dir={root / 'etcd'}", f"--listen-client-urls={client}",
             f"--advertise-client-urls={client}", f"--listen-peer-urls=http://127.0.0.1:{peer}",
             f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
             f"--initial-cluster=default=http://127.0.0.1:{peer}", "--log-level=error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, **CREDENTIALS},
        ),
    ]  # fmt: skip
    os.environ.update(CREDENTIALS)
    try:
        wait_port(etcd_port, 30)
        wait_port(s3_port, 30)
        request = urllib.request.Request(f"http://127.0.0.1:{s3_port}/probe", method="PUT")
        urllib.request.urlopen(request, timeout=10).close()
        store = await S3ObjectStore("probe", endpoint_url=f"http://127.0.0.1:{s3_port}").open()
        results: list[dict[str, Any]] = []
        try:
            async with aetcd.Client(host="127.0.0.1", port=etcd_port) as etcd:
                for count in (int(n) for n in args.partitions.split(",")):
                    say(f"{count} partitions ...")
                    results += await probe(store, etcd, count, args.windows, args.bytes)
        finally:
            await store.close()
        load = os.getloadavg()[0]
        return [{**r, "load_average": round(load, 2)} for r in results]
    finally:
        for process in processes:
            process.kill()
            process.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", default="1,6,24")
    parser.add_argument("--windows", type=int, default=200, help="windows per mode and count")
    parser.add_argument("--bytes", type=int, default=16384, help="bytes per partition per window")
    parser.add_argument("--output", type=Path, help="also write the JSON rows here")
    args = parser.parse_args()
    results = asyncio.run(main(args))
    text = json.dumps(results, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    cli()
