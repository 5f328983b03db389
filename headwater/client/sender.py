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

A partition waits only for its own owner (issue 42): finding it (a lookup, the backoff, a
connect) runs in the background while the other partitions' batches go, and `max_in_flight`
holds per connection. A batch unanswered for the routing table's `owner_check` (1 s, half the
default lease) has the router ask the other brokers whether its partition moved; once they name
another owner or none, the silent (frozen) owner's connection is abandoned and its batches go
again to the new owners (docs/CLUSTER.md, "Failover as a producer sees it").
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
        # unanswered batches per connection: `max_in_flight` holds per connection (per broker),
        # so a frozen owner's unanswered batches hold up nothing sent to the other brokers
        self._in_flight_on: dict[Connection, int] = {}
        # background work a partition's batches wait for (key None: off a cluster, every batch)
        self._resolving: dict[int | None, asyncio.Task[None]] = {}
        self._refreshing: asyncio.Task[None] | None = None
        self._looked_up = False  # off a cluster: the first lookup was tried
        self._probing: dict[Connection, asyncio.Task[None]] = {}  # owners silent too long
        # connections abandoned because their silent owner's partitions moved (`_probe`)
        self._moved_away: set[Connection] = set()
        self._task = loop.create_task(self._run())

    def wake(self) -> None:
        self._wake.set()

    def take_error(self) -> HeadwaterError | None:
        """The first error since the last call (what `flush()` raises)."""
        error, self.first_error = self.first_error, None
        return error

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._send_ready()
            self._accumulator.update_room()

    def _send_ready(self) -> None:
        """Send every queued batch that can go now, in order within each partition. A batch
        that cannot (its retry delay, its owner not known or not connected yet, its connection's
        `max_in_flight` reached, a THROTTLE) holds back only the later batches of its
        partition: the others' go on, so a dead or frozen owner holds up nothing of the other
        brokers' partitions. What it waits for runs in the background and wakes the sender."""
        queue = self._accumulator.queue
        now = time.monotonic()
        held: set[int] = set()  # partitions whose earliest queued batch cannot go now
        index = 0
        while index < len(queue):
            batch = queue[index]
            partition = batch.partition
            if partition in held:
                index += 1
                continue
            connection = None if batch.not_before > now else self._connection_now(partition)
            if (
                connection is None
                or self._in_flight_on.get(connection, 0) >= self.config.max_in_flight
            ):
                held.add(partition)  # its timer, resolution or an answer wakes the sender
                index += 1
                continue
            throttled = connection.throttled_until - self._loop.time()
            if throttled > 0:  # the server's THROTTLE: over the produce quota
                held.add(partition)
                self._loop.call_later(throttled, self._wake.set)
                index += 1
                continue
            del queue[index]
            self._transmit(connection, batch)

    def _connection_now(self, partition: int) -> Connection | None:
        """The open connection the partition's next batch goes on, when known without waiting;
        else None, and a background task finds it (a lookup, the owner's backoff, a connect)."""
        router = self.router
        key = partition if router is not None and router.multi_broker else None
        if key not in self._resolving:
            connection: Connection | None = None
            if router is None:
                connection = self.connection
            elif not router.multi_broker:
                if router.fresh(self.topic):
                    connection = self.connection
                elif self._looked_up:  # looked up again in the background, sent meanwhile
                    connection = self.connection
                    self._refresh_routes()
            else:
                owner = router.table.owner(self.topic, partition)
                if owner is None and router.table.error(self.topic) is not None:
                    # as `Router.route`: the bootstrap broker answers with the topic's error
                    # (a deleted topic). Waiting for an owner here instead, while the resolving
                    # task found the bootstrap broker at once, spun the sender without end
                    owner = router.table.bootstrap
                if owner is not None:
                    connection = self._open_now(owner)
                    if not router.fresh(self.topic):
                        self._refresh_routes()  # used meanwhile: a NOT_OWNER corrects them
            if connection is not None and not connection.closed:
                return connection
            task = self._loop.create_task(self._resolve(partition, key))
            self._resolving[key] = task
        return None

    def _open_now(self, owner: BrokerAddress) -> Connection | None:
        assert self.router is not None
        if owner.broker_id == "" or owner.address == self.router.table.bootstrap.address:
            return self.connection
        return self.peers.get(owner.address)

    def _refresh_routes(self) -> None:
        if self._refreshing is None or self._refreshing.done():
            assert self.router is not None
            self._refreshing = self._loop.create_task(self.router.settle(self.topic))

    async def _resolve(self, partition: int, key: int | None) -> None:
        """Find (lookup, connect) where the partition's batches go, then wake the sender; a
        failure retries or fails the batches waiting for it (all of them, off a cluster)."""
        try:
            await self._connect(partition, key)
        finally:
            del self._resolving[key]
            self._wake.set()

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

    async def _connect(self, partition: int, key: int | None) -> None:
        router = self.router
        try:
            if router is not None and not router.multi_broker and not router.fresh(self.topic):
                self._looked_up = True
                # not known to be a cluster yet: look the topic up before the first batch (a
                # batch for an explicit partition went to the bootstrap broker unrouted, and
                # met NOT_OWNER at every retry), and after a NOT_OWNER marked it stale
                await router.settle(self.topic)
            if router is not None and router.multi_broker:
                await self._owner_connection(partition)
            else:
                await self.open()
        except InvalidPartition as exc:  # this batch's partition is gone, not the connection
            queue = self._accumulator.queue
            first = next((b for b in queue if b.partition == partition), None)
            if first is not None:
                queue.remove(first)
                self._fail(first, exc)
        except HeadwaterError as exc:
            queue = self._accumulator.queue
            if key is None:
                self.connection = None
            for batch in [b for b in queue if key is None or b.partition == key]:
                queue.remove(batch)
                self._retry_or_fail(batch, exc)

    async def _owner_connection(self, partition: int) -> Connection:
        """A connection to the partition's owner; an owner that cannot be reached is reported
        and looked up again, after the router's backoff, until its time runs out."""
        router = self.router
        assert router is not None
        delays = router.backoff.delays()
        give_up = time.monotonic() + router.backoff.timeout
        while True:
            owner = await router.route(self.topic, partition)
            try:
                return await self._open_to(owner)
            except ConnectionClosed as exc:
                router.lost(owner.address)
                delay = next(delays, None)
                if delay is None or time.monotonic() >= give_up:
                    raise
                logger.info("cannot reach %s (%s); waiting for a new owner", owner, exc.message)
                # the cluster names the dead owner until its lease expires: a long poll through
                # another broker answers when the new owner's key exists (else the backoff)
                polled = await router.new_owner(self.topic, partition, owner.address)
                if not polled or router.table.owner(self.topic, partition) == owner:
                    await asyncio.sleep(delay)  # no long poll, or no new owner in its time

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
        self._in_flight_on[connection] = self._in_flight_on.get(connection, 0) + 1
        router = self.router
        if router is not None and router.multi_broker:
            self._loop.call_later(
                router.table.owner_check, self._check_owner, connection, batch, batch.attempts
            )
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

    def _check_owner(self, connection: Connection, batch: ProducerBatch, attempt: int) -> None:
        """A batch unanswered for `owner_check` seconds: its owner may be dead or frozen
        (SIGSTOP, a long pause), which its open connection does not tell. Ask another broker,
        until the batch is answered, whether the partition moved (`_probe`)."""
        if (
            batch.attempts != attempt
            or batch not in self._accumulator.in_flight
            or connection.closed
        ):
            return
        if connection in self._probing:
            # a probe of an earlier batch there is still asking (a long poll, up to 5 s after
            # its own batch was answered): look again later. Skipped, this batch waited for a
            # frozen owner to wake (12 s) when the earlier probe ended without a move
            assert self.router is not None
            owner_check = self.router.table.owner_check
            self._loop.call_later(owner_check, self._check_owner, connection, batch, attempt)
            return
        task = self._loop.create_task(self._probe(connection, batch, attempt))
        self._probing[connection] = task
        task.add_done_callback(lambda _: self._probing.pop(connection, None))

    async def _probe(self, connection: Connection, batch: ProducerBatch, attempt: int) -> None:
        """Look the partition up through the other brokers every `LookupBackoff.maximum` while
        the batch is unanswered; once the cluster says the partition is no longer the silent
        broker's (another owner, or none: its lease expired), abandon its connection: every
        batch unanswered there goes again, in order, to the new owners (an idempotent
        producer's resends are recognised there: same producer id and sequences)."""
        router = self.router
        assert router is not None
        silent = self._address_of(connection)
        if silent is None:  # not a connection of ours to a broker: nothing to ask about
            logger.warning("partition %s unanswered on an unknown connection", batch.partition)
            return
        logger.debug("partition %s unanswered at %s: probing", batch.partition, silent)
        while batch.attempts == attempt and batch in self._accumulator.in_flight:
            if connection.closed:
                return
            try:
                moved = await router.moved(self.topic, batch.partition, silent)
            except HeadwaterError as exc:  # no other broker answered: try again shortly
                logger.debug("probe of %s through other brokers failed: %s", silent, exc)
                moved = False
            except Exception:
                # never a silent end: the batch would wait for a frozen owner to wake, or
                # for the request timeout
                logger.warning("probe of %s failed; again shortly", silent, exc_info=True)
                moved = False
            if moved and batch.attempts == attempt and not connection.closed:
                logger.warning(
                    "partition %s of %s moved while %s did not answer for %.1fs; resending",
                    batch.partition,
                    self.topic,
                    silent,
                    time.monotonic() - (batch.first_sent or 0.0),
                )
                self._moved_away.add(connection)  # its batches go again at once (`_answered`)
                connection.abandon()
                return
            await asyncio.sleep(router.backoff.maximum)

    def _address_of(self, connection: Connection) -> tuple[str, int] | None:
        if connection is self.connection:
            assert self.router is not None
            return self.router.table.bootstrap.address
        return next((a for a, c in self.peers.items() if c is connection), None)

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
        moved = connection in self._moved_away  # abandoned: its partitions moved
        left = self._in_flight_on.get(connection, 0) - 1
        if left > 0:
            self._in_flight_on[connection] = left
        else:
            self._in_flight_on.pop(connection, None)
            self._moved_away.discard(connection)
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
            self._retry_or_fail(batch, error, at_once=moved)
        self._accumulator.update_room()
        self._wake.set()

    def _retry_or_fail(
        self, batch: ProducerBatch, error: HeadwaterError, at_once: bool = False
    ) -> None:
        """`at_once`: the batch was unanswered at a silent owner whose partitions the cluster
        names elsewhere now: it goes again without the wait between owners (100 ms more to
        every first acknowledgement after a freeze)."""
        delivery = self.config.delivery
        if not isinstance(delivery, AtLeastOnce) or not error.retriable:
            self._fail(batch, error)
            return
        if at_once:
            delay: float | None = 0.0
        elif self._between_owners(error):
            # a partition between owners is not the batch's failure: it waits for the new
            # owner (the router looks it up) within the policy's time budget, without using up
            # its retries, as Kafka's producer retries NOT_LEADER until its delivery timeout
            delay = OWNER_WAIT
        else:
            if batch.delays is None:
                batch.delays = delivery.retry.delays()
            delay = next(batch.delays, None)
        now = time.monotonic()
        if not batch.first_sent:
            # never sent (its owner never found): the policy's time counts from its first
            # failure, else a partition that never gets an owner held the batch, and every
            # flush and close waiting for it, for ever
            batch.first_sent = now
        started = batch.first_sent
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
        tasks = [self._task, *self._resolving.values(), *self._probing.values()]
        if self._refreshing is not None:
            tasks.append(self._refreshing)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for connection in [self.connection, *self.peers.values()]:
            if connection is not None:
                await connection.close()
