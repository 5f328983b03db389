"""A stand-in consumer session for tests that drive a subscription in-process: always writable,
every delivery queued for the test to take."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from headwater.server.topics.subscription_contract import Consumer
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
