"""The write-ahead log of one partition: append, group commit, roll, recover, read.

Appends are synchronous writes to the active segment (the OS page cache), so a batch is readable
the moment `append` returns, and offsets are assigned in append order with no await in between.
Durability is separate: `append` returns a sequence number and `wait_durable(seq)` resolves once an
fsync covers it. One background syncer task per partition does every fsync, in a worker thread,
so the event loop never blocks on the disk:

- `always`: group commit. The syncer runs whenever someone waits; one fsync covers every batch
  appended before it started, and all their waiters wake together.
- `interval`: the syncer fsyncs every `fsync_interval_ms`; nobody waits for it.
- `never`: only sealing a segment fsyncs it (uploads need a stable file).

The active segment rolls when it passes `segment_bytes` or `segment_ms` (which bounds how far
uploads lag behind). A rolled segment is handed to the syncer, which fsyncs it, writes its sparse
index and reports it sealed (the uploader takes it from there). On open, every segment is found,
indexes are loaded (or rebuilt) and the last segment is scanned and cut at the first incomplete or
corrupt batch; offsets continue from the last good batch, never from zero.

A small tail cache keeps the most recent batches in memory, so consumers at the live edge are
served without touching the disk.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import enum
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from storage.segments import (
    INDEX_INTERVAL_BYTES,
    INDEX_SUFFIX,
    BatchLocation,
    IndexEntry,
    batch_location,
    build_index,
    parse_segment_name,
    read_index,
    scan_segment,
    segment_name,
    write_index,
)
from wire.records import BATCH_HEADER_SIZE, stamp_base_offset

log = structlog.get_logger("headwater.wal")

_READ_CHUNK = 1 << 20


class FsyncPolicy(enum.StrEnum):
    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class LogConfig:
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_ms: int = 100
    segment_bytes: int = 64 * 1024 * 1024
    segment_ms: int = 10 * 60 * 1000
    tail_cache_bytes: int = 8 * 1024 * 1024


@dataclass(slots=True)
class Segment:
    base_offset: int
    path: Path
    next_offset: int
    size: int
    index: list[IndexEntry]
    created: float  # monotonic time of its first append (age-based rolling)
    sealed: bool
    write_fd: int | None = None
    last_index_position: int = -INDEX_INTERVAL_BYTES
    max_timestamp: int = -1
    # the batches found by the recovery scan (active segment only)
    recovered: list[BatchLocation] = field(default_factory=list)

    @property
    def index_path(self) -> Path:
        return self.path.with_suffix(INDEX_SUFFIX)


@dataclass(frozen=True, slots=True)
class SealedSegment:
    base_offset: int
    next_offset: int
    path: Path
    size: int


class PartitionLog:
    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        segments: list[Segment],
        on_sealed: Callable[[SealedSegment], None] | None = None,
    ) -> None:
        self.directory = directory
        self.config = config
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self.on_sealed = on_sealed
        self._tail: deque[tuple[int, int, bytes]] = deque()
        self._tail_bytes = 0
        self._appended = 0
        self._durable = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._to_seal: list[Segment] = []
        self._dirty: list[Segment] = []
        self._wake = asyncio.Event()
        self._syncer: asyncio.Task[None] | None = None
        self._closed = False
        self._append_listeners: list[Callable[[], None]] = []
        # what was on disk at open counts as durable: it survived whatever stopped the server
        self._durable_offset = segments[-1].next_offset

    # Opening and recovery

    @classmethod
    def open(
        cls,
        directory: Path,
        config: LogConfig,
        start_offset: int = 0,
        on_sealed: Callable[[SealedSegment], None] | None = None,
    ) -> PartitionLog:
        """Open (or create) the log in `directory`; a new log starts at `start_offset`."""
        directory.mkdir(parents=True, exist_ok=True)
        found = sorted(
            (base, directory / name)
            for name in os.listdir(directory)
            if (base := parse_segment_name(name)) is not None
        )
        segments: list[Segment] = []
        for position, (base, path) in enumerate(found):
            is_last = position == len(found) - 1
            size = path.stat().st_size
            index = None if is_last else read_index(path.with_suffix(INDEX_SUFFIX), size)
            if index is not None:
                next_base = found[position + 1][0]
                segments.append(Segment(base, path, next_base, size, index, 0.0, sealed=True))
                continue
            segment = _recover_segment(base, path)
            segment.sealed = not is_last
            if segment.sealed:
                write_index(segment.index_path, segment.index)
            segments.append(segment)
        if not segments:
            path = directory / segment_name(start_offset)
            path.touch()
            segments.append(Segment(start_offset, path, start_offset, 0, [], 0.0, sealed=False))
        log_ = cls(directory, config, segments, on_sealed)
        active = segments[-1]
        active.write_fd = os.open(active.path, os.O_WRONLY | os.O_APPEND)
        active.created = time.monotonic()
        return log_

    def start(self) -> None:
        """Start the background syncer (needs a running event loop)."""
        if self._syncer is None:
            self._syncer = asyncio.get_running_loop().create_task(self._sync_loop())

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

    def recovered_batches(self) -> list[BatchLocation]:
        """The active segment's batches as found on open (for state that follows the WAL)."""
        return list(self._segments[-1].recovered)

    def sealed_segments(self) -> list[SealedSegment]:
        return [
            SealedSegment(s.base_offset, s.next_offset, s.path, s.size)
            for s in self._segments
            if s.sealed and s not in self._to_seal
        ]

    def add_append_listener(self, listener: Callable[[], None]) -> None:
        """Called after each append, and when the durable offset advances."""
        self._append_listeners.append(listener)

    def remove_append_listener(self, listener: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._append_listeners.remove(listener)

    # Appending

    def append(self, batch: bytes, record_count: int) -> tuple[int, int]:
        """Stamp and write a validated batch; returns (base offset, durability sequence)."""
        if self._closed:
            raise RuntimeError("log is closed")
        active = self._segments[-1]
        if active.size > 0 and (
            active.size + len(batch) > self.config.segment_bytes
            or (time.monotonic() - active.created) * 1000 >= self.config.segment_ms
        ):
            active = self._roll()
        base_offset = active.next_offset
        stamped = bytearray(batch)
        stamp_base_offset(stamped, base_offset)
        data = bytes(stamped)
        assert active.write_fd is not None
        _write_all(active.write_fd, data)
        location = batch_location(data, active.size)
        if location.position - active.last_index_position >= INDEX_INTERVAL_BYTES:
            active.index.append(IndexEntry(base_offset, location.position, active.max_timestamp))
            active.last_index_position = location.position
        active.max_timestamp = max(active.max_timestamp, location.max_timestamp)
        active.size += len(data)
        active.next_offset = base_offset + record_count
        if not self._dirty or self._dirty[-1] is not active:
            self._dirty.append(active)
        self._appended += 1
        self._cache(base_offset, active.next_offset, data)
        if self._waiters:
            self._wake.set()
        for listener in self._append_listeners:
            listener()
        return base_offset, self._appended

    def _cache(self, base: int, next_offset: int, data: bytes) -> None:
        self._tail.append((base, next_offset, data))
        self._tail_bytes += len(data)
        while self._tail_bytes > self.config.tail_cache_bytes and len(self._tail) > 1:
            _, _, old = self._tail.popleft()
            self._tail_bytes -= len(old)

    def roll_if_old(self) -> None:
        """Roll the active segment if it has data and has reached `segment_ms`."""
        active = self._segments[-1]
        if active.size and (time.monotonic() - active.created) * 1000 >= self.config.segment_ms:
            self._roll()

    def _roll(self) -> Segment:
        old = self._segments[-1]
        old.sealed = True
        self._to_seal.append(old)
        path = self.directory / segment_name(old.next_offset)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        segment = Segment(
            old.next_offset, path, old.next_offset, 0, [], time.monotonic(), False, fd
        )
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        self._wake.set()
        log.debug("wal.rolled", directory=str(self.directory), base_offset=segment.base_offset)
        return segment

    # Durability

    def must_wait(self, sequence: int, committed: bool = False) -> bool:
        """Whether an ack for append `sequence` waits for an fsync: under policy `always`, or
        when the producer asked for read_committed."""
        if self._durable >= sequence:
            return False
        return committed or self.config.fsync == FsyncPolicy.ALWAYS

    @property
    def durable_offset(self) -> int:
        """Every offset below this is covered by an fsync (or was recovered from disk)."""
        return self._durable_offset

    async def wait_durable(self, sequence: int) -> None:
        """Resolve once an fsync covers append number `sequence`. Waiting starts an fsync now,
        whatever the policy: that is how read_committed works on `interval` and `never` topics."""
        if self._durable >= sequence:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((sequence, future))
        self._wake.set()
        await future

    async def _sync_loop(self) -> None:
        interval = (
            self.config.fsync_interval_ms / 1000
            if self.config.fsync == FsyncPolicy.INTERVAL
            else None
        )
        while True:
            if interval is None:
                await self._wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), interval)
            self._wake.clear()
            try:
                await self._sync_once()
            except OSError as exc:  # a failing disk: waiters keep waiting; say so loudly
                log.error("wal.fsync_failed", directory=str(self.directory), error=str(exc))
                await asyncio.sleep(1)
            if self._closed and not self._to_seal and not self._dirty:
                return

    async def _sync_once(self) -> None:
        target = self._appended
        target_offset = self.next_offset
        if self.config.fsync != FsyncPolicy.NEVER or self._waiters or self._closed:
            dirty, self._dirty = self._dirty, []
            for segment in dirty:
                if segment.write_fd is not None:
                    await asyncio.to_thread(os.fsync, segment.write_fd)
            self._durable = max(self._durable, target)
            self._advance_durable_offset(target_offset)
            waiting, self._waiters = self._waiters, []
            for sequence, future in waiting:
                if sequence > self._durable:
                    self._waiters.append((sequence, future))
                elif not future.done():
                    future.set_result(None)
        sealing, self._to_seal = self._to_seal, []
        for segment in sealing:
            await asyncio.to_thread(_seal, segment)  # fsyncs it whatever the policy
            if self.config.fsync == FsyncPolicy.NEVER:
                self._dirty = [s for s in self._dirty if s is not segment]
                self._advance_durable_offset(segment.next_offset)
            log.info(
                "wal.sealed",
                directory=str(self.directory),
                base_offset=segment.base_offset,
                next_offset=segment.next_offset,
                bytes=segment.size,
            )
            if self.on_sealed is not None:
                self.on_sealed(
                    SealedSegment(
                        segment.base_offset, segment.next_offset, segment.path, segment.size
                    )
                )

    def _advance_durable_offset(self, offset: int) -> None:
        if offset > self._durable_offset:
            self._durable_offset = offset
            for listener in self._append_listeners:
                listener()

    # Reading

    async def read(self, offset: int, max_bytes: int = _READ_CHUNK) -> list[bytes]:
        """Batches from the one holding `offset` on, about `max_bytes` (at least one batch).

        Empty when `offset` is at or past the end, or below `start_offset` (then the caller
        reads the object store).
        """
        cached = self._read_cache(offset, max_bytes)
        if cached is not None:
            return cached
        if offset >= self.next_offset or offset < self.start_offset:
            return []
        segment = self._segments[bisect.bisect_right(self._bases, offset) - 1]
        entry_index = bisect.bisect_right([e.offset for e in segment.index], offset) - 1
        position = segment.index[entry_index].position if entry_index >= 0 else 0
        return await asyncio.to_thread(_read_batches, segment.path, position, offset, max_bytes)

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
        for index in range(low, len(tail)):
            data = tail[index][2]
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
                and segment not in self._to_seal
            ):
                del self._segments[position]
                del self._bases[position]
                segment.path.unlink(missing_ok=True)
                segment.index_path.unlink(missing_ok=True)
                return True
        return False

    # Shutdown

    async def close(self, seal_active: bool = False) -> None:
        """Fsync everything; with `seal_active`, also seal the active segment (for upload)."""
        if self._closed:
            return
        if seal_active and self._segments[-1].size:
            self._roll()
        self._closed = True
        self._wake.set()
        if self._syncer is not None:
            await self._syncer
        else:
            await self._sync_once()
        for segment in self._segments:
            if segment.write_fd is not None:
                await asyncio.to_thread(os.fsync, segment.write_fd)
                os.close(segment.write_fd)
                segment.write_fd = None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _seal(segment: Segment) -> None:
    if segment.write_fd is not None:
        os.fsync(segment.write_fd)
        os.close(segment.write_fd)
        segment.write_fd = None
    write_index(segment.index_path, segment.index)


def _recover_segment(base: int, path: Path) -> Segment:
    scan = scan_segment(path)
    if scan.valid_size < scan.file_size:
        log.warning(
            "wal.truncated",
            segment=str(path),
            kept_bytes=scan.valid_size,
            dropped_bytes=scan.file_size - scan.valid_size,
            reason=scan.problem,
        )
        with path.open("r+b") as file:
            file.truncate(scan.valid_size)
            file.flush()
            os.fsync(file.fileno())
    next_offset = scan.batches[-1].next_offset if scan.batches else base
    if scan.batches and scan.batches[0].base_offset != base:
        log.warning(
            "wal.segment_base_mismatch", segment=str(path), first=scan.batches[0].base_offset
        )
    segment = Segment(
        base, path, next_offset, scan.valid_size, build_index(scan.batches), 0.0, False
    )
    segment.last_index_position = (
        segment.index[-1].position if segment.index else -INDEX_INTERVAL_BYTES
    )
    segment.max_timestamp = max((b.max_timestamp for b in scan.batches), default=-1)
    segment.recovered = scan.batches
    return segment


def _read_batches(path: Path, position: int, offset: int, max_bytes: int) -> list[bytes]:
    batches: list[bytes] = []
    size = 0
    with path.open("rb") as file:
        file.seek(position)
        while True:
            header = file.read(BATCH_HEADER_SIZE)
            if len(header) < BATCH_HEADER_SIZE:
                return batches
            location = batch_location(header, position)
            length = 12 + int.from_bytes(header[8:12], "big")
            if location.next_offset <= offset:
                file.seek(length - BATCH_HEADER_SIZE, os.SEEK_CUR)
                position += length
                continue
            rest = file.read(length - BATCH_HEADER_SIZE)
            if len(rest) < length - BATCH_HEADER_SIZE:
                return batches  # a batch still being written
            batches.append(header + rest)
            size += length
            position += length
            if size >= max_bytes:
                return batches
