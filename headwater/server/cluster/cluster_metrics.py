"""Prometheus metrics of a cluster broker, from `ClusterMode.status()` at scrape time.

Registered by `serve` next to the server's collector only in cluster mode, so a single broker's
/metrics is unchanged. Every metric is listed in docs/OPERATIONS.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_COUNTERS = {
    "acquisitions": "Partitions this broker took over (acquire succeeded)",
    "acquire_failures": "Take-overs that failed (the key is given back, retried with backoff)",
    "releases": "Partitions handed off gracefully",
    "losses": "Partitions lost without a hand-off (fenced, or the topic deleted)",
    "fencings": "Times this broker stopped serving because its lease was not confirmed in time",
    "lease_failures": "Lease renewals that failed",
}


class ClusterCollector(Collector):
    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        status = self._status()
        lease = status["lease"]
        serving = [p for p in status["partitions"] if p["state"] == "serving"]
        yield GaugeMetricFamily(
            "headwater_cluster_brokers",
            "Live brokers this broker sees",
            value=len(status["brokers"]),
        )
        yield GaugeMetricFamily(
            "headwater_cluster_partitions_served", "Partitions this broker serves now",
            value=len(serving),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "headwater_cluster_serving_seconds",
            "How long this broker may serve without another confirmed lease renewal (0: fenced)",
            value=lease["serving_for"],
        )
        yield GaugeMetricFamily(
            "headwater_cluster_etcd_reachable", "1 when the last etcd call succeeded",
            value=int(bool(status["etcd"]["reachable"])),
        )  # fmt: skip
        for name, help_text in _COUNTERS.items():
            yield CounterMetricFamily(
                f"headwater_cluster_{name}", help_text, value=status["counters"].get(name, 0)
            )
        yield CounterMetricFamily(
            "headwater_cluster_tail_chunks",
            "Cloud-tail objects written (each acknowledges the batches of one commit window)",
            value=status.get("chunks", 0),
        )
        yield CounterMetricFamily(
            "headwater_cluster_tail_put_failures", "Cloud-tail PUTs that failed (each retried)",
            value=status.get("chunk_failures", 0),
        )  # fmt: skip
        yield CounterMetricFamily(
            "headwater_cluster_checkpoint_failures",
            "Subscription cursor checkpoints to etcd that failed (each retried the next round)",
            value=status.get("checkpoint_failures", 0),
        )
        takeovers = CounterMetricFamily(
            "headwater_cluster_takeovers",
            "Partitions taken over, by whether the local log was rebuilt from the object store",
            labels=["local_log"],
        )
        takeovers.add_metric(["rebuilt"], status.get("rebuilt", 0))
        takeovers.add_metric(["kept"], status.get("kept", 0))
        yield takeovers
        yield CounterMetricFamily(
            "headwater_cluster_producer_tables_rebuilt",
            "Idempotent-producer tables rebuilt from the object store after a take-over",
            value=status.get("producer_tables_rebuilt", 0),
        )
        yield CounterMetricFamily(
            "headwater_cluster_producer_id_blocks",
            "Blocks of producer ids this broker took from etcd",
            value=status.get("producer_id_blocks", 0),
        )
