"""Exactly-once on the Kafka protocol in a cluster under failure (issue 38): the confluent-kafka
consume-transform-produce application of tests/support/eos_app.py (read_committed input, output
to two topics, the group's offsets sent in each transaction) runs against three brokers with
Kafka ports, a real etcd and moto's S3, bootstrapped at all three so it outlives any one. As the
group's committed offsets pass random points of the run (seeded; the seed printed), the
application is killed -9 three times, and twice each the broker FindCoordinator (key type 1)
names for its transactional id and a broker owning an input partition but not coordinating the
id are killed -9 and restarted on their ports. `exactly_once_run` (tests/support/txn_attack.py)
then reads the output read_committed: one record per input record, in input order per key, and
the group's committed offsets at the input's ends.

Long (60-90 s): in the Makefile's LONG_TESTS.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from headwater.server.kafka import codec
from headwater.server.kafka.apis import SERVED
from headwater.server.kafka.messages import groups
from tests.support.cluster_support import Cluster, running_cluster
from tests.support.kafka_support import RawKafka
from tests.support.s3 import MotoS3
from tests.support.txn_attack import exactly_once_run

BROKERS = ("b1", "b2", "b3")
LEASE_TTL_MS = 2000
RECORDS = 10_000
SEED = 3839
TRANSACTION = 1  # FindCoordinator's key type of a transactional id


@pytest.fixture
def cluster(tmp_path: Path, s3: MotoS3, bucket: str) -> Iterator[Cluster]:
    with running_cluster(tmp_path, s3, bucket, LEASE_TTL_MS, kafka=True) as cluster:
        for broker in BROKERS:
            cluster.start_broker(broker)
        yield cluster


def coordinator(cluster: Cluster, transactional_id: str) -> str:
    """The broker FindCoordinator (key type 1) names for the transactional id."""
    api = SERVED[groups.FindCoordinatorRequest.API_KEY]
    request = groups.FindCoordinatorRequest(key=transactional_id, key_type=TRANSACTION)
    raw = RawKafka(cluster.kafka_ports["b1"], timeout=30)
    try:
        raw.request(api.key, 1, 1, codec.encode(api.requests[1], request))
        _, rest = raw.response()
        found = codec.decode_body(codec.Reader(rest), api.responses[1])
    finally:
        raw.close()
    assert found.error_code == 0, found
    (broker,) = [b for b, port in cluster.kafka_ports.items() if port == found.port]
    return broker


def test_a_kafka_exactly_once_loop_survives_kills_of_its_coordinator_and_an_owner(
    cluster: Cluster, tmp_path: Path, topic_name: str
) -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    transactional_id = f"{topic_name}-txn"  # exactly_once_run's name for it
    killed: list[tuple[str, str]] = []
    # a killed broker starts again beside the run: waiting for it held the run's watch of the
    # application's progress, which then passed the next kills' points and finished before them
    restarting: list[threading.Thread] = []

    def restarted() -> None:
        for thread in restarting:
            thread.join(120)
        restarting.clear()

    def kill(kind: str, source: str) -> None:
        restarted()  # every broker up before the next kill is chosen
        txn_broker = coordinator(cluster, transactional_id)
        if kind == "coordinator":
            victim = txn_broker
        else:
            owners = asyncio.run(cluster.owners(source))
            others = sorted({b for b in owners.values() if b != txn_broker})
            assert others, f"every input partition is at the coordinator {txn_broker}: {owners}"
            victim = rng.choice(others)
        print(f"kill -9 {victim} ({kind})")
        killed.append((kind, victim))
        cluster.brokers[victim].kill()
        thread = threading.Thread(target=cluster.restart_broker, args=(victim,))
        thread.start()
        restarting.append(thread)

    try:
        run = exactly_once_run(
            ",".join(f"127.0.0.1:{cluster.kafka_ports[b]}" for b in BROKERS),
            tmp_path,
            topic_name,
            records=RECORDS,
            kinds=["app"] * 3 + ["coordinator"] * 2 + ["owner"] * 2,
            kill=kill,
            rng=rng,
            deadline_s=300,
        )
    finally:
        restarted()
    print(run, killed)
    assert run.kills == Counter(app=3, coordinator=2, owner=2), run
