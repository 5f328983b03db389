"""The contract between a topic and its subscriptions, and the consumer they deliver to.

A topic holds subscriptions of three kinds, live (`server.subscriptions.live_subscription`:
non-reliable, keeps a bounded backlog), reliable (`server.subscriptions.reliable_subscription`:
reads the WAL, acks, redelivery) and last-value (`server.topics.lastvalue_index`: the current value
per key), and calls each through `SubscriptionKind` without knowing which it holds. What differs is
said by data, not by class:

- `feed`: what an append hands it as it passes (`Feed.BATCHES`: the stamped batch, through
  `offer`; `Feed.CHANGES`: the last-value changes, through `changed`; `Feed.NOTHING`: a reliable
  subscription reads the WAL at its own pace and is woken by the topic's append signal);
- `persistent`: it outlives its consumers (and so can be seeked); the others end with their
  last consumer;
- `durable`: the durable kind it was made as (what a later SUBSCRIBE of the same name must match).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from headwater.durables.lastvalue import StoredValue
from headwater.wire.messages import AckEntry, AckRange, Durable, SubscriptionInfo, SubscriptionType


class Feed(enum.IntEnum):
    NOTHING = 0
    BATCHES = 1
    CHANGES = 2


class ConsumerSession(Protocol):
    """The client connection a consumer belongs to and receives on."""

    consumers: dict[int, Consumer]
    peer: str

    @property
    def principal(self) -> str:
        """Who authenticated on the connection ("" without authentication)."""
        ...

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
    subscription: SubscriptionKind
    credits: int = 0
    partitions: frozenset[int] | None = None  # the partitions it chose; None: every one
    # takes whole batches: the batch its credit reaches into is sent whole, past the credit (a
    # Kafka share member: ShareFetch's MaxRecords "can be exceeded for alignment of batch
    # boundaries"), rather than cut (decoded and rebuilt) to fit it
    whole_batches: bool = False

    @property
    def sort_key(self) -> tuple[int, str, int]:
        return (self.priority, self.name, self.consumer_id)


class SubscriptionKind(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def topic(self) -> str: ...

    @property
    def sub_type(self) -> SubscriptionType: ...

    @property
    def durable(self) -> Durable: ...

    @property
    def persistent(self) -> bool: ...

    @property
    def feed(self) -> Feed: ...

    @property
    def consumers(self) -> Mapping[int, Consumer]: ...

    def attach(self, consumer: Consumer) -> None:
        """Add a consumer (raises ConsumerBusy when the kind admits no more)."""

    def detach(self, consumer: Consumer) -> None: ...

    def grant(self, consumer: Consumer, credits: int) -> None: ...

    def drain(self) -> None:
        """Send what consumers can take now."""

    def ack(self, consumer: Consumer, entries: Sequence[AckEntry], kind: int) -> None: ...

    def ack_ranges(self, consumer: Consumer, ranges: Sequence[AckRange]) -> None:
        """Each offset of each range acknowledged individually (ACK_RANGES)."""

    def nack(self, consumer: Consumer, entries: Sequence[AckEntry], delay_ms: int) -> None: ...

    def offer(self, partition: int, batch: bytes, count: int) -> None:
        """An appended batch, stamped with its base offset (`Feed.BATCHES` only)."""

    def changed(self, changes: Sequence[StoredValue]) -> None:
        """Last values an append changed (`Feed.CHANGES` only)."""

    def seek(self, offsets: list[int]) -> None:
        """Start every partition again at the given offset (`persistent` only)."""

    async def close(self) -> None: ...

    def info(self) -> SubscriptionInfo: ...
