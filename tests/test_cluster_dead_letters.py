"""Dead letters in a cluster: three brokers, a real etcd and moto's S3 on loopback.

A dead-letter topic is one the server creates for itself. It must take the path a client's
CREATE_TOPIC and PRODUCE take: defined in etcd (so every broker lists it, and no broker deletes
it at its next start as a topic etcd does not know), written by the broker that owns its
partition (here another broker than the source partition's, over a peer link), and counted once
it is in the object store, so a kill -9 of any broker loses no dead letter whose source message
was taken off the subscription.

The topic names are chosen so that the dead-letter topic's partition and the source partition
have different first-choice owners (`balanced`, as the brokers rank them): the dead letters cross
from one broker to another, which the test checks from etcd's ownership keys.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

import headwater
from headwater.server.cluster.layout import balanced
from headwater.wire.names import dead_letter_topic
from tests.support.cluster_support import Cluster, running_cluster
from tests.support.helpers import drain, eventually, subscription_info
from tests.support.s3 import MotoS3

BROKERS = ("a", "b", "c")
LEASE_TTL_MS = 2000
MESSAGES = 50
SUBSCRIPTION = "work"
TAKE_OVER_S = LEASE_TTL_MS / 1000 + 20


@pytest.fixture
def cluster(tmp_path: Path, s3: MotoS3, bucket: str) -> Iterator[Cluster]:
    with running_cluster(tmp_path, s3, bucket, LEASE_TTL_MS) as cluster:
        for broker_id in BROKERS:
            cluster.start_broker(broker_id)
        yield cluster


def first_choice(topic: str) -> str:
    return balanced(frozenset(BROKERS), topic, 1)[0][0]


def source_topic() -> str:
    """A topic whose dead-letter topic's partition is first chosen by another broker."""
    for n in itertools.count():
        name = f"orders-{n}"
        if first_choice(name) != first_choice(dead_letter_topic(name, SUBSCRIPTION)):
            return name
    raise AssertionError("unreachable")


async def read_all(cluster: Cluster, through: str, topic: str, subscription: str) -> list[bytes]:
    """Every message of `topic`, from earliest, with a client bootstrapped at `through`."""
    async with await headwater.connect(await cluster.address(through)) as client:
        consumer = await client.subscribe(topic, subscription, start="earliest")
        try:
            return [message.value for message in await drain(consumer, MESSAGES, timeout=60)]
        finally:
            await consumer.close()


async def test_dead_letters_are_cluster_topics_and_survive_sigterm_and_kill9(
    cluster: Cluster,
) -> None:
    topic = source_topic()
    dlq = dead_letter_topic(topic, SUBSCRIPTION)
    expected = [f"m{i}".encode() for i in range(MESSAGES)]
    bootstrap = await cluster.address("a")
    async with await headwater.connect(bootstrap) as client:
        await client.create_topic(topic, dispatch="reliable")
        await cluster.wait_owned(topic, 1, set(BROKERS))
        async with client.producer(topic) as producer:
            sent = [await producer.send(value) for value in expected]
            await producer.flush()
        assert [(await future).offset for future in sent] == list(range(MESSAGES))
        consumer = await client.subscribe(
            topic,
            SUBSCRIPTION,
            type="shared",
            start="earliest",
            max_deliveries=1,
            ack_timeout=0.2,
        )
        received = await drain(consumer, MESSAGES, timeout=60)  # and never acked
        assert sorted(m.value for m in received) == sorted(expected)

        async def all_dead_lettered() -> bool:
            info = await subscription_info(client, topic, SUBSCRIPTION)
            return info.dead_lettered == MESSAGES and info.pending == 0

        await eventually(all_dead_lettered, timeout=60, what="every message dead-lettered")
        await consumer.close()

    source_owner = (await cluster.owners(topic))[0]
    dlq_owners = await cluster.wait_owned(dlq, 1, set(BROKERS))
    assert dlq_owners[0] != source_owner  # the dead letters went over a peer link
    # the DLQ is the cluster's: every broker lists it, and reads all of them from earliest
    for broker_id in BROKERS:
        async with await headwater.connect(await cluster.address(broker_id)) as client:
            assert dlq in {t.name for t in await client.list_topics()}
            assert (await client.describe_topic(dlq)).next_offsets == (MESSAGES,)
        read = await read_all(cluster, broker_id, dlq, f"inspect-{broker_id}")
        assert sorted(read) == sorted(expected)

    # SIGTERM the source partition's owner and start it again: it keeps the DLQ (etcd knows it;
    # a broker drops at its start the topics etcd does not know)
    assert cluster.brokers[source_owner].stop() == 0
    others = sorted(set(BROKERS) - {source_owner})
    read = await read_all(cluster, others[0], dlq, "after-sigterm")
    assert sorted(read) == sorted(expected)
    cluster.restart_broker(source_owner)
    async with await headwater.connect(await cluster.address(source_owner)) as client:
        assert dlq in {t.name for t in await client.list_topics()}

    # kill -9 of the DLQ partition's owner: its dead letters were in the object store
    await cluster.wait_owned(dlq, 1, set(BROKERS))
    victim = (await cluster.owners(dlq))[0]
    cluster.brokers[victim].kill()
    survivors = set(BROKERS) - {victim}
    await cluster.wait_owned(dlq, 1, survivors, timeout=TAKE_OVER_S)
    read = await read_all(cluster, sorted(survivors)[0], dlq, "after-kill9")
    assert sorted(read) == sorted(expected)
