"""Ending background tasks: cancel them, wait until they are done, keep the caller cancellable.

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
from typing import Any


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
