"""Last-value and map subscriptions: the current value of each requested key, then its updates.

A last-value subscription belongs to one consumer and names keys and/or a key prefix. When it
attaches, it reads the current value of every matching key from the topic's `LastValueIndex`
and registers for changes in the same synchronous step, so no update falls between the snapshot
and the live stream. Values wait in a per-key pending map until the consumer has credit: a newer
value replaces an older one still waiting (conflation), so a slow consumer costs one entry per
key, never a growing queue, and never receives a value older than one it already has. A deleted
key is delivered as a tombstone (the key with a null value). Nothing is acknowledged.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from durables.lastvalue import LastValueIndex, StoredValue
from server.subscription import Consumer
from wire.errors import ConsumerBusy
from wire.limits import MAX_CREDITS
from wire.messages import AckEntry, ConsumerInfo, SubscriptionInfo, SubscriptionType
from wire.records import rebuild_batch


class LastValueSubscription:
    def __init__(
        self,
        topic: str,
        name: str,
        sub_type: SubscriptionType,
        keys: Sequence[bytes],
        key_prefix: bytes | None,
    ) -> None:
        self.topic = topic
        self.name = name
        self.sub_type = sub_type
        self.keys = frozenset(keys)
        self.key_prefix = key_prefix
        self.consumers: dict[int, Consumer] = {}
        self._pending: OrderedDict[bytes, StoredValue] = OrderedDict()
        self.delivered = 0

    def matches(self, record_key: bytes) -> bool:
        return record_key in self.keys or (
            self.key_prefix is not None and record_key.startswith(self.key_prefix)
        )

    def attach(self, consumer: Consumer, index: LastValueIndex | None = None) -> None:
        if self.consumers:
            raise ConsumerBusy(f"last-value subscription {self.name!r} already has its consumer")
        self.consumers[consumer.consumer_id] = consumer
        if index is not None:
            for record_key in sorted(self.keys):
                current = index.get(record_key)
                if current is not None:
                    self._pending[record_key] = current
            if self.key_prefix is not None:
                for current in index.scan(self.key_prefix)[0]:
                    self._pending[current.key] = current

    def detach(self, consumer: Consumer) -> None:
        self.consumers.pop(consumer.consumer_id, None)

    def changed(self, changes: Sequence[StoredValue]) -> None:
        for change in changes:
            if self.matches(change.key):
                self._pending.pop(change.key, None)
                self._pending[change.key] = change
        self.drain()

    def grant(self, consumer: Consumer, credits: int) -> None:
        consumer.credits = min(consumer.credits + credits, MAX_CREDITS)
        self.drain()

    def drain(self) -> None:
        for consumer in self.consumers.values():
            while self._pending and consumer.credits > 0 and consumer.session.writable:
                _, value = self._pending.popitem(last=False)
                consumer.credits -= 1
                self.delivered += 1
                consumer.session.send_delivery(
                    consumer.consumer_id, value.partition, rebuild_batch([value.as_record()])
                )

    def ack(self, consumer: Consumer, entries: Sequence[AckEntry], kind: int) -> None:
        """Last values need no acknowledgement."""

    def nack(self, consumer: Consumer, entries: Sequence[AckEntry], delay_ms: int) -> None:
        """Nothing to deliver again: the next value of a key comes when it changes."""

    async def close(self) -> None:
        self._pending.clear()

    def info(self) -> SubscriptionInfo:
        return SubscriptionInfo(
            name=self.name,
            sub_type=self.sub_type,
            pending=len(self._pending),
            delivered=self.delivered,
            dropped=0,
            consumers=tuple(
                ConsumerInfo(c.consumer_id, c.name, c.priority, c.credits, True)
                for c in self.consumers.values()
            ),
        )
