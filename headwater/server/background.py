"""Fire-and-forget tasks whose failures are logged where they happen.

A task nobody awaits hides its exception: asyncio reports it only as "Task exception was never
retrieved" when the task is garbage-collected, if ever (a task kept in a set for its reference is
never collected while the set lives), and without the event that says what the task was for.
`spawn` creates the task, keeps a strong reference in its owner's set until it ends (the loop keeps
only a weak one), and logs its exception from a done callback under the caller's dotted event, with
the caller's fields. A cancelled task is not a failure and is not logged.

Every task the server starts and does not await goes through `spawn`; tasks that are awaited (or
whose result a caller retrieves) do not need it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from functools import partial
from typing import Any, TypeVar

import structlog

log = structlog.get_logger("headwater.server")

T = TypeVar("T")


def spawn(
    work: Coroutine[Any, Any, T],
    event: str,
    owner: set[asyncio.Task[Any]] | None = None,
    **fields: object,
) -> asyncio.Task[T]:
    """Run `work` as a task; if it raises, log `event` (with `fields` and the traceback).

    `owner`: the set that holds the task until it ends (the object that started it, so a server's
    tasks are its own and can be cancelled with it)."""
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
