"""Many awaitables, a few at a time: the catalog opens and closes thousands of topics this way.

`bounded_gather` starts every awaitable under a semaphore of `limit` slots and returns their
results in order. Every one runs to its end even when another fails (a failed close must not
leave the other topics unclosed); the first error is raised after that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")


async def bounded_gather(awaitables: Iterable[Awaitable[T]], limit: int) -> list[T]:
    slots = asyncio.Semaphore(limit)

    async def one(awaitable: Awaitable[T]) -> T:
        async with slots:
            return await awaitable

    results = await asyncio.gather(*(one(a) for a in awaitables), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]  # no exception among them
