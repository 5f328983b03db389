"""confluent-kafka (librdkafka) against a 3-broker Headwater cluster: throughput and failover.

    python -m loadtest.kafka_cluster_bench [--records 100000] [--runs 3] [--failover-rounds 3]
        [--faults kill,freeze] [--freeze 12] [--only-failover]

etcd and moto's S3 server are started here (`cluster_bench.Backing`), then three brokers on
127.0.0.1, each with a Kafka port, all stopped by PID at the end. A 6-partition topic created
through one broker's Kafka port (CreateTopics). Rows, 100-byte values, spread over the
partitions by librdkafka's default partitioner (no key):

- `produce acks=all`: an idempotent producer (acks=all, linger 5 ms), timed from the first
  `produce` to the last delivery report; every broker's CPU over the span, per message;
- `produce acks=1`: the same without idempotence (in a cluster both are answered once the batch
  is in the object store: the difference is librdkafka's own);
- `produce acks=1, 5 in flight`: acks=1 with at most 5 requests in flight per connection, the
  cap librdkafka puts on an idempotent producer;
- `consume`: the six partitions assigned (no group) from the beginning, to the last record.

The three produce rows alternate `--runs` times (each run produces `--records` more), after an
untimed warm-up of 5,000 records (the first producer's connections and producer id).

`failover` (`--failover-rounds` per fault of `--faults`): a producer sends one record every 2 ms
to partition 0; its owner is killed with kill -9, or frozen (SIGSTOP for `--freeze` s, then
SIGCONT); reported per round: seconds from the fault to the first delivery report
(acknowledgement) of a record of partition 0 produced after it, which includes the lease running
out (`lease_ttl_ms` 2000 here), the take-over, and librdkafka finding the new leader through
Metadata (after a freeze: once its request to the frozen broker is answered or times out).
Undelivered records at the end are counted (0 expected). A killed victim is started again before
the next round (with `handoff_after_ms` 0 it takes its share back at once). `--only-failover`
skips the throughput rows. Results: JSON on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aetcd

from headwater.testing import ServerProcess
from loadtest.cluster_bench import CREDENTIALS, Backing
from loadtest.harness import process_cpu, say

PARTITIONS = 6
TOPIC = "kbench"
VALUE = b"v" * 100


class KafkaBrokers:
    def __init__(self, root: Path, backing: Backing) -> None:
        self.root = root
        self.backing = backing
        self.config = root / "cluster.toml"
        self.config.write_text(
            f'[object_store]\nbackend = "s3"\nbucket = "bench"\n'
            f'endpoint_url = "http://127.0.0.1:{backing.s3_port}"\nregion = "us-east-1"\n'
            "[cluster]\nlease_ttl_ms = 2000\nhandoff_after_ms = 0\n"
        )
        self.processes: dict[str, ServerProcess] = {}
        self.kafka_ports: dict[str, int] = {}

    def start(self, broker: str) -> None:
        port_file = self.root / f"{broker}.kafka"
        port_file.unlink(missing_ok=True)
        kafka_port = str(self.kafka_ports.get(broker, 0))
        process = ServerProcess(
            self.root / broker,
            extra_args=("--config", str(self.config),
                        "--cluster", f"etcd://127.0.0.1:{self.backing.etcd_port}",
                        "--broker-id", broker, "--log-format", "json",
                        "--kafka-port", kafka_port, "--kafka-port-file", str(port_file)),
            env=CREDENTIALS,
        ).start(120)  # fmt: skip
        self.processes[broker] = process
        self.kafka_ports[broker] = int(port_file.read_text())

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.kafka_ports.values())

    def cpu(self) -> float:
        return sum(
            process_cpu(p.process.pid) for p in self.processes.values() if p.process is not None
        )

    async def owners(self) -> dict[int, str]:
        async with aetcd.Client(host="127.0.0.1", port=self.backing.etcd_port) as etcd:
            found = await etcd.get_prefix(f"/headwater/owners/{TOPIC}/".encode())
        return {int(kv.key.decode().rsplit("/", 1)[1]): kv.value.decode() for kv in found}

    def wait_owned(self, among: set[str], timeout: float = 60) -> dict[int, str]:
        """Until every partition is owned by one of `among`, each of them owning its share (a
        restarted broker's take-overs are over: a round must not kill a broker handing off)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            owners = asyncio.run(self.owners())
            counts = [list(owners.values()).count(b) for b in among]
            if len(owners) == PARTITIONS and set(owners.values()) <= among and min(counts) > 0:
                return owners
            time.sleep(0.1)
        raise RuntimeError(f"partitions not owned by {among} in {timeout} s")

    def stop(self) -> None:
        for process in self.processes.values():
            process.kill()


def produce_row(
    brokers: KafkaBrokers, records: int, idempotent: bool, in_flight: int | None = None
) -> dict[str, Any]:
    from confluent_kafka import Producer

    delivered = [0]
    failed = [0]

    def report(error: object, message: object) -> None:
        if error is None:
            delivered[0] += 1
        else:
            failed[0] += 1

    config: dict[str, Any] = {
        "bootstrap.servers": brokers.bootstrap,
        "acks": "all" if idempotent else 1,
        "enable.idempotence": idempotent,
        "linger.ms": 5,
        "batch.size": 256 * 1024,
        "queue.buffering.max.messages": records,
        "on_delivery": report,
    }
    if in_flight is not None:
        config["max.in.flight.requests.per.connection"] = in_flight
    producer = Producer(config)
    producer.list_topics(TOPIC, timeout=10)  # connections and metadata before the clock
    cpu, started = brokers.cpu(), time.monotonic()
    for i in range(records):
        producer.produce(TOPIC, VALUE)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    elapsed, cpu = time.monotonic() - started, brokers.cpu() - cpu
    limit = "" if in_flight is None else f", {in_flight} in flight"
    return {
        "row": f"produce acks={'all' if idempotent else 1}{limit}",
        "records": records,
        "msgs_per_s": round(delivered[0] / elapsed),
        "brokers_cpu_us_per_msg": round(cpu / max(1, delivered[0]) * 1e6, 2),
        "failed": failed[0] + left,
    }


def consume_row(brokers: KafkaBrokers, records: int) -> dict[str, Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": brokers.bootstrap,
            "group.id": "kbench-unused",
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        cpu, started, seen = brokers.cpu(), time.monotonic(), 0
        deadline = started + 120
        while seen < records and time.monotonic() < deadline:
            seen += sum(1 for m in consumer.consume(10_000, 0.5) if m.error() is None)
        elapsed, cpu = time.monotonic() - started, brokers.cpu() - cpu
    finally:
        consumer.close()
    return {
        "row": "consume",
        "records": seen,
        "msgs_per_s": round(seen / elapsed),
        "brokers_cpu_us_per_msg": round(cpu / max(1, seen) * 1e6, 2),
    }


def failover_round(brokers: KafkaBrokers, fault: str, freeze: float) -> dict[str, Any]:
    from confluent_kafka import Producer

    brokers.wait_owned(set(brokers.processes))
    killed = [0.0]
    first_ack: list[float] = []
    undelivered = [0]

    def report(sent: float, error: object) -> None:
        if error is not None:
            undelivered[0] += 1
        elif killed[0] and not first_ack and sent > killed[0]:
            first_ack.append(time.monotonic())

    producer = Producer(
        {
            "bootstrap.servers": brokers.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 0,
            "message.timeout.ms": 60_000,
            "retry.backoff.ms": 50,
        }
    )
    stop = threading.Event()

    def send() -> None:
        while not stop.is_set():
            sent = time.monotonic()
            producer.produce(
                TOPIC,
                VALUE,
                partition=0,
                on_delivery=lambda error, _message, sent=sent: report(sent, error),
            )
            producer.poll(0.002)

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(1.0)  # producing; and a restarted broker's take-overs settle
    load = os.getloadavg()[0]
    victim = asyncio.run(brokers.owners())[0]  # partition 0's owner now
    process = brokers.processes[victim]
    assert process.process is not None
    pid = process.process.pid
    # the freeze ends after `freeze` s whether or not the producer got an ack meanwhile
    wake = threading.Timer(freeze, os.kill, (pid, signal.SIGCONT))
    killed[0] = time.monotonic()
    if fault == "kill":
        process.kill()
    else:
        os.kill(pid, signal.SIGSTOP)
        wake.start()
    deadline = killed[0] + 60
    try:
        while not first_ack and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        if fault == "freeze":
            wake.join()
    stop.set()
    sender.join()
    left = producer.flush(60)
    if fault == "kill":
        brokers.start(victim)
    return {
        "fault": fault,
        "victim": victim,
        "fault_to_first_ack_s": round(first_ack[0] - killed[0], 3) if first_ack else None,
        "fault_s": freeze if fault == "freeze" else 0.0,
        "undelivered": undelivered[0] + left,
        "load_average": round(load, 1),
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, NewTopic

    with tempfile.TemporaryDirectory(prefix="kafka-cluster-bench-") as folder:
        root = Path(folder)
        backing = Backing(root)
        backing.start()
        brokers = KafkaBrokers(root, backing)
        try:
            for broker in ("b1", "b2", "b3"):
                brokers.start(broker)
            say("3 brokers up")
            admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{brokers.kafka_ports['b1']}"})
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(timeout=60)
            brokers.wait_owned({"b1", "b2", "b3"})
            rows = []
            if not args.only_failover:
                produce_row(brokers, 5_000, idempotent=True)  # warm-up: connections, ids
                for _ in range(args.runs):  # alternating: the machine's load drifts
                    rows.append(produce_row(brokers, args.records, idempotent=False))
                    rows.append(produce_row(brokers, args.records, idempotent=True))
                    rows.append(produce_row(brokers, args.records, idempotent=False, in_flight=5))
                rows.append(consume_row(brokers, 5_000 + 3 * args.runs * args.records))
            for row in rows:
                say(json.dumps(row))
            results: dict[str, Any] = {"rows": rows}
            for fault in args.faults.split(","):
                rounds = []
                for _ in range(args.failover_rounds):
                    rounds.append(failover_round(brokers, fault, args.freeze))
                    print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
                times = [r["fault_to_first_ack_s"] for r in rounds if r["fault_to_first_ack_s"]]
                results[fault] = rounds
                results[f"{fault}_median_s"] = statistics.median(times) if times else None
            results["load_average_end"] = round(os.getloadavg()[0], 1)
            return results
        finally:
            brokers.stop()
            backing.stop()


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3, help="of each produce row")
    parser.add_argument("--failover-rounds", type=int, default=3, help="per fault")
    parser.add_argument("--faults", default="kill,freeze", help="kill, freeze or both")
    parser.add_argument("--freeze", type=float, default=12.0, help="seconds of SIGSTOP")
    parser.add_argument("--only-failover", action="store_true", help="no throughput rows")
    print(json.dumps(main(parser.parse_args()), indent=2))


if __name__ == "__main__":
    cli()
