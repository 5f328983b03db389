"""The write-ahead log of one partition: append, group commit, roll, read, and failure handling.

Appends are synchronous writes to the active segment (the OS page cache), so a batch is readable
the moment `append` returns, and offsets are assigned in append order with no await in between.
Durability is separate: `append` returns a sequence number and `wait_durable(seq)` resolves once an
fsync covers it. The syncer (`storage.syncer`) does every fsync in a worker thread.

Faults, and what they do (docs/DURABILITY.md has the reasons):

- a failed write (ENOSPC, EIO, a short write) truncates the segment back to where the batch
  started, before anything else can be appended, and raises `StorageError` (retriable); the next
  append simply tries again. If even the truncate fails, the partition fails (below).
- a failed fsync fails the partition: after it the kernel may have dropped the dirty pages, so no
  later fsync can vouch for them. Waiters get `PartitionOffline`, appends are refused with it, the
  durable offset stops, until a restart lets recovery decide what is on disk.
- before an offset is handed out, the offset lease (`storage.offsets`) must cover it, so a restart
  never gives an offset twice, whatever was lost. The lease is written in the syncer's pool, never
  on the event loop by the server's appends: an append it would not cover waits first
  (`lease_covers`, `lease_wait`; `server.topics.topic.LogTopic.when_leased` keeps a partition's
  appends in order meanwhile). `append` itself still writes it in line when a caller did not wait
  (counted in `lease_in_line`), so no caller can ever get an offset the lease does not cover.
- reads get past damaged bytes (`storage.reader`), quarantining them, and say which offsets the
  damage hid so the caller can look for another copy.

Segment writes and fsyncs go through `FileOps` (`storage.fileio`), the seam fault tests replace.
A small tail cache keeps the most recent batches in memory, so consumers at the live edge are
served without touching the disk.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import structlog

from headwater.storage.fileio import FileOps, default_file_ops, write_all
from headwater.storage.logstate import FsyncPolicy, LogConfig, SealedSegment, Segment
from headwater.storage.offsets import MIN_LEASE_BLOCK, OffsetLease
from headwater.storage.reader import LogRead, SegmentRead, read_batches
from headwater.storage.recovery import quarantine, recover
from headwater.storage.segments import (
    INDEX_INTERVAL_BYTES,
    BatchLocation,
    Damage,
    SparseIndex,
    batch_location,
    segment_name,
)
from headwater.storage.syncer import Syncer
from headwater.wire.errors import PartitionOffline, StorageError
from headwater.wire.records import stamp_base_offset

__all__ = ["FsyncPolicy", "LogConfig", "LogRead", "PartitionLog", "SealedSegment"]

log = structlog.get_logger(__name__)

_READ_CHUNK = 1 << 20


class PartitionLog:
    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        segments: list[Segment],
        on_sealed: Callable[[SealedSegment], None] | None = None,
        ops: FileOps | None = None,
    ) -> None:
        self.directory = directory
        self.config = config
        self.ops = ops or default_file_ops()
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self.on_sealed = on_sealed
        self._tail: deque[tuple[int, int, bytes]] = deque()
        self._tail_bytes = 0
        self._appended = 0
        self._closed = False
        self._append_listeners: list[Callable[[], None]] = []
        self.syncer = Syncer(self)
        self.failed: str | None = None  # why the partition is offline, if it is
        self.data_end = segments[-1].next_offset  # where the good data ended at open
        self.quarantined = 0  # damaged ranges found (recovery and reads), each copied aside
        self.write_errors = 0
        self._reported: set[tuple[str, int]] = set()
        self._recovered: list[BatchLocation] = []
        self.lease = OffsetLease(directory)
        self.lease_in_line = 0  # appends that wrote the lease in line (their caller did not wait)
        self._dir_dirty = False
        self._reads: set[asyncio.Future[SegmentRead]] = set()  # segment reads in worker threads

    # Opening

    @classmethod
    def open(
        cls,
        directory: Path,
        config: LogConfig,
        start_offset: int = 0,
        on_sealed: Callable[[SealedSegment], None] | None = None,
        ops: FileOps | None = None,
    ) -> PartitionLog:
        """Open (or create) the log in `directory`; a new log starts at `start_offset`.
        Blocking (recovery reads and fsyncs): run it in a worker thread from the event loop."""
        ops = ops or default_file_ops()
        recovered = recover(directory, ops, start_offset)
        log_ = cls(directory, config, recovered.segments, on_sealed, ops)
        log_.data_end = recovered.data_end
        log_.quarantined = len(recovered.quarantined)
        log_._reported = {(str(d.path), d.position) for d in recovered.quarantined}
        log_._recovered = recovered.recovered
        active = recovered.segments[-1]
        active.write_fd = ops.open_append(active.path)
        active.created = time.monotonic()
        # What recovery kept may sit only in the page cache (the process was killed): make it
        # durable before counting it as such.
        ops.fsync(active.write_fd, active.path)
        log_.extend_lease(active.next_offset + MIN_LEASE_BLOCK)
        return log_

    @classmethod
    def open_or_offline(
        cls,
        directory: Path,
        config: LogConfig,
        on_sealed: Callable[[SealedSegment], None] | None = None,
    ) -> PartitionLog:
        """Open the log; if that fails, an offline log that refuses everything with the reason,
        so one damaged partition never keeps the server (or its other partitions) down."""
        try:
            return cls.open(directory, config, on_sealed=on_sealed)
        except Exception as exc:
            reason = f"cannot open {directory}: {type(exc).__name__}: {exc}"
            log.exception("wal.open_failed", directory=str(directory), error=reason)
            return cls.offline(directory, config, reason)

    @classmethod
    def offline(cls, directory: Path, config: LogConfig, reason: str) -> PartitionLog:
        placeholder = Segment(
            0, directory / segment_name(0), 0, 0, SparseIndex(), 0.0, sealed=False
        )
        log_ = cls(directory, config, [placeholder])
        log_.failed = reason
        log_._closed = True
        return log_

    def start(self) -> None:
        """Start the background syncer (needs a running event loop)."""
        if self.failed is None:
            self.syncer.start()

    # Properties

    @property
    def next_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def start_offset(self) -> int:
        """The first offset still held locally."""
        return self._segments[0].base_offset

    @property
    def size(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def durable_offset(self) -> int:
        """Every offset below this is covered by an fsync (or was recovered and fsynced)."""
        return self.syncer.durable_offset

    @property
    def visible_offset(self) -> int:
        """What consumers may read: on `fsync=always` only what an fsync covers (the high
        watermark), so nobody sees a record a power cut could take back; else everything."""
        if self.config.fsync == FsyncPolicy.ALWAYS:
            return self.durable_offset
        return self.next_offset

    def recovered_batches(self) -> list[BatchLocation]:
        """The last segment's batches as found on open (for state that follows the WAL)."""
        return list(self._recovered)

    def sealed_segments(self) -> list[SealedSegment]:
        return [
            SealedSegment(s.base_offset, s.next_offset, s.path, s.size)
            for s in self._segments
            if s.sealed and not self.syncer.sealing(s)
        ]

    def add_append_listener(self, listener: Callable[[], None]) -> None:
        """Called after each append, and when the durable offset advances."""
        self._append_listeners.append(listener)

    def remove_append_listener(self, listener: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._append_listeners.remove(listener)

    def notify(self) -> None:
        for listener in self._append_listeners:
            listener()

    # Appending

    def append(self, batch: bytes, record_count: int) -> tuple[int, int]:
        """Stamp and write a validated batch; returns (base offset, durability sequence).

        Raises `StorageError` (retriable, nothing written) or `PartitionOffline`."""
        if self.failed is not None:
            raise PartitionOffline(f"partition offline until restart: {self.failed}")
        if self._closed:
            raise StorageError("log is closed")
        active = self._segments[-1]
        if active.size > 0 and (
            active.size + len(batch) > self.config.segment_bytes
            or (time.monotonic() - active.created) * 1000 >= self.config.segment_ms
        ):
            active = self._roll()
        base_offset = active.next_offset
        end_offset = base_offset + record_count
        if end_offset > self.lease.on_disk:
            self._extend_lease_in_line(end_offset)
        stamped = bytearray(batch)
        stamp_base_offset(stamped, base_offset)
        data = bytes(stamped)
        assert active.write_fd is not None
        try:
            write_all(self.ops, active.write_fd, data)
        except OSError as exc:
            self._write_failed(active, exc)
        if self.write_errors:
            log.info("wal.write_recovered", directory=str(self.directory), failed=self.write_errors)
            self.write_errors = 0
        location = batch_location(data, active.size)
        if location.position - active.last_index_position >= INDEX_INTERVAL_BYTES:
            active.index.append(base_offset, location.position, active.max_timestamp)
            active.last_index_position = location.position
        active.max_timestamp = max(active.max_timestamp, location.max_timestamp)
        active.size += len(data)
        active.next_offset = end_offset
        self._appended += 1
        self._cache(base_offset, end_offset, data)
        self.syncer.appended(active, self.lease.on_disk - end_offset < self.lease.block // 2)
        self.notify()
        return base_offset, self._appended

    def _write_failed(self, active: Segment, exc: OSError) -> None:
        """Remove whatever part of the batch reached the file, then refuse this one append."""
        assert active.write_fd is not None
        try:
            self.ops.truncate(active.write_fd, active.size)
        except OSError as truncate_error:
            self.fail(
                f"a write failed ({exc}) and the partial batch could not be removed "
                f"({truncate_error})"
            )
            raise PartitionOffline(f"partition offline until restart: {self.failed}") from None
        self.write_errors += 1
        if self.write_errors == 1:  # once per run of failures, not once per produce
            log.error(
                "wal.write_failed",
                segment=str(active.path),
                position=active.size,
                error=str(exc),
                errno=exc.errno,
            )
        raise StorageError(f"cannot write to the log of {self.directory}: {exc}") from None

    def _cache(self, base: int, next_offset: int, data: bytes) -> None:
        self._tail.append((base, next_offset, data))
        self._tail_bytes += len(data)
        while self._tail_bytes > self.config.tail_cache_bytes and len(self._tail) > 1:
            _, _, old = self._tail.popleft()
            self._tail_bytes -= len(old)

    def roll_if_old(self) -> None:
        """Roll the active segment if it has data and has reached `segment_ms`."""
        active = self._segments[-1]
        if (
            self.failed is None
            and not self._closed
            and active.size
            and (time.monotonic() - active.created) * 1000 >= self.config.segment_ms
        ):
            with contextlib.suppress(StorageError):  # the next append reports it
                self._roll()

    def _roll(self) -> Segment:
        old = self._segments[-1]
        path = self.directory / segment_name(old.next_offset)
        try:
            fd = self.ops.open_append(path, create=True)
        except OSError as exc:  # nothing changed: the old segment stays active
            raise StorageError(f"cannot create segment {path}: {exc}") from None
        old.sealed = True
        segment = Segment(
            old.next_offset, path, old.next_offset, 0, SparseIndex(), time.monotonic(), False, fd
        )
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        self._dir_dirty = True  # the syncer makes the new name durable before any data in it
        self.syncer.seal(old)
        log.debug("wal.rolled", directory=str(self.directory), base_offset=segment.base_offset)
        return segment

    # The offset lease

    def lease_target(self) -> int | None:
        return self.lease.target(self.next_offset)

    def extend_lease(self, reserved: int) -> None:
        self.lease.extend(reserved)

    @property
    def lease_end(self) -> int:
        """Offsets below this are covered by the lease on disk."""
        return self.lease.on_disk

    def lease_covers(self, record_count: int) -> bool:
        """Whether an append of `record_count` records now needs no lease write."""
        return self.next_offset + record_count <= self.lease.on_disk or self.failed is not None

    def lease_wait(self, record_count: int) -> asyncio.Future[None]:
        """A future that completes once the lease covers an append of `record_count` records
        made now (extended in the syncer's pool, a block past it), or fails with `StorageError`
        (the lease could not be written: retriable) or `PartitionOffline`."""
        end = self.next_offset + record_count
        return self.syncer.leased(end, end + self.lease.block)

    def _extend_lease_in_line(self, needed: int) -> None:
        self.lease_in_line += 1
        try:
            self.lease.extend(needed + self.lease.block)
        except OSError as exc:
            self.write_errors += 1
            if self.write_errors == 1:
                log.error("wal.lease_write_failed", directory=str(self.directory), error=str(exc))
            raise StorageError(f"cannot record the offset lease: {exc}") from None

    # Durability

    def must_wait(self, sequence: int, committed: bool = False) -> bool:
        """Whether an ack for append `sequence` waits for an fsync: under policy `always`, or
        when the producer asked for fsynced isolation."""
        if self.syncer.durable_sequence >= sequence:
            return False
        return committed or self.config.fsync == FsyncPolicy.ALWAYS

    def wait_durable(self, sequence: int) -> asyncio.Future[None]:
        """Resolve once an fsync covers append number `sequence`; `PartitionOffline` if the
        partition failed first. Waiting starts an fsync now, whatever the policy: that is how
        fsynced isolation works on `interval` and `never` topics."""
        return self.syncer.wait(sequence)

    def fail(self, reason: str) -> None:
        """Take the partition offline until restart (see the module docstring)."""
        if self.failed is not None:
            return
        self.failed = reason
        log.error("wal.partition_failed", directory=str(self.directory), reason=reason)
        self.syncer.fail_waiters(PartitionOffline(f"partition offline until restart: {reason}"))
        self.notify()

    def take_directory_dirty(self) -> bool:
        dirty, self._dir_dirty = self._dir_dirty, False
        return dirty

    @property
    def appended(self) -> int:
        return self._appended

    @property
    def closed(self) -> bool:
        return self._closed

    # Reading

    async def read(self, offset: int, max_bytes: int = _READ_CHUNK) -> list[bytes]:
        """Batches from the one holding `offset` on, about `max_bytes` (at least one batch).

        Empty when `offset` is at or past the end, or below `start_offset` (then the caller
        reads the object store), which it also is when retention deleted the segment during the
        read.
        """
        return (await self.read_span(offset, max_bytes)).batches

    async def read_span(self, offset: int, max_bytes: int = _READ_CHUNK) -> LogRead:
        """As `read`, and whether damage was skipped before the first batch returned: then the
        offsets from `offset` up to that batch were hidden by it (or never existed: a gap)."""
        cached = self._read_cache(offset, max_bytes)
        if cached is not None:
            return LogRead(cached, False)
        if offset >= self.next_offset or offset < self.start_offset:
            return LogRead([], False)
        damaged = False
        position_in_list = bisect.bisect_right(self._bases, offset) - 1
        for segment in list(self._segments[position_in_list:]):
            position = segment.index.start_of(offset)
            job = asyncio.get_running_loop().run_in_executor(
                None,
                read_batches,
                segment.path,
                position,
                offset,
                max_bytes,
                segment.size,
                segment.base_offset,
            )
            self._reads.add(job)
            job.add_done_callback(self._read_ended)
            # shielded: a cancelled reader leaves the job running in its thread, and the job
            # stays in `_reads` until it ends (a deleted segment's blocks wait for it)
            try:
                result = await asyncio.shield(job)
            except FileNotFoundError:
                if any(kept is segment for kept in self._segments):
                    raise
                # retention deleted it before the thread opened it: the offset is now below
                # `start_offset`, where the caller reads the object store
                return LogRead([], False)
            for damage in result.damage:
                self._report(damage)
            if result.damage and (
                not result.batches or batch_location(result.batches[0], 0).base_offset > offset
            ):
                damaged = True
            if result.batches or not segment.sealed:
                return LogRead(result.batches, damaged)
            # nothing at or after `offset` in this segment: a gap, or damage at its end
        return LogRead([], damaged)

    def _read_ended(self, job: asyncio.Future[SegmentRead]) -> None:
        self._reads.discard(job)
        if not job.cancelled():
            job.exception()  # retrieved: its reader may have been cancelled and gone

    def reads_in_flight(self) -> list[asyncio.Future[SegmentRead]]:
        return list(self._reads)

    def _report(self, damage: Damage) -> None:
        ident = (str(damage.path), damage.position)
        if ident in self._reported:
            return
        self._reported.add(ident)
        self.quarantined += 1
        quarantine(self.directory, damage)

    def _read_cache(self, offset: int, max_bytes: int) -> list[bytes] | None:
        tail = self._tail
        if not tail or offset < tail[0][0] or offset >= tail[-1][1]:
            return None
        # find the first cached batch whose range holds the offset
        low, high = 0, len(tail) - 1
        while low < high:
            middle = (low + high) // 2
            if tail[middle][1] <= offset:
                low = middle + 1
            else:
                high = middle
        result: list[bytes] = []
        size = 0
        # iterated, not indexed: a deque's index walks its blocks from the nearer end, so
        # `tail[i]` for each i of a read was quadratic (a 1 MiB read of 100-byte batches, 10,000
        # of them, took milliseconds of the loop: docs/BENCHMARKS.md, hostile requests)
        for _, _, data in itertools.islice(tail, low, None):
            if result and size + len(data) > max_bytes:
                break
            result.append(data)
            size += len(data)
        return result

    async def offset_for_timestamp(self, timestamp: int) -> int:
        """The first offset of the first local batch with max_timestamp >= `timestamp`."""
        offset = self.start_offset
        while offset < self.next_offset:
            batches = await self.read(offset)
            if not batches:
                break
            for data in batches:
                location = batch_location(data, 0)
                if location.max_timestamp >= timestamp:
                    return max(location.base_offset, offset)
                offset = location.next_offset
        return self.next_offset

    # Retention

    def delete_segment(self, base_offset: int) -> bool:
        """Delete a sealed segment (never the active one); returns whether it existed."""
        for position, segment in enumerate(self._segments[:-1]):
            if (
                segment.base_offset == base_offset
                and segment.sealed
                and not self.syncer.sealing(segment)
            ):
                del self._segments[position]
                del self._bases[position]
                self._dir_dirty = True
                # unlinking a 64 MiB file held the loop 10-20 ms: the syncer's next round does
                # it in its pool thread, before the directory fsync that makes it durable, and
                # frees the blocks afterwards in steps
                self.syncer.delete(segment.path, segment.index_path)
                return True
        return False

    # Shutdown

    async def close(self, seal_active: bool = False, discard: bool = False) -> None:
        """Fsync everything; with `seal_active`, also seal the active segment (for upload).
        A clean close records the exact next offset, so a restart leaves no gap. Returns once
        the segment reads in flight have ended too. With `discard` (its files are removed next:
        a deleted topic's), neither the fsync nor the clean lease: a deletion of a topic of
        1,001 partitions paid two blocking writes per partition, one after the other (15 s)."""
        if self._closed:
            return
        if seal_active and self._segments[-1].size and self.failed is None:
            with contextlib.suppress(StorageError):
                self._roll()
        self._closed = True
        await self.syncer.close()
        for segment in self._segments:
            if segment.write_fd is None:
                continue
            # the syncer's last round (in `syncer.close`) covered every append: fsync again only
            # if it did not (10,000 idle partitions paid a redundant fsync each at shutdown)
            if (
                not discard
                and self.failed is None
                and self.syncer.durable_sequence < self._appended
            ):
                try:
                    # at close, only: asyncio's default executor
                    await asyncio.to_thread(self.ops.fsync, segment.write_fd, segment.path)
                except OSError as exc:
                    self.fail(f"fsync failed at close: {exc}")
            with contextlib.suppress(OSError):
                self.ops.close(segment.write_fd)
            segment.write_fd = None
        if self.failed is None and not discard:
            try:
                await asyncio.to_thread(self.lease.close, self.next_offset)
            except OSError as exc:
                log.warning("wal.lease_write_failed", directory=str(self.directory), error=str(exc))
        await self._reads_ended()

    async def _reads_ended(self) -> None:
        """Reads in worker threads hold descriptors of their own: whoever removes the files once
        `close` returns (a topic's deletion, a take-over: `fileio.remove_tree`, which frees them
        in steps) must not cut a segment under one."""
        for _ in range(10):  # bounded: nothing reads a closed log, only reads begun before
            if not self._reads:
                return
            await asyncio.gather(*self._reads, return_exceptions=True)
