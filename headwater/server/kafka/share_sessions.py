"""Share sessions (KIP-932): a share group member's records, acquired from the group's Shared
subscription on each topic and acknowledged back to it.

A share group G on topic T is the Shared subscription named G on T (docs/KAFKA.md, Share
groups), so a member is one more consumer of it. Each member's share session on this broker (a
ShareFetch with session epoch 0 opens it) holds one `Consumer` per topic, attached to the topic's
subscription like a native Shared consumer, whose connection is the session's `Inbox`: what the
subscription's pump sends it is kept there until a ShareFetch takes it. A member pulls where a
native consumer is pushed to, so it has credit only while a ShareFetch waits: the fetch grants
`MaxRecords` of credit, waits up to `MaxWaitMs` for the first delivery, and takes the credit back
before answering. Records that arrive after that (a delivery already under way) are in the inbox
for the next fetch; their lock runs from when they were sent.

The record lock is the delivery's ack timeout; acknowledgements go to the subscription's delivery
core: ACCEPT acks, RELEASE nacks (delivered again after the subscription's backoff, as a native
nack without a delay), REJECT sends the record to the dead-letter topic at once
(`ReliableDelivery.reject`). GAP is what a client answers for an acquired offset it found no
record at: it acks an offset that holds none (a transaction marker's, or a batch of no records:
the inbox notes those `holes` as it receives them), and is a RELEASE, logged, for an offset that
holds a record (the client dropped a record it was sent: acking it would lose it). Only records
in flight to this member can be acknowledged (`ReliableDelivery.held_by`): a range holding any
other (never acquired, acquired by another member, or whose lock expired) is INVALID_RECORD_STATE
(121) for its partition, and none of that range is applied.

A session is closed by a request with epoch -1 (after its acknowledgements are applied), by a
new one opened with epoch 0, when the connection of its latest request closes (as Kafka's share
session cache drops a closed connection's sessions: nothing more can be acknowledged through it,
and a client that connects again opens a new one; a session kept until its lock expired held its
records from the others for the lock, and 10,000 dropped connections left 10,000 sessions and
consumers), and a few seconds after the member leaves the group or expires
(`share_handlers.LEAVE_GRACE`: a client's final acknowledgements may come after its leave, and
are applied; meanwhile the session acquires nothing more): its consumers are detached, and what
they held is delivered again at once, as for a native consumer that leaves.

A share member's consumer takes whole batches (`Consumer.whole_batches`): a fetch's `MaxRecords`
is exceeded to end at a batch boundary, as ShareFetch allows, rather than the subscription cutting
(decoding and re-encoding) each stored batch to the 500 records librdkafka asks for. The records
acquired are then the batch's, and its AcquiredRecords range is the batch's offsets.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Final

import structlog

from headwater.server.subscriptions.reliable_subscription import ReliableSubscription
from headwater.server.topics.subscription_contract import Consumer
from headwater.wire.limits import MAX_CREDITS
from headwater.wire.markers import peek
from headwater.wire.messages import AckEntry, AckRange
from headwater.wire.records import BATCH_HEADER

log = structlog.get_logger(__name__)

ACCEPT: Final = 1
RELEASE: Final = 2
REJECT: Final = 3
GAP: Final = 0
RENEW: Final = 4  # KIP-1222 (ShareFetch v2): not served at v1


@dataclass(frozen=True, slots=True)
class Delivery:
    """A batch the subscription sent a session: offsets [first, last], `count`: its delivery
    number (the records' delivery count)."""

    topic: str
    partition: int
    batch: bytes
    first: int
    last: int
    count: int


class Inbox:
    """The `ConsumerSession` a share session's consumers deliver to: a list, taken by fetches."""

    def __init__(self, peer: str, principal: str) -> None:
        self.consumers: dict[int, Consumer] = {}
        self.peer = peer
        self._principal = principal
        self.deliveries: list[Delivery] = []
        self.arrived = asyncio.Event()
        # (topic, partition) -> offsets sent here that hold no record (a GAP acks those only)
        self.holes: dict[tuple[str, int], set[int]] = {}

    @property
    def principal(self) -> str:
        return self._principal

    @property
    def writable(self) -> bool:
        return True

    def send_delivery(
        self, consumer_id: int, partition: int, batch: bytes, delivery_count: int = 1
    ) -> None:
        consumer = self.consumers.get(consumer_id)
        if consumer is None:
            return
        header = peek(batch)
        topic = consumer.subscription.topic
        if header.control or not BATCH_HEADER.unpack_from(batch, 0)[12]:  # no record in it
            holes = self.holes.setdefault((topic, partition), set())
            holes.update(range(header.base_offset, header.next_offset))
        self.deliveries.append(
            Delivery(
                topic, partition, batch, header.base_offset, header.next_offset - 1, delivery_count
            )
        )
        self.arrived.set()

    def send_consumer_closed(self, consumer_id: int, code: int, message: str) -> None:
        """The subscription was deleted: the member's fetches find no consumer for the topic."""
        self.consumers.pop(consumer_id, None)

    def send_messages_dropped(self, consumer_id: int, count: int) -> None:
        """Never: a reliable subscription drops nothing."""


@dataclass(eq=False, slots=True)
class ShareSession:
    group: str
    member_id: str
    inbox: Inbox
    connection: object  # the Kafka connection of its latest request: its close closes the session
    epoch: int = 0  # the epoch the member's next request carries (once answered)
    partitions: set[tuple[str, int]] = field(default_factory=set)
    consumers: dict[str, Consumer] = field(default_factory=dict)  # by topic
    # set when the member left the group: the session's close, unless its final request comes first
    leaving: asyncio.TimerHandle | None = None


@dataclass(frozen=True, slots=True)
class Acknowledgement:
    """One batch of acknowledgements: offsets [first, last] of a partition, and either one type
    for them all or one per offset."""

    partition: int
    first: int
    last: int
    types: tuple[int, ...]


def ack_error(
    subscription: ReliableSubscription, consumer: Consumer, batches: list[Acknowledgement]
) -> str | None:
    """Why these acknowledgements cannot be applied (None: they can): each range must be in
    flight to `consumer`, and its types known and fitting it."""
    core = subscription.core
    previous = -1
    for batch in batches:
        if batch.first > batch.last or batch.first <= previous:
            return f"acknowledgement ranges must ascend: {batch.first}-{batch.last}"
        previous = batch.last
        size = batch.last - batch.first + 1
        if len(batch.types) not in (1, size):
            return f"{len(batch.types)} acknowledge types for {size} offsets"
        if any(t not in (GAP, ACCEPT, RELEASE, REJECT) for t in batch.types):
            return f"unknown acknowledge type in {list(batch.types)[:8]}"
        if not core.held_by(consumer.consumer_id, batch.partition, batch.first, batch.last + 1):
            return (
                f"offsets {batch.first}-{batch.last} of partition {batch.partition} are not "
                "acquired by this member"
            )
    return None


def apply(
    subscription: ReliableSubscription,
    consumer: Consumer,
    batches: list[Acknowledgement],
    holes: set[int],
) -> dict[str, int]:
    """Apply acknowledgements `ack_error` passed: accepted acked, released nacked, rejected
    dead-lettered; a gap acked where the partition's `holes` say no record is (and taken out of
    them), released elsewhere. How many of each."""
    accepted: list[AckRange] = []
    released: list[AckEntry] = []
    rejected: list[AckEntry] = []
    refused_gaps: list[int] = []
    for batch in batches:
        types = batch.types
        for offset in range(batch.first, batch.last + 1):
            kind = types[0] if len(types) == 1 else types[offset - batch.first]
            if kind == GAP:
                if offset in holes:
                    holes.discard(offset)
                    kind = ACCEPT
                else:
                    refused_gaps.append(offset)
                    kind = RELEASE
            if kind == ACCEPT:
                if accepted and accepted[-1].partition == batch.partition:
                    last = accepted[-1]
                    if last.first_offset + last.count == offset:
                        accepted[-1] = AckRange(batch.partition, last.first_offset, last.count + 1)
                        continue
                accepted.append(AckRange(batch.partition, offset, 1))
            elif kind == RELEASE:
                released.append(AckEntry(batch.partition, offset))
            else:
                rejected.append(AckEntry(batch.partition, offset))
    if refused_gaps:
        log.warning(
            "kafka.share_gap_released",
            topic=subscription.topic,
            subscription=subscription.name,
            partition=batches[0].partition,
            count=len(refused_gaps),
            first=refused_gaps[0],
            last=refused_gaps[-1],
        )
    if accepted:
        subscription.ack_ranges(consumer, accepted)
    if released:
        subscription.nack(consumer, released, 0)  # 0: after the subscription's backoff
    if rejected:
        subscription.reject(rejected)
    return {
        "accept": sum(r.count for r in accepted),
        "release": len(released),
        "reject": len(rejected),
    }


def grant(consumer: Consumer, credits: int) -> None:
    """Give the consumer exactly `credits` (it has none between fetches)."""
    subscription = consumer.subscription
    assert isinstance(subscription, ReliableSubscription)
    subscription.grant(consumer, min(credits, MAX_CREDITS) - consumer.credits)


def take_back(consumer: Consumer) -> None:
    """Leave the consumer no credit: the subscription sends it nothing until the next fetch. A
    redelivery read back while the credit was taken is sent whole and leaves it below zero:
    that is forgiven too, or the next fetch's grant would not bring it above zero."""
    subscription = consumer.subscription
    if consumer.credits and isinstance(subscription, ReliableSubscription):
        subscription.group.charge(consumer, consumer.credits)
