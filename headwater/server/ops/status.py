"""What the operator's HTTP port shows: readiness, a ring of recent samples, the status JSON.

`ServerState` is handed the server's parts as start-up makes them (the listener at once, the
catalog once recovery has opened every topic) and only reads them. A sampler task takes a
`Sample` every `SAMPLE_INTERVAL` seconds (cumulative counters per topic, lag per subscription)
into a ring of `SAMPLES` (10 minutes); `/status.json` turns consecutive samples into rates for
the status page's charts. Rings are bounded in topics and subscriptions too (`MAX_SERIES`, the
busiest and the most lagging), so a server with thousands of topics keeps a small history.

Readiness (`/readyz`): recovery has finished and a probe file in the data directory can be
written and fsynced. The probe runs in a thread, at most once a second whatever the request
rate, and is abandoned (503) after `PROBE_TIMEOUT` if the disk hangs.

The HTTP paths are wired in `server.ops.operator_port`.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from headwater.server.build_info import version
from headwater.server.net.stage_trace import StageTrace
from headwater.storage.tasks import end_tasks, spawn
from headwater.wire.messages import DispatchMode, SubscriptionInfo, SubscriptionType

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from headwater.server.catalog.topic_catalog import TopicCatalog
    from headwater.server.memory_budget import MemoryBudget
    from headwater.server.net.listener import Listener
    from headwater.server.net.traffic import TrafficStats
    from headwater.server.topics.topic import Topic


SAMPLE_INTERVAL: Final = 2.0
SAMPLES: Final = 300  # 10 minutes
MAX_SERIES: Final = 20
PROBE_TIMEOUT: Final = 5.0
PROBE_EVERY: Final = 1.0
PROBE_FILE: Final = ".readyz-probe"


def lag_and_backlog(info: SubscriptionInfo) -> tuple[int, int]:
    """(lag, backlog): messages not yet acknowledged (non-reliable: not yet sent), and those
    not yet delivered at all. `pending` counts unacked ones too for reliable subscriptions."""
    return info.pending, max(info.pending - info.unacked, 0)


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # unix time
    connections: int
    # topic -> (messages in, messages out, bytes in, bytes out), cumulative
    topics: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    lag: dict[str, int] = field(default_factory=dict)  # "topic/subscription" -> messages


class ServerState:
    def __init__(self, data_dir: Path, listener: Listener) -> None:
        self.data_dir = data_dir
        self.listener = listener
        self.started = time.time()
        self.catalog: TopicCatalog | None = None  # set once recovery is done
        self.registry: CollectorRegistry | None = None  # /metrics (a cluster adds its collector)
        # the Kafka port's groups (`KafkaListener.groups_status`), when it listens
        self.kafka_groups: Callable[[], list[dict[str, Any]]] | None = None
        self.stopping = False
        self.samples: deque[Sample] = deque(maxlen=SAMPLES)
        self._sampler: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[str | None] | None = None
        self._probed_at = -1e9
        self._probe_result: str | None = "not probed yet"

    @property
    def traffic(self) -> TrafficStats:
        return self.listener.shared.traffic

    def stages(self, every: int | None = None) -> dict[str, object]:
        """GET /debug/stages: the sampled stage times taken since the last call (empty while
        nothing is traced) and the event loop's longest holds (server/net/stage_trace.py,
        server/loop_lag.py); with `every` (`?every=N`), tracing every N-th offset from now on
        (0: none), whatever `trace_every` said at start-up."""
        shared = self.listener.shared
        trace = shared.trace
        events, dropped = trace.take() if trace is not None else ([], 0)
        if every is not None:
            shared.trace = StageTrace(every) if every > 0 else None
        return {
            "every": trace.every if trace is not None else 0,
            "dropped": dropped,
            "fields": ["stage", "topic", "partition", "offset", "ns", "subscription"],
            "events": events,
            "stalls": shared.loop_lag.take_worst(),
        }

    def recovered(self, catalog: TopicCatalog) -> None:
        self.catalog = catalog
        self._sampler = spawn(self._sample_forever(), "status.sampler_failed")

    async def close(self) -> None:
        self.stopping = True
        await end_tasks(self._sampler, self._probe)

    def topics(self) -> dict[str, Topic]:
        return self.catalog.topics if self.catalog is not None else {}

    def memory(self) -> MemoryBudget | None:
        """The memory budget, once the broker exists."""
        broker = self.listener.broker
        return broker.memory if broker is not None else None

    # Readiness

    async def readiness(self) -> str | None:
        """None when ready, else why not."""
        if self.catalog is None:
            return "recovering: the topics are being opened"
        if self.stopping:
            return "shutting down"
        loop = asyncio.get_running_loop()
        if self._probe is None and loop.time() - self._probed_at >= PROBE_EVERY:
            self._probe = spawn(self._run_probe(), "status.probe_failed")
        if self._probe is not None:
            try:
                async with asyncio.timeout(PROBE_TIMEOUT):
                    await asyncio.shield(self._probe)
            except TimeoutError:
                return f"a write to the data directory has not finished in {PROBE_TIMEOUT:g} s"
        return self._probe_result

    async def _run_probe(self) -> str | None:
        try:
            # one small write per PROBE_EVERY at most: asyncio's default executor
            await asyncio.to_thread(_probe_write, self.data_dir / PROBE_FILE)
            self._probe_result = None
        except OSError as exc:
            self._probe_result = f"the data directory is not writable: {exc.strerror or exc}"
        finally:
            self._probed_at = asyncio.get_running_loop().time()
            self._probe = None
        return self._probe_result

    # Samples

    async def _sample_forever(self) -> None:
        while True:
            self.samples.append(self.sample())
            await asyncio.sleep(SAMPLE_INTERVAL)

    def sample(self) -> Sample:
        traffic = self.traffic.topics
        topics: dict[str, tuple[int, int, int, int]] = {}
        lag: dict[str, int] = {}
        for name, topic in self.topics().items():
            out = traffic.get(name)
            topics[name] = (
                topic.messages_in,
                out.messages_out if out is not None else 0,
                topic.bytes_in,
                out.bytes_out if out is not None else 0,
            )
            for subscription_name, subscription in topic.subscriptions.items():
                lag[f"{name}/{subscription_name}"] = lag_and_backlog(subscription.info())[0]
        busiest = sorted(topics, key=lambda n: -(topics[n][0] + topics[n][1]))[:MAX_SERIES]
        lagging = sorted(lag, key=lambda n: -lag[n])[:MAX_SERIES]
        return Sample(
            time.time(),
            len(self.listener.connections),
            {n: topics[n] for n in busiest},
            {n: lag[n] for n in lagging},
        )

    # The status JSON

    def _live_series(self) -> set[str]:
        """The topics and "topic/subscription" names that exist now: the charts drop the
        others (a deleted topic or subscription left its line in the legends for the ring's
        10 minutes)."""
        live: set[str] = set()
        for name, topic in self.topics().items():
            live.add(name)
            live.update(f"{name}/{subscription}" for subscription in topic.subscriptions)
        return live

    def status(self, ready: str | None) -> dict[str, Any]:
        samples = list(self.samples)
        if not samples or time.time() - samples[-1].at > 0.5:
            samples.append(self.sample())  # the page shows now, not up to 2 s ago
        uploader = self.catalog.uploader if self.catalog is not None else None
        return {
            "version": version(),
            "uptime_seconds": round(time.time() - self.started, 1),
            "ready": ready is None,
            "not_ready_reason": ready,
            "connections": len(self.listener.connections),
            "sample_interval_seconds": SAMPLE_INTERVAL,
            "uploads": None
            if uploader is None
            else {"pending": uploader.pending, "failures": uploader.failures},
            "topics": [self._topic_status(t, samples) for _, t in sorted(self.topics().items())],
            "kafka_groups": [] if self.kafka_groups is None else self.kafka_groups(),
            "history": _history(samples, self._live_series()),
        }

    def _topic_status(self, topic: Topic, samples: list[Sample]) -> dict[str, Any]:
        out = self.traffic.topics.get(topic.name)
        rates = _rates(samples[-2:], topic.name) if len(samples) >= 2 else (None, None)
        subscriptions = []
        for name, subscription in sorted(topic.subscriptions.items()):
            info = subscription.info()
            lag, backlog = lag_and_backlog(info)
            subscriptions.append(
                {
                    "name": name,
                    "type": SubscriptionType(info.sub_type).name.lower(),
                    "consumers": len(info.consumers),
                    "lag": lag,
                    "backlog": backlog,
                    "unacked": info.unacked,
                    "delivered": info.delivered,
                    "dead_lettered": info.dead_lettered,
                    "dropped": info.dropped,
                }
            )
        return {
            "name": topic.name,
            "dispatch": DispatchMode(topic.info.dispatch).name.lower().replace("_", "-"),
            "partitions": len(topic.partitions),
            "offline_partitions": sum(1 for p in topic.partitions if p.log.failed is not None)
            if topic.reliable
            else 0,
            "messages_in": topic.messages_in,
            "bytes_in": topic.bytes_in,
            "messages_out": out.messages_out if out is not None else 0,
            "bytes_out": out.bytes_out if out is not None else 0,
            "in_per_second": rates[0],
            "out_per_second": rates[1],
            "subscriptions": subscriptions,
        }


def _rates(pair: list[Sample], topic: str) -> tuple[float | None, float | None]:
    before, after = pair
    old, new = before.topics.get(topic), after.topics.get(topic)
    elapsed = after.at - before.at
    if old is None or new is None or elapsed <= 0:
        return None, None
    # a topic deleted and re-created in between restarts its counters: no negative rates
    return (
        round(max(new[0] - old[0], 0) / elapsed, 1),
        round(max(new[1] - old[1], 0) / elapsed, 1),
    )


def _history(samples: list[Sample], live: set[str]) -> dict[str, Any]:
    """Per-interval rates (one point fewer than samples) and lag, for the charts: the series of
    the topics and subscriptions in `live`, those that exist now."""
    pairs = list(itertools.pairwise(samples))
    topics = sorted({name for sample in samples[1:] for name in sample.topics} & live)
    lagging = sorted({name for sample in samples for name in sample.lag} & live)
    in_rates: dict[str, list[float | None]] = {name: [] for name in topics}
    out_rates: dict[str, list[float | None]] = {name: [] for name in topics}
    for pair in pairs:
        for name in topics:
            rate_in, rate_out = _rates(list(pair), name)
            in_rates[name].append(rate_in)
            out_rates[name].append(rate_out)
    return {
        "time": [round(s.at, 3) for _, s in pairs],
        "in_per_second": in_rates,
        "out_per_second": out_rates,
        "lag_time": [round(s.at, 3) for s in samples],
        "lag": {name: [s.lag.get(name) for s in samples] for name in lagging},
        "connections": [s.connections for s in samples],
    }


def _probe_write(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, b"ready?\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    path.unlink()
