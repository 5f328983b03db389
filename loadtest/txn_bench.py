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

Prints a table (msgs/s, transactions/s, server CPU µs per message, and each producer row's share
of the idempotent throughput) and, with `--json`, the same as JSON.

    python -m loadtest.txn_bench --seconds 10
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PARTITIONS = 3
VALUE = b"v" * 100
COMMIT_EVERY_MS = (1, 10, 100)
BASE: dict[str, Any] = {"acks": "all", "linger.ms": 5, "queue.buffering.max.messages": 1_000_000}


def idempotent(bootstrap: str, topic: str, seconds: float) -> tuple[int, int]:
    """(records, transactions) produced in `seconds`."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **BASE})
    sent = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(1000):
            _produce(producer, topic, sent)
            sent += 1
        producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("the idempotent producer did not deliver everything in 120 s")
    return sent, 0


def transactional(every_ms: int) -> Callable[[str, str, float], tuple[int, int]]:
    def run(bootstrap: str, topic: str, seconds: float) -> tuple[int, int]:
        from confluent_kafka import Producer

        producer = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": f"bench-{topic}", **BASE}
        )
        producer.init_transactions(30)
        sent = transactions = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            producer.begin_transaction()
            window = time.monotonic() + every_ms / 1000
            while time.monotonic() < window:
                for _ in range(100):
                    _produce(producer, topic, sent)
                    sent += 1
                producer.poll(0)
            producer.commit_transaction(60)
            transactions += 1
        return sent, transactions

    return run


def _produce(producer: Any, topic: str, number: int) -> None:
    while True:
        try:
            producer.produce(topic, VALUE, partition=number % PARTITIONS)
            return
        except BufferError:  # the local queue is full: let deliveries drain it
            producer.poll(0.01)


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


def run(seconds: float) -> dict[str, Any]:
    from headwater.testing import ServerProcess

    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        port_file = root / "kafka.port"
        server = ServerProcess(
            root / "data", extra_args=("--kafka-port", "0", "--kafka-port-file", str(port_file))
        ).start()
        assert server.process is not None
        pid = server.process.pid
        bootstrap = f"127.0.0.1:{int(port_file.read_text())}"
        try:
            producers: list[tuple[str, str, Callable[[str, str, float], tuple[int, int]]]] = [
                ("idempotent producer", "idempotent", idempotent)
            ] + [
                (f"transactional, commit every {ms} ms", f"txn-{ms}", transactional(ms))
                for ms in COMMIT_EVERY_MS
            ]
            _create(server.address, *(topic for _, topic, _ in producers))
            for name, topic, step in producers:
                (sent, transactions), elapsed, cpu = _timed(
                    pid, lambda s=step, t=topic: s(bootstrap, t, seconds)
                )
                # every record acknowledged: the partitions' ends hold them and one marker per
                # partition per transaction
                held = _held(bootstrap, topic) - transactions * PARTITIONS
                if held != sent:
                    raise RuntimeError(f"{name}: {sent} records sent, {held} in the partitions")
                rows[name] = {
                    "msgs_per_s": round(sent / elapsed),
                    "txns_per_s": round(transactions / elapsed, 1),
                    "server_cpu_us_per_msg": round(cpu / sent * 1e6, 2),
                    "records": sent,
                }
            baseline = rows["idempotent producer"]["msgs_per_s"]
            for name, _, _ in producers[1:]:
                rows[name]["of_idempotent"] = round(rows[name]["msgs_per_s"] / baseline, 3)
            records = int(rows[f"transactional, commit every {COMMIT_EVERY_MS[-1]} ms"]["records"])
            for isolation in ("read_committed", "read_uncommitted"):
                _, elapsed, cpu = _timed(
                    pid,
                    lambda i=isolation: consume(  # type: ignore[misc]
                        bootstrap, f"txn-{COMMIT_EVERY_MS[-1]}", records, i
                    ),
                )
                rows[f"{isolation} consumer"] = {
                    "msgs_per_s": round(records / elapsed),
                    "server_cpu_us_per_msg": round(cpu / records * 1e6, 2),
                    "records": records,
                }
        finally:
            server.stop()
    return {
        "seconds_per_producer_row": seconds,
        "value_bytes": len(VALUE),
        "rows": rows,
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{'row':38} {'msgs/s':>9} {'txns/s':>8} {'server µs/msg':>14} {'of idempotent':>14}",
    ]
    for name, row in result["rows"].items():
        share = row.get("of_idempotent")
        lines.append(
            f"{name:38} {row['msgs_per_s']:>9,} {row.get('txns_per_s', ''):>8} "
            f"{row['server_cpu_us_per_msg']:>14} {'' if share is None else f'{share:.0%}':>14}"
        )
    lines.append(
        f"({result['seconds_per_producer_row']} s per producer row, {result['value_bytes']}-byte "
        f"values, {result['cpus']} CPUs, load average {result['load_average']})"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per producer row")
    parser.add_argument("--json", action="store_true", help="the results as JSON too")
    args = parser.parse_args()
    result = run(args.seconds)
    print(table(result))
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
