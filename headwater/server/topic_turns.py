"""Per-topic-name turns: what serialises the operations that must not interleave on a topic.

Each topic name has a line (FIFO) of turns. Create, delete, subscribe, seek, DELETE_SUBSCRIPTION,
the last-value catch-up and writing a dead letter each run in a turn of the name they act on,
awaits included: a delete never iterates subscriptions a subscribe is adding, a create of a name
starts only once the delete of that name has removed every file and state key, and the catch-up
never races the delete that removes its state.

A place in the line is taken synchronously (`turn`), when the request is read, not when its
handler task first runs. So requests pipelined on a connection keep their order: a produce that
follows a CREATE_TOPIC in the same read waits for the create (the broker queues any request
naming a topic while that name's line is not empty) instead of overtaking it and finding no
topic. A name with an empty line costs nothing: produce and map get stay synchronous.

A turn taken `produces_pass` (a cluster's take-over of one partition) is one produces do not
queue behind (`blocks_produce`): it holds the topic for a few hundred milliseconds while it claims
the partition in the object store, and the produces to the topic's other partitions at the new
owner waited as long (issue 42). A produce still queues when any other turn is in the line.

Lines exist only while someone holds or waits for a turn. After `close`, no new turn is given
(SERVER_SHUTTING_DOWN), and `idle` lets shutdown wait for the turns still running.

A turn is given up when its `async with` ends, or when waiting for it fails (cancelled). A turn
taken for a coroutine that never gets that far (closed or cancelled before its first step, or
dropped and garbage-collected: a handler's `AfterWork` nobody awaited) would otherwise hold its
name's line forever, and every later request naming the topic would queue behind it. So a `Turn`
gives its place up when it is collected without having been released (`weakref.finalize`), through
`call_soon_threadsafe`: a collection may run on any thread, and the line's futures are the loop's.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import deque
from types import TracebackType

from headwater.wire.errors import ServerShuttingDown


class Turn:
    """One place in a name's line; `async with` waits for it and gives it up at the end."""

    def __init__(self, locks: NameLocks, name: str, future: asyncio.Future[None]) -> None:
        self._locks = locks
        self._name = name
        self._future = future
        # given up if this turn is collected unreleased (the module doc); holds no reference
        # to the turn itself, or the turn would never be collected
        self._dropped = weakref.finalize(
            self, _release_dropped, asyncio.get_running_loop(), locks, name, future
        )

    async def __aenter__(self) -> None:
        try:
            await self._future
        except BaseException:
            self._release()
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._release()

    def _release(self) -> None:
        self._dropped.detach()
        self._locks._release(self._name, self._future)


def _release_dropped(
    loop: asyncio.AbstractEventLoop, locks: NameLocks, name: str, future: asyncio.Future[None]
) -> None:
    """A turn collected while still in its line: give its place up on the loop."""
    with contextlib.suppress(RuntimeError):  # the loop is closed: no line is left to unblock
        loop.call_soon_threadsafe(locks._release, name, future)


class NameLocks:
    def __init__(self) -> None:
        self._lines: dict[str, deque[asyncio.Future[None]]] = {}
        self._passable: set[asyncio.Future[None]] = set()  # turns produces need not wait for
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()

    def busy(self, name: str) -> bool:
        """Whether some operation on `name` runs or waits."""
        return name in self._lines

    def blocks_produce(self, name: str) -> bool:
        """Whether some operation on `name` that a produce must wait for runs or waits: any
        but the turns taken `produces_pass`."""
        line = self._lines.get(name)
        return line is not None and any(f not in self._passable for f in line)

    def turn(self, name: str, produces_pass: bool = False) -> Turn:
        """Take a place in `name`'s line now; enter the returned `Turn` to wait for it.
        `produces_pass`: produces do not queue behind this one (`blocks_produce`): a take-over
        of one partition, which changes nothing the topic's other partitions' produces touch
        (its own partition's are refused NOT_OWNER until it is served)."""
        if self._closed:
            raise ServerShuttingDown("the server is shutting down")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if produces_pass:
            self._passable.add(future)
        line = self._lines.setdefault(name, deque())
        if not line:
            future.set_result(None)
        line.append(future)
        self._idle.clear()
        return Turn(self, name, future)

    def hold(self, name: str) -> Turn:
        return self.turn(name)

    def _release(self, name: str, future: asyncio.Future[None]) -> None:
        self._passable.discard(future)
        line = self._lines.get(name)
        if line is None or future not in line:
            return
        first = line[0] is future
        line.remove(future)
        if not line:
            del self._lines[name]
            if not self._lines:
                self._idle.set()
        elif first and not line[0].done():
            line[0].set_result(None)

    def close(self) -> None:
        self._closed = True

    async def idle(self) -> None:
        await self._idle.wait()
