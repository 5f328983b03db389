"""What a handler answers, and what the answer waits for.

A handler returns a `Reply`: most often the response itself (a non-reliable produce, a map get, a
flow: nothing to wait for, nothing allocated for the answer), or a `Waiting` that says what must
happen before the response can be written:

- `AfterDurable(response, durable)`: the response is known, but the promise it makes needs the
  data on disk first (a reliable produce under fsync `always` or fsynced isolation, a map set, a new
  producer id): the connection writes it once `durable` completes. The wait needs no turn of the
  topic, so produces queued behind this one do not wait for its fsync.
- `AfterWork(work)`: the handler must await before it even has a response (a turn of the topic,
  a WAL read to find a timestamp, building last-value state); `work` ends in a `Reply`.
- `AfterData(work)`: as `AfterWork`, but awaited after the topic's turn is given up: a FETCH long
  poll waiting for appends must not hold the turn the produces bringing them may queue on.
- `AfterOwner(work)`: as `AfterData`, for a request waiting for a change of owner: a produce
  waiting for this broker's take-over of its partition (which holds the topic's turn), a LOOKUP
  long poll. The connection counts it as it counts `AfterWork` (MAX_WAITING_REQUESTS, the memory
  budget): a produce holds its batch, and a client could pipeline long polls without end.

`Waiting.resolve()` gives the final response; the connection awaits it in a task of its own.
A `bulky` response (a listing of many topics, a topic with many subscriptions) is encoded on a
worker thread, so one client's large answer does not freeze the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from headwater.wire import messages as m
from headwater.wire.frames import FrameHeader
from headwater.wire.protocol import encode_response


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


class AfterData(Waiting):
    __slots__ = ("work",)

    def __init__(self, work: Coroutine[Any, Any, Reply]) -> None:
        self.work = work

    async def resolve(self) -> m.Response:
        return await resolve(await self.work)


class AfterOwner(AfterData):
    __slots__ = ()


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


# Answers with more elements than this are encoded on a worker thread, not the loop (`bulky`):
# encoding costs ~100 µs per topic or subscription, so listing 10,000 topics froze every
# client for 1.35 s.
BULKY_ELEMENTS = 200


def bulky(response: m.Response) -> bool:
    if isinstance(response, m.ListTopicsResponse):
        return len(response.topics) > BULKY_ELEMENTS
    if isinstance(response, m.DescribeTopicResponse | m.ListSubscriptionsResponse):
        return len(response.subscriptions) > BULKY_ELEMENTS
    return False


def encoder_thread() -> ThreadPoolExecutor:
    """The encoder for a listener's connections, owned and shut down by the listener. One thread
    for all of them: it yields the GIL to the loop every switch interval, where several threads
    taking turns (one per pipelined LIST_TOPICS) starved the loop for hundreds of ms."""
    return ThreadPoolExecutor(1, thread_name_prefix="hw-encode")


async def encode_off_loop(
    header: FrameHeader,
    response: m.Response,
    write: Callable[[bytes], None],
    encoder: Executor | None,
) -> None:
    """Encode `response` on the `encoder` thread (None: on the loop), then `write` it."""
    if encoder is None:  # a connection built without a listener (tests, embedders)
        write(encode_response(header.api_key, header.correlation_id, response))
        return
    write(
        await asyncio.get_running_loop().run_in_executor(
            encoder, encode_response, header.api_key, header.correlation_id, response
        )
    )
