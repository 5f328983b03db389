"""The consumer side of the client: `Consumer`, an async iterator of `Message`s.

A consumer grants the server `prefetch` credits when it subscribes and tops them up as the
application takes messages, so at most `prefetch` messages wait in memory. Acks made in one
event-loop turn travel in one request, as ranges of consecutive offsets (ACK_RANGES): a consumer
acking one partition's messages in order sends one range a turn, and each ack only extends it.

How a consumer ends says why. `async for` stops only when the application closed the consumer
(or its client); anything else raises: `ConnectionLost` when the server or the network ended the
connection, or the server's own reason from CONSUMER_CLOSED (`UnknownTopic` when the topic was
deleted, `UnknownSubscription` when the subscription was, `ServerShuttingDown`). Messages already
buffered are handed out first. On a reconnecting client (`connect(..., reconnect=...)`), a lost
connection or a shutdown only *suspends* the consumer: the client resubscribes it with the same
request once it has reconnected, and it raises `ConnectionLost` only if the client gives up.

A MESSAGES_DROPPED notice (non-reliable topics: the server dropped messages this consumer's
subscription could not take) adds to `consumer.dropped`, calls the `on_dropped(count)` callback
given to `subscribe` (or logs a warning when there is none), and marks the next message received
with `missed=count`.

In a cluster the consumer also takes from the legs at the other brokers owning partitions of
its topic (`_cluster`, headwater/client/consumer_legs.py); losing its own connection then only
suspends it, and the legs follow the partitions to their new owners.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Protocol

from headwater.client.message_batch import Message, MessageBatch
from headwater.client.schema_codec import SchemaCodec
from headwater.wire import messages as m
from headwater.wire.errors import (
    ConnectionClosed,
    ConnectionLost,
    HeadwaterError,
    InvalidRequest,
    NotOwner,
    ServerShuttingDown,
)
from headwater.wire.limits import MAX_ACK_RANGES_PER_REQUEST, MAX_OFFSETS_PER_ACK_RANGES
from headwater.wire.records import inspect_batch

if TYPE_CHECKING:
    from headwater.client.broker_connection import Connection

__all__ = ["Consumer", "Legs", "Message", "ms"]

logger = logging.getLogger(__name__)


class Legs(Protocol):
    """What a consumer asks of its legs at the other brokers of a cluster
    (`consumer_legs.ClusterLegs`): it knows them only through this, so the two modules do not
    import each other."""

    def leg_lost(self, consumer: Consumer, error: HeadwaterError) -> None: ...

    def stop(self, error: HeadwaterError) -> None: ...

    async def pick(self, timeout: float | None) -> Consumer: ...

    async def close(self) -> None: ...


def ms(seconds: float | None) -> int:
    if seconds is None:
        return 0
    if seconds < 0:
        raise InvalidRequest("durations must be >= 0")
    return max(1, round(seconds * 1000))


class Consumer:
    """An async iterator of `Message`s for one subscription."""

    def __init__(
        self,
        connection: Connection,
        topic: str,
        subscription: str,
        prefetch: int,
        limit: int | None = None,
        *,
        resumable: bool = False,
        on_dropped: Callable[[int], None] | None = None,
        on_end: Callable[[Consumer], None] | None = None,
    ) -> None:
        self._connection = connection
        self.topic = topic
        self.subscription = subscription
        self.consumer_id = -1
        self.dropped = 0  # messages the server dropped for this consumer (non-reliable topics)
        self.dropped_callback = on_dropped
        self._prefetch = prefetch
        self._limit = limit
        self._received = 0
        self._missed = 0  # dropped, not yet reported on a message
        self._messages: deque[Message] = deque()  # decoded, for receive()
        self._batches: deque[MessageBatch] = deque()  # as delivered, not decoded yet
        self._taken_since_grant = 0
        # credit still to grant after the initial prefetch, when the consumer has a limit
        self._grantable = None if limit is None else limit - prefetch
        self._waiter: asyncio.Future[None] | None = None
        self._error: HeadwaterError | None = None
        self._resumable = resumable
        self._on_end = on_end
        self._suspended = False  # connection lost; the client will resubscribe us
        self._request: m.SubscribeRequest | None = None
        # acks of this turn: the finished runs, and the run being extended ([first, end) of a
        # partition; end -1: none)
        self._ack_ranges: list[m.AckRange] = []
        self._run_partition = 0
        self._run_first = 0
        self._run_end = -1
        self._ack_flush_scheduled = False
        self._codecs: dict[int, SchemaCodec] = {}
        self._on_ready: Callable[[], None] | None = None  # a cluster consumer merging legs
        self._cluster: Legs | None = None  # the legs at other brokers, in a cluster

    async def codec(self, version: int) -> SchemaCodec:
        """Schema version `version` of the topic, fetched on first use."""
        codec = self._codecs.get(version)
        if codec is None:
            response = await self._connection.request(m.GetSchemaRequest(self.topic, version))
            assert isinstance(response, m.GetSchemaResponse)
            codec = self._codecs[version] = SchemaCodec(response.schema)
        return codec

    # Pushes from the connection

    def _attach(self, response: m.Response) -> None:
        assert isinstance(response, m.SubscribeResponse)
        self.consumer_id = response.consumer_id
        if self._error is not None:  # closed while its resubscription was under way
            self._connection.send_nowait(m.UnsubscribeRequest(response.consumer_id))
            return
        self._suspended = False
        self._connection.consumers[response.consumer_id] = self

    def on_delivery(self, delivery: m.Delivery) -> None:
        """Keep the batch as it came (header and CRC checked): it is decoded when taken, by
        `receive` into messages or by the application from a `MessageBatch`."""
        if self._error is not None:
            return  # ended (a batch did not decode, say): nothing more is handed out
        try:
            info = inspect_batch(delivery.batch)
        except HeadwaterError as exc:
            self.on_closed(exc)
            return
        build = partial(Message, self, self.topic, delivery.partition, delivery.delivery_count)
        batch = MessageBatch(
            self,
            self.topic,
            delivery.partition,
            delivery.delivery_count,
            delivery.batch,
            info,
            build,
            self._missed,
        )
        batch.received_ns = time.monotonic_ns()
        self._batches.append(batch)
        self._missed = 0
        self._received += info.record_count
        self._wake()

    def on_dropped(self, count: int) -> None:
        """MESSAGES_DROPPED: the next message handed out says `missed=count`."""
        self._missed += count
        self.report_dropped(count)

    def report_dropped(self, count: int) -> None:
        """Count messages the server dropped for this consumer and tell the application: its
        `on_dropped` callback, else a warning. A cluster consumer's legs report here too."""
        self.dropped += count
        if self.dropped_callback is not None:
            self.dropped_callback(count)
        else:
            logger.warning(
                "consumer %s of %s/%s missed %d messages (the consumer fell behind)",
                self.consumer_id,
                self.topic,
                self.subscription,
                count,
            )

    def on_undecodable(self, error: HeadwaterError) -> None:
        """A delivered batch did not decode (found when it was taken): the consumer ends, and
        what was delivered after it is not handed out."""
        self._batches.clear()
        self.on_closed(error)

    def on_closed(self, error: HeadwaterError) -> None:
        if self._error is not None:
            return
        if self._cluster is not None and isinstance(
            error, ConnectionLost | ServerShuttingDown | NotOwner
        ):
            self._suspended = True  # the other legs go on; ours is placed again
            self._cluster.leg_lost(self, error)
            return
        if self._resumable and isinstance(error, ConnectionLost | ServerShuttingDown):
            self._suspended = True  # the client resubscribes us once it has reconnected
            return
        self._end(error)

    def _end(self, error: HeadwaterError) -> None:
        self._error = self._error or error
        self._suspended = False
        if self._cluster is not None:
            self._cluster.stop(self._error)
        self._wake()
        if self._on_end is not None:
            self._on_end(self)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        if self._on_ready is not None:
            self._on_ready()

    # Reconnection

    @property
    def resumable(self) -> bool:
        """Open, and due to be resubscribed after a reconnection."""
        return self._error is None and self._suspended

    async def _resubscribe(self, connection: Connection) -> None:
        """Subscribe again on a new connection with the first request's settings (or end, when
        a limit is already met and nothing more will be asked for)."""
        assert self._request is not None
        credits = max(1, self._prefetch - self._buffered())
        if self._limit is not None:
            remaining = self._limit - self._received
            if remaining <= 0:
                self._end(connection.lost("not resubscribed: the consumer's limit was reached"))
                return
            credits = min(credits, remaining)
            self._grantable = remaining - credits
        # Acks and grants of the old connection are gone with it: the server redelivers
        # what was not acknowledged, and the new consumer starts from fresh credit.
        self._ack_ranges.clear()
        self._run_end = -1
        self._taken_since_grant = 0
        self._connection = connection
        await connection.request(
            replace(self._request, initial_credits=credits), on_response=self._attach
        )

    # Iteration

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        messages = self._messages
        if messages and self._cluster is None:  # `receive`'s path for a buffered message
            message = messages.popleft()
            self._taken(1)
            return message
        try:
            return await self.receive()
        except ConnectionClosed as exc:
            if isinstance(exc, ConnectionLost):
                raise
            raise StopAsyncIteration from None  # the application closed us or our client

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message; raises the closing error, or TimeoutError after `timeout` seconds."""
        leg = await self._ready_leg(timeout)
        if leg is not self:
            return await leg.receive(0)
        if not self._messages:
            self._decode_next()
        message = self._messages.popleft()
        self._taken(1)
        return message

    def _decode_next(self, more: bool = False) -> None:
        """The next delivered batch into messages (`_wait` returned: there is one); `more`:
        one more even if messages are buffered."""
        while more or not self._messages:
            more = False
            if not self._batches:
                assert self._error is not None
                raise type(self._error)(self._error.message)
            self._messages.extend(self._batches.popleft().messages())

    def _buffered(self) -> int:
        return len(self._messages) + sum(len(b) for b in self._batches)

    async def next_batch(self, timeout: float | None = None) -> MessageBatch:
        """The next delivered batch, not decoded until accessed (see `MessageBatch`): one await
        and no per-record work for consumers that need the throughput. Raises as `receive`."""
        leg = await self._ready_leg(timeout)
        if leg is not self:
            return await leg.next_batch(0)
        if self._messages:  # left over from receive(): hand them out first, in order
            messages = list(self._messages)
            self._messages.clear()
            batch = MessageBatch.of_messages(self, messages)
        else:
            batch = self._batches.popleft()
        self._taken(len(batch))
        return batch

    async def batches(self) -> AsyncIterator[MessageBatch]:
        """`async for batch in consumer.batches()`: `next_batch` until the consumer is closed
        (ends quietly) or fails (raises, as iterating messages does)."""
        while True:
            try:
                batch = await self.next_batch()
            except ConnectionClosed as exc:
                if isinstance(exc, ConnectionLost):
                    raise
                return
            yield batch

    async def receive_batch(
        self, max_messages: int = 1000, timeout: float | None = None
    ) -> list[Message]:
        """Whatever is buffered, up to `max_messages` (waiting for at least one): one await for
        many messages, for consumers that need the throughput."""
        leg = await self._ready_leg(timeout)
        if leg is not self:
            return await leg.receive_batch(max_messages, 0)
        if not self._messages:
            self._decode_next()
        messages = self._messages
        while len(messages) < max_messages and self._batches:
            self._decode_next(more=True)
        count = min(max_messages, len(messages))
        taken = [messages.popleft() for _ in range(count)]
        self._taken(count)
        return taken

    async def _ready_leg(self, timeout: float | None) -> Consumer:
        """This consumer with a delivery at hand, or in a cluster the leg that has one. Legs at
        the topic's other owners may be attached while a wait on this consumer alone is in
        progress (the routes were not known at SUBSCRIBE): the wait then looks at them too."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            if self._cluster is not None:
                return await self._cluster.pick(remaining)
            if self._messages or self._batches:
                return self
            await self._wait(remaining)

    def join_cluster(self, legs: Legs) -> None:
        """Legs at the topic's other owners are attached: a wait in progress looks at them."""
        self._cluster = legs
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait(self, timeout: float | None) -> None:
        """Until a delivery, the consumer's end (raised), legs attached, or TimeoutError."""
        while not (self._messages or self._batches):
            if self._error is not None:
                raise type(self._error)(self._error.message)
            if self._cluster is not None:
                return
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout):
                    await self._waiter
            finally:
                self._waiter = None

    @property
    def _live(self) -> bool:
        return self._error is None and not self._suspended and not self._connection.closed

    def _taken(self, count: int) -> None:
        self._taken_since_grant += count
        if self._taken_since_grant * 2 >= self._prefetch and self._live:
            # Top credit back up in halves, as Pulsar's receiver queue does: one FLOW per
            # prefetch/2 messages rather than one per message.
            grant = self._taken_since_grant
            if self._grantable is not None:
                grant = min(grant, self._grantable)
                self._grantable -= grant
            self._taken_since_grant = 0
            if grant > 0:
                self._connection.send_nowait(m.FlowRequest(self.consumer_id, grant))

    # Acknowledgements

    async def ack(self, message: Message) -> None:
        """Acknowledge one message. Acks made in one event-loop turn travel in one request."""
        if message._consumer is not self and message._consumer is not None:
            return await message._consumer.ack(message)  # another leg's (a cluster)
        offset = message.offset
        if offset == self._run_end and message.partition == self._run_partition:
            self._run_end = offset + 1  # the next in order: the run grows
        else:
            self._ack_offset(message.partition, offset)

    async def ack_offsets(self, partition: int, offsets: Iterable[int]) -> None:
        """Acknowledge many messages of a partition (a `MessageBatch.ack()`)."""
        for offset in offsets:
            if offset == self._run_end and partition == self._run_partition:
                self._run_end = offset + 1
            else:
                self._ack_offset(partition, offset)

    def _ack_offset(self, partition: int, offset: int) -> None:
        """An ack that does not extend the current run: close it, start another, and make sure
        this turn's acks are sent."""
        if self._run_end >= 0:
            self._ack_ranges.append(
                m.AckRange(self._run_partition, self._run_first, self._run_end - self._run_first)
            )
        self._run_partition, self._run_first, self._run_end = partition, offset, offset + 1
        if not self._ack_flush_scheduled:
            self._ack_flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_acks)
            self._connection.before_request.append(self._flush_acks)

    async def ack_cumulative(self, message: Message) -> None:
        """Acknowledge the message and every earlier one of its partition (not on Shared)."""
        if message._consumer is not self and message._consumer is not None:
            return await message._consumer.ack_cumulative(message)
        await self.ack_cumulative_offset(message.partition, message.offset)

    async def ack_cumulative_offset(self, partition: int, offset: int) -> None:
        self._flush_acks()
        if self._live:
            self._connection.send_nowait(
                m.AckRequest(
                    self.consumer_id, (m.AckEntry(partition, offset),), m.AckKind.CUMULATIVE
                )
            )

    async def nack(self, message: Message, delay: float | None = None) -> None:
        if message._consumer is not self and message._consumer is not None:
            return await message._consumer.nack(message, delay)
        if self._live:
            self._connection.send_nowait(
                m.NackRequest(
                    self.consumer_id,
                    (m.AckEntry(message.partition, message.offset),),
                    ms(delay),
                )
            )

    def _flush_acks(self) -> None:
        if not self._ack_flush_scheduled:
            return
        self._ack_flush_scheduled = False
        with contextlib.suppress(ValueError):
            self._connection.before_request.remove(self._flush_acks)
        ranges, self._ack_ranges = self._ack_ranges, []
        if self._run_end >= 0:
            ranges.append(
                m.AckRange(self._run_partition, self._run_first, self._run_end - self._run_first)
            )
            self._run_end = -1
        if not self._live:
            return  # unacknowledged on a lost connection: the server delivers them again
        for request in ack_requests(self.consumer_id, ranges):
            self._connection.send_nowait(request)

    async def close(self) -> None:
        """Unsubscribe. A consumer the application closed ends its iteration normally."""
        if self._cluster is not None:
            await self._cluster.close()
        self._flush_acks()
        if self._live:
            self._connection.consumers.pop(self.consumer_id, None)
            with contextlib.suppress(ConnectionClosed):  # gone with the connection anyway
                await self._connection.request(m.UnsubscribeRequest(self.consumer_id))
        self._end(ConnectionClosed("consumer closed"))

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


def ack_requests(consumer_id: int, ranges: Iterable[m.AckRange]) -> Iterator[m.AckRangesRequest]:
    """ACK_RANGES requests for `ranges`, each within the request's limits (a range covering
    more offsets than one request may is split)."""
    batch: list[m.AckRange] = []
    covered = 0
    for entry in ranges:
        first, count = entry.first_offset, entry.count
        while count > 0:  # a range of no offsets asks nothing
            take = min(count, MAX_OFFSETS_PER_ACK_RANGES - covered)
            batch.append(m.AckRange(entry.partition, first, take))
            covered += take
            first += take
            count -= take
            if covered == MAX_OFFSETS_PER_ACK_RANGES or len(batch) == MAX_ACK_RANGES_PER_REQUEST:
                yield m.AckRangesRequest(consumer_id, tuple(batch))
                batch, covered = [], 0
    if batch:
        yield m.AckRangesRequest(consumer_id, tuple(batch))
