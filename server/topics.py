"""Topics and partitions, and the non-reliable publish path.

A topic has a fixed number of partitions, each with its next offset, and the subscriptions of its
attached consumers. Non-reliable publish stamps the batch with the partition's next offset and
hands it to every subscription: no disk, no acks, offsets restart at 0 with the server. The batch
stays the producer's bytes throughout; only its first 8 bytes (the base offset) change.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from server.subscription import Subscription
from wire.errors import InvalidPartition
from wire.messages import DescribeTopicResponse, DispatchMode, TopicInfo

_BASE_OFFSET = struct.Struct(">q")


@dataclass(slots=True)
class Partition:
    index: int
    next_offset: int = 0


class Topic:
    def __init__(self, info: TopicInfo) -> None:
        self.info = info
        self.partitions = [Partition(i) for i in range(info.partitions)]
        self.subscriptions: dict[str, Subscription] = {}
        self.messages_in = 0
        self.bytes_in = 0
        self._next_partition = 0

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def dispatch(self) -> DispatchMode:
        return DispatchMode(self.info.dispatch)

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
        """Stamp and fan out a validated batch; returns its base offset."""
        base_offset = partition.next_offset
        partition.next_offset = base_offset + record_count
        stamped = _BASE_OFFSET.pack(base_offset) + batch[8:]
        self.messages_in += record_count
        self.bytes_in += len(batch)
        for subscription in self.subscriptions.values():
            subscription.offer(partition.index, stamped, record_count)
        return base_offset

    def describe(self) -> DescribeTopicResponse:
        return DescribeTopicResponse(
            topic=self.info,
            next_offsets=tuple(p.next_offset for p in self.partitions),
            messages_in=self.messages_in,
            bytes_in=self.bytes_in,
            subscriptions=tuple(s.info() for _, s in sorted(self.subscriptions.items())),
        )
