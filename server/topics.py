"""Topics and partitions: the non-reliable publish path and the reliable append path.

A topic has a fixed number of partitions and the subscriptions on it. Non-reliable publish stamps
the batch with the partition's next in-memory offset and hands it to every subscription: no disk,
no acks, offsets restart at 0 with the server. Reliable append writes the batch to the partition's
WAL, which assigns the offset; subscriptions read from there at their own pace, and a partition's
history older than the local WAL is read back from the object store (`archive`).

Reads get past damage rather than stopping at it: offsets a damaged local batch hides are read
from the object store's copy when it has one, else skipped (an error log and the partition's
`skipped` counter); an object missing from the store is skipped the same way, and the replay goes
on with the next object or the local WAL. `describe` reports, as `status.*` entries after the
topic's configs, each offline partition with its reason and the damage counters.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final, Protocol

import structlog

from durables.lastvalue import LastValueIndex
from durables.producers import ProducerTable
from server.config import TopicSettings
from server.registry import SubscriptionRegistry
from storage.segments import batch_location
from storage.wal import PartitionLog
from wire.errors import InvalidPartition, ObjectNotFound, StorageError
from wire.messages import ConfigEntry, DescribeTopicResponse, DispatchMode, TopicInfo
from wire.records import read_records

log = structlog.get_logger("headwater.topics")

_BASE_OFFSET = struct.Struct(">q")
_MAX_ARCHIVE_SKIPS: Final = 10_000  # bounds one read's walk over missing objects


class Archive(Protocol):
    """Segments that left the local WAL for the object store."""

    def start_offset(self, topic: str, partition: int) -> int | None: ...

    def covers(self, topic: str, partition: int, offset: int) -> bool: ...

    def next_after(self, topic: str, partition: int, offset: int) -> int | None: ...

    async def read(self, topic: str, partition: int, offset: int) -> list[bytes]: ...


@dataclass(slots=True)
class Partition:
    index: int
    log: PartitionLog | None = None
    _next_offset: int = 0  # non-reliable only
    producers: ProducerTable = field(default_factory=ProducerTable)
    skipped: int = 0  # reads that had to skip damaged or missing data

    @property
    def next_offset(self) -> int:
        return self.log.next_offset if self.log is not None else self._next_offset

    def forget_lost_producer_batches(self) -> None:
        """Idempotent-producer entries pointing at or past the end of the data recovery found
        describe batches a crash took away: forget them, so the producer's retry is appended
        again (at a new offset) instead of being answered with the offset of a lost batch."""
        if self.log is None:
            return
        end = self.log.data_end
        for entry in self.producers.producers.values():
            while entry.recent and entry.recent[-1][2] >= end:
                entry.recent.pop()


class Topic:
    def __init__(
        self,
        info: TopicInfo,
        settings: TopicSettings | None = None,
        logs: list[PartitionLog] | None = None,
        archive: Archive | None = None,
    ) -> None:
        self.info = info
        self.settings = settings
        self.archive = archive
        self.partitions = [
            Partition(i, logs[i] if logs is not None else None) for i in range(info.partitions)
        ]
        self.subscriptions = SubscriptionRegistry()
        self.last_value: LastValueIndex | None = None
        self.messages_in = 0
        self.bytes_in = 0
        self._next_partition = 0

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def reliable(self) -> bool:
        return self.info.dispatch == DispatchMode.RELIABLE

    def pick_partition(self, requested: int) -> Partition:
        """`requested` -1 lets the server choose, round-robin per batch."""
        if requested == -1:
            index = self._next_partition
            self._next_partition = (index + 1) % len(self.partitions)
            return self.partitions[index]
        if not 0 <= requested < len(self.partitions):
            raise InvalidPartition(
                f"topic {self.name!r} has partitions 0..{len(self.partitions) - 1}, not {requested}"
            )
        return self.partitions[requested]

    def publish(self, partition: Partition, batch: bytes, record_count: int) -> int:
        """Non-reliable: stamp and fan out a validated batch; returns its base offset."""
        base_offset = partition._next_offset
        partition._next_offset = base_offset + record_count
        stamped = _BASE_OFFSET.pack(base_offset) + batch[8:]
        self.messages_in += record_count
        self.bytes_in += len(batch)
        for subscription in self.subscriptions.live.values():
            subscription.offer(partition.index, stamped, record_count)
        return base_offset

    def append(self, partition: Partition, batch: bytes, record_count: int) -> tuple[int, int]:
        """Reliable: write a validated batch to the WAL; returns (base offset, durability seq).

        With last-value state, every record's key is checked first (a bad one refuses the whole
        batch, before anything is written), and the state follows the append at once.
        """
        assert partition.log is not None
        index = self.last_value
        if index is not None:
            records = read_records(batch)
            keys = index.check(records, partition.index)
        base_offset, sequence = partition.log.append(batch, record_count)
        self.messages_in += record_count
        self.bytes_in += len(batch)
        live = self.subscriptions.live
        if live:  # subscriptions that keep nothing see the batch as it passes
            stamped = _BASE_OFFSET.pack(base_offset) + batch[8:]
            for subscription in live.values():
                subscription.offer(partition.index, stamped, record_count)
        if index is not None:
            changes = index.apply(partition.index, base_offset, records, keys)
            for view in list(self.subscriptions.views.values()):
                view.changed(changes)
        return base_offset, sequence

    def start_offset(self, partition: int) -> int:
        """The oldest offset still stored for `partition`, in the object store or locally."""
        log = self.partitions[partition].log
        if log is None:
            return self.partitions[partition].next_offset
        archived = self.archive.start_offset(self.name, partition) if self.archive else None
        return min(log.start_offset, archived) if archived is not None else log.start_offset

    async def read(self, partition: int, offset: int) -> list[bytes]:
        """Reliable: batches from the one holding `offset` (local WAL, else the object store).
        The first batch may start above `offset` when damage or missing data was skipped."""
        wal = self.partitions[partition].log
        assert wal is not None
        archive = self.archive
        for _ in range(_MAX_ARCHIVE_SKIPS):
            if offset >= wal.start_offset or archive is None:
                return await self._read_local(partition, offset)
            batches: list[bytes] | None
            try:
                batches = await archive.read(self.name, partition, offset)
            except ObjectNotFound as exc:
                self._skip(partition, offset, "object missing from the object store", exc)
                batches = None
            if batches:
                return batches
            if batches is not None and archive.covers(self.name, partition, offset):
                self._skip(partition, offset, "no valid batch left in the archived segment", None)
            following = archive.next_after(self.name, partition, offset)
            following = wal.start_offset if following is None else following
            offset = max(offset + 1, min(following, wal.start_offset))
        return []

    async def _read_local(self, partition: int, offset: int) -> list[bytes]:
        wal = self.partitions[partition].log
        assert wal is not None
        result = await wal.read_span(offset)
        if not result.damaged:
            return result.batches
        if self.archive is not None and self.archive.covers(self.name, partition, offset):
            try:
                copy = await self.archive.read(self.name, partition, offset)
            except StorageError as exc:
                log.warning("topic.archive_copy_unreadable", topic=self.name, error=str(exc))
                copy = []
            if copy:
                log.warning(
                    "topic.damage_read_from_archive",
                    topic=self.name,
                    partition=partition,
                    offset=offset,
                )
                return copy
        self._skip(partition, offset, "damaged local data and no intact copy", None)
        return result.batches

    def _skip(self, partition: int, offset: int, reason: str, error: Exception | None) -> None:
        self.partitions[partition].skipped += 1
        log.error(
            "topic.data_skipped",
            topic=self.name,
            partition=partition,
            offset=offset,
            reason=reason,
            error=str(error) if error is not None else None,
        )

    async def offset_for_timestamp(self, partition: int, timestamp: int) -> int:
        """The first offset of the first batch whose max timestamp is at or after `timestamp`:
        archived history first (read in order, so linear in its size), then the local WAL."""
        log = self.partitions[partition].log
        assert log is not None
        offset = self.start_offset(partition)
        while self.archive is not None and offset < log.start_offset:
            batches = await self.read(partition, offset)
            if not batches:
                break
            for batch in batches:
                found = batch_location(batch, 0)
                if found.max_timestamp >= timestamp:
                    return max(found.base_offset, offset)
                offset = found.next_offset
        return await log.offset_for_timestamp(timestamp)

    def describe(self) -> DescribeTopicResponse:
        return DescribeTopicResponse(
            topic=self._info_with_status(),
            next_offsets=tuple(p.next_offset for p in self.partitions),
            start_offsets=tuple(self.start_offset(p.index) for p in self.partitions),
            messages_in=self.messages_in,
            bytes_in=self.bytes_in,
            subscriptions=tuple(s.info() for _, s in sorted(self.subscriptions.items())),
        )

    def _info_with_status(self) -> TopicInfo:
        """The topic's info, with `status.*` entries for storage trouble (none when healthy)."""
        status: list[ConfigEntry] = []
        for partition in self.partitions:
            wal = partition.log
            if wal is None:
                continue
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
