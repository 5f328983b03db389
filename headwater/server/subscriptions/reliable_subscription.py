"""Reliable subscriptions: the asyncio pump around `durables.delivery.ReliableDelivery`.

A reliable subscription outlives its consumers. What to deliver, when, and to whom is decided by
the I/O-free core (`ReliableDelivery`: cursors, in-flight, ack timeouts, backoff, dead-letter
decisions) and the consumer group (`durables.group`); this module does the I/O the core asks for:
it reads the WAL (or the object store), sends to consumers, writes to the dead-letter topic,
persists changed cursors, and sleeps until the core's next wake-up time.

One pump task per subscription does all sending, so no two deliveries race. Each round it picks a
consumer the subscription type allows (Exclusive: the one; Failover: the active one; Shared: the
one with the most credit) and sends it, within its credit (on a topic of several partitions,
Failover, and consumers that chose partitions, are tried in turn, each with the partitions it is
active for or chose; Key_Shared cuts batches by key owner, `server.subscriptions.key_shared_round`):

1. messages due for redelivery (`take_due`), re-encoded as batches of consecutive offsets; a
   message already delivered `max_deliveries` times goes to the dead-letter topic instead and is
   acked here;
2. otherwise the next batch after the cursor's position, read from the WAL's tail cache, the WAL,
   or the object store, cut to the consumer's credit (`plan_new`), and the batches after it from
   the same read while the group would pick that consumer again (a disk read is not per batch).

Transactions (docs/DURABLES.md): a partition is read up to its last stable offset
(`LogTopic.stable_end`: nothing of a transaction still open, nor anything after it, is sent), and
a transaction's marker or a batch of an aborted transaction is never sent: the cursor steps over
it as over a gap (acknowledged, so it counts in no backlog), however many there are in a read.
Redelivery reads back only offsets that were sent; one in such a batch (an acknowledgement a
restart forgot, past the cursor's cap) is acknowledged, not sent.

The pump sleeps on one event. It is woken by a consumer arriving, credit, a writable socket, an ack
timeout or redelivery falling due, and by appends: not through a listener per subscription on every
partition (which made each append cost one wake-up per subscription, however idle), but through
the topic's `AppendSignal`, which a sleeping pump joins only when it has a consumer able to take a
message. An append fires the signal once and empties it, so its cost does not grow with the number
of subscriptions, only with the pumps that are waiting to deliver that very append.

A batch is sent as stored when the consumer's credit takes it whole, or when the consumer takes
whole batches (`Consumer.whole_batches`, a Kafka share member) and has any credit. Cutting it
(credit, a position inside it) decodes it under the broker's `max_decompressed_batch`, once while
it is being cut (`records_of`), in a worker thread unless it is small and uncompressed. A batch
that does not decode fails the same way at every try, so its partition is stopped for this
subscription (`stop_partition`: an error event, the `stopped_partitions` gauge) and the others go
on, until a seek or a restart (docs/DURABLES.md).

A subscription started at `snapshot` reads each partition below its snapshot's horizon from a
`SnapshotFeed` (server.subscriptions.snapshot_feed) rather than the log, and the log from the
horizon on.

Closing sets a flag, wakes and cancels the pump, and waits for it: the pump sleeps with a timer of
its own rather than `asyncio.wait_for`, which on Python 3.11 can swallow a cancellation that races
the wake-up (the pump then ran on, and the close, and with it DELETE_TOPIC, waited forever).

Cursor writes are coalesced: one WriteBatch per event-loop turn at most, synced (through the
`StateWriter`'s group commit) when the topic's fsync policy is `always`. A cursor write or sync
that fails is tried again with a backoff, logged (`subscription.cursor_write_failed`) and counted
(`cursor_write_failures`, a metric).
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial

import structlog

from headwater.durables.cursor import PartitionCursor
from headwater.durables.delivery import (
    DEAD_LETTER_RETRY,
    Redeliver,
    ReliableDelivery,
    ReliableSettings,
)
from headwater.durables.group import ConsumerGroup
from headwater.durables.lastvalue import StoredValue
from headwater.server.subscriptions.append_signal import AppendSignal, DeadLetter
from headwater.server.subscriptions.key_shared_round import KeyedDispatch
from headwater.server.subscriptions.live_subscription import failover_logger
from headwater.server.subscriptions.snapshot_feed import SnapshotFeed
from headwater.server.topics.subscription_contract import Consumer, Feed
from headwater.server.topics.topic import LogTopic
from headwater.storage.state import CURSOR, StateWriter, key
from headwater.storage.wal import FsyncPolicy
from headwater.wire.errors import CorruptBatch, DecompressedTooLarge, HeadwaterError
from headwater.wire.limits import MAX_DECOMPRESSED_BATCH
from headwater.wire.markers import peek
from headwater.wire.messages import AckEntry, AckRange, Durable, SubscriptionInfo, SubscriptionType
from headwater.wire.records import (
    BatchInfo,
    Compression,
    Record,
    inspect_batch,
    read_records,
    rebuild_batch,
)

log = structlog.get_logger(__name__)

_YIELD_EVERY = 64  # pump rounds between yields to the event loop
_STUCK_RECHECK = 0.25  # seconds: a round that sent nothing while something is due looks again
# an uncompressed batch up to this size is decoded on the loop (tens of microseconds); others, which
# may inflate to `max_decompressed_batch`, in a worker thread
_DECODE_INLINE = 64 * 1024
_CURSOR_RETRY_FIRST = 0.05  # seconds before a failed cursor write is tried again, doubled
_CURSOR_RETRY_MAX = 5.0  # up to this
_BASE = struct.Struct(">q")  # a batch's base offset
_CRC = slice(17, 21)  # a batch's CRC-32C (Kafka RecordBatch v2), over everything after it


class ReliableSubscription:
    persistent = True
    feed = Feed.NOTHING

    def __init__(
        self,
        topic: LogTopic,
        name: str,
        sub_type: SubscriptionType,
        settings: ReliableSettings,
        cursors: list[PartitionCursor],
        writer: StateWriter,
        dead_letter: DeadLetter,
        signal: AppendSignal,
        snapshot: SnapshotFeed | None = None,
        max_decompressed: int = MAX_DECOMPRESSED_BATCH,
    ) -> None:
        self.topic = topic.name
        # the cap the broker accepted batches under (`max_decompressed_batch`): a batch it took
        # under a raised cap must decode here too, not fail at the default one
        self.max_decompressed = max_decompressed
        # partition -> (base offset, CRC, records) of the batch a credit split is cutting (the
        # CRC: a take-over may give an offset another batch)
        self._decoded: dict[int, tuple[int, bytes, list[Record]]] = {}
        # partitions this subscription stopped sending: a batch there does not decode (see
        # `stop_partition`), with the reason; a seek or a restart starts them again
        self.stopped: dict[int, str] = {}
        self.dispatch_failures = 0  # rounds that raised (a bug): logged, retried after 1 s
        self.snapshot = snapshot
        self._topic = topic
        self.name = name
        self.sub_type = sub_type
        shared = sub_type in (SubscriptionType.SHARED, SubscriptionType.KEY_SHARED)
        self.durable = Durable.SHARED if shared else Durable.STANDARD
        self.settings = settings
        self.group: ConsumerGroup[Consumer] = ConsumerGroup(
            topic.name, name, sub_type, failover_logger(topic.name, name)
        )
        self.group.partitions = len(topic.partitions)
        self.consumers = self.group.consumers
        self.core = ReliableDelivery(settings, cursors, shared, time.monotonic(), topic.name)
        self._keyed = KeyedDispatch(self) if sub_type == SubscriptionType.KEY_SHARED else None
        self._writer = writer
        self._dead_letter = dead_letter
        self._signal = signal
        self._wake = asyncio.Event()
        self._flushing = False
        self._flush_task: asyncio.Task[None] | None = None  # kept: a task is weakly referenced
        # the `write_within` sync the last cursor write waits for, and the partitions under it
        self._sync_pending: asyncio.Future[None] | None = None
        self._sync_partitions: set[int] = set()
        self.cursor_write_failures = 0  # cursor writes or syncs that failed (each retried)
        self._capped: set[int] = set()  # partitions whose acks are past the written ranges' cap
        # in a cluster, whether this broker serves a partition now
        # (server.requests.partition_ownership)
        self.serves: Callable[[str, int], bool] | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.rounds = 0  # pump rounds run (tests count the work appends cause)

    # Lifecycle

    @property
    def _sync_state(self) -> bool:
        """Read each time: `topic alter` may change the fsync policy while the server runs."""
        return self._topic.settings.fsync == FsyncPolicy.ALWAYS

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def wake(self) -> None:
        """What this broker serves changed (a cluster): look at the partitions again."""
        self._wake.set()

    async def close(self) -> None:
        self._closed = True
        self._signal.leave(id(self))
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        puts = self._dirty_puts()
        if puts:
            # the last writes: a failure is told (nothing is left to retry them; a restart
            # redelivers what they acknowledged), not raised into a topic's deletion
            try:
                done = self._writer.write(puts, sync=self._sync_state)
                if done is not None:
                    await done
            except Exception as exc:
                self.cursor_write_failures += 1
                log.error(
                    "subscription.cursor_write_failed",
                    topic=self.topic,
                    subscription=self.name,
                    error=str(exc),
                    retry_in=None,
                )

    # Consumers and their requests

    def attach(self, consumer: Consumer) -> None:
        self.group.add(consumer, consumer.partitions)
        self._wake.set()

    def detach(self, consumer: Consumer) -> None:
        if not self.group.remove(consumer):
            return
        if self._keyed is not None:
            self._keyed.holds.returned_all(consumer.consumer_id)
        self.core.consumer_left(consumer.consumer_id, time.monotonic())
        self._wake.set()

    def grant(self, consumer: Consumer, credits: int) -> None:
        self.group.grant(consumer, credits)
        self._wake.set()

    def drain(self) -> None:
        self._wake.set()

    def ack(self, consumer: Consumer, entries: Sequence[AckEntry], kind: int) -> None:
        self.core.ack(entries, kind)
        self.persist()
        if self._keyed is not None:  # an ack may free a key held back for another consumer
            for entry in entries:
                self._keyed.holds.release(entry.partition, entry.offset)
            self._wake.set()

    def ack_ranges(self, consumer: Consumer, ranges: Sequence[AckRange]) -> None:
        self.core.ack_ranges(ranges)
        self._acked(ranges)

    def acked_in_transaction(self, ranges: Sequence[AckRange], ends: Sequence[int]) -> None:
        """Acknowledge `ranges` as a committed transaction does (it has no consumer): also
        what this broker never dispatched, up to each partition's end in `ends` (a cluster's
        previous owner delivered it: `ReliableDelivery.ack_committed`)."""
        self.core.ack_committed(ranges, ends, time.monotonic())
        self._acked(ranges)
        self._wake.set()  # offsets taken as dispatched below a range are due

    def _acked(self, ranges: Sequence[AckRange]) -> None:
        self.persist()
        if self._keyed is not None:
            holds = self._keyed.holds
            for entry in ranges:
                holds.release_range(
                    entry.partition, entry.first_offset, entry.first_offset + entry.count
                )
            self._wake.set()

    def nack(self, consumer: Consumer, entries: Sequence[AckEntry], delay_ms: int) -> None:
        self.core.nack(entries, delay_ms, time.monotonic())
        if self._keyed is not None:
            for entry in entries:
                self._keyed.holds.returned(entry.partition, entry.offset)
        self._wake.set()

    def reject(self, entries: Sequence[AckEntry]) -> None:
        """A Kafka share consumer's REJECT: to the dead-letter topic at once (`ReliableDelivery.
        reject`)."""
        self.core.reject(entries, time.monotonic())
        self._wake.set()

    def offer(self, partition: int, batch: bytes, count: int) -> None:
        """Reads the WAL itself: fed nothing."""

    def changed(self, changes: Sequence[StoredValue]) -> None:
        """Fed nothing."""

    def seek(self, offsets: list[int]) -> None:
        """Start every partition again at the given offset, forgetting unacked messages (and
        starting the stopped partitions again)."""
        self.core.reset(offsets)
        self._decoded.clear()
        if self.stopped:
            log.info(
                "subscription.partitions_restarted",
                topic=self.topic,
                subscription=self.name,
                partitions=sorted(self.stopped),
            )
            self.stopped.clear()
        if self._keyed is not None:
            self._keyed.holds.clear()
        self.persist()
        self._wake.set()

    # Persistence: coalesce cursor writes, one WriteBatch per event-loop turn at most.

    def persist(self) -> None:
        if self.core.dirty and not self._flushing:
            self._flushing = True
            self._flush_task = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        # Acks are answered before their cursor is written, and losing a cursor's last writes
        # redelivers, never skips: so under fsync `always` the cursors are written at once (a
        # killed server keeps them) and synced within the topic's fsync interval, one sync for
        # every subscription's writes meanwhile, not one per round of acks beside the topic's
        # own fsyncs (docs/DECISIONS.md).
        # A write that fails (RocksDB's I/O error) puts its partitions back in `dirty` and is
        # tried again after a backoff, counted and logged: it raised out of this task before,
        # which nobody awaited, and the partitions' changes were not written until they changed
        # again (a restart then redelivered everything acked meanwhile, silently).
        delay = _CURSOR_RETRY_FIRST
        try:
            while self.core.dirty and not self._closed:
                await asyncio.sleep(0)
                dirty = self.core.take_dirty()
                try:
                    self._write_cursors(dirty)
                except Exception as exc:  # rocksdict raises plain Exceptions for I/O errors
                    self._cursor_write_failed(dirty.keys(), exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _CURSOR_RETRY_MAX)
                    continue
                delay = _CURSOR_RETRY_FIRST
        finally:
            self._flushing = False

    def _write_cursors(self, dirty: dict[int, bytes]) -> None:
        self._tell_capped(dirty)
        puts = {key(CURSOR, self.topic, self.name, p): data for p, data in dirty.items()}
        settings = self._topic.settings
        if settings.fsync != FsyncPolicy.ALWAYS:
            self._writer.write(puts)
            return
        synced = self._writer.write_within(settings.fsync_interval_ms / 1000, puts)
        # written, not yet synced: a failed sync is tried again too (the cursors are written
        # again, and with them a sync queued). One callback per sync, with every partition
        # written under it, not one per flush
        if synced is not self._sync_pending:
            self._sync_pending = synced
            self._sync_partitions = set()
            synced.add_done_callback(partial(self._synced, self._sync_partitions))
        self._sync_partitions.update(dirty)

    def _tell_capped(self, partitions: Iterable[int]) -> None:
        """Log once when a partition's cursor starts to hold more ranges of acknowledgements than
        are written (`durables.cursor.MAX_PERSISTED_RANGES`): after a restart, the acks past
        the cap would be delivered again."""
        for partition in partitions:
            over = self.core.cursors[partition].ranges_over_cap
            if over and partition not in self._capped:
                self._capped.add(partition)
                log.warning(
                    "subscription.ack_ranges_capped",
                    topic=self.topic,
                    subscription=self.name,
                    partition=partition,
                    floor=self.core.cursors[partition].floor,
                    ranges_left_out=over,
                )
            elif not over:
                self._capped.discard(partition)

    def _synced(self, partitions: set[int], done: asyncio.Future[None]) -> None:
        if done is self._sync_pending:
            self._sync_pending = None
        if done.cancelled() or done.exception() is None or self._closed:
            return
        error = done.exception()
        assert error is not None
        self._cursor_write_failed(partitions, error, 0.0)
        self.persist()  # the next write waits for the next sync window: no tight loop

    def _cursor_write_failed(
        self, partitions: Iterable[int], error: BaseException, retry: float
    ) -> None:
        failed = sorted(partitions)
        self.core.dirty.update(failed)
        self.cursor_write_failures += 1
        log.error(
            "subscription.cursor_write_failed",
            topic=self.topic,
            subscription=self.name,
            partitions=failed,
            error=str(error),
            retry_in=retry,
        )

    def _dirty_puts(self) -> dict[bytes, bytes]:
        return {
            key(CURSOR, self.topic, self.name, p): data
            for p, data in self.core.take_dirty().items()
        }

    # The pump

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            started = time.monotonic()
            # Cleared before the round, not after it: a wake-up (credit, an ack, an append seen
            # through `appends` below) arriving while the round awaits a read must not be lost
            self._wake.clear()
            appends = self._signal.fired
            self.core.expire(started)
            try:
                sent = await self._dispatch_once()
            except Exception:  # a bug must not stop the subscription for good
                self.dispatch_failures += 1
                log.exception("subscription.dispatch_failed", topic=self.topic, name=self.name)
                await asyncio.sleep(1)
                continue
            self.rounds += 1
            if sent and self.rounds % _YIELD_EVERY:
                continue
            if sent:
                await asyncio.sleep(0)
                continue
            if self._closed:
                return
            wake_at = None
            if self.group.pick() is not None:  # someone could take a message: wait for appends
                self._signal.join(id(self), self._wake.set)
                if self._signal.fired != appends:
                    # appended (or made durable) while the round read the log, before the join:
                    # the round may have seen the old end, so look again
                    self._wake.set()
                wake_at = self.core.wake_at()
            # else nobody can take a redelivery or notice an ack timeout before a consumer, credit
            # or a writable socket wakes the pump (which then expires and redelivers): a timer
            # here fired every millisecond once a redelivery was overdue with no consumer
            timer = None
            if wake_at is not None:
                timeout = max(0.0, wake_at - time.monotonic())
                if wake_at <= started:
                    # due before this round, yet nothing went: someone has credit, but not the
                    # consumer the due message is for (Failover over partitions, Key_Shared);
                    # what changes that wakes the pump, and a 1 ms timer here made it spin
                    timeout = _STUCK_RECHECK
                timer = loop.call_later(timeout + 0.001, self._wake.set)
            try:
                await self._wake.wait()
            finally:
                if timer is not None:
                    timer.cancel()

    async def _dispatch_once(self) -> bool:
        group = self.group
        group.partitions = len(self._topic.partitions)  # partitions may have been added
        if self._keyed is not None:
            return await self._keyed.dispatch()
        served = self.sendable_partitions()
        if group.partitions > 1 and (self.sub_type != SubscriptionType.SHARED or group.chosen):
            # Failover over partitions, or consumers that chose partitions: each consumer is
            # sent from the partitions it is active for, or chose
            for target in group.ready():
                owned = set(group.owned(target))
                if await self._dispatch_to(target, owned if served is None else owned & served):
                    return True
            return False
        return await self._dispatch_to(group.pick(), served)

    def sendable_partitions(self) -> set[int] | None:
        """The partitions this broker serves (a cluster) and this subscription has not stopped,
        None for all of them."""
        serves = self.serves
        if serves is None and not self.stopped:
            return None
        return {
            p
            for p in range(len(self._topic.partitions))
            if (serves is None or serves(self.topic, p)) and p not in self.stopped
        }

    def stop_partition(self, partition: int, offset: int, error: Exception) -> None:
        """A batch of `partition` at `offset` does not decode here (corrupt past its CRC, or it
        inflates past `max_decompressed_batch`, lowered since it was accepted). That is the same
        at every try: retrying it every round (a `dispatch_failed` a second, forever, and the
        other partitions slowed behind it) neither sends it nor says why. So the partition
        stops for this subscription, told and counted, and the others go on; nothing is
        skipped or acked. It starts again at a seek (past the batch, as a Kafka consumer seeks
        past a corrupt record) or a restart (after raising the cap): docs/DURABLES.md."""
        self._decoded.pop(partition, None)
        if partition in self.stopped:
            return
        self.stopped[partition] = str(error)
        log.error(
            "subscription.partition_stopped",
            topic=self.topic,
            subscription=self.name,
            partition=partition,
            offset=offset,
            error=str(error),
        )

    async def records_of(self, partition: int, batch: bytes, info: BatchInfo) -> list[Record]:
        """The batch's records, decoded once while a credit split (or a Key_Shared round) cuts
        it, in a worker thread: decoding it whole on the loop once per cut held the loop for
        the whole batch at every grant of credit. Raises `CorruptBatch` or
        `DecompressedTooLarge`."""
        crc = batch[_CRC]
        found = self._decoded.get(partition)
        if found is not None and found[0] == info.base_offset and found[1] == crc:
            return found[2]
        if info.compression == Compression.NONE and len(batch) <= _DECODE_INLINE:
            records = read_records(batch, self.max_decompressed)  # less than a thread's hop
        else:
            records = await asyncio.to_thread(read_records, batch, self.max_decompressed)
        self._decoded[partition] = (info.base_offset, crc, records)
        return records

    def decoded_to(self, partition: int, end: int) -> None:
        """What was decoded for `partition` is sent up to `end`: forgotten once it all is."""
        found = self._decoded.get(partition)
        if found is not None and found[2] and end > found[2][-1].offset:
            del self._decoded[partition]

    async def _dispatch_to(self, target: Consumer | None, owned: set[int] | None) -> bool:
        if target is None:
            return False
        if owned is not None and not owned:
            return False
        due = self.core.take_due(time.monotonic(), target.credits, owned)
        if due is not None:
            await self._redeliver(target, due)
            return True
        topic = self._topic
        committed = self.settings.committed_only
        ends = [
            topic.stable_end(p, committed) if owned is None or p.index in owned else 0
            for p in topic.partitions
        ]
        core = self.core
        while (partition := core.next_partition(ends, target.consumer_id)) is not None:
            position = core.position(partition)
            feed = self.snapshot
            from_feed = feed is not None and feed.covers(partition, position)
            if feed is not None and from_feed:
                batches = await feed.read(partition, position)
                if batches == []:  # past the last row: the log goes on at the horizon
                    core.plan_new(partition, feed.horizon(partition), 0, 0)
                    self.persist()
                    continue
                if batches is None:
                    continue  # unreadable: read from the log (the feed dropped the partition)
            else:
                if feed is not None:
                    feed.release(partition, core.cursors[partition].floor)
                start = topic.start_offset(partition)
                if position < start:
                    core.restart_at(partition, start)
                    continue
                batches = await topic.read(partition, position)
            if batches and _BASE.unpack_from(batches[0])[0] >= ends[partition]:
                ends[partition] = 0  # past a gap, the next batch is not visible yet
                continue
            if not batches:
                if topic.walk_goes_on(partition, position):
                    # a walk over missing objects cut short: the next round reads on from where
                    # it stopped (waiting for an append left the records after the hole unsent)
                    return True
                # nothing at the position though the end is past it: a gap (the offsets a
                # restart skipped to its lease) reaching the end, nothing written after it yet.
                # The other partitions go on; returning here left them unsent until this one
                # got a record (acknowledged records of a new subscription never delivered)
                self.step_over_gap(partition, position, ends[partition])
                ends[partition] = 0
                continue
            if target.consumer_id not in self.consumers:
                return True
            # A read from disk costs about the same for one batch as for its megabyte of them
            # (after a restart the tail cache is empty): one read per batch sent made a fresh
            # subscription crawl at ~100 records/s. So send the batches read while the group
            # would pick this consumer again (credit left, socket writable, its Shared turn).
            for index, batch in enumerate(batches):
                base = _BASE.unpack_from(batch)[0]
                if base >= ends[partition]:
                    break
                if index and base != core.position(partition) and not from_feed:
                    # a hole inside the read (a damaged batch skipped): the next read starts
                    # there, so the object store's copy is tried before anything is stepped over
                    # (a snapshot's rows have holes by nature: superseded records)
                    break
                if self.step_over_hidden(partition, batch):
                    continue  # (a read of nothing but hidden batches still moves the cursor)
                if not await self._send_new(target, partition, batch):
                    break  # stopped, or changed while the batch decoded: the next round looks
                if owned is None and self.group.pick() is not target:
                    break
                if owned is not None and not (target.credits > 0 and target.session.writable):
                    break
            return True
        return False

    def step_over_gap(self, partition: int, read_at: int, end: int) -> None:
        """A read at `read_at` found no batch though the partition's readable `end` (taken
        before the read: every batch below it was there) is past it: the offsets up to `end`
        hold no record (a restart skipped them to its offset lease) and the cursor steps over
        them, acknowledged, as over a gap before a batch. Left there, they counted in the
        subscription's backlog (`pending`) until a record came after them. Only if the cursor is
        still where the read was (a seek meanwhile may have moved it back over records), and in
        the local WAL (`LogTopic.empty_read_is_a_gap`: an object-store walk cut short is not
        one; stepping there would acknowledge records never delivered).
        Shared with the Key_Shared round."""
        if self.core.position(partition) == read_at < end and self._topic.empty_read_is_a_gap(
            partition, read_at
        ):
            self.core.plan_new(partition, end, 0, 0)
            self.persist()

    def step_over_hidden(self, partition: int, batch: bytes) -> bool:
        """Whether `batch`, read at the partition's position, is one no subscriber is sent (a
        transaction's marker, or a batch of an aborted transaction); if so the cursor steps
        over its offsets as over a gap, acknowledged. Shared with the Key_Shared round."""
        topic = self._topic
        if not topic.hides(topic.partitions[partition], batch):
            return False
        info = peek(batch)
        self.core.plan_new(partition, info.next_offset, 0, 0)
        self.persist()
        return True

    async def _send_new(self, target: Consumer, partition: int, batch: bytes) -> bool:
        """Send what the consumer's credit takes of a batch read at the partition's position;
        False when nothing could go (the partition stopped, or the consumer or the position
        changed while the batch decoded)."""
        core = self.core
        info = inspect_batch(batch)
        position = core.position(partition)
        base, batch_end = info.base_offset, info.base_offset + info.record_count
        first = max(position, base)
        records = None
        if base < first or first + _takes(target, batch_end - first) < batch_end:  # a part: cut
            try:
                records = await self.records_of(partition, batch, info)
            except (CorruptBatch, DecompressedTooLarge) as exc:
                self.stop_partition(partition, base, exc)
                return False
            if core.position(partition) != position or target.consumer_id not in self.consumers:
                return False  # a seek, a take-over or the consumer left meanwhile
        takes = _takes(target, batch_end - first)  # (its credit may have changed meanwhile)
        planned = core.plan_new(partition, base, info.record_count, takes)
        if planned is not None and planned[0] < planned[1]:  # (credit taken back meanwhile)
            first, end = planned
            if records is not None and (base < first or end < batch_end):
                cut = [r for r in records if first <= r.offset < end]
                batch = rebuild_batch(cut, Compression(info.compression))
                end = cut[-1].offset + 1
            self.send(target, partition, first, end, batch, 1)
            self.decoded_to(partition, end)
        self.persist()
        return True

    async def _redeliver(self, target: Consumer, due: Redeliver) -> None:
        partition, offsets = due.partition, due.offsets
        if not offsets:
            return
        core = self.core
        records, _ = await self.fetch_due(partition, offsets)
        if target.consumer_id not in self.consumers:
            core.requeue(partition, [r.offset for r in records], time.monotonic())
            return
        plan = core.split_due(partition, records)
        await self.write_dead_letters(partition, plan.dead)
        for group in plan.send:
            if target.consumer_id not in self.consumers:  # left while a dead letter was written
                core.requeue(partition, [r.offset for r in group], time.monotonic())
                continue
            count = core.delivery_count(partition, [r.offset for r in group])
            first, end = group[0].offset, group[-1].offset + 1
            self.send(target, partition, first, end, rebuild_batch(group), count)
        self.persist()

    async def fetch_due(self, partition: int, offsets: list[int]) -> tuple[list[Record], list[int]]:
        """The records of offsets due for redelivery, and the offsets that can no longer be read
        (marked unreadable in the core, and logged). A failed read requeues every offset and
        raises: a message is never dropped from redelivery. Shared with the Key_Shared round."""
        core = self.core
        try:
            records, hidden = await self.fetch(partition, offsets)
        except (CorruptBatch, DecompressedTooLarge) as exc:
            # the same at every try: the partition stops (its offsets stay due, for a seek or
            # a restart to decide), rather than a failed round every second for ever
            core.requeue(partition, offsets, time.monotonic())
            self.stop_partition(partition, offsets[0], exc)
            return [], []
        except Exception:
            core.requeue(partition, offsets, time.monotonic() + DEAD_LETTER_RETRY)
            raise
        if hidden:  # (after a restart that forgot acks past the cap) nothing to deliver
            core.unreadable(partition, hidden)
        gone = sorted(set(offsets).difference(r.offset for r in records).difference(hidden))
        if gone:
            log.error(
                "subscription.offsets_unreadable",
                topic=self.topic,
                name=self.name,
                partition=partition,
                count=len(gone),
                first=gone[0],
            )
            core.unreadable(partition, gone)
        return records, gone

    async def write_dead_letters(
        self, partition: int, dead: Sequence[tuple[Record, int]]
    ) -> list[int]:
        """Dead-letter each (record, delivery count); the offsets written (a refused one stays
        due, for a later try). After a refusal the rest are not tried this round but stay due
        with it: a dead-letter topic that cannot take one now (its owner frozen, its peer link
        timing out) costs the pump one wait per round, not one per message."""
        written = []
        for position, (record, count) in enumerate(dead):
            if not await self.send_to_dead_letter(partition, record, count):
                now = time.monotonic()
                for later, _ in dead[position + 1 :]:
                    self.core.dead_letter_failed(partition, later.offset, now)
                break
            self.core.dead_letter_written(partition, record.offset)
            written.append(record.offset)
        return written

    async def send_to_dead_letter(self, partition: int, record: Record, count: int) -> bool:
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
            self.core.dead_letter_failed(partition, record.offset, time.monotonic())
            return False
        return True

    async def fetch(self, partition: int, offsets: list[int]) -> tuple[list[Record], list[int]]:
        """The records at `offsets` (sorted), read back from the WAL or the object store, and
        those of `offsets` in batches no subscriber is sent (markers, aborted transactions)."""
        found: list[Record] = []
        hidden: list[int] = []
        feed = self.snapshot
        if feed is not None and feed.covers(partition, offsets[0]):
            below = [o for o in offsets if feed.covers(partition, o)]
            rows = await feed.records(partition, below)
            if rows is not None:
                found.extend(rows)
                offsets = [o for o in offsets if not feed.covers(partition, o)]
                if not offsets:
                    return found, hidden
        wanted = set(offsets)
        offset = offsets[0]
        last = offsets[-1]
        topic = self._topic
        while offset <= last:
            batches = await topic.read(partition, offset)
            if not batches:
                break
            for batch in batches:
                header = peek(batch)  # (`inspect_batch` refuses a marker)
                end = header.next_offset
                if topic.hides(topic.partitions[partition], batch):
                    hidden += [o for o in range(header.base_offset, end) if o in wanted]
                else:
                    for record in read_records(batch, self.max_decompressed):
                        if record.offset in wanted:
                            found.append(record)
                offset = end
        return found, hidden

    def send(
        self, target: Consumer, partition: int, first: int, end: int, batch: bytes, count: int
    ) -> None:
        self.core.sent(target.consumer_id, partition, first, end, time.monotonic())
        self.group.charge(target, end - first)
        target.session.send_delivery(target.consumer_id, partition, batch, count)

    # Partitions added to the topic

    def grow(self, cursors: list[PartitionCursor]) -> None:
        """The topic has new partitions: deliver them from these cursors (their beginning)."""
        self.core.grow(cursors)
        self.group.partitions = len(self._topic.partitions)
        self.persist()
        self._wake.set()

    @property
    def log_topic(self) -> LogTopic:
        return self._topic

    # Introspection

    @property
    def delivered(self) -> int:
        return self.core.delivered

    @property
    def dead_lettered(self) -> int:
        return self.core.dead_lettered

    def info(self) -> SubscriptionInfo:
        return SubscriptionInfo(
            name=self.name,
            sub_type=self.sub_type,
            pending=self.core.backlog([p.next_offset for p in self._topic.partitions]),
            delivered=self.core.delivered,
            dropped=0,
            consumers=self.group.infos(),
            unacked=self.core.unacked,
            dead_lettered=self.core.dead_lettered,
        )


def _takes(target: Consumer, rest: int) -> int:
    """How many records the consumer takes of the `rest` of a batch: its credit, or the whole
    rest when it takes whole batches and has any credit (it is then left below zero, and sent
    nothing more until credit brings it back above)."""
    if target.whole_batches and target.credits > 0:
        return max(target.credits, rest)
    return target.credits
