"""Object-store PUTs per commit window per broker, counted on the wire (issue 21 item 2).

A broker's reliable produces are acknowledged once their batches are in the object store. Today
the owner writes one tail object per busy partition per commit window (`cluster/tail_commit.py`),
so a broker's PUTs grow with the partitions it owns; the goal is one object per broker per window
holding every partition's pending batches (WarpStream, KafScale), designed in docs/DECISIONS.md
("Object-store batching per broker"). Not built yet: the test is marked `xfail(strict=True)` and
turns into a failure (XPASS) the day the batching is built, when the mark must go.

One broker (real process, etcd, moto's S3 behind `tests.support.put_counter`, which counts the
HTTP PUTs the broker sends, whatever object they write) owns a 1-partition and a 12-partition
topic. Each round sends one record to every partition of one topic at once and waits for all the
acknowledgements: about one commit window per round. The PUTs per round with 12 partitions must
stay within twice those with one (a round's batches can straddle two windows).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import headwater
from tests.support.cluster_support import Cluster, running_cluster
from tests.support.put_counter import PutCounter
from tests.support.s3 import MotoS3

LEASE_TTL_MS = 2000
ROUNDS = 40


@pytest.fixture
async def counter(s3: MotoS3) -> AsyncIterator[PutCounter]:
    proxy = await PutCounter(s3.port).start()
    yield proxy
    await proxy.stop()


@pytest.fixture(
    params=[
        pytest.param(
            "partition",
            marks=pytest.mark.xfail(
                strict=True,
                raises=AssertionError,
                reason="one tail object per busy partition per commit window",
            ),
        ),
        "broker",
    ]
)
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, s3: MotoS3, bucket: str, counter: PutCounter
) -> Iterator[Cluster]:
    """A cluster whose brokers use `cluster.tail_layout` = the parameter."""
    with running_cluster(
        tmp_path,
        s3,
        bucket,
        LEASE_TTL_MS,
        s3_endpoint=counter.endpoint_url,
        cluster_settings=f'tail_layout = "{request.param}"',
    ) as cluster:
        yield cluster


async def puts_per_round(
    client: headwater.Client, counter: PutCounter, topic: str, partitions: int
) -> float:
    """Object-store PUTs per round of one record to each partition, all acknowledged."""
    producer = client.producer(topic)
    # a first round outside the count: routes looked up, the partitions' first chunks stored
    await asyncio.gather(*[await producer.send(b"warm", partition=p) for p in range(partitions)])
    before = counter.puts
    for n in range(ROUNDS):
        value = f"{topic}-{n}".encode()
        sends = [await producer.send(value, partition=p) for p in range(partitions)]
        await asyncio.gather(*sends)
    found = (counter.puts - before) / ROUNDS
    await producer.close()
    return found


async def test_puts_per_commit_window_per_broker_do_not_grow_with_the_partitions(
    cluster: Cluster, counter: PutCounter
) -> None:
    await asyncio.to_thread(cluster.start_broker, "b1")
    address = await cluster.address("b1")
    async with await headwater.connect(address) as client:
        await client.create_topic("one", partitions=1)
        await client.create_topic("twelve", partitions=12)
        try:
            await cluster.wait_owned("one", 1, {"b1"})
            await cluster.wait_owned("twelve", 12, {"b1"})
        except AssertionError as exc:  # not the failure the xfail mark expects
            raise RuntimeError(str(exc)) from exc
        one = await puts_per_round(client, counter, "one", 1)
        twelve = await puts_per_round(client, counter, "twelve", 12)
    if one < 0.5:  # not the failure this test is about (the counter saw no tail PUT)
        raise RuntimeError(f"{one} PUTs per round with one partition: is the counter in the way?")
    assert twelve <= 2 * one, (
        f"PUTs per round: {one:.1f} with 1 partition, {twelve:.1f} with 12 (same broker)"
    )
