"""Acknowledge a cluster's reliable produce once its batch is in the object store, with one object
per broker per commit window (`tail_layout = "broker"`; the per-partition committer is
`tail_commit.TailCommitter`, whose interface this one has).

Every `interval` the batches added for every partition since the last window, by any number of
producers, go out as one object (`shared_tail.shared_name`), each partition's batches one slice;
up to `in_flight` windows are PUT at once (while all are busy, batches gather into the next
window: fewer, larger objects). Once a window's object is stored, its slices are named in the
etcd index by one transaction (`SharedTail.commit`), and the windows' transactions run one at a
time in window order: a partition's entries enter the index in offset order, so the index never
names a slice while an earlier one of the same partition is missing. A producer is answered once
its slice is named (under the claim token: the partition is still ours, whatever `serves()` said
meanwhile).

As in the per-partition committer: a failed PUT or transaction is retried (the same bytes, the
same entries) with doubling delays until the partition is lost, never given up (that would
leave a hole in the partition's index); whatever was added
before a loss (`reset`) is never named after it (its generation is gone, and the take-over's new
claim token fails the transaction anyway); a take-over waits for the partition's windows in
flight (`settle`). A window whose object grew older than `REPUT_AFTER` while its transaction was
retried is written again under a new name first, so an entry never names an object the shared
objects' collection may take.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from headwater.server.cluster.shared_tail import REPUT_AFTER, SharedTail, Slice, shared_name
from headwater.storage.cloud_tail import Chunk
from headwater.wire.errors import HeadwaterError, StorageError

log = structlog.get_logger(__name__)

_RETRY_INITIAL = 0.05
_RETRY_MAX = 2.0
IN_FLIGHT = 4  # windows whose PUT or transaction is under way at once
_DRAIN_POLL = 1.0  # a drain looks again at least this often
_DRAIN_ROUNDS = 3600
_COLLECT_EVERY = 60.0  # seconds between passes of the shared objects' collection


@dataclass(slots=True)
class _Pending:
    first: int
    end: int
    generation: int
    batches: list[bytes] = field(default_factory=list)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)


@dataclass(slots=True)
class _Part:
    """A partition's slice of one window, until it is named or failed."""

    key: tuple[str, int]
    pending: _Pending
    epoch: int
    token: bytes
    position: int = 0
    length: int = 0


class SharedCommitter:
    def __init__(
        self,
        tail: SharedTail,
        broker_id: str,
        interval: float,
        epoch: Callable[[str, int], int | None],
        not_owner: Callable[[str, int], HeadwaterError],
        in_flight: int = IN_FLIGHT,
    ) -> None:
        self._tail = tail
        self._broker_id = broker_id
        self._interval = interval
        self._epoch = epoch
        self._not_owner = not_owner
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._generation: dict[tuple[str, int], int] = {}
        self._windows_of: dict[tuple[str, int], int] = {}  # windows in flight holding it
        self._gate = asyncio.Semaphore(in_flight)
        self._previous: asyncio.Future[None] | None = None  # the last window's index step
        self._runner: asyncio.Task[None] | None = None
        self._windows: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._sequence = 0
        self._collector: asyncio.Task[None] | None = None
        self.chunks = 0  # objects stored (one per window)
        self.failures = 0
        self.on_stored: Callable[[str, int, int], None] = lambda topic, partition, end: None

    def start(self) -> None:
        self._collector = asyncio.get_running_loop().create_task(self._collect_loop())

    async def close(self) -> None:
        tasks = [*self._windows]
        for task in (self._runner, self._collector):
            if task is not None:
                tasks.append(task)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    def add(
        self, topic: str, partition: int, base: int, batch: bytes, count: int
    ) -> Awaitable[None]:
        """`batch` stamped with its base offset; the answer waits on the returned future."""
        key = (topic, partition)
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending(base, base, self._generation.get(key, 0))
        if base != pending.end:  # the WAL assigns offsets in order: a gap is a bug upstream
            raise StorageError(f"{topic}/{partition}: batch at {base}, slice ends at {pending.end}")
        pending.batches.append(batch)
        pending.end = base + count
        waiter = asyncio.get_running_loop().create_future()
        pending.waiters.append(waiter)
        if self._runner is None:
            self._runner = asyncio.get_running_loop().create_task(self._run())
        return waiter

    def reset(self, topic: str, partition: int) -> None:
        """Fail what waits for a partition (it was lost or is being rebuilt), including slices
        in windows under way: they are not named."""
        key = (topic, partition)
        self._generation[key] = self._generation.get(key, 0) + 1
        pending = self._pending.pop(key, None)
        if pending is not None:
            _fail(pending, self._not_owner(topic, partition))

    async def drain(self, topic: str, partition: int) -> None:
        """Wait until what was added for the partition is named (a graceful hand-off)."""
        key = (topic, partition)
        for _ in range(_DRAIN_ROUNDS):  # (the coordinator's release_timeout bounds it sooner)
            if key not in self._pending and not self._windows_of.get(key, 0):
                return
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_DRAIN_POLL):
                    await changed.wait()
        raise StorageError(f"{topic}/{partition}: its windows are still under way")

    async def settle(self, topic: str, partition: int) -> None:
        """Wait until no window holding the partition is under way (a take-over reads the
        index only then)."""
        await self.drain(topic, partition)

    def _current(self, key: tuple[str, int], pending: _Pending) -> bool:
        """Not lost since it was added. Deliberately not `serves()`: the claim token fences a
        slice of a partition that moved, and `serves()` can turn False for a moment without a
        loss (a renewal confirmed just after the deadline passed, before the watchdog fenced):
        failing that window's slice while the next one is named would leave a hole in the
        partition's index, and a take-over keeps only the chain's last contiguous run."""
        return pending.generation == self._generation.get(key, 0)

    def _signal(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                await asyncio.sleep(self._interval)  # the window that groups the batches
                await self._gate.acquire()  # meanwhile batches keep gathering
                window, self._pending = self._pending, {}
                if not window:
                    self._gate.release()
                    continue
                for key in window:
                    self._windows_of[key] = self._windows_of.get(key, 0) + 1
                previous = self._previous
                done: asyncio.Future[None] = loop.create_future()
                self._previous = done
                task = loop.create_task(self._window(window, previous, done))
                self._windows.add(task)
                task.add_done_callback(self._windows.discard)
        finally:
            self._runner = None

    async def _window(
        self,
        window: dict[tuple[str, int], _Pending],
        previous: asyncio.Future[None] | None,
        done: asyncio.Future[None],
    ) -> None:
        parts: list[_Part] = []
        try:
            parts = self._parts(window)
            if parts:
                await self._name(parts, await self._store(parts), previous)
            elif previous is not None:
                await asyncio.shield(previous)
        except Exception as exc:  # a bug: its producers must not wait forever
            log.error("cluster.shared_window_failed", error=repr(exc))
            for part in parts:
                _fail(part.pending, StorageError(f"tail window failed: {exc}"))
        finally:
            if not done.done():
                done.set_result(None)
            for key in window:
                self._windows_of[key] -= 1
                if not self._windows_of[key]:
                    del self._windows_of[key]
            self._gate.release()
            self._signal()

    def _parts(self, window: dict[tuple[str, int], _Pending]) -> list[_Part]:
        parts = []
        for key, pending in window.items():
            epoch = self._epoch(*key)
            token = self._tail.token(*key)
            if epoch is None or token is None or not self._current(key, pending):
                _fail(pending, self._not_owner(*key))
                continue
            parts.append(_Part(key, pending, epoch, token))
        return parts

    def _drop_stale(self, parts: list[_Part]) -> list[_Part]:
        kept = []
        for part in parts:
            if self._current(part.key, part.pending):
                kept.append(part)
            else:
                _fail(part.pending, self._not_owner(*part.key))
        return kept

    async def _store(self, parts: list[_Part]) -> tuple[str, float, bytes]:
        """PUT the window's object (retried while any of its partitions is served); returns its
        key, when it was stored, and its bytes."""
        position = 0
        pieces = []
        for part in parts:
            data = b"".join(part.pending.batches)
            part.position, part.length = position, len(data)
            position += len(data)
            pieces.append(data)
        data = b"".join(pieces)
        delay = _RETRY_INITIAL
        while True:
            self._sequence += 1
            name = shared_name(self._broker_id, self._sequence)
            try:
                await self._tail.store.put(name, data)
                self.chunks += 1
                return name, time.monotonic(), data
            except StorageError as exc:
                self.failures += 1
                log.warning("cluster.shared_put_failed", object=name, error=str(exc))
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX)
            if not self._drop_stale(parts):
                return name, time.monotonic(), data  # nothing left to name

    async def _name(
        self,
        parts: list[_Part],
        stored: tuple[str, float, bytes],
        previous: asyncio.Future[None] | None,
    ) -> None:
        """Name the parts still current in the index, after the previous window's step, then
        answer their producers."""
        name, stored_at, data = stored
        if previous is not None:
            await asyncio.shield(previous)  # (never fails: set in a finally)
        delay = _RETRY_INITIAL
        while parts := self._drop_stale(parts):
            if time.monotonic() - stored_at > REPUT_AFTER:
                # the shared objects' collection could take an object this old: write it again
                try:
                    self._sequence += 1
                    fresh = shared_name(self._broker_id, self._sequence)
                    await self._tail.store.put(fresh, data)
                    name, stored_at = fresh, time.monotonic()
                except StorageError as exc:
                    log.warning("cluster.shared_put_failed", object=name, error=str(exc))
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _RETRY_MAX)
                    continue
            slices = [
                Slice(
                    part.key[0],
                    part.key[1],
                    part.token,
                    Chunk(
                        part.pending.first,
                        part.pending.end,
                        part.epoch,
                        shared=name,
                        position=part.position,
                        length=part.length,
                    ),
                )
                for part in parts
            ]
            try:
                lost = await self._tail.commit(slices)
            except StorageError as exc:
                self.failures += 1
                log.warning("cluster.shared_index_failed", object=name, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX)
                continue
            for part in parts:
                topic, partition = part.key
                if part.key in lost or not self._current(part.key, part.pending):
                    _fail(part.pending, self._not_owner(topic, partition))
                    continue
                self.on_stored(topic, partition, part.pending.end)
                for waiter in part.pending.waiters:
                    if not waiter.done():
                        waiter.set_result(None)
            return

    async def _collect_loop(self) -> None:
        while True:
            await asyncio.sleep(_COLLECT_EVERY)
            try:
                await self._tail.collect_objects()
            except Exception as exc:  # etcd or the object store away: the next pass
                log.warning("cluster.shared_collect_failed", error=str(exc))


def _fail(pending: _Pending, error: HeadwaterError) -> None:
    for waiter in pending.waiters:
        if not waiter.done():
            waiter.set_exception(error)
