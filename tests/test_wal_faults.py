"""The partition WAL under disk faults, injected through its file-ops seam (`storage.fileio`).

Each test replaces the real `FileOps` with one that fails where a real disk does: a short write,
ENOSPC, EIO, a failing fsync or truncate. The files are real; only the failing call is simulated.
What must hold: nothing acknowledged is lost, a failed append leaves no byte behind, an offset is
never given twice (also after a restart), and a failed fsync takes the partition offline.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from headwater.storage import syncer as syncer_module
from headwater.storage import wal as wal_module
from headwater.storage.fileio import BOOT_ID_ENV, RELEASE_STEP, FileOps, remove_tree
from headwater.storage.offsets import MAX_LEASE_BLOCK
from headwater.storage.reader import SegmentRead, read_batches
from headwater.storage.segments import scan_segment, segment_name
from headwater.storage.wal import FsyncPolicy, LogConfig, PartitionLog
from headwater.wire.errors import PartitionOffline, StorageError
from headwater.wire.records import build_batch, read_records
from tests.support.helpers import eventually


class FaultyOps(FileOps):
    """Real file operations, except the ones a test schedules to fail."""

    def __init__(self) -> None:
        # what each write call does, in order: "ok", "half", "enospc", "eio" or "zero"
        self.writes: list[str] = []
        self.fail_fsync = False
        self.fail_truncate = False
        self.fsyncs = 0
        self.directory_fsyncs = 0
        self.directory_events: list[tuple[str, str, int]] = []  # (call, name, thread)

    def write(self, fd: int, data: memoryview) -> int:
        action = self.writes.pop(0) if self.writes else "ok"
        if action == "half":
            return os.write(fd, data[: max(1, len(data) // 2)])
        if action == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device")
        if action == "eio":
            raise OSError(errno.EIO, "Input/output error")
        if action == "zero":
            return 0
        return os.write(fd, data)

    def truncate(self, fd: int, length: int) -> None:
        if self.fail_truncate:
            raise OSError(errno.EIO, "Input/output error")
        os.ftruncate(fd, length)

    def fsync(self, fd: int, path: Path) -> None:
        self.fsyncs += 1
        if self.fail_fsync:
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)

    def fsync_directory(self, directory: Path) -> None:
        self.directory_fsyncs += 1
        self.directory_events.append(("fsync", directory.name, threading.get_ident()))
        super().fsync_directory(directory)

    def remove(self, path: Path) -> None:
        self.directory_events.append(("remove", path.name, threading.get_ident()))
        super().remove(path)

    def detach(self, path: Path) -> int | None:
        self.directory_events.append(("detach", path.name, threading.get_ident()))
        return super().detach(path)


def batch(*values: bytes) -> bytes:
    return build_batch([(None, v, []) for v in values])


async def read_all(log: PartitionLog) -> list[tuple[int, bytes | None]]:
    out: list[tuple[int, bytes | None]] = []
    offset = log.start_offset
    for _ in range(10_000):
        batches = await log.read(offset)
        if not batches:
            return out
        for data in batches:
            for record in read_records(data):
                if record.offset >= offset:
                    out.append((record.offset, record.value))
            offset = read_records(data)[-1].offset + 1
    raise AssertionError("read_all did not finish")


async def abandon(log: PartitionLog) -> None:
    """What kill -9 does to a log: nothing is closed, nothing more is written."""
    log.syncer.halt()


@pytest.mark.parametrize("fault", [["half", "enospc"], ["enospc"], ["eio"], ["half", "zero"]])
async def test_failed_append_leaves_nothing_behind_and_later_appends_work(
    tmp_path: Path, fault: list[str]
) -> None:
    ops = FaultyOps()
    log = PartitionLog.open(tmp_path, LogConfig(fsync=FsyncPolicy.ALWAYS), ops=ops)
    log.start()
    acked: dict[int, bytes] = {}
    for i in range(5):
        base, sequence = log.append(batch(f"before{i}".encode()), 1)
        await log.wait_durable(sequence)
        acked[base] = f"before{i}".encode()
    size = (tmp_path / segment_name(0)).stat().st_size
    ops.writes = list(fault)
    with pytest.raises(StorageError) as raised:
        log.append(batch(b"x" * 5000), 1)
    assert raised.value.retriable
    assert (tmp_path / segment_name(0)).stat().st_size == size, "a partial batch stayed behind"
    assert log.next_offset == 5
    for i in range(5):  # the disk is back
        base, sequence = log.append(batch(f"after{i}".encode()), 1)
        await log.wait_durable(sequence)
        acked[base] = f"after{i}".encode()
    assert dict(await read_all(log)) == acked
    assert scan_segment(tmp_path / segment_name(0)).problem is None
    await abandon(log)  # kill -9
    reopened = PartitionLog.open(tmp_path, LogConfig())
    assert dict(await read_all(reopened)) == acked
    assert reopened.append(batch(b"new"), 1)[0] >= 10  # at the lease: a kill leaves a gap
    await reopened.close()
    await log.close()


async def test_failed_truncate_after_a_failed_write_takes_the_partition_offline(
    tmp_path: Path,
) -> None:
    ops = FaultyOps()
    log = PartitionLog.open(tmp_path, LogConfig(fsync=FsyncPolicy.ALWAYS), ops=ops)
    log.start()
    _, sequence = log.append(batch(b"kept"), 1)
    await log.wait_durable(sequence)
    ops.writes = ["half", "eio"]
    ops.fail_truncate = True
    with pytest.raises(PartitionOffline):
        log.append(batch(b"y" * 3000), 1)
    with pytest.raises(PartitionOffline):
        log.append(batch(b"z"), 1)
    assert log.failed is not None and "could not be removed" in log.failed
    await log.close()
    # the restart's recovery scan cuts the torn bytes; what was acked is there
    reopened = PartitionLog.open(tmp_path, LogConfig())
    assert await read_all(reopened) == [(0, b"kept")]
    assert reopened.append(batch(b"next"), 1)[0] >= 1
    await reopened.close()


async def test_failed_fsync_fails_the_partition_and_is_never_retried(tmp_path: Path) -> None:
    ops = FaultyOps()
    log = PartitionLog.open(tmp_path, LogConfig(fsync=FsyncPolicy.ALWAYS), ops=ops)
    log.start()
    _, sequence = log.append(batch(b"durable"), 1)
    await log.wait_durable(sequence)
    ops.fail_fsync = True
    fsyncs_before = ops.fsyncs
    _, sequence = log.append(batch(b"pending"), 1)
    with pytest.raises(PartitionOffline):
        await asyncio.wait_for(log.wait_durable(sequence), 5)
    assert log.failed is not None and "fsync failed" in log.failed
    assert log.durable_offset == 1  # no ack, and no consumer, ever sees "pending"
    assert log.visible_offset == 1
    with pytest.raises(PartitionOffline):
        log.append(batch(b"refused"), 1)
    with pytest.raises(PartitionOffline):
        await log.wait_durable(sequence)
    ops.fail_fsync = False  # the disk "recovers": a later fsync would prove nothing
    await asyncio.sleep(0.05)
    assert ops.fsyncs == fsyncs_before + 1, "a failed fsync was retried"
    await log.close()
    reopened = PartitionLog.open(tmp_path, LogConfig())
    assert (await read_all(reopened))[0] == (0, b"durable")
    assert reopened.append(batch(b"new"), 1)[0] >= 2  # offset 1 was handed out
    await reopened.close()


async def test_fsync_always_consumers_see_only_what_an_fsync_covers(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, LogConfig(fsync=FsyncPolicy.ALWAYS))
    interval = PartitionLog.open(tmp_path / "i", LogConfig(fsync=FsyncPolicy.INTERVAL))
    log.start()
    _, sequence = log.append(batch(b"a"), 1)
    interval.append(batch(b"a"), 1)
    assert log.visible_offset == 0  # appended, not yet durable
    assert interval.visible_offset == 1  # interval/never: visible once written
    await log.wait_durable(sequence)
    assert log.visible_offset == 1
    await log.close()
    await interval.close()


async def test_directories_are_fsynced_after_segment_create_and_delete(tmp_path: Path) -> None:
    ops = FaultyOps()
    log = PartitionLog.open(tmp_path, LogConfig(segment_bytes=1024), ops=ops)
    log.start()
    before = ops.directory_fsyncs
    for i in range(3):
        _, sequence = log.append(batch(f"{i}".encode() * 1000), 1)
        await log.wait_durable(sequence)
    assert len(list(tmp_path.glob("*.log"))) == 3
    assert ops.directory_fsyncs >= before + 2
    for _ in range(100):
        if log.sealed_segments():
            break
        await asyncio.sleep(0.01)
    before = ops.directory_fsyncs
    ops.directory_events.clear()
    assert log.delete_segment(0)
    _, sequence = log.append(batch(b"x"), 1)
    await log.wait_durable(sequence)
    assert ops.directory_fsyncs > before
    # the files went in a pool thread (unlinking a 64 MiB segment held the loop 10-20 ms),
    # before the directory fsync that makes their removal durable
    assert not (tmp_path / segment_name(0)).exists()
    calls = [(call, name) for call, name, _ in ops.directory_events]
    assert calls[:3] == [
        ("remove", segment_name(0).replace(".log", ".index")),
        ("detach", segment_name(0)),
        ("fsync", tmp_path.name),
    ], calls
    assert threading.get_ident() not in {thread for _, _, thread in ops.directory_events}
    await log.close()


async def test_offsets_are_not_reused_after_a_power_loss_took_the_unsynced_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsync=never acks what is only in the page cache; a power cut takes it. The restart (a new
    boot) continues above every offset handed out, so none is given to two messages."""
    monkeypatch.setenv(BOOT_ID_ENV, "boot-1")
    log = PartitionLog.open(tmp_path, LogConfig(fsync=FsyncPolicy.NEVER))
    log.start()
    handed_out = [log.append(batch(f"v{i}".encode()), 1)[0] for i in range(100)]
    await abandon(log)
    segment = tmp_path / segment_name(0)
    size = segment.stat().st_size
    with segment.open("r+b") as file:  # the power cut: half the unsynced data is gone
        file.truncate(size // 2)
    monkeypatch.setenv(BOOT_ID_ENV, "boot-2")
    reopened = PartitionLog.open(tmp_path, LogConfig(fsync=FsyncPolicy.NEVER))
    reopened.start()
    new = [reopened.append(batch(f"n{i}".encode()), 1)[0] for i in range(10)]
    assert min(new) > max(handed_out)
    records = await read_all(reopened)
    assert len({o for o, _ in records}) == len(records)
    assert [o for o, v in records if v is not None and v.startswith(b"n")] == new
    await reopened.close()
    await log.close()


async def test_a_killed_process_restarts_at_the_lease_and_keeps_every_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same boot: the page cache kept every completed write, so every record is there; appends
    continue at the lease all the same (a gap of at most one block), since what is left of the
    tail cannot tell which offsets were handed out (tests/test_offset_reuse.py)."""
    monkeypatch.setenv(BOOT_ID_ENV, "boot-1")
    log = PartitionLog.open(tmp_path, LogConfig(fsync=FsyncPolicy.NEVER))
    log.start()
    for i in range(50):
        log.append(batch(f"v{i}".encode()), 1)
    await abandon(log)
    reopened = PartitionLog.open(tmp_path, LogConfig())
    assert 50 <= reopened.next_offset <= 50 + MAX_LEASE_BLOCK
    assert await read_all(reopened) == [(i, f"v{i}".encode()) for i in range(50)]
    await reopened.close()
    await log.close()


@pytest.mark.parametrize("policy", [FsyncPolicy.NEVER, FsyncPolicy.ALWAYS])
async def test_close_fsyncs_what_no_fsync_covered_and_nothing_more(
    tmp_path: Path, policy: FsyncPolicy
) -> None:
    """A clean close makes every append durable with one fsync, and spends none on a segment an
    fsync already covers (a shutdown with 10,000 idle partitions paid one each)."""
    ops = FaultyOps()
    log = PartitionLog.open(tmp_path, LogConfig(fsync=policy), ops=ops)
    log.start()
    _, sequence = log.append(batch(b"kept"), 1)
    if policy == FsyncPolicy.ALWAYS:
        await log.wait_durable(sequence)
    before = ops.fsyncs
    await log.close()
    assert ops.fsyncs - before == (0 if policy == FsyncPolicy.ALWAYS else 1)
    reopened = PartitionLog.open(tmp_path, LogConfig())
    assert await read_all(reopened) == [(0, b"kept")]
    await reopened.close()


class ReleaseRecorder(FileOps):
    """Real file operations that note each length a released segment is cut to."""

    def __init__(self) -> None:
        self.cuts: list[int] = []
        self.released = threading.Event()

    def truncate(self, fd: int, length: int) -> None:
        self.cuts.append(length)
        super().truncate(fd, length)

    def release(self, fd: int) -> None:
        super().release(fd)
        self.released.set()


def _open_deleted(directory: Path) -> list[str]:
    """This process's descriptors on deleted files of `directory`."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(directory)) and target.endswith("(deleted)"):
                found.append(target)
    return found


async def _log_with_sealed_segment(
    tmp_path: Path, ops: FileOps, sealed: int = 1
) -> tuple[PartitionLog, int]:
    """A log whose first `sealed` segments (about 3 MiB each, five batches) are sealed; returns
    it and the first segment's size."""
    config = LogConfig(segment_bytes=3 << 20, fsync=FsyncPolicy.ALWAYS, tail_cache_bytes=0)
    log = PartitionLog.open(tmp_path, config, ops=ops)  # no tail cache: reads go to the file
    log.start()
    value = os.urandom(600_000)
    for _ in range(5 * sealed + 1):  # five batches fill a segment, the next one rolls it
        _, sequence = log.append(batch(value), 1)
        await log.wait_durable(sequence)
    await eventually(lambda: len(log.sealed_segments()) == sealed, what="the segments sealed")
    return log, (tmp_path / segment_name(0)).stat().st_size


def _held_read(entered: threading.Event, go_on: threading.Event) -> Callable[..., SegmentRead]:
    """`read_batches` as a read does it, holding its own descriptor (opened first, as the real
    read opens the file) until `go_on`; `entered` once it holds it."""

    def held_read(path: Path, *args: int) -> SegmentRead:
        with path.open("rb") as held:
            entered.set()
            go_on.wait(30)
            return read_batches(Path(f"/proc/self/fd/{held.fileno()}"), *args)

    return held_read


async def _releases_done() -> None:
    """Every release queued so far has ended (the release thread runs them in order)."""
    await asyncio.wrap_future(syncer_module._release_pool().submit(lambda: None))


async def test_a_deleted_segment_is_freed_a_mebibyte_at_a_time_after_its_round(
    tmp_path: Path,
) -> None:
    """Retention's unlink is a directory change in the round; the blocks go afterwards, in
    steps (freeing 64 MiB at once held every fsync on the disk for 10-15 ms), on another thread,
    and the descriptor is closed at the end."""
    ops = ReleaseRecorder()
    log, size = await _log_with_sealed_segment(tmp_path, ops)
    assert size > 2 * RELEASE_STEP
    assert log.delete_segment(0)
    _, sequence = log.append(batch(b"x"), 1)
    await log.wait_durable(sequence)
    assert not (tmp_path / segment_name(0)).exists()  # gone by the round that covered this
    await asyncio.to_thread(ops.released.wait, 30)
    expected = [*range(size - RELEASE_STEP, 0, -RELEASE_STEP), 0]
    assert ops.cuts == expected
    assert _open_deleted(tmp_path) == []
    await log.close()


async def test_a_deleted_segment_with_another_name_is_not_cut(tmp_path: Path) -> None:
    """A segment the local object store hard-linked (object_store.link) shares its blocks with
    the object: deleting the segment removes its name only, and the object keeps every byte."""
    ops = ReleaseRecorder()
    log, _ = await _log_with_sealed_segment(tmp_path, ops)
    linked = tmp_path / "object.log"
    os.link(tmp_path / segment_name(0), linked)
    before = linked.read_bytes()
    assert log.delete_segment(0)
    _, sequence = log.append(batch(b"x"), 1)
    await log.wait_durable(sequence)
    assert not (tmp_path / segment_name(0)).exists()
    assert linked.read_bytes() == before
    assert ops.cuts == []
    assert _open_deleted(tmp_path) == []
    await log.close()


async def test_a_deleted_segment_is_not_cut_under_a_read_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read runs in a worker thread on a descriptor of its own: the segment's blocks are freed
    only once every read in flight at its deletion has ended, so none sees the file shrink."""
    ops = ReleaseRecorder()
    log, _ = await _log_with_sealed_segment(tmp_path, ops)
    entered, go_on = threading.Event(), threading.Event()
    monkeypatch.setattr(wal_module, "read_batches", _held_read(entered, go_on))
    reading = asyncio.ensure_future(log.read(0))
    try:
        assert await asyncio.to_thread(entered.wait, 30)
        assert log.delete_segment(0)
        _, sequence = log.append(batch(b"x"), 1)
        await log.wait_durable(sequence)  # the deleting round is over
        await _releases_done()  # a release queued by that round would have run by now
        assert not ops.released.is_set()
        assert ops.cuts == []
    finally:
        go_on.set()
    first = await reading  # read whole: the descriptor it opened was not cut under it
    assert read_records(first[0])[0].value is not None
    await asyncio.to_thread(ops.released.wait, 30)
    assert ops.cuts[-1] == 0
    await log.close()


def test_a_deleted_topics_tree_is_freed_a_step_at_a_time(tmp_path: Path) -> None:
    """`remove_tree` (a deleted topic's directory) frees each large file in steps, leaves a
    file with another name (a hard-linked object) whole, and removes everything else."""
    topic = tmp_path / "topic"
    (topic / "0").mkdir(parents=True)
    big = os.urandom(3 * RELEASE_STEP + 5)
    (topic / "0" / segment_name(0)).write_bytes(big)
    (topic / "0" / segment_name(9)).write_bytes(big)
    (topic / "0" / "next_offset").write_bytes(b"small")
    os.link(topic / "0" / segment_name(9), tmp_path / "object.log")
    os.mkfifo(topic / "0" / "fifo")  # never opened for writing (that would wait for a reader)
    os.symlink(tmp_path / "object.log", topic / "0" / "link.log")  # not followed
    ops = ReleaseRecorder()
    remove_tree(topic, ops)
    assert not topic.exists()
    assert ops.cuts == [2 * RELEASE_STEP + 5, RELEASE_STEP + 5, 5, 0]  # one file, in steps
    assert (tmp_path / "object.log").read_bytes() == big
    assert _open_deleted(tmp_path) == []
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / segment_name(0)).write_bytes(big)
    (tmp_path / "linked-topic").symlink_to(elsewhere)
    remove_tree(tmp_path / "linked-topic", ops)  # as rmtree: not followed
    assert (elsewhere / segment_name(0)).read_bytes() == big


async def test_a_closed_logs_tree_is_not_cut_under_a_read_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic's deletion and a cluster take-over close the partition's log, then `remove_tree`
    its directory, freeing big segments in steps. `close` returns only once the reads in flight
    have ended, so none sees its segment shrink (found by review: the read reported damage and
    quarantined it)."""
    ops = ReleaseRecorder()
    log, _ = await _log_with_sealed_segment(tmp_path / "topic" / "0", ops)
    entered, go_on = threading.Event(), threading.Event()
    monkeypatch.setattr(wal_module, "read_batches", _held_read(entered, go_on))
    reading = asyncio.ensure_future(log.read(0))
    assert await asyncio.to_thread(entered.wait, 30)
    # a deletion: close, then remove the files. The read is let go when the close waits for
    # it (with no such wait the files are cut first, and the read meets the cut)
    waiting_for_reads = asyncio.Event()
    reads_ended = log._reads_ended

    async def noted_wait() -> None:
        waiting_for_reads.set()
        go_on.set()
        await reads_ended()

    monkeypatch.setattr(log, "_reads_ended", noted_wait)
    try:
        await log.close()
        await asyncio.to_thread(remove_tree, tmp_path / "topic", ops)
    finally:
        go_on.set()
    value_read = [r.value for r in read_records((await reading)[0]) if r.value is not None]
    assert waiting_for_reads.is_set()  # the close waited for the read
    assert log.quarantined == 0
    assert len(value_read) == 1 and len(value_read[0]) == 600_000
    assert not (tmp_path / "topic").exists()


def test_a_segment_is_deleted_when_it_cannot_be_opened(tmp_path: Path) -> None:
    """`detach` opens the segment to free it in steps; a deletion needs no descriptor and no
    write permission, so when the open fails (every descriptor taken here) the segment is
    unlinked as before (found by review: it stayed on disk, dropped from the log)."""
    path = tmp_path / segment_name(0)
    path.write_bytes(b"x" * (2 * RELEASE_STEP))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    fillers: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 8, hard))
    try:
        for _ in range(100_000):  # bounded: the limit is 8 above the highest fd in use
            try:
                fillers.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
        detached = FileOps().detach(path)
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert detached is None
    assert not path.exists()


async def test_releases_waiting_in_the_queue_hold_a_bounded_count_of_descriptors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each queued release holds its segment open. Past `MAX_QUEUED_RELEASES` (thousands of
    segments past retention at once, after a long stop) a deleted segment is freed at once
    instead of waiting open in the queue."""
    monkeypatch.setattr(syncer_module, "MAX_QUEUED_RELEASES", 1)
    ops = ReleaseRecorder()
    log, _ = await _log_with_sealed_segment(tmp_path, ops, sealed=2)
    busy = threading.Event()
    blocker = syncer_module._release_pool().submit(busy.wait, 30)  # the queue cannot drain
    try:
        assert log.delete_segment(0)
        assert log.delete_segment(5)
        _, sequence = log.append(batch(b"x"), 1)
        await log.wait_durable(sequence)  # one round deleted both
        assert not (tmp_path / segment_name(0)).exists()
        assert not (tmp_path / segment_name(5)).exists()
        assert len(_open_deleted(tmp_path)) == 1  # one queued; the other freed at once
    finally:
        busy.set()
    await asyncio.wrap_future(blocker)
    await _releases_done()
    assert ops.cuts[-1] == 0 and ops.cuts.count(0) == 1  # one released in steps
    assert _open_deleted(tmp_path) == []
    await log.close()
