"""Last-value state of a topic (`LastValueIndex`) and last-value subscriptions.

`LastValueIndex` joins the plan (`durables.lastvalue.LastValueKeys`: which keys a batch changes)
and the store (`storage.lastvalue_store`: RocksDB). It applies a batch only when the batch starts
exactly at its partition's position, so while the state is being built a live append to a
partition the catch-up has not reached yet is left for the catch-up to read from the WAL, and one
to a partition already caught up is applied at once; none is missed.

A last-value subscription belongs to one consumer and names keys and/or a key prefix. When it
attaches, it reads the current value of every matching key from the index and registers for
changes in the same synchronous step, so no update falls between the snapshot and the live
stream. Values wait in a per-key pending map until the consumer has credit: a newer value replaces
an older one still waiting (conflation), so a slow consumer costs one entry per key, never a
growing queue, and never receives a value older than one it already has. A deleted key is
delivered as a tombstone (the key with a null value). Nothing is acknowledged.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from headwater.durables.lastvalue import LastValueKeys, StoredValue
from headwater.server.kind import Consumer, Feed
from headwater.storage.lastvalue_store import LastValueStore
from headwater.storage.state import StateStore
from headwater.wire.errors import ConsumerBusy, InvalidRequest
from headwater.wire.limits import MAX_CREDITS
from headwater.wire.messages import (
    AckEntry,
    ConsumerInfo,
    Durable,
    SubscriptionInfo,
    SubscriptionType,
)
from headwater.wire.records import Record, rebuild_batch


class LastValueIndex(LastValueKeys):
    def __init__(self, state: StateStore, topic: str, partitions: int, key_field: str = "") -> None:
        super().__init__(topic, partitions, key_field)
        self._store = LastValueStore(state, topic, partitions)
        self.ready = False  # set once the catch-up has applied the whole history

    def apply(
        self,
        partition: int,
        base_offset: int,
        records: Sequence[Record],
        keys: Sequence[bytes | None],
    ) -> list[StoredValue]:
        """Apply records appended at `base_offset`; returns the changes (value None: deleted).
        A batch that does not start at the partition's position is not applied (nothing is
        returned): below it, it was applied already; above it, the catch-up reads it later."""
        if base_offset != self._store.applied(partition):
            return []
        changes = self.changes(partition, base_offset, records, keys)
        puts = {c.key: c.encode() for c in changes if c.value is not None}
        deletes = [c.key for c in changes if c.value is None]
        self._store.write(partition, base_offset + len(records), puts, deletes)
        return changes

    def applied(self, partition: int) -> int:
        return self._store.applied(partition)

    def skip_to(self, partition: int, offset: int) -> None:
        self._store.skip_to(partition, offset)

    def get(self, record_key: bytes) -> StoredValue | None:
        data = self._store.get(record_key)
        return None if data is None else StoredValue.decode(record_key, data)

    def get_head(self, record_key: bytes) -> tuple[int, int, int, bytes] | None:
        """(partition, revision, timestamp, value), or None: `get` without the headers."""
        data = self._store.get(record_key)
        return None if data is None else StoredValue.decode_head(data)

    def scan(
        self, prefix: bytes, after: bytes = b"", limit: int | None = None
    ) -> tuple[list[StoredValue], bytes]:
        rows, cursor = self._store.scan(prefix, after, limit)
        return [StoredValue.decode(k, data) for k, data in rows], cursor

    def size(self) -> int:
        return self._store.size()

    def drop(self) -> None:
        self._store.drop()


class LastValueSubscription:
    durable = Durable.LAST_VALUE
    persistent = False
    feed = Feed.CHANGES

    def __init__(
        self,
        topic: str,
        name: str,
        sub_type: SubscriptionType,
        keys: Sequence[bytes],
        key_prefix: bytes | None,
        index: LastValueIndex | None = None,
    ) -> None:
        self.topic = topic
        self.name = name
        self.sub_type = sub_type
        self.keys = frozenset(keys)
        self.key_prefix = key_prefix
        self.consumers: dict[int, Consumer] = {}
        self._index = index
        self._pending: OrderedDict[bytes, StoredValue] = OrderedDict()
        self.delivered = 0

    def matches(self, record_key: bytes) -> bool:
        return record_key in self.keys or (
            self.key_prefix is not None and record_key.startswith(self.key_prefix)
        )

    def attach(self, consumer: Consumer) -> None:
        if self.consumers:
            raise ConsumerBusy(f"last-value subscription {self.name!r} already has its consumer")
        self.consumers[consumer.consumer_id] = consumer
        index = self._index
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

    def offer(self, partition: int, batch: bytes, count: int) -> None:
        """Fed last values, not batches."""

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

    def seek(self, offsets: list[int]) -> None:
        raise InvalidRequest(
            f"subscription {self.name!r} of topic {self.topic!r} is not a reliable one: "
            "only those can seek"
        )

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
