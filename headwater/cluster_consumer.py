"""One consumer over a cluster: a leg at every broker owning a partition, merged into one stream.

`Client.subscribe` returns a `ClusterConsumer` when LOOKUP names several brokers. Each leg is a
plain `Consumer` subscribed with the application's request on the connection to one owner (the
server there delivers only the partitions it serves); the application sees one consumer, taking
from the legs in turn. A message keeps its leg (`message._consumer`), so its ack or nack goes to
the connection it came from, with that leg's consumer id; each leg tops up its own credit, so
`prefetch` applies per broker.

A leg that ends for a reason a new owner can cure (its connection lost, the broker shutting down,
NOT_OWNER) is dropped once its buffered messages are taken, and the topic looked up again; so is
the topic every `metadata_refresh` seconds (the routing table's `refresh_interval`) while the
consumer is open. Any owner without a live leg then gets one. What was delivered and not
acknowledged on a lost leg is redelivered by the new owner: at-least-once. Any other end (the
topic or subscription deleted, a refusal) ends the whole consumer with that error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from headwater.consumer import Consumer, Message
from headwater.message_batch import MessageBatch
from headwater.routing import BrokerAddress
from headwater.schema_codec import SchemaCodec
from headwater.wire.errors import (
    ConnectionClosed,
    ConnectionLost,
    HeadwaterError,
    NotOwner,
    RequestTimeout,
    ServerShuttingDown,
)

if TYPE_CHECKING:
    from headwater.router import Peers, Router

logger = logging.getLogger("headwater.client")

# A leg ending with one of these is re-placed at the partition's (new) owner.
_MOVABLE = (ConnectionLost, ServerShuttingDown, NotOwner, RequestTimeout)


class ClusterConsumer(Consumer):
    def __init__(
        self,
        template: Consumer,
        router: Router,
        peers: Peers,
        on_end: Callable[[Consumer], None] | None = None,
    ) -> None:
        assert template._request is not None
        super().__init__(
            template._connection,
            template.topic,
            template.subscription,
            template._prefetch,
            template._limit,
            on_dropped=template.dropped_callback,
            on_end=on_end,
        )
        self._request = template._request
        self._router = router
        self._peers = peers
        self._legs: dict[tuple[str, int], Consumer] = {}
        self._rotation = 0
        self._ready_event = asyncio.Event()
        self._syncing: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Subscribe at every current owner (a refusal is raised), then keep watching."""
        if not await self._sync(raise_errors=True):
            self._resync()
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop())

    @property
    def legs(self) -> dict[tuple[str, int], Consumer]:
        """The live legs by broker address (for monitoring and tests)."""
        return dict(self._legs)

    @property
    def dropped(self) -> int:
        return sum(leg.dropped for leg in self._legs.values())

    @dropped.setter
    def dropped(self, value: int) -> None:
        pass  # counted by the legs

    # Legs

    async def _sync(self, raise_errors: bool = False) -> bool:
        """A leg at every owner that has none; whether every partition has an owner with a leg.
        A refusal a new owner cannot cure ends the consumer (or is raised, at the start)."""
        table = self._router.table
        owners = table.owned_by(self.topic)
        complete = sum(len(p) for p in owners.values()) == len(table.owners(self.topic))
        for broker in owners:
            leg = self._legs.get(broker.address)
            if leg is not None and leg._error is None and not leg._connection.closed:
                continue
            try:
                await self._subscribe_at(broker)
            except HeadwaterError as exc:
                self._legs.pop(broker.address, None)
                if not isinstance(exc, (*_MOVABLE, ConnectionClosed)):
                    if raise_errors:
                        raise
                    self._end(exc)
                    return True
                logger.info("cannot subscribe at %s yet: %s", broker, exc.message)
                if isinstance(exc, NotOwner):
                    table.invalidate(self.topic)
                else:
                    self._router.lost(broker.address)
                complete = False
        return complete

    async def _subscribe_at(self, broker: BrokerAddress) -> None:
        connection = await self._peers.get(broker)
        leg = Consumer(
            connection,
            self.topic,
            self.subscription,
            self._prefetch,
            self._limit,
            on_dropped=self.dropped_callback,
            on_end=self._leg_ended,
        )
        leg._request = replace(self._request) if self._request is not None else None
        leg._on_ready = self._ready_event.set
        self._legs[broker.address] = leg
        assert leg._request is not None
        await connection.request(leg._request, on_response=leg._attach)

    def _leg_ended(self, leg: Consumer) -> None:
        self._ready_event.set()
        error = leg._error
        if self._error is not None or error is None:
            return
        if isinstance(error, _MOVABLE):
            logger.info("consumer of %s/%s lost a leg: %s", self.topic, self.subscription, error)
            self._router.table.invalidate(self.topic)
            self._resync()
        elif not (isinstance(error, ConnectionClosed) and not isinstance(error, ConnectionLost)):
            self._end(error)

    def _resync(self) -> None:
        if self._error is None and (self._syncing is None or self._syncing.done()):
            self._syncing = asyncio.get_running_loop().create_task(self._resync_soon())

    async def _resync_soon(self) -> None:
        for delay in (0.0, *self._router.backoff.delays()):
            await asyncio.sleep(delay)
            if self._error is not None:
                return
            await self._router.settle(self.topic, force=True)
            if await self._sync():
                return

    async def _refresh_loop(self) -> None:
        while self._error is None:
            await asyncio.sleep(self._router.table.refresh_interval)
            await self._router.settle(self.topic)
            if not await self._sync():
                self._resync()

    # Taking messages: from the legs in turn

    def _next_leg(self) -> Consumer | None:
        """A leg with something to hand out (dropping the ended, emptied ones), or None."""
        legs = list(self._legs.items())
        for step in range(len(legs)):
            address, leg = legs[(self._rotation + step) % len(legs)]
            if leg._messages or leg._batches:
                self._rotation = (self._rotation + step + 1) % max(len(legs), 1)
                return leg
            if leg._error is not None and self._legs.get(address) is leg:
                del self._legs[address]
        return None

    async def _leg(self, timeout: float | None) -> Consumer:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            leg = self._next_leg()
            if leg is not None:
                return leg
            if self._error is not None:
                raise type(self._error)(self._error.message)
            self._ready_event.clear()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise TimeoutError
            await asyncio.wait_for(self._ready_event.wait(), remaining)

    async def receive(self, timeout: float | None = None) -> Message:
        return await (await self._leg(timeout)).receive(0)

    async def next_batch(self, timeout: float | None = None) -> MessageBatch:
        return await (await self._leg(timeout)).next_batch(0)

    async def receive_batch(
        self, max_messages: int = 1000, timeout: float | None = None
    ) -> list[Message]:
        return await (await self._leg(timeout)).receive_batch(max_messages, 0)

    # Acknowledgements: each to the leg the message came from

    async def ack(self, message: Message) -> None:
        await message.ack()

    async def nack(self, message: Message, delay: float | None = None) -> None:
        await message.nack(delay)

    async def ack_cumulative(self, message: Message) -> None:
        if message._consumer is not None:
            await message._consumer.ack_cumulative(message)

    async def codec(self, version: int) -> SchemaCodec:
        for leg in self._legs.values():
            return await leg.codec(version)
        return await super().codec(version)

    # Ending

    def _end(self, error: HeadwaterError) -> None:
        super()._end(error)
        self._stop_tasks()
        for leg in list(self._legs.values()):
            leg._end(error)

    def _stop_tasks(self) -> None:
        for task in (self._refresher, self._syncing):
            if task is not None and task is not asyncio.current_task():
                task.cancel()

    async def close(self) -> None:
        self._stop_tasks()
        for leg in list(self._legs.values()):
            with contextlib.suppress(HeadwaterError):
                await leg.close()
        self._end(ConnectionClosed("consumer closed"))


__all__ = ["ClusterConsumer"]
