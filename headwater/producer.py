"""The producer: batching, delivery semantics, retries, idempotence, isolation, compression.

`send` appends a record to its partition's open batch and returns a `SendFuture` at once; it waits
only while `max_queued_batches` batches are already waiting to be sent or answered
(backpressure: memory stays bounded). A batch closes when it reaches `batch_size` bytes, or after
`linger` seconds (0: at the end of the current event-loop turn, so records sent together travel
together), or when `flush()` is called; it never grows past `max_request_size`.

One sender task writes closed batches in order on the producer's own connection, with up to
`max_in_flight` unanswered:

- `AtMostOnce()`: frames go out with NO_RESPONSE; each record's future resolves when its batch is
  written to the socket, with `offset=None`. A failure is reported on the future and never
  retried; the producer never waits for the server. A refusal the server sends back (an unknown
  topic, say) is raised by the next `flush()`; `confirm()` waits one round trip for such
  refusals, which is what `headwater produce --delivery at-most-once` does before it reports
  success. `AtMostOnce(wait_for_offsets=True)` asks for
  responses (futures then carry offsets) but still never retries.
- `AtLeastOnce(RetryPolicy)`: a batch is done when the server acknowledges it. A retriable error
  (the connection failing, a timeout, the server shutting down or its storage failing) puts every
  unanswered batch back, in order, and they are sent again on a new connection after the policy's
  next delay, until `max_retries` or the policy's total `timeout` runs out. A non-retriable error
  fails that batch's futures at once.

With `idempotent=True` the producer takes a producer id from the server and numbers its records
per partition (RecordBatch's producer id and base sequence). A resent batch that the server had
already appended is answered with its original offsets instead of being stored twice, so retries
cannot duplicate. `isolation=Isolation.READ_COMMITTED` asks reliable topics to acknowledge only
once an fsync covers the batch.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import time
from collections.abc import Generator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from headwater.producer_config import (
    AtLeastOnce,
    AtMostOnce,
    DeliverySemantic,
    Isolation,
    ProducerConfig,
    RecordMetadata,
    RetryPolicy,
    RetryStrategy,
)
from wire import messages as m
from wire.errors import (
    ConnectionClosed,
    HeadwaterError,
    RecordTooLarge,
    RequestTimeout,
)
from wire.keys import partition_for_key
from wire.records import BatchBuilder

if TYPE_CHECKING:
    from headwater.client import Client
    from headwater.connection import Connection

logger = logging.getLogger("headwater.producer")


_RECORD_OVERHEAD = 64  # bytes a record may add beyond key, value and headers (varints, header)


class _Batch:
    """Records bound for one partition, then the frame that carries them until answered."""

    __slots__ = (
        "attempts",
        "builder",
        "data",
        "delays",
        "first_sent",
        "not_before",
        "order",
        "partition",
        "result",
        "sequence",
        "size",
        "timestamps",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        order: int,
        partition: int,
        builder: BatchBuilder,
        sequence: int,
    ) -> None:
        self.order = order
        self.partition = partition
        self.builder = builder
        self.sequence = sequence
        self.size = 61
        self.timestamps: list[int] = []
        self.data: bytes | None = None
        self.attempts = 0
        self.first_sent = 0.0
        self.not_before = 0.0
        self.delays: Iterator[float] | None = None
        self.result: asyncio.Future[m.ProduceResponse] = loop.create_future()
        # Errors reach callers through SendFuture or flush(); mark them seen so asyncio does
        # not also log "exception was never retrieved" for batches nobody awaited.
        self.result.add_done_callback(_retrieve)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class SendFuture:
    """The outcome of one `send`: await it for the record's `RecordMetadata`.

    One per record, so it is a small object pointing into its batch's single result future: an
    asyncio.Future per record cost more than encoding the record.
    """

    __slots__ = ("_batch", "_position", "_topic")

    def __init__(self, topic: str, batch: _Batch, position: int) -> None:
        self._topic = topic
        self._batch = batch
        self._position = position

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        response = yield from self._batch.result.__await__()
        return self._metadata(response)

    def done(self) -> bool:
        return self._batch.result.done()

    def exception(self) -> BaseException | None:
        return self._batch.result.exception()

    def result(self) -> RecordMetadata:
        """The metadata if the send completed; raises its error, or InvalidStateError if pending."""
        return self._metadata(self._batch.result.result())

    def _metadata(self, response: m.ProduceResponse) -> RecordMetadata:
        offset = response.base_offset + self._position if response.base_offset >= 0 else None
        return RecordMetadata(
            self._topic, response.partition, offset, self._batch.timestamps[self._position]
        )


class Producer:
    def __init__(self, client: Client, topic: str, config: ProducerConfig) -> None:
        self._client = client
        self.topic = topic
        self.config = config
        self._loop = asyncio.get_running_loop()
        self._connection: Connection | None = None
        self._partitions: int | None = None
        self._next_partition = 0
        self._open: dict[int, _Batch] = {}
        self._closers: dict[int, asyncio.Handle | asyncio.TimerHandle] = {}
        self._queue: list[_Batch] = []  # closed, waiting to be sent, by `order`
        self._in_flight: list[_Batch] = []
        self._order = itertools.count()
        self._sequences: dict[int, int] = {}
        self._producer_id = -1
        self._first_error: HeadwaterError | None = None
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        self._sender = self._loop.create_task(self._send_loop())

    @property
    def _at_least_once(self) -> bool:
        return isinstance(self.config.delivery, AtLeastOnce)

    # Sending records

    async def send(
        self,
        value: bytes | None,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> SendFuture:
        """Queue one record; waits only while the producer's queue is full."""
        if self._closed:
            raise ConnectionClosed("producer is closed")
        while not self._room.is_set():
            await self._room.wait()
        header_list = list(headers.items()) if headers else []
        size = (
            _RECORD_OVERHEAD
            + (len(key) if key else 0)
            + (len(value) if value else 0)
            + sum(len(k) + len(v or b"") for k, v in header_list)
        )
        if size + 61 > self.config.max_request_size:
            raise RecordTooLarge(
                f"record of about {size} bytes exceeds max_request_size "
                f"{self.config.max_request_size}"
            )
        if self.config.idempotent and self._producer_id < 0:
            await self._init_producer_id()
        if partition is None:
            partition = await self._partition_for(key)
        batch = self._open.get(partition)
        if batch is not None and batch.size + size > self.config.max_request_size:
            self._close_batch(partition)
            batch = None
        if batch is None:
            batch = self._new_batch(partition)
        timestamp = int(time.time() * 1000)
        position = batch.builder.append(key, value, header_list, timestamp)
        batch.timestamps.append(timestamp)
        batch.size += size
        if batch.size >= self.config.batch_size:
            self._close_batch(partition)
        return SendFuture(self.topic, batch, position)

    async def _partition_for(self, key: bytes | None) -> int:
        if key is None and not self.config.idempotent:
            return -1  # the server spreads keyless batches round-robin
        if self._partitions is None:
            self._partitions = (await self._client.describe_topic(self.topic)).topic.partitions
        if key is None:
            self._next_partition = (self._next_partition + 1) % self._partitions
            return self._next_partition
        return partition_for_key(key, self._partitions)

    def _new_batch(self, partition: int) -> _Batch:
        sequence = self._sequences.get(partition, 0) if self.config.idempotent else -1
        builder = BatchBuilder(
            self.config.compression,
            producer_id=self._producer_id if self.config.idempotent else -1,
            producer_epoch=0 if self.config.idempotent else -1,
            base_sequence=sequence,
        )
        batch = _Batch(self._loop, next(self._order), partition, builder, sequence)
        self._open[partition] = batch
        self._idle.clear()
        if self.config.linger:
            self._closers[partition] = self._loop.call_later(
                self.config.linger, self._close_batch, partition
            )
        else:
            self._closers[partition] = self._loop.call_soon(self._close_batch, partition)
        return batch

    def _close_batch(self, partition: int) -> None:
        batch = self._open.pop(partition, None)
        closer = self._closers.pop(partition, None)
        if closer is not None:
            closer.cancel()
        if batch is None:
            return
        if self.config.idempotent:
            self._sequences[partition] = batch.sequence + batch.builder.count
        batch.data = batch.builder.build()
        self._queue.append(batch)
        self._update_room()
        self._wake.set()

    def _update_room(self) -> None:
        if len(self._queue) + len(self._in_flight) >= self.config.max_queued_batches:
            self._room.clear()
        else:
            self._room.set()
        if not (self._queue or self._in_flight or self._open):
            self._idle.set()

    # The sender

    async def _send_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                batch = self._queue[0]
                now = time.monotonic()
                if batch.not_before > now:
                    break  # its retry timer wakes the sender
                if len(self._in_flight) >= self.config.max_in_flight:
                    break
                connection = await self._connect()
                if connection is None:
                    break  # retry scheduled, or batches failed
                await connection.throttle()  # the server's THROTTLE: over the produce quota
                self._queue.pop(0)
                self._transmit(connection, batch)
            self._update_room()

    async def _init_producer_id(self) -> None:
        """Idempotent producers get their id before building their first batch."""
        response = await self._client.request(m.InitProducerIdRequest())
        assert isinstance(response, m.InitProducerIdResponse)
        self._producer_id = response.producer_id

    async def _connect(self) -> Connection | None:
        if self._connection is not None and not self._connection.closed:
            return self._connection
        try:
            self._connection = await self._client._open_connection()
            self._connection.on_unsolicited_error = self._unsolicited_error
            return self._connection
        except HeadwaterError as exc:
            self._connection = None
            for batch in list(self._queue):
                self._queue.remove(batch)
                self._retry_or_fail(batch, exc)
            return None

    def _transmit(self, connection: Connection, batch: _Batch) -> None:
        assert batch.data is not None
        if batch.attempts == 0:
            batch.first_sent = time.monotonic()
        batch.attempts += 1
        request = m.ProduceRequest(self.topic, batch.partition, batch.data, self.config.isolation)
        wants_response = self._at_least_once or (
            isinstance(self.config.delivery, AtMostOnce) and self.config.delivery.wait_for_offsets
        )
        try:
            if not wants_response:
                connection.produce(request, None)
                batch.result.set_result(m.ProduceResponse(batch.partition, -1))
                return
            response: asyncio.Future[m.Response] = self._loop.create_future()
            connection.produce(request, response)
        except HeadwaterError as exc:
            self._retry_or_fail(batch, exc)
            return
        self._in_flight.append(batch)
        response.add_done_callback(lambda done: self._answered(batch, done))
        attempt = batch.attempts
        self._loop.call_later(
            self.config.request_timeout, self._check_answered, connection, batch, attempt
        )

    def _check_answered(self, connection: Connection, batch: _Batch, attempt: int) -> None:
        """No answer in `request_timeout`: give up on the connection; its batches are retried."""
        if batch.attempts == attempt and batch in self._in_flight:
            logger.warning("no answer in %ss; reconnecting", self.config.request_timeout)
            connection.abandon()

    def _answered(self, batch: _Batch, done: asyncio.Future[m.Response]) -> None:
        if batch in self._in_flight:
            self._in_flight.remove(batch)
        error = done.exception() if not done.cancelled() else RequestTimeout("cancelled")
        if error is None:
            response = done.result()
            assert isinstance(response, m.ProduceResponse)
            if not batch.result.done():
                batch.result.set_result(response)
        else:
            assert isinstance(error, HeadwaterError)
            if error.retriable and self._connection is not None:
                # Resend everything unanswered in order, on a fresh connection: the server
                # handles a connection's requests in order, so sequences never gap.
                self._connection.abandon()
            self._retry_or_fail(batch, error)
        self._update_room()
        self._wake.set()

    def _retry_or_fail(self, batch: _Batch, error: HeadwaterError) -> None:
        delivery = self.config.delivery
        if not isinstance(delivery, AtLeastOnce) or not error.retriable:
            self._fail(batch, error)
            return
        if batch.delays is None:
            batch.delays = delivery.retry.delays()
        delay = next(batch.delays, None)
        now = time.monotonic()
        started = batch.first_sent or now
        if delay is None or now + delay - started > delivery.retry.timeout:
            self._fail(batch, error)
            return
        batch.not_before = now + delay
        bisect.insort(self._queue, batch, key=lambda b: b.order)
        self._loop.call_later(delay, self._wake.set)
        logger.debug("retrying batch for partition %s in %.3fs: %s", batch.partition, delay, error)

    def _unsolicited_error(self, error: HeadwaterError) -> None:
        """The server refused a frame sent without response (at-most-once): which batch is not
        known, so the error goes to the next `flush()` (and `confirm()`) and the log."""
        logger.warning("at-most-once send to %s failed: %s", self.topic, error)
        if self._first_error is None:
            self._first_error = error

    def _fail(self, batch: _Batch, error: HeadwaterError) -> None:
        if not batch.result.done():
            batch.result.set_exception(error)
        if self._first_error is None:
            self._first_error = error

    # Flushing and closing

    async def flush(self) -> None:
        """Send everything queued, wait until every send is resolved, raise the first error
        since the last flush."""
        for partition in list(self._open):
            self._close_batch(partition)
        self._update_room()
        await self._idle.wait()
        error, self._first_error = self._first_error, None
        if error is not None:
            raise error

    async def confirm(self, timeout: float = 2.0) -> None:
        """`flush()`, then wait (at most `timeout` s) until the server has handled every frame
        sent so far, and raise the first error it reported. For at-most-once producers, whose
        frames get no answer unless refused: one round trip on the producer's connection, which
        the server answers after every request sent before it. A refusal that only comes later
        (a reliable topic's fsync failing after the append) is not waited for."""
        await self.flush()
        connection = self._connection
        if connection is not None:
            await connection.request(m.ApiVersionsRequest(), timeout=timeout)
        error, self._first_error = self._first_error, None
        if error is not None:
            raise error

    async def close(self) -> None:
        if self._closed:
            return
        try:
            await self.flush()
        finally:
            self._closed = True
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
            if self._connection is not None:
                await self._connection.close()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


__all__ = [
    "AtLeastOnce",
    "AtMostOnce",
    "DeliverySemantic",
    "Isolation",
    "Producer",
    "ProducerConfig",
    "RecordMetadata",
    "RetryPolicy",
    "RetryStrategy",
    "SendFuture",
]
