"""Topics and partitions: the non-reliable publish path and the reliable append path.

A topic has a fixed number of partitions and the subscriptions on it. Non-reliable publish stamps
the batch with the partition's next in-memory offset and hands it to every subscription: no disk,
no acks, offsets restart at 0 with the server. Reliable append writes the batch to the partition's
WAL, which assigns the offset; subscriptions read from there at their own pace, and a partition's
history older than the local WAL is read back from the object store (`archive`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Protocol

from durables.lastvalue import LastValueIndex
from durables.producers import ProducerTable
from server.config import TopicSettings
from server.registry import SubscriptionRegistry
from storage.segments import batch_location
from storage.wal import PartitionLog
from wire.errors import InvalidPartition
from wire.messages import DescribeTopicResponse, DispatchMode, TopicInfo
from wire.records import read_records

_BASE_OFFSET = struct.Struct(">q")


class Archive(Protocol):
    """Segments that left the local WAL for the object store."""

    def start_offset(self, topic: str, partition: int) -> int | None: ...

    async def read(self, topic: str, partition: int, offset: int) -> list[bytes]: ...


@dataclass(slots=True)
class Partition:
    index: int
    log: PartitionLog | None = None
    _next_offset: int = 0  # non-reliable only
    producers: ProducerTable = field(default_factory=ProducerTable)

    @property
    def next_offset(self) -> int:
        return self.log.next_offset if self.log is not None else self._next_offset


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
        """Reliable: batches from the one holding `offset` (local WAL, else the object store)."""
        log = self.partitions[partition].log
        assert log is not None
        if offset >= log.start_offset or self.archive is None:
            return await log.read(offset)
        return await self.archive.read(self.name, partition, offset)

    async def offset_for_timestamp(self, partition: int, timestamp: int) -> int:
        """The first offset of the first batch whose max timestamp is at or after `timestamp`:
        archived history first (read in order, so linear in its size), then the local WAL."""
        log = self.partitions[partition].log
        assert log is not None
        offset = self.start_offset(partition)
        while self.archive is not None and offset < log.start_offset:
            batches = await self.archive.read(self.name, partition, offset)
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
            topic=self.info,
            next_offsets=tuple(p.next_offset for p in self.partitions),
            start_offsets=tuple(self.start_offset(p.index) for p in self.partitions),
            messages_in=self.messages_in,
            bytes_in=self.bytes_in,
            subscriptions=tuple(s.info() for _, s in sorted(self.subscriptions.items())),
        )
