"""Subscriptions and their consumers: who gets each batch, and when.

A subscription holds a bounded backlog of batches not yet sent and the consumers attached to it.
`drain` sends from the backlog's head while some consumer may take it: it has credit (messages it
granted with FLOW and has not yet received) and its socket is not backed up. The subscription type
picks that consumer:

- Exclusive: the single consumer (a second one is refused at attach).
- Failover: the active consumer, the lowest (priority, name, consumer id); when it leaves, the next
  takes over with the backlog still in place.
- Shared: the consumer with the most credit, so batches spread by available permits.

A batch holding more records than the chosen consumer's credit is split (re-encoded) at the credit,
so no consumer ever receives more than it granted. When the backlog is full new batches are dropped
and counted: a slow consumer costs bounded memory and never stalls a producer. The drop is not
silent: the consumer that receives the subscription's next delivery first gets a MESSAGES_DROPPED
push with the number of messages dropped since the previous notice (one notice, however many
batches were dropped).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from wire.errors import ConsumerBusy
from wire.limits import MAX_CREDITS
from wire.messages import AckEntry, ConsumerInfo, SubscriptionInfo, SubscriptionType
from wire.records import split_batch

if TYPE_CHECKING:
    from server.lastvalue import LastValueSubscription
    from server.reliable import ReliableSubscription

log = structlog.get_logger("headwater.subscription")


class ConsumerSession(Protocol):
    """The client connection a consumer belongs to and receives on."""

    consumers: dict[int, Consumer]
    peer: str

    @property
    def writable(self) -> bool: ...

    def send_delivery(
        self, consumer_id: int, partition: int, batch: bytes, delivery_count: int = 1
    ) -> None: ...

    def send_consumer_closed(self, consumer_id: int, code: int, message: str) -> None: ...

    def send_messages_dropped(self, consumer_id: int, count: int) -> None: ...


@dataclass(eq=False, slots=True)
class Consumer:
    consumer_id: int
    name: str
    priority: int
    session: ConsumerSession
    subscription: Subscription | ReliableSubscription | LastValueSubscription
    credits: int = 0

    @property
    def sort_key(self) -> tuple[int, str, int]:
        return (self.priority, self.name, self.consumer_id)


class ConsumerGroup:
    """The consumers attached to one subscription, and which of them receives next.

    Exclusive admits one consumer. Failover keeps an active consumer: the lowest (priority, name,
    consumer id), elected again whenever one joins or leaves. Shared picks the consumer with the
    most credit; among equals, the one whose credit changed least recently, so equal credit
    rotates. Only a consumer with credit and a socket that is not backed up is picked.

    Both orders are heaps with lazy deletion, so joining, leaving and picking cost O(log n) with
    ten thousand consumers as with one: a Shared entry is (-credits, stamp, id) and is current only
    while its stamp is the consumer's latest (every credit change pushes a new entry); a Failover
    entry is (priority, name, id) and is current while the consumer is attached. The heap is
    rebuilt when stale entries outnumber live ones.
    """

    def __init__(self, topic: str, name: str, sub_type: SubscriptionType) -> None:
        self.topic = topic
        self.name = name
        self.sub_type = sub_type
        self.consumers: dict[int, Consumer] = {}
        self.active: Consumer | None = None
        self._shared = sub_type == SubscriptionType.SHARED
        self._heap: list[tuple[Any, ...]] = []
        self._stamp: dict[int, int] = {}  # Shared: consumer id -> stamp of its current entry
        self._stamps = itertools.count()

    def add(self, consumer: Consumer) -> None:
        if self.sub_type == SubscriptionType.EXCLUSIVE and self.consumers:
            raise ConsumerBusy(
                f"subscription {self.name!r} on topic {self.topic!r} is exclusive and already "
                "has a consumer"
            )
        self.consumers[consumer.consumer_id] = consumer
        if self._shared:
            self._push(consumer)
        else:
            heapq.heappush(self._heap, consumer.sort_key)
            self._elect()

    def remove(self, consumer: Consumer) -> bool:
        """Drop a consumer; False if it was not attached."""
        if self.consumers.pop(consumer.consumer_id, None) is None:
            return False
        if self._shared:
            del self._stamp[consumer.consumer_id]
        elif consumer is self.active:
            self._elect()
        self._compact()
        return True

    def grant(self, consumer: Consumer, credits: int) -> None:
        consumer.credits = min(consumer.credits + credits, MAX_CREDITS)
        if self._shared and consumer.consumer_id in self.consumers:
            self._push(consumer)

    def charge(self, consumer: Consumer, count: int) -> None:
        """`count` messages were just sent to `consumer`."""
        consumer.credits -= count
        if self._shared and consumer.consumer_id in self.consumers:
            self._push(consumer)

    def _push(self, consumer: Consumer) -> None:
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
            self._heap = [c.sort_key for c in self.consumers.values()]
        heapq.heapify(self._heap)

    def _elect(self) -> None:
        heap = self._heap
        while heap and heap[0][2] not in self.consumers:
            heapq.heappop(heap)
        previous = self.active
        self.active = self.consumers[heap[0][2]] if heap else None
        if self.sub_type == SubscriptionType.FAILOVER and self.active is not previous:
            log.info(
                "subscription.failover",
                topic=self.topic,
                subscription=self.name,
                active=self.active.name if self.active else None,
            )

    def pick(self) -> Consumer | None:
        if not self._shared:
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
                active=self.sub_type == SubscriptionType.SHARED or c is self.active,
            )
            for c in sorted(self.consumers.values(), key=lambda c: c.sort_key)
        )


class Subscription:
    def __init__(
        self, topic: str, name: str, sub_type: SubscriptionType, backlog_limit: int
    ) -> None:
        self.topic = topic
        self.name = name
        self.sub_type = sub_type
        self.group = ConsumerGroup(topic, name, sub_type)
        self.consumers = self.group.consumers
        self._backlog: deque[tuple[int, bytes, int]] = deque()
        self._backlog_count = 0
        self._backlog_limit = backlog_limit
        self.delivered = 0
        self.dropped = 0
        self._unreported = 0  # dropped since the last MESSAGES_DROPPED notice

    def attach(self, consumer: Consumer) -> None:
        self.group.add(consumer)

    def detach(self, consumer: Consumer) -> None:
        if self.group.remove(consumer):
            self.drain()

    def grant(self, consumer: Consumer, credits: int) -> None:
        self.group.grant(consumer, credits)
        self.drain()

    def offer(self, partition: int, batch: bytes, count: int) -> None:
        if self._backlog_count + count > self._backlog_limit:
            self.dropped += count
            self._unreported += count
            return
        self._backlog.append((partition, batch, count))
        self._backlog_count += count
        self.drain()

    def drain(self) -> None:
        backlog = self._backlog
        while backlog:
            target = self._target()
            if target is None:
                return
            partition, batch, count = backlog[0]
            if count <= target.credits:
                backlog.popleft()
                sent = count
            else:
                sent = target.credits
                batch, rest = split_batch(batch, sent)
                backlog[0] = (partition, rest, count - sent)
            self.group.charge(target, sent)
            self._backlog_count -= sent
            self.delivered += sent
            if self._unreported:  # coalesced: one notice for every drop since the last one
                target.session.send_messages_dropped(target.consumer_id, self._unreported)
                self._unreported = 0
            target.session.send_delivery(target.consumer_id, partition, batch)

    def _target(self) -> Consumer | None:
        return self.group.pick()

    def ack(self, consumer: Consumer, entries: Sequence[AckEntry], kind: int) -> None:
        """Non-reliable topics keep nothing to acknowledge: acks are accepted and ignored."""

    def nack(self, consumer: Consumer, entries: Sequence[AckEntry], delay_ms: int) -> None:
        """Nothing is kept to deliver again: nacks are accepted and ignored."""

    async def close(self) -> None:
        self._backlog.clear()
        self._backlog_count = 0

    def info(self) -> SubscriptionInfo:
        return SubscriptionInfo(
            name=self.name,
            sub_type=self.sub_type,
            pending=self._backlog_count,
            delivered=self.delivered,
            dropped=self.dropped,
            consumers=self.group.infos(),
        )
