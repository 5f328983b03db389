"""How long the event loop is kept from its timers: the measure of "no client can stall the others".

A timer is set every `TICK`; how late it fires is how long something held the loop (a request's
handling, a task's step, a scrape) plus any time the process was not scheduled at all. The
loop's own CPU time between two ticks tells these apart: the hold is the smaller of the two, so a
machine busy with other processes does not look like a request that holds the loop. Every hold
goes into a histogram (/metrics `headwater_event_loop_lag_seconds`), and one over `STALL` is
logged (`loop.stalled`, with the milliseconds held and late): no request, authenticated or not,
should hold the loop that long (docs/PROTOCOL.md, "Limits"). A hundred wake-ups a second cost a
few microseconds each.

Garbage collection is the one cause the loop cannot see from its callbacks: a collection runs in
whichever thread allocates past the threshold and holds the interpreter meanwhile. `gc.callbacks`
time every collection, so each hold says how much of it was collecting and the oldest generation
collected. The `WORST` longest holds since the last `take_worst` (GET /debug/stages) are kept with
those figures: where a tail latency's milliseconds went.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import time
from typing import Any, Final

import structlog

from headwater.storage.latency import LatencyHistogram

log = structlog.get_logger(__name__)

TICK: Final = 0.01
STALL: Final = 0.05
WORST: Final = 20


class LoopLag:
    def __init__(self) -> None:
        self.histogram = LatencyHistogram()
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._cpu = 0.0  # the loop thread's CPU time at the last tick
        # collections since the last tick: their time, the oldest generation; one in progress
        self._gc_ns = 0
        self._gc_generation = -1
        self._gc_started = 0
        # (held, unix time, late, gc seconds, generation): a min-heap of the longest holds
        self._worst: list[tuple[float, float, float, float, int]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._cpu = time.thread_time()
        self._due = loop.time() + TICK
        self._handle = loop.call_at(self._due, self._tick)
        gc.callbacks.append(self._collecting)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._collecting in gc.callbacks:
            gc.callbacks.remove(self._collecting)

    def _collecting(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter_ns()
        elif self._gc_started:
            self._gc_ns += time.perf_counter_ns() - self._gc_started
            self._gc_generation = max(self._gc_generation, info["generation"])
            self._gc_started = 0

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        cpu = time.thread_time()
        late = max(0.0, now - self._due)
        held = min(late, cpu - self._cpu)
        self._cpu = cpu
        collected, generation = self._gc_ns / 1e9, self._gc_generation
        self._gc_ns, self._gc_generation = 0, -1
        self.histogram.observe(held)
        if held > STALL:
            log.warning(
                "loop.stalled",
                ms=round(held * 1000, 1),
                late_ms=round(late * 1000, 1),
                gc_ms=round(collected * 1000, 1),
                gc_generation=generation,
            )
        if len(self._worst) < WORST:
            heapq.heappush(self._worst, (held, time.time(), late, collected, generation))
        elif held > self._worst[0][0]:
            heapq.heapreplace(self._worst, (held, time.time(), late, collected, generation))
        self._due = now + TICK
        self._handle = loop.call_at(self._due, self._tick)

    def take_worst(self) -> list[dict[str, float | int]]:
        """The longest holds since the last call, longest first: when (unix time), milliseconds
        held and late, milliseconds collecting garbage within them and the oldest generation
        collected (-1: none)."""
        worst, self._worst = sorted(self._worst, reverse=True), []
        return [
            {
                "at": round(at, 3),
                "held_ms": round(held * 1000, 2),
                "late_ms": round(late * 1000, 2),
                "gc_ms": round(collected * 1000, 2),
                "gc_generation": generation,
            }
            for held, at, late, collected, generation in worst
        ]
