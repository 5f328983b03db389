"""Reliable subscriptions: at-least-once delivery from the WAL, with acks, redelivery and DLQ.

A reliable subscription outlives its consumers. Per partition it keeps a `PartitionCursor` (acked
floor, out-of-order acks, what was dispatched, delivery counts), persisted in RocksDB after each
change, and in memory which offsets are in flight to which consumer.

One pump task per subscription does all sending, so no two deliveries race. Each round it picks a
consumer the subscription type allows (Exclusive: the one; Failover: the active one; Shared: the
one with the most credit) and sends it, within its credit:

1. messages due for redelivery (ack timeout passed, nacked and the delay passed, or their consumer
   left), re-encoded as batches of consecutive offsets; a message already delivered
   `max_deliveries` times goes to the dead-letter topic instead and is acked here;
2. otherwise the next batch after `dispatched`, read from the WAL's tail cache, the WAL, or the
   object store, cut to start at `dispatched` and to the consumer's credit.

The pump sleeps on one event. It is woken by a consumer arriving, credit, a writable socket, an ack
timeout or redelivery falling due, and by appends: not through a listener per subscription on every
partition (which made each append cost one wake-up per subscription, however idle), but through
the topic's `AppendSignal`, which a sleeping pump joins only when it has a consumer able to take a
message. An append fires the signal once and empties it, so its cost does not grow with the number
of subscriptions, only with the pumps that are waiting to deliver that very append.

Closing sets a flag, wakes and cancels the pump, and waits for it: the pump sleeps with a timer of
its own rather than `asyncio.wait_for`, which on Python 3.11 can swallow a cancellation that races
the wake-up (the pump then ran on, and the close, and with it DELETE_TOPIC, waited forever).

Ack timeouts are tracked per delivered batch in a heap. Redelivery waits follow the subscription's
backoff: fixed, or exponential in the number of deliveries, capped; a nack may name its own delay;
a consumer that disconnects has its messages redelivered at once. On a restart, everything
dispatched and not acked is redelivered, with its delivery count kept.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from durables.cursor import PartitionCursor
from server.delivery import (
    DEAD_LETTER_RETRY,
    AppendSignal,
    DeadLetter,
    ReliableSettings,
)
from server.delivery import (
    runs as _runs,
)
from server.subscription import Consumer, ConsumerGroup
from server.topics import Topic
from storage.state import CURSOR, StateStore, key
from storage.wal import FsyncPolicy
from wire.errors import HeadwaterError, InvalidRequest
from wire.messages import (
    AckEntry,
    AckKind,
    SubscriptionInfo,
    SubscriptionType,
)
from wire.records import Compression, Record, inspect_batch, read_records, rebuild_batch

log = structlog.get_logger("headwater.reliable")

_YIELD_EVERY = 64  # pump rounds between yields to the event loop
_BASE = struct.Struct(">q")  # a batch's base offset


@dataclass(slots=True)
class _Delivery:
    partition: int
    first: int
    end: int
    consumer_id: int
    generation: int


class ReliableSubscription:
    def __init__(
        self,
        topic: Topic,
        name: str,
        sub_type: SubscriptionType,
        settings: ReliableSettings,
        cursors: list[PartitionCursor],
        state: StateStore,
        dead_letter: DeadLetter,
        signal: AppendSignal,
    ) -> None:
        self.topic = topic.name
        self._topic = topic
        self.name = name
        self.sub_type = sub_type
        self.settings = settings
        self.group = ConsumerGroup(topic.name, name, sub_type)
        self.consumers = self.group.consumers
        self._cursors = cursors
        self._state = state
        self._sync_state = topic.settings is not None and topic.settings.fsync == FsyncPolicy.ALWAYS
        self._dead_letter = dead_letter
        self._signal = signal
        # offset -> generation of the delivery it is in flight with, per partition
        self._in_flight: list[dict[int, int]] = [{} for _ in cursors]
        self._deliveries: dict[int, _Delivery] = {}
        self._by_consumer: dict[int, set[int]] = {}  # consumer id -> its delivery generations
        self._deadlines: list[tuple[float, int]] = []  # (deadline, generation)
        self._due: list[tuple[float, int, int]] = []  # (not before, partition, offset)
        self._generations = itertools.count(1)
        self._next_partition = 0
        self._wake = asyncio.Event()
        self._dirty: set[int] = set()
        self._flushing = False
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.rounds = 0  # pump rounds run (tests count the work appends cause)
        self.delivered = 0
        self.dead_lettered = 0
        now = time.monotonic()
        for partition, cursor in enumerate(cursors):
            for offset in cursor.unacked():
                heapq.heappush(self._due, (now, partition, offset))

    # Lifecycle

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        self._closed = True
        self._signal.leave(id(self))
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._write_dirty()

    # Consumers

    def attach(self, consumer: Consumer) -> None:
        self.group.add(consumer)
        self._wake.set()

    def detach(self, consumer: Consumer) -> None:
        if not self.group.remove(consumer):
            return
        now = time.monotonic()
        for generation in list(self._by_consumer.get(consumer.consumer_id, ())):
            self._requeue(self._deliveries[generation], now)
        self._by_consumer.pop(consumer.consumer_id, None)
        self._wake.set()

    def grant(self, consumer: Consumer, credits: int) -> None:
        self.group.grant(consumer, credits)
        self._wake.set()

    def drain(self) -> None:
        self._wake.set()

    def _target(self) -> Consumer | None:
        return self.group.pick()

    # Acknowledgements

    def ack(self, consumer: Consumer, entries: Sequence[AckEntry], kind: int) -> None:
        if kind == AckKind.CUMULATIVE and self.sub_type == SubscriptionType.SHARED:
            raise InvalidRequest("cumulative acks are not allowed on a shared subscription")
        self._check_partitions(entries)
        for entry in entries:
            cursor = self._cursors[entry.partition]
            in_flight = self._in_flight[entry.partition]
            if kind == AckKind.CUMULATIVE:
                changed = cursor.ack_up_to(entry.offset)
                for offset in [o for o in in_flight if o <= entry.offset]:
                    del in_flight[offset]
            else:
                changed = cursor.ack(entry.offset)
                in_flight.pop(entry.offset, None)
            if changed:
                self._dirty.add(entry.partition)
        self._persist()

    def nack(self, consumer: Consumer, entries: Sequence[AckEntry], delay_ms: int) -> None:
        if delay_ms < 0:
            raise InvalidRequest(f"nack delay must be >= 0 ms, not {delay_ms}")
        self._check_partitions(entries)
        now = time.monotonic()
        for entry in entries:
            cursor = self._cursors[entry.partition]
            if self._in_flight[entry.partition].pop(entry.offset, None) is None:
                continue
            if cursor.is_acked(entry.offset):
                continue
            delay = (
                delay_ms / 1000
                if delay_ms
                else self.settings.redelivery_delay(cursor.delivery_count(entry.offset))
            )
            heapq.heappush(self._due, (now + delay, entry.partition, entry.offset))
        self._wake.set()

    def _check_partitions(self, entries: Sequence[AckEntry]) -> None:
        for entry in entries:
            if not 0 <= entry.partition < len(self._cursors):
                raise InvalidRequest(f"topic {self.topic!r} has no partition {entry.partition}")

    def reset(self, offsets: list[int]) -> None:
        """Seek: start every partition again at the given offset, forgetting unacked messages."""
        for partition, offset in enumerate(offsets):
            self._cursors[partition].reset(offset)
            self._in_flight[partition].clear()
            self._dirty.add(partition)
        self._deliveries.clear()
        self._by_consumer.clear()
        self._deadlines.clear()
        self._due.clear()
        self._persist()
        self._wake.set()

    # Persistence: coalesce cursor writes, one WriteBatch per event-loop turn at most.

    def _persist(self) -> None:
        if self._dirty and not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        try:
            while self._dirty:
                await asyncio.sleep(0)
                puts = self._dirty_puts()
                if self._sync_state:
                    await asyncio.to_thread(self._state.write, puts, None, True)
                else:
                    self._state.write(puts)
        finally:
            self._flushing = False

    def _dirty_puts(self) -> dict[bytes, bytes]:
        dirty, self._dirty = self._dirty, set()
        return {
            key(CURSOR, self.topic, self.name, p): self._cursors[p].encode() for p in sorted(dirty)
        }

    def _write_dirty(self) -> None:
        if self._dirty:
            self._state.write(self._dirty_puts(), sync=self._sync_state)

    # The pump

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            self._expire(time.monotonic())
            try:
                sent = await self._dispatch_once()
            except Exception:  # a bug must not stop the subscription for good
                log.exception("subscription.dispatch_failed", topic=self.topic, name=self.name)
                await asyncio.sleep(1)
                continue
            self.rounds += 1
            if sent and self.rounds % _YIELD_EVERY:
                continue
            if sent:
                await asyncio.sleep(0)
                continue
            self._wake.clear()
            if self._closed:
                return
            if self._target() is not None:  # someone could take a message: wait for appends
                self._signal.join(id(self), self._wake.set)
            timeout = self._next_event_in(time.monotonic())
            timer = loop.call_later(timeout, self._wake.set) if timeout is not None else None
            try:
                await self._wake.wait()
            finally:
                if timer is not None:
                    timer.cancel()

    def _next_event_in(self, now: float) -> float | None:
        times = []
        if self._deadlines:
            times.append(self._deadlines[0][0])
        if self._due:
            times.append(self._due[0][0])
        return max(0.0, min(times) - now) + 0.001 if times else None

    def _expire(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, generation = heapq.heappop(self._deadlines)
            delivery = self._deliveries.get(generation)
            if delivery is not None:
                self._requeue(delivery, now, backoff=True)

    def _requeue(self, delivery: _Delivery, now: float, backoff: bool = False) -> None:
        """Put a delivery's unacked offsets back to be delivered again."""
        self._forget(delivery)
        in_flight = self._in_flight[delivery.partition]
        cursor = self._cursors[delivery.partition]
        for offset in range(delivery.first, delivery.end):
            if in_flight.get(offset) != delivery.generation:
                continue
            del in_flight[offset]
            if cursor.is_acked(offset):
                continue
            delay = self.settings.redelivery_delay(cursor.delivery_count(offset)) if backoff else 0
            heapq.heappush(self._due, (now + delay, delivery.partition, offset))
        self._wake.set()

    def _forget(self, delivery: _Delivery) -> None:
        self._deliveries.pop(delivery.generation, None)
        generations = self._by_consumer.get(delivery.consumer_id)
        if generations is not None:
            generations.discard(delivery.generation)
            if not generations:
                del self._by_consumer[delivery.consumer_id]

    async def _dispatch_once(self) -> bool:
        target = self._target()
        if target is None:
            return False
        if self._due and self._due[0][0] <= time.monotonic():
            return await self._redeliver(target)
        partitions = len(self._cursors)
        for step in range(partitions):
            partition = (self._next_partition + step) % partitions
            cursor = self._cursors[partition]
            log_ = self._topic.partitions[partition].log
            assert log_ is not None
            end = log_.durable_offset if self.settings.committed_only else log_.visible_offset
            if cursor.dispatched >= end:
                continue
            self._next_partition = (partition + 1) % partitions
            if cursor.dispatched < self._topic.start_offset(partition):
                # Retention (or a seek) left the cursor behind the oldest stored message.
                cursor.reset(self._topic.start_offset(partition))
                self._dirty.add(partition)
                continue
            batches = await self._topic.read(partition, cursor.dispatched)
            if batches and _BASE.unpack_from(batches[0])[0] >= end:
                continue  # past a gap, the next batch is not visible yet
            if not batches or target.consumer_id not in self.consumers:
                return bool(batches)
            return self._send_new(target, partition, batches[0])
        return False

    def _send_new(self, target: Consumer, partition: int, batch: bytes) -> bool:
        cursor = self._cursors[partition]
        info = inspect_batch(batch)
        end = info.base_offset + info.record_count
        first = cursor.dispatched
        if end <= first:  # already past this batch (a racing seek)
            return True
        if info.base_offset > first:  # [first, base) hold nothing: skipped damage, or a gap
            _skip_gap(cursor, first, info.base_offset)
            first = info.base_offset
        if info.base_offset < first or end - first > target.credits:
            records = [r for r in read_records(batch) if r.offset >= first][: target.credits]
            batch = rebuild_batch(records, Compression(info.compression))
            end = records[-1].offset + 1
        self._send(target, partition, first, end, batch, 1)
        cursor.record_delivery(first, end)
        self._dirty.add(partition)
        self._persist()
        return True

    async def _redeliver(self, target: Consumer) -> bool:
        now = time.monotonic()
        partition = self._due[0][1]
        cursor = self._cursors[partition]
        in_flight = self._in_flight[partition]
        offsets: set[int] = set()
        while (
            self._due
            and self._due[0][0] <= now
            and self._due[0][1] == partition
            and len(offsets) < target.credits
        ):
            _, _, offset = heapq.heappop(self._due)
            if not cursor.is_acked(offset) and offset not in in_flight:
                offsets.add(offset)
        if not offsets:
            return True
        try:
            records = await self._fetch(partition, sorted(offsets))
        except Exception:
            self._retry_later(partition, offsets)  # never drop a message from redelivery
            raise
        gone = offsets.difference(r.offset for r in records)
        if gone:  # lost to damage that no copy could repair: nothing left to deliver
            log.error(
                "subscription.offsets_unreadable",
                topic=self.topic,
                name=self.name,
                partition=partition,
                count=len(gone),
                first=min(gone),
            )
            for offset in gone:
                cursor.ack(offset)
            self._dirty.add(partition)
        if target.consumer_id not in self.consumers:
            for record in records:
                heapq.heappush(self._due, (now, partition, record.offset))
            return True
        limit = self.settings.max_deliveries
        for run in _runs(records):
            deliverable = []
            for record in run:
                count = cursor.delivery_count(record.offset)
                if limit and count >= limit:
                    if not await self._send_to_dead_letter(partition, record, count):
                        continue
                    self.dead_lettered += 1
                    cursor.ack(record.offset)
                    self._dirty.add(partition)
                elif target.consumer_id in self.consumers:
                    deliverable.append(record)
                else:  # left while a dead letter was being written
                    heapq.heappush(self._due, (now, partition, record.offset))
            for group in _runs(deliverable):
                count = max(cursor.delivery_count(r.offset) for r in group) + 1
                first, end = group[0].offset, group[-1].offset + 1
                self._send(target, partition, first, end, rebuild_batch(group), count)
                cursor.record_delivery(first, end)
        self._dirty.add(partition)
        self._persist()
        return True

    async def _send_to_dead_letter(self, partition: int, record: Record, count: int) -> bool:
        """False (and the message stays due, for a later try) when the dead-letter topic refused
        it: a message is never dropped from redelivery."""
        try:
            await self._dead_letter(partition, record, count)
        except (HeadwaterError, OSError) as exc:
            log.warning(
                "subscription.dead_letter_failed",
                topic=self.topic,
                subscription=self.name,
                partition=partition,
                offset=record.offset,
                error=str(exc),
            )
            self._retry_later(partition, [record.offset])
            return False
        return True

    def _retry_later(self, partition: int, offsets: Sequence[int] | set[int]) -> None:
        due = time.monotonic() + DEAD_LETTER_RETRY
        for offset in offsets:
            heapq.heappush(self._due, (due, partition, offset))

    async def _fetch(self, partition: int, offsets: list[int]) -> list[Record]:
        """The records at `offsets` (sorted), read back from the WAL or the object store."""
        wanted = set(offsets)
        found: list[Record] = []
        offset = offsets[0]
        last = offsets[-1]
        while offset <= last:
            batches = await self._topic.read(partition, offset)
            if not batches:
                break
            for batch in batches:
                for record in read_records(batch):
                    if record.offset in wanted:
                        found.append(record)
                offset = inspect_batch(batch).base_offset + inspect_batch(batch).record_count
        return found

    def _send(
        self, target: Consumer, partition: int, first: int, end: int, batch: bytes, count: int
    ) -> None:
        generation = next(self._generations)
        delivery = _Delivery(partition, first, end, target.consumer_id, generation)
        self._deliveries[generation] = delivery
        self._by_consumer.setdefault(target.consumer_id, set()).add(generation)
        in_flight = self._in_flight[partition]
        for offset in range(first, end):
            in_flight[offset] = generation
        deadline = time.monotonic() + self.settings.ack_timeout_ms / 1000
        heapq.heappush(self._deadlines, (deadline, generation))
        self.group.charge(target, end - first)
        self.delivered += end - first
        target.session.send_delivery(target.consumer_id, partition, batch, count)

    # Introspection

    def info(self) -> SubscriptionInfo:
        backlog = sum(
            self._topic.partitions[p].next_offset - c.floor - len(c.acked)
            for p, c in enumerate(self._cursors)
        )
        return SubscriptionInfo(
            name=self.name,
            sub_type=self.sub_type,
            pending=backlog,
            delivered=self.delivered,
            dropped=0,
            consumers=self.group.infos(),
            unacked=sum(len(f) for f in self._in_flight),
            dead_lettered=self.dead_lettered,
        )


def _skip_gap(cursor: PartitionCursor, first: int, end: int) -> None:
    """Move the cursor over offsets [first, end) that hold no record."""
    if cursor.floor == cursor.dispatched == first:
        cursor.reset(end)
        return
    cursor.record_delivery(first, end)
    for offset in range(first, end):
        cursor.ack(offset)
