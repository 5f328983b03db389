"""Kafka transactions under kill -9, the long runs (`make test-long`; the fast ones are
tests/test_kafka_transactions.py).

- A loop of confluent-kafka transactions (random commit or abort over 3 topics x 3 partitions
  with 4 KiB segments) while the server is killed -9 six times at random moments: each
  transaction is what the client was told (committed: read once; aborted: never; its end
  failed: all or nothing), read again after one more kill.
- The exactly-once consume-transform-produce application over 100,000 records, killed -9 five
  times and the server twice at random points of its progress.
- Ends killed mid-way: transactions over 96 partitions whose EndTxn is followed by a kill -9
  of the server at a moment the end reached (just sent, its decision stored, one partition's
  marker written), each resolved on start to all-committed or all-aborted (at least one cut
  between its decision and its completion: the coordinator's resume on start).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

from headwater.server.kafka import codec
from headwater.server.kafka.apis import SERVED
from headwater.server.kafka.messages.transactions import EndTxnRequest
from tests.support.kafka_support import KafkaServer, RawKafka
from tests.support.txn_attack import (
    check_outcomes,
    create,
    exactly_once_run,
    restarts,
    transaction_loop,
)
from tests.support.txn_clients import producer, read, seal


def test_transactions_under_six_kills_at_random_moments_are_all_or_nothing(
    tmp_path: Path, topic_name: str
) -> None:
    server = KafkaServer(tmp_path / "data", same_port=True).start()
    try:
        topics = [f"{topic_name}-{i}" for i in range(3)]
        partitions = create(server, topics, {"segment.bytes": "4096"})
        outcomes, kills = transaction_loop(
            server, partitions, transactions=300, kills=6, rng=random.Random(38), deadline_s=600
        )
        assert kills == 6
        check_outcomes(server, partitions, outcomes)
        server.kill()
        server.start()
        check_outcomes(server, partitions, outcomes)
    finally:
        server.stop()
    told = Counter(outcome.told for outcome in outcomes)
    assert told["committed"] and told["aborted"], told


def test_exactly_once_over_100000_records_with_the_app_killed_5_times_and_the_server_twice(
    tmp_path: Path, topic_name: str
) -> None:
    server = KafkaServer(tmp_path / "data", same_port=True).start()
    try:
        run = exactly_once_run(
            server.bootstrap,
            tmp_path,
            topic_name,
            records=100_000,
            kinds=["app"] * 5 + ["server"] * 2,
            kill=restarts(server),
            rng=random.Random(100_000),
            deadline_s=900,
        )
    finally:
        server.stop()
    assert run.kills == Counter(app=5, server=2), run


def test_ends_cut_by_kill_9_at_moments_they_reached_resolve_all_or_nothing(
    tmp_path: Path, topic_name: str
) -> None:
    rng = random.Random(3)
    server = KafkaServer(tmp_path / "data", same_port=True).start()
    resumed = 0
    try:
        topics = [f"{topic_name}-{i}" for i in range(3)]
        partitions = create(server, topics, partitions=32)
        transactional_id = f"{topic_name}-txn"
        for round_ in range(12):
            txn = producer("confluent", server.bootstrap, transactional_id)
            records = [(t, p, f"r{round_}-{t[-1]}{p}".encode()) for t, p in partitions]
            txn.begin()
            txn.send(records)
            txn.flush()
            commit = rng.random() < 0.5
            moment = rng.choice(["sent", "decided", "marker"])
            watched = rng.choice(partitions)
            ends = _Ends(server)
            before = ends.of(watched)
            held = _held(server, transactional_id)
            raw = RawKafka(server.kafka_port)
            end = EndTxnRequest(transactional_id, held[0], held[1], commit)
            raw.request(26, 1, 1, codec.encode(SERVED[26].requests[1], end))
            # the kill comes at a moment the end reached: just sent, its decision stored, or
            # one partition's marker written (of 96, written together)
            deadline = time.monotonic() + 10
            while moment != "sent" and time.monotonic() < deadline:
                if moment == "decided" and _state(server, transactional_id).startswith("Prepare"):
                    break
                if moment == "marker" and ends.of(watched) > before:
                    break
            server.kill()
            raw.close()
            ends.close()
            log = server.process.log_path
            already = log.read_text().count("transactions.resuming_end")
            server.start()
            resumed += log.read_text().count("transactions.resuming_end") - already
            # a new instance: whatever the kill left open is aborted
            producer("confluent", server.bootstrap, transactional_id).close()
            seal(server.bootstrap, partitions)
            seen = read("confluent", server.bootstrap, partitions, committed=True)
            present = [
                any(value == f"r{round_}-{t[-1]}{p}".encode() for _o, _k, value in seen[(t, p)])
                for t, p in partitions
            ]
            assert all(present) or not any(present), f"round {round_}: {Counter(present)}"
            assert not any(present) or commit, f"round {round_}: an abort became visible"
    finally:
        server.stop()
    assert resumed >= 1, "no kill landed between an end's decision and its completion"


class _Ends:
    """Partitions' high watermarks, read on one consumer."""

    def __init__(self, server: KafkaServer) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer(
            {
                "bootstrap.servers": server.bootstrap,
                "group.id": "ends",
                "isolation.level": "read_uncommitted",
            }
        )

    def of(self, where: tuple[str, int]) -> int:
        from confluent_kafka import TopicPartition

        return int(self.consumer.get_watermark_offsets(TopicPartition(*where), 5)[1])

    def close(self) -> None:
        self.consumer.close()


def _state(server: KafkaServer, transactional_id: str) -> str:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=10_000)
    try:
        return str(admin.describe_transactions([transactional_id])[transactional_id].state.value)
    finally:
        admin.close()


def _held(server: KafkaServer, transactional_id: str) -> tuple[int, int]:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=10_000)
    try:
        found = admin.describe_transactions([transactional_id])[transactional_id]
        return found.producer_id, found.producer_epoch
    finally:
        admin.close()
