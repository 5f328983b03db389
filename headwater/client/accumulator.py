"""The producer's accumulator: records into per-partition batches, closed batches into a queue.

As in aiokafka, the producer is two halves: this one collects and the sender
(headwater/client/sender.py) transmits. `append` adds a record to its partition's open batch
(`extend` adds many, for `send_batch`, in one call to the C encoder's loop per batch); a batch
closes when it reaches `batch_size` bytes, after `linger` seconds (0: at the end of the current
event-loop turn, so records sent together travel together), or on `close_all` (flush); it never
grows past `max_request_size`. Closed batches wait in `queue`, in the order they were opened
(`order`), until the sender takes them; the sender keeps them in `in_flight` until answered and puts
a batch to retry back with `requeue`, in its place.

The accumulator is also the producer's memory bound: `room` is clear while `max_queued_batches`
batches are queued or in flight (`send` waits on it). `unresolved` holds the result of every
batch opened and not yet answered, wherever it is (open, queued, in flight, between a failure
and its retry): `flush` waits for the ones there when it is called, not for "nothing left",
which a task that goes on sending never allows. With idempotence, each partition's sequence
numbers are assigned here, when a batch is opened (and a transactional producer's batches
flagged so, with its epoch).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, overload

from headwater.client.producer_config import ProducerConfig, RecordMetadata
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


class BatchSendFuture:
    """The outcome of one `send_batch`: await it for a `SentBatch` (every record's metadata).

    The records may span several produce batches (each closes at `batch_size`); this waits for
    each in turn and raises the first error. `futures()` gives one `SendFuture` per record, for
    an application that must tell which records of a partly failed call were delivered.
    """

    __slots__ = ("_placed", "_segments", "_topic")

    def __init__(
        self,
        topic: str,
        segments: list[tuple[ProducerBatch, int, int]],
        placed: list[int] | None = None,
    ) -> None:
        self._topic = topic
        self._segments = segments  # (batch, position of the first record, record count)
        # keyed records are queued partition by partition: placed[i] is where the call's i-th
        # record sits in the segments' order (None: in the order given)
        self._placed = placed

    def __await__(self) -> Generator[Any, None, SentBatch]:
        responses = []
        for batch, _, _ in self._segments:
            responses.append((yield from batch.result.__await__()))
        return SentBatch(self._topic, self._segments, responses, self._placed)

    def __len__(self) -> int:
        return sum(count for _, _, count in self._segments)

    def done(self) -> bool:
        return all(batch.result.done() for batch, _, _ in self._segments)

    def exception(self) -> BaseException | None:
        """The first error of a finished call (InvalidStateError while any part is pending)."""
        for batch, _, _ in self._segments:
            error = batch.result.exception()
            if error is not None:
                return error
        return None

    def futures(self) -> list[SendFuture]:
        """One future per record, in the order the records were given."""
        queued = [
            SendFuture(self._topic, batch, position)
            for batch, first, count in self._segments
            for position in range(first, first + count)
        ]
        return queued if self._placed is None else [queued[j] for j in self._placed]


class SentBatch(Sequence[RecordMetadata]):
    """Every record's `RecordMetadata` of a completed `send_batch`, in the order sent, built
    when asked for (a per-record object is what the batch API avoids)."""

    def __init__(
        self,
        topic: str,
        segments: list[tuple[ProducerBatch, int, int]],
        responses: list[m.ProduceResponse],
        placed: list[int] | None = None,
    ) -> None:
        self._topic = topic
        self._placed = placed  # as BatchSendFuture's
        # the timestamps, not the batches: a kept SentBatch holds no encoded bytes
        self._parts = [
            (batch.timestamps, first, count, response)
            for (batch, first, count), response in zip(segments, responses, strict=True)
        ]
        self._length = sum(count for _, _, count in segments)

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> RecordMetadata: ...

    @overload
    def __getitem__(self, index: slice) -> list[RecordMetadata]: ...

    def __getitem__(self, index: int | slice) -> RecordMetadata | list[RecordMetadata]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._length))]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("record index out of range")
        if self._placed is not None:
            index = self._placed[index]
        for timestamps, first, count, response in self._parts:
            if index < count:
                position = first + index
                offset = response.base_offset + position if response.base_offset >= 0 else None
                return RecordMetadata(self._topic, response.partition, offset, timestamps[position])
            index -= count
        raise AssertionError("unreachable")

    @property
    def offsets(self) -> list[int | None]:
        """Each record's offset (None when the delivery semantic does not wait for offsets)."""
        offsets: list[int | None] = []
        for _, first, count, response in self._parts:
            if response.base_offset < 0:
                offsets.extend([None] * count)
            else:
                start = response.base_offset + first
                offsets.extend(range(start, start + count))
        return offsets if self._placed is None else [offsets[j] for j in self._placed]


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
        self.producer_epoch = 0  # a transactional producer's, from its coordinator
        self._transactional = config.transactional_id is not None
        self._open: dict[int, ProducerBatch] = {}
        self._closers: dict[int, asyncio.Handle | asyncio.TimerHandle] = {}
        self.queue: list[ProducerBatch] = []  # closed, waiting to be sent, by `order`
        self.in_flight: list[ProducerBatch] = []  # sent, waiting for an answer
        self._order = itertools.count()
        self._sequences: dict[int, int] = {}
        self.room = asyncio.Event()
        self.room.set()
        # each batch's result until it is done (a bound method as the callback: a closure per
        # batch cost twice as much, on every batch)
        self.unresolved: set[asyncio.Future[m.ProduceResponse]] = set()

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

    def extend(
        self,
        partition: int,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[list[tuple[str, bytes | None]]] | None,
        start: int,
    ) -> tuple[ProducerBatch, int, int]:
        """Add `values[start:]` to the partition's open batch until it closes (each record's size
        checked against max_request_size already): (the batch, its position of the first record
        added, the index after the last). Callers loop, waiting for `room` between calls."""
        config = self.config
        batch = self._open.get(partition)
        if batch is None:
            batch = self._new_batch(partition)
        timestamp = int(time.time() * 1000)
        first = batch.builder.count
        stop, used = batch.builder.extend(
            values,
            keys,
            headers,
            timestamp,
            start,
            config.batch_size - batch.size,
            config.max_request_size - batch.size,
            RECORD_OVERHEAD,
        )
        if stop == start:  # the next record does not fit: it starts the next batch
            if first == 0:
                raise ValueError("a record larger than max_request_size reached the accumulator")
            self.close_batch(partition)
            return self.extend(partition, values, keys, headers, start)
        batch.timestamps.extend(itertools.repeat(timestamp, stop - start))
        batch.size += used
        if batch.size >= config.batch_size or stop < len(values):
            self.close_batch(partition)
        return batch, first, stop

    def _new_batch(self, partition: int) -> ProducerBatch:
        idempotent = self.config.idempotent
        sequence = self._sequences.get(partition, 0) if idempotent else -1
        builder = BatchBuilder(
            self.config.compression,
            producer_id=self.producer_id if idempotent else -1,
            producer_epoch=self.producer_epoch if idempotent else -1,
            base_sequence=sequence,
            transactional=self._transactional,
        )
        batch = ProducerBatch(self._loop, next(self._order), partition, builder, sequence)
        self._open[partition] = batch
        self.unresolved.add(batch.result)
        batch.result.add_done_callback(self.unresolved.discard)
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

    def restart(self, producer_id: int, epoch: int) -> None:
        """A new producer id or epoch (a transactional producer's, after an abort): the next
        batch of each partition starts at sequence 0 again. Only with nothing open, queued or
        in flight (after a flush)."""
        assert not (self._open or self.queue or self.in_flight)
        self.producer_id, self.producer_epoch = producer_id, epoch
        self._sequences.clear()

    def requeue(self, batch: ProducerBatch) -> None:
        """Put a batch to retry back in its place: retries keep the order batches were made in."""
        bisect.insort(self.queue, batch, key=lambda b: b.order)

    def update_room(self) -> None:
        if len(self.queue) + len(self.in_flight) >= self.config.max_queued_batches:
            self.room.clear()
        else:
            self.room.set()
