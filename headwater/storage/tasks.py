"""Background tasks: started with their failures logged (`spawn`), ended (`end_tasks`).

A task nobody awaits hides its exception: asyncio reports it only as "Task exception was never
retrieved" when the task is garbage-collected, if ever (a task kept in a set for its reference is
never collected while the set lives), and without the event that says what the task was for.
`spawn` creates the task, keeps a strong reference in its owner's set until it ends (the loop keeps
only a weak one), and logs its exception from a done callback under the caller's dotted event, with
the caller's fields. A cancelled task is not a failure and is not logged. Every task the server
and the storage start and do not await go through it.

Ending them: cancel them, wait until they are done, keep the caller cancellable.

`end_tasks` is what every close and stop uses for its loops. The obvious form, `task.cancel()`
then `await task` under `suppress(CancelledError)`, swallows the caller's own cancellation too:
a stop bounded by a shutdown deadline then ran on past it, waiting for a loop that had lost its
cancellation (aetcd's `asyncio.wait_for` returns a result that races a cancellation in Python
3.11). `asyncio.gather` is no better: cancelled, it still waits for every child. `asyncio.wait`
returns when the tasks are done and raises at once when its caller is cancelled. The tasks'
outcomes are read, so an exception of a cancelled loop is not reported as never retrieved: it is
the loop's business, logged where the loop runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from functools import partial
from typing import Any, TypeVar

import structlog

log = structlog.get_logger(__name__)

T = TypeVar("T")


def spawn(
    work: Coroutine[Any, Any, T],
    event: str,
    owner: set[asyncio.Task[Any]] | None = None,
    **fields: object,
) -> asyncio.Task[T]:
    """Run `work` as a task; if it raises, log `event` (with `fields` and the traceback).

    `owner`: the set that holds the task until it ends (the object that started it, so its tasks
    are its own and can be ended with it)."""
    task = asyncio.get_running_loop().create_task(work)
    if owner is not None:
        owner.add(task)
    task.add_done_callback(partial(_ended, event, owner, fields))
    return task


def _ended(
    event: str,
    owner: set[asyncio.Task[Any]] | None,
    fields: dict[str, object],
    task: asyncio.Task[Any],
) -> None:
    if owner is not None:
        owner.discard(task)
    if task.cancelled():
        return
    error = task.exception()  # retrieved: asyncio does not report it again at collection
    if error is not None:
        log.error(event, error=repr(error), exc_info=error, **fields)


async def end_tasks(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel `tasks` (None: nothing started) and wait until all are done."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    if not running:
        return
    await asyncio.wait(running)
    for task in running:
        if not task.cancelled():
            task.exception()  # read: an ending loop's error is not "never retrieved"
