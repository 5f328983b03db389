"""Failover as a producer sees it (issue 42): the first ack after kill -9 and after a freeze.

    python -m loadtest.failover_bench [--rounds 5] [--freeze 12] [--lease-ms MS] [--output FILE]

Three brokers (etcd and moto's S3 started here, everything stopped by PID), a 6-partition topic,
one idempotent producer of a client bootstrapped at b1, one record in flight per partition. Each
round picks a victim among the brokers other than b1 that own partitions, then either kills it
(kill -9; it is started again after the round) or freezes it (SIGSTOP for `--freeze` s, then
SIGCONT). Reported per round and as p50/p99 over every victim partition of every round: seconds
from the fault to the first acknowledgement on that partition (`first_ack_s`), and the longest
time without an acknowledgement on the other brokers' partitions over the same span
(`others_gap_s`). The brokers' default lease (2 s) unless `--lease-ms`; the load average is noted
with each round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import headwater
from headwater.testing import ServerProcess
from loadtest import cluster_bench
from loadtest.cluster_bench import Backing, start_brokers, wait_served
from loadtest.harness import say

PARTITIONS = 6


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def one_round(
    backing: Backing, brokers: list[ServerProcess], fault: str, freeze: float
) -> dict[str, Any]:
    owner_of = await wait_served(backing, brokers)
    candidates = [b for b in brokers[1:] if b.address in owner_of.values()]
    if not candidates:
        raise RuntimeError(f"no broker but b1 owns a partition: {owner_of}")
    victim = candidates[0]
    mine = sorted(p for p, a in owner_of.items() if a == victim.address)
    others = sorted(set(owner_of) - set(mine))
    times: dict[int, list[float]] = {p: [] for p in range(PARTITIONS)}
    stop = asyncio.Event()
    changed = asyncio.Event()
    async with await headwater.connect(brokers[0].address) as client:
        producer = client.producer("bench", idempotent=True)

        async def one(partition: int) -> None:
            while not stop.is_set():
                await (await producer.send(b"x" * 100, partition=partition))
                times[partition].append(time.monotonic())
                changed.set()

        async def until(condition: Any, timeout: float) -> None:
            async with asyncio.timeout(timeout):
                while not condition():
                    changed.clear()
                    await changed.wait()

        producing = asyncio.gather(*(one(p) for p in range(PARTITIONS)))
        await until(lambda: all(len(t) >= 20 for t in times.values()), 60)
        load = os.getloadavg()[0]
        assert victim.process is not None
        pid = victim.process.pid
        if fault == "kill":
            victim.kill()
        else:
            os.kill(pid, signal.SIGSTOP)
        at = time.monotonic()

        def first(partition: int) -> float | None:
            return next((t for t in times[partition] if t > at), None)

        try:
            await until(lambda: all(first(p) for p in mine), 120)
        finally:
            if fault == "freeze":
                # the fault's length: the producer goes on against the frozen broker meanwhile
                await asyncio.sleep(max(0.0, at + freeze - time.monotonic()))
                os.kill(pid, signal.SIGCONT)
        recovered = max(first(p) or 0.0 for p in mine)
        gap = 0.0
        for partition in others:
            points = [at, *(t for t in times[partition] if at <= t <= recovered), recovered]
            gap = max(gap, *(b - a for a, b in itertools.pairwise(points)))
        stop.set()
        await producing
        await producer.close()
    if fault == "kill":
        victim.start(60)
    return {
        "fault": fault,
        "victim_partitions": mine,
        "first_ack_s": {p: round((first(p) or 0.0) - at, 2) for p in mine},
        "others_gap_s": round(gap, 2),
        "load_average": round(load, 1),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    cluster_bench.PARTITIONS = PARTITIONS
    root = Path(tempfile.mkdtemp(prefix="hw-failover-bench-"))
    backing = Backing(root)
    brokers: list[ServerProcess] = []
    results: dict[str, Any] = {}
    try:
        backing.start()
        brokers = start_brokers(root, 3, backing, args.lease_ms)
        async with await headwater.connect(brokers[0].address) as client:
            await client.create_topic("bench", partitions=PARTITIONS)
        for fault in ("kill", "freeze"):
            rounds = []
            for n in range(args.rounds):
                rounds.append(await one_round(backing, brokers, fault, args.freeze))
                say(f"  {fault} round {n + 1}: {rounds[-1]}")
            acks = [s for r in rounds for s in r["first_ack_s"].values()]
            gaps = [r["others_gap_s"] for r in rounds]
            results[fault] = {
                "rounds": rounds,
                "first_ack_p50_s": percentile(acks, 0.5),
                "first_ack_p99_s": percentile(acks, 0.99),
                "others_gap_p50_s": percentile(gaps, 0.5),
                "others_gap_p99_s": percentile(gaps, 0.99),
            }
        return results
    finally:
        for broker in brokers:
            if broker.process is not None:  # a frozen one, interrupted, is killed all the same
                with contextlib.suppress(ProcessLookupError):
                    os.kill(broker.process.pid, signal.SIGCONT)
            broker.kill()
        backing.stop()
        shutil.rmtree(root, ignore_errors=True)


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds per fault")
    parser.add_argument("--freeze", type=float, default=12.0, help="seconds of SIGSTOP")
    parser.add_argument(
        "--lease-ms", type=int, default=None, help="cluster.lease_ttl_ms (default: the brokers')"
    )
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    results = asyncio.run(main(args))
    text = json.dumps(results, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    cli()
