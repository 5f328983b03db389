"""A stand-in consumer session for tests that drive a subscription in-process: always writable,
every delivery queued for the test to take."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from headwater.durables.cursor import PartitionCursor
from headwater.durables.delivery import ReliableSettings
from headwater.server.subscriptions.append_signal import AppendSignal
from headwater.server.subscriptions.reliable_subscription import ReliableSubscription
from headwater.server.topics.subscription_contract import Consumer
from headwater.server.topics.topic import LogTopic
from headwater.storage.state import StateWriter
from headwater.wire.messages import Backoff, SubscriptionType
from headwater.wire.records import Record


@dataclass
class Delivery:
    consumer_id: int
    partition: int
    batch: bytes
    delivery_count: int


@dataclass
class QueueSession:
    """The `ConsumerSession` a consumer receives on: always writable, deliveries queued."""

    deliveries: asyncio.Queue[Delivery] = field(default_factory=asyncio.Queue)
    consumers: dict[int, Consumer] = field(default_factory=dict)
    peer: str = "test"

    @property
    def writable(self) -> bool:
        return True

    def send_delivery(
        self, consumer_id: int, partition: int, batch: bytes, delivery_count: int = 1
    ) -> None:
        self.deliveries.put_nowait(Delivery(consumer_id, partition, batch, delivery_count))

    def send_consumer_closed(self, consumer_id: int, code: int, message: str) -> None:
        raise AssertionError(f"consumer {consumer_id} closed: {code} {message}")

    def send_messages_dropped(self, consumer_id: int, count: int) -> None:
        raise AssertionError(f"consumer {consumer_id}: {count} messages dropped")


async def no_dead_letters(partition: int, record: Record, count: int) -> None:
    raise AssertionError(f"dead-lettered {partition}/{record.offset}")


def exclusive_subscription(
    topic: LogTopic, writer: StateWriter, start: int, ack_timeout_ms: int
) -> tuple[ReliableSubscription, Consumer, QueueSession]:
    """A started Exclusive subscription "sub" on the topic's partition 0, woken by the real
    `AppendSignal`, its cursor at `start`; and a consumer with 10,000 credits on a
    `QueueSession`, not yet attached."""
    signal = AppendSignal()
    topic.partitions[0].log.add_append_listener(signal.fire)
    subscription = ReliableSubscription(
        topic,
        "sub",
        SubscriptionType.EXCLUSIVE,
        ReliableSettings(ack_timeout_ms, 0, Backoff.FIXED, 1_000, 60_000),
        [PartitionCursor.starting_at(start)],
        writer,
        no_dead_letters,
        signal,
    )
    session = QueueSession()
    consumer = Consumer(1, "consumer", 0, session, subscription, credits=10_000)
    session.consumers[consumer.consumer_id] = consumer
    subscription.start()
    return subscription, consumer, session
