"""At-least-once delivery of one reliable subscription, as a state machine with no I/O and no clock.

`ReliableDelivery` holds, per partition, the `PartitionCursor` (acked floor, out-of-order acks,
what was dispatched, delivery counts) and which offsets are in flight to which consumer. The
server's pump feeds it events, each with the time `now` it happened, and asks it what to do:

- events: `sent` (a range went to a consumer), `ack`, `ack_ranges`, `nack`, `reject` (to the
  dead-letter topic now, whatever its deliveries: a Kafka share consumer's REJECT), `consumer_left`,
  `expire` (time passed: ack timeouts fall due), `reset` (a seek), `dead_letter_written`,
  `dead_letter_failed`, `unreadable` (offsets lost to damage no copy could repair);
- decisions: `take_due` (redeliver these offsets of one partition), `split_due` (of those, which
  go to the dead-letter topic, having been delivered `max_deliveries` times, and which are sent),
  `next_partition` and `plan_new` (send this range of new messages, cut to the consumer's
  credit, stepping over offsets that hold no record), `wake_at` (the next time something falls
  due).

Ack timeouts are tracked per delivered range in a heap of (deadline, generation); a delivery
whose every offset was acked or nacked is forgotten at once (its heap entry then finds nothing
when it falls due), so finished deliveries neither wait out their timeout nor are scanned again
offset by offset. What waits for redelivery is a heap of (not before, partition, offset).
Redelivery waits follow the backoff: fixed, or exponential in the number of deliveries, capped;
a nack may name its own delay; a consumer that leaves has its messages redelivered at once. On a
restart everything dispatched and not acked is due at once, with its delivery count kept (the
cursor carries it).

Cursors that changed are collected in `dirty`; the server persists `take_dirty()`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from headwater.durables.cursor import PartitionCursor, offsets_within
from headwater.wire.errors import InvalidRequest
from headwater.wire.messages import AckEntry, AckKind, AckRange, Backoff

DEAD_LETTER_RETRY = 1.0  # seconds before a message whose dead-lettering failed is tried again
# offsets a committed transaction's acknowledgement may take as dispatched below its range
# (`ack_committed`); past it the range is acked as far as it was dispatched here
MAX_COMMITTED_GAP = 100_000


@dataclass(frozen=True, slots=True)
class ReliableSettings:
    ack_timeout_ms: int
    max_deliveries: int  # 0: no limit
    backoff: Backoff
    backoff_initial_ms: int
    backoff_max_ms: int
    committed_only: bool = False  # deliver only what an fsync covers

    def redelivery_delay(self, deliveries: int) -> float:
        """Seconds to wait before delivery number `deliveries + 1`."""
        initial = self.backoff_initial_ms / 1000
        if self.backoff == Backoff.FIXED:
            return initial
        return float(min(initial * 2 ** max(0, deliveries - 1), self.backoff_max_ms / 1000))


class HasOffset(Protocol):
    @property
    def offset(self) -> int: ...


R = TypeVar("R", bound=HasOffset)


def runs(records: Sequence[R]) -> list[list[R]]:
    """Split offset-sorted records into runs of consecutive offsets (one batch each)."""
    found: list[list[R]] = []
    for record in records:
        if found and found[-1][-1].offset + 1 == record.offset:
            found[-1].append(record)
        else:
            found.append([record])
    return found


@dataclass(slots=True)
class _Delivery:
    partition: int
    first: int
    end: int
    consumer_id: int
    generation: int
    outstanding: int  # offsets still in flight with this delivery (an upper bound)


@dataclass(frozen=True, slots=True)
class Redeliver:
    """Redeliver these offsets (sorted) of `partition`: read them back and pass them to
    `split_due`. Empty when everything that fell due was acked or in flight meanwhile."""

    partition: int
    offsets: list[int]


@dataclass(slots=True)
class DuePlan(Generic[R]):
    """What to do with records read back for redelivery."""

    dead: list[tuple[R, int]] = field(default_factory=list)  # (record, deliveries): dead-letter
    send: list[list[R]] = field(default_factory=list)  # runs of consecutive offsets: send each


class ReliableDelivery:
    def __init__(
        self,
        settings: ReliableSettings,
        cursors: list[PartitionCursor],
        shared: bool,
        now: float,
        topic: str = "",
    ) -> None:
        self.settings = settings
        self._topic = topic
        self.cursors = cursors
        self._shared = shared
        # offset -> generation of the delivery it is in flight with, per partition
        self._in_flight: list[dict[int, int]] = [{} for _ in cursors]
        self._deliveries: dict[int, _Delivery] = {}
        self._by_consumer: dict[int, set[int]] = {}  # consumer id -> its delivery generations
        self._deadlines: list[tuple[float, int]] = []  # (deadline, generation)
        self._due: list[tuple[float, int, int]] = []  # (not before, partition, offset)
        self._rejected: set[tuple[int, int]] = set()  # (partition, offset): dead-letter when due
        self._generations = itertools.count(1)
        self._next_partition = 0
        # each consumer's own round-robin over the partitions (a Shared subscription's consumers
        # picked in turn would otherwise each be sent one partition only, in lockstep)
        self._next_for: dict[int, int] = {}
        self.dirty: set[int] = set()
        self.delivered = 0
        self.dead_lettered = 0
        self.dead_lettered_by_partition: dict[int, int] = {}
        for partition, cursor in enumerate(cursors):
            for offset in cursor.unacked():
                heapq.heappush(self._due, (now, partition, offset))

    def grow(self, cursors: Sequence[PartitionCursor]) -> None:
        """Partitions were added to the topic: track them too, from these cursors."""
        for cursor in cursors:
            self.cursors.append(cursor)
            self._in_flight.append({})
            self.dirty.add(len(self.cursors) - 1)

    # Events

    def sent(self, consumer_id: int, partition: int, first: int, end: int, now: float) -> None:
        """Offsets [first, end) of `partition` just went to `consumer_id`."""
        generation = next(self._generations)
        self._deliveries[generation] = _Delivery(
            partition, first, end, consumer_id, generation, end - first
        )
        self._by_consumer.setdefault(consumer_id, set()).add(generation)
        self._in_flight[partition].update(dict.fromkeys(range(first, end), generation))
        heapq.heappush(self._deadlines, (now + self.settings.ack_timeout_ms / 1000, generation))
        self.cursors[partition].record_delivery(first, end)
        self.delivered += end - first
        self.dirty.add(partition)

    def ack(self, entries: Sequence[AckEntry], kind: int) -> None:
        if kind == AckKind.CUMULATIVE and self._shared:
            raise InvalidRequest("cumulative acks are not allowed on a shared subscription")
        self._check_partitions(entries)
        if kind == AckKind.CUMULATIVE:
            # only the highest offset of a partition counts: one scan of what is in flight a
            # partition, not one an entry (10,000 entries over 100,000 in flight held the loop)
            highest: dict[int, int] = {}
            for entry in entries:
                highest[entry.partition] = max(entry.offset, highest.get(entry.partition, -1))
            for partition, offset in highest.items():
                in_flight = self._in_flight[partition]
                self._settle(in_flight, sorted(o for o in in_flight if o <= offset))
                if self.cursors[partition].ack_up_to(offset):
                    self.dirty.add(partition)
            return
        for entry in entries:
            self._settle(self._in_flight[entry.partition], (entry.offset,))
            if self.cursors[entry.partition].ack(entry.offset):
                self.dirty.add(entry.partition)

    def ack_ranges(self, ranges: Sequence[AckRange]) -> None:
        """Each offset of each range acknowledged, as `ack` with INDIVIDUAL does one by one. A
        range is first cut to what was dispatched; then its in-flight offsets are settled in
        min(its length, what is in flight) steps, and the cursor takes it (`ack_range`)."""
        self._check_partitions(ranges)
        for entry in ranges:
            partition = entry.partition
            cursor = self.cursors[partition]
            first = entry.first_offset
            end = min(first + entry.count, cursor.dispatched)
            if first >= end:
                continue  # nothing of it was ever sent
            # in flight below the floor too: an offset acked while its redelivery was read, or
            # one retention passed, is settled here as ACK settles it
            in_flight = self._in_flight[partition]
            if in_flight:
                self._settle(in_flight, offsets_within(in_flight, first, end))
            if cursor.ack_range(first, end):
                self.dirty.add(partition)

    def ack_committed(self, ranges: Sequence[AckRange], ends: Sequence[int], now: float) -> None:
        """A committed transaction's acknowledgements (ADD_ACKS_TO_TXN), which may name offsets
        this core never dispatched: in a cluster the partition's previous owner delivered them
        and the checkpoint it left says less (it lags by up to its interval). So a range past
        `dispatched` (cut to the partition's end in `ends`) is taken as dispatched first, and
        the offsets between the two, which that owner dispatched before it, are due at once,
        as a take-over's unacked are; then every range is acked as `ack_ranges` acks it.
        Without this, `ack_ranges` dropped the part never dispatched here, and the new owner
        delivered those messages again although their transaction had committed. A gap over
        `MAX_COMMITTED_GAP` offsets is not filled (the range is acked as far as it was
        dispatched: the rest is delivered again, at-least-once)."""
        self._check_partitions(ranges)
        for entry in sorted(ranges, key=lambda r: (r.partition, r.first_offset)):
            cursor = self.cursors[entry.partition]
            start = cursor.dispatched
            end = min(entry.first_offset + entry.count, ends[entry.partition])
            gap_end = min(max(start, entry.first_offset), end)
            if end <= start or gap_end - start > MAX_COMMITTED_GAP:
                continue
            cursor.record_delivery(start, end)
            for offset in range(start, gap_end):
                heapq.heappush(self._due, (now, entry.partition, offset))
            self.dirty.add(entry.partition)
        self.ack_ranges(ranges)

    def nack(self, entries: Sequence[AckEntry], delay_ms: int, now: float) -> None:
        if delay_ms < 0:
            raise InvalidRequest(f"nack delay must be >= 0 ms, not {delay_ms}")
        self._check_partitions(entries)
        for entry in entries:
            cursor = self.cursors[entry.partition]
            in_flight = self._in_flight[entry.partition]
            if entry.offset not in in_flight:
                continue
            self._settle(in_flight, (entry.offset,))
            if cursor.is_acked(entry.offset):
                continue
            delay = (
                delay_ms / 1000
                if delay_ms
                else self.settings.redelivery_delay(cursor.delivery_count(entry.offset))
            )
            heapq.heappush(self._due, (now + delay, entry.partition, entry.offset))

    def reject(self, entries: Sequence[AckEntry], now: float) -> None:
        """These offsets (those still in flight) go to the dead-letter topic when next due,
        however few times they were delivered."""
        self._check_partitions(entries)
        for entry in entries:
            in_flight = self._in_flight[entry.partition]
            if entry.offset not in in_flight:
                continue
            self._settle(in_flight, (entry.offset,))
            if not self.cursors[entry.partition].is_acked(entry.offset):
                self._rejected.add((entry.partition, entry.offset))
                heapq.heappush(self._due, (now, entry.partition, entry.offset))

    def held_by(self, consumer_id: int, partition: int, first: int, end: int) -> bool:
        """Whether every offset of [first, end) of `partition` is in flight to `consumer_id` (a
        Kafka share consumer acknowledges only records it acquired). At most one step per offset
        in flight: a range longer than that cannot be held."""
        if not 0 <= partition < len(self._in_flight):
            return False
        in_flight = self._in_flight[partition]
        if end - first > len(in_flight) or first >= end:
            return False
        deliveries = self._deliveries
        for offset in range(first, end):
            delivery = deliveries.get(in_flight.get(offset, 0))
            if delivery is None or delivery.consumer_id != consumer_id:
                return False
        return True

    def _check_partitions(self, entries: Sequence[AckEntry] | Sequence[AckRange]) -> None:
        for entry in entries:
            if not 0 <= entry.partition < len(self.cursors):
                raise InvalidRequest(f"topic {self._topic!r} has no partition {entry.partition}")

    def _settle(self, in_flight: dict[int, int], offsets: Iterable[int]) -> None:
        """`offsets` left flight (acked or nacked): each delivery they were in counts them off,
        and one with nothing left in flight is forgotten. Consecutive offsets mostly share a
        delivery, so it is looked up once a run."""
        pop = in_flight.pop
        generation = settled = 0  # generations start at 1
        for offset in offsets:
            found = pop(offset, 0)
            if found != generation:
                if settled:
                    self._count_off(generation, settled)
                generation, settled = found, 0
            if found:
                settled += 1
        if settled:
            self._count_off(generation, settled)

    def _count_off(self, generation: int, settled: int) -> None:
        delivery = self._deliveries.get(generation)
        if delivery is not None:
            delivery.outstanding -= settled
            if delivery.outstanding <= 0:
                self._forget(delivery)

    def consumer_left(self, consumer_id: int, now: float) -> None:
        """What it had in flight is due again at once."""
        self._next_for.pop(consumer_id, None)
        for generation in list(self._by_consumer.get(consumer_id, ())):
            self._requeue(self._deliveries[generation], now)
        self._by_consumer.pop(consumer_id, None)

    def expire(self, now: float) -> None:
        """Deliveries whose ack timeout passed are due again, after their backoff."""
        while self._deadlines and self._deadlines[0][0] <= now:
            _, generation = heapq.heappop(self._deadlines)
            delivery = self._deliveries.get(generation)
            if delivery is not None:
                self._requeue(delivery, now, backoff=True)

    def reset(self, offsets: Sequence[int]) -> None:
        """Seek: start every partition again at the given offset, forgetting unacked messages."""
        for partition, offset in enumerate(offsets):
            self.cursors[partition].reset(offset)
            self._in_flight[partition].clear()
            self.dirty.add(partition)
        self._deliveries.clear()
        self._by_consumer.clear()
        self._deadlines.clear()
        self._due.clear()
        self._rejected.clear()

    def replace_cursor(self, partition: int, cursor: PartitionCursor, now: float) -> None:
        """A cluster take-over: the partition's cursor is the checkpoint the previous owner left.
        What this core had in flight there is forgotten (its acks went elsewhere); the
        checkpoint's unacked messages are due at once (at-least-once)."""
        self.cursors[partition] = cursor
        self._in_flight[partition].clear()
        for delivery in list(self._deliveries.values()):
            if delivery.partition == partition:
                self._forget(delivery)
        self._due = [entry for entry in self._due if entry[1] != partition]
        heapq.heapify(self._due)
        for offset in cursor.unacked():
            heapq.heappush(self._due, (now, partition, offset))
        self.dirty.add(partition)

    def requeue(self, partition: int, offsets: Sequence[int], not_before: float) -> None:
        """Offsets taken for redelivery that could not be sent: due again at `not_before`."""
        for offset in offsets:
            heapq.heappush(self._due, (not_before, partition, offset))

    def dead_letter_written(self, partition: int, offset: int) -> None:
        self._rejected.discard((partition, offset))
        self.dead_lettered += 1
        self.dead_lettered_by_partition[partition] = (
            self.dead_lettered_by_partition.get(partition, 0) + 1
        )
        self.cursors[partition].ack(offset)
        self.dirty.add(partition)

    def dead_letter_failed(self, partition: int, offset: int, now: float) -> None:
        """The dead-letter topic refused it: try again later, never drop it."""
        self.requeue(partition, [offset], now + DEAD_LETTER_RETRY)

    def unreadable(self, partition: int, offsets: Sequence[int]) -> None:
        """Lost to damage that no copy could repair: nothing left to deliver."""
        for offset in offsets:
            self.cursors[partition].ack(offset)
        self.dirty.add(partition)

    def _requeue(self, delivery: _Delivery, now: float, backoff: bool = False) -> None:
        self._forget(delivery)
        in_flight = self._in_flight[delivery.partition]
        cursor = self.cursors[delivery.partition]
        for offset in range(delivery.first, delivery.end):
            if in_flight.get(offset) != delivery.generation:
                continue
            del in_flight[offset]
            if cursor.is_acked(offset):
                continue
            delay = self.settings.redelivery_delay(cursor.delivery_count(offset)) if backoff else 0
            heapq.heappush(self._due, (now + delay, delivery.partition, offset))

    def _forget(self, delivery: _Delivery) -> None:
        self._deliveries.pop(delivery.generation, None)
        generations = self._by_consumer.get(delivery.consumer_id)
        if generations is not None:
            generations.discard(delivery.generation)
            if not generations:
                del self._by_consumer[delivery.consumer_id]

    # Decisions

    def wake_at(self) -> float | None:
        """When the next ack timeout or redelivery falls due (None: nothing waits)."""
        if self._deadlines and self._due:
            return min(self._deadlines[0][0], self._due[0][0])
        if self._deadlines:
            return self._deadlines[0][0]
        if self._due:
            return self._due[0][0]
        return None

    def take_due(
        self, now: float, credits: int, allowed: Container[int] | None = None
    ) -> Redeliver | None:
        """Up to `credits` offsets of one partition due for redelivery (None: none is due), of
        the `allowed` partitions only when given (a Failover consumer's own)."""
        due = self._due
        if allowed is not None:
            skipped = []
            while due and due[0][0] <= now and due[0][1] not in allowed:
                skipped.append(heapq.heappop(due))
            try:
                return self.take_due(now, credits)
            finally:
                for entry in skipped:
                    heapq.heappush(due, entry)
        if not due or due[0][0] > now:
            return None
        partition = due[0][1]
        cursor = self.cursors[partition]
        in_flight = self._in_flight[partition]
        offsets: set[int] = set()
        while due and due[0][0] <= now and due[0][1] == partition and len(offsets) < credits:
            _, _, offset = heapq.heappop(due)
            if not cursor.is_acked(offset) and offset not in in_flight:
                offsets.add(offset)
        return Redeliver(partition, sorted(offsets))

    def split_due(self, partition: int, records: Sequence[R]) -> DuePlan[R]:
        """Records read back for redelivery: those delivered `max_deliveries` times go to the
        dead-letter topic, the others are sent again in runs of consecutive offsets. A record
        acked while it was read (its consumer's ack was late, not lost) is not sent again."""
        cursor = self.cursors[partition]
        limit = self.settings.max_deliveries
        plan: DuePlan[R] = DuePlan()
        live = []
        rejected = self._rejected
        for record in records:
            if cursor.is_acked(record.offset):
                rejected.discard((partition, record.offset))
                continue
            count = cursor.delivery_count(record.offset)
            if (limit and count >= limit) or (partition, record.offset) in rejected:
                plan.dead.append((record, count))
            else:
                live.append(record)
        plan.send = runs(live)
        return plan

    def delivery_count(self, partition: int, offsets: Sequence[int]) -> int:
        """The delivery number a redelivery of `offsets` will carry."""
        cursor = self.cursors[partition]
        return max(cursor.delivery_count(offset) for offset in offsets) + 1

    def next_partition(self, ends: Sequence[int], consumer_id: int | None = None) -> int | None:
        """The next partition, round-robin (the consumer's own, when named), with new messages
        below its end in `ends`."""
        count = min(len(self.cursors), len(ends))  # a read may span partitions being added
        start = self._next_partition if consumer_id is None else self._next_for.get(consumer_id, 0)
        for step in range(count):
            partition = (start + step) % count
            if self.cursors[partition].dispatched < ends[partition]:
                if consumer_id is None:
                    self._next_partition = (partition + 1) % count
                else:
                    self._next_for[consumer_id] = (partition + 1) % count
                return partition
        return None

    def position(self, partition: int) -> int:
        """The first offset of `partition` never dispatched."""
        return self.cursors[partition].dispatched

    def restart_at(self, partition: int, offset: int) -> None:
        """Retention (or a seek) left the cursor behind the oldest stored message. What was in
        flight below it is settled: no ack of it can move anything any more."""
        self.cursors[partition].reset(offset)
        in_flight = self._in_flight[partition]
        if in_flight:
            self._settle(in_flight, sorted(o for o in in_flight if o < offset))
        self.dirty.add(partition)

    def plan_new(
        self, partition: int, base_offset: int, record_count: int, credits: int
    ) -> tuple[int, int] | None:
        """The range [first, end) to send from a batch read at the partition's position, cut to
        `credits`; None when the cursor is already past it (a racing seek). Offsets between the
        position and the batch hold no record (skipped damage, a gap): the cursor steps over."""
        cursor = self.cursors[partition]
        end = base_offset + record_count
        first = cursor.dispatched
        if end <= first:
            return None
        if base_offset > first:
            if cursor.floor == cursor.dispatched == first:
                cursor.reset(base_offset)
            else:
                cursor.record_delivery(first, base_offset)
                cursor.ack_range(first, base_offset)
            self.dirty.add(partition)
            first = base_offset
        return first, min(end, first + credits)

    # Persistence and introspection

    def take_dirty(self) -> dict[int, bytes]:
        """The encoded cursors changed since the last call, by partition."""
        dirty, self.dirty = self.dirty, set()
        return {p: self.cursors[p].encode() for p in sorted(dirty)}

    def backlog(self, next_offsets: Sequence[int]) -> int:
        return sum(
            end - cursor.floor - len(cursor.acked)
            for end, cursor in zip(next_offsets, self.cursors, strict=True)
        )

    def in_flight(self, partition: int) -> int:
        """Offsets of `partition` delivered and awaiting an ack."""
        return len(self._in_flight[partition])

    @property
    def open_deliveries(self) -> int:
        """Deliveries with offsets still in flight, each waiting for its ack timeout."""
        return len(self._deliveries)

    @property
    def unacked(self) -> int:
        return sum(len(f) for f in self._in_flight)
