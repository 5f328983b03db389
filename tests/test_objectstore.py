"""Object storage: both backends against one contract, and the server shipping WAL segments to S3
(moto's standalone server over HTTP) and replaying from it."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import headwater
from headwater.server.requests.admin_requests import disk_usage
from headwater.storage.fileio import COPY_STEP, RELEASE_STEP, copy_durably
from headwater.storage.objectstore import LocalObjectStore, ObjectStore, S3ObjectStore
from headwater.testing import ServerProcess
from headwater.wire.errors import ObjectNotFound, StorageError
from tests.support.faults import partition_dir, produce_each, read_from_earliest, small_tmpfs
from tests.support.helpers import eventually
from tests.support.s3 import CREDENTIALS, MotoS3, create_bucket


@pytest.fixture(params=["local", "s3"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, s3: MotoS3, bucket: str
) -> AsyncIterator[ObjectStore]:
    if request.param == "local":
        yield LocalObjectStore(tmp_path / "objects")
        return
    opened = await S3ObjectStore(bucket, "prefix", s3.endpoint_url).open()
    yield opened
    await opened.close()


async def test_object_store_contract(store: ObjectStore) -> None:
    await store.put("t/0/a.log", b"hello world")
    assert await store.get("t/0/a.log") == b"hello world"
    assert await store.get("t/0/a.log", 6) == b"world"
    assert await store.get("t/0/a.log", 0, 5) == b"hello"
    await store.put("t/0/a.log", b"replaced")
    assert await store.get("t/0/a.log") == b"replaced"
    assert await store.put_if_absent("t/0/a.log", b"no") is False
    assert await store.get("t/0/a.log") == b"replaced"
    assert await store.put_if_absent("t/1/b.log", b"yes") is True
    assert [(o.key, o.size) for o in await store.list("t/")] == [("t/0/a.log", 8), ("t/1/b.log", 3)]
    assert [o.key for o in await store.list("t/1/")] == ["t/1/b.log"]
    await store.delete("t/1/b.log")
    assert [o.key for o in await store.list("")] == ["t/0/a.log"]
    with pytest.raises(ObjectNotFound):
        await store.get("t/9/missing.log")
    for bad in ("", "../escape", "a//b", "/abs"):
        with pytest.raises(StorageError, match="invalid object key"):
            await store.put(bad, b"x")


async def test_put_file_stores_a_files_bytes_and_says_when_the_file_is_gone(
    store: ObjectStore, tmp_path: Path
) -> None:
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(os.urandom(300_000))
    assert await store.put_file("t/0/seg.log", segment) == 300_000
    assert await store.get("t/0/seg.log") == segment.read_bytes()
    with pytest.raises(FileNotFoundError):  # the uploader's "segment gone", not a store failure
        await store.put_file("t/0/other.log", tmp_path / "deleted.log")
    assert [o.key for o in await store.list("t/")] == ["t/0/seg.log"]


async def test_s3_put_file_goes_up_in_parts_and_leaves_no_upload_behind(
    tmp_path: Path, s3: MotoS3, bucket: str
) -> None:
    """A 64 MiB segment was read whole into memory for one PUT; above `part_size` it goes up in
    parts, one in memory at a time. A part that fails aborts the upload: nothing half-made stays
    in the bucket (S3 keeps, and bills, the parts of an upload never completed or aborted)."""
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(os.urandom(11 * 1024 * 1024 + 5))
    store = await S3ObjectStore(bucket, "wal", s3.endpoint_url, part_size=5 * 1024 * 1024).open()
    try:
        assert await store.put_file("t/0/seg.log", segment) == segment.stat().st_size
        assert await store.get("t/0/seg.log") == segment.read_bytes()
        head = await store._client.head_object(Bucket=bucket, Key="wal/t/0/seg.log")
        assert head["ETag"].strip('"').endswith("-3")  # a multipart object's ETag: <md5>-<parts>
        failing = await S3ObjectStore(bucket, "wal", s3.endpoint_url, part_size=4 << 20).open()
        try:  # parts under S3's 5 MiB minimum: completing the upload fails
            with pytest.raises(StorageError, match="multipart put"):
                await failing.put_file("t/0/small-parts.log", segment)
        finally:
            await failing.close()
        pending = await store._client.list_multipart_uploads(Bucket=bucket)
        assert pending.get("Uploads", []) == []
        assert [o.key for o in await store.list("t/")] == ["t/0/seg.log"]
    finally:
        await store.close()


async def test_local_put_file_links_on_the_same_file_system_and_copies_otherwise(
    tmp_path: Path,
) -> None:
    """With `link`, a sealed segment becomes the object without its bytes being written again;
    without it, or from another file system (a tmpfs), the object is a copy of its own."""
    segment = tmp_path / "wal" / "00000000000000000000.log"
    segment.parent.mkdir()
    segment.write_bytes(os.urandom(100_000))
    linked = LocalObjectStore(tmp_path / "linked", link=True)
    await linked.put_file("t/0/a.log", segment)
    assert (tmp_path / "linked/t/0/a.log").stat().st_ino == segment.stat().st_ino
    copied = LocalObjectStore(tmp_path / "copied", link=False)
    await copied.put_file("t/0/a.log", segment)
    assert (tmp_path / "copied/t/0/a.log").stat().st_ino != segment.stat().st_ino
    assert (tmp_path / "copied/t/0/a.log").read_bytes() == segment.read_bytes()
    shm = Path("/dev/shm")
    assert shm.stat().st_dev != tmp_path.stat().st_dev, "needs /dev/shm on another file system"
    elsewhere = shm / f"headwater-test-{os.getpid()}-{tmp_path.name}"
    try:
        await LocalObjectStore(elsewhere, link=True).put_file("t/0/a.log", segment)
        assert (elsewhere / "t/0/a.log").read_bytes() == segment.read_bytes()
        assert [p.name for p in (elsewhere / "t/0").iterdir()] == ["a.log"]  # no temporary left
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


async def test_a_copy_onto_a_full_disk_fails_leaves_nothing_and_succeeds_once_there_is_room(
    tmp_path: Path,
) -> None:
    """The uploader retries a StorageError; a half-written temporary file left by each attempt
    would fill the store's disk for good."""
    root = tmp_path / "objects"
    root.mkdir()
    with small_tmpfs(root, "1m"):
        segment = tmp_path / "00000000000000000000.log"
        segment.write_bytes(os.urandom(3 * 1024 * 1024))
        store = LocalObjectStore(root)
        with pytest.raises(StorageError, match="No space left"):
            await store.put_file("t/0/seg.log", segment)
        assert [p for p in root.rglob("*") if p.is_file()] == []
        subprocess.run(["mount", "-o", "remount,size=8m", str(root)], check=True)
        assert await store.put_file("t/0/seg.log", segment) == 3 * 1024 * 1024
        assert await store.get("t/0/seg.log") == segment.read_bytes()


_KILLED_MID_PUT = """
import os, sys
from pathlib import Path
from headwater.storage.objectstore import LocalObjectStore

def fill(temporary):
    with temporary.open("wb") as file:
        file.write(b"x" * 65536)
        file.flush()
        os.fsync(file.fileno())
    print("filling", flush=True)
    sys.stdin.read()  # held mid-put until killed

store = LocalObjectStore(Path(sys.argv[1]))
store._store(store._path("t/0/00000000000000000000.log"), fill, False)
"""


def _kill_mid_put(root: Path) -> Path:
    """A process killed (SIGKILL) in the middle of a put into `root`: returns the temporary file
    it left."""
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_MID_PUT, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "filling\n"
    finally:
        child.kill()
        child.wait(timeout=30)
    (left,) = (root / "t/0").iterdir()
    return left


def test_a_put_killed_midway_leaves_a_temporary_that_is_removed_once_old(tmp_path: Path) -> None:
    """What a server killed mid-put leaves is never listed, and the sweep deletes it once its
    inode has not changed for `older_than`; a fresh one (another broker's put in progress on a
    shared directory looks the same) is kept, and so are objects and other dot files."""
    root = tmp_path / "objects"
    left = _kill_mid_put(root)
    assert left.name.startswith(".00000000000000000000.log.") and left.name.endswith(".tmp")
    store = LocalObjectStore(root)
    asyncio.run(store.put("t/0/00000000000000000100.log", b"kept"))
    (root / "t/0/.not-ours.tmp").write_bytes(b"")
    assert [o.key for o in asyncio.run(store.list(""))] == ["t/0/00000000000000000100.log"]

    assert store.remove_abandoned(older_than=600) == 0  # unchanged for less than that
    assert left.exists()
    assert store.remove_abandoned(older_than=600, now=time.time() + 601) == 1
    assert not left.exists()
    assert sorted(p.name for p in (root / "t/0").iterdir()) == [
        ".not-ours.tmp",
        "00000000000000000100.log",
    ]


@pytest.mark.parametrize("abandoned_after_s", [None, 0])
async def test_the_server_removes_abandoned_temporaries_at_start(
    tmp_path: Path, abandoned_after_s: int | None
) -> None:
    """A server restarted after a kill mid-put deletes the put's temporary file when it is older
    than object_store.abandoned_after_s (default 600 s: kept here, it is seconds old)."""
    left = _kill_mid_put(tmp_path / "data" / "objects")
    config = tmp_path / "headwater.toml"
    lines = ["[object_store]"]
    if abandoned_after_s is not None:
        lines.append(f"abandoned_after_s = {abandoned_after_s}")
    config.write_text("\n".join(lines) + "\n")
    server = ServerProcess(tmp_path / "data", extra_args=("--config", str(config))).start()
    try:
        async with await headwater.connect(server.address) as client:
            await client.server_info()  # answered: the start (and its sweep) is over
        assert left.exists() == (abandoned_after_s is None)
    finally:
        server.stop()


def test_abandoned_after_s_loads_and_must_not_be_negative(tmp_path: Path) -> None:
    from headwater.server.config_file import ConfigError, load_config

    path = tmp_path / "headwater.toml"
    path.write_text("[object_store]\nabandoned_after_s = 30\n")
    assert load_config(path).object_store.abandoned_after_s == 30.0
    path.write_text("[object_store]\nabandoned_after_s = -1\n")
    with pytest.raises(ConfigError, match=r"object_store\.abandoned_after_s must be >= 0"):
        load_config(path)


def test_a_copy_reaches_the_disk_in_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local store's copy of a 64 MiB segment, flushed whole, held the disk for tens of
    milliseconds, and every WAL fsync waited behind it: it is synced every COPY_STEP bytes."""
    source = tmp_path / "segment.log"
    source.write_bytes(os.urandom(3 * COPY_STEP + 5))
    synced: list[int] = []
    real_fdatasync = os.fdatasync

    def counting_fdatasync(fd: int) -> None:
        synced.append(os.fstat(fd).st_size)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", counting_fdatasync)
    copy_durably(source, tmp_path / "copy.log")
    assert synced == [COPY_STEP, 2 * COPY_STEP, 3 * COPY_STEP, 3 * COPY_STEP + 5]
    assert (tmp_path / "copy.log").read_bytes() == source.read_bytes()


def _s3_config(tmp_path: Path, s3: MotoS3, bucket: str) -> Path:
    config = tmp_path / "headwater.toml"
    lines = [
        "[object_store]",
        'backend = "s3"',
        f'bucket = "{bucket}"',
        'prefix = "wal"',
        f'endpoint_url = "{s3.endpoint_url}"',
        "retry_initial_ms = 100",
        "retry_max_ms = 500",
    ]
    config.write_text("\n".join(lines) + "\n")
    return config


def _s3_server(tmp_path: Path, s3: MotoS3, bucket: str) -> ServerProcess:
    """A server whose object store is the test's bucket on moto."""
    config = _s3_config(tmp_path, s3, bucket)
    server = ServerProcess(tmp_path / "data", extra_args=("--config", str(config)), env=CREDENTIALS)
    return server.start()


async def _objects(s3: MotoS3, bucket: str) -> list[str]:
    store = await S3ObjectStore(bucket, "wal", s3.endpoint_url).open()
    try:
        return [o.key for o in await store.list("")]
    finally:
        await store.close()


async def _wait_for(predicate, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.1)


async def _produce_each(client: headwater.Client, topic: str, values: list[bytes]) -> None:
    producer = client.producer(topic)
    for value in values:  # one batch per value, so segments roll often
        await (await producer.send(value))


async def test_local_deletes_leave_no_empty_directories_and_race_no_put(tmp_path: Path) -> None:
    """Retention on the local backend left an empty directory for every prefix it emptied (each
    superseded snapshot's horizon directory); a put racing the delete of its directory's last
    object still lands."""
    root = tmp_path / "objects"
    store = LocalObjectStore(root)
    await store.put("snapshots/t/0/100/part-0.parquet", b"a")
    await store.put("snapshots/t/0/100/manifest.json", b"m")
    await store.put("snapshots/t/0/200/part-0.parquet", b"b")
    await store.delete("snapshots/t/0/100/part-0.parquet")
    assert (root / "snapshots/t/0/100").is_dir()  # still holds the manifest
    await store.delete("snapshots/t/0/100/manifest.json")
    assert not (root / "snapshots/t/0/100").exists()
    assert (root / "snapshots/t/0/200").is_dir()
    await store.delete("snapshots/t/0/200/part-0.parquet")
    assert [p for p in root.rglob("*")] == [] and root.is_dir()  # the root itself stays
    for round_ in range(50):  # a put and the delete of the directory's last object, at once
        await store.put("t/0/old.log", b"x")
        await asyncio.gather(store.delete("t/0/old.log"), store.put(f"t/0/{round_}.log", b"y"))
        assert await store.get(f"t/0/{round_}.log") == b"y"
        await store.delete(f"t/0/{round_}.log")


async def test_local_list_skips_an_object_deleted_while_it_lists(tmp_path: Path) -> None:
    """A delete between the directory walk and the size's stat made LIST fail with
    FileNotFoundError (a take-over's manifest claim, racing the removal of an old version). A
    dangling symlink is such a name, every time: listed by the walk, gone for the stat."""
    store = LocalObjectStore(tmp_path / "objects")
    await store.put("t/0/manifest/00000000000000000002", b"kept")
    (tmp_path / "objects/t/0/manifest/00000000000000000001").symlink_to(tmp_path / "gone")
    listed = await store.list("t/0/manifest/")
    assert [(o.key, o.size) for o in listed] == [("t/0/manifest/00000000000000000002", 4)]


async def test_segments_upload_and_replay_from_s3_after_local_deletion(
    tmp_path: Path, s3: MotoS3, bucket: str
) -> None:
    server = _s3_server(tmp_path, s3, bucket)
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic(
                "cloud",
                dispatch="reliable",
                configs={"segment.bytes": 1024, "retention.bytes": 0, "fsync": "never"},
            )
            values = [f"value-{i:04d}-{'x' * 60}".encode() for i in range(120)]
            await _produce_each(client, "cloud", values)

            async def uploaded_and_trimmed() -> bool:
                keys = await _objects(s3, bucket)
                local = list((tmp_path / "data" / "topics" / "cloud" / "0").glob("*.log"))
                return len([k for k in keys if k.endswith(".log")]) >= 5 and len(local) <= 2

            await _wait_for(uploaded_and_trimmed)
            keys = await _objects(s3, bucket)
            assert all(k.startswith("cloud/0/") for k in keys)
            assert any(k.endswith(".index") for k in keys)
            description = await client.describe_topic("cloud")
            assert description.start_offsets == (0,)  # history still reachable, from S3
            local_start = min(
                int(p.name[:20])
                for p in (tmp_path / "data" / "topics" / "cloud" / "0").glob("*.log")
            )
            assert local_start > 0, "local segments should have been deleted after upload"

            consumer = await client.subscribe("cloud", "replay", start="earliest", prefetch=50)
            # producers keep writing while the consumer replays from S3, then the local WAL,
            # then the live tail: by offset, with no gap and no duplicate at the hand-offs
            live = [f"live-{i:03d}".encode() for i in range(80)]
            writer = asyncio.create_task(_produce_each(client, "cloud", live))
            received = []
            while len(received) < len(values) + len(live):
                message = await consumer.receive(timeout=30)
                received.append(message)
                await message.ack()
            await writer
            assert [m.value for m in received] == values + live
            assert [m.offset for m in received] == list(range(len(values) + len(live)))
            with pytest.raises(TimeoutError):  # and nothing twice
                await consumer.receive(timeout=0.5)
    finally:
        server.stop()
    assert "Traceback" not in server.log()


async def test_uploader_survives_the_object_store_going_down(
    tmp_path: Path, s3: MotoS3, bucket: str
) -> None:
    server = _s3_server(tmp_path, s3, bucket)
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic(
                "outage", dispatch="reliable", configs={"segment.bytes": 1024, "fsync": "never"}
            )
            s3.stop()
            try:
                values = [f"during-outage-{i:03d}-{'y' * 60}".encode() for i in range(60)]
                await _produce_each(client, "outage", values)  # producers are not blocked

                async def retrying() -> bool:
                    return "upload.retry" in server.log()

                await _wait_for(retrying)
            finally:
                s3.start()
                await create_bucket(s3, bucket)  # moto starts empty

            sealed = len(list((tmp_path / "data" / "topics" / "outage" / "0").glob("*.log"))) - 1

            async def caught_up() -> bool:
                keys = await _objects(s3, bucket)
                return len([k for k in keys if k.endswith(".log")]) >= sealed

            await _wait_for(caught_up, timeout=30)
            consumer = await client.subscribe("outage", "check", start="earliest", prefetch=100)
            received = [await consumer.receive(timeout=30) for _ in values]
            assert [m.value for m in received] == values
    finally:
        server.stop()


async def test_graceful_shutdown_uploads_the_active_segment(
    tmp_path: Path, s3: MotoS3, bucket: str
) -> None:
    server = _s3_server(tmp_path, s3, bucket)
    async with await headwater.connect(server.address) as client:
        await client.create_topic("bye", dispatch="reliable")
        await _produce_each(client, "bye", [b"last words"])
    assert await _objects(s3, bucket) == []  # one small active segment: nothing sealed yet
    assert server.stop() == 0
    assert await _objects(s3, bucket) == [
        "bye/0/00000000000000000000.index",
        "bye/0/00000000000000000000.log",
    ]


async def test_deleting_a_topic_removes_its_objects_and_a_new_one_inherits_nothing(
    fresh_server: ServerProcess,
) -> None:
    """A re-created name is a new topic: none of the old topic's archived segments may be
    served to it, and the deleted topic's objects leave the store."""
    objects = fresh_server.data_dir / "objects" / "reborn"
    settings = {"segment.bytes": 1024, "retention.bytes": 0, "fsync": "never"}
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("reborn", dispatch="reliable", configs=settings)
        await _produce_each(client, "reborn", [f"old-{i:03d}".encode() * 20 for i in range(40)])
        await eventually(  # sealed segments upload in the background
            lambda: len(_segment_objects(objects)) >= 3, what="three uploaded segments"
        )
        await client.delete_topic("reborn")
        await client.create_topic("reborn", dispatch="reliable", configs=settings)
        await _produce_each(client, "reborn", [b"new-0", b"new-1"])
        consumer = await client.subscribe("reborn", "reader", start="earliest")
        received = [(await consumer.receive(timeout=30)).value for _ in range(2)]
        assert received == [b"new-0", b"new-1"]
    await eventually(  # the purge runs in the uploader's queue, after the delete answered
        lambda: not [p for p in _segment_objects(objects) if int(p.name[:20]) > 1],
        what="the deleted topic's objects leaving the store",
    )


def _segment_objects(root: Path) -> list[Path]:
    """The segment objects under `root`, read while the uploader writes and the purge deletes:
    os.walk passes over a folder that vanishes mid-walk, where Path.rglob raised
    FileNotFoundError (a stress run, 2026-11-26)."""
    return [
        Path(folder) / name
        for folder, _, names in os.walk(root)
        for name in names
        if name.endswith(".log")
    ]


class _GatedStore(LocalObjectStore):
    """A real local store whose puts wait until released: holds an upload in flight."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def put(self, key: str, data: bytes) -> None:
        self.entered.set()
        await self.release.wait()
        await super().put(key, data)


async def test_an_upload_finishing_after_its_topic_was_deleted_is_not_recorded(
    tmp_path: Path,
) -> None:
    from headwater.storage.logstate import SealedSegment
    from headwater.storage.state import UPLOAD, StateStore
    from headwater.storage.uploader import Uploader

    state = StateStore(tmp_path / "state")
    store = _GatedStore(tmp_path / "objects")
    uploader = Uploader(store, state)
    uploader.start()
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(b"x" * 10)
    uploader.enqueue("t", 0, SealedSegment(0, 5, segment, 10))
    await asyncio.wait_for(store.entered.wait(), 5)
    uploader.forget_topic("t")  # deleted while its segment is being uploaded
    store.release.set()
    assert await uploader.drain(5)
    assert not uploader.holds("t", 0, 0, 5)
    assert list(state.scan(UPLOAD)) == []
    assert await store.list("t/") == []
    await uploader.close()
    state.close()


def values(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i:04d}-{'x' * 40}".encode() for i in range(count)]


def test_data_dir_usage_counts_a_segment_and_its_linked_object_once(tmp_path: Path) -> None:
    """SERVER_INFO's data_dir_bytes: a linked object is the segment's disk, not more of it."""
    segment = tmp_path / "topics" / "t" / "0" / "00000000000000000000.log"
    segment.parent.mkdir(parents=True)
    segment.write_bytes(b"x" * 100_000)
    (tmp_path / "objects").mkdir()
    os.link(segment, tmp_path / "objects" / "00000000000000000000.log")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "000001.sst").write_bytes(b"y" * 1_000)
    assert disk_usage(tmp_path) == 101_000


async def test_linked_segments_are_the_objects_and_outlive_local_retention(tmp_path: Path) -> None:
    """`object_store.link = true`: an uploaded segment is its object's file (one inode), and
    once retention has deleted the segment the object still serves every acknowledged record."""
    config = tmp_path / "headwater.toml"
    config.write_text('[object_store]\nbackend = "local"\nlink = true\n')
    server = ServerProcess(tmp_path / "data", extra_args=("--config", str(config))).start()
    objects = server.data_dir / "objects"
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic(
                "kept", dispatch="reliable", configs={"segment.bytes": 2048, "fsync": "always"}
            )
            kept, errors = await produce_each(client, "kept", values("kept", 120))
            assert not errors
            local = sorted(partition_dir(server, "kept").glob("*.log"))[:-1]  # the sealed ones
            assert len(local) >= 3

            def uploaded() -> bool:
                return all((objects / "kept/0" / path.name).exists() for path in local)

            await eventually(uploaded, what="the sealed segments uploaded")
            for path in local:
                assert (objects / "kept/0" / path.name).stat().st_ino == path.stat().st_ino
            await client.create_topic(
                "gone",
                dispatch="reliable",
                configs={"segment.bytes": 2048, "retention.bytes": 0, "fsync": "always"},
            )
            acked, errors = await produce_each(client, "gone", values("gone", 200))
            assert not errors
            await eventually(
                lambda: len(list(partition_dir(server, "gone").glob("*.log"))) <= 2,
                what="retention deleting the uploaded segments",
            )
            assert await read_from_earliest(client, "gone", "replay", len(acked)) == acked
            assert await read_from_earliest(client, "kept", "replay", len(kept)) == kept
    finally:
        server.kill()


async def _produce_until_killed(
    client: headwater.Client,
    tag: str,
    acked: dict[int, bytes],
    target: int,
    kill_now: asyncio.Event,
    pad: int = 60,
) -> None:
    """One record a batch, without retries, into `acked` until the server is gone; `kill_now`
    is set once `acked` holds `target` records."""
    producer = client.producer(
        "linked", delivery=headwater.AtLeastOnce(headwater.RetryPolicy(max_retries=0))
    )
    for number in range(100_000):  # bounded; the kill ends it long before
        value = f"{tag}-{number:06d}-{'x' * pad}".encode()
        try:
            metadata = await (await producer.send(value))
        except (headwater.HeadwaterError, OSError):
            return  # killed
        assert metadata.offset is not None and metadata.offset not in acked
        acked[metadata.offset] = value
        if len(acked) >= target:
            kill_now.set()


@pytest.mark.parametrize(
    ("link", "segment_bytes", "pad", "per_kill"),
    [(True, 4096, 60, (100, 400)), (False, 5 * RELEASE_STEP // 4, 2000, (1500, 3000))],
    ids=["linked", "copied-and-freed-in-steps"],
)
async def test_retention_keeps_every_acknowledged_record_across_kill_9(
    tmp_path: Path, link: bool, segment_bytes: int, pad: int, per_kill: tuple[int, int]
) -> None:
    """Retention under load: three connections produce to a topic whose segments are deleted
    locally once uploaded, and the server is killed with SIGKILL after a random count of
    acknowledgements, three times. Every acknowledged record is then read back once, from the
    objects that outlived their segments and from the WAL. Linked: `object_store.link = true`,
    4 KiB segments uploaded as links. Copied: segments over `RELEASE_STEP`, whose blocks are
    freed a step at a time after their deletion (kills land in the middle of that too)."""
    rng = random.Random(int(os.environ.get("HEADWATER_ATTACK_SEED", random.randrange(2**32))))
    config = tmp_path / "headwater.toml"
    config.write_text(f'[object_store]\nbackend = "local"\nlink = {str(link).lower()}\n')
    server = ServerProcess(tmp_path / "data", extra_args=("--config", str(config)))
    acked: dict[int, bytes] = {}
    try:
        for cycle in range(3):
            server.start()
            kill_now = asyncio.Event()
            target = len(acked) + rng.randrange(*per_kill)
            async with await headwater.connect(server.address) as client:
                if cycle == 0:
                    await client.create_topic(
                        "linked",
                        dispatch="reliable",
                        configs={
                            "segment.bytes": segment_bytes,
                            "retention.bytes": 2 * segment_bytes,
                        },
                    )
                producers = [
                    asyncio.ensure_future(
                        _produce_until_killed(client, f"{cycle}{tag}", acked, target, kill_now, pad)
                    )
                    for tag in "abc"
                ]
                killing = asyncio.ensure_future(kill_now.wait())
                await asyncio.wait([killing, *producers], return_when=asyncio.FIRST_COMPLETED)
                killing.cancel()
                assert kill_now.is_set(), "the producers stopped before the kill"
                server.kill()
                await asyncio.gather(*producers, return_exceptions=True)
        server.start()
        local = partition_dir(server, "linked")
        await eventually(
            lambda: len(list(local.glob("*.log"))) <= 3,
            what="the segments uploaded and deleted locally",
        )
        objects = server.data_dir / "objects" / "linked" / "0"
        assert len(list(objects.glob("*.log"))) >= 5
        async with await headwater.connect(server.address) as client:
            end, errors = await produce_each(client, "linked", [b"end"])
            assert not errors
            received = await read_from_earliest(client, "linked", "check", until=max(end))
        lost = {offset for offset in acked if received.get(offset) != acked[offset]}
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged records lost or changed"
    finally:
        server.kill()
