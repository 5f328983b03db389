"""The server side of compaction (issue 11 item 5): last-value state rebuilt from a snapshot plus
the WAL after its horizon, the `snapshot` start position, and the horizon in `describe`.

Snapshots are made here without Spark but with the job's own pieces: the uploaded segment objects
are decoded by `spark_compaction.wal`, folded in Python (newest record per key, tombstones and
keyless records dropped), written by `spark_compaction.writer` and committed with a manifest by a
conditional put, exactly as the job does. tests/test_spark_*.py check that the job's fold equals
such a fold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

import headwater
from headwater.spark_compaction.manifest import Manifest, manifest_key, now_iso
from headwater.spark_compaction.schema import SNAPSHOT_SCHEMA
from headwater.spark_compaction.store import BlockingStore, StoreSpec
from headwater.spark_compaction.wal import iter_batches, list_segments
from headwater.spark_compaction.writer import write_snapshot_files
from headwater.storage.lastvalue_store import drop_last_values
from headwater.storage.state import StateStore
from headwater.testing import ServerProcess

SEGMENT_CONFIGS = {
    "last.value": "true",
    "segment.bytes": "2048",
    "retention.bytes": "0",  # sealed segments leave the local disk once uploaded
    "fsync": "never",
}


def make_snapshot(objects: Path, topic: str, partition: int, rows_per_file: int = 16) -> Manifest:
    """Fold every uploaded segment of one partition into a committed snapshot."""
    with BlockingStore(StoreSpec.local(objects)) as store:
        segments = [s for s in list_segments(store, [topic]) if s.partition == partition]
        assert segments, "nothing uploaded yet"
        winners: dict[bytes, tuple[int, int, bytes | None, list[tuple[str, bytes | None]]]] = {}
        records_in = keyless = 0
        horizon = 0
        for segment in segments:
            for problem, rows in iter_batches(segment, store.get(segment.key)):
                assert problem is None, problem
                for offset, timestamp, key, value, headers in rows:
                    records_in += 1
                    horizon = max(horizon, offset + 1)
                    if key is None:
                        keyless += 1
                    else:
                        winners[key] = (offset, timestamp, value, headers)
        live = sorted((k, w) for k, w in winners.items() if w[2] is not None)
        table = pa.table(
            {
                "topic": [topic] * len(live),
                "partition": [partition] * len(live),
                "key": [k for k, _ in live],
                "value": [w[2] for _, w in live],
                "offset": [w[0] for _, w in live],
                "timestamp": [w[1] for _, w in live],
                "headers": [[{"key": n, "value": v} for n, v in w[3]] for _, w in live],
            },
            schema=SNAPSHOT_SCHEMA,
        )
        files = tuple(
            f
            for _, _, f in write_snapshot_files(
                store, {(topic, partition): horizon}, table.to_batches(), rows_per_file
            )
        )
        manifest = Manifest(
            topic=topic,
            partition=partition,
            horizon=horizon,
            last_segment=segments[-1].base_offset,
            previous_horizon=None,
            files=files,
            rows=len(live),
            records_in=records_in,
            tombstones_dropped=len(winners) - len(live),
            keyless_skipped=keyless,
            corrupt_batches=0,
            created_at=now_iso(),
        )
        assert store.put_if_absent(manifest_key(topic, partition, horizon), manifest.encode())
        return manifest


def history(count: int, keys: int, salt: str) -> list[tuple[bytes | None, bytes | None]]:
    """Overwrites, a tombstone every 7th record and a keyless one every 23rd."""
    items: list[tuple[bytes | None, bytes | None]] = []
    for i in range(count):
        key = None if i % 23 == 22 else b"k%03d" % ((i * 7919) % keys)
        value = None if key is not None and i % 7 == 6 else f"{salt}-{i}".encode()
        items.append((key, value))
    return items


async def produce(
    client: headwater.Client, topic: str, items: list[tuple[bytes | None, bytes | None]]
) -> None:
    """In batches of 20 records (one flush each), so segments of 2 KiB fill and seal."""
    producer = client.producer(topic)
    for index, (key, value) in enumerate(items, 1):
        await producer.send(value, key=key)
        if index % 20 == 0:
            await producer.flush()
    await producer.flush()


async def wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def map_state(
    client: headwater.Client, topic: str, keys: int
) -> tuple[dict[bytes, bytes | None], int]:
    table = client.map(topic)
    names = [b"k%03d" % i for i in range(keys)]
    found = await table.get_many(names)
    return {
        n: (v.value if v is not None else None) for n, v in zip(names, found, strict=True)
    }, await table.size()


def lose_last_value_state(server: ServerProcess, topic: str) -> None:
    state = StateStore(server.data_dir / "state")
    try:
        drop_last_values(state, topic)
    finally:
        state.close()


def uploaded(server: ServerProcess, topic: str) -> list[Path]:
    return sorted((server.data_dir / "objects" / topic / "0").glob("*.log"))


async def build_topic(server: ServerProcess, topic: str, keys: int) -> Manifest:
    """A topic with several uploaded segments, a snapshot of them, and a tail after it."""
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic, dispatch="reliable", configs=SEGMENT_CONFIGS)
        await produce(client, topic, history(400, keys, "old"))
        # records of one other key seal the segments of the history, which are then uploaded
        await produce(client, topic, [(b"filler", b"%d" % i) for i in range(200)])
        await wait_for(lambda: any(int(p.name[:20]) >= 400 for p in uploaded(server, topic)))
    manifest = await asyncio.to_thread(make_snapshot, server.data_dir / "objects", topic, 0)
    assert manifest.rows > 0 and len(manifest.files) > 1
    async with await headwater.connect(server.address) as client:
        await produce(client, topic, history(60, 8, "tail"))  # after the horizon, on 8 of the keys
    return manifest


async def test_rebuild_from_snapshot_and_wal_tail_equals_the_state_before(tmp_path: Path) -> None:
    keys = 40
    server = ServerProcess(tmp_path / "data").start()
    try:
        manifest = await build_topic(server, "kv", keys)
        async with await headwater.connect(server.address) as client:
            before = await map_state(client, "kv", keys)
        assert before[1] > 0
        server.stop()
        lose_last_value_state(server, "kv")
        # Only the snapshot and the WAL after its horizon can give the right answer: every
        # segment below the horizon goes, from the object store and from the local disk.
        removed = 0
        for directory in (
            server.data_dir / "objects" / "kv" / "0",
            server.data_dir / "topics" / "kv" / "0",
        ):
            for path in sorted(directory.glob("*.log")):
                following = sorted(p for p in directory.glob("*.log") if p > path)
                end = int(following[0].name[:20]) if following else None
                if end is not None and end <= manifest.horizon:
                    for sibling in directory.glob(path.name[:20] + ".*"):
                        sibling.unlink()
                    removed += 1
        assert removed >= 3
        server.start()
        async with await headwater.connect(server.address) as client:
            assert await map_state(client, "kv", keys) == before
        log = server.log()
        assert "last_value.snapshot_loaded" in log
        tail_records = 660 - manifest.horizon
        assert f"replayed={tail_records} " in log or f"'replayed': {tail_records}" in log, log[
            -3000:
        ]
    finally:
        server.kill()


async def test_damaged_snapshot_falls_back_to_a_full_replay(tmp_path: Path) -> None:
    keys = 40
    server = ServerProcess(tmp_path / "data").start()
    try:
        manifest = await build_topic(server, "kv", keys)
        async with await headwater.connect(server.address) as client:
            before = await map_state(client, "kv", keys)
        server.stop()
        objects = server.data_dir / "objects"
        # the second file is cut short: the first one's rows were already in when it fails
        damaged = objects / manifest.files[1].key
        damaged.write_bytes(damaged.read_bytes()[:-40])
        lose_last_value_state(server, "kv")
        server.start()
        async with await headwater.connect(server.address) as client:
            assert await map_state(client, "kv", keys) == before
        log = server.log()
        assert "last_value.snapshot_unusable" in log
        assert "last_value.snapshot_loaded" not in log
        server.stop()
        # a missing file: the same
        (objects / manifest.files[0].key).unlink()
        lose_last_value_state(server, "kv")
        server.start()
        async with await headwater.connect(server.address) as client:
            assert await map_state(client, "kv", keys) == before
        assert server.log().count("last_value.snapshot_unusable") == 2
    finally:
        server.kill()
