"""Acknowledge a cluster's reliable produce once its batch is in the object store.

`TailCommitter.add` is called by `LogTopic.accept` right after the local append (the WAL is the
owner's cache; the object store is the record any broker can take the partition over from) and
returns what the producer's answer waits for. Batches appended to one partition within
`interval` seconds, by any number of producers, go out as one chunk (`storage.cloud_tail`): one
PUT per partition per interval, not per batch. A partition has at most one chunk in flight, so
its chunks are contiguous and in order; partitions flush independently.

A chunk is stored, and a failed PUT retried (the same chunk with the same bytes: a retry that
merged newer batches would make two chunks start at one offset, with doubling delays), until the
partition is lost (`reset`), never given up before: a chunk failed while the next one is stored
would leave a hole in the partition's tail, and a take-over keeps only the chain's last
contiguous run. So neither a lease renewal confirmed late nor a graceful hand-off stops a chunk:
a chunk of a broker that lost the partition is fenced by the new owner's marker anyway.
The answer is sent once the PUT has completed, and only if the broker then still holds the
partition under a confirmed lease (`Standing.HELD`; while the confirmation is late, LAPSED, it
waits for the watchdog's verdict): a fenced broker could have been replaced by an owner that no
longer counts this chunk, so its producers get NOT_OWNER and retry at the new owner
(at-least-once: the batch may then be stored twice, never lost).
Whatever was added before a loss (`reset`) is never stored after it, even if this broker serves
the partition again meanwhile (same epoch, after an etcd outage): its log was rebuilt, and those
offsets belong to other batches now.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from headwater.server.cluster.coordinator_state import Standing
from headwater.storage.cloud_tail import Chunk, CloudTail
from headwater.wire.errors import HeadwaterError, StorageError

log = structlog.get_logger(__name__)

_RETRY_INITIAL = 0.05
_RETRY_MAX = 2.0
# how often a LAPSED standing is looked at again, and for how long at most (the watchdog settles
# it within half a second of the deadline; the bound only keeps a broken watchdog from hanging)
_LAPSE_POLL = 0.02
_LAPSE_LIMIT = 30.0


@dataclass(slots=True)
class _Pending:
    first: int = -1
    end: int = -1
    batches: list[bytes] = field(default_factory=list)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    generation: int = 0


class TailCommitter:
    def __init__(
        self,
        tail: CloudTail,
        interval: float,
        standing: Callable[[str, int], Standing],
        epoch: Callable[[str, int], int | None],
        not_owner: Callable[[str, int], HeadwaterError],
    ) -> None:
        self._tail = tail
        self._interval = interval
        self._standing = standing
        self._epoch = epoch
        self._not_owner = not_owner
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._flushing: dict[tuple[str, int], asyncio.Task[None]] = {}
        # bumped by `reset`: a chunk added before a loss must never be stored after it, even if
        # the partition is served again by then (same epoch after an etcd outage): the rebuilt
        # log reuses its offsets for other batches
        self._generation: dict[tuple[str, int], int] = {}
        self.chunks = 0
        self.failures = 0
        self.on_stored: Callable[[str, int, int], None] = lambda topic, partition, end: None

    def add(
        self, topic: str, partition: int, base: int, batch: bytes, count: int
    ) -> Awaitable[None]:
        """`batch` stamped with its base offset; the answer waits on the returned future."""
        key = (topic, partition)
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending(
                first=base, end=base, generation=self._generation.get(key, 0)
            )
        if base != pending.end:  # the WAL assigns offsets in order: a gap is a bug upstream
            raise StorageError(f"{topic}/{partition}: batch at {base}, chunk ends at {pending.end}")
        pending.batches.append(batch)
        pending.end = base + count
        waiter = asyncio.get_running_loop().create_future()
        pending.waiters.append(waiter)
        if key not in self._flushing:
            self._flushing[key] = asyncio.get_running_loop().create_task(self._run(key))
        return waiter

    def reset(self, topic: str, partition: int) -> None:
        """Fail what waits for a partition (it was lost or is being rebuilt), including a chunk
        whose PUT is being retried: it is not retried again."""
        key = (topic, partition)
        self._generation[key] = self._generation.get(key, 0) + 1
        pending = self._pending.pop(key, None)
        if pending is not None:
            self._fail(pending, self._not_owner(topic, partition))

    async def drain(self, topic: str, partition: int) -> None:
        """Wait until what was added for the partition is stored (a graceful hand-off)."""
        task = self._flushing.get((topic, partition))
        if task is not None:
            await asyncio.shield(task)

    async def settle(self, topic: str, partition: int) -> None:
        """Wait until no PUT of the partition is in flight (a take-over lists the tail only then:
        a chunk of before a loss must not land after the listing)."""
        task = self._flushing.get((topic, partition))
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    def _current(self, key: tuple[str, int], pending: _Pending) -> bool:
        """Not lost since it was added (deliberately not whether the partition is served now:
        see the module's description)."""
        return pending.generation == self._generation.get(key, 0)

    async def _confirmed(self, key: tuple[str, int], pending: _Pending) -> bool:
        """Still held under a confirmed lease, and not lost since it was added: its answer may
        be sent."""
        standing = self._standing(*key)
        polls = int(_LAPSE_LIMIT / _LAPSE_POLL)
        while standing is Standing.LAPSED and polls > 0 and self._current(key, pending):
            await asyncio.sleep(_LAPSE_POLL)
            standing = self._standing(*key)
            polls -= 1
        return standing is Standing.HELD and self._current(key, pending)

    async def _run(self, key: tuple[str, int]) -> None:
        try:
            while self._pending.get(key) is not None:
                await asyncio.sleep(self._interval)  # the window that groups producers' batches
                pending = self._pending.pop(key, None)
                if pending is None:
                    return
                await self._store(key, pending)
        finally:
            self._flushing.pop(key, None)

    async def _store(self, key: tuple[str, int], pending: _Pending) -> None:
        topic, partition = key
        epoch = self._epoch(topic, partition)
        if epoch is None or not self._current(key, pending):
            self._fail(pending, self._not_owner(topic, partition))
            return
        chunk = Chunk(pending.first, pending.end, epoch)
        data = b"".join(pending.batches)
        delay = _RETRY_INITIAL
        while True:
            try:
                await self._tail.put(topic, partition, chunk, data)
                break
            except StorageError as exc:
                self.failures += 1
                log.warning(
                    "cluster.tail_put_failed",
                    topic=topic,
                    partition=partition,
                    first=chunk.first,
                    error=str(exc),
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX)
            if not self._current(key, pending):
                self._fail(pending, self._not_owner(topic, partition))
                return
        if not await self._confirmed(key, pending):
            self._fail(pending, self._not_owner(topic, partition))
            return
        self.chunks += 1
        self.on_stored(topic, partition, chunk.end)
        for waiter in pending.waiters:
            if not waiter.done():
                waiter.set_result(None)

    @staticmethod
    def _fail(pending: _Pending, error: HeadwaterError) -> None:
        for waiter in pending.waiters:
            if not waiter.done():
                waiter.set_exception(error)
