"""The reliable pump's Key_Shared round: each record goes to the owner of its key.

A reliable Key_Shared subscription reads the WAL like the others, but a batch is cut by key: each
record goes to the consumer its key hashes to on the subscription's ring (`durables.keyshared`),
runs of consecutive records for one consumer travel as one rebuilt batch. A partition is sent in
offset order up to the first record that cannot go now: its owner has no credit or a backed-up
socket, or the key is held elsewhere (`KeyHolds`: another consumer still has unacked records of
the key, or some wait for redelivery). That partition then waits (an ack, credit, a consumer
leaving or joining wakes the pump) while the other partitions go on. So per-key order holds
across joins and leaves: a key moved to a new consumer reaches it only once the old consumer has
acked what it held of the key, or left (its records then redelivered first, to the new owner).
The price is Pulsar's: a consumer that grants no credit holds back its partitions' later records.

A transaction's marker and an aborted transaction's batches are stepped over, never sent, and
nothing past the partition's last stable offset is read (`ReliableSubscription.step_over_hidden`,
as for the other types).

Redelivery (nack, ack timeout, a consumer that left) sends each due record to its key's current
owner; one that cannot go yet waits `_RETRY` seconds and is tried again.

A batch is decoded through the subscription's `records_of`: once while the partition stays at it
(a held key keeps it there round after round), off the loop. One that does not decode stops its
partition for the subscription (`ReliableSubscription.stop_partition`); a stopped partition is
neither read nor redelivered from.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from headwater.durables.delivery import Redeliver
from headwater.durables.keyshared import KeyHolds, key_hash, keyless_hash
from headwater.server.topics.subscription_contract import Consumer
from headwater.wire.errors import CorruptBatch, DecompressedTooLarge
from headwater.wire.limits import MAX_CREDITS
from headwater.wire.records import BatchInfo, Compression, Record, inspect_batch, rebuild_batch

if TYPE_CHECKING:
    from headwater.durables.delivery import ReliableDelivery, ReliableSettings
    from headwater.durables.group import ConsumerGroup
    from headwater.server.topics.topic import LogTopic


class KeyedSubscription(Protocol):
    """What the round needs of its reliable subscription
    (`reliable_subscription.ReliableSubscription`, which imports this module)."""

    group: ConsumerGroup[Consumer]
    core: ReliableDelivery
    settings: ReliableSettings
    stopped: dict[int, str]  # partitions whose batch does not decode: not sent from

    async def records_of(self, partition: int, batch: bytes, info: BatchInfo) -> list[Record]: ...

    def decoded_to(self, partition: int, end: int) -> None: ...

    def stop_partition(self, partition: int, offset: int, error: Exception) -> None: ...

    def step_over_hidden(self, partition: int, batch: bytes) -> bool: ...

    def step_over_gap(self, partition: int, read_at: int, end: int) -> None: ...

    def sendable_partitions(self) -> set[int] | None: ...

    @property
    def log_topic(self) -> LogTopic: ...

    async def fetch_due(
        self, partition: int, offsets: list[int]
    ) -> tuple[list[Record], list[int]]: ...

    async def write_dead_letters(
        self, partition: int, dead: Sequence[tuple[Record, int]]
    ) -> list[int]: ...

    def send(
        self, target: Consumer, partition: int, first: int, end: int, batch: bytes, count: int
    ) -> None: ...

    def persist(self) -> None: ...


_BASE = struct.Struct(">q")
_RETRY = 0.05  # seconds before a due record whose owner cannot take it now is tried again


def record_hash(partition: int, record: Record) -> int:
    if record.key is None:
        return keyless_hash(partition, record.offset)
    return key_hash(record.key)


class KeyedDispatch:
    def __init__(self, subscription: KeyedSubscription) -> None:
        self._sub = subscription
        self.holds = KeyHolds()

    async def dispatch(self) -> bool:
        sub = self._sub
        core = sub.core
        # every partition's due records, until one goes: those that cannot go now are requeued
        # a little later, so this ends
        # a stopped partition (a batch that does not decode) is left out, looked up at each
        # turn: a redelivery may stop one, and its offsets, due again, must not come back here
        while (due := core.take_due(time.monotonic(), MAX_CREDITS, self._sendable())) is not None:
            if due.offsets and await self._redeliver(due):
                return True
        topic = sub.log_topic
        committed = sub.settings.committed_only
        stopped = sub.stopped
        ends = [
            0 if p.index in stopped else topic.stable_end(p, committed) for p in topic.partitions
        ]
        while (partition := core.next_partition(ends)) is not None:
            start = topic.start_offset(partition)
            if core.position(partition) < start:
                core.restart_at(partition, start)
                continue
            read_at = core.position(partition)
            batches = await topic.read(partition, read_at)
            if not batches and topic.walk_goes_on(partition, read_at):
                return True  # a walk over missing objects cut short: read on at the next round
            if not batches:
                sub.step_over_gap(partition, read_at, ends[partition])
            sent = False
            for index, batch in enumerate(batches):
                base = _BASE.unpack_from(batch)[0]
                if base >= ends[partition] or (index and base != core.position(partition)):
                    break
                if sub.step_over_hidden(partition, batch):
                    sent = True  # the cursor moved: the partition is read on
                    continue
                took, complete = await self._send_new(partition, batch)
                sent = sent or took
                if not complete:
                    break
            sub.persist()
            if sent:
                return True
            ends[partition] = 0  # blocked (or nothing visible): the other partitions go on
        return False

    def _sendable(self) -> set[int] | None:
        """The partitions served here (a cluster's) and not stopped (None: all): a partition
        another broker serves now has its due records redelivered there, not here."""
        return self._sub.sendable_partitions()

    async def _send_new(self, partition: int, batch: bytes) -> tuple[bool, bool]:
        """Send what can go of a batch read at the partition's position: (sent any, sent all).
        The batch is decoded once while its records go (a blocked key keeps its partition at
        the same batch round after round), off the loop; one that does not decode stops the
        partition (`ReliableSubscription.stop_partition`)."""
        sub = self._sub
        core = sub.core
        info = inspect_batch(batch)
        position = core.position(partition)
        if position >= info.base_offset + info.record_count:
            return False, True
        try:
            decoded = await sub.records_of(partition, batch, info)
        except (CorruptBatch, DecompressedTooLarge) as exc:
            sub.stop_partition(partition, info.base_offset, exc)
            return False, False
        if core.position(partition) != position or partition in sub.stopped:
            return False, False  # a seek or a take-over meanwhile: the next round reads again
        planned = core.plan_new(partition, info.base_offset, info.record_count, MAX_CREDITS)
        if planned is None:
            return False, True
        first, end = planned
        records = [r for r in decoded if first <= r.offset < end]
        plan = self._plan(partition, records, redelivery=False)
        whole = len(plan) == info.record_count and len(plan) == len(records)
        # one owner for the whole batch (few keys, or one consumer): sent as read, not rebuilt
        original = batch if whole and all(o is plan[0][0] for o, _, _ in plan) else None
        self._send_runs(partition, plan, Compression(info.compression), 1, original)
        if plan:
            sub.decoded_to(partition, plan[-1][1].offset + 1)
        return bool(plan), len(plan) == len(records)

    def _plan(
        self, partition: int, records: list[Record], redelivery: bool
    ) -> list[tuple[Consumer, Record, int]]:
        """The longest prefix of `records` whose owners can take them now."""
        group = self._sub.group
        taken: dict[int, int] = {}
        plan = []
        for record in records:
            hashed = self.holds.hash_of(partition, record.offset)
            if hashed is None:
                hashed = record_hash(partition, record)
            owner = group.key_owner(hashed)
            if (
                owner is None
                or not owner.session.writable
                or owner.credits - taken.get(owner.consumer_id, 0) <= 0
                or self.holds.blocked(hashed, owner.consumer_id, redelivery)
            ):
                break
            taken[owner.consumer_id] = taken.get(owner.consumer_id, 0) + 1
            plan.append((owner, record, hashed))
        return plan

    def _send_runs(
        self,
        partition: int,
        plan: list[tuple[Consumer, Record, int]],
        compression: Compression,
        count: int,
        original: bytes | None = None,
    ) -> None:
        sub = self._sub
        at = 0
        while at < len(plan):
            owner = plan[at][0]
            end = at + 1
            while (
                end < len(plan)
                and plan[end][0] is owner
                and plan[end][1].offset == plan[end - 1][1].offset + 1
            ):
                end += 1
            run = [record for _, record, _ in plan[at:end]]
            delivery_count = count or sub.core.delivery_count(partition, [r.offset for r in run])
            batch = original if original is not None else rebuild_batch(run, compression)
            sub.send(owner, partition, run[0].offset, run[-1].offset + 1, batch, delivery_count)
            for _, record, hashed in plan[at:end]:
                self.holds.hold(partition, record.offset, hashed, owner.consumer_id)
            at = end

    async def _redeliver(self, due: Redeliver) -> bool:
        sub = self._sub
        core = sub.core
        partition, offsets = due.partition, due.offsets
        for offset in offsets:
            self.holds.returned(partition, offset)
        records, gone = await sub.fetch_due(partition, offsets)
        for offset in gone:
            self.holds.release(partition, offset)
        split = core.split_due(partition, records)
        for offset in await sub.write_dead_letters(partition, split.dead):
            self.holds.release(partition, offset)
        live = [record for run in split.send for record in run]
        sent = 0
        now = time.monotonic()
        while live:
            plan = self._plan(partition, live, redelivery=True)
            if not plan:
                # the head waits; so does every later record of its key (kept in order)
                head = live[0]
                hashed = self.holds.hash_of(partition, head.offset) or record_hash(partition, head)
                self.holds.hold(partition, head.offset, hashed, -1)
                core.requeue(partition, [head.offset], now + _RETRY)
                live = live[1:]
                continue
            self._send_runs(partition, plan, Compression.NONE, 0)
            sent += len(plan)
            live = live[len(plan) :]
        sub.persist()
        return sent > 0
