"""Last-value state of a topic (`LastValueIndex`) and last-value subscriptions.

`LastValueIndex` joins the plan (`durables.lastvalue.LastValueKeys`: which keys a batch changes)
and the store (`storage.lastvalue_store`: RocksDB). It applies a batch only when the batch starts
exactly at its partition's position, so while the state is being built a live append to a
partition the catch-up has not reached yet is left for the catch-up to read from the WAL, and one
to a partition already caught up is applied at once; none is missed.

Transactions (docs/DURABLES.md, "Transactions"): a transactional batch is not applied but held
(`hold`: each key's newest change, in the store with the position) until its producer's marker
in the partition. An abort drops what it held; a commit (`end_transaction`) applies, in one
WriteBatch across the keys, each held change that is newer, by offset, than every record of its
key applied since (the stored value's revision, or a deletion the store remembered while the
transaction was held): a key's value is its last record by offset among the committed ones, as
a compacted Kafka topic's. Plain records are applied as they come, so a map set and its
compare-and-set are never held back by someone else's open transaction. The catch-up replays
the log through the same three steps, so a transaction open across a restart is applied when
its marker comes.

When a partition's state is behind its newest snapshot (docs/COMPACTION.md, "Server side"),
`bootstrap` loads the snapshot into it before the catch-up replays the WAL from the horizon on;
a snapshot that cannot be read is abandoned (an error log) and the partition rebuilt from its
history instead, never left half-loaded.

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
from collections.abc import Callable, Sequence

import structlog

from headwater.durables.lastvalue import KeyedBatch, LastValueKeys, StoredValue, encode_stored
from headwater.server.topics.subscription_contract import Consumer, Feed
from headwater.storage.lastvalue_store import LastValueStore
from headwater.storage.objectstore import ObjectStore
from headwater.storage.snapshots import Snapshot, batch_rows, newest_horizons, read_manifest
from headwater.storage.state import StateStore
from headwater.wire.errors import ConsumerBusy, InvalidRequest, StorageError
from headwater.wire.limits import MAX_CREDITS
from headwater.wire.messages import (
    AckEntry,
    AckRange,
    ConsumerInfo,
    Durable,
    SubscriptionInfo,
    SubscriptionType,
)
from headwater.wire.records import rebuild_batch

log = structlog.get_logger(__name__)

_LOAD_CHUNK = 10_000  # snapshot rows per WriteBatch


class LastValueIndex(LastValueKeys):
    def __init__(self, state: StateStore, topic: str, partitions: int, key_field: str = "") -> None:
        super().__init__(topic, partitions, key_field)
        self._store = LastValueStore(state, topic, partitions)
        self.ready = False  # set once the catch-up has applied the whole history
        self._loading: set[int] = set()  # partitions a snapshot is being loaded into
        self.replayed = 0  # records the catch-up applied from the WAL (tests, logs)
        self.snapshot_horizons: dict[int, int] = {}  # partition -> horizon of the snapshot loaded

    def apply(
        self, partition: int, base_offset: int, batch: KeyedBatch, notify: bool = False
    ) -> list[StoredValue]:
        """Apply records appended at `base_offset`; returns the changes (value None: deleted)
        when `notify` (a last-value subscription is told of them). A batch that does not start
        at the partition's position is not applied (nothing is returned): below it, it was
        applied already; above it, the catch-up reads it later."""
        if base_offset != self._store.applied(partition) or partition in self._loading:
            return []
        newest = batch.newest()
        puts, deletes = batch.plan(partition, base_offset, newest)
        deleted_at = None
        if deletes and self._store.holding(partition):  # a held change older must not win
            deleted_at = {record_key: base_offset + newest[record_key] for record_key in deletes}
        self._store.write(partition, base_offset + len(batch.keys), puts, deletes, deleted_at)
        return batch.changes(partition, base_offset, newest) if notify else []

    def hold(self, partition: int, producer: int, base_offset: int, batch: KeyedBatch) -> None:
        """A transactional batch appended at `base_offset`: its changes wait for the producer's
        marker (`end_transaction`). Applied in order as `apply` is (not at the position: not
        now)."""
        if base_offset != self._store.applied(partition) or partition in self._loading:
            return
        changes = batch.changes(partition, base_offset, batch.newest())
        self._store.hold(
            partition,
            base_offset + len(batch.keys),
            producer,
            {change.key: change.encode() for change in changes},
        )

    def end_transaction(
        self, partition: int, producer: int, offset: int, commit: bool, notify: bool = False
    ) -> list[StoredValue]:
        """The producer's marker at `offset`: on a commit, the held changes that are newer than
        anything applied to their keys since are applied, all at once; on an abort none is.
        Returns what changed when `notify`."""
        if offset != self._store.applied(partition) or partition in self._loading:
            return []
        held = self._store.held(partition, producer) if commit else {}
        won: list[StoredValue] = []
        if held:
            record_keys = list(held)
            current = self._store.get_many(record_keys)
            deleted = self._store.deleted(partition, record_keys)
            for record_key, now, gone in zip(record_keys, current, deleted, strict=True):
                change = StoredValue.decode(record_key, held[record_key])
                newer = now is None or StoredValue.decode_head(now)[1] < change.offset
                if newer and (gone is None or gone < change.offset):
                    won.append(change)
        self._store.release(
            partition,
            offset + 1,
            producer,
            {c.key: c.encode() for c in won if c.value is not None},
            [c.key for c in won if c.value is None],
            {c.key: c.offset for c in won if c.value is None},
        )
        return won if notify else []

    def applied(self, partition: int) -> int:
        return self._store.applied(partition)

    def skip_to(self, partition: int, offset: int) -> None:
        self._store.skip_to(partition, offset)

    def restart_partition(self, partition: int) -> None:
        """The partition's log was replaced (a cluster take-over): forget its keys and apply it
        again from offset 0 (the catch-up loads a snapshot first when one helps)."""
        self._store.clear(partition, _belongs(partition))
        self._store.write(partition, 0, {}, [])

    async def snapshots(
        self, store: ObjectStore | None, next_offsets: Sequence[int]
    ) -> dict[int, int]:
        """The newest snapshot horizon of each partition (one listing of the store), when one
        could matter: some partition's state is short of its end, and the topic has no key
        field (snapshots are keyed by record key; a key-field topic keys by its values)."""
        if store is None or self.key_field:
            return {}
        if all(self.applied(p) >= end for p, end in enumerate(next_offsets)):
            return {}  # a horizon is at most the end: nothing can be behind one
        try:
            return await newest_horizons(store, self.topic)
        except StorageError as exc:
            log.error("last_value.snapshot_unreadable", topic=self.topic, error=str(exc))
            return {}

    async def bootstrap(
        self,
        store: ObjectStore | None,
        partition: int,
        start_offset: int,
        next_offset: int,
        horizon: int | None,
    ) -> None:
        """Before the catch-up of `partition`: finish off an interrupted load, and load the
        snapshot at `horizon` (its newest) when the state is behind it and that beats
        replaying the WAL."""
        belongs = _belongs(partition)
        if self._store.loading(partition):
            log.warning("last_value.load_interrupted", topic=self.topic, partition=partition)
            self._store.abandon_load(partition, belongs)
        applied = self.applied(partition)
        if store is None or horizon is None or applied >= horizon:
            return
        if horizon > next_offset:
            log.warning(
                "last_value.snapshot_ahead",
                topic=self.topic,
                partition=partition,
                horizon=horizon,
                next_offset=next_offset,
            )
            return  # not a snapshot of this log (one of an earlier topic of that name)
        try:
            manifest = await read_manifest(store, self.topic, partition, horizon)
        except StorageError as exc:
            log.error(
                "last_value.snapshot_unreadable",
                topic=self.topic,
                partition=partition,
                horizon=horizon,
                error=str(exc),
            )
            return
        if applied >= start_offset and horizon - applied <= manifest.rows_to_read:
            return  # replaying the WAL is no more work than loading the snapshot
        snapshot = Snapshot(store, manifest)
        self._loading.add(partition)
        keys = 0
        try:
            self._store.begin_load(partition, belongs)
            async for batch in snapshot.batches():
                rows = batch_rows(batch)
                keys += len(rows)
                for start in range(0, len(rows), _LOAD_CHUNK):
                    self._store.put_rows(
                        {
                            row.key: encode_stored(
                                partition, row.offset, row.timestamp, row.value, row.headers
                            )
                            for row in rows[start : start + _LOAD_CHUNK]
                        }
                    )
            self._store.finish_load(partition, horizon)
        except StorageError as exc:
            self._store.abandon_load(partition, belongs)
            log.error(
                "last_value.snapshot_unusable",
                topic=self.topic,
                partition=partition,
                horizon=horizon,
                error=str(exc),
                fallback="replay from the oldest stored offset",
            )
            return
        finally:
            self._loading.discard(partition)
        self.snapshot_horizons[partition] = horizon
        log.info(
            "last_value.snapshot_loaded",
            topic=self.topic,
            partition=partition,
            horizon=horizon,
            keys=keys,
            layers=len(manifest.all_layers),
            state_was_at=applied,
        )

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


def _belongs(partition: int) -> Callable[[bytes], bool]:
    def belongs(data: bytes) -> bool:
        return StoredValue.decode(b"", data).partition == partition

    return belongs


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

    def ack_ranges(self, consumer: Consumer, ranges: Sequence[AckRange]) -> None:
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
