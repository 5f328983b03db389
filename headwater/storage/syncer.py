"""The one task per partition that does every fsync, in a worker thread, never on the event loop.

- `always`: group commit. The syncer runs after each append (as soon as the event loop lets it);
  one fsync covers every batch appended before it started, and all their waiters wake together.
- `interval`: the syncer fsyncs every `fsync_interval_ms`; producers do not wait for it.
- `never`: only sealing a segment fsyncs it (uploads need a stable file), and waiters
  (read_committed producers) get an fsync when they ask.

Before any data fsync, the partition directory is fsynced if a segment was created or deleted
since the last one: a new segment's name must be durable before its data can count as durable.
Rolled segments are sealed here (fsync, close, index) and reported to `on_sealed`. The offset
lease is extended here too, ahead of need, so appends rarely write it themselves.

A failed fsync is never retried: the partition fails (`PartitionLog.fail`) and this task ends.
Each fsync is timed in its worker thread and counted on the loop (`storage.latency`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import structlog

from headwater.storage.fileio import FileOps
from headwater.storage.latency import FSYNC_SECONDS
from headwater.storage.logstate import FsyncPolicy, LogConfig, SealedSegment, Segment
from headwater.storage.segments import write_index
from headwater.wire.errors import PartitionOffline


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

    def extend_lease(self, reserved: int) -> None: ...

    def fail(self, reason: str) -> None: ...

    def notify(self) -> None: ...


log = structlog.get_logger("headwater.wal")


class Syncer:
    def __init__(self, partition_log: SyncedLog) -> None:
        self._log = partition_log
        self.durable_sequence = 0
        # what was on disk at open counts as durable: recovery fsynced it
        self.durable_offset = partition_log.next_offset
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._to_seal: list[Segment] = []
        self._dirty: list[Segment] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lease_due = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def wake(self) -> None:
        self._wake.set()

    def sealing(self, segment: Segment) -> bool:
        return segment in self._to_seal

    def appended(self, segment: Segment, lease_due: bool) -> None:
        if not self._dirty or self._dirty[-1] is not segment:
            self._dirty.append(segment)
        if lease_due:
            self._lease_due = True
        if lease_due or self._waiters or self._log.config.fsync == FsyncPolicy.ALWAYS:
            self._wake.set()

    def seal(self, segment: Segment) -> None:
        self._to_seal.append(segment)
        self._wake.set()

    async def wait(self, sequence: int) -> None:
        if self.durable_sequence >= sequence:
            return
        if self._log.failed is not None:
            raise PartitionOffline(f"partition offline until restart: {self._log.failed}")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((sequence, future))
        self._wake.set()
        await future

    def fail_waiters(self, error: Exception) -> None:
        waiting, self._waiters = self._waiters, []
        for _, future in waiting:
            if not future.done():
                future.set_exception(error)

    async def close(self) -> None:
        self._wake.set()
        if self._task is not None:
            if not self._task.done():
                await self._task
        elif self._log.failed is None:
            with contextlib.suppress(OSError):
                await self._sync_once()

    async def _run(self) -> None:
        while self._log.failed is None:
            # read each round: `topic alter` may change the policy while the log is open
            config = self._log.config
            interval = (
                config.fsync_interval_ms / 1000 if config.fsync == FsyncPolicy.INTERVAL else None
            )
            if interval is None:
                await self._wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(interval):
                        await self._wake.wait()
            self._wake.clear()
            try:
                await self._sync_once()
            except OSError as exc:
                self._log.fail(f"fsync failed: {exc}")
                return
            if self._log.closed and not self._to_seal and not self._dirty:
                return

    async def _sync_once(self) -> None:
        partition_log = self._log
        target = partition_log.appended
        target_offset = partition_log.next_offset
        if partition_log.take_directory_dirty():
            FSYNC_SECONDS.observe(
                await asyncio.to_thread(
                    _timed, partition_log.ops.fsync_directory, partition_log.directory
                )
            )
        policy = partition_log.config.fsync
        if policy != FsyncPolicy.NEVER or self._waiters or partition_log.closed:
            dirty, self._dirty = self._dirty, []
            for segment in dirty:
                if segment.write_fd is not None:
                    FSYNC_SECONDS.observe(
                        await asyncio.to_thread(
                            _timed, partition_log.ops.fsync, segment.write_fd, segment.path
                        )
                    )
            self.durable_sequence = max(self.durable_sequence, target)
            self._advance(target_offset)
            waiting, self._waiters = self._waiters, []
            for sequence, future in waiting:
                if sequence > self.durable_sequence:
                    self._waiters.append((sequence, future))
                elif not future.done():
                    future.set_result(None)
        sealing = list(self._to_seal)
        for segment in sealing:
            elapsed = await asyncio.to_thread(self._seal, segment)
            if elapsed is not None:
                FSYNC_SECONDS.observe(elapsed)
            self._to_seal.remove(segment)
            if policy == FsyncPolicy.NEVER:
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
                    SealedSegment(
                        segment.base_offset, segment.next_offset, segment.path, segment.size
                    )
                )
        if self._lease_due:
            self._lease_due = False
            target_lease = partition_log.lease_target()
            if target_lease is not None:
                try:
                    await asyncio.to_thread(partition_log.extend_lease, target_lease)
                except OSError as exc:  # appends will try in line, and say so
                    log.warning(
                        "wal.lease_write_failed",
                        directory=str(partition_log.directory),
                        error=str(exc),
                    )

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


def _timed(call: Callable[..., Any], *args: Any) -> float:
    """Run `call` (an fsync, in a worker thread); its duration in seconds."""
    started = time.perf_counter()
    call(*args)
    return time.perf_counter() - started
