"""Every fsync of a partition, in a worker thread, never on the event loop.

- `always`: group commit. An append asks for an fsync round at once; one round covers every batch
  appended before it started, and all their waiters wake together. Appends made while a round
  runs are covered by the next, which starts as soon as it ends.
- `interval`: a round runs `fsync_interval_ms` after the first append it will cover; producers do
  not wait for it.
- `never`: only sealing a segment fsyncs it (uploads need a stable file), and waiters
  (producers of fsynced isolation) get a round when they ask.

Before any data fsync, the partition directory is fsynced if a segment was created or deleted
since the last one: a new segment's name must be durable before its data can count as durable.
Rolled segments are sealed here (fsync, close, index) and reported to `on_sealed`; segments that
retention deletes are unlinked here, in the round that fsyncs the directory, but kept open: their
blocks are freed afterwards a mebibyte at a time (`FileOps.release`, on a thread of its own, once
the reads in flight when they were unlinked have ended), because freeing 64 MiB at once held every
fsync on the disk for 10-15 ms. The offset lease is extended here too: ahead of need, and at once
for an append that would outrun it (`leased`, the WAL's `lease_wait`): that append waits for the
lease job instead of writing the lease on the event loop, and the job goes before any round.

A syncer is a small state machine driven by callbacks, not a task: one job at a time runs in the
pool (a round, a seal, a lease write), and the job itself posts its outcome to the loop, which
starts the next job in the same callback. So an fsync round starts in the append that asks for
it, waiters wake in the first loop turn after the last fsync returns, and the next round starts
there too; a task would add a loop turn at each of these steps (the syncer's own wake-up, the
executor's future, the task's resumption), each as long as whatever else that turn runs. After a
round, pending seals and the lease go first, so a steady stream of rounds cannot starve them. An
idle partition costs nothing: no task, no timer.

A failed fsync is never retried: the partition fails (`PartitionLog.fail`) and the syncer stops.
Each fsync is timed in its worker thread and counted on the loop (`storage.latency`). The jobs run
on a pool of their own (`FSYNC_THREADS`), not asyncio's default executor, where object-store
transfers and segment reads could hold every thread while a group commit waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import structlog

from headwater.storage.fileio import FileOps
from headwater.storage.latency import FSYNC_SECONDS
from headwater.storage.logstate import FsyncPolicy, LogConfig, SealedSegment, Segment
from headwater.storage.segments import write_index
from headwater.wire.errors import PartitionOffline, StorageError


class SyncedLog(Protocol):
    """What the syncer needs of its `storage.wal.PartitionLog` (a protocol, so the two modules
    do not import each other)."""

    directory: Path
    config: LogConfig
    ops: FileOps
    on_sealed: Callable[[SealedSegment], None] | None
    failed: str | None

    @property
    def next_offset(self) -> int: ...

    @property
    def appended(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def take_directory_dirty(self) -> bool: ...

    def lease_target(self) -> int | None: ...

    @property
    def lease_end(self) -> int: ...

    def extend_lease(self, reserved: int) -> None: ...

    def fail(self, reason: str) -> None: ...

    def notify(self) -> None: ...

    def reads_in_flight(self) -> list[asyncio.Future[Any]]: ...


log = structlog.get_logger(__name__)


class Syncer:
    def __init__(self, partition_log: SyncedLog) -> None:
        self._log = partition_log
        self.durable_sequence = 0
        # what was on disk at open counts as durable: recovery fsynced it
        self.durable_offset = partition_log.next_offset
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._to_seal: list[Segment] = []
        self._dirty: list[Segment] = []
        self._doomed: list[tuple[Path, Path]] = []  # segments and indexes to delete next round
        self._lease_due = False
        # appends waiting for the lease to cover them: (their end offset, the lease to write,
        # the future they wait on), served before any round
        self._lease_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._round_wanted = False  # an fsync round is asked for
        self._busy = False  # a job runs in the pool
        self._maintenance_next = False  # a round just ended: seals and the lease go first
        self._loop: asyncio.AbstractEventLoop | None = None  # set by `start`
        self._interval_timer: asyncio.TimerHandle | None = None
        self._closed: asyncio.Future[None] | None = None  # set by `close`
        self._halted = False

    def start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._next()

    def halt(self) -> None:
        """Start nothing more, as after kill -9 (tests); a job in a thread still finishes."""
        self._halted = True
        if self._interval_timer is not None:
            self._interval_timer.cancel()
        self._ended()

    def wake(self) -> None:
        """A round now: a segment was deleted, or the fsync policy changed."""
        self._round_wanted = True
        self._next()

    def delete(self, segment: Path, index: Path) -> None:
        """Delete a sealed segment and its index in the next round, before its directory
        fsync; the segment's blocks are freed after the round."""
        self._doomed.append((segment, index))
        self._round_wanted = True
        self._next()

    def sealing(self, segment: Segment) -> bool:
        return segment in self._to_seal

    def appended(self, segment: Segment, lease_due: bool) -> None:
        if not self._dirty or self._dirty[-1] is not segment:
            self._dirty.append(segment)
        if lease_due:
            self._lease_due = True
        policy = self._log.config.fsync
        if self._waiters or policy == FsyncPolicy.ALWAYS:
            self._round_wanted = True
        elif policy == FsyncPolicy.INTERVAL and self._interval_timer is None and self._loop:
            self._interval_timer = self._loop.call_later(
                self._log.config.fsync_interval_ms / 1000, self._interval_due
            )
        self._next()

    def seal(self, segment: Segment) -> None:
        self._to_seal.append(segment)
        self._next()

    def wait(self, sequence: int) -> asyncio.Future[None]:
        """A future that completes once a round covers append number `sequence` (at once when
        one has), or fails with `PartitionOffline`. A future, not a coroutine: a produce's answer
        is written from its done callback, with no task per produce."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.durable_sequence >= sequence:
            future.set_result(None)
        elif self._log.failed is not None:
            future.set_exception(
                PartitionOffline(f"partition offline until restart: {self._log.failed}")
            )
        else:
            self._waiters.append((sequence, future))
            self._round_wanted = True
            self._next()
        return future

    def leased(self, end: int, target: int) -> asyncio.Future[None]:
        """A future that completes once the lease covers offsets below `end` (a lease job
        writes `target`, at least, in the pool), or fails (`StorageError`, `PartitionOffline`)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._log.lease_end >= end:
            future.set_result(None)
        elif self._log.failed is not None:
            future.set_exception(
                PartitionOffline(f"partition offline until restart: {self._log.failed}")
            )
        elif self._halted or self._log.closed or self._closed is not None:
            future.set_exception(StorageError("log is closed"))
        else:
            self._lease_waiters.append((end, target, future))
            self._next()
        return future

    def fail_waiters(self, error: Exception) -> None:
        waiting, self._waiters = self._waiters, []
        for _, future in waiting:
            if not future.done():
                future.set_exception(error)
        self._fail_lease_waiters(error)

    def _fail_lease_waiters(self, error: Exception) -> None:
        waiting, self._lease_waiters = self._lease_waiters, []
        for _, _, future in waiting:
            if not future.done():
                future.set_exception(error)

    async def close(self) -> None:
        """A last round over everything appended, every pending seal; then nothing more runs."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        if self._closed is None:
            self._closed = self._loop.create_future()
        if self._interval_timer is not None:
            self._interval_timer.cancel()
            self._interval_timer = None
        self._round_wanted = True
        self._next()
        await self._closed

    # The state machine: `_next` starts the job that is due, if none runs.

    def _next(self) -> None:
        if self._halted or self._log.failed is not None:
            self._ended()
            return
        if self._busy or self._loop is None:
            return
        if self._lease_waiters:  # appends wait for it: before any round
            wanted = max(target for _, target, _ in self._lease_waiters)
            self._lease_due = False
            self._run(self._log.extend_lease, self._leased, wanted, fatal=False)
        elif self._round_wanted and not (self._maintenance_next and self._maintenance_due):
            self._round_wanted = False
            self._maintenance_next = False
            self._start_round()
        elif self._to_seal:
            self._maintenance_next = False
            self._run(self._seal, self._sealed, self._to_seal[0])
        elif self._lease_due:
            self._maintenance_next = False
            self._lease_due = False
            target = self._log.lease_target()
            if target is None:
                self._next()
            else:
                self._run(self._log.extend_lease, self._leased, target, fatal=False)
        elif self._closed is not None:
            self._ended()

    @property
    def _maintenance_due(self) -> bool:
        return bool(self._to_seal) or self._lease_due

    def _ended(self) -> None:
        self._fail_lease_waiters(StorageError("log is closed"))
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def _interval_due(self) -> None:
        self._interval_timer = None
        self._round_wanted = True
        self._next()

    def _start_round(self) -> None:
        partition_log = self._log
        # what this round makes durable: everything appended before it starts
        covered: tuple[int, int] | None = (partition_log.appended, partition_log.next_offset)
        doomed, self._doomed = self._doomed, []
        directory_dirty = partition_log.take_directory_dirty()
        files: list[tuple[int, Path]] = []
        if partition_log.config.fsync != FsyncPolicy.NEVER or self._waiters or partition_log.closed:
            dirty, self._dirty = self._dirty, []
            files = [(s.write_fd, s.path) for s in dirty if s.write_fd is not None]
        else:
            covered = None  # nothing waits and the policy syncs only on sealing
        if not directory_dirty and not files and not doomed:
            self._round_done(covered, ([], []), None)
            self._next()
            return
        ops, directory = partition_log.ops, partition_log.directory

        def fsync_all() -> tuple[list[float], list[int]]:  # in a pool thread
            detached: list[int] = []
            for segment, index in doomed:
                try:
                    ops.remove(index)
                    fd = ops.detach(segment)
                except OSError as exc:  # left behind: the directory's next listing shows it
                    log.warning("wal.delete_failed", file=str(segment), error=str(exc))
                else:
                    if fd is not None:
                        detached.append(fd)
            try:
                durations = [_timed(ops.fsync_directory, directory)] if directory_dirty else []
                durations += [_timed(ops.fsync, fd, path) for fd, path in files]
            except BaseException:
                for fd in detached:  # the partition fails: free them at once
                    with contextlib.suppress(OSError):
                        ops.close(fd)
                raise
            return durations, detached

        self._run(fsync_all, partial(self._round_done, covered))

    def _run(
        self,
        job: Callable[..., Any],
        done: Callable[[Any, OSError | None], None],
        *args: Any,
        fatal: bool = True,
    ) -> None:
        """Run `job(*args)` in the pool; `done(result, error)` on the loop as soon as it ends.
        With `fatal`, an OSError fails the partition instead (a failed fsync is never retried)."""
        loop = self._loop
        assert loop is not None
        self._busy = True

        def in_thread() -> None:
            try:
                result = job(*args)
            except BaseException as exc:
                _post(loop, self._finished, done, fatal, None, exc)
            else:
                _post(loop, self._finished, done, fatal, result, None)

        _fsync_pool().submit(in_thread)

    def _finished(
        self,
        done: Callable[[Any, OSError | None], None],
        fatal: bool,
        result: Any,
        error: BaseException | None,
    ) -> None:
        self._busy = False
        if self._halted:
            return
        if error is not None and (fatal or not isinstance(error, OSError)):
            self._log.fail(f"fsync failed: {error}")
            self._ended()
            if not isinstance(error, OSError):
                raise error  # a bug: the loop's exception handler logs it
            return
        done(result, error if isinstance(error, OSError) else None)
        self._next()

    def _round_done(
        self,
        covered: tuple[int, int] | None,
        outcome: tuple[list[float], list[int]],
        _: OSError | None,
    ) -> None:
        durations, detached = outcome
        if detached:
            self._release(detached)
        for elapsed in durations:
            FSYNC_SECONDS.observe(elapsed)
        self._maintenance_next = True
        if covered is None:
            return
        sequence, offset = covered
        self.durable_sequence = max(self.durable_sequence, sequence)
        self._advance(offset)
        waiting, self._waiters = self._waiters, []
        for waited, future in waiting:
            if waited > self.durable_sequence:
                self._waiters.append((waited, future))
            elif not future.done():
                future.set_result(None)

    def _release(self, detached: list[int]) -> None:
        """Free deleted segments' blocks in the release thread, once every read that was in
        flight when they were unlinked has ended: a read holds its own descriptor to the file,
        and must not see it shrink."""
        ops, directory = self._log.ops, str(self._log.directory)

        def submit(_: object = None) -> None:
            for fd in detached:
                _queue_release(ops, fd, directory)

        reads = self._log.reads_in_flight()
        if reads:
            asyncio.gather(*reads, return_exceptions=True).add_done_callback(submit)
        else:
            submit()

    def _sealed(self, elapsed: float | None, _: OSError | None) -> None:
        segment = self._to_seal.pop(0)
        if elapsed is not None:
            FSYNC_SECONDS.observe(elapsed)
        partition_log = self._log
        if partition_log.config.fsync == FsyncPolicy.NEVER:
            self._dirty = [s for s in self._dirty if s is not segment]
            self._advance(segment.next_offset)
        log.info(
            "wal.sealed",
            directory=str(partition_log.directory),
            base_offset=segment.base_offset,
            next_offset=segment.next_offset,
            bytes=segment.size,
        )
        if partition_log.on_sealed is not None:
            partition_log.on_sealed(
                SealedSegment(segment.base_offset, segment.next_offset, segment.path, segment.size)
            )

    def _leased(self, _: None, error: OSError | None) -> None:
        if error is not None:  # the appends waiting are refused (retriable), and said so
            log.warning(
                "wal.lease_write_failed", directory=str(self._log.directory), error=str(error)
            )
            self._fail_lease_waiters(StorageError(f"cannot record the offset lease: {error}"))
            return
        covered = self._log.lease_end
        waiting, self._lease_waiters = self._lease_waiters, []
        for end, target, future in waiting:
            if end <= covered:
                if not future.done():
                    future.set_result(None)
            else:  # came while the job ran: the next job
                self._lease_waiters.append((end, target, future))

    def _seal(self, segment: Segment) -> float | None:
        """Runs in a worker thread; returns how long the fsync took, if there was one."""
        ops = self._log.ops
        elapsed = None
        if segment.write_fd is not None:
            # an OSError here fails the partition
            elapsed = _timed(ops.fsync, segment.write_fd, segment.path)
            ops.close(segment.write_fd)
            segment.write_fd = None
        try:
            write_index(segment.index_path, segment.index)
        except OSError as exc:  # the index is a cache: the next open rebuilds it
            log.warning("wal.index_write_failed", index=str(segment.index_path), error=str(exc))
        return elapsed

    def _advance(self, offset: int) -> None:
        if offset > self.durable_offset:
            self.durable_offset = offset
            self._log.notify()


# Threads for every partition's fsyncs, seals and lease writes: as many as asyncio's default
# executor would have, but for these alone.
FSYNC_THREADS = min(32, (os.cpu_count() or 1) + 4)
_pool: ThreadPoolExecutor | None = None


def _fsync_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(FSYNC_THREADS, thread_name_prefix="hw-fsync")
    return _pool


# One thread frees every partition's deleted segments, one after the other: two frees at once
# would make the steps' commits twice as long for every fsync beside them.
_release_executor: ThreadPoolExecutor | None = None


def _release_pool() -> ThreadPoolExecutor:
    global _release_executor
    if _release_executor is None:
        _release_executor = ThreadPoolExecutor(1, thread_name_prefix="hw-release")
    return _release_executor


# Descriptors a queued release holds at most, in all. Past it (thousands of segments past
# retention at once, after a long stop) a segment is freed at once, as before the release thread:
# its descriptor must not wait in the queue, or the queue would hold one per segment.
MAX_QUEUED_RELEASES = 64
_queued = 0
_queued_lock = threading.Lock()


def _queue_release(ops: FileOps, fd: int, directory: str) -> None:
    global _queued
    with _queued_lock:
        full = _queued >= MAX_QUEUED_RELEASES
        if not full:
            _queued += 1
    if full:
        with contextlib.suppress(OSError):
            ops.close(fd)
        return
    _release_pool().submit(_release, ops, fd, directory)


def _release(ops: FileOps, fd: int, directory: str) -> None:
    global _queued
    try:
        ops.release(fd)
    except OSError as exc:  # closed anyway (release's finally): the kernel frees the rest
        log.warning("wal.release_failed", directory=directory, error=str(exc))
    finally:
        with _queued_lock:
            _queued -= 1


def _post(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> None:
    """From a pool thread: run `callback` on the loop (unless the loop is gone: shut down)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)


def _timed(call: Callable[..., Any], *args: Any) -> float:
    """Run `call` (an fsync, in a worker thread); its duration in seconds."""
    started = time.perf_counter()
    call(*args)
    return time.perf_counter() - started
