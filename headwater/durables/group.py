"""Who receives a subscription's next message: the consumer group of Exclusive, Shared, Failover
and Key_Shared.

Exclusive admits one consumer. Failover keeps an active consumer: the lowest (priority, name,
consumer id), elected again whenever one joins or leaves; on a topic of several partitions each
partition has its own active consumer, Pulsar's rule: with the consumers sorted by (priority, name,
consumer id), partition i belongs to consumer i % n (`owner`), reassigned on every join or leave.
Shared picks the consumer with the most credit; among equals, the one whose credit changed least
recently, so equal credit rotates. Key_Shared picks like Shared for its wake-ups, but a record goes
to the owner of its key on the subscription's hash ring (`durables.keyshared`). Only a consumer
with credit and a socket that is not backed up is picked.

Both orders are heaps with lazy deletion, so joining, leaving and picking cost O(log n) with ten
thousand consumers as with one: a Shared entry is (-credits, stamp, id) and is current only while
its stamp is the consumer's latest (every credit change pushes a new entry); a Failover entry is
(priority, name, id) and is current while the consumer is attached. The heap is rebuilt when stale
entries outnumber live ones.

Pure state: a member is anything with an id, a name, a priority, credits and a session that says
whether it can take more (`Member`); the server's `Consumer` is one. A change of the Failover
leader is reported to `on_elected` (the server logs it), so this module does no I/O.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from headwater.durables.keyshared import HashRing
from headwater.wire.errors import ConsumerBusy
from headwater.wire.limits import MAX_CREDITS
from headwater.wire.messages import ConsumerInfo, SubscriptionType


class Writable(Protocol):
    @property
    def writable(self) -> bool: ...


class Member(Protocol):
    consumer_id: int
    name: str
    priority: int
    credits: int

    @property
    def session(self) -> Writable: ...


M = TypeVar("M", bound=Member)


def sort_key(member: Member) -> tuple[int, str, int]:
    return (member.priority, member.name, member.consumer_id)


class ConsumerGroup(Generic[M]):
    def __init__(
        self,
        topic: str,
        name: str,
        sub_type: SubscriptionType,
        on_elected: Callable[[M | None], None] | None = None,
    ) -> None:
        self.topic = topic
        self.name = name
        self.sub_type = sub_type
        self.consumers: dict[int, M] = {}
        self.active: M | None = None
        self.partitions = 1  # Failover: partitions are spread over the consumers
        self._ordered: list[M] = []  # Failover: consumers by sort_key
        self.ring = HashRing()  # Key_Shared: who owns a key
        self._shared = sub_type in (SubscriptionType.SHARED, SubscriptionType.KEY_SHARED)
        self._key_shared = sub_type == SubscriptionType.KEY_SHARED
        self._on_elected = on_elected if sub_type == SubscriptionType.FAILOVER else None
        self._heap: list[tuple[Any, ...]] = []
        self._stamp: dict[int, int] = {}  # Shared: consumer id -> stamp of its current entry
        self._stamps = itertools.count()
        # consumer id -> the partitions it chose (SUBSCRIBE's `partitions`); absent: every one
        self.chosen: dict[int, frozenset[int]] = {}

    def add(self, consumer: M, partitions: frozenset[int] | None = None) -> None:
        if self.sub_type == SubscriptionType.EXCLUSIVE and self.consumers:
            raise ConsumerBusy(
                f"subscription {self.name!r} on topic {self.topic!r} is exclusive and already "
                "has a consumer"
            )
        self.consumers[consumer.consumer_id] = consumer
        if partitions:
            self.chosen[consumer.consumer_id] = partitions
        if self._key_shared:
            self.ring.add(consumer.consumer_id, consumer.name)
        if self._shared:
            self._push(consumer)
        else:
            bisect.insort(self._ordered, consumer, key=sort_key)
            heapq.heappush(self._heap, sort_key(consumer))
            self._elect()

    def remove(self, consumer: M) -> bool:
        """Drop a consumer; False if it was not attached."""
        if self.consumers.pop(consumer.consumer_id, None) is None:
            return False
        self.chosen.pop(consumer.consumer_id, None)
        if self._key_shared:
            self.ring.remove(consumer.consumer_id)
        if self._shared:
            del self._stamp[consumer.consumer_id]
        else:
            self._ordered.remove(consumer)
            if consumer is self.active:
                self._elect()
        self._compact()
        return True

    def grant(self, consumer: M, credits: int) -> None:
        consumer.credits = min(consumer.credits + credits, MAX_CREDITS)
        if self._shared and consumer.consumer_id in self.consumers:
            self._push(consumer)

    def charge(self, consumer: M, count: int) -> None:
        """`count` messages were just sent to `consumer`."""
        consumer.credits -= count
        if self._shared and consumer.consumer_id in self.consumers:
            self._push(consumer)

    def _push(self, consumer: M) -> None:
        stamp = next(self._stamps)
        self._stamp[consumer.consumer_id] = stamp
        heapq.heappush(self._heap, (-consumer.credits, stamp, consumer.consumer_id))
        self._compact()

    def _compact(self) -> None:
        if len(self._heap) <= 2 * len(self.consumers) + 32:
            return
        if self._shared:
            self._heap = [
                (-c.credits, self._stamp[c.consumer_id], c.consumer_id)
                for c in self.consumers.values()
            ]
        else:
            self._heap = [sort_key(c) for c in self.consumers.values()]
        heapq.heapify(self._heap)

    def _elect(self) -> None:
        heap = self._heap
        while heap and heap[0][2] not in self.consumers:
            heapq.heappop(heap)
        previous = self.active
        self.active = self.consumers[heap[0][2]] if heap else None
        if self._on_elected is not None and self.active is not previous:
            self._on_elected(self.active)

    # Failover over partitions, and consumers that chose partitions

    def accepts(self, consumer: M, partition: int) -> bool:
        chosen = self.chosen.get(consumer.consumer_id)
        return chosen is None or partition in chosen

    def takes(self, partition: int) -> bool:
        """Whether some attached consumer takes `partition`."""
        if not self.chosen:
            return bool(self.consumers)
        return any(self.accepts(c, partition) for c in self.consumers.values())

    def owner(self, partition: int) -> M | None:
        """The active consumer of `partition` (Exclusive, Failover): of the consumers that take
        the partition, in failover order, number i % n."""
        eligible = self._ordered
        if self.chosen:
            eligible = [c for c in eligible if self.accepts(c, partition)]
        return eligible[partition % len(eligible)] if eligible else None

    def owned(self, consumer: M) -> list[int]:
        """The partitions `consumer` may be sent now: those it is active for (Exclusive,
        Failover), or those it chose (Shared)."""
        if self._shared:
            return [p for p in range(self.partitions) if self.accepts(consumer, p)]
        if self.chosen:
            return [p for p in range(self.partitions) if self.owner(p) is consumer]
        ordered = self._ordered
        if consumer not in ordered:
            return []
        return list(range(ordered.index(consumer), self.partitions, len(ordered)))

    def ready(self) -> list[M]:
        """The consumers that could take a message now: in failover order (Exclusive,
        Failover), by most credit (Shared)."""
        if self._shared:
            found = [c for c in self.consumers.values() if c.credits > 0 and c.session.writable]
            return sorted(found, key=lambda c: -c.credits)
        return [c for c in self._ordered if c.credits > 0 and c.session.writable]

    def pick_for(self, partition: int) -> M | None:
        """Who takes a message of `partition` now (None: nobody can)."""
        if not self._shared and self.partitions > 1:
            owner = self.owner(partition)
            if owner is not None and owner.credits > 0 and owner.session.writable:
                return owner
            return None
        if self.chosen:
            ready = [c for c in self.ready() if self.accepts(c, partition)]
            return ready[0] if ready else None
        return self.pick()

    def key_owner(self, hashed: int) -> M | None:
        """Key_Shared: the consumer owning a key hash."""
        owner = self.ring.owner(hashed)
        return None if owner is None else self.consumers[owner]

    def pick(self) -> M | None:
        if not self._shared:
            if self.partitions > 1:
                ready = self.ready()
                return ready[0] if ready else None
            active = self.active
            if active is not None and active.credits > 0 and active.session.writable:
                return active
            return None
        heap = self._heap
        skipped = []
        best = None
        while heap:
            _, stamp, consumer_id = heap[0]
            if self._stamp.get(consumer_id) != stamp:
                heapq.heappop(heap)  # stale: credit changed since, or the consumer left
                continue
            consumer = self.consumers[consumer_id]
            if consumer.credits <= 0:
                break  # entries are current, so nobody further down has credit either
            if not consumer.session.writable:
                skipped.append(heapq.heappop(heap))
                continue
            best = consumer
            break
        for entry in skipped:
            heapq.heappush(heap, entry)
        return best

    def infos(self) -> tuple[ConsumerInfo, ...]:
        """What DESCRIBE_TOPIC shows of the consumers, in failover order."""
        return tuple(
            ConsumerInfo(
                consumer_id=c.consumer_id,
                name=c.name,
                priority=c.priority,
                credits=c.credits,
                active=self._shared or c is self.active or bool(self.owned(c)),
            )
            for c in sorted(self.consumers.values(), key=sort_key)
        )
