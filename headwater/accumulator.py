"""The producer's accumulator: records into per-partition batches, closed batches into a queue.

As in aiokafka, the producer is two halves: this one collects and the sender
(headwater/sender.py) transmits. `append` adds a record to its partition's open batch; a batch
closes when it reaches `batch_size` bytes, after `linger` seconds (0: at the end of the current
event-loop turn, so records sent together travel together), or on `close_all` (flush); it never
grows past `max_request_size`. Closed batches wait in `queue`, in the order they were opened
(`order`), until the sender takes them; the sender keeps them in `in_flight` until answered and
puts a batch to retry back with `requeue`, in its place.

The accumulator is also the producer's memory bound: `room` is clear while `max_queued_batches`
batches are queued or in flight (`send` waits on it), and `idle` is set when nothing is open,
queued or in flight (`flush` waits on it). With idempotence, each partition's sequence numbers
are assigned here, when a batch is opened.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

from headwater.producer_config import ProducerConfig, RecordMetadata
from headwater.wire import messages as m
from headwater.wire.records import BatchBuilder

BATCH_OVERHEAD = 61  # RecordBatch v2 header bytes
RECORD_OVERHEAD = 64  # bytes a record may add beyond key, value and headers (varints, header)


class ProducerBatch:
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
        self.size = BATCH_OVERHEAD
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

    def __init__(self, topic: str, batch: ProducerBatch, position: int) -> None:
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


class RecordAccumulator:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        topic: str,
        config: ProducerConfig,
        ready: Callable[[], None],
    ) -> None:
        self._loop = loop
        self.topic = topic
        self.config = config
        self._ready = ready  # tells the sender a batch is queued
        self.producer_id = -1
        self._open: dict[int, ProducerBatch] = {}
        self._closers: dict[int, asyncio.Handle | asyncio.TimerHandle] = {}
        self.queue: list[ProducerBatch] = []  # closed, waiting to be sent, by `order`
        self.in_flight: list[ProducerBatch] = []  # sent, waiting for an answer
        self._order = itertools.count()
        self._sequences: dict[int, int] = {}
        self.room = asyncio.Event()
        self.room.set()
        self.idle = asyncio.Event()
        self.idle.set()

    def append(
        self,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]],
        size: int,
    ) -> SendFuture:
        """Add a record of about `size` bytes (checked against max_request_size already)."""
        batch = self._open.get(partition)
        if batch is not None and batch.size + size > self.config.max_request_size:
            self.close_batch(partition)
            batch = None
        if batch is None:
            batch = self._new_batch(partition)
        timestamp = int(time.time() * 1000)
        position = batch.builder.append(key, value, headers, timestamp)
        batch.timestamps.append(timestamp)
        batch.size += size
        if batch.size >= self.config.batch_size:
            self.close_batch(partition)
        return SendFuture(self.topic, batch, position)

    def _new_batch(self, partition: int) -> ProducerBatch:
        idempotent = self.config.idempotent
        sequence = self._sequences.get(partition, 0) if idempotent else -1
        builder = BatchBuilder(
            self.config.compression,
            producer_id=self.producer_id if idempotent else -1,
            producer_epoch=0 if idempotent else -1,
            base_sequence=sequence,
        )
        batch = ProducerBatch(self._loop, next(self._order), partition, builder, sequence)
        self._open[partition] = batch
        self.idle.clear()
        if self.config.linger:
            self._closers[partition] = self._loop.call_later(
                self.config.linger, self.close_batch, partition
            )
        else:
            self._closers[partition] = self._loop.call_soon(self.close_batch, partition)
        return batch

    def close_batch(self, partition: int) -> None:
        batch = self._open.pop(partition, None)
        closer = self._closers.pop(partition, None)
        if closer is not None:
            closer.cancel()
        if batch is None:
            return
        if self.config.idempotent:
            self._sequences[partition] = batch.sequence + batch.builder.count
        batch.data = batch.builder.build()
        self.queue.append(batch)
        self.update_room()
        self._ready()

    def close_all(self) -> None:
        for partition in list(self._open):
            self.close_batch(partition)
        self.update_room()

    def requeue(self, batch: ProducerBatch) -> None:
        """Put a batch to retry back in its place: retries keep the order batches were made in."""
        bisect.insort(self.queue, batch, key=lambda b: b.order)

    def update_room(self) -> None:
        if len(self.queue) + len(self.in_flight) >= self.config.max_queued_batches:
            self.room.clear()
        else:
            self.room.set()
        if not (self.queue or self.in_flight or self._open):
            self.idle.set()
