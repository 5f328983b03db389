"""Kafka share groups (KIP-932) beside classic groups and native Shared consumers, same run.

A server of its own (a temporary data directory) with its Kafka listener on; one reliable topic
of 2 partitions (the default fsync policy) filled first with `--records` 100-byte records, round
robin. Every row is a fresh group on that topic reading from its start, each consumer in a
process of its own (spawned: the GIL caps none of them):

- `share xN`: confluent-kafka's `ShareConsumer` (librdkafka), explicit acknowledgement: each
  record of a `poll()` ACCEPTed, the acknowledgements travelling in one batch on the next
  ShareFetch. The share group is made natively first to start at the earliest offset;
- `classic xN`: confluent-kafka's `Consumer`, `group.protocol=classic`, `consume()` up to 500,
  one asynchronous offset commit per batch. Two partitions keep at most two members busy: the
  `x8` row shows the other six idle (the `busy` column);
- `native shared xN`: the headwater client, `subscribe(..., type="shared")`, `receive_batch()`
  and an ack per record (the acks of a batch travel in one request).

Two settings: `5ms` (each record takes 5 ms to process, `time.sleep(0.005)` in the consumer: the
work queue share groups exist for) and `0ms` (no processing: the protocol's cost). A row starts
its consumers and waits until each has records in hand (a classic member: its assignment), lets
them run `--settle` seconds, then counts the records consumed and acknowledged over `--seconds`
with the server's user+system CPU over the same span (/proc/<pid>/stat): records/s and server
CPU µs per record. A window ends early when the group has read the whole topic (the `s` column:
the seconds measured; raise `--records` when it is short). Progress goes to stderr, the table
to stdout (`--json`: JSON too); `--reverse` runs the rows in the opposite order, for
alternating runs.

    python -m loadtest.share_bench --seconds 8 --records 1200000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PARTITIONS = 2
VALUE = b"v" * 100
TOPIC = "share-bench"
SETUP_TIMEOUT = 120.0  # seconds a row's consumers may take to have records in hand
SETTINGS = {"5ms": 0.005, "0ms": 0.0}
ROWS = (
    [("share", n) for n in (1, 2, 4, 8)]
    + [("classic", n) for n in (1, 2, 8)]
    + [("native shared", n) for n in (1, 8)]
)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _share(bootstrap: str, group: str, delay: float, count: Any, ready: Any, stop: Any) -> None:
    from confluent_kafka import AcknowledgeType, ShareConsumer

    consumer = ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
        }
    )
    consumer.subscribe([TOPIC])
    try:
        while not stop.is_set():
            messages = consumer.poll(0.5)
            for message in messages:
                if message.error() is not None:
                    raise RuntimeError(str(message.error()))
                if delay:
                    time.sleep(delay)
                consumer.acknowledge(message, AcknowledgeType.ACCEPT)
                count.value += 1  # per record: a poll may hold seconds of work
            if messages:
                ready.set()
    finally:
        consumer.close()


def _classic(bootstrap: str, group: str, delay: float, count: Any, ready: Any, stop: Any) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": "classic",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            # librdkafka prefetches up to 64 MiB a partition by default: the whole topic during
            # the settling time, the window then reading its own memory (and the server idle)
            "queued.max.messages.kbytes": 1024,
        }
    )
    consumer.subscribe([TOPIC], on_assign=lambda _consumer, _partitions: ready.set())
    try:
        while not stop.is_set():
            messages = consumer.consume(500, 0.5)
            for message in messages:
                if message.error() is not None:
                    raise RuntimeError(str(message.error()))
                if delay:
                    time.sleep(delay)
                count.value += 1
            if messages:
                consumer.commit(asynchronous=True)
    finally:
        consumer.close()


def _native(address: str, group: str, delay: float, count: Any, ready: Any, stop: Any) -> None:
    import headwater

    async def run() -> None:
        async with await headwater.connect(address) as client:
            consumer = await client.subscribe(TOPIC, group, type="shared", start="earliest")
            while not stop.is_set():
                try:
                    messages = await consumer.receive_batch(500, timeout=0.5)
                except TimeoutError:
                    continue
                for message in messages:
                    if delay:
                        time.sleep(delay)  # the work blocks the loop, as CPU-bound work would
                    await consumer.ack(message)
                    count.value += 1
                ready.set()
            await consumer.close()

    asyncio.run(run())


def _worker(
    kind: str,
    bootstrap: str,
    address: str,
    group: str,
    delay: float,
    count: Any,
    ready: Any,
    stop: Any,
    errors: Any,
) -> None:
    try:
        if kind == "share":
            _share(bootstrap, group, delay, count, ready, stop)
        elif kind == "classic":
            _classic(bootstrap, group, delay, count, ready, stop)
        else:
            _native(address, group, delay, count, ready, stop)
    except BaseException as exc:  # reported by the parent, which fails the row
        errors.put(f"{kind} {group}: {exc!r}")


def _fill(bootstrap: str, records: int) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "queue.buffering.max.messages": 1_000_000}
    )
    for i in range(records):
        producer.produce(TOPIC, VALUE, partition=i % PARTITIONS)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("the producer did not deliver every record in 300 s")


def _create(address: str, groups: list[str]) -> None:
    """The topic, and the Shared subscriptions of the share rows from the topic's start (a share
    group made by its first heartbeat would start at the latest offset)."""
    import headwater

    async def make() -> None:
        async with await headwater.connect(address) as client:
            await client.create_topic(TOPIC, partitions=PARTITIONS, dispatch="reliable")
            for group in groups:
                consumer = await client.subscribe(TOPIC, group, type="shared", start="earliest")
                await consumer.close()

    asyncio.run(make())


def _row(
    pid: int,
    bootstrap: str,
    address: str,
    kind: str,
    consumers: int,
    group: str,
    delay: float,
    seconds: float,
    settle: float,
    records: int,
) -> dict[str, Any]:
    from loadtest.harness import process_cpu

    ctx = mp.get_context("spawn")
    stop, errors = ctx.Event(), ctx.Queue()
    counts = [ctx.Value("q", 0, lock=False) for _ in range(consumers)]
    readies = [ctx.Event() for _ in range(consumers)]
    processes = [
        ctx.Process(
            target=_worker,
            args=(kind, bootstrap, address, group, delay, counts[i], readies[i], stop, errors),
            daemon=True,
        )
        for i in range(consumers)
    ]
    for process in processes:
        process.start()
    try:
        deadline = time.monotonic() + SETUP_TIMEOUT
        while not all(r.is_set() for r in readies):
            if not errors.empty():
                raise RuntimeError(errors.get())
            if time.monotonic() > deadline:
                raise RuntimeError(f"{group}: consumers not ready in {SETUP_TIMEOUT} s")
            time.sleep(0.05)
        time.sleep(settle)
        before = [c.value for c in counts]
        cpu, started = process_cpu(pid), time.monotonic()
        while time.monotonic() - started < seconds and sum(c.value for c in counts) < records:
            time.sleep(0.01)  # until the window's end, or the group has read the whole topic
        after = [c.value for c in counts]
        cpu, elapsed = process_cpu(pid) - cpu, time.monotonic() - started
    finally:
        stop.set()
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
    if not errors.empty():
        raise RuntimeError(errors.get())
    done = sum(after) - sum(before)
    if not done:
        raise RuntimeError(f"{group}: no record consumed in the window (raise --records?)")
    return {
        "records_per_s": round(done / elapsed),
        "server_cpu_us_per_record": round(cpu / done * 1e6, 1),
        "busy": sum(1 for b, a in zip(before, after, strict=True) if a > b),
        "seconds": round(elapsed, 1),
        "records": done,
    }


def run(
    seconds: float, settle: float, records: int, reverse: bool, settings: list[str]
) -> dict[str, Any]:
    from headwater.testing import ServerProcess

    records = records // PARTITIONS * PARTITIONS
    plan = [(setting, kind, n) for setting in settings for kind, n in ROWS]
    if reverse:
        plan.reverse()
    groups = {(s, k, n): f"{k.replace(' ', '-')}-{n}-{s}" for s, k, n in plan}
    loads = [os.getloadavg()[0]]
    rows: dict[str, dict[str, dict[str, Any]]] = {setting: {} for setting in settings}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        port_file = root / "kafka.port"
        server = ServerProcess(
            root / "data", extra_args=("--kafka-port", "0", "--kafka-port-file", str(port_file))
        ).start()
        assert server.process is not None
        bootstrap = f"127.0.0.1:{int(port_file.read_text())}"
        try:
            _create(server.address, [g for (_, k, _), g in groups.items() if k == "share"])
            _say(f"filling {TOPIC}: {records:,} records of {len(VALUE)} bytes")
            _fill(bootstrap, records)
            for step, (setting, kind, n) in enumerate(plan, 1):
                name = f"{kind} x{n}"
                row = _row(
                    server.process.pid,
                    bootstrap,
                    server.address,
                    kind,
                    n,
                    groups[setting, kind, n],
                    SETTINGS[setting],
                    seconds,
                    settle,
                    records,
                )
                loads.append(os.getloadavg()[0])
                row["load"] = round(loads[-1], 1)
                rows[setting][name] = row
                _say(
                    f"[{step}/{len(plan)}] {setting} {name}: {row['records_per_s']:,} records/s, "
                    f"{row['server_cpu_us_per_record']} server µs/record, {row['busy']} busy, "
                    f"over {row['seconds']} s (load {row['load']})"
                )
        finally:
            server.stop()
    return {
        "seconds_per_row": seconds,
        "records": records,
        "value_bytes": len(VALUE),
        "order": "reverse" if reverse else "forward",
        "rows": {s: dict(sorted(r.items(), key=lambda i: _order(i[0]))) for s, r in rows.items()},
        "ratios": _ratios(rows),
        "cpus": os.cpu_count(),
        "load_average": {"min": round(min(loads), 1), "max": round(max(loads), 1)},
        "python": platform.python_version(),
    }


def _ratios(rows: dict[str, dict[str, dict[str, Any]]]) -> dict[str, float]:
    """The targets' ratios (issue 39), within the run."""
    ratios: dict[str, float] = {}
    if slow := rows.get("5ms"):
        for kind, target in (("share", " (target >= 6)"), ("native shared", ""), ("classic", "")):
            x8, x1 = slow[f"{kind} x8"]["records_per_s"], slow[f"{kind} x1"]["records_per_s"]
            ratios[f"5ms records/s {kind} x8 / x1{target}"] = round(x8 / x1, 2)
    if fast := rows.get("0ms"):
        for n in (1, 2, 8):
            share = fast[f"share x{n}"]["server_cpu_us_per_record"]
            classic = fast[f"classic x{n}"]["server_cpu_us_per_record"]
            ratios[f"0ms server µs/record share x{n} / classic x{n} (target <= 1.5)"] = round(
                share / classic, 2
            )
    return ratios


def _order(name: str) -> int:
    return [f"{kind} x{n}" for kind, n in ROWS].index(name)


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{'setting':8} {'row':18} {'records/s':>10} {'server µs/record':>16} {'busy':>5} "
        f"{'s':>5} {'load':>5}"
    ]
    for setting, rows in result["rows"].items():
        for name, row in rows.items():
            lines.append(
                f"{setting:8} {name:18} {row['records_per_s']:>10,} "
                f"{row['server_cpu_us_per_record']:>16} {row['busy']:>5} {row['seconds']:>5} "
                f"{row['load']:>5}"
            )
    lines += [f"{name}: {value}" for name, value in result["ratios"].items()]
    lines.append(
        f"({result['seconds_per_row']} s per row, {result['records']:,} records of "
        f"{result['value_bytes']} bytes, {result['order']} order, {result['cpus']} CPUs, "
        f"load average {result['load_average']['min']}-{result['load_average']['max']})"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per row")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds before measuring")
    parser.add_argument("--records", type=int, default=1_200_000, help="records in the topic")
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--reverse", action="store_true", help="the rows in the opposite order")
    parser.add_argument("--json", action="store_true", help="the results as JSON too")
    args = parser.parse_args()
    result = run(args.seconds, args.settle, args.records, args.reverse, args.settings)
    print(table(result))
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
