"""Topics and partitions: the non-reliable publish path and the reliable append path.

Two classes, one per dispatch mode: `MemoryTopic` (non-reliable) and `LogTopic` (reliable, one
`PartitionLog` per partition); `Topic` is either, told apart by `reliable` (a literal, so the
type checker narrows on it). Both answer `accept`, the produce path's one call.

A topic has a fixed number of partitions and the subscriptions on it. Non-reliable publish stamps
the batch with the partition's next in-memory offset and hands it to every subscription: no disk,
no acks, offsets restart at 0 with the server. Reliable append writes the batch to the partition's
WAL, which assigns the offset; subscriptions read from there at their own pace, and a partition's
history older than the local WAL is read back from the object store (`archive`).

Reads get past damage rather than stopping at it, through the one read path every reader of the
log takes (`storage.log_reader`): offsets a damaged local batch hides are read from the object
store's copy when it has one, else skipped (an error log and the partition's `skipped` counter);
an object missing from the store is skipped the same way, and the replay goes on with the next
object or the local WAL. `describe` reports, as `status.*` entries after the
topic's configs, each offline partition with its reason and the damage counters.

An append on the event loop never writes the offset lease itself (an fsync, `storage.offsets`):
`when_leased` runs it at once when the lease covers it, else once the partition's syncer has
extended the lease in its pool. A partition's later appends through `when_leased` queue behind one
that waits (`LogPartition.lease_line`), so a producer's pipelined batches keep their order, and
the check-then-append of an append (a map set's expected revisions, an idempotent producer's
sequence) still runs with no await between the two: it is the `go` that runs once the lease is
there.
"""

from __future__ import annotations

import asyncio
import bisect
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

import structlog

from headwater.durables.lastvalue import KeyedBatch
from headwater.durables.partition_transactions import Closed, Opened, PartitionTransactions
from headwater.durables.producers import ProducerTable
from headwater.server.config import TopicSettings
from headwater.server.reply import AfterWork, Reply
from headwater.server.topics.committed_feed import CommittedFeed
from headwater.server.topics.lastvalue_index import LastValueIndex
from headwater.server.topics.subscription_registry import SubscriptionRegistry
from headwater.storage.log_reader import Archive, Walked, read_partition
from headwater.storage.segments import SparseIndex, batch_location
from headwater.storage.wal import PartitionLog
from headwater.wire.errors import InvalidPartition, StorageError
from headwater.wire.markers import BatchHeader, Marker, is_transactional, marker_type, peek
from headwater.wire.messages import ConfigEntry, DescribeTopicResponse, TopicInfo
from headwater.wire.records import read_records

__all__ = ["Archive", "LogTopic", "MemoryTopic", "Topic"]

log = structlog.get_logger(__name__)

_BASE_OFFSET = struct.Struct(">q")
_MAX_SEGMENT_STEPS: Final = 10_000_000  # bounds a timestamp search's walk over segments


@dataclass(slots=True)
class MemoryPartition:
    index: int
    next_offset: int = 0  # offsets restart at 0 with the server
    producers: ProducerTable = field(default_factory=ProducerTable)
    producers_ready: asyncio.Future[None] | None = None  # (never set: nothing to rebuild)
    producers_found: asyncio.Future[None] | None = None


@dataclass(slots=True)
class LogPartition:
    index: int
    log: PartitionLog
    producers: ProducerTable = field(default_factory=ProducerTable)
    # in a cluster, pending while a new owner rebuilds `producers` from the object store:
    # idempotent produces to the partition wait for it (server.requests.broker)
    producers_ready: asyncio.Future[None] | None = None
    # meanwhile, done (and replaced) each time the rebuild, reading the newest part of the log
    # first, added batches to `producers`: a produce it may now answer looks again
    producers_found: asyncio.Future[None] | None = None
    skipped: int = 0  # reads that had to skip damaged or missing data
    # ranges below the local WAL a read found nothing readable in, where the next read goes on
    walked: Walked = field(default_factory=Walked)
    # the last append queued for the offset lease (`LogTopic.when_leased`): later ones queue
    # behind it, so appends keep their order
    lease_line: asyncio.Future[None] | None = None
    # open and aborted transactions, the last stable offset (docs/TRANSACTIONS.md)
    transactions: PartitionTransactions = field(default_factory=PartitionTransactions)

    @property
    def next_offset(self) -> int:
        return self.log.next_offset

    def forget_lost_producer_batches(self) -> None:
        """Idempotent-producer entries pointing at or past the end of the data recovery found
        describe batches a crash took away: forget them, so the producer's retry is appended
        again (at a new offset) instead of being answered with the offset of a lost batch."""
        end = self.log.data_end
        for entry in self.producers.producers.values():
            while entry.recent and entry.recent[-1][2] >= end:
                entry.recent.pop()


class _TopicBase:
    def __init__(self, info: TopicInfo) -> None:
        self.info = info
        self.subscriptions = SubscriptionRegistry()
        self.messages_in = 0
        self.bytes_in = 0
        self._next_partition = 0

    @property
    def name(self) -> str:
        return self.info.name

    def _pick(self, requested: int, count: int) -> int:
        """`requested` -1 lets the server choose, round-robin per batch."""
        if requested == -1:
            index = self._next_partition
            self._next_partition = (index + 1) % count
            return index
        if not 0 <= requested < count:
            raise InvalidPartition(
                f"topic {self.name!r} has partitions 0..{count - 1}, not {requested}"
            )
        return requested


class MemoryTopic(_TopicBase):
    """Non-reliable: publish stamps a batch with the partition's next in-memory offset and hands
    it to every subscription; nothing is kept."""

    reliable: Literal[False] = False
    settings: None = None
    last_value: None = None

    def __init__(self, info: TopicInfo) -> None:
        super().__init__(info)
        self.partitions = [MemoryPartition(i) for i in range(info.partitions)]

    def pick_partition(self, requested: int) -> MemoryPartition:
        return self.partitions[self._pick(requested, len(self.partitions))]

    def accept(
        self, partition: MemoryPartition, batch: bytes, record_count: int, committed: bool
    ) -> tuple[int, Awaitable[None] | None]:
        """Stamp and fan out a validated batch: (base offset, nothing to wait for)."""
        base_offset = partition.next_offset
        partition.next_offset = base_offset + record_count
        stamped = stamped_batch(batch, base_offset)
        self.messages_in += record_count
        self.bytes_in += len(batch)
        for subscription in self.subscriptions.live.values():
            subscription.offer(partition.index, stamped, record_count)
        return base_offset, None

    def start_offset(self, partition: int) -> int:
        return self.partitions[partition].next_offset

    def describe(self) -> DescribeTopicResponse:
        return _describe(self, self.info)

    async def close(self, seal: bool = False) -> None:
        """Nothing to close: a memory topic holds no files."""


class Durability(Protocol):
    """What the answer to an append waits for, and how far readers may read: the seam through
    which a cluster makes the object store, not the local fsync, the point of durability."""

    def commit(
        self,
        topic: str,
        partition: LogPartition,
        base_offset: int,
        batch: bytes,
        record_count: int,
        sequence: int,
        committed: bool,
    ) -> Awaitable[None] | None: ...

    def readable_end(self, topic: str, partition: LogPartition, committed: bool) -> int: ...


class LocalDurability:
    """A single broker's: the fsync, when the topic's policy (or `committed`: a producer's
    fsynced isolation) asks for one; readers read what is visible (or fsynced, for
    `committed`)."""

    def commit(
        self,
        topic: str,
        partition: LogPartition,
        base_offset: int,
        batch: bytes,
        record_count: int,
        sequence: int,
        committed: bool,
    ) -> Awaitable[None] | None:
        wal = partition.log
        if wal.must_wait(sequence, committed):
            return wal.wait_durable(sequence)
        return None

    def readable_end(self, topic: str, partition: LogPartition, committed: bool) -> int:
        wal = partition.log
        return wal.durable_offset if committed else wal.visible_offset


LOCAL_DURABILITY: Final = LocalDurability()


def stamped_batch(batch: bytes, base_offset: int) -> bytes:
    """The batch as stored: its base offset field set to `base_offset` (one copy of the batch:
    `pack(...) + batch[8:]` made two, which for an 8 MiB batch cost milliseconds of the loop)."""
    with memoryview(batch) as view:
        return b"".join((_BASE_OFFSET.pack(base_offset), view[8:]))


TransactionListener = Callable[
    ["LogTopic", LogPartition, Opened | Closed, BatchHeader], "asyncio.Future[None] | None"
]


class LogTopic(_TopicBase):
    """Reliable: append writes a batch to the partition's WAL, which assigns the offset."""

    reliable: Literal[True] = True

    def __init__(
        self,
        info: TopicInfo,
        settings: TopicSettings,
        logs: list[PartitionLog],
        archive: Archive | None = None,
        durable: Durability | None = None,
    ) -> None:
        super().__init__(info)
        self.settings = settings
        self.archive = archive
        self.partitions = [LogPartition(i, logs[i]) for i in range(info.partitions)]
        self.last_value: LastValueIndex | None = None
        # what an append's answer waits for and where readers may read up to: the WAL's fsync,
        # or in a cluster the object store (the placement's, `server.topics.placement`)
        self.durable: Durability = durable or LOCAL_DURABILITY
        # per partition, the start a Kafka DeleteRecords moved it to (kept in the state store)
        self.deleted_below: dict[int, int] = {}
        # told each change of a partition's transactions, to persist it (the catalog's)
        self.on_transaction: TransactionListener | None = None
        # a committed transaction's batches, for the subscriptions fed batches as they pass
        self.committed_feed = CommittedFeed(
            info.name, self.read, lambda: self.subscriptions.live.values()
        )

    def pick_partition(self, requested: int) -> LogPartition:
        return self.partitions[self._pick(requested, len(self.partitions))]

    @staticmethod
    def when_leased(counts: Sequence[tuple[LogPartition, int]], go: Callable[[], Reply]) -> Reply:
        """`go()` (appends of n records to each (partition, n) of `counts`, and its answer) now if
        every partition's lease covers them and no append waits there for it; else, as an
        `AfterWork`, once the lease is extended off the loop and the appends queued before this
        one are done (the module doc)."""
        if all(p.lease_line is None and p.log.lease_covers(n) for p, n in counts):
            return go()
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        previous = [p.lease_line for p, _ in counts if p.lease_line is not None]
        for partition, _ in counts:
            partition.lease_line = mine
        return AfterWork(_when_leased(counts, previous, mine, go))

    def accept(
        self, partition: LogPartition, batch: bytes, record_count: int, committed: bool
    ) -> tuple[int, Awaitable[None] | None]:
        """Append, and say what the producer's answer waits for: the fsync, when the topic's
        policy (or `committed`: a producer's fsynced isolation) asks for one."""
        base_offset, sequence = self.append(partition, batch, record_count)
        return base_offset, self.durability(
            partition, base_offset, batch, record_count, sequence, committed
        )

    def durability(
        self,
        partition: LogPartition,
        base_offset: int,
        batch: bytes,
        record_count: int,
        sequence: int,
        committed: bool = False,
    ) -> Awaitable[None] | None:
        """What the answer to an append waits for (`Durability.commit`)."""
        return self.durable.commit(
            self.name, partition, base_offset, batch, record_count, sequence, committed
        )

    def append(
        self,
        partition: LogPartition,
        batch: bytes,
        record_count: int,
        keyed: KeyedBatch | None = None,
    ) -> tuple[int, int]:
        """Write a validated batch to the WAL; returns (base offset, durability sequence).

        With last-value state, every record's key is checked first (a bad one refuses the whole
        batch, before anything is written), and the state follows the append at once. A caller
        that built the batch from keys it checked itself (a map set) passes them as `keyed`, so
        the batch is not decoded again.
        """
        index = self.last_value
        header = peek(batch) if is_transactional(batch) else None
        if index is not None and keyed is None and (header is None or not header.control):
            records = read_records(batch)  # (a marker has no keys: the broker wrote it)
            keyed = KeyedBatch.of_records(records, index.check(records, partition.index))
        base_offset, sequence = partition.log.append(batch, record_count)
        self.messages_in += record_count
        self.bytes_in += len(batch)
        if header is not None:
            self._follow_transaction(partition, header, batch, base_offset, record_count, keyed)
            return base_offset, sequence
        live = self.subscriptions.live
        if live:  # subscriptions that keep nothing see the batch as it passes
            stamped = stamped_batch(batch, base_offset)
            for subscription in live.values():
                subscription.offer(partition.index, stamped, record_count)
        if index is not None and keyed is not None:
            views = self.subscriptions.views
            changes = index.apply(partition.index, base_offset, keyed, notify=bool(views))
            for view in list(views.values()):
                view.changed(changes)
        return base_offset, sequence

    def _follow_transaction(
        self,
        partition: LogPartition,
        found: BatchHeader,
        batch: bytes,
        base_offset: int,
        record_count: int,
        keyed: KeyedBatch | None,
    ) -> None:
        """A transactional batch or a marker was appended: the partition's transactions follow
        it. Its records are neither values nor passing batches until its transaction commits:
        the last-value state holds them and applies them at the COMMIT marker, and the
        subscriptions that see batches as they pass are offered them then (`CommittedFeed`);
        an abort drops them, and a marker is neither, ever (docs/DURABLES.md)."""
        producer = found.producer_id
        header = BatchHeader(
            base_offset,
            base_offset + record_count,
            producer,
            found.producer_epoch,
            found.transactional,
            found.control,
        )
        marker = marker_type(batch) if header.control else None
        change = partition.transactions.appended(header, marker)
        if header.control:
            partition.producers.fence(producer, header.producer_epoch)
        if change is not None and self.on_transaction is not None:
            self.on_transaction(self, partition, change, header)
        index = self.last_value
        if index is not None and marker is None and keyed is not None:
            index.hold(partition.index, producer, base_offset, keyed)
        elif index is not None and marker is not None:
            views = self.subscriptions.views
            changes = index.end_transaction(
                partition.index, producer, base_offset, marker == Marker.COMMIT, bool(views)
            )
            for view in list(views.values()):
                view.changed(changes)
        if marker == Marker.COMMIT and isinstance(change, Closed) and self.subscriptions.live:
            self.committed_feed.committed(
                partition.index, producer, change.first_offset, base_offset
            )

    def stable_end(self, partition: LogPartition, committed: bool = False) -> int:
        """The last stable offset: the readable end, or the first offset of the oldest
        transaction still open in the partition if that is lower. Below it every transactional
        batch's fate is written; transaction-aware readers read no further."""
        return partition.transactions.stable_end(self.readable_end(partition, committed))

    def hides(self, partition: LogPartition, batch: bytes) -> bool:
        """Whether a transaction-aware reader skips a stored batch: a marker, or a batch of an
        aborted transaction."""
        return is_transactional(batch) and partition.transactions.hides(peek(batch))

    def empty_read_is_a_gap(self, partition: int, offset: int) -> bool:
        """Whether a read at `offset` that found no batch says no batch is stored from `offset`
        on (a restart's lease gap at the end of the log), so a reader may step to the end: when
        the read went on into the local WAL. Below it the read walks the object store, and an
        empty answer there is a walk cut short at the archive's `walk_limit`, with batches after
        it (`walk_goes_on`)."""
        holder = self.partitions[partition]
        return holder.walked.past(offset)[1] >= holder.log.start_offset

    def walk_goes_on(self, partition: int, offset: int) -> bool:
        """Whether a read at `offset` that found no batch was a walk over missing objects cut
        short below the local WAL (`storage.log_reader.Walked`): the next read at `offset` goes
        on where it stopped. A reader reads again (nothing is skipped, and nothing is appended
        to wake it)."""
        holder = self.partitions[partition]
        return offset < holder.walked.past(offset)[1] < holder.log.start_offset

    def readable_end(self, partition: LogPartition, committed: bool) -> int:
        """Where subscriptions may read up to: what is visible (or fsynced, for `committed`);
        in a cluster, only what is in the object store, so no consumer ever acks an offset a
        take-over could give to another message."""
        return self.durable.readable_end(self.name, partition, committed)

    def start_offset(self, partition: int) -> int:
        """The oldest offset still stored for `partition`, in the object store or locally."""
        log = self.partitions[partition].log
        archived = self.archive.start_offset(self.name, partition) if self.archive else None
        stored = min(log.start_offset, archived) if archived is not None else log.start_offset
        return max(stored, self.deleted_below.get(partition, stored))

    async def read(self, partition: int, offset: int) -> list[bytes]:
        """Reliable: batches from the one holding `offset` (local WAL, else the object store),
        over damage as every reader of the log reads (`storage.log_reader`). The first batch
        may start above `offset` when damage or missing data was skipped."""
        holder = self.partitions[partition]
        return await read_partition(
            holder.log, self.archive, self.name, partition, offset, holder, holder.walked
        )

    async def offset_for_timestamp(self, partition: int, timestamp: int) -> int:
        """The first offset of the first batch whose max timestamp is at or after `timestamp`
        (the end when none is). Segment by segment, archived history then the local WAL: each
        segment's sparse index holds the greatest timestamp before each entry, so the scan of a
        segment starts at its last entry with only older batches before it: a segment holding
        nothing that recent costs one read from its last index entry, not a read of it all."""
        wal = self.partitions[partition].log
        offset = self.start_offset(partition)
        for _ in range(_MAX_SEGMENT_STEPS):
            if offset >= self.partitions[partition].next_offset:
                break
            located = await self._segment_index(partition, offset)
            if located is None:  # a gap in the archive, or between it and the local WAL
                following = None
                if self.archive is not None:
                    following = self.archive.next_after(self.name, partition, offset)
                if following is None or following > wal.start_offset:
                    following = wal.start_offset
                offset = max(offset + 1, following)
                continue
            segment_end, index = located
            start = offset
            for entry in index:
                if entry.max_timestamp >= timestamp:
                    break
                start = max(start, entry.offset)
            batches = await self.read(partition, start)
            if not batches:
                offset = max(segment_end, start + 1)
                continue
            for batch in batches:  # all of them: a read may run on into the next segment
                found = batch_location(batch, 0)
                if found.max_timestamp >= timestamp:
                    return max(found.base_offset, start)
                start = max(start, found.next_offset)
            offset = max(start, offset + 1)
        return self.partitions[partition].next_offset

    async def _segment_index(self, partition: int, offset: int) -> tuple[int, SparseIndex] | None:
        """(end offset, sparse index) of the segment holding `offset`, local or archived."""
        wal = self.partitions[partition].log
        if offset < wal.start_offset:
            if self.archive is None:
                return None
            return await self.archive.segment_index(self.name, partition, offset)
        segments = wal._segments  # read only: the WAL has no public list of its segments
        position = bisect.bisect_right([s.base_offset for s in segments], offset) - 1
        segment = segments[max(position, 0)]
        if offset >= segment.next_offset:  # past a cut: the read steps to the next segment
            following = position + 1 < len(segments)
            return (segments[position + 1].base_offset if following else offset + 1), SparseIndex()
        return segment.next_offset, segment.index.copy()  # the active one grows meanwhile

    def describe(self) -> DescribeTopicResponse:
        return _describe(self, self._info_with_status())

    async def close(self, seal: bool = False) -> None:
        """Close every partition's log (sealing the active segment if `seal`)."""
        await self.committed_feed.close()
        for partition in self.partitions:
            await partition.log.close(seal_active=seal)

    def _info_with_status(self) -> TopicInfo:
        """The topic's info, with `status.*` entries for storage trouble (none when healthy)."""
        status: list[ConfigEntry] = []
        for partition in self.partitions:
            wal = partition.log
            prefix = f"status.partition.{partition.index}"
            if wal.failed is not None:
                status.append(ConfigEntry(f"{prefix}.offline", wal.failed))
            if wal.quarantined:
                status.append(ConfigEntry(f"{prefix}.quarantined", str(wal.quarantined)))
            if partition.skipped:
                status.append(ConfigEntry(f"{prefix}.skipped", str(partition.skipped)))
        if not status:
            return self.info
        return TopicInfo(
            self.info.name, self.info.partitions, self.info.dispatch, (*self.info.configs, *status)
        )


Topic = MemoryTopic | LogTopic


def _describe(topic: Topic, info: TopicInfo) -> DescribeTopicResponse:
    return DescribeTopicResponse(
        topic=info,
        next_offsets=tuple(p.next_offset for p in topic.partitions),
        start_offsets=tuple(topic.start_offset(p.index) for p in topic.partitions),
        messages_in=topic.messages_in,
        bytes_in=topic.bytes_in,
        subscriptions=tuple(s.info() for _, s in sorted(topic.subscriptions.items())),
    )


# An append is checked against the lease again after each wait: another append (one that did not
# queue, a dead letter's) may have taken the offsets meanwhile. Bounded, as a lease that cannot
# keep up after this many extensions is a disk that cannot write.
LEASE_ATTEMPTS: Final = 8


async def _when_leased(
    counts: Sequence[tuple[LogPartition, int]],
    previous: list[asyncio.Future[None]],
    mine: asyncio.Future[None],
    go: Callable[[], Reply],
) -> Reply:
    try:
        if previous:
            await asyncio.wait(previous)  # (never cancels them: they are not ours)
        for _ in range(LEASE_ATTEMPTS):
            behind = [p.log.lease_wait(n) for p, n in counts if not p.log.lease_covers(n)]
            if not behind:
                return go()  # covered: checked and appended with no await between
            for wait in behind:
                await wait
        raise StorageError("the offset lease could not keep up with the appends: retry")
    finally:
        mine.set_result(None)
        for partition, _ in counts:
            if partition.lease_line is mine:
                partition.lease_line = None
