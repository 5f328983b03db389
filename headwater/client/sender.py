"""The producer's sender: one task that writes closed batches, in order, on its own connection.

It takes batches from the accumulator's queue (headwater/client/accumulator.py) while fewer than
`max_in_flight` are unanswered, after waiting out a THROTTLE the server sent, and writes each as
one produce frame (`Connection.produce`: the batch bytes are not copied). The connection comes
from the factory it was given (the client's opener: TLS and the handshake), so the producer needs
nothing else of the client; it opens a new one when the last was lost.

- `AtMostOnce()`: frames go out with NO_RESPONSE; a batch is done when written. A refusal the
  server sends back (no batch is named) is kept for the next `flush()`.
- `AtLeastOnce(RetryPolicy)` (and `AtMostOnce(wait_for_offsets=True)`, which never retries): a
  batch is done when answered. A retriable error abandons the connection, so every unanswered
  batch fails and is put back in order, and they go again on a new connection after the policy's
  next delay, until `max_retries` or the policy's total `timeout` runs out. No answer within
  `request_timeout` counts as a lost connection.

In a cluster (a `Router` given, and LOOKUP naming several brokers) each batch goes to its
partition's owner, on a connection of the producer's own per broker; one task still writes every
batch in order, so a partition's batches keep their order. NOT_OWNER is retriable: the router
learns of it (the topic is looked up again) and the batches are resent to the new owner, within
the delivery semantics (at-most-once: failed) and the retry policy's time budget, without using
up its retries: a partition between owners is not the batch's failure. An owner that cannot be
reached is reported to the router, and the sender looks up and tries again after the router's
backoff (bounded) before counting it as a failure. On a single broker every batch goes to the
bootstrap connection, exactly as without a router.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from headwater.client.accumulator import ProducerBatch, RecordAccumulator
from headwater.client.broker_connection import Connection
from headwater.client.producer_config import AtLeastOnce, AtMostOnce, ProducerConfig
from headwater.wire import messages as m
from headwater.wire.errors import (
    ConnectionClosed,
    HeadwaterError,
    InvalidPartition,
    NotOwner,
    RequestTimeout,
    WrongPartition,
)

if TYPE_CHECKING:
    from headwater.client.router import Router
    from headwater.client.routing_table import BrokerAddress

logger = logging.getLogger(__name__)

# between tries of a batch whose partition is between owners (NOT_OWNER): the router's lookups
# have their own backoff; this only wakes the sender to ask it again
OWNER_WAIT = 0.1

ConnectionFactory = Callable[[], Awaitable[Connection]]
AddressedFactory = Callable[[str, int], Awaitable[Connection]]


class Sender:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        topic: str,
        config: ProducerConfig,
        accumulator: RecordAccumulator,
        connect: ConnectionFactory,
        router: Router | None = None,
        connect_to: AddressedFactory | None = None,
    ) -> None:
        self._loop = loop
        self.topic = topic
        self.config = config
        self._accumulator = accumulator
        self._open_connection = connect
        self.connection: Connection | None = None  # to the bootstrap broker
        self.router = router
        self._connect_to = connect_to
        self.peers: dict[tuple[str, int], Connection] = {}  # to the other brokers (a cluster)
        self.first_error: HeadwaterError | None = None
        self.metadata_stale = False  # a partition error: the partition count may have changed
        delivery = config.delivery
        self._retries = isinstance(delivery, AtLeastOnce)
        self._wants_response = self._retries or (
            isinstance(delivery, AtMostOnce) and delivery.wait_for_offsets
        )
        self._wake = asyncio.Event()
        self._task = loop.create_task(self._run())

    def wake(self) -> None:
        self._wake.set()

    def take_error(self) -> HeadwaterError | None:
        """The first error since the last call (what `flush()` raises)."""
        error, self.first_error = self.first_error, None
        return error

    async def _run(self) -> None:
        accumulator = self._accumulator
        queue, in_flight = accumulator.queue, accumulator.in_flight
        while True:
            await self._wake.wait()
            self._wake.clear()
            while queue:
                batch = queue[0]
                if batch.not_before > time.monotonic():
                    break  # its retry timer wakes the sender
                if len(in_flight) >= self.config.max_in_flight:
                    break
                connection = await self._connect(batch.partition)
                if connection is None:
                    break  # retry scheduled, or batches failed
                await connection.throttle()  # the server's THROTTLE: over the produce quota
                # while we waited (a lookup, a failover's backoff) a retried batch of an earlier
                # order may have been put back in front of this one: popping that one in its
                # place lost it (its sender waited forever); start again from the front
                if not queue or queue[0] is not batch:
                    continue
                queue.pop(0)
                self._transmit(connection, batch)
            accumulator.update_room()

    async def open(self) -> Connection:
        """The sender's connection, opened now if there is none; raises if that fails."""
        if self.connection is None or self.connection.closed:
            self.connection = await self._open_connection()
            self.connection.on_unsolicited_error = self._unsolicited_error
        return self.connection

    def connections(self) -> list[Connection]:
        """Every open connection of the sender (the bootstrap one first)."""
        found = [self.connection] if self.connection is not None else []
        return [c for c in (*found, *self.peers.values()) if not c.closed]

    async def _connect(self, partition: int) -> Connection | None:
        router = self.router
        try:
            if router is not None and not router.multi_broker and not router.fresh(self.topic):
                # not known to be a cluster yet: look the topic up before the first batch (a
                # batch for an explicit partition went to the bootstrap broker unrouted, and
                # met NOT_OWNER at every retry), and after a NOT_OWNER marked it stale
                await router.settle(self.topic)
            if router is not None and router.multi_broker:
                return await self._owner_connection(partition)
            return await self.open()
        except InvalidPartition as exc:  # this batch's partition is gone, not the connection
            queue = self._accumulator.queue
            if queue and queue[0].partition == partition:
                self._fail(queue.pop(0), exc)
            self._wake.set()
            return None
        except HeadwaterError as exc:
            self.connection = None
            queue = self._accumulator.queue
            for batch in list(queue):
                queue.remove(batch)
                self._retry_or_fail(batch, exc)
            return None

    async def _owner_connection(self, partition: int) -> Connection:
        """A connection to the partition's owner; an owner that cannot be reached is reported
        and looked up again, after the router's backoff, until its time runs out."""
        router = self.router
        assert router is not None
        delays = router.backoff.delays()
        while True:
            owner = await router.route(self.topic, partition)
            try:
                return await self._open_to(owner)
            except ConnectionClosed as exc:
                router.lost(owner.address)
                delay = next(delays, None)
                if delay is None:
                    raise
                logger.info("cannot reach %s (%s); looking up again", owner, exc.message)
                await asyncio.sleep(delay)

    async def _open_to(self, owner: BrokerAddress) -> Connection:
        assert self.router is not None
        if owner.broker_id == "" or owner.address == self.router.table.bootstrap.address:
            return await self.open()
        connection = self.peers.get(owner.address)
        if connection is None or connection.closed:
            assert self._connect_to is not None
            connection = await self._connect_to(*owner.address)
            connection.on_unsolicited_error = self._unsolicited_error
            router, address = self.router, owner.address
            connection.on_lost = lambda _: router.lost(address)
            self.peers[owner.address] = connection
        return connection

    def _transmit(self, connection: Connection, batch: ProducerBatch) -> None:
        assert batch.data is not None
        if batch.attempts == 0:
            batch.first_sent = time.monotonic()
        batch.attempts += 1
        request = m.ProduceRequest(self.topic, batch.partition, batch.data, self.config.isolation)
        try:
            if not self._wants_response:
                connection.produce(request, None)
                batch.result.set_result(m.ProduceResponse(batch.partition, -1))
                return
            response: asyncio.Future[m.Response] = self._loop.create_future()
            connection.produce(request, response)
        except HeadwaterError as exc:
            self._retry_or_fail(batch, exc)
            return
        self._accumulator.in_flight.append(batch)
        # Cancelled once answered: a pending timer holds the batch (its frame, its futures) for
        # request_timeout, and at thousands of requests a second that was 30 s of sent batches
        # kept alive, hundreds of thousands of objects each full collection had to walk.
        timer = self._loop.call_later(
            self.config.request_timeout, self._check_answered, connection, batch, batch.attempts
        )
        response.add_done_callback(lambda done: self._answered(batch, done, connection, timer))

    def _check_answered(self, connection: Connection, batch: ProducerBatch, attempt: int) -> None:
        """No answer in `request_timeout`: give up on the connection; its batches are retried."""
        if batch.attempts == attempt and batch in self._accumulator.in_flight:
            logger.warning("no answer in %ss; reconnecting", self.config.request_timeout)
            connection.abandon()

    def _answered(
        self,
        batch: ProducerBatch,
        done: asyncio.Future[m.Response],
        connection: Connection,
        timer: asyncio.TimerHandle,
    ) -> None:
        timer.cancel()
        in_flight = self._accumulator.in_flight
        if batch in in_flight:
            in_flight.remove(batch)
        error = done.exception() if not done.cancelled() else RequestTimeout("cancelled")
        if error is None:
            response = done.result()
            assert isinstance(response, m.ProduceResponse)
            if not batch.result.done():
                batch.result.set_result(response)
        else:
            assert isinstance(error, HeadwaterError)
            if isinstance(error, NotOwner) and self.router is not None:
                self.router.not_owner(self.topic, batch.partition, error)
            if error.retriable:
                # Resend everything unanswered in order, on a fresh connection: the server
                # handles a connection's requests in order, so sequences never gap.
                connection.abandon()
            self._retry_or_fail(batch, error)
        self._accumulator.update_room()
        self._wake.set()

    def _retry_or_fail(self, batch: ProducerBatch, error: HeadwaterError) -> None:
        delivery = self.config.delivery
        if not isinstance(delivery, AtLeastOnce) or not error.retriable:
            self._fail(batch, error)
            return
        if self._between_owners(error):
            # a partition between owners is not the batch's failure: it waits for the new
            # owner (the router looks it up) within the policy's time budget, without using up
            # its retries, as Kafka's producer retries NOT_LEADER until its delivery timeout
            delay: float | None = OWNER_WAIT
        else:
            if batch.delays is None:
                batch.delays = delivery.retry.delays()
            delay = next(batch.delays, None)
        now = time.monotonic()
        started = batch.first_sent or now
        if delay is None or now + delay - started > delivery.retry.timeout:
            self._fail(batch, error)
            return
        batch.not_before = now + delay
        self._accumulator.requeue(batch)
        self._loop.call_later(delay, self._wake.set)
        logger.debug("retrying batch for partition %s in %.3fs: %s", batch.partition, delay, error)

    def _between_owners(self, error: HeadwaterError) -> bool:
        """NOT_OWNER, or in a cluster a lost connection to an owner (it stopped or died: its
        partitions are being taken over)."""
        if isinstance(error, NotOwner):
            return True
        router = self.router
        return isinstance(error, ConnectionClosed) and router is not None and router.multi_broker

    def _unsolicited_error(self, error: HeadwaterError) -> None:
        """The server refused a frame sent without response (at-most-once): which batch is not
        known, so the error goes to the next `flush()` (and `confirm()`) and the log."""
        logger.warning("at-most-once send to %s failed: %s", self.topic, error)
        if isinstance(error, NotOwner) and self.router is not None:
            self.router.table.invalidate(self.topic)  # which partition is not known
        if self.first_error is None:
            self.first_error = error

    def _fail(self, batch: ProducerBatch, error: HeadwaterError) -> None:
        if isinstance(error, (InvalidPartition, WrongPartition)):
            self.metadata_stale = True  # the producer asks for the partition count again
        if not batch.result.done():
            batch.result.set_exception(error)
        if self.first_error is None:
            self.first_error = error

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        for connection in [self.connection, *self.peers.values()]:
            if connection is not None:
                await connection.close()
