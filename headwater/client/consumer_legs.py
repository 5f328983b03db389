"""One consumer over a cluster: a leg at every broker owning a partition, merged into one stream.

`Client.subscribe` subscribes on the bootstrap connection as always; when LOOKUP (asked then, or
known already) names several brokers, it gives the consumer a `ClusterLegs`. The consumer itself
is the leg at the bootstrap broker; every other owner of a partition of the topic gets a leg of
its own, a plain `Consumer` subscribed with the same request on the connection to that broker
(the server there delivers only the partitions it serves). The application still sees the one
consumer: `receive`, `receive_batch` and `next_batch` take from the legs in turn. A message keeps
its leg (`message._consumer`), so its ack or nack goes to the connection it came from, with that
leg's consumer id; each leg tops up its own credit, so `prefetch` applies per broker.

A leg that ends for a reason a new owner can cure (its connection lost, the broker shutting down,
NOT_OWNER) is dropped once its buffered messages are taken, and the topic looked up again, after
the router's backoff (while a partition has no owner at all, a LOOKUP long poll for its new owner
instead: `Router.new_owner`); so is the topic every `metadata_refresh` seconds while the consumer
is open. Any owner without a live leg then gets one. What was
delivered and not acknowledged on a lost leg is redelivered by the new owner: at-least-once. A
leg at a broker that sends nothing (frozen: its connection stays open) is checked after the
routing table's `owner_check` (`_watch_loop`, `_check_leg`) and dropped once the other brokers
name another owner, or none, for its partitions (`_drop`), as the producer's sender abandons a
frozen owner's connection (sender.py `_probe`). Any
other end (the topic or subscription deleted, a refusal) ends the consumer with that error. A
partition left without a live leg for the router's backoff timeout (`LookupBackoff.timeout`, 30 s:
no owner, or an owner that cannot be reached) ends the consumer too, with NotOwner or
ConnectionLost naming the partitions: a consumer never waits silently. The bootstrap broker's leg
goes back on a connection of the router's when the client's own is closed for good (no
`reconnect`), so a bootstrap broker restarted on its address is served again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from headwater.client.consumer import Consumer
from headwater.wire import messages as m
from headwater.wire.errors import (
    ConnectionClosed,
    ConnectionLost,
    ConsumerBusy,
    HeadwaterError,
    NotOwner,
    RequestTimeout,
    ServerShuttingDown,
    StorageError,
)

if TYPE_CHECKING:
    from headwater.client.router import Peers, Router
    from headwater.client.routing_table import BrokerAddress

logger = logging.getLogger(__name__)

# A leg ending with one of these is placed again at the partitions' (new) owner.
MOVABLE = (ConnectionLost, ServerShuttingDown, NotOwner, RequestTimeout)
# A leg refused with one of these is tried again, within the placement timeout: the etcd of the
# cluster unavailable for a moment, or our own previous leg there not detached yet (its
# connection died and the broker has not noticed).
PASSING = (StorageError, ConsumerBusy)


class ClusterLegs:
    def __init__(self, consumer: Consumer, router: Router, peers: Peers) -> None:
        self.consumer = consumer  # the application's; also the leg at the bootstrap broker
        self._router = router
        self._peers = peers
        self.legs: dict[tuple[str, int], Consumer] = {}
        self._rotation = 0
        self.ready = asyncio.Event()
        self._syncing: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._checking: dict[tuple[str, int], asyncio.Task[None]] = {}  # legs gone silent
        self._sync_lock = asyncio.Lock()  # one placement at a time: never two legs per broker
        self.bootstrap = router.table.bootstrap.address
        self.legs[self.bootstrap] = consumer
        self._unplaced_since: float | None = None  # since when a partition has had no live leg
        self._refusals: dict[tuple[str, int], HeadwaterError] = {}  # the last, per broker

    async def start(self) -> None:
        """Subscribe at every current owner (a refusal is raised), then keep watching."""
        if not await self._sync(raise_errors=True):
            self._resync()
        loop = asyncio.get_running_loop()
        self._refresher = _watched(loop.create_task(self._refresh_loop()))
        self._watcher = _watched(loop.create_task(self._watch_loop()))

    # Legs

    @staticmethod
    def _alive(leg: Consumer | None) -> bool:
        return (
            leg is not None
            and leg._error is None
            and not leg._suspended
            and leg.consumer_id >= 0
            and not leg._connection.closed
        )

    async def _sync(self, raise_errors: bool = False) -> bool:
        """A leg at every owner that has none; whether every partition has an owner with a leg.
        A refusal a new owner cannot cure ends the consumer (or is raised, at the start), and so
        does a partition left without a live leg for longer than the router's backoff."""
        async with self._sync_lock:
            complete = await self._place(raise_errors)
        self._check_placed(complete)
        return complete

    def _check_placed(self, complete: bool) -> None:
        """Never wait silently: a partition that stayed without a live leg (no owner, or an
        owner we cannot reach or subscribe at) for `backoff.timeout` seconds ends the consumer
        with an error saying which partitions and why, as a request would fail after it."""
        now = asyncio.get_running_loop().time()
        if complete or self.consumer._error is not None:
            self._unplaced_since = None
            return
        if self._unplaced_since is None:
            self._unplaced_since = now
            return
        waited = now - self._unplaced_since
        if waited < self._router.backoff.timeout:
            return
        self.consumer._end(self._unplaced_error(waited))

    def _unplaced_error(self, waited: float) -> HeadwaterError:
        consumer = self.consumer
        unowned, unreachable = [], []
        refusal: HeadwaterError | None = None
        for partition, owner in self._router.table.owners(consumer.topic).items():
            if owner is None:
                unowned.append(partition)
            elif not self._alive(self.legs.get(self._key(owner))):
                unreachable.append(f"{partition} at {owner}")
                refusal = self._refusals.get(self._key(owner), refusal)
        where = f"consumer of {consumer.topic!r}/{consumer.subscription!r}"
        if refusal is not None and isinstance(refusal, PASSING):  # refused, not out of reach
            return type(refusal)(
                f"{where} could not be placed for {waited:.0f}s: partitions "
                f"{', '.join(unreachable)} refused it: {refusal.message}"
            )
        if unreachable or not unowned:  # none known at all: every broker was out of reach
            parts = ", ".join(unreachable) if unreachable else "every partition"
            return ConnectionLost(
                f"{where} could not be placed for {waited:.0f}s: cannot reach the owner of "
                f"partitions {parts}"
            )
        return NotOwner(
            f"{where} could not be placed for {waited:.0f}s: partitions "
            f"{', '.join(map(str, unowned))} have no owner: owner=none"
        )

    async def _place(self, raise_errors: bool) -> bool:
        if self.consumer._error is not None:
            return True
        topic = self.consumer.topic
        table = self._router.table
        owners = table.owned_by(topic)
        complete = sum(len(p) for p in owners.values()) == len(table.owners(topic))
        for broker in owners:
            if self._alive(self.legs.get(self._key(broker))):
                continue
            try:
                await self._subscribe_at(broker)
            except HeadwaterError as exc:
                if raise_errors and isinstance(exc, ConsumerBusy):
                    raise  # at subscribe: the subscription is another consumer's
                if not isinstance(exc, (*MOVABLE, ConnectionClosed, *PASSING)):
                    if raise_errors:
                        raise
                    self.consumer._end(exc)
                    return True
                logger.info("cannot subscribe at %s yet: %s", broker, exc.message)
                self._refusals[self._key(broker)] = exc
                if isinstance(exc, NotOwner):
                    table.invalidate(topic)
                elif isinstance(exc, ConnectionClosed):
                    self._router.lost(broker.address)
                complete = False
            else:
                self._refusals.pop(self._key(broker), None)
        return complete

    def _key(self, broker: BrokerAddress) -> tuple[str, int]:
        return self.bootstrap if self._peers.is_bootstrap(broker) else broker.address

    async def _subscribe_at(self, broker: BrokerAddress) -> None:
        connection = await self._peers.get(broker)
        consumer = self.consumer
        if self._key(broker) == self.bootstrap:
            # its own subscription, lost: again, unless the client's reconnection (which the
            # wait for the connection may have been) did it already
            if not self._alive(consumer) and consumer._error is None:
                await consumer._resubscribe(connection)
            return
        leg = Consumer(
            connection,
            consumer.topic,
            consumer.subscription,
            consumer._prefetch,
            consumer._limit,
            on_dropped=consumer.report_dropped,
            on_end=self._leg_ended,
        )
        assert consumer._request is not None
        leg._request = replace(consumer._request)
        leg._on_ready = self.ready.set
        self.legs[broker.address] = leg
        try:
            await connection.request(leg._request, on_response=leg._attach)
        except HeadwaterError:
            if self.legs.get(broker.address) is leg:
                del self.legs[broker.address]
            raise

    def _leg_ended(self, leg: Consumer) -> None:
        if leg._error is not None:
            self.leg_lost(leg, leg._error)

    def leg_lost(self, leg: Consumer, error: HeadwaterError) -> None:
        """A leg ended (or, the bootstrap one, was suspended) with `error`."""
        self.ready.set()
        if self.consumer._error is not None:
            return
        if isinstance(error, MOVABLE):
            logger.info("consumer of %s lost a leg: %s", self.consumer.topic, error.message)
            self._router.table.invalidate(self.consumer.topic)
            self._resync()
        elif not (isinstance(error, ConnectionClosed) and not isinstance(error, ConnectionLost)):
            self.consumer._end(error)  # not curable elsewhere; a leg closed by us is no error

    def _resync(self) -> None:
        if self.consumer._error is None and (self._syncing is None or self._syncing.done()):
            self._syncing = _watched(asyncio.get_running_loop().create_task(self._resync_soon()))

    async def _resync_soon(self) -> None:
        """Look up and place the legs again, after each backoff delay while some partition
        has none; while one has no owner at all (a failover under way), a long poll for its new
        owner instead of the delay (`Router.new_owner`): placed the moment its key exists."""
        topic = self.consumer.topic
        for delay in (0.0, *self._router.backoff.delays(), self._router.backoff.maximum):
            unowned = self._unowned() if delay else None
            if unowned is not None and await self._router.new_owner(topic, unowned):
                if self._router.table.owner(topic, unowned) is None:
                    await asyncio.sleep(delay)  # its time ran out, still no owner: no hot loop
            else:
                await asyncio.sleep(delay)
                if self.consumer._error is not None:
                    return
                await self._router.settle(topic, force=True)
            if self.consumer._error is not None:
                return
            if await self._sync():
                return

    def _unowned(self) -> int | None:
        """A partition of the topic the routing table names no owner for."""
        owners = self._router.table.owners(self.consumer.topic)
        return next((p for p, owner in owners.items() if owner is None), None)

    async def _refresh_loop(self) -> None:
        while self.consumer._error is None:
            await asyncio.sleep(self._router.table.refresh_interval)
            await self._router.settle(self.consumer.topic)
            if not await self._sync():
                self._resync()

    # Silent brokers: frozen owners

    async def _watch_loop(self) -> None:
        """Every half `owner_check`: a leg whose connection read nothing for `owner_check`
        seconds (no delivery, no answer) is checked (`_check_leg`)."""
        loop = asyncio.get_running_loop()
        while self.consumer._error is None:
            check = self._router.table.owner_check
            await asyncio.sleep(check / 2)
            now = loop.time()
            for key, leg in list(self.legs.items()):
                if (
                    key not in self._checking
                    and self._alive(leg)
                    and now - leg._connection.last_received >= check
                ):
                    task = _watched(loop.create_task(self._check_leg(key, leg)))
                    self._checking[key] = task
                    task.add_done_callback(partial(self._checked, key))

    def _checked(self, key: tuple[str, int], task: asyncio.Task[None]) -> None:
        if self._checking.get(key) is task:
            del self._checking[key]

    async def _check_leg(self, key: tuple[str, int], leg: Consumer) -> None:
        """The leg's broker sent nothing for `owner_check` seconds. Answering a cheap request
        (API_VERSIONS) within `owner_check`, it is only idle. Otherwise it may be frozen (SIGSTOP,
        a long pause), which its open connection does not tell: as the producer's sender does
        for an unanswered batch, ask the other brokers (`Router.moved`, a long poll for a new
        owner) while it stays silent; once they name another owner, or none,
        for every partition the leg had there, drop the leg (`_drop`) and place one at the new
        owners. An owner the cluster still names keeps its leg, however long it is silent."""
        loop = asyncio.get_running_loop()
        connection = leg._connection
        asked = loop.time()
        try:
            await connection.request(m.ApiVersionsRequest(), self._router.table.owner_check)
            return
        except RequestTimeout:
            pass
        except HeadwaterError:
            return  # the connection ended: the leg's own end follows
        topic, table = self.consumer.topic, self._router.table
        held = self._held_at(key)  # may be none already: the producer's check looked it up
        owner = next((b for b in table.brokers.values() if self._key(b) == key), None)
        silent = key if owner is None else owner.address
        while self.legs.get(key) is leg and self._alive(leg) and connection.last_received < asked:
            try:
                if self._held_at(key):  # (a long poll on none of its partitions waited in vain)
                    await self._router.moved(topic, held[0] if held else 0, silent)
            except HeadwaterError as exc:  # no other broker answered: again shortly
                logger.debug("check of %s:%s through other brokers failed: %s", *silent, exc)
            else:
                if not self._held_at(key):
                    if self._alive(leg) and connection.last_received < asked:
                        self._drop(leg, silent, held)
                        if not await self._sync():
                            self._resync()
                    return
            await asyncio.sleep(self._router.backoff.maximum)

    def _held_at(self, key: tuple[str, int]) -> list[int]:
        """The partitions of the topic the routing table names the broker at `key` for."""
        owners = self._router.table.owners(self.consumer.topic).items()
        return [p for p, o in owners if o is not None and self._key(o) == key]

    def _drop(self, leg: Consumer, owner: tuple[str, int], partitions: list[int]) -> None:
        """Give the leg at a silent broker up: the cluster names it owner of none of the topic's
        partitions now. Its subscription there is detached (its UNSUBSCRIBE waits in the
        socket, for the broker to read if it wakes); what it delivered and was not acknowledged
        is redelivered by the new owner: at-least-once, as on a lost leg."""
        silent = asyncio.get_running_loop().time() - leg._connection.last_received
        held = f"partitions {partitions}" if partitions else "its partitions"
        logger.warning(
            "consumer of %s: %s:%s silent for %.1fs and %s moved; leaving it",
            self.consumer.topic,
            *owner,
            silent,
            held,
        )
        error = ConnectionLost(
            f"{owner[0]}:{owner[1]} answered nothing for {silent:.1f}s and the cluster names "
            f"another owner of {held}"
        )
        connection = leg._connection
        if leg.consumer_id >= 0 and connection.consumers.get(leg.consumer_id) is leg:
            del connection.consumers[leg.consumer_id]
            with contextlib.suppress(HeadwaterError):
                connection.send_nowait(m.UnsubscribeRequest(leg.consumer_id))
        if leg is self.consumer:
            leg.on_closed(error)  # suspended; placed again wherever the cluster says
        else:
            leg._end(error)

    # Taking messages: from the legs in turn

    def _next_leg(self) -> Consumer | None:
        """A leg with something to hand out (dropping the ended, emptied ones), or None."""
        legs = list(self.legs.items())
        for step in range(len(legs)):
            address, leg = legs[(self._rotation + step) % len(legs)]
            if leg._messages or leg._batches:
                self._rotation = (self._rotation + step + 1) % len(legs)
                return leg
            if leg._error is not None and leg is not self.consumer:
                self.legs.pop(address, None)
        return None

    async def pick(self, timeout: float | None) -> Consumer:
        """A leg with a message to hand out; raises the consumer's end, or TimeoutError."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            leg = self._next_leg()
            if leg is not None:
                return leg
            error = self.consumer._error
            if error is not None:
                raise type(error)(error.message)
            self.ready.clear()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise TimeoutError
            async with asyncio.timeout(remaining):
                await self.ready.wait()

    # Ending

    def stop(self, error: HeadwaterError) -> None:
        """The consumer ended: so does every other leg, and the watching."""
        for task in (self._refresher, self._syncing, self._watcher, *self._checking.values()):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self.ready.set()
        for leg in list(self.legs.values()):
            if leg is not self.consumer:
                leg._end(error)

    async def close(self) -> None:
        for leg in list(self.legs.values()):
            if leg is not self.consumer:
                with contextlib.suppress(HeadwaterError):
                    await leg.close()


def _watched(task: asyncio.Task[None]) -> asyncio.Task[None]:
    """A background task whose failure (a bug) is logged, not left for asyncio to report."""
    task.add_done_callback(_log_failure)
    return task


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        logger.error("cluster consumer task failed: %r", error)
