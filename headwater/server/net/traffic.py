"""Traffic counters that exist nowhere else in the server: what went out, and how late.

Topics count what comes in (`Topic.messages_in`, `bytes_in`) and subscriptions what they hand
out, but nothing knew the bytes sent per topic, redeliveries, or latencies. The connection calls
`delivered` once per DELIVER push (a batch, never a record) and `produced` once per PRODUCE
answer, so the cost is a dict lookup, a header read and a bisect per batch. `server.ops.metrics`
reads these at scrape time; topics that no longer exist are pruned there (`prune`).

End-to-end latency is the time from the batch's max timestamp (set by the producer, so it
includes producer linger and assumes clocks in step) to the moment its first delivery is
written to the consumer's socket; redeliveries are not sampled (their lateness is the ack
timeout's, not the pipeline's).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from headwater.storage.latency import LatencyHistogram
from headwater.wire.messages import ProduceResponse

if TYPE_CHECKING:
    from headwater.server.topics.subscription_contract import Consumer

# RecordBatch v2 header: maxTimestamp at byte 35, recordCount at byte 57 (of 61).
_MAX_TIMESTAMP = struct.Struct(">q")
_RECORD_COUNT = struct.Struct(">i")
_HEADER_SIZE = 61


@dataclass(slots=True)
class TopicTraffic:
    messages_out: int = 0
    bytes_out: int = 0
    redelivered: dict[str, int] = field(default_factory=dict)  # subscription -> messages
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)


@dataclass(slots=True)
class TrafficStats:
    topics: dict[str, TopicTraffic] = field(default_factory=dict)
    produce_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    bytes_read: int = 0  # every byte the native port's connections read

    def delivered(self, consumer: Consumer | None, batch: bytes, delivery_count: int) -> None:
        if consumer is None or len(batch) < _HEADER_SIZE:
            return
        subscription = consumer.subscription
        stats = self.topics.get(subscription.topic)
        if stats is None:
            stats = self.topics[subscription.topic] = TopicTraffic()
        count = _RECORD_COUNT.unpack_from(batch, 57)[0]
        stats.messages_out += count
        stats.bytes_out += len(batch)
        if delivery_count > 1:
            name = subscription.name
            stats.redelivered[name] = stats.redelivered.get(name, 0) + count
        else:
            late_ms = time.time() * 1000 - _MAX_TIMESTAMP.unpack_from(batch, 35)[0]
            stats.latency.observe(max(late_ms, 0.0) / 1000)

    def produced(self, started: float | None, response: object) -> None:
        """A request answered: if it was a PRODUCE (made durable as its topic's fsync policy
        says), `started`, the `time.perf_counter()` when its frame began to be handled, dates it."""
        if started is not None and type(response) is ProduceResponse:
            self.produce_latency.observe(time.perf_counter() - started)

    def prune(self, live_topics: Collection[str]) -> None:
        for name in [name for name in self.topics if name not in live_topics]:
            del self.topics[name]
