"""A committed transaction's batches, for the subscriptions that see batches as they pass.

Subscriptions that keep nothing (durable `none` on a reliable topic: `Feed.BATCHES`) are offered
each batch as it is appended. A transaction's batches are not offered then, as it may still
abort, but when its COMMIT marker is appended to the partition: read back from the log (its tail
cache, as a rule) from the transaction's first offset there up to the marker, the producer's
transactional batches in offset order. An abort offers nothing; a marker is never offered.

The append of the marker is synchronous and the read is not, so a task per commit reads, each
after the previous commit's task of the same partition: commits reach the subscriptions in the
order of their markers. Its batches come after the plain batches appended while the transaction
was open (each carries its own offset), and go to the subscriptions there are when they are
read. A read that fails (a storage error, the topic deleted meanwhile), or finds nothing where
the transaction's batches should be (retention took them), is logged
(`transactions.committed_batches_unread`) and ends that commit's offer: these subscriptions keep
nothing and promise nothing beyond what passes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Final

import structlog

from headwater.server.topics.subscription_contract import SubscriptionKind
from headwater.wire.markers import peek

log = structlog.get_logger(__name__)

Reader = Callable[[int, int], Awaitable[list[bytes]]]

# reads of one transaction's range at most (each returns many batches): a bound, not a limit
# any transaction's size reaches
_MAX_READS: Final = 1_000_000


class CommittedFeed:
    def __init__(
        self, topic: str, read: Reader, live: Callable[[], Iterable[SubscriptionKind]]
    ) -> None:
        self._topic = topic
        self._read = read
        self._live = live
        self._last: dict[int, asyncio.Task[None]] = {}  # partition -> its newest commit's task

    def committed(self, partition: int, producer: int, first: int, marker: int) -> None:
        """`producer`'s transaction in `partition`, from `first`, committed at `marker`."""
        previous = self._last.get(partition)
        task = asyncio.get_running_loop().create_task(
            self._offer(previous, partition, producer, first, marker)
        )
        self._last[partition] = task
        task.add_done_callback(partial(self._done, partition))

    def _done(self, partition: int, task: asyncio.Task[None]) -> None:
        if self._last.get(partition) is task:
            del self._last[partition]

    async def _offer(
        self,
        previous: asyncio.Task[None] | None,
        partition: int,
        producer: int,
        first: int,
        marker: int,
    ) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        offset = first
        try:
            for _ in range(_MAX_READS):
                if offset >= marker:
                    return
                batches = await self._read(partition, offset)
                if not batches:
                    break
                for batch in batches:
                    header = peek(batch)
                    if header.base_offset >= marker:
                        return
                    if (
                        header.transactional
                        and not header.control
                        and header.producer_id == producer
                    ):
                        count = header.next_offset - header.base_offset
                        for subscription in list(self._live()):
                            subscription.offer(partition, batch, count)
                    offset = max(offset + 1, header.next_offset)
        except Exception as exc:  # a storage error, or the topic deleted meanwhile
            self._unread(partition, producer, offset, marker, str(exc) or type(exc).__name__)
            return
        self._unread(partition, producer, offset, marker, "nothing stored there")

    def _unread(self, partition: int, producer: int, offset: int, marker: int, why: str) -> None:
        log.error(
            "transactions.committed_batches_unread",
            topic=self._topic,
            partition=partition,
            producer_id=producer,
            offset=offset,
            marker=marker,
            error=why,
        )

    async def close(self) -> None:
        tasks = list(self._last.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
