"""Small helpers shared by the end-to-end tests.

Tests decide by events, never by elapsed time: `drain(consumer, count)` reads exactly the messages
the test expects, `eventually(condition)` polls a condition until it holds. Their deadlines only
bound a hang (a bug): on a working system, however loaded, they are never reached.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import headwater
from headwater.wire.messages import SubscriptionInfo

# How long a test waits for something that should happen before it calls it a hang: far beyond
# what anything takes on a loaded 2-core machine, so it never decides a passing test.
HANG = 30.0


async def drain(
    consumer: headwater.Consumer,
    count: int | None = None,
    *,
    idle: float = 0.6,
    timeout: float = HANG,
    exact: bool = True,
) -> list[headwater.Message]:
    """`count` messages, each waited for up to `timeout` seconds (a hang bound); with `exact`,
    fails when a message beyond them is already at hand (delivered along with them).

    Without `count` (only where a test cannot know how many will come): every message that arrives
    until none has come for `idle` seconds."""
    if count is None:
        received = []
        while True:
            try:
                received.append(await consumer.receive(timeout=idle))
            except TimeoutError:
                return received
    received = []
    for _ in range(count):
        try:
            received.append(await consumer.receive(timeout=timeout))
        except TimeoutError:
            raise AssertionError(
                f"received {len(received)} of {count} messages, then none for {timeout} s "
                f"(the last: {[m.value for m in received[-3:]]})"
            ) from None
    if exact:
        try:
            extra = await consumer.receive(timeout=0)
        except TimeoutError:
            return received
        raise AssertionError(f"more than the {count} expected messages came: also {extra.value!r}")
    return received


async def drain_until(
    consumer: headwater.Consumer,
    done: Callable[[list[headwater.Message]], bool],
    limit: int = 100_000,
    timeout: float = HANG,
) -> list[headwater.Message]:
    """Messages until `done(received)` holds (for at-least-once streams, where duplicates make the
    count unknown); each waited for up to `timeout` seconds, at most `limit` of them."""
    received: list[headwater.Message] = []
    while not done(received):
        if len(received) >= limit:
            raise AssertionError(f"{limit} messages and the condition still does not hold")
        try:
            received.append(await consumer.receive(timeout=timeout))
        except TimeoutError:
            raise AssertionError(
                f"received {len(received)} messages, then none for {timeout} s"
            ) from None
    return received


async def drain_spread(
    consumers: list[headwater.Consumer], total: int, timeout: float = HANG
) -> list[list[headwater.Message]]:
    """`total` messages spread over `consumers` in a way the test cannot know (Shared, Key_Shared):
    read from all of them at once until `total` have come (within `timeout`, a hang bound), then
    fail if one more is already at hand. The messages each consumer received, in order."""
    received: list[list[headwater.Message]] = [[] for _ in consumers]
    everything = asyncio.Event()

    async def take(index: int, consumer: headwater.Consumer) -> None:
        while True:
            received[index].append(await consumer.receive())
            if sum(len(batch) for batch in received) >= total:
                everything.set()

    tasks = [asyncio.create_task(take(i, c)) for i, c in enumerate(consumers)]
    try:
        await asyncio.wait_for(everything.wait(), timeout)
    except TimeoutError:
        got = sum(len(batch) for batch in received)
        raise AssertionError(f"received {got} of {total} messages within {timeout} s") from None
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert sum(len(batch) for batch in received) == total, "more messages than expected"
    for consumer in consumers:
        await nothing_at_hand(consumer)
    return received


async def eventually(
    condition: Callable[[], Awaitable[bool]] | Callable[[], bool],
    timeout: float = HANG,
    interval: float = 0.02,
    what: str = "the condition",
) -> None:
    """Polls `condition` (a function, sync or async) until it is true; fails after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout} s")
        await asyncio.sleep(interval)


async def nothing_at_hand(consumer: headwater.Consumer) -> None:
    """Fails when a message has been delivered to `consumer` and not yet taken (no waiting: pair it
    with a check of the server's state, which says nothing more is on its way)."""
    try:
        extra = await consumer.receive(timeout=0)
    except TimeoutError:
        return
    raise AssertionError(f"an unexpected message was delivered: {extra.value!r}")


async def subscription_info(
    client: headwater.Client, topic: str, subscription: str
) -> SubscriptionInfo:
    """The server's view of one subscription (pending, unacked, consumers), from describe_topic."""
    for info in (await client.describe_topic(topic)).subscriptions:
        if info.name == subscription:
            return info
    raise AssertionError(f"no subscription {subscription!r} on {topic!r}")
