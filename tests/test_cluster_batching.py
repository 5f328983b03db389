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
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import headwater
from headwater.storage.objectstore import S3ObjectStore
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


SHARED = 'tail_layout = "broker"'


async def read_all(address: str, topic: str, wanted: int) -> dict[tuple[int, int], bytes]:
    """(partition, offset) -> value of everything a fresh `earliest` subscription through
    `address` gets, until `wanted` messages came and nothing more for 2 s (bounded); a
    (partition, offset) met with two values fails the test."""
    got: dict[tuple[int, int], bytes] = {}
    async with await headwater.connect(address) as client:
        consumer = await client.subscribe(topic, "audit", start="earliest")
        deadline = time.monotonic() + 90
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            try:
                message = await consumer.receive(timeout=0.5)
            except TimeoutError:
                if len(got) >= wanted and time.monotonic() - quiet_since > 2:
                    break
                continue
            assert message.value is not None
            where = (message.partition, message.offset)
            assert got.setdefault(where, message.value) == message.value, f"{where} twice"
            quiet_since = time.monotonic()
            await message.ack()
        await consumer.close()
    return got


@pytest.mark.timeout(600)  # etcd, moto and two brokers on a busy machine: a hang bound
async def test_kill9_of_an_owner_with_shared_objects_loses_no_acknowledged_message(
    tmp_path: Path, s3: MotoS3, bucket: str
) -> None:
    """Two brokers share a 6-partition topic, each window of each one object for all its
    partitions. A producer with 16 records in flight is acknowledged while one broker is killed
    with kill -9, its partitions are taken over (the survivor reads the dead broker's slices in
    place, then folds them), and the broker is started again (it takes its share back at once:
    a second take-over, of the survivor's slices). Every acknowledged message is read back at
    the partition and offset it was acknowledged with, and no offset holds two values."""
    with running_cluster(tmp_path, s3, bucket, LEASE_TTL_MS, cluster_settings=SHARED) as cluster:
        await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in ("b1", "b2")))
        async with await headwater.connect(await cluster.address("b1")) as client:
            await client.create_topic("orders", partitions=6)
        owners = await cluster.wait_owned("orders", 6, {"b1", "b2"})
        victim = owners[0]
        survivor = "b2" if victim == "b1" else "b1"
        acked: dict[tuple[int, int], bytes] = {}
        async with await headwater.connect(await cluster.address(survivor)) as client:
            producer = client.producer("orders")
            sent = 0

            async def produce(count: int) -> None:
                nonlocal sent
                for _ in range(count // 16):
                    values = [f"m{sent + i}".encode() for i in range(16)]
                    sends = [
                        await producer.send(v, partition=(sent + i) % 6)
                        for i, v in enumerate(values)
                    ]
                    sent += 16
                    for value, outcome in zip(
                        values,
                        await asyncio.gather(*sends, return_exceptions=True),
                        strict=True,
                    ):
                        if not isinstance(outcome, BaseException):
                            assert outcome.offset is not None
                            acked[outcome.partition, outcome.offset] = value

            await produce(320)
            cluster.brokers[victim].kill()
            await produce(320)  # through the lease's expiry and the take-over
            await cluster.wait_owned("orders", 6, {survivor}, timeout=30)
            await produce(160)
            await asyncio.to_thread(cluster.restart_broker, victim)
            await produce(320)  # through the hand-back
            await producer.close()
        assert len(acked) >= 400, f"only {len(acked)} acknowledged"
        got = await read_all(await cluster.address(survivor), "orders", len(acked))
        missing = {where: v for where, v in acked.items() if got.get(where) != v}
        assert not missing, f"{len(missing)} of {len(acked)} acknowledged not read back"
        # the take-over found the dead broker's slices through the index, and nothing was
        # written as a per-partition tail object
        acquired = [
            event
            for line in cluster.brokers[survivor].log().splitlines()
            if line.startswith("{")
            and (event := json.loads(line)).get("event") == "cluster.partition_acquired"
        ]
        assert any(e["chunks"] > 0 for e in acquired), acquired
        store = await S3ObjectStore(bucket, "headwater", s3.endpoint_url).open()
        try:
            assert await store.list("shared/")
            assert not [o for o in await store.list("orders/") if "/tail/" in o.key]
        finally:
            await store.close()


@pytest.mark.timeout(600)
async def test_a_damaged_or_deleted_shared_object_is_skipped_visibly(
    tmp_path: Path, s3: MotoS3, bucket: str
) -> None:
    """The owner of a 1-partition topic is killed with kill -9 after 40 acknowledged messages,
    each in a window (an object) of its own. Then a record byte is flipped in the object holding
    offset 20, and the object holding offset 30 is deleted. The heir takes the partition over
    (it reads only the etcd index, so that succeeds), and a reader from the earliest offset gets
    the other 38 messages at their offsets, while the two skips are counted in the partition's
    status and logged (`topic.data_skipped`), as docs/DURABILITY.md says of a damaged or
    missing object."""
    with running_cluster(tmp_path, s3, bucket, LEASE_TTL_MS, cluster_settings=SHARED) as cluster:
        await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in ("b1", "b2")))
        async with await headwater.connect(await cluster.address("b1")) as client:
            await client.create_topic("dmg", partitions=1)
        owner = (await cluster.wait_owned("dmg", 1, {"b1", "b2"}))[0]
        heir = "b2" if owner == "b1" else "b1"
        async with await headwater.connect(await cluster.address(owner)) as client:
            producer = client.producer("dmg")
            offsets = [(await (await producer.send(f"v{i}".encode()))).offset for i in range(40)]
            await producer.close()
        assert offsets == list(range(40))
        cluster.brokers[owner].kill()
        async with await cluster._etcd() as etcd:
            entries = [
                json.loads(kv.value) for kv in await etcd.get_prefix(b"/headwater/tail/dmg/0/")
            ]
        holding = {e["first"]: e for e in entries}
        assert {20, 30} <= set(holding), f"offsets 20 and 30 not in windows of their own: {entries}"
        store = await S3ObjectStore(bucket, "headwater", s3.endpoint_url).open()
        try:
            damaged = holding[20]
            data = bytearray(await store.get(damaged["object"]))
            data[damaged["position"] + damaged["length"] - 6] ^= 0x40  # a record byte
            await store.put(damaged["object"], bytes(data))
            await store.delete(holding[30]["object"])
        finally:
            await store.close()
        await cluster.wait_owned("dmg", 1, {heir}, timeout=30)
        got = await read_all(await cluster.address(heir), "dmg", 38)
        assert got == {(0, i): f"v{i}".encode() for i in range(40) if i not in (20, 30)}
        async with await headwater.connect(await cluster.address(heir)) as client:
            description = await client.describe_topic("dmg")
        status = {c.name: c.value for c in description.topic.configs}
        assert int(status.get("status.partition.0.skipped", "0")) >= 2
        assert "topic.data_skipped" in cluster.brokers[heir].log()
