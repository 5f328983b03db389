"""Prometheus metrics of the Kafka listener, read at scrape time.

Registered by `serve` next to the server's collector when the Kafka listener is on (the topics'
own metrics already count what Kafka clients produce and read: it is the same broker). The
counters are `KafkaStats`, bumped by the connections; every metric is listed in
docs/OPERATIONS.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from headwater.server.kafka.apis import SERVED
from headwater.server.kafka.consumer_groups import ConsumerGroups
from headwater.server.kafka.groups import Coordinator
from headwater.server.kafka.share_handlers import ShareHandlers


@dataclass(eq=False)
class KafkaStats:
    requests: dict[int, int] = field(default_factory=dict)  # by api key, those served only
    unsupported: int = 0  # answered UNSUPPORTED_VERSION
    protocol_errors: int = 0  # connections closed for a frame or body that does not decode
    refused: int = 0  # connections closed at accept: max_connections, or waiting to authenticate


class KafkaCollector(Collector):
    def __init__(
        self,
        stats: KafkaStats,
        connections: Callable[[], int],
        coordinator: Coordinator,
        consumer_groups: ConsumerGroups | None = None,
        share: ShareHandlers | None = None,
    ) -> None:
        self._stats = stats
        self._connections = connections
        self._coordinator = coordinator
        self._consumer_groups = consumer_groups
        self._share = share

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "headwater_kafka_connections", "Open connections on the Kafka port",
            value=self._connections(),
        )  # fmt: skip
        requests = CounterMetricFamily(
            "headwater_kafka_requests", "Kafka requests handled, by API", labels=["api"]
        )
        for key, count in sorted(self._stats.requests.items()):
            requests.add_metric([SERVED[key].name], count)
        yield requests
        yield CounterMetricFamily(
            "headwater_kafka_unsupported_requests",
            "Kafka requests of an API or version not served (answered UNSUPPORTED_VERSION)",
            value=self._stats.unsupported,
        )
        yield CounterMetricFamily(
            "headwater_kafka_protocol_errors",
            "Kafka connections closed for a frame or request that does not decode",
            value=self._stats.protocol_errors,
        )
        yield CounterMetricFamily(
            "headwater_kafka_refused_connections",
            "Kafka connections closed at accept (max_connections, or the caps on connections "
            "waiting to authenticate)",
            value=self._stats.refused,
        )
        groups = self._coordinator.groups.values()
        yield GaugeMetricFamily(
            "headwater_kafka_groups", "Kafka consumer groups with members or a rebalance",
            value=len(groups),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "headwater_kafka_group_members", "Members of every Kafka consumer group",
            value=sum(len(g.members) for g in groups),
        )  # fmt: skip
        if self._consumer_groups is not None:
            yield from self._consumer_group_metrics(self._consumer_groups)
        share = self._share
        if share is None:
            return
        # share groups (KIP-932): their records are their Shared subscriptions' (in flight:
        # headwater_subscription_unacked_messages, redelivered, dead_lettered)
        members = sum(len(g.members) for g in share.groups.groups.values())
        yield GaugeMetricFamily(
            "headwater_kafka_share_groups", "Kafka share groups with members (coordinated here)",
            value=len(share.groups.groups),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "headwater_kafka_share_members", "Members of every Kafka share group", value=members
        )
        yield GaugeMetricFamily(
            "headwater_kafka_share_sessions", "Share sessions open on this broker",
            value=len(share.sessions),
        )  # fmt: skip
        acknowledged = CounterMetricFamily(
            "headwater_kafka_share_acknowledged",
            "Records Kafka share consumers acknowledged, by type (accept, release, reject)",
            labels=["type"],
        )
        for kind, count in sorted(share.acknowledged.items()):
            acknowledged.add_metric([kind], count)
        yield acknowledged

    @staticmethod
    def _consumer_group_metrics(groups: ConsumerGroups) -> Iterator[Metric]:
        # Kafka 4's consumer groups (KIP-848), each by name
        members = GaugeMetricFamily(
            "headwater_kafka_consumer_group_members",
            "Members of each consumer group of Kafka 4's protocol (KIP-848)",
            labels=["group"],
        )
        epochs = GaugeMetricFamily(
            "headwater_kafka_consumer_group_epoch",
            "Each KIP-848 consumer group's epoch (bumped by every membership or subscription "
            "change)",
            labels=["group"],
        )
        for name, group in sorted(groups.groups.items()):
            members.add_metric([name], len(group.members))
            epochs.add_metric([name], group.group_epoch)
        yield members
        yield epochs
