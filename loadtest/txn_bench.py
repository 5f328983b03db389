"""Kafka transactions' cost: confluent-kafka transactional throughput beside idempotent, same run.

A server of its own (a temporary data directory) with its Kafka listener on; topics of 3
partitions, reliable, fsync `always` (the default: a commit's records are fsynced before it is
decided whatever the policy, so the idempotent row is the like-for-like durable baseline).
100-byte values, produced for `--seconds` per row by one confluent-kafka (librdkafka) producer
(acks=all, linger 5 ms, 3 partitions round robin); the server's CPU seconds over the same span
(/proc/<pid>/stat):

- `idempotent producer`: `enable.idempotence=true`, `produce()` per record, then `flush()`;
- `transactional, commit every N ms` (N = 1, 10, 100): `begin_transaction()`, `produce()` until
  N ms have passed since the begin, `commit_transaction()`, again; a commit every N ms of
  producing, each commit's own round trips (EndTxn, the markers and their fsyncs) on top;
- `read_committed consumer`, `read_uncommitted consumer`: every record of the 100 ms row's
  topic (its markers included: one per partition per transaction), three partitions assigned
  from the beginning, `consume()` in batches of up to 10,000.

`--runs` runs of every row, in turn on the same server (fresh topics each run): each row's median
run, every run's msgs/s, transactions/s and the commits' durations (`commit_transaction()` alone,
median and 90th percentile), server CPU µs per message, and each transactional row's share of
the idempotent row's throughput in the same run (the median of the runs' shares); with `--json`,
the same as JSON.

    python -m loadtest.txn_bench --seconds 10 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PARTITIONS = 3
VALUE = b"v" * 100
COMMIT_EVERY_MS = (1, 10, 100)
BASE: dict[str, Any] = {"acks": "all", "linger.ms": 5, "queue.buffering.max.messages": 1_000_000}


Produced = tuple[int, list[float]]  # records, each commit's seconds
Rows = dict[str, dict[str, Any]]


def idempotent(bootstrap: str, topic: str, seconds: float) -> Produced:
    """(records, commits' durations) produced in `seconds`."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **BASE})
    sent = _fill(producer, topic, 0, time.monotonic() + seconds)
    if producer.flush(120):
        raise RuntimeError("the idempotent producer did not deliver everything in 120 s")
    return sent, []


def transactional(every_ms: int) -> Callable[[str, str, float], Produced]:
    def run(bootstrap: str, topic: str, seconds: float) -> Produced:
        from confluent_kafka import Producer

        producer = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": f"bench-{topic}", **BASE}
        )
        producer.init_transactions(30)
        sent = 0
        commits: list[float] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            producer.begin_transaction()
            sent = _fill(producer, topic, sent, time.monotonic() + every_ms / 1000)
            started = time.perf_counter()
            producer.commit_transaction(60)
            commits.append(time.perf_counter() - started)
        return sent, commits

    return run


def _fill(producer: Any, topic: str, sent: int, until: float) -> int:
    """Records produced until `until` (checked every 100, the same loop for every row)."""
    while time.monotonic() < until:
        for _ in range(100):
            while True:
                try:
                    producer.produce(topic, VALUE, partition=sent % PARTITIONS)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.01)
            sent += 1
        producer.poll(0)
    return sent


def consume(bootstrap: str, topic: str, records: int, isolation: str) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{isolation}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        seen = 0
        deadline = time.monotonic() + 300
        while seen < records and time.monotonic() < deadline:
            seen += sum(1 for m in consumer.consume(10_000, 1.0) if not m.error())
        if seen < records:
            raise RuntimeError(f"{isolation}: read {seen} of {records} records")
    finally:
        consumer.close()


def _held(bootstrap: str, topic: str) -> int:
    """The offsets the topic's partitions hold (their high watermarks; no restart, no gap)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-ends"})
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), 30)[1]
            for p in range(PARTITIONS)
        )
    finally:
        consumer.close()


def _timed(server_pid: int, work: Callable[[], Any]) -> tuple[Any, float, float]:
    """(work's result, seconds, server CPU seconds) over the work."""
    from loadtest.harness import process_cpu

    cpu = process_cpu(server_pid)
    started = time.perf_counter()
    result = work()
    return result, time.perf_counter() - started, process_cpu(server_pid) - cpu


def _create(address: str, *topics: str) -> None:
    import asyncio

    import headwater

    async def create() -> None:
        async with await headwater.connect(address) as client:
            for topic in topics:
                await client.create_topic(topic, partitions=PARTITIONS, dispatch="reliable")

    asyncio.run(create())


def _one_run(pid: int, address: str, bootstrap: str, run: int, seconds: float) -> Rows:
    """Every row once, on topics of their own."""
    rows: Rows = {}
    producers: list[tuple[str, str, Callable[[str, str, float], Produced]]] = [
        ("idempotent producer", f"idempotent-{run}", idempotent)
    ] + [
        (f"transactional, commit every {ms} ms", f"txn-{ms}-{run}", transactional(ms))
        for ms in COMMIT_EVERY_MS
    ]
    _create(address, *(topic for _, topic, _ in producers))
    for name, topic, step in producers:
        (sent, commits), elapsed, cpu = _timed(
            pid, lambda s=step, t=topic: s(bootstrap, t, seconds)
        )
        # every record acknowledged: the partitions hold them and one marker per partition per
        # transaction
        held = _held(bootstrap, topic) - len(commits) * PARTITIONS
        if held != sent:
            raise RuntimeError(f"{name}: {sent} records sent, {held} in the partitions")
        rows[name] = {
            "msgs_per_s": round(sent / elapsed),
            "txns_per_s": round(len(commits) / elapsed, 1),
            "commit_ms_p50": round(statistics.median(commits) * 1000, 1) if commits else 0,
            "commit_ms_p90": round(sorted(commits)[len(commits) * 9 // 10] * 1000, 1)
            if commits
            else 0,
            "server_cpu_us_per_msg": round(cpu / sent * 1e6, 2),
            "records": sent,
        }
    records = int(rows[f"transactional, commit every {COMMIT_EVERY_MS[-1]} ms"]["records"])
    for isolation in ("read_committed", "read_uncommitted"):
        topic = f"txn-{COMMIT_EVERY_MS[-1]}-{run}"
        _, elapsed, cpu = _timed(
            pid, lambda i=isolation, t=topic: consume(bootstrap, t, records, i)
        )
        rows[f"{isolation} consumer"] = {
            "msgs_per_s": round(records / elapsed),
            "server_cpu_us_per_msg": round(cpu / records * 1e6, 2),
            "records": records,
        }
    return rows


def run(seconds: float, runs: int) -> dict[str, Any]:
    """`runs` runs of every row on one server; each row's median run, and its share of the
    idempotent row's throughput in the same run (the median of those)."""
    from headwater.testing import ServerProcess

    every: list[Rows] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        port_file = root / "kafka.port"
        server = ServerProcess(
            root / "data", extra_args=("--kafka-port", "0", "--kafka-port-file", str(port_file))
        ).start()
        assert server.process is not None
        bootstrap = f"127.0.0.1:{int(port_file.read_text())}"
        try:
            for number in range(runs):
                every.append(
                    _one_run(server.process.pid, server.address, bootstrap, number, seconds)
                )
        finally:
            server.stop()
    rows: Rows = {}
    for name in every[0]:
        found = sorted(every, key=lambda r: r[name]["msgs_per_s"])
        rows[name] = dict(found[len(found) // 2][name])
        rows[name]["runs_msgs_per_s"] = [r[name]["msgs_per_s"] for r in every]
        if name.startswith("transactional"):
            shares = [r[name]["msgs_per_s"] / r["idempotent producer"]["msgs_per_s"] for r in every]
            rows[name]["of_idempotent"] = round(statistics.median(shares), 3)
    return {
        "seconds_per_producer_row": seconds,
        "runs": runs,
        "value_bytes": len(VALUE),
        "rows": rows,
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
    }


def table(result: dict[str, Any]) -> str:
    head = (
        f"{'row':36} {'msgs/s':>9} {'runs':>26} {'txns/s':>7} {'commit ms p50/p90':>17} "
        f"{'server µs/msg':>13} {'of idempotent':>13}"
    )
    lines = [head]
    for name, row in result["rows"].items():
        share = row.get("of_idempotent")
        runs = " / ".join(f"{x:,}" for x in row["runs_msgs_per_s"])
        commit = (
            f"{row['commit_ms_p50']} / {row['commit_ms_p90']}" if "commit_ms_p50" in row else ""
        )
        lines.append(
            f"{name:36} {row['msgs_per_s']:>9,} {runs:>26} {row.get('txns_per_s', ''):>7} "
            f"{commit:>17} {row['server_cpu_us_per_msg']:>13} "
            f"{'' if share is None else f'{share:.0%}':>13}"
        )
    lines.append(
        f"(median of {result['runs']} runs, {result['seconds_per_producer_row']} s per producer "
        f"row, {result['value_bytes']}-byte values, {result['cpus']} CPUs, load average "
        f"{result['load_average']})"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per producer row")
    parser.add_argument("--runs", type=int, default=3, help="runs of every row, alternating")
    parser.add_argument("--json", action="store_true", help="the results as JSON too")
    args = parser.parse_args()
    result = run(args.seconds, args.runs)
    print(table(result))
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
