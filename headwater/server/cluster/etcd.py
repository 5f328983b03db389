"""The coordinator's connection to etcd: calls with a deadline, and prefix caches kept by watches.

`EtcdSession.call` runs one aetcd call under `asyncio.timeout`: a blackholed etcd costs a
timeout, never a hang, and every failure (refused, timed out, etcd error) comes out as
`EtcdUnavailable`. With several endpoints, repeated failures move the session to the next one (a
new aetcd client; the watches notice their stream ended and come back on it).

`PrefixWatch` keeps a copy of every key under a prefix: it reads the prefix, then watches from
the read's revision + 1, so no change between the read and the watch is missed. When the watch
breaks (etcd restarted, the session moved, `restart()` after an outage) it reads again and
reports the difference between the old copy and the new read as changes, then watches on: the
callback sees every change, in revision order, at most once per revision.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aetcd
import structlog

from headwater.storage.tasks import end_tasks

log = structlog.get_logger(__name__)

T = TypeVar("T")

# gRPC backs off up to 2 minutes between reconnections by default: far beyond a lease's TTL
_CHANNEL_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
}


# seconds a call that nothing fences on may take (topic definitions, subscriptions, checkpoints,
# exclusive claims): a slow answer there costs a client only time, a short deadline an error
UNFENCED_CALL_TIMEOUT = 10.0


class EtcdUnavailable(Exception):
    """etcd did not answer in time, refused the connection or failed the call."""


@dataclass(frozen=True, slots=True)
class Entry:
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


def entry_of(kv: Any) -> Entry:
    return Entry(bytes(kv.value), int(kv.create_revision), int(kv.mod_revision), int(kv.lease))


class EtcdSession:
    def __init__(self, endpoints: list[tuple[str, int]], call_timeout: float) -> None:
        self.endpoints = endpoints
        self.call_timeout = call_timeout
        self._index = 0
        self._failures = 0
        self.client = self._client()
        self.reachable = True

    @property
    def current(self) -> str:
        host, port = self.endpoints[self._index]
        return f"{host}:{port}"

    def _client(self) -> aetcd.Client:
        host, port = self.endpoints[self._index]
        return aetcd.Client(
            host,
            port,
            # aetcd puts this gRPC deadline on every call: it must let the longest deadline a
            # caller passes to `call` run out (at the session's own, the unfenced calls failed
            # with "Deadline Exceeded" after 2 s instead of 10 under load). `call` times each
            # call; this only backs it up.
            timeout=math.ceil(max(self.call_timeout, UNFENCED_CALL_TIMEOUT)),
            options=dict(_CHANNEL_OPTIONS),
            connect_wait_timeout=max(1, round(self.call_timeout)),
        )

    async def call(
        self, operation: Callable[[aetcd.Client], Awaitable[T]], timeout: float | None = None
    ) -> T:
        client = self.client
        task = asyncio.current_task()
        cancels_before = task.cancelling() if task is not None else 0
        try:
            async with asyncio.timeout(timeout or self.call_timeout):
                result = await operation(client)
        except Exception as exc:  # refused, timed out, an etcd or gRPC error: all the same here
            self.reachable = False
            self._failures += 1
            if len(self.endpoints) > 1 and self._failures >= 2 and client is self.client:
                self._rotate()
            raise EtcdUnavailable(f"etcd {self.current}: {type(exc).__name__}: {exc}") from None
        if task is not None and task.cancelling() > cancels_before:
            # aetcd waits with `asyncio.wait_for` (a watch's creation, the connection), which in
            # Python 3.11 returns the result when a cancellation races it: the caller was
            # cancelled and must stop (a watch loop that ran on held a broker's stop forever)
            raise asyncio.CancelledError
        self.reachable = True
        self._failures = 0
        return result

    def _rotate(self) -> None:
        old = self.client
        self._index = (self._index + 1) % len(self.endpoints)
        self._failures = 0
        self.client = self._client()
        log.warning("cluster.endpoint_switched", endpoint=self.current)
        _background(self._close(old))

    async def _close(self, client: aetcd.Client) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.call_timeout):
                await client.close()

    async def close(self) -> None:
        await self._close(self.client)


_background_tasks: set[asyncio.Task[Any]] = set()


def _background(work: Awaitable[Any]) -> None:
    """Fire and forget, with a reference held so the task is not collected mid-way."""

    async def run() -> None:
        await work

    task = asyncio.get_running_loop().create_task(run())
    _background_tasks.add(task)
    task.add_done_callback(_background_tasks.discard)


Changed = Callable[[bytes, Entry | None], Awaitable[None]]


class PrefixWatch:
    def __init__(self, session: EtcdSession, prefix: bytes, on_change: Changed) -> None:
        self.session = session
        self.prefix = prefix
        self.items: dict[bytes, Entry] = {}
        self.revision = 0
        self.synced = asyncio.Event()
        self._on_change = on_change
        self._watch: Any = None
        self._task: asyncio.Task[None] | None = None

    async def load(self) -> None:
        """Read the prefix; report what changed since the last copy (every key, the first time)."""
        answer = await self.session.call(lambda c: c.get_prefix(self.prefix))
        fresh = {bytes(kv.key): entry_of(kv) for kv in answer}
        old = self.items
        self.items = fresh
        self.revision = int(answer.header.revision)
        for key in sorted(set(old) - set(fresh)):
            await self._report(key, None)
        changed = [key for key, entry in fresh.items() if old.get(key) != entry]
        for key in sorted(changed, key=lambda k: fresh[k].mod_revision):
            await self._report(key, fresh[key])

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def restart(self) -> None:
        """End the current watch: the loop reads the prefix again and watches from there."""
        self.synced.clear()
        watch, self._watch = self._watch, None
        if watch is not None:
            _background(self.session.call(lambda c: watch.cancel()))

    async def stop(self) -> None:
        if self._task is not None:
            await end_tasks(self._task)
            self._task = None
        self.restart()

    async def _run(self) -> None:
        backoff = 0.05
        loaded = True  # start() follows the first load()
        while True:
            try:
                if not loaded:
                    await self.load()
                loaded = False
                self._watch = await self.session.call(self._watch_from_copy)
                self.synced.set()
                async for event in self._watch:
                    await self._event(event)
                    backoff = 0.05
            except EtcdUnavailable as exc:
                log.debug("cluster.watch_failed", prefix=self.prefix.decode(), error=str(exc))
            except Exception as exc:  # the stream broke (etcd restarted, compacted, ...)
                log.info("cluster.watch_broken", prefix=self.prefix.decode(), error=repr(exc))
            self.synced.clear()
            self._watch = None
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    def _watch_from_copy(self, client: aetcd.Client) -> Awaitable[Any]:
        # from the revision after the copy's: nothing between the read and the watch is missed
        return client.watch_prefix(self.prefix, start_revision=self.revision + 1)  # type: ignore[no-any-return]  # aetcd is untyped

    async def _event(self, event: Any) -> None:
        # the watch starts after the copy's revision: every event is newer than the copy (one
        # revision may hold many events: a revoked lease deletes all its keys at once)
        key = bytes(event.kv.key)
        self.revision = max(self.revision, int(event.kv.mod_revision))
        if event.kind == aetcd.EventKind.DELETE:
            if self.items.pop(key, None) is not None:
                await self._report(key, None)
        else:
            entry = entry_of(event.kv)
            self.items[key] = entry
            await self._report(key, entry)

    async def _report(self, key: bytes, entry: Entry | None) -> None:
        try:
            await self._on_change(key, entry)
        except Exception:
            log.exception("cluster.watch_callback_failed", key=key.decode(errors="replace"))
