"""Damaged segments and a lost object store, end to end on real server processes.

Bytes are flipped in stopped servers' files, exactly as a bad disk or a stray write would leave
them; then the server restarts and is used as a client would. What must hold: the server starts,
nothing intact is dropped, no offset is given twice, damage is quarantined and reported in
`topic describe`, and other topics are unaffected.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import headwater
from headwater.storage.segments import INDEX_SUFFIX
from headwater.testing import ServerProcess
from headwater.wire.messages import DescribeTopicResponse
from tests.support.faults import (
    batches,
    flip,
    partition_dir,
    produce_each,
    read_from_earliest,
    segments,
)
from tests.support.helpers import drain


def values(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i:04d}-{'x' * 40}".encode() for i in range(count)]


def status(description: DescribeTopicResponse) -> dict[str, str]:
    """The storage status entries `topic describe` adds after the topic's configs."""
    configs = description.topic.configs
    return {c.name: c.value for c in configs if c.name.startswith("status.")}


def no_object_store(tmp_path: Path) -> ServerProcess:
    config = tmp_path / "no-store.toml"
    config.write_text('[object_store]\nbackend = "none"\n')
    return ServerProcess(tmp_path / "data", extra_args=("--config", str(config)))


async def test_corrupt_batch_in_the_middle_of_the_last_segment(tmp_path: Path) -> None:
    server = no_object_store(tmp_path).start()
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic("mid", dispatch="reliable")
            await client.create_topic("other", dispatch="reliable")
            acked, errors = await produce_each(client, "mid", values("m", 60))
            other, _ = await produce_each(client, "other", values("o", 20))
            assert not errors and len(acked) == 60
            # a subscription that has acked everything before the damage
            assert len(await read_from_earliest(client, "mid", "all-acked", 60)) == 60
        server.stop()  # graceful: the subscription's acks are all persisted
        (segment,) = segments(server, "mid")
        target = batches(segment)[30]
        flip(segment, target.position + target.size - 20)  # inside the record, CRC now wrong
        server.start()
        async with await headwater.connect(server.address) as client:
            intact = {o: v for o, v in acked.items() if o != target.base_offset}
            received = await read_from_earliest(client, "mid", "fresh", len(intact))
            assert received == intact, "intact batches after the damage were dropped"
            description = await client.describe_topic("mid")
            assert description.next_offsets[0] >= 60
            assert status(description) == {
                "status.partition.0.quarantined": "1",
                "status.partition.0.skipped": "1",
            }
            # new messages get new offsets, and the old subscription receives them
            consumer = await client.subscribe("mid", "all-acked", prefetch=100)
            new, errors = await produce_each(client, "mid", values("new", 5))
            assert not errors and min(new) >= 60
            got = await drain(consumer, len(new))
            assert {m.offset: m.value for m in got} == new
            assert await read_from_earliest(client, "other", "o", len(other)) == other
        quarantined = list((partition_dir(server, "mid") / "quarantine").iterdir())
        assert len(quarantined) == 1 and quarantined[0].stat().st_size == target.size
        assert "wal.quarantined" in server.log()
    finally:
        server.kill()


async def _sealed_topic(client: headwater.Client, topic: str, count: int) -> dict[int, bytes]:
    await client.create_topic(
        topic, dispatch="reliable", configs={"segment.bytes": 2048, "fsync": "always"}
    )
    acked, errors = await produce_each(client, topic, values(topic, count))
    assert not errors
    return acked


async def test_corrupt_batch_and_flipped_length_in_sealed_segments_without_a_copy(
    tmp_path: Path,
) -> None:
    server = no_object_store(tmp_path).start()
    try:
        async with await headwater.connect(server.address) as client:
            acked = await _sealed_topic(client, "sealed", 200)
        server.kill()
        files = segments(server, "sealed")
        assert len(files) > 6
        crc_victim = batches(files[1])[2]
        flip(files[1], crc_victim.position + crc_victim.size - 10)
        length_victim = batches(files[3])[1]
        flip(files[3], length_victim.position + 10, count=1)  # a byte of the length field
        sizes = {f: f.stat().st_size for f in files[:-1]}
        server.start()
        async with await headwater.connect(server.address) as client:
            lost = {crc_victim.base_offset, length_victim.base_offset}
            expected = {o: v for o, v in acked.items() if o not in lost}
            received = await read_from_earliest(client, "sealed", "replay", len(expected))
            assert received == expected
            found = status(await client.describe_topic("sealed"))
            assert found["status.partition.0.quarantined"] == "2"
            assert int(found["status.partition.0.skipped"]) >= 2
            new, _ = await produce_each(client, "sealed", [b"after"])
            assert min(new) >= 200
        assert {f: f.stat().st_size for f in files[:-1]} == sizes, "a sealed segment was cut"
    finally:
        server.kill()


async def test_missing_index_is_rebuilt_and_a_sealed_segment_never_cut(tmp_path: Path) -> None:
    server = no_object_store(tmp_path).start()
    try:
        async with await headwater.connect(server.address) as client:
            acked = await _sealed_topic(client, "noindex", 120)
        server.kill()
        files = segments(server, "noindex")
        victim = batches(files[2])[3]
        flip(files[2], victim.position + victim.size - 10)  # and one bad batch in the middle
        sizes = {f: f.stat().st_size for f in files[:-1]}
        for path in files[:-1]:
            path.with_suffix(INDEX_SUFFIX).unlink()
        server.start()
        async with await headwater.connect(server.address) as client:
            expected = {o: v for o, v in acked.items() if o != victim.base_offset}
            received = await read_from_earliest(client, "noindex", "r", len(expected))
            assert received == expected
            found = status(await client.describe_topic("noindex"))
            assert found["status.partition.0.quarantined"] == "1"
        assert {f: f.stat().st_size for f in files[:-1]} == sizes
        assert all(f.with_suffix(INDEX_SUFFIX).exists() for f in files[:-1])
    finally:
        server.kill()


async def _wait_for(predicate, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.1)


async def test_corrupt_sealed_batch_is_read_from_the_object_store_copy(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()  # the local object store is the default
    objects = server.data_dir / "objects" / "copied" / "0"
    try:
        async with await headwater.connect(server.address) as client:
            acked = await _sealed_topic(client, "copied", 150)
            files = segments(server, "copied")
            await _wait_for(lambda: (objects / files[1].name).exists())
        server.kill()
        victim = batches(files[1])[2]
        flip(files[1], victim.position + victim.size - 10)
        server.start()
        async with await headwater.connect(server.address) as client:
            assert await read_from_earliest(client, "copied", "r", len(acked)) == acked
            assert status(await client.describe_topic("copied")) == {
                "status.partition.0.quarantined": "1"
            }
        assert "topic.damage_read_from_archive" in server.log()
    finally:
        server.kill()


async def test_replay_continues_past_objects_lost_from_the_store(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    objects = server.data_dir / "objects" / "lost" / "0"
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic(
                "lost",
                dispatch="reliable",
                configs={"segment.bytes": 2048, "retention.bytes": 0, "fsync": "never"},
            )
            acked, _ = await produce_each(client, "lost", values("l", 200))
            local = partition_dir(server, "lost")
            await _wait_for(lambda: len(list(local.glob("*.log"))) <= 2)
            uploaded = sorted(objects.glob("*.log"))
            assert len(uploaded) >= 6
            # two objects in the middle vanish behind the server's back
            gone: set[int] = set()
            for path in uploaded[2:4]:
                first = int(path.name[:20])
                following = uploaded[uploaded.index(path) + 1]
                gone.update(range(first, int(following.name[:20])))
                path.unlink()
            expected = {o: v for o, v in acked.items() if o not in gone}
            received = await read_from_earliest(client, "lost", "middle", len(expected))
            assert received == expected
            # then the whole bucket
            shutil.rmtree(server.data_dir / "objects" / "lost")
            local_start = min(int(p.name[:20]) for p in local.glob("*.log"))
            expected = {o: v for o, v in acked.items() if o >= local_start}
            assert expected, "no local data after the gap: nothing to check"
            received = await read_from_earliest(client, "lost", "emptied", len(expected))
            assert received == expected
    finally:
        server.kill()


async def test_map_rebuilt_over_a_damaged_segment_and_a_broken_partition_stays_apart(
    tmp_path: Path,
) -> None:
    server = no_object_store(tmp_path).start()
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic(
                "kv", dispatch="reliable", configs={"segment.bytes": 2048, "fsync": "always"}
            )
            producer = client.producer("kv")
            for i in range(100):
                await (await producer.send(f"value-{i}".encode(), key=f"k{i % 10}".encode()))
            await client.create_topic("broken", dispatch="reliable")
            await produce_each(client, "broken", [b"b"])
        server.kill()
        files = segments(server, "kv")
        victim = batches(files[-2])[0]
        flip(files[-2], victim.position + victim.size - 10)
        for path in files[:-1]:
            path.with_suffix(INDEX_SUFFIX).unlink()
        broken = partition_dir(server, "broken")
        shutil.rmtree(broken)
        broken.write_text("not a directory")  # the partition cannot be opened at all
        server.start()
        async with await headwater.connect(server.address) as client:
            kv = client.map("kv")
            await kv.set("z", "first write")  # builds the state (a read would be refused) ...
            assert await kv.size() == 11  # ... over the damaged segment
            for k in range(10):
                latest = max(i for i in range(k, 100, 10) if i != victim.base_offset)
                found = await kv.get(f"k{k}")
                assert found is not None and found.value == f"value-{latest}".encode()
            description = await client.describe_topic("broken")
            offline = status(description)["status.partition.0.offline"]
            assert "cannot open" in offline
            _, errors = await produce_each(client, "broken", [b"refused"])
            assert [e.code for e in errors] == [headwater.ErrorCode.PARTITION_OFFLINE]
            await client.create_topic("healthy", dispatch="reliable")
            ok, errors = await produce_each(client, "healthy", [b"fine"])
            assert not errors and ok == {0: b"fine"}
    finally:
        server.kill()
