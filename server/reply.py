"""What a handler answers, and what the answer waits for.

A handler returns a `Reply`: most often the response itself (a non-reliable produce, a map get, a
flow: nothing to wait for, nothing allocated for the answer), or a `Waiting` that says what must
happen before the response can be written:

- `AfterDurable(response, durable)`: the response is known, but the promise it makes needs the
  data on disk first (a reliable produce under fsync `always` or read_committed, a map set, a new
  producer id): the connection writes it once `durable` completes. The wait needs no turn of the
  topic, so produces queued behind this one do not wait for its fsync.
- `AfterWork(work)`: the handler must await before it even has a response (a turn of the topic,
  a WAL read to find a timestamp, building last-value state); `work` ends in a `Reply`.

`Waiting.resolve()` gives the final response; the connection awaits it in a task of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import Any

from wire import messages as m


class Waiting:
    __slots__ = ()

    async def resolve(self) -> m.Response:
        raise NotImplementedError


class AfterDurable(Waiting):
    __slots__ = ("durable", "response")

    def __init__(self, response: m.Response, durable: Awaitable[Any]) -> None:
        self.response = response
        self.durable = durable

    async def resolve(self) -> m.Response:
        await self.durable
        return self.response


class AfterWork(Waiting):
    __slots__ = ("work",)

    def __init__(self, work: Coroutine[Any, Any, Reply]) -> None:
        self.work = work

    async def resolve(self) -> m.Response:
        return await resolve(await self.work)


Reply = m.Response | Waiting


def after(response: m.Response, *durable: Awaitable[Any] | None) -> Reply:
    """`response`, once every given wait (None: nothing to wait for) completes."""
    waits = [w for w in durable if w is not None]
    if not waits:
        return response
    if len(waits) == 1:
        return AfterDurable(response, waits[0])
    return AfterDurable(response, asyncio.gather(*waits))


async def resolve(reply: Reply) -> m.Response:
    if isinstance(reply, Waiting):
        return await reply.resolve()
    return reply
