"""Failover as a producer and as a consumer see it (issue 42): kill -9 and a freeze of an owner.

    python -m loadtest.failover_bench [--rounds 10] [--freeze 12] [--sides producer,consumer]
        [--faults kill,freeze] [--lease-ms MS] [--output FILE]

Three brokers (etcd and moto's S3 started here, everything stopped by PID), a 6-partition topic,
clients bootstrapped at b1. Each round picks a victim among the brokers other than b1 that own
partitions, then either kills it (kill -9; it is started again after the round) or freezes it
(SIGSTOP for `--freeze` s, then SIGCONT).

- producer rows: one idempotent producer, one 100-byte record in flight per partition. Per round
  and as p50/p99 over every victim partition of every round: seconds from the fault to the first
  acknowledgement on that partition (`first_ack_s`); and the longest time without an
  acknowledgement on the other brokers' partitions over the same span (`others_gap_s`, with
  where it began, `others_gap_at_s` after the fault, and on which partition).
- consumer rows: the same producer feeds a consumer of another client (a subscription of its
  own each round, prefetch 100). Seconds from the fault to the first delivery of each victim
  partition by a leg other than the victim's (`first_delivery_s`), and the others' longest gap
  between deliveries.

The brokers' default lease (2 s) unless `--lease-ms`. Progress (each round's figures) goes to
stderr as the run goes; the JSON summary to stdout, and to `--output`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import headwater
from headwater.client.consumer_legs import ClusterLegs
from headwater.testing import ServerProcess
from loadtest import cluster_bench
from loadtest.cluster_bench import Backing, start_brokers, wait_served

log = logging.getLogger("failover_bench")

PARTITIONS = 6
WARM = 20  # events per partition before the fault
TIMEOUT = 120.0  # seconds a round's recovery may take before it counts as a failure


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


class Events:
    """Per partition, the times of the events watched (acks or deliveries)."""

    def __init__(self) -> None:
        self.times: dict[int, list[float]] = {p: [] for p in range(PARTITIONS)}
        self.changed = asyncio.Event()

    def add(self, partition: int) -> None:
        self.times[partition].append(time.monotonic())
        self.changed.set()

    async def until(self, condition: Any, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not condition():
                self.changed.clear()
                await self.changed.wait()

    def first(self, partition: int, since: float) -> float | None:
        return next((t for t in self.times[partition] if t > since), None)

    def longest_gap(self, partitions: list[int], since: float, until: float) -> tuple[float, ...]:
        """(seconds, where it began after `since`, partition) of the longest time without an
        event on one of `partitions` within [since, until]."""
        found = (0.0, 0.0, -1)
        for partition in partitions:
            inside = [t for t in self.times[partition] if since <= t <= until]
            for a, b in itertools.pairwise([since, *inside, until]):
                if b - a > found[0]:
                    found = (b - a, a - since, partition)
        return found


async def one_round(
    backing: Backing, brokers: list[ServerProcess], side: str, fault: str, args: Any, n: int
) -> dict[str, Any]:
    owner_of = await wait_served(backing, brokers)
    candidates = [b for b in brokers[1:] if b.address in owner_of.values()]
    if not candidates:
        raise RuntimeError(f"no broker but b1 owns a partition: {owner_of}")
    victim = candidates[0]
    mine = sorted(p for p, a in owner_of.items() if a == victim.address)
    others = sorted(set(owner_of) - set(mine))
    acks, deliveries = Events(), Events()
    watched = acks if side == "producer" else deliveries
    stop = asyncio.Event()
    victim_leg: list[object] = []  # the consumer's leg at the victim (consumer rows)
    async with (
        await headwater.connect(brokers[0].address) as client,
        await headwater.connect(brokers[0].address) as reader,
    ):
        producer = client.producer("bench", idempotent=True)

        async def one(partition: int) -> None:
            while not stop.is_set():
                await (await producer.send(b"x" * 100, partition=partition))
                acks.add(partition)

        async def consume(consumer: headwater.Consumer) -> None:
            while True:
                message = await consumer.receive()
                if message._consumer not in victim_leg:
                    deliveries.add(message.partition)
                await message.ack()

        consumer = None
        consuming = None
        if side == "consumer":
            consumer = await reader.subscribe("bench", f"round-{fault}-{n}", prefetch=100)
            consuming = asyncio.ensure_future(consume(consumer))
        producing = asyncio.gather(*(one(p) for p in range(PARTITIONS)))
        try:
            await watched.until(lambda: all(len(t) >= WARM for t in watched.times.values()), 60)
            if consumer is not None:
                legs = consumer._cluster
                assert isinstance(legs, ClusterLegs)
                host, port = victim.address.rsplit(":", 1)
                victim_leg.append(legs.legs[(host, int(port))])
            load = os.getloadavg()[0]
            assert victim.process is not None
            pid = victim.process.pid
            log.info("fault: %s of %s, partitions %s", fault, victim.address, mine)
            if fault == "kill":
                victim.kill()
            else:
                os.kill(pid, signal.SIGSTOP)
                # the freeze ends after `--freeze` s whether or not the clients moved on
                loop = asyncio.get_running_loop()
                wake = loop.call_later(args.freeze, os.kill, pid, signal.SIGCONT)
            at = time.monotonic()
            try:
                await watched.until(lambda: all(watched.first(p, at) for p in mine), TIMEOUT)
            finally:
                if fault == "freeze":
                    # the fault's length: the clients go on against the frozen broker meanwhile
                    await asyncio.sleep(max(0.0, at + args.freeze - time.monotonic()))
                    wake.cancel()
                    os.kill(pid, signal.SIGCONT)
            recovered = max(watched.first(p, at) or 0.0 for p in mine)
            gap, gap_at, gap_partition = watched.longest_gap(others, at, recovered)
        finally:
            stop.set()
            if consuming is not None:
                consuming.cancel()
            with contextlib.suppress(asyncio.CancelledError, headwater.HeadwaterError):
                await asyncio.wait_for(producing, 60)
            await producer.close()
            if consumer is not None:
                with contextlib.suppress(headwater.HeadwaterError):
                    await consumer.close()
    if fault == "kill":
        victim.start(60)
    key = "first_ack_s" if side == "producer" else "first_delivery_s"
    return {
        "side": side,
        "fault": fault,
        "victim_partitions": mine,
        key: {p: round((watched.first(p, at) or 0.0) - at, 2) for p in mine},
        "others_gap_s": round(gap, 2),
        "others_gap_at_s": round(gap_at, 2),
        "others_gap_partition": gap_partition,
        "load_average": round(load, 1),
    }


def summary(rounds: list[dict[str, Any]], key: str) -> dict[str, Any]:
    firsts = [s for r in rounds for s in r[key].values()]
    gaps = [r["others_gap_s"] for r in rounds]
    return {
        "rounds": rounds,
        f"{key[:-2]}_p50_s": percentile(firsts, 0.5),
        f"{key[:-2]}_p99_s": percentile(firsts, 0.99),
        "others_gap_p50_s": percentile(gaps, 0.5),
        "others_gap_p99_s": percentile(gaps, 0.99),
        "load_average": [
            min(r["load_average"] for r in rounds),
            max(r["load_average"] for r in rounds),
        ],
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    cluster_bench.PARTITIONS = PARTITIONS
    root = Path(tempfile.mkdtemp(prefix="hw-failover-bench-"))
    backing = Backing(root)
    brokers: list[ServerProcess] = []
    results: dict[str, Any] = {}
    sides = args.sides.split(",")
    faults = args.faults.split(",")
    total = len(sides) * len(faults) * args.rounds
    done = 0
    if args.keep:  # the client's side of each round, beside the brokers' logs
        logging.basicConfig(
            filename=root / "client.log",
            level=logging.DEBUG,
            format="%(asctime)s.%(msecs)03d %(name)s %(message)s",
            datefmt="%H:%M:%S",
        )
    try:
        backing.start()
        brokers = start_brokers(root, 3, backing, args.lease_ms)
        async with await headwater.connect(brokers[0].address) as client:
            await client.create_topic("bench", partitions=PARTITIONS)
        for side in sides:
            key = "first_ack_s" if side == "producer" else "first_delivery_s"
            for fault in faults:
                rounds = []
                for n in range(args.rounds):
                    rounds.append(await one_round(backing, brokers, side, fault, args, n))
                    done += 1
                    r = rounds[-1]
                    progress(
                        f"{done}/{total} {side} {fault}: {key[:-2]} {r[key]} s, others' gap "
                        f"{r['others_gap_s']} s (at +{r['others_gap_at_s']} s, partition "
                        f"{r['others_gap_partition']}), load {r['load_average']}"
                    )
                results[f"{side} {fault}"] = summary(rounds, key)
                s = results[f"{side} {fault}"]
                progress(
                    f"{side} {fault}: p50 {s[f'{key[:-2]}_p50_s']} s, p99 "
                    f"{s[f'{key[:-2]}_p99_s']} s; others' gap p50 {s['others_gap_p50_s']} s, "
                    f"p99 {s['others_gap_p99_s']} s"
                )
        return results
    finally:
        for broker in brokers:
            if broker.process is not None:  # a frozen one, interrupted, is killed all the same
                with contextlib.suppress(ProcessLookupError):
                    os.kill(broker.process.pid, signal.SIGCONT)
            broker.kill()
        backing.stop()
        if args.keep:
            progress(f"logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=10, help="rounds per side and fault")
    parser.add_argument("--freeze", type=float, default=12.0, help="seconds of SIGSTOP")
    parser.add_argument("--sides", default="producer,consumer", help="producer, consumer or both")
    parser.add_argument("--faults", default="kill,freeze", help="kill, freeze or both")
    parser.add_argument(
        "--lease-ms", type=int, default=None, help="cluster.lease_ttl_ms (default: the brokers')"
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the brokers' logs, and write the client's (debug, with each fault) beside them",
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
