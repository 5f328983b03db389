"""Take-overs of a partition in the object store: issue 21's failures 1 and 5, on real processes
(brokers, etcd, moto's S3, loopback).

Failure 1: a 1-partition topic seals a segment every second; its owner is killed with kill -9
right after it logs `upload.done`, another broker takes the partition over and is produced to,
the old owner is started again; three rounds. Then the whole partition is read from the earliest
offset through each broker: every acknowledged message must be there, and no offset may hold two
values. Before the partition manifest (storage/partition_manifest.py), segments of two owners
were named by their base offset alone: a reader jumped from a short segment to a longer one
uploaded under the same base by the other owner, and acknowledged messages were never delivered
again.

Failure 5: a take-over read every tail object written since the last segment upload (up to
`segment.ms`, 10 minutes by default), so failover grew with the tail. The owner now folds its
tail into a segment every `cluster.fold_chunks` chunks, and a take-over reads the tail in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import headwater
from headwater.storage.objectstore import S3ObjectStore
from tests.support.cluster_support import Cluster, running_cluster
from tests.support.s3 import MotoS3

LEASE_TTL_MS = 2000
BROKERS = ("b1", "b2", "b3")


@pytest.fixture
def cluster(tmp_path: Path, s3: MotoS3, bucket: str) -> Iterator[Cluster]:
    with running_cluster(tmp_path, s3, bucket, LEASE_TTL_MS) as cluster:
        yield cluster


def uploads(cluster: Cluster, broker: str) -> int:
    return cluster.brokers[broker].log().count('"upload.done"')


async def kill_after_next_upload(cluster: Cluster, broker: str, timeout: float = 20) -> None:
    """kill -9 `broker` as soon as its log shows one more `upload.done` (bounded)."""
    before = uploads(cluster, broker)
    deadline = time.monotonic() + timeout
    while uploads(cluster, broker) == before:
        assert time.monotonic() < deadline, f"{broker} uploaded no segment in {timeout}s"
        await asyncio.sleep(0.01)
    cluster.brokers[broker].kill()


async def read_all(address: str, topic: str, wanted: set[bytes]) -> dict[int, bytes]:
    """offset -> value of everything a fresh `earliest` subscription through `address` gets,
    until `wanted` was seen and nothing more comes (bounded)."""
    client = await headwater.connect(address)
    got: dict[int, bytes] = {}
    clashes: list[int] = []
    try:
        consumer = await client.subscribe(topic, f"audit-{time.monotonic_ns()}", start="earliest")
        deadline = time.monotonic() + 60
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            try:
                message = await consumer.receive(timeout=0.5)
            except TimeoutError:
                if wanted <= set(got.values()) and time.monotonic() - quiet_since > 2:
                    break
                continue
            assert message.value is not None
            if got.setdefault(message.offset, message.value) != message.value:
                clashes.append(message.offset)
            quiet_since = time.monotonic()
            await message.ack()
        await consumer.close()
    finally:
        await client.close()
    assert not clashes, f"offsets read with two values through {address}: {clashes[:5]}"
    return got


async def test_kill9_right_after_segment_uploads_across_take_overs_loses_nothing(
    cluster: Cluster,
) -> None:
    await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in BROKERS))
    client = await headwater.connect(await cluster.address("b1"))
    acked: set[bytes] = set()
    stop = asyncio.Event()
    try:
        await client.create_topic("seg", partitions=1, configs={"segment.ms": "1000"})
        await cluster.wait_owned("seg", 1, set(BROKERS))

        async def produce(name: str) -> None:
            producer = client.producer("seg")
            i = 0
            while not stop.is_set():
                values = [f"{name}-{i + j}".encode() for j in range(8)]
                i += 8
                sends = [await producer.send(v) for v in values]
                for value, sent in zip(values, sends, strict=True):
                    with contextlib.suppress(headwater.HeadwaterError):  # not acknowledged
                        await sent
                        acked.add(value)
            with contextlib.suppress(headwater.HeadwaterError):
                await producer.close()

        producing = [asyncio.ensure_future(produce(n)) for n in ("p", "q")]
        for _ in range(3):
            owner = (await cluster.wait_owned("seg", 1, set(BROKERS)))[0]
            await kill_after_next_upload(cluster, owner)
            await cluster.wait_owned("seg", 1, set(BROKERS) - {owner}, timeout=30)
            await asyncio.sleep(3)  # the new owner is produced to and uploads segments
            await asyncio.to_thread(cluster.start_broker, owner)
            await asyncio.sleep(3)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*producing), 60)
        assert len(acked) > 500
        for broker in BROKERS:
            got = await read_all(await cluster.address(broker), "seg", acked)
            missing = acked - set(got.values())
            assert not missing, (
                f"{len(missing)} of {len(acked)} acknowledged messages not read through "
                f"{broker}: {sorted(missing)[:5]}"
            )
    finally:
        stop.set()
        await client.close()


FOLD_CHUNKS = 40


@pytest.fixture
def folding(tmp_path: Path, s3: MotoS3, bucket: str) -> Iterator[Cluster]:
    settings = f"fold_chunks = {FOLD_CHUNKS}"
    with running_cluster(tmp_path, s3, bucket, LEASE_TTL_MS, cluster_settings=settings) as cluster:
        yield cluster


async def tail_chunks(s3: MotoS3, bucket: str, topic: str) -> int:
    store = await S3ObjectStore(bucket, endpoint_url=s3.endpoint_url).open()
    try:
        found = await store.list(f"{topic}/0/tail/")
    finally:
        await store.close()
    return sum(1 for info in found if not info.key.rsplit("/", 1)[1].startswith("epoch-"))


async def test_the_tail_stays_bounded_and_a_take_over_reads_it_in_place(
    folding: Cluster, s3: MotoS3, bucket: str
) -> None:
    cluster = folding
    await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in ("b1", "b2")))
    client = await headwater.connect(await cluster.address("b1"))
    try:
        await client.create_topic("trickle", partitions=1)  # segment.ms: 10 minutes
        owner = (await cluster.wait_owned("trickle", 1, {"b1", "b2"}))[0]
        producer = client.producer("trickle")
        acked = set()
        for i in range(6 * FOLD_CHUNKS):  # one at a time: about a chunk each
            value = f"t-{i}".encode()
            await (await producer.send(value))
            acked.add(value)
        await producer.close()
        deadline = time.monotonic() + 30
        while (chunks := await tail_chunks(s3, bucket, "trickle")) > 2 * FOLD_CHUNKS:
            assert time.monotonic() < deadline, f"{chunks} tail objects, not folded"
            await asyncio.sleep(0.2)
        cluster.brokers[owner].kill()
        survivor = "b2" if owner == "b1" else "b1"
        await cluster.wait_owned("trickle", 1, {survivor}, timeout=30)
        got = await read_all(await cluster.address(survivor), "trickle", acked)
        assert acked <= set(got.values())
        taken = [
            event
            for line in cluster.brokers[survivor].log().splitlines()
            if line.startswith("{")
            and (event := json.loads(line)).get("event") == "cluster.partition_acquired"
            and event.get("topic") == "trickle"
        ]
        assert taken, "no take-over logged"
        # the chunks it found above the manifest's segments, read in place
        assert taken[-1]["chunks"] <= 2 * FOLD_CHUNKS
    finally:
        await client.close()
