"""A latency histogram cheap enough for hot paths: fixed bucket bounds, a bisect and two adds.

prometheus_client's `Histogram` takes a lock and walks its buckets on every observation; this one
only counts, and `server.ops.metrics` turns the counts into a Prometheus histogram at scrape time.
Lives in storage (which must not import the server) because the fsync latency is measured here;
`FSYNC_SECONDS` is process-wide, like the disk it measures.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Final

# Seconds: from a page-cache fsync on NVMe (~50 µs) to a disk in trouble (10 s).
LATENCY_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class LatencyHistogram:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bucket (Prometheus's `le`)
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs, the last one "+Inf", as Prometheus exposes them."""
        total = 0
        result: list[tuple[str, int]] = []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            result.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return result

    def merge(self, other: LatencyHistogram) -> None:
        for index, count in enumerate(other.counts):
            self.counts[index] += count
        self.sum += other.sum


# Every fsync the WALs make (segment data, directories, sealing), in seconds.
FSYNC_SECONDS: Final = LatencyHistogram()
