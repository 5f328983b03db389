"""FETCH in a cluster (two brokers, a real etcd, moto's S3): a broker that does not own the
partition answers NOT_OWNER naming the owner, and `Client.fetch` through any broker reads every
acknowledged record of every partition at its owner."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import headwater
from headwater.wire import messages as m
from tests.support.cluster_support import Cluster, running_cluster
from tests.support.s3 import MotoS3

PARTITIONS = 4


@pytest.fixture
def cluster(tmp_path: Path, s3: MotoS3, bucket: str) -> Iterator[Cluster]:
    with running_cluster(tmp_path, s3, bucket, 2000) as cluster:
        yield cluster


async def test_fetch_goes_to_the_owner_and_a_stranger_answers_not_owner(cluster: Cluster) -> None:
    await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in ("b1", "b2")))
    client = await headwater.connect(await cluster.address("b1"))
    try:
        await client.create_topic("ledger", partitions=PARTITIONS)
        deadline = time.monotonic() + 30
        while True:  # both brokers serve some (bounded): a stranger exists for some partition
            owner_of = await cluster.wait_owned("ledger", PARTITIONS, {"b1", "b2"})
            if set(owner_of.values()) == {"b1", "b2"}:
                break
            assert time.monotonic() < deadline, f"one broker holds everything: {owner_of}"
            await asyncio.sleep(0.2)
        producer = client.producer("ledger")
        for p in range(PARTITIONS):
            await (await producer.send_batch([f"{p}-{i}".encode() for i in range(5)], partition=p))
        await producer.close()  # acknowledged: in the object store, so readable

        for p in range(PARTITIONS):
            fetched = await client.fetch("ledger", p, 0, max_wait=5)
            assert [r.value for r in fetched.records()] == [f"{p}-{i}".encode() for i in range(5)]

        for _ in range(20):  # (a hand-off between reading etcd and asking: read again)
            partition, owner = next(iter(sorted((await cluster.owners("ledger")).items())))
            stranger = "b2" if owner == "b1" else "b1"
            async with await headwater.connect(await cluster.address(stranger)) as other:
                try:
                    await other.request(m.FetchRequest("ledger", partition, 0))
                except headwater.NotOwner as refused:
                    host, port = refused.owner_address or ("", 0)
                    if f"{host}:{port}" == await cluster.address(owner):
                        break
        else:
            raise AssertionError("no NOT_OWNER naming the owner from a broker that is not it")
    finally:
        await client.close()
