"""Transactions under kill -9: the exactly-once application's run and a loop of transactions.

`exactly_once_run` writes an input topic of N keyed records, runs `tests.support.eos_app` as a
process (confluent-kafka, read_committed, offsets sent in each transaction), and kills it -9
and the server -9 (restarted on the same port; in a cluster, a broker the caller's `kill`
chooses by the kill's kind) as the group's committed offsets pass random points of the run,
starting another instance of the application whenever one is gone. At the end
it checks the output read_committed: one record per input record, in input order per key, and
the group's committed offsets at the input's end.

`transaction_loop` runs confluent-kafka transactions (random commit or abort, several partitions
each) while a thread kills the server -9 and starts it again each time the loop has taken a
random number of steps (so at a moment the loop reached, not after a time); each transaction's
outcome is what the client was told (committed, aborted, or unknown when the call failed).
`check_outcomes` then reads every partition read_committed: a committed transaction's records
all there once, an aborted one's never, an unknown one's all or none, never half.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from tests.support.kafka_support import KafkaServer
from tests.support.txn_clients import SEAL, Partition, read, seal

PARTITIONS = 3
KEYS = 30  # keys k0..k29: key j lives in input partition j % 3


def create(
    server: KafkaServer,
    topics: list[str],
    configs: dict[str, str] | None = None,
    partitions: int = PARTITIONS,
) -> list[Partition]:
    """Reliable topics through Kafka's CreateTopics; their partitions."""
    return create_at(server.bootstrap, topics, configs, partitions)


def create_at(
    bootstrap: str,
    topics: list[str],
    configs: dict[str, str] | None = None,
    partitions: int = PARTITIONS,
) -> list[Partition]:
    """`create` through any bootstrap (a cluster's brokers)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        admin.create_topics(
            [NewTopic(t, partitions, 1, topic_configs=configs or {}) for t in topics]
        )
    finally:
        admin.close()
    return [(t, p) for t in topics for p in range(partitions)]


# The exactly-once application


@dataclass
class Run:
    kills: Counter[str] = field(default_factory=Counter)  # by kind: "app" or the caller's
    instances: int = 0  # application processes started
    exits: Counter[int] = field(default_factory=Counter)  # their exit codes (-9: killed)


def _write_input(bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20}
    )
    for i in range(records):
        producer.produce(topic, str(i).encode(), f"k{i % KEYS}".encode(), partition=i % PARTITIONS)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(60):
        raise RuntimeError("the input was not all delivered in 60 s")


def _ends(records: int) -> dict[int, int]:
    """Each input partition's end: record i is at offset i // 3 of partition i % 3."""
    return {p: (records - p + PARTITIONS - 1) // PARTITIONS for p in range(PARTITIONS)}


class _Progress:
    """The group's committed offsets in all (None while the server does not answer)."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})

    def committed(self) -> int | None:
        from confluent_kafka import KafkaException

        try:
            found = self.consumer.committed(self.partitions, 2.0)
        except KafkaException:
            return None
        return sum(max(tp.offset, 0) for tp in found)

    def close(self) -> None:
        self.consumer.close()


def restarts(server: KafkaServer) -> Callable[[str, str], None]:
    """`exactly_once_run`'s `kill` of a lone server: -9, then started again on its port."""

    def kill(_kind: str, _source: str) -> None:
        server.kill()
        server.start()

    return kill


def exactly_once_run(
    bootstrap: str,
    workdir: Path,
    name: str,
    records: int,
    kinds: list[str],
    kill: Callable[[str, str], None],
    rng: random.Random,
    deadline_s: float,
) -> Run:
    """`kinds`: the kills in a random order, "app" (the application's process, -9) or a kind
    that `kill` (of the kind and the input topic's name) does, a server's kill -9 and restart."""
    source, output, group = f"{name}-in", f"{name}-out", f"{name}-group"
    create_at(bootstrap, [source, f"{output}-0", f"{output}-1"])
    _write_input(bootstrap, source, records)
    kinds = list(kinds)
    rng.shuffle(kinds)
    points = sorted(int(rng.uniform(0.05, 0.9) * records) for _ in kinds)
    plan = list(zip(points, kinds, strict=True))
    run = Run()
    command = [sys.executable, "-m", "tests.support.eos_app", bootstrap]
    ends = _ends(records)
    command += [source, output, group, f"{name}-txn", ",".join(map(str, ends.values()))]
    progress = _Progress(bootstrap, source, group)
    app: subprocess.Popen[bytes] | None = None
    deadline = time.monotonic() + deadline_s
    try:
        while time.monotonic() < deadline:
            if app is None:
                if run.instances >= 4 * len(kinds) + 20:
                    raise AssertionError(f"{run.instances} application instances: {run}")
                run.instances += 1
                with (workdir / f"app-{run.instances}.log").open("wb") as log:
                    app = subprocess.Popen(
                        command,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
            code = app.poll()
            if code is not None:
                run.exits[code] += 1
                app = None
                if code == 0:
                    break
                continue
            committed = progress.committed()
            if plan and committed is not None and committed >= plan[0][0]:
                _point, kind = plan.pop(0)
                if kind == "app":
                    app.kill()
                    run.exits[app.wait()] += 1
                    app = None
                else:
                    kill(kind, source)
                run.kills[kind] += 1
            time.sleep(0.05)  # a bounded poll of the application's progress
        else:
            raise AssertionError(f"the application did not finish in {deadline_s} s: {run}")
    finally:
        if app is not None:
            app.kill()
            app.wait()
        progress.close()
    _check_output(bootstrap, source, output, group, records)
    return run


def _check_output(bootstrap: str, source: str, output: str, group: str, records: int) -> None:
    outputs = [(f"{output}-{k}", p) for k in range(2) for p in range(PARTITIONS)]
    seal(bootstrap, outputs)
    seen = read("confluent", bootstrap, outputs, committed=True)
    produced: Counter[tuple[int, int]] = Counter()
    for (topic, partition), found in seen.items():
        last: dict[bytes, int] = {}
        for _offset, key, value in found:
            if value == SEAL:
                continue
            assert key is not None
            source_partition, source_offset, number = (int(x) for x in value.split(b":"))
            assert source_partition == partition, (topic, partition, value)
            # input record i is key i % 30 at offset i // 3 of partition i % 3
            assert number == source_offset * PARTITIONS + source_partition, value
            assert key == f"k{number % KEYS}".encode() and topic.endswith(f"-{number % KEYS % 2}")
            assert source_offset > last.get(key, -1), f"{key!r} out of order at {value!r}"
            last[key] = source_offset
            produced[(source_partition, source_offset)] += 1
    twice = {where: n for where, n in produced.items() if n > 1}
    assert not twice, f"{len(twice)} input records written more than once: {list(twice)[:10]}"
    expected = {(i % PARTITIONS, i // PARTITIONS) for i in range(records)}
    missing = expected - set(produced)
    assert not missing, f"{len(missing)} input records never written: {sorted(missing)[:10]}"
    assert len(produced) == records
    progress = _Progress(bootstrap, source, group)
    try:
        found = progress.consumer.committed(progress.partitions, 30)
        assert {tp.partition: tp.offset for tp in found} == _ends(records)
    finally:
        progress.close()


# A loop of transactions under server kills


@dataclass(frozen=True)
class Outcome:
    number: int
    records: tuple[tuple[str, int, bytes], ...]
    told: str  # "committed", "aborted" or "unknown"


class _Killer(threading.Thread):
    """Kills the server -9 and starts it again `kills` times, each once the loop has taken a
    random 1 to 30 more steps (a begin, its records produced, its end): so a kill lands at a
    moment the loop reached, anywhere in a transaction, commits in flight included."""

    def __init__(self, server: KafkaServer, kills: int, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.server, self.kills, self.rng = server, kills, rng
        self.steps = 0
        self.done = 0
        self.stopping = False
        self.changed = threading.Condition()

    def step(self) -> None:
        with self.changed:
            self.steps += 1
            self.changed.notify()

    def stop(self) -> None:
        with self.changed:
            self.stopping = True
            self.changed.notify()
        self.join(120)

    def run(self) -> None:
        for _ in range(self.kills):
            with self.changed:
                target = self.steps + self.rng.randint(1, 30)
                if not self.changed.wait_for(
                    lambda t=target: self.steps >= t or self.stopping, timeout=120
                ):
                    return
                if self.stopping:
                    return
            self.server.kill()
            self.done += 1
            self.server.start()


def transaction_loop(
    server: KafkaServer,
    partitions: list[Partition],
    transactions: int,
    kills: int,
    rng: random.Random,
    per_partition: int = 20,
    deadline_s: float = 180,
) -> tuple[list[Outcome], int]:
    """At least `transactions` transactions, and more until `kills` are done; returns their
    outcomes and the kills done."""
    from confluent_kafka import KafkaException, Producer

    killer = _Killer(server, kills, random.Random(rng.random()))
    outcomes: list[Outcome] = []

    def new_producer() -> Producer:
        producer = Producer(
            {
                "bootstrap.servers": server.bootstrap,
                "transactional.id": "loop",
                "linger.ms": 2,
                "transaction.timeout.ms": 10_000,
            }
        )
        for _ in range(30):
            try:
                producer.init_transactions(10)
                return producer
            except KafkaException as exc:
                if not exc.args[0].retriable():
                    raise
        raise RuntimeError("init_transactions did not succeed in 30 tries")

    killer.start()
    deadline = time.monotonic() + deadline_s
    try:
        producer = new_producer()
        number = -1
        # at least `transactions`, and on until every kill is done
        while number + 1 < transactions or killer.is_alive():
            number += 1
            if time.monotonic() > deadline:
                raise AssertionError(f"{number} transactions and the kills not done in time")
            chosen = rng.sample(partitions, k=rng.randint(1, len(partitions)))
            records = tuple(
                (topic, index, f"t{number}-{topic[-1]}{index}-{n}".encode())
                for topic, index in chosen
                for n in range(rng.randint(1, per_partition))
            )
            commit = rng.random() < 0.7
            try:
                producer.begin_transaction()
                killer.step()
                for topic, index, value in records:
                    producer.produce(topic, value, partition=index)
                producer.poll(0)
                killer.step()
                if commit:
                    producer.commit_transaction(10)
                else:
                    producer.flush(10)
                    producer.abort_transaction(10)
                outcomes.append(Outcome(number, records, "committed" if commit else "aborted"))
                killer.step()
            except KafkaException:
                outcomes.append(Outcome(number, records, "unknown"))
                # a new instance fences the old and settles its transaction
                producer = new_producer()
    finally:
        killer.stop()
    return outcomes, killer.done


def check_outcomes(
    server: KafkaServer, partitions: list[Partition], outcomes: list[Outcome]
) -> None:
    seal(server.bootstrap, partitions)
    seen = read("confluent", server.bootstrap, partitions, committed=True)
    where: Counter[tuple[str, int, bytes]] = Counter(
        (topic, index, value)
        for (topic, index), found in seen.items()
        for _o, _k, value in found
        if value != SEAL
    )
    for outcome in outcomes:
        present = [where[r] for r in outcome.records]
        assert all(n <= 1 for n in present), f"transaction {outcome.number} read twice"
        if outcome.told == "committed":
            assert all(present), f"committed transaction {outcome.number} lost {present}"
        elif outcome.told == "aborted":
            assert not any(present), f"aborted transaction {outcome.number} visible {present}"
        else:
            assert all(present) or not any(present), (
                f"transaction {outcome.number} half visible: {present}"
            )
    known = {r for outcome in outcomes for r in outcome.records}
    assert set(where) <= known
    # per partition, the transactions' records in the order they were written
    for (topic, index), found in seen.items():
        numbers = [int(value.split(b"-")[0][1:]) for _o, _k, value in found if value != SEAL]
        assert numbers == sorted(numbers), (topic, index)
