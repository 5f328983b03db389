"""The server side of compaction (issue 11 item 5): last-value state rebuilt from a snapshot plus
the WAL after its horizon, the `snapshot` start position, and the horizon in `describe`.

Snapshots are made here without Spark but with the job's own pieces: the uploaded segment objects
are decoded by `spark_compaction.wal_segments`, folded in Python (newest record per key, tombstones
and keyless records dropped), written by `spark_compaction.writer` and committed with a manifest by
a conditional put, exactly as the job does. tests/test_spark_*.py check that the job's fold equals
such a fold.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

import headwater
from headwater.durables.lastvalue import KeyedBatch, StoredValue
from headwater.server.topics.lastvalue_index import LastValueIndex
from headwater.spark_compaction.manifest import (
    LAYERED_SCHEMA_VERSION,
    Manifest,
    data_key,
    manifest_key,
    now_iso,
)
from headwater.spark_compaction.schema import DELTA_SCHEMA, SNAPSHOT_SCHEMA
from headwater.spark_compaction.store import BlockingStore, StoreSpec
from headwater.spark_compaction.wal_segments import iter_batches, list_segments
from headwater.spark_compaction.writer import encode_parquet, write_snapshot_files
from headwater.storage.lastvalue_store import drop_last_values
from headwater.storage.objectstore import LocalObjectStore, S3ObjectStore
from headwater.storage.snapshots import SnapshotFile
from headwater.storage.state import StateStore
from headwater.testing import ServerProcess
from tests.support.cli_process import hw
from tests.support.s3 import CREDENTIALS, MotoS3

SEGMENT_CONFIGS = {
    "last.value": "true",
    "segment.bytes": "2048",
    "retention.bytes": "0",  # sealed segments leave the local disk once uploaded
    "fsync": "never",
}


def make_snapshot(
    spec: StoreSpec,
    topic: str,
    partition: int,
    rows_per_file: int = 16,
    over: Manifest | None = None,
) -> Manifest:
    """Fold every uploaded segment of one partition into a committed snapshot; `over` a previous
    snapshot, fold only the segments after it into a delta layer over it (deletions kept)."""
    with BlockingStore(spec) as store:
        done = over.last_segment if over else -1
        segments = [
            s
            for s in list_segments(store, [topic])
            if s.partition == partition and s.base_offset > done
        ]
        assert segments, "nothing new uploaded yet"
        winners: dict[bytes, tuple[int, int, bytes | None, list[tuple[str, bytes | None]]]] = {}
        records_in = keyless = 0
        horizon = over.horizon if over else 0
        for segment in segments:
            for problem, rows in iter_batches(segment, store.get(segment.key)):
                assert problem is None, problem
                for offset, timestamp, key, value, headers in rows:
                    if over is not None and offset < over.horizon:
                        continue
                    records_in += 1
                    horizon = max(horizon, offset + 1)
                    if key is None:
                        keyless += 1
                    else:
                        winners[key] = (offset, timestamp, value, headers)
        kept = sorted((k, w) for k, w in winners.items() if over is not None or w[2] is not None)
        table = pa.table(
            {
                "topic": [topic] * len(kept),
                "partition": [partition] * len(kept),
                "key": [k for k, _ in kept],
                "value": [w[2] for _, w in kept],
                "offset": [w[0] for _, w in kept],
                "timestamp": [w[1] for _, w in kept],
                "headers": [[{"key": n, "value": v} for n, v in w[3]] for _, w in kept],
            },
            schema=SNAPSHOT_SCHEMA if over is None else DELTA_SCHEMA,
        )
        files = tuple(
            f
            for _, _, f in write_snapshot_files(
                store,
                {(topic, partition): horizon},
                table.to_batches(),
                rows_per_file,
                frozenset() if over is None else frozenset({(topic, partition)}),
            )
        )
        manifest = Manifest(
            topic=topic,
            partition=partition,
            horizon=horizon,
            last_segment=segments[-1].base_offset,
            previous_horizon=over.horizon if over else None,
            files=files,
            rows=len(kept),
            records_in=records_in,
            tombstones_dropped=sum(w[2] is None for w in winners.values()),
            keyless_skipped=keyless,
            corrupt_batches=0,
            created_at=now_iso(),
            schema_version=1 if over is None else LAYERED_SCHEMA_VERSION,
            delta=over is not None,
            layers=over.all_layers if over else (),
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
        await producer.send(value, key=key, partition=0)  # one queue: offsets follow the order
        if index % 20 == 0:
            await producer.flush()
    await producer.flush()


async def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
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
    spec = StoreSpec.local(server.data_dir / "objects")
    manifest = await asyncio.to_thread(make_snapshot, spec, topic, 0)
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


async def test_rebuild_and_snapshot_start_through_a_delta_layer(tmp_path: Path) -> None:
    """A snapshot whose newest run wrote a delta (changed keys, deletions included) over a full
    layer: the last-value rebuild and the `snapshot` start position both see the merged state,
    with every segment below the delta's horizon gone."""
    keys = 40
    server = ServerProcess(tmp_path / "data").start()
    objects = server.data_dir / "objects"
    try:
        base = await build_topic(server, "kv", keys)
        # changes after the tail: overwrites, deletions of keys the full layer holds, a new key
        changes = [(b"k%03d" % i, None if i % 3 == 0 else b"changed-%d" % i) for i in range(12)]
        changes.append((b"brand-new", b"n"))
        async with await headwater.connect(server.address) as client:
            await produce(client, "kv", changes + FILLER)
            end = 400 + 200 + 60 + len(changes)
            await wait_for(lambda: any(int(p.name[:20]) >= end for p in uploaded(server, "kv")))
        spec = StoreSpec.local(objects)
        delta = await asyncio.to_thread(make_snapshot, spec, "kv", 0, 16, base)
        assert delta.delta and [x.horizon for x in delta.layers] == [base.horizon]
        assert delta.horizon > end
        items = history(400, keys, "old") + FILLER + history(60, 8, "tail") + changes + FILLER
        deleted = {k for k, v in changes if v is None}
        expected_rows = fold(items[: delta.horizon])
        assert deleted.isdisjoint(expected_rows) and deleted & set(fold(items[: base.horizon]))
        async with await headwater.connect(server.address) as client:
            before = await map_state(client, "kv", keys)
        server.stop()
        lose_last_value_state(server, "kv")
        for directory in (objects / "kv" / "0", server.data_dir / "topics" / "kv" / "0"):
            for path in sorted(directory.glob("*.log")):
                following = sorted(p for p in directory.glob("*.log") if p > path)
                if following and int(following[0].name[:20]) <= delta.horizon:
                    for sibling in directory.glob(path.name[:20] + ".*"):
                        sibling.unlink()
        server.start()
        async with await headwater.connect(server.address) as client:
            assert await map_state(client, "kv", keys) == before
            consumer = await client.subscribe("kv", "boot", start="snapshot")
            received = await receive_until(
                consumer, lambda r: len(r) == len(expected_rows) + len(items) - delta.horizon
            )
            from_snapshot = {
                m.key: (m.offset, m.value) for m in received if m.offset < delta.horizon
            }
            assert from_snapshot == expected_rows
            assert [m.offset for m in received if m.offset >= delta.horizon] == list(
                range(delta.horizon, len(items))
            )
        log = server.log()
        assert "last_value.snapshot_loaded" in log and "layers=2" in log, log[-3000:]
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


def fold(items: list[tuple[bytes | None, bytes | None]]) -> dict[bytes, tuple[int, bytes]]:
    """key -> (offset, value) of the live keys after `items`, produced at offsets 0, 1, ..."""
    live: dict[bytes, tuple[int, bytes]] = {}
    for offset, (key, value) in enumerate(items):
        if key is None:
            continue
        if value is None:
            live.pop(key, None)
        else:
            live[key] = (offset, value)
    return live


FILLER = [(b"filler", b"%d" % i) for i in range(200)]


async def receive_until(
    consumer: headwater.Consumer, done: Callable[[list[headwater.Message]], bool]
) -> list[headwater.Message]:
    received: list[headwater.Message] = []
    for _ in range(10_000):
        if done(received):
            return received
        message = await consumer.receive(timeout=30)
        await message.ack()
        received.append(message)
    raise AssertionError("too many messages")


async def test_snapshot_start_delivers_one_value_per_live_key_then_the_log(tmp_path: Path) -> None:
    keys = 40
    server = ServerProcess(tmp_path / "data").start()
    try:
        manifest = await build_topic(server, "kv", keys)
        horizon = manifest.horizon
        items = history(400, keys, "old") + FILLER + history(60, 8, "tail")
        expected_rows = fold(items[:horizon])
        tombstoned = {k for k, v in items[:horizon] if k is not None and k not in expected_rows}
        assert tombstoned, "the history should delete some keys for good"
        async with await headwater.connect(server.address) as client:
            consumer = await client.subscribe("kv", "boot", start="snapshot")
            end = len(items)
            received = await receive_until(
                consumer, lambda r: len(r) == len(expected_rows) + end - horizon
            )
            snapshot_part = [m for m in received if m.offset < horizon]
            log_part = [m for m in received if m.offset >= horizon]
            # one current value per live key, with its original offset; no tombstoned key
            assert {m.key: (m.offset, m.value) for m in snapshot_part} == expected_rows
            assert len(snapshot_part) == len(expected_rows)
            assert not tombstoned & {m.key for m in snapshot_part}
            assert [m.offset for m in snapshot_part] == sorted(m.offset for m in snapshot_part)
            # then every record of the log from the horizon on, in order
            assert [m.offset for m in log_part] == list(range(horizon, end))
            assert received.index(log_part[0]) == len(snapshot_part)
            # and records produced after subscribing
            await produce(client, "kv", [(b"k001", b"late-1"), (b"new", b"late-2")])
            later = await receive_until(consumer, lambda r: len(r) == 2)
            assert [(m.offset, m.key, m.value) for m in later] == [
                (end, b"k001", b"late-1"),
                (end + 1, b"new", b"late-2"),
            ]
            assert await described_horizon(client, "kv") == str(horizon)
        # the command line: the same messages, and --exit-at-end finds the end
        cli = await asyncio.to_thread(
            hw,
            "consume",
            "kv",
            "-s",
            "cli",
            "--from",
            "snapshot",
            "--exit-at-end",
            "--format",
            "json",
            server=server,
        )
        assert cli.returncode == 0, cli.stderr
        printed = [json.loads(line) for line in cli.stdout.splitlines()]
        assert [m["offset"] for m in printed] == [m.offset for m in received + later]
        described = await asyncio.to_thread(hw, "topic", "describe", "kv", server=server)
        assert f"snapshot.partition.0.horizon={horizon}" in described.stdout  # cached by now
        # a seek to the snapshot gives an existing subscription the same again
        async with await headwater.connect(server.address) as client:
            await client.seek("kv", "boot", "snapshot")
            consumer = await client.subscribe("kv", "boot")
            everything = received + later
            replay = await receive_until(consumer, lambda r: len(r) == len(everything))
            assert [(m.offset, m.value) for m in replay] == [
                (m.offset, m.value) for m in everything
            ]
    finally:
        server.kill()


async def test_snapshot_start_goes_on_with_the_snapshot_after_a_restart(tmp_path: Path) -> None:
    """A subscription stopped half-way through the snapshot's rows resumes them after a
    restart, even with the history below the horizon gone from the WAL."""
    keys = 40
    server = ServerProcess(tmp_path / "data").start()
    try:
        manifest = await build_topic(server, "kv", keys)
        horizon = manifest.horizon
        items = history(400, keys, "old") + FILLER + history(60, 8, "tail")
        expected_rows = fold(items[:horizon])
        async with await headwater.connect(server.address) as client:
            consumer = await client.subscribe("kv", "boot", start="snapshot", prefetch=1)
            # a row handed back is delivered again, read from the snapshot
            row = await consumer.receive(timeout=30)
            await row.nack(delay=0.01)  # (0 would mean the backoff)
            # the credit comes back as a message is received (not acked), so new rows stream on
            # while the 10 ms run; once they have passed, the due row goes before new ones: only
            # the row already sent (prefetch 1) can still come first (a loop of 20 rows raced
            # the 10 ms on a fast machine: acks are batched, the rows pipelined). describe goes
            # after the nack on this connection (it flushes it): once answered, the server has
            # the nack, and the 10 ms run from before the sleep, which lets the clock pass them
            # five times over; every credit after it finds the row due
            await client.describe_topic("kv")
            await asyncio.sleep(0.05)
            first: list[headwater.Message] = []
            for _ in range(3):
                message = await consumer.receive(timeout=30)
                first.append(message)
                if message.offset == row.offset:
                    break
            for message in first:
                await message.ack()
            repeat = first[-1]
            assert (repeat.offset, repeat.key, repeat.value) == (row.offset, row.key, row.value)
            assert repeat.delivery_count == 2
            first += await receive_until(consumer, lambda r: len(first) + len(r) >= 10)
            await consumer.close()
        assert all(m.offset < horizon for m in first)
        server.stop()
        for path in (server.data_dir / "objects" / "kv" / "0").glob("*"):
            if int(path.name[:20]) < manifest.last_segment:
                path.unlink()
        server.start()
        async with await headwater.connect(server.address) as client:
            consumer = await client.subscribe("kv", "boot")
            rest = await receive_until(
                consumer, lambda r: len(r) == len(expected_rows) - len(first) + len(items) - horizon
            )
        rows = {m.key: (m.offset, m.value) for m in first + rest if m.offset < horizon}
        assert rows == expected_rows
        assert [m.offset for m in rest if m.offset >= horizon] == list(range(horizon, len(items)))
    finally:
        server.kill()


async def test_snapshot_start_without_a_snapshot_is_earliest(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic("plain", dispatch="reliable", configs=SEGMENT_CONFIGS)
            items = history(50, 10, "p")
            await produce(client, "plain", items)
            consumer = await client.subscribe("plain", "s", start="snapshot")
            received = await receive_until(consumer, lambda r: len(r) == len(items))
            assert [m.offset for m in received] == list(range(len(items)))
            description = await client.describe_topic("plain")
            assert not [c for c in description.topic.configs if c.name.startswith("snapshot.")]
    finally:
        server.kill()


async def test_deleting_a_topic_removes_its_snapshots_and_only_its_own(tmp_path: Path) -> None:
    """A re-created topic must never load the snapshot of the one deleted before it; and a topic
    named `snapshots` takes only its own segments with it."""
    server = ServerProcess(tmp_path / "data").start()
    objects = server.data_dir / "objects"
    try:
        await build_topic(server, "kv", 40)
        async with await headwater.connect(server.address) as client:
            await client.create_topic("snapshots", dispatch="reliable", configs=SEGMENT_CONFIGS)
            await produce(client, "snapshots", FILLER)
            await wait_for(lambda: bool(list((objects / "snapshots" / "0").glob("*.log"))))
            kept = snapshot_files(objects, "kv")
            assert any(p.name.startswith("_manifest-") for p in kept)
            # creating a topic purges its name, silently when nothing was there
            assert purged(server) == ""
            await client.delete_topic("snapshots")
            await wait_for(lambda: purged(server).count("topic=snapshots") == 1)
            assert not list((objects / "snapshots" / "0").glob("*.log"))
            assert kept == snapshot_files(objects, "kv")
            await client.delete_topic("kv")
            await wait_for(lambda: purged(server).count("topic=kv") == 1)
            assert snapshot_files(objects, "kv") == []
    finally:
        server.kill()


def purged(server: ServerProcess) -> str:
    """The server's log lines of finished topic purges."""
    return "\n".join(line for line in server.log().splitlines() if "upload.topic_purged" in line)


def snapshot_files(objects: Path, topic: str) -> list[Path]:
    return sorted(p for p in (objects / "snapshots" / topic).rglob("*") if p.is_file())


async def put_snapshot(
    store: LocalObjectStore,
    topic: str,
    partition: int,
    horizon: int,
    rows: list[tuple[bytes, int, bytes]],
) -> None:
    """A one-file snapshot of (key, offset, value) rows, written and committed as the job does."""
    rows = sorted(rows)
    table = pa.table(
        {
            "topic": [topic] * len(rows),
            "partition": [partition] * len(rows),
            "key": [k for k, _, _ in rows],
            "value": [v for _, _, v in rows],
            "offset": [o for _, o, _ in rows],
            "timestamp": [1000 + o for _, o, _ in rows],
            "headers": [[] for _ in rows],
        },
        schema=SNAPSHOT_SCHEMA,
    )
    data = encode_parquet(table)
    key = data_key(topic, partition, horizon, 0)
    await store.put(key, data)
    manifest = Manifest(
        topic,
        partition,
        horizon,
        0,
        None,
        (SnapshotFile(key, len(rows), len(data)),),
        len(rows),
        horizon,
        0,
        0,
        0,
        now_iso(),
    )
    assert await store.put_if_absent(manifest_key(topic, partition, horizon), manifest.encode())


def _values(index: LastValueIndex) -> dict[bytes, tuple[int, int, bytes | None]]:
    return {v.key: (v.partition, v.offset, v.value) for v in index.scan(b"")[0]}


async def test_a_load_replaces_only_its_partition_and_an_interrupted_one_is_redone(
    tmp_path: Path,
) -> None:
    state = StateStore(tmp_path / "state")
    store = LocalObjectStore(tmp_path / "objects")
    try:
        index = LastValueIndex(state, "t", 2)
        old = [(b"a", b"old"), (b"gone", b"x"), (b"b", b"old")]
        index.apply(0, 0, KeyedBatch([k for k, _ in old], [v for _, v in old], [1000, 1001, 1002]))
        index.apply(1, 0, KeyedBatch([b"p1"], [b"one"], [1000]))
        await put_snapshot(store, "t", 0, 100, [(b"a", 50, b"new"), (b"c", 60, b"c")])
        # a snapshot above the partition's end is not this log's: ignored
        await index.bootstrap(store, 0, 0, 99, 100)
        assert index.applied(0) == 3 and index.snapshot_horizons == {}
        await index.bootstrap(store, 0, 0, 100, 100)
        expected = {b"a": (0, 50, b"new"), b"c": (0, 60, b"c"), b"p1": (1, 0, b"one")}
        assert _values(index) == expected and index.size() == 3
        assert index.applied(0) == 100 and index.applied(1) == 1
        # a load cut short (a crash): the next start clears the partition and loads again
        index._store.begin_load(0, lambda data: StoredValue.decode(b"", data).partition == 0)
        index._store.put_rows({b"half": b"\0" * 26})
        restarted = LastValueIndex(state, "t", 2)
        assert restarted.applied(0) == 0 and restarted._store.loading(0)
        await restarted.bootstrap(store, 0, 0, 100, 100)
        assert _values(restarted) == expected and restarted.size() == 3
        assert not restarted._store.loading(0) and restarted.applied(0) == 100
        # not behind the snapshot: nothing is loaded again
        again = LastValueIndex(state, "t", 2)
        await again.bootstrap(store, 0, 0, 100, 100)
        assert again.snapshot_horizons == {}
        # the store is listed only when some partition's state is short of its end
        assert await again.snapshots(store, [100, 1]) == {}
        assert await again.snapshots(store, [150, 1]) == {0: 100}
    finally:
        state.close()


async def test_rebuild_and_snapshot_start_with_s3(tmp_path: Path, s3: MotoS3, bucket: str) -> None:
    """The same on S3 (moto's server): describe, a snapshot start, and a rebuild after the
    state and every segment below the horizon are gone."""
    keys = 40
    config = tmp_path / "headwater.toml"
    config.write_text(
        f'[object_store]\nbackend = "s3"\nbucket = "{bucket}"\nprefix = "wal"\n'
        f'endpoint_url = "{s3.endpoint_url}"\nretry_initial_ms = 100\nretry_max_ms = 500\n'
    )
    server = ServerProcess(
        tmp_path / "data", extra_args=("--config", str(config)), env=CREDENTIALS
    ).start()
    store = await S3ObjectStore(bucket, "wal", s3.endpoint_url).open()
    spec = StoreSpec("s3", bucket=bucket, prefix="wal", endpoint_url=s3.endpoint_url)

    async def segments() -> list[int]:
        return sorted(
            int(o.key.split("/")[-1][:20])
            for o in await store.list("kv/0/")
            if o.key.endswith(".log")
        )

    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic("kv", dispatch="reliable", configs=SEGMENT_CONFIGS)
            await produce(client, "kv", history(400, keys, "old") + FILLER)
            for _ in range(400):
                if any(base >= 400 for base in await segments()):
                    break
                await asyncio.sleep(0.05)
            manifest = await asyncio.to_thread(make_snapshot, spec, "kv", 0)
            horizon = manifest.horizon
            await produce(client, "kv", history(60, 8, "tail"))
            items = history(400, keys, "old") + FILLER + history(60, 8, "tail")
            expected_rows = fold(items[:horizon])
            before = await map_state(client, "kv", keys)
            consumer = await client.subscribe("kv", "boot", start="snapshot")
            received = await receive_until(
                consumer, lambda r: len(r) == len(expected_rows) + len(items) - horizon
            )
            assert {m.key: (m.offset, m.value) for m in received if m.offset < horizon} == (
                expected_rows
            )
            assert await described_horizon(client, "kv") == str(horizon)
        server.stop()
        lose_last_value_state(server, "kv")
        for base in await segments():
            following = [b for b in await segments() if b > base]
            if following and following[0] <= horizon:
                await store.delete(f"kv/0/{base:020d}.log")
                await store.delete(f"kv/0/{base:020d}.index")
        local = server.data_dir / "topics" / "kv" / "0"
        for path in local.glob("*.log"):
            later = sorted(p for p in local.glob("*.log") if p > path)
            if later and int(later[0].name[:20]) <= horizon:
                for sibling in local.glob(path.name[:20] + ".*"):
                    sibling.unlink()
        server.start()
        async with await headwater.connect(server.address) as client:
            assert await map_state(client, "kv", keys) == before
        assert "last_value.snapshot_loaded" in server.log()
    finally:
        server.kill()
        await store.close()


async def described_horizon(client: headwater.Client, topic: str) -> str | None:
    """Partition 0's horizon in describe. The server waits at most 1 s for its listing of the
    store and then answers with what it knew before: asked again until the listing is in."""
    for _ in range(150):  # 30 s: bounds a hang only
        description = await client.describe_topic(topic)
        configs = {c.name: c.value for c in description.topic.configs}
        if "snapshot.partition.0.horizon" in configs:
            return configs["snapshot.partition.0.horizon"]
        await asyncio.sleep(0.2)
    return None
