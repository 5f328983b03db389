"""Prometheus metrics, made at scrape time from the state the server keeps anyway.

`HeadwaterCollector` is a custom collector on a registry of its own (`make_registry`, with the
process collector): each scrape walks the topics, their partitions' WALs, their subscriptions'
`info()`, the uploader and the connection set, and reads the few counters that exist only for
metrics (`server.net.traffic`: bytes out, redeliveries, latencies; `storage.latency`: fsyncs). So
the message path does no work for metrics beyond one histogram bucket per batch. The scrape runs
on the event loop, synchronously, so it sees one consistent moment; its cost is linear in
topics, partitions and subscriptions (about a millisecond per thousand).

Every metric is listed, with its labels and meaning, in docs/OPERATIONS.md. Counters that come
from per-topic or per-subscription objects restart from zero when those are deleted and
re-created (Prometheus treats that as a counter reset), and WAL appends count since start-up.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from headwater.server.build_info import version
from headwater.server.memory_budget import MAX_MEMORY_PRINCIPALS_SHOWN
from headwater.server.ops.status import ServerState, lag_and_backlog
from headwater.server.subscriptions.reliable_subscription import ReliableSubscription
from headwater.storage.latency import FSYNC_SECONDS, LatencyHistogram
from headwater.wire.messages import DispatchMode, SubscriptionType

if TYPE_CHECKING:
    from headwater.server.topics.topic import Topic

_TOPIC = ["topic"]
_SUBSCRIPTION = ["topic", "subscription", "type"]


def make_registry(state: ServerState) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HeadwaterCollector(state))
    ProcessCollector(registry=registry)
    return registry


def _histogram(family: HistogramMetricFamily, labels: list[str], hist: LatencyHistogram) -> None:
    family.add_metric(labels, hist.cumulative(), hist.sum)


class HeadwaterCollector(Collector):
    def __init__(self, state: ServerState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        state = self._state
        info = GaugeMetricFamily("headwater_info", "Server version", labels=["version"])
        info.add_metric([version()], 1)
        yield info
        yield GaugeMetricFamily(
            "headwater_recovered", "1 once start-up recovery has opened every topic",
            value=int(state.catalog is not None),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "headwater_connections", "Open client connections on the message port",
            value=len(state.listener.connections),
        )  # fmt: skip
        traffic = state.traffic
        yield CounterMetricFamily(
            "headwater_bytes_read",
            "Bytes the message port's connections read (a muted or back-pressured client's "
            "bytes stay in its socket, uncounted)",
            value=traffic.bytes_read,
        )
        produce = HistogramMetricFamily(
            "headwater_produce_latency_seconds",
            "From a PRODUCE frame's handling to its answer (with the fsync wait of acks)",
        )
        _histogram(produce, [], traffic.produce_latency)
        yield produce
        fsyncs = HistogramMetricFamily(
            "headwater_wal_fsync_seconds", "Duration of each WAL fsync (data, directory, seal)"
        )
        _histogram(fsyncs, [], FSYNC_SECONDS)
        yield fsyncs
        yield CounterMetricFamily(
            "headwater_wal_fsyncs", "WAL fsyncs made since start-up", value=FSYNC_SECONDS.count
        )
        lag = HistogramMetricFamily(
            "headwater_event_loop_lag_seconds",
            "How late the event loop's 10 ms timer fired: how long something held the loop",
        )
        _histogram(lag, [], state.listener.shared.loop_lag.histogram)
        yield lag
        yield GaugeMetricFamily(
            "headwater_gc_frozen_objects",
            "Objects start-up built and froze out of Python's cyclic collector (gc.freeze): "
            "full collections do not walk them",
            value=gc.get_freeze_count(),
        )
        memory = state.memory()
        if memory is not None:
            yield GaugeMetricFamily(
                "headwater_memory_budget_bytes",
                "Bytes subscription backlogs may hold in all (memory_max_bytes)",
                value=memory.max_bytes,
            )
            yield GaugeMetricFamily(
                "headwater_memory_used_bytes",
                "Bytes subscription backlogs and connections' unsent output hold now",
                value=memory.used,
            )
            yield CounterMetricFamily(
                "headwater_memory_refused_bytes",
                "Bytes of batches dropped because the memory budget was spent",
                value=memory.refused,
            )
            yield GaugeMetricFamily(
                "headwater_memory_principal_share_bytes",
                "Bytes one authenticated principal may hold (memory_max_bytes_per_principal)",
                value=memory.principal_max_bytes,
            )
            held = GaugeMetricFamily(
                "headwater_memory_principal_used_bytes",
                "Bytes a principal holds: its backlogs and its connections' unsent output "
                f"(the {MAX_MEMORY_PRINCIPALS_SHOWN} holding the most)",
                labels=["principal"],
            )
            for principal, used in memory.largest(MAX_MEMORY_PRINCIPALS_SHOWN):
                held.add_metric([principal], used)
            yield held
            yield CounterMetricFamily(
                "headwater_memory_refused_by_share_bytes",
                "Bytes of batches dropped because their principal's share was spent",
                value=memory.refused_by_share,
            )
        topics = state.topics()
        traffic.prune(topics)
        yield GaugeMetricFamily("headwater_topics", "Topics", value=len(topics))
        yield from self._topics(topics)
        yield from self._subscriptions(topics)
        yield from self._uploads(topics)

    def _topics(self, topics: dict[str, Topic]) -> Iterator[Metric]:
        traffic = self._state.traffic.topics
        partitions = GaugeMetricFamily(
            "headwater_topic_partitions", "Partitions of the topic", labels=["topic", "dispatch"]
        )
        counters = {
            name: CounterMetricFamily(f"headwater_topic_{name}", text, labels=_TOPIC)
            for name, text in (
                ("messages_in", "Messages produced to the topic since start-up"),
                ("bytes_in", "Record-batch bytes produced to the topic since start-up"),
                ("messages_out", "Messages sent to consumers (redeliveries included)"),
                ("bytes_out", "Record-batch bytes sent to consumers (redeliveries included)"),
                ("wal_appends", "Batches appended to the topic's WALs since start-up"),
                ("quarantined", "Damaged WAL ranges found and copied aside"),
                ("read_skipped", "Reads that skipped damaged or missing data"),
            )
        }
        offline = GaugeMetricFamily(
            "headwater_topic_partitions_offline",
            "Partitions whose WAL failed (offline until restart)",
            labels=_TOPIC,
        )
        latency = HistogramMetricFamily(
            "headwater_topic_end_to_end_latency_seconds",
            "From a batch's max timestamp (the producer's clock) to its first delivery",
            labels=_TOPIC,
        )
        for name, topic in topics.items():
            dispatch = DispatchMode(topic.info.dispatch).name.lower().replace("_", "-")
            partitions.add_metric([name, dispatch], len(topic.partitions))
            out = traffic.get(name)
            logs = [p.log for p in topic.partitions] if topic.reliable else []
            values = {
                "messages_in": topic.messages_in,
                "bytes_in": topic.bytes_in,
                "messages_out": out.messages_out if out is not None else 0,
                "bytes_out": out.bytes_out if out is not None else 0,
                "wal_appends": sum(wal.appended for wal in logs),
                "quarantined": sum(wal.quarantined for wal in logs),
                "read_skipped": sum(p.skipped for p in topic.partitions) if topic.reliable else 0,
            }
            for key, family in counters.items():
                family.add_metric([name], values[key])
            offline.add_metric([name], sum(1 for wal in logs if wal.failed is not None))
            _histogram(latency, [name], out.latency if out is not None else LatencyHistogram())
        yield partitions
        yield from counters.values()
        yield offline
        yield latency

    def _subscriptions(self, topics: dict[str, Topic]) -> Iterator[Metric]:
        traffic = self._state.traffic.topics
        gauges = {
            name: GaugeMetricFamily(f"headwater_subscription_{name}", text, labels=_SUBSCRIPTION)
            for name, text in (
                ("lag_messages", "Messages not yet acknowledged (non-reliable: not yet sent)"),
                ("backlog_messages", "Messages not yet delivered to any consumer"),
                ("unacked_messages", "Messages delivered and not yet acknowledged"),
                ("consumers", "Consumers attached"),
                (
                    "stopped_partitions",
                    "Reliable: partitions stopped on a batch that does not decode",
                ),
            )
        }
        counters = {
            name: CounterMetricFamily(f"headwater_subscription_{name}", text, labels=_SUBSCRIPTION)
            for name, text in (
                ("delivered", "Messages delivered, first deliveries and redeliveries"),
                ("redelivered", "Messages delivered again (nack, ack timeout, consumer gone)"),
                ("dead_lettered", "Messages moved to the dead-letter topic"),
                ("dropped", "Messages dropped because the consumers were too slow"),
                ("cursor_write_failures", "Reliable: cursor writes or syncs that failed (retried)"),
                ("dispatch_failures", "Reliable: pump rounds that failed unexpectedly (retried)"),
            )
        }
        for topic_name, topic in topics.items():
            out = traffic.get(topic_name)
            for name, subscription in topic.subscriptions.items():
                info = subscription.info()
                labels = [topic_name, name, SubscriptionType(info.sub_type).name.lower()]
                lag, backlog = lag_and_backlog(info)
                gauges["lag_messages"].add_metric(labels, lag)
                gauges["backlog_messages"].add_metric(labels, backlog)
                gauges["unacked_messages"].add_metric(labels, info.unacked)
                gauges["consumers"].add_metric(labels, len(info.consumers))
                redelivered = out.redelivered.get(name, 0) if out is not None else 0
                counters["delivered"].add_metric(labels, info.delivered)
                counters["redelivered"].add_metric(labels, redelivered)
                counters["dead_lettered"].add_metric(labels, info.dead_lettered)
                counters["dropped"].add_metric(labels, info.dropped)
                if isinstance(subscription, ReliableSubscription):
                    gauges["stopped_partitions"].add_metric(labels, len(subscription.stopped))
                    counters["cursor_write_failures"].add_metric(
                        labels, subscription.cursor_write_failures
                    )
                    counters["dispatch_failures"].add_metric(labels, subscription.dispatch_failures)
        yield from gauges.values()
        yield from counters.values()

    def _uploads(self, topics: dict[str, Topic]) -> Iterator[Metric]:
        catalog = self._state.catalog
        uploader = catalog.uploader if catalog is not None else None
        if uploader is None:
            return  # no object store configured
        yield GaugeMetricFamily(
            "headwater_uploads_pending", "Sealed segments waiting for or being uploaded",
            value=uploader.pending,
        )  # fmt: skip
        yield CounterMetricFamily(
            "headwater_upload_failures", "Upload attempts that failed (each is retried)",
            value=uploader.failures,
        )  # fmt: skip
        segments = GaugeMetricFamily(
            "headwater_uploaded_segments", "Topic segments in the object store", labels=_TOPIC
        )
        size = GaugeMetricFamily(
            "headwater_uploaded_bytes", "Bytes of the topic in the object store", labels=_TOPIC
        )
        lag = GaugeMetricFamily(
            "headwater_upload_lag_messages",
            "Messages stored locally and not yet in the object store (the open segment too)",
            labels=_TOPIC,
        )
        for name, topic in topics.items():
            if not topic.reliable:
                continue
            count = total = behind = 0
            for partition in topic.partitions:
                uploaded = uploader.uploaded(name, partition.index)
                count += len(uploaded)
                total += sum(s.size for s in uploaded)
                end = uploaded[-1].next_offset if uploaded else 0
                local = partition.log.start_offset
                behind += max(partition.next_offset - max(end, local), 0)
            segments.add_metric([name], count)
            size.add_metric([name], total)
            lag.add_metric([name], behind)
        yield segments
        yield size
        yield lag
