"""Every reader of the log gets past a damaged batch the same way (storage.log_reader).

A byte is flipped in one batch of a stopped server's segment. When that segment was uploaded,
each reader must take the batch from the object store's copy (`topic.damage_read_from_archive`):
the last-value rebuild at start holds every key (it lost the key silently before), after a
snapshot load too, and a consumer receives every offset. When it was not uploaded, each reader
skips it with `topic.data_skipped` and counts it in `status.partition.<p>.skipped`. The storage
test at the end checks the read path itself on real files: no read ever returns batches on both
sides of damage, so no reader can step over hidden offsets without seeing them. Spark's WAL source
reads the uploaded objects (whole where only the local copy is damaged; damage in an object is
skipped and counted like the server's), and a cluster's take-over copies the cloud tail over
damage the same way (from the uploaded segment, else skipped).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import headwater
from headwater.spark_compaction.store import StoreSpec
from headwater.storage import wal as wal_module
from headwater.storage.archive import ObjectArchive
from headwater.storage.log_reader import read_partition
from headwater.storage.objectstore import LocalObjectStore, S3ObjectStore
from headwater.storage.reader import SegmentRead, read_batches
from headwater.storage.segments import batch_location, walk_batches
from headwater.storage.state import StateStore
from headwater.storage.uploader import Uploader
from headwater.storage.wal import FsyncPolicy, LogConfig, PartitionLog
from headwater.testing import ServerProcess
from headwater.wire.messages import DescribeTopicResponse
from headwater.wire.records import build_batch, read_records
from tests.support.cluster_support import running_cluster
from tests.support.faults import batches, flip, read_from_earliest, segments
from tests.support.s3 import MotoS3
from tests.test_snapshot_server import lose_last_value_state, make_snapshot

KEYS = 320
VICTIM = 110  # the offset (and key number) of the damaged batch


def _status(description: DescribeTopicResponse) -> dict[str, str]:
    return {c.name: c.value for c in description.topic.configs if c.name.startswith("status.")}


async def _wait_for(predicate, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


def _server(tmp_path: Path, object_store: bool) -> ServerProcess:
    if object_store:
        return ServerProcess(tmp_path / "data")  # the local object store is the default
    config = tmp_path / "no-store.toml"
    config.write_text('[object_store]\nbackend = "none"\n')
    return ServerProcess(tmp_path / "data", extra_args=("--config", str(config)))


async def _keyed(
    client: headwater.Client, topic: str, first: int, count: int, keys: int | None = None
) -> None:
    """Key k<i> = v<i> (k<i % keys> with `keys`), one batch each, at offset i (one partition)."""
    producer = client.producer(topic)
    for i in range(first, first + count):
        key = f"k{i if keys is None else i % keys}".encode()
        await (await producer.send(f"v{i}".encode(), key=key, partition=0))
    await producer.close()


def _uploaded_holding(server: ServerProcess, topic: str, offset: int) -> bool:
    objects = sorted((server.data_dir / "objects" / topic / "0").glob("*.log"))
    bases = [int(p.name[:20]) for p in objects]
    return any(b <= offset < n for b, n in itertools.pairwise(bases))


def _flip_batch_at(server: ServerProcess, topic: str, offset: int) -> None:
    for path in segments(server, topic):
        for found in batches(path):
            if found.base_offset == offset:
                flip(path, found.position + found.size - 6)  # in the record: the CRC fails
                return
    raise AssertionError(f"no local batch at {offset}")


async def _map_values(client: headwater.Client, topic: str, count: int) -> dict[str, bytes]:
    found = await client.map(topic).get_many([f"k{i}" for i in range(count)])
    return {f"k{i}": v.value for i, v in enumerate(found) if v is not None}


async def test_last_value_rebuild_takes_a_damaged_uploaded_batch_from_the_archive(
    tmp_path: Path,
) -> None:
    server = _server(tmp_path, object_store=True).start()
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic(
                "lv", dispatch="reliable", configs={"segment.bytes": 2048, "last.value": "true"}
            )
            await _keyed(client, "lv", 0, KEYS)
            await _wait_for(lambda: _uploaded_holding(server, "lv", VICTIM))
        server.stop()
        lose_last_value_state(server, "lv")  # the state is rebuilt from the log at start
        _flip_batch_at(server, "lv", VICTIM)
        server.start()
        async with await headwater.connect(server.address) as client:
            held = await _map_values(client, "lv", KEYS)
            assert held == {f"k{i}": f"v{i}".encode() for i in range(KEYS)}, (
                f"missing: {sorted(set(range(KEYS)) - {int(k[1:]) for k in held})}"
            )
            received = await read_from_earliest(client, "lv", "all", count=KEYS)
            assert sorted(received) == list(range(KEYS))
            assert "status.partition.0.skipped" not in _status(await client.describe_topic("lv"))
        log = server.log()
        assert log.count("topic.damage_read_from_archive") >= 2  # the rebuild and the consumer
        assert "topic.data_skipped" not in log
    finally:
        server.kill()


async def test_last_value_rebuild_skips_a_damaged_batch_without_a_copy_like_a_consumer(
    tmp_path: Path,
) -> None:
    server = _server(tmp_path, object_store=False).start()
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic(
                "lv", dispatch="reliable", configs={"segment.bytes": 2048, "last.value": "true"}
            )
            await _keyed(client, "lv", 0, KEYS)
        server.stop()
        lose_last_value_state(server, "lv")
        _flip_batch_at(server, "lv", VICTIM)
        server.start()
        async with await headwater.connect(server.address) as client:
            held = await _map_values(client, "lv", KEYS)
            assert held == {f"k{i}": f"v{i}".encode() for i in range(KEYS) if i != VICTIM}
            # the rebuild at start counted its skip; a consumer counts its own the same way
            assert _status(await client.describe_topic("lv"))["status.partition.0.skipped"] == "1"
            received = await read_from_earliest(client, "lv", "all", count=KEYS - 1)
            assert sorted(received) == [i for i in range(KEYS) if i != VICTIM]
            assert _status(await client.describe_topic("lv"))["status.partition.0.skipped"] == "2"
        assert server.log().count("topic.data_skipped") == 2
    finally:
        server.kill()


async def test_catch_up_after_a_snapshot_load_takes_a_damaged_batch_from_the_archive(
    tmp_path: Path,
) -> None:
    server = _server(tmp_path, object_store=True).start()
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic(
                "snap", dispatch="reliable", configs={"segment.bytes": 2048, "last.value": "true"}
            )
            # overwrites of 20 keys: the snapshot (20 rows) beats replaying its 200 records
            await _keyed(client, "snap", 0, 200, keys=20)
            await _wait_for(lambda: _uploaded_holding(server, "snap", 150))
        spec = StoreSpec.local(server.data_dir / "objects")
        manifest = await asyncio.to_thread(make_snapshot, spec, "snap", 0)
        victim = manifest.horizon + 30
        async with await headwater.connect(server.address) as client:
            await _keyed(client, "snap", 200, KEYS - 200)
            await _wait_for(lambda: _uploaded_holding(server, "snap", victim))
        server.stop()
        lose_last_value_state(server, "snap")
        _flip_batch_at(server, "snap", victim)
        server.start()
        async with await headwater.connect(server.address) as client:
            held = await _map_values(client, "snap", KEYS)
            latest = {f"k{i % 20}": f"v{i}".encode() for i in range(200)}
            assert held == latest | {f"k{i}": f"v{i}".encode() for i in range(200, KEYS)}
        log = server.log()
        assert "last_value.snapshot_loaded" in log
        assert "topic.damage_read_from_archive" in log and "topic.data_skipped" not in log
    finally:
        server.kill()


def _batch(value: bytes) -> bytes:
    return build_batch([(None, value, [])])


class SkipCount:
    skipped = 0


@contextlib.asynccontextmanager
async def _uploaded_log(
    tmp_path: Path, config: LogConfig, records: int
) -> AsyncIterator[tuple[PartitionLog, LocalObjectStore, Uploader]]:
    """A partition log of `records` one-record batches (topic "t", partition 0) whose sealed
    segments go to a local object store; yielded once its first segment is uploaded."""
    state = StateStore(tmp_path / "state")
    store = LocalObjectStore(tmp_path / "objects")
    uploader = Uploader(store, state)
    uploader.start()
    wal = PartitionLog.open(tmp_path / "log", config, on_sealed=None)
    wal.on_sealed = lambda sealed: uploader.enqueue("t", 0, sealed)
    wal.start()
    try:
        for i in range(records):
            wal.append(_batch(f"value-{i:03d}".encode()), 1)
        await _wait_for(
            lambda: (
                any(s.base_offset == 0 for s in uploader.uploaded("t", 0)) and not uploader.pending
            )
        )
        yield wal, store, uploader
    finally:
        await wal.close()
        await uploader.close()
        state.close()


async def test_no_read_returns_batches_on_both_sides_of_damage(tmp_path: Path) -> None:
    """The read path on real files: a read stops in front of damage; the read starting there
    takes the uploaded copy, or (no copy) skips and counts it; nothing is lost silently."""
    async with _uploaded_log(tmp_path, LogConfig(segment_bytes=1024), 60) as (
        wal,
        store,
        uploader,
    ):
        first = sorted((tmp_path / "log").glob("*.log"))[0]
        victims = [b for b in batches(first) if b.base_offset in (3, 4)]
        for victim in victims:  # two batches in a row: both hidden, both recovered
            flip(first, victim.position + victim.size - 6)
        archive = ObjectArchive(store, uploader)
        wal._tail.clear()  # as after a restart: reads go to the files

        async def read_all(archive_or_none: ObjectArchive | None) -> tuple[list[int], int]:
            counter = SkipCount()
            offsets: list[int] = []
            offset = 0
            while offset < wal.next_offset:
                read = await read_partition(wal, archive_or_none, "t", 0, offset, counter)
                if not read:
                    break
                for data in read:
                    location = batch_location(data, 0)
                    # consecutive inside a read: hidden offsets only ever start a read
                    if offsets and data is not read[0]:
                        assert location.base_offset == offsets[-1] + 1
                    offsets.extend(r.offset for r in read_records(data))
                    offset = location.next_offset
            return offsets, counter.skipped

        assert await read_all(archive) == (list(range(60)), 0)
        assert await read_all(None) == ([i for i in range(60) if i not in (3, 4)], 1)
        # below the local log the object is the only copy: a flipped length byte in it costs
        # its batch, skipped and counted (it silently cost the rest of the object before)
        assert wal.delete_segment(0)
        uploaded = tmp_path / "objects" / "t" / "0" / first.name
        victim = batches(uploaded)[7]
        flip(uploaded, victim.position + 10, count=1)
        assert await read_all(archive) == ([i for i in range(60) if i != 7], 1)


@pytest.mark.timeout(600)  # a Spark session starting on a busy 2-core machine: a hang bound
def test_spark_wal_source_reads_uploaded_copies_and_skips_damage_like_the_server(
    spark: Any, tmp_path: Path
) -> None:
    """The Spark WAL source reads the uploaded objects: a batch damaged on the local disk after
    its upload is read whole from them; a batch damaged in the object itself (the only copy it
    has) is skipped and counted (a `corrupt` row) under the server's event, and a flipped length
    byte costs its batch, not the rest of the segment."""

    async def fill() -> ServerProcess:
        server = _server(tmp_path, object_store=True).start()
        async with await headwater.connect(server.address) as client:
            await client.create_topic("sp", dispatch="reliable", configs={"segment.bytes": 2048})
            await _keyed(client, "sp", 0, 200)
            await _wait_for(lambda: _uploaded_holding(server, "sp", 150))
        server.stop()
        return server

    server = asyncio.run(fill())
    objects = server.data_dir / "objects"
    uploaded = sorted((objects / "sp" / "0").glob("*.log"))
    expected = [
        o for p in uploaded for b in batches(p) for o in range(b.base_offset, b.next_offset)
    ]
    _flip_batch_at(server, "sp", 110)  # the local copy only

    def offsets_read() -> tuple[list[int], list[str]]:
        frame = spark.read.format("headwater_wal").option("store", spec.to_json()).load()
        rows = frame.collect()
        return sorted(r.offset for r in rows if r.corrupt is None), [
            r.corrupt for r in rows if r.corrupt is not None
        ]

    spec = StoreSpec.local(objects)
    found, corrupt = offsets_read()
    assert found == expected and not corrupt
    # now the objects themselves: a record byte (CRC) in one, a length byte in another
    crc_object, length_object = uploaded[1], uploaded[3]
    crc_victim, length_victim = batches(crc_object)[2], batches(length_object)[1]
    flip(crc_object, crc_victim.position + crc_victim.size - 6)
    flip(length_object, length_victim.position + 10, count=1)
    found, corrupt = offsets_read()
    lost = {crc_victim.base_offset, length_victim.base_offset}
    assert found == [o for o in expected if o not in lost]
    assert len(corrupt) == 2, corrupt


async def _chunks(store: S3ObjectStore, topic: str) -> list[str]:
    return [i.key for i in await store.list(f"{topic}/0/tail/") if i.key.endswith(".log")]


async def _damage_chunk_batch(store: S3ObjectStore, topic: str, offset: int) -> None:
    """Flip a record byte of the batch at `offset` in the cloud-tail chunk holding it."""
    for key in await _chunks(store, topic):
        first, end, _ = (int(part) for part in key.rsplit("/", 1)[1][:-4].split("-"))
        if first <= offset < end:
            data = bytearray(await store.get(key))
            for step in walk_batches(bytes(data)):
                if step.batch is not None and step.batch.base_offset == offset:
                    data[step.position + step.length - 6] ^= 0x40
                    await store.put(key, bytes(data))
                    return
    raise AssertionError(f"no chunk holds offset {offset}: {await _chunks(store, topic)}")


@pytest.mark.timeout(300)  # etcd, moto and two brokers on a busy machine: a hang bound
async def test_a_take_over_skips_a_damaged_tail_batch_and_serves_the_partition(
    tmp_path: Path, s3: MotoS3, bucket: str
) -> None:
    """The new owner reads the cloud tail's chunks in place, as every reader reads the log: a
    damaged batch in the newest chunk (no segment holds it) is skipped, counted and logged, the
    offsets stay where they were (the map's revisions too), and the partition is served. Before,
    the last-value catch-up of the take-over refused the skip and every take-over failed."""
    keys = 30
    with running_cluster(tmp_path, s3, bucket, 2000) as cluster:
        await asyncio.gather(*(asyncio.to_thread(cluster.start_broker, b) for b in ("b1", "b2")))
        async with await headwater.connect(await cluster.address("b1")) as client:
            await client.create_topic("kvc", partitions=1, configs={"last.value": "true"})
        owner = (await cluster.wait_owned("kvc", 1, {"b1", "b2"}))[0]
        heir = "b2" if owner == "b1" else "b1"
        async with await headwater.connect(await cluster.address(owner)) as client:
            table = client.map("kvc")
            revisions = {f"k{i}": await table.set(f"k{i}", f"v{i}") for i in range(keys)}
        victim = revisions[f"k{keys - 1}"]  # in the newest chunk, which is never collected
        store = await S3ObjectStore(bucket, "headwater", s3.endpoint_url).open()  # the default
        try:
            cluster.brokers[owner].kill()
            await _damage_chunk_batch(store, "kvc", victim)
        finally:
            await store.close()
        await cluster.wait_owned("kvc", 1, {heir}, timeout=30)
        async with await headwater.connect(await cluster.address(heir)) as client:
            table = client.map("kvc")
            deadline = asyncio.get_running_loop().time() + 60  # bounds a hang only
            while True:  # the take-over finishes (NOT_OWNER until then)
                try:
                    found = await table.get_many(list(revisions))
                    break
                except headwater.NotOwner:
                    assert asyncio.get_running_loop().time() < deadline, "never served again"
                    await asyncio.sleep(0.2)
            held = {k: v.revision for k, v in zip(revisions, found, strict=True) if v is not None}
            assert held == {k: r for k, r in revisions.items() if k != f"k{keys - 1}"}
            fresh = await table.set("fresh", "value")
            assert fresh > max(revisions.values()), "a revision was given again"
            status = _status(await client.describe_topic("kvc"))
            # one per skip, whichever reader met it (DURABILITY.md): the last-value catch-up,
            # and the idempotent producers' table rebuild when it read the chunk by then
            assert int(status.get("status.partition.0.skipped", "0")) >= 1
        assert "topic.data_skipped" in cluster.brokers[heir].log()


async def test_a_read_whose_segment_retention_deletes_meanwhile_takes_the_archived_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read runs in a worker thread; retention may unlink its (uploaded) segment before the
    thread opens it. The read then takes the object store's copy, as a read that started after
    the deletion does; it raised FileNotFoundError to the reader."""
    entered, go_on = threading.Event(), threading.Event()

    def late_read(path: Path, *args: int) -> SegmentRead:
        entered.set()
        go_on.wait(30)  # the thread opens the file only after the deletion
        return read_batches(path, *args)

    config = LogConfig(segment_bytes=1024, fsync=FsyncPolicy.ALWAYS, tail_cache_bytes=0)
    async with _uploaded_log(tmp_path, config, 20) as (wal, store, uploader):
        monkeypatch.setattr(wal_module, "read_batches", late_read)
        archive = ObjectArchive(store, uploader)
        reading = asyncio.ensure_future(read_partition(wal, archive, "t", 0, 0, SkipCount()))
        try:
            assert await asyncio.to_thread(entered.wait, 30)
            assert wal.delete_segment(0)
            _, sequence = wal.append(_batch(b"after"), 1)
            await wal.wait_durable(sequence)  # the round that unlinked segment 0 is over
            assert not (tmp_path / "log" / "00000000000000000000.log").exists()
        finally:
            go_on.set()
        read = await reading
        assert [r.value for r in read_records(read[0])] == [b"value-000"]
