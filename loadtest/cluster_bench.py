"""A 3-broker cluster against one broker on the same machine, and the failover time.

    python -m loadtest.cluster_bench [--seconds 10] [--producers 8] [--window 8] [--output FILE]

Rows, each a fresh set of processes on 127.0.0.1 (etcd and moto's S3 server started here, stopped
by PID):

- `1 broker, embedded`: today's default, a local object store, fsync `always`;
- `1 broker, cluster`: the same broker in cluster mode (etcd + S3): a produce is answered once
  its batch is in the object store, so the difference is what object-store durability costs;
- `3 brokers, cluster`: a 6-partition topic spread over three brokers.

Each row runs `--producers` asyncio producers in this process for `--seconds`, 100-byte values.
`--api batch` (the default): each a `Producer` of its own client (which routes to the owners
itself) calling `send_batch` with 1,000 values, up to `--window` calls unanswered. `--api record`:
each sends single-record PRODUCE requests to the owner of its partition (found in etcd), up to
`--window` in flight. Reported: acknowledged messages/s, acknowledgement latency percentiles, and
CPU seconds per million messages of every broker (from /proc) and of this client. On these shared
2-core machines rates swing 2x from run to run; the brokers' CPU per message is the steadier figure.

`failover` (`--failover-rounds`, default 10): one producer produces to a partition while a
consumer reads it; its owner is killed with kill -9; reported per round and as p50/p99: seconds
from the kill to the first produce acknowledged by the new owner and to the first message of that
partition delivered by it (the lease TTL, `cluster.lease_ttl_ms`, bounds both from below; the
brokers' default unless `--lease-ms`). The killed broker is started again before the next round
(with the default `cluster.handoff_after_ms` it takes nothing back), and the next round kills the
partition's owner then. Each round is broken down from the brokers' JSON log lines (seconds after
the kill): `gone` (a survivor's brokers watch saw the victim's lease expire:
`cluster.broker_gone`), `acquiring` (the new owner won the partition's key), `take_over_start`
(its take-over started; before the object-store part left the topic's turn, after waiting for
it), `acquired` (`cluster.acquired`; `claim_ms`, `marker_ms`, `turn_ms` (waiting for the topic's
turn, which another partition's take-over may hold), `local_ms` from
`cluster.partition_acquired`), then `ack` (the client's first acknowledgement by the new owner;
`client_after_acquired` is the client's own share). The load average is noted with each round.
`--only-failover` runs only the 3-broker row (its throughput part for `--seconds`, 0 for none).
`--idempotent-failover`: the failover producer is idempotent, so its first acknowledgement by the
new owner also waits for the partition's producer table, rebuilt from the object store.
The failover producer uses the client's default `AtLeastOnce()` (a partition between owners does
not use up its retries); `--retry patient` gives it 1,000 retries, as the rounds before
2026-11-25's issue 21 item 3 work did.

Object-store requests: every cluster row reports the tail's PUTs per second and per million
acknowledged messages (the brokers' /metrics), and what that costs at S3 Standard's public price
for PUTs ($0.005 per 1,000); per broker too (`tail_puts_per_s_by_broker`), since only the
brokers owning busy partitions write.

`--partitions 1,6,24` runs the rows once per partition count (default 6), to see how the tail's
PUTs per broker grow with the partitions a broker owns (issue 21 item 2); `--rows cluster3`
(comma-separated among `embedded`, `cluster1`, `cluster3`) runs only those rows;
`--tail-layout broker` runs the brokers with one tail object per broker per window.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import aetcd

import headwater
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.records import build_batch
from loadtest.harness import free_port, latency_summary, process_cpu, say, wait_port

PARTITIONS = 6  # the topic's partitions (`--partitions` sets it for each run of the rows)
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "x",
    "AWS_SECRET_ACCESS_KEY": "x",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class Backing:
    """etcd and moto, for the cluster rows."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.etcd_port, self.s3_port = free_port(), free_port()
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        peer = free_port()
        client = f"http://127.0.0.1:{self.etcd_port}"
        etcd = shutil.which("etcd") or "/usr/bin/etcd"
        self.processes.append(
            subprocess.Popen(
                [etcd, f"--data-dir={self.root / 'etcd'}", f"--listen-client-urls={client}",
                 f"--advertise-client-urls={client}", f"--listen-peer-urls=http://127.0.0.1:{peer}",
                 f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                 f"--initial-cluster=default=http://127.0.0.1:{peer}", "--log-level=error"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
        self.processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.s3_port)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={**os.environ, **CREDENTIALS},
            )
        )  # fmt: skip
        wait_port(self.etcd_port, 30)
        wait_port(self.s3_port, 30)
        request = urllib.request.Request(f"http://127.0.0.1:{self.s3_port}/bench", method="PUT")
        urllib.request.urlopen(request, timeout=10).close()

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait(10)


S3_PUT_DOLLARS = 0.005 / 1000  # S3 Standard, us-east-1, public price per PUT


def start_brokers(
    root: Path,
    count: int,
    backing: Backing | None,
    lease_ms: int | None,
    tail_layout: str = "partition",
) -> list[ServerProcess]:
    if backing is None:
        return [ServerProcess(root / "solo").start(60)]
    config = root / "cluster.toml"
    lease = "" if lease_ms is None else f"lease_ttl_ms = {lease_ms}\n"
    config.write_text(
        f'[object_store]\nbackend = "s3"\nbucket = "bench"\n'
        f'endpoint_url = "http://127.0.0.1:{backing.s3_port}"\nregion = "us-east-1"\n'
        f'[cluster]\n{lease}tail_layout = "{tail_layout}"\n'
    )
    brokers = [
        ServerProcess(
            root / f"b{n}",
            extra_args=("--config", str(config), "--cluster", f"etcd://127.0.0.1:{backing.etcd_port}",
                        "--broker-id", f"b{n}", "--log-level", "info", "--log-format", "json",
                        "--http-port", "0",
                        "--http-port-file", str(root / f"b{n}.http")),
            env=CREDENTIALS,
        )
        for n in range(1, count + 1)
    ]  # fmt: skip
    try:
        for broker in brokers:
            broker.start(60)
    except BaseException:  # the ones started would outlive the run (their etcd gone)
        for broker in brokers:
            broker.kill()
        raise
    return brokers


async def owners(backing: Backing | None, brokers: list[ServerProcess]) -> dict[int, str]:
    """partition -> address of its owner (the one broker when not clustered)."""
    if backing is None:
        return dict.fromkeys(range(PARTITIONS), brokers[0].address)
    async with aetcd.Client(host="127.0.0.1", port=backing.etcd_port) as etcd:
        addresses = {}
        for kv in await etcd.get_prefix(b"/headwater/brokers/"):
            data = json.loads(kv.value)
            addresses[kv.key.decode().rsplit("/", 1)[1]] = f"{data['host']}:{data['port']}"
        found = await etcd.get_prefix(b"/headwater/owners/bench/")
        return {
            int(kv.key.decode().rsplit("/", 1)[1]): addresses[kv.value.decode()] for kv in found
        }


async def wait_served(backing: Backing | None, brokers: list[ServerProcess]) -> dict[int, str]:
    """Every partition owned and answering produces (bounded)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = await owners(backing, brokers)
        if len(found) == PARTITIONS:
            try:
                for partition, address in found.items():
                    async with await headwater.connect(address) as client:
                        await produce(client, partition, b"warm-up")
                return found
            except headwater.HeadwaterError:
                pass
        await asyncio.sleep(0.2)
    raise RuntimeError("partitions not served within 60 s")


async def produce(client: headwater.Client, partition: int, value: bytes) -> None:
    response = await client._request(
        m.ProduceRequest("bench", partition, build_batch([(None, value, ())]))
    )
    assert isinstance(response, m.ProduceResponse)


async def throughput(
    owner_of: dict[int, str], seconds: float, producers: int, window: int
) -> dict[str, Any]:
    clients = {a: await headwater.connect(a) for a in set(owner_of.values())}
    latencies: list[int] = []
    acked = 0
    value = b"v" * 100
    stop_at = time.monotonic() + seconds

    async def one(partition: int) -> None:
        nonlocal acked
        client = clients[owner_of[partition]]
        while time.monotonic() < stop_at:
            started = time.perf_counter_ns()
            await produce(client, partition, value)
            latencies.append(time.perf_counter_ns() - started)
            acked += 1

    cpu = time.process_time()
    started = time.monotonic()
    await asyncio.gather(*(one(i % PARTITIONS) for i in range(producers * window)))
    elapsed = time.monotonic() - started
    client_cpu = time.process_time() - cpu
    for client in clients.values():
        await client.close()
    return {
        "acked": acked,
        "rate": round(acked / elapsed),
        "client_cpu_s_per_million": round(client_cpu / acked * 1e6, 1),
        **latency_summary(latencies),
    }


async def throughput_batch(
    bootstrap: str, seconds: float, producers: int, window: int
) -> dict[str, Any]:
    """`producers` batch-API producers, each with up to `window` calls of 1,000 values
    unanswered; latency from the call to its acknowledgement."""
    values = [b"v" * 100] * 1000
    latencies: list[int] = []
    acked = 0
    stop_at = time.monotonic() + seconds

    async def one() -> None:
        nonlocal acked
        async with await headwater.connect(bootstrap) as client:
            producer = client.producer("bench")
            pending: list[tuple[int, Any]] = []

            async def settle_oldest() -> None:
                nonlocal acked
                started, future = pending.pop(0)
                await future
                latencies.append(time.perf_counter_ns() - started)
                acked += len(values)

            while time.monotonic() < stop_at:
                started = time.perf_counter_ns()
                pending.append((started, await producer.send_batch(values)))
                if len(pending) >= window:
                    await settle_oldest()
            while pending:
                await settle_oldest()
            await producer.close()

    cpu = time.process_time()
    started = time.monotonic()
    await asyncio.gather(*(one() for _ in range(producers)))
    elapsed = time.monotonic() - started
    client_cpu = time.process_time() - cpu
    return {
        "acked": acked,
        "rate": round(acked / elapsed),
        "client_cpu_s_per_million": round(client_cpu / acked * 1e6, 1),
        **latency_summary(latencies),
    }


def log_events(brokers: list[ServerProcess], since: float) -> list[dict[str, Any]]:
    """The brokers' JSON log lines written since `since` (wall clock), each with `at` (wall
    seconds) and `broker` (its index), in time order."""
    found = []
    for index, broker in enumerate(brokers):
        if not broker.log_path.exists():
            continue
        for line in broker.log_path.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
                at = datetime.fromisoformat(event["timestamp"]).timestamp()
            except (ValueError, KeyError):
                continue
            if at >= since:
                found.append({**event, "at": at, "broker_index": index})
    return sorted(found, key=lambda e: e["at"])


def stages(events: list[dict[str, Any]], victim: str, killed: float) -> dict[str, Any]:
    """Where a round's time went, in seconds after the kill (None: not logged)."""

    def first(name: str, **fields: Any) -> dict[str, Any] | None:
        return next(
            (
                e
                for e in events
                if e.get("event") == name and all(e.get(k) == v for k, v in fields.items())
            ),
            None,
        )

    def since_kill(event: dict[str, Any] | None) -> float | None:
        return None if event is None else round(event["at"] - killed, 3)

    acquiring = first("cluster.acquiring", topic="bench", partition=0)
    done = first("cluster.partition_acquired", topic="bench", partition=0)
    acquired = first("cluster.acquired", topic="bench", partition=0)
    result: dict[str, Any] = {
        "gone": since_kill(first("cluster.broker_gone", broker=victim)),
        "acquiring": since_kill(acquiring),
        "take_over_start": (
            None if done is None else round(done["at"] - done["ms"] / 1000 - killed, 3)
        ),
        "acquired": since_kill(acquired),
        "new_owner": None if acquired is None else f"b{acquired['broker_index'] + 1}",
    }
    if done is not None:
        result.update(
            {
                k: done[k]
                for k in ("claim_ms", "marker_ms", "turn_ms", "local_ms", "chunks")
                if k in done
            }
        )
    # the other partition(s) the victim held, taken over by the same broker just before
    others = [
        e
        for e in events
        if e.get("event") == "cluster.partition_acquired"
        and e.get("topic") == "bench"
        and e.get("partition") != 0
    ]
    result["other_take_overs"] = [
        {
            "partition": e["partition"],
            "at": since_kill(e),
            "by": f"b{e['broker_index'] + 1}",
            **{k: e[k] for k in ("ms", "claim_ms", "marker_ms", "turn_ms", "local_ms") if k in e},
        }
        for e in others
    ]
    return result


async def failover(
    backing: Backing, brokers: list[ServerProcess], retry: str, idempotent: bool = False
) -> dict[str, Any]:
    """One round of what a user of the Python client sees: its producer's first acknowledgement
    and its consumer's first message of the partition after its owner is killed (the client
    finds the new owner by itself: LOOKUP, backoff, retry). The killed broker is started again."""
    owner_of = await wait_served(backing, brokers)
    victim = next(b for b in brokers if b.address == owner_of[0])
    victim_id = f"b{brokers.index(victim) + 1}"
    survivor = next(b for b in brokers if b is not victim)
    async with await headwater.connect(survivor.address) as client:
        consumer = await client.subscribe(
            "bench", f"failover-{time.monotonic_ns()}", start="latest"
        )
        delivery = (
            headwater.AtLeastOnce()
            if retry == "default"
            # retries for as long as a failover takes, whatever the client does on NOT_OWNER:
            # what is measured is when the cluster can acknowledge
            else headwater.AtLeastOnce(headwater.RetryPolicy(max_retries=1000, timeout=60))
        )
        producer = client.producer("bench", delivery=delivery, idempotent=idempotent)
        # the consumer's leg at the owner follows subscribe() within a LOOKUP round trip, and a
        # `latest` leg placed after the first marker never sees it: marker again until one comes
        for attempt in range(20):
            marker = f"before-the-kill-{attempt}".encode()
            await (await producer.send(marker, partition=0))
            try:
                while (await consumer.receive(timeout=3)).value != marker:
                    pass
                break
            except TimeoutError:
                continue
        else:
            raise RuntimeError("the consumer got none of 20 markers")
        load = os.getloadavg()[0]
        killed_wall = time.time()
        victim.kill()
        killed = time.monotonic()
        killed_wall = (killed_wall + time.time()) / 2
        await asyncio.wait_for(await producer.send(b"after-the-kill", partition=0), 120)
        acked_at = time.monotonic() - killed
        served_at = None
        with contextlib.suppress(TimeoutError):  # reported as None: never delivered in 30 s
            for _ in range(100_000):
                message = await consumer.receive(timeout=30)
                if message.value == b"after-the-kill":
                    served_at = time.monotonic() - killed
                    break
        await producer.close()
        await consumer.close()
    await asyncio.sleep(0.2)  # the brokers' last log lines of the take-over
    breakdown = stages(log_events(brokers, killed_wall - 1.0), victim_id, killed_wall)
    if breakdown["acquired"] is not None:
        breakdown["client_after_acquired"] = round(acked_at - breakdown["acquired"], 3)
    victim.start(60)
    return {
        "kill_to_first_ack_s": round(acked_at, 2),
        "kill_to_first_served_s": round(served_at, 2) if served_at is not None else None,
        "load_average": round(load, 1),
        "stages_s": breakdown,
    }


async def failovers(
    backing: Backing, brokers: list[ServerProcess], rounds: int, retry: str, idempotent: bool
) -> dict[str, Any]:
    found = []
    for n in range(rounds):
        found.append(await failover(backing, brokers, retry, idempotent))
        say(f"  failover round {n + 1}: {found[-1]}")
    acks = sorted(r["kill_to_first_ack_s"] for r in found)
    served = sorted(r["kill_to_first_served_s"] or float("inf") for r in found)

    def percentile(values: list[float], p: float) -> float:
        return values[min(len(values) - 1, int(p * len(values)))]

    def median_of(name: str) -> float | None:
        values = [r["stages_s"].get(name) for r in found]
        present = [v for v in values if v is not None]
        return round(statistics.median(present), 3) if present else None

    return {
        "rounds": found,
        "kill_to_first_ack_p50_s": percentile(acks, 0.5),
        "kill_to_first_ack_p99_s": percentile(acks, 0.99),
        "kill_to_first_served_p50_s": percentile(served, 0.5),
        "kill_to_first_served_p99_s": percentile(served, 0.99),
        "stage_medians_s": {
            name: median_of(name)
            for name in (
                "gone",
                "acquiring",
                "take_over_start",
                "acquired",
                "client_after_acquired",
                "claim_ms",
                "marker_ms",
                "turn_ms",
                "local_ms",
            )
        },
        "load_averages": [r["load_average"] for r in found],
    }


def tail_chunks(brokers: list[ServerProcess]) -> list[int]:
    """Cloud-tail objects each broker wrote so far (their /metrics)."""
    found = []
    for broker in brokers:
        port = int((broker.data_dir.parent / f"{broker.data_dir.name}.http").read_text())
        count = 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            for line in answer.read().decode().splitlines():
                if line.startswith("headwater_cluster_tail_chunks_total "):
                    count += int(float(line.split()[1]))
        found.append(count)
    return found


async def row(name: str, count: int, clustered: bool, args: argparse.Namespace) -> dict[str, Any]:
    say(f"{name} ...")
    root = Path(tempfile.mkdtemp(prefix="hw-cluster-bench-"))
    backing = Backing(root) if clustered else None
    brokers: list[ServerProcess] = []
    try:
        if backing is not None:
            backing.start()
        brokers = start_brokers(root, count, backing, args.lease_ms, args.tail_layout)
        async with await headwater.connect(brokers[0].address) as client:
            await client.create_topic("bench", partitions=PARTITIONS)
        owner_of = await wait_served(backing, brokers)
        before = {b.address: process_cpu(b.process.pid) for b in brokers if b.process}
        backing_before = [process_cpu(p.pid) for p in backing.processes] if backing else []
        chunks_before = tail_chunks(brokers) if backing else []
        if args.seconds <= 0:
            result = {"acked": 0}
        elif args.api == "batch":
            result = await throughput_batch(
                brokers[0].address, args.seconds, args.producers, args.window
            )
        else:
            result = await throughput(owner_of, args.seconds, args.producers, args.window)
        cpu = {
            b.address: process_cpu(b.process.pid) - before[b.address] for b in brokers if b.process
        }
        result["per_broker_cpu_s"] = [round(c, 2) for c in cpu.values()]
        if result["acked"]:
            result["broker_cpu_s_per_million"] = round(sum(cpu.values()) / result["acked"] * 1e6, 1)
        # etcd's and moto's (the object store's) share of the machine
        if backing is not None and result["acked"]:
            spent = [
                process_cpu(p.pid) - b
                for p, b in zip(backing.processes, backing_before, strict=True)
            ]
            result["etcd_cpu_s"], result["object_store_cpu_s"] = (round(c, 2) for c in spent)
            by_broker = [
                after - before
                for after, before in zip(tail_chunks(brokers), chunks_before, strict=True)
            ]
            chunks = sum(by_broker)
            result["tail_puts_per_s_by_broker"] = [round(c / args.seconds, 1) for c in by_broker]
            result["records_per_chunk"] = round(result["acked"] / max(chunks, 1), 1)
            result["tail_puts_per_s"] = round(chunks / args.seconds, 1)
            result["tail_puts_per_broker_per_s"] = round(chunks / args.seconds / count, 1)
            result["tail_puts_per_million_msgs"] = round(chunks / result["acked"] * 1e6)
            result["tail_put_dollars_per_million_msgs"] = round(
                chunks / result["acked"] * 1e6 * S3_PUT_DOLLARS, 5
            )
            result["tail_put_dollars_per_broker_per_month"] = round(
                chunks / args.seconds / count * S3_PUT_DOLLARS * 86400 * 30, 2
            )
        if count == 3 and backing is not None and args.failover_rounds:
            say(f"{name}: failover ...")
            result["failover"] = await failovers(
                backing, brokers, args.failover_rounds, args.retry, args.idempotent_failover
            )
        return {"row": name, "partitions": PARTITIONS, "tail_layout": args.tail_layout, **result}
    finally:
        for broker in brokers:
            broker.kill()
        if backing is not None:
            backing.stop()
        if args.keep_logs is not None and brokers:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for broker in brokers:
                if broker.log_path.exists():
                    shutil.copy(broker.log_path, args.keep_logs / broker.log_path.name)
        shutil.rmtree(root, ignore_errors=True)


ROWS = {
    "embedded": ("1 broker, embedded", 1, False),
    "cluster1": ("1 broker, cluster", 1, True),
    "cluster3": ("3 brokers, cluster", 3, True),
}


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    global PARTITIONS
    chosen = ["cluster3"] if args.only_failover else args.rows.split(",")
    unknown = set(chosen) - set(ROWS)
    if unknown:
        raise SystemExit(f"unknown rows {sorted(unknown)}: choose among {sorted(ROWS)}")
    results = []
    for partitions in (int(n) for n in args.partitions.split(",")):
        PARTITIONS = partitions
        for key in chosen:
            name, count, clustered = ROWS[key]
            results.append(await row(name, count, clustered, args))
    return results


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--producers", type=int, default=8, help="producers")
    parser.add_argument("--window", type=int, default=8, help="produces in flight per producer")
    parser.add_argument("--api", choices=("batch", "record"), default="batch")
    parser.add_argument(
        "--lease-ms", type=int, default=None, help="cluster.lease_ttl_ms (default: the brokers')"
    )
    parser.add_argument("--failover-rounds", type=int, default=10, help="0: none")
    parser.add_argument(
        "--only-failover",
        action="store_true",
        help="only the 3-broker row: --seconds of throughput (0: none), then the rounds",
    )
    parser.add_argument(
        "--retry",
        choices=("default", "patient"),
        default="default",
        help="the failover producer's policy: the client's default, or 1,000 retries",
    )
    parser.add_argument(
        "--idempotent-failover",
        action="store_true",
        help="the failover rounds' producer is idempotent (its first ack by the new owner waits "
        "for the partition's producer table, rebuilt from the object store)",
    )
    parser.add_argument(
        "--partitions", default=str(PARTITIONS), help="the topic's partitions, e.g. 1,6,24"
    )
    parser.add_argument(
        "--rows", default=",".join(ROWS), help=f"rows to run, among {','.join(ROWS)}"
    )
    parser.add_argument(
        "--tail-layout",
        choices=("partition", "broker"),
        default="partition",
        help="the brokers' cluster.tail_layout: a tail object per partition or per broker",
    )
    parser.add_argument("--output", type=Path, help="also write the JSON rows here")
    parser.add_argument("--keep-logs", type=Path, help="copy the brokers' logs into this folder")
    args = parser.parse_args()
    results = asyncio.run(main(args))
    text = json.dumps(results, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    cli()
