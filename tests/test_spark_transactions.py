"""Transactions as the Spark compaction job and the Spark streaming source see them (issue 38): a
topic written through the Kafka front end by two confluent-kafka transactional producers (committed
and aborted transactions, tombstones) interleaved with a plain producer's records (keyless ones
too), the last transaction of one producer left open on partition 1 and plain records after it.

- Compaction of what the server uploaded equals an independent fold of the committed and plain
  records below each partition's horizon: the end of partition 0, the open transaction's first
  offset on partition 1 (nothing from there on is folded, plain records included).
- The streaming source: a task whose range holds the open transaction waits for its marker and
  fails its read timeout rather than hand on an undecided record; a range that ends inside a
  committed transaction is read on past its end for the marker; once the open transaction is
  committed, a query yields exactly the committed and plain records, markers never.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, Producer

import headwater
from headwater.spark_compaction.job import CompactionSettings, run
from headwater.spark_compaction.store import StoreSpec
from headwater.spark_compaction.stream import Settings, read_range
from headwater.wire.errors import RequestTimeout
from tests.support.kafka_support import KafkaServer
from tests.test_spark_compaction import snapshot

PARTITIONS = 2
KEYS = 12

Key = bytes | None
Value = bytes | None


@dataclass
class History:
    """What the producers wrote, by (partition, offset), and what became of each transaction."""

    records: dict[tuple[int, int], tuple[Key, Value]] = field(default_factory=dict)
    writer: dict[tuple[int, int], str] = field(default_factory=dict)  # "plain" or a transaction
    outcomes: dict[str, str] = field(default_factory=dict)  # transaction -> commit, abort, open
    errors: list[str] = field(default_factory=list)

    def visible(self, partition: int, below: int | None = None) -> dict[int, tuple[Key, Value]]:
        """The records a transaction-aware reader sees: plain ones and committed ones."""
        return {
            o: kv
            for (p, o), kv in sorted(self.records.items())
            if p == partition
            and (below is None or o < below)
            and self.outcomes.get(self.writer[(p, o)], "commit") == "commit"
        }

    def first_open(self, partition: int) -> int | None:
        opened = [
            o
            for (p, o), who in self.writer.items()
            if p == partition and self.outcomes.get(who) == "open"
        ]
        return min(opened, default=None)

    def aborted(self, horizons: dict[int, int]) -> int:
        return sum(
            1
            for (p, o), who in self.writer.items()
            if self.outcomes.get(who) == "abort" and o < horizons[p]
        )


def _produce(
    producer: Producer,
    topic: str,
    writer: str,
    count: int,
    chance: random.Random,
    history: History,
    partitions: tuple[int, ...] = tuple(range(PARTITIONS)),
) -> None:
    for _ in range(count):
        key: Key = (
            None
            if writer == "plain" and chance.random() < 0.1
            else b"k%02d" % chance.randrange(KEYS)
        )
        value: Value = (
            None
            if chance.random() < 0.15
            else b"%s-%d" % (writer.encode(), chance.randrange(10**6))
        )

        def delivered(
            error: KafkaError | None, message: Message, kv: tuple[Key, Value] = (key, value)
        ) -> None:
            if error is not None:
                history.errors.append(str(error))
                return
            place = (message.partition(), message.offset())
            history.records[place] = kv
            history.writer[place] = writer

        producer.produce(
            topic, value=value, key=key, partition=chance.choice(partitions), on_delivery=delivered
        )
    producer.flush(30)


def write_history(server: KafkaServer, topic: str, seed: int) -> tuple[History, Producer]:
    """Interleaved plain records and transactions of two producers, each ended by a commit or an
    abort, then one of tx-b's left open on partition 1 with plain records after it. Returns the
    producer whose transaction is open."""

    async def create() -> None:
        async with await headwater.connect(server.address) as client:
            await client.create_topic(
                topic,
                partitions=PARTITIONS,
                dispatch="reliable",
                configs={"segment.bytes": 2048, "fsync": "never"},  # several segments
            )

    asyncio.run(create())
    chance = random.Random(seed)
    history = History()
    common = {"bootstrap.servers": server.bootstrap, "linger.ms": 2}
    plain = Producer({**common, "enable.idempotence": True})
    producers = {
        name: Producer({**common, "transactional.id": name, "transaction.timeout.ms": 300_000})
        for name in ("tx-a", "tx-b")
    }
    for producer in producers.values():
        producer.init_transactions(30)
    current: dict[str, str] = {}  # producer -> its transaction in progress
    for round_ in range(40):
        if chance.random() < 0.3:
            _produce(plain, topic, "plain", 1 + chance.randrange(4), chance, history)
            continue
        name = chance.choice(sorted(producers))
        producer = producers[name]
        if name not in current:
            producer.begin_transaction()
            current[name] = f"{name}-{round_}"
            history.outcomes[current[name]] = "open"
        _produce(producer, topic, current[name], 1 + chance.randrange(4), chance, history)
        if chance.random() < 0.4:
            commit = chance.random() < 0.6
            (producer.commit_transaction if commit else producer.abort_transaction)(30)
            history.outcomes[current.pop(name)] = "commit" if commit else "abort"
    for name, transaction in current.items():
        producers[name].commit_transaction(30)
        history.outcomes[transaction] = "commit"
    producers["tx-b"].begin_transaction()
    history.outcomes["tx-b-open"] = "open"
    _produce(producers["tx-b"], topic, "tx-b-open", 5, chance, history, partitions=(1,))
    for partition in range(PARTITIONS):
        _produce(plain, topic, "plain", 3, chance, history, partitions=(partition,))
    assert not history.errors, history.errors
    assert {"commit", "abort", "open"} <= set(history.outcomes.values())
    return history, producers["tx-b"]


def _next_offsets(server: KafkaServer, topic: str) -> tuple[int, ...]:
    async def describe() -> tuple[int, ...]:
        async with await headwater.connect(server.address) as client:
            return (await client.describe_topic(topic)).next_offsets

    return asyncio.run(describe())


def test_compaction_folds_committed_records_only_and_stops_at_the_open_transaction(
    spark: Any, tmp_path: Path, topic_name: str
) -> None:
    server = KafkaServer(tmp_path / "data").start()
    try:
        history, _ = write_history(server, topic_name, seed=1)
        ends = _next_offsets(server, topic_name)
    finally:
        server.stop()  # a graceful stop uploads the active segments, the open transaction's too
    spec = StoreSpec.local(tmp_path / "data" / "objects")

    summary = run(lambda: spark, CompactionSettings(spec, (topic_name,), group_bytes=4096))

    first_open = history.first_open(1)
    assert history.first_open(0) is None and first_open is not None
    horizons = {0: ends[0], 1: first_open}
    assert first_open < ends[1] - 3  # the plain records after it are not folded
    for partition, horizon in horizons.items():
        folded: dict[bytes, tuple[bytes, int]] = {}
        for offset, (key, value) in history.visible(partition, horizon).items():
            if key is None:
                continue
            if value is None:
                folded.pop(key, None)
            else:
                folded[key] = (value, offset)
        found_horizon, rows = snapshot(spec, topic_name, partition)
        assert found_horizon == horizon
        assert {k: (v[0], v[1]) for k, v in rows.items()} == folded
    assert summary.aborted_skipped == history.aborted(horizons) > 0
    assert summary.corrupt_batches == 0  # markers are batches, not damage


def test_the_streaming_source_yields_committed_records_only(
    spark: Any, tmp_path: Path, topic_name: str
) -> None:
    server = KafkaServer(tmp_path / "data").start()
    try:
        history, open_producer = write_history(server, topic_name, seed=2)
        ends = _next_offsets(server, topic_name)
        settings = Settings(
            {"server": server.address, "topic": topic_name, "readTimeoutMs": "1500"}
        )
        first_open = history.first_open(1)
        assert first_open is not None

        # a range holding the open transaction: nothing of it, nor after it, is guessed
        with pytest.raises(RequestTimeout, match=f"transaction open at offset {first_open}"):
            list(read_range(settings, 1, 0, ends[1]))

        # a range ending inside a committed transaction's records: its records in the range
        # are decided by reading past the range's end for its marker
        spans: dict[str, list[int]] = {}
        for (p, o), who in sorted(history.writer.items()):
            if p == 0 and who != "plain" and history.outcomes[who] == "commit":
                spans.setdefault(who, []).append(o)
        middle = next(offsets[-1] for offsets in spans.values() if len(offsets) > 1)
        rows = [r for b in read_range(settings, 0, 0, middle) for r in b.to_pylist()]
        assert {r["offset"]: (r["key"], r["value"]) for r in rows} == history.visible(0, middle)

        open_producer.commit_transaction(30)
        history.outcomes["tx-b-open"] = "commit"
        query = (
            spark.readStream.format("headwater")
            .option("server", server.address)
            .option("topic", topic_name)
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.format("memory")
            .queryName("transactions")
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(180), "the query did not read what was available"
        got = spark.sql("select partition, offset, key, value from transactions").collect()
    finally:
        server.stop()
    offsets = [(r.partition, r.offset) for r in got]
    assert len(offsets) == len(set(offsets)), "a record twice"
    for partition in range(PARTITIONS):
        mine = {r.offset: (r.key, r.value) for r in got if r.partition == partition}
        assert mine == history.visible(partition)
