"""How long the event loop is kept from its timers: the measure of "no client can stall the others".

A timer is set every `TICK`; how late it fires is how long something held the loop (a request's
handling, a task's step, a scrape) plus any time the process was not scheduled at all. The
loop's own CPU time between two ticks tells these apart: the hold is the smaller of the two, so a
machine busy with other processes does not look like a request that holds the loop. Every hold
goes into a histogram (/metrics `headwater_event_loop_lag_seconds`), and one over `STALL` is
logged (`loop.stalled`, with the milliseconds held and late): no request, authenticated or not,
should hold the loop that long (docs/PROTOCOL.md, "Limits"). A hundred wake-ups a second cost a
few microseconds each.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

import structlog

from headwater.storage.latency import LatencyHistogram

log = structlog.get_logger("headwater.server")

TICK: Final = 0.01
STALL: Final = 0.05


class LoopLag:
    def __init__(self) -> None:
        self.histogram = LatencyHistogram()
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._cpu = 0.0  # the loop thread's CPU time at the last tick

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._cpu = time.thread_time()
        self._due = loop.time() + TICK
        self._handle = loop.call_at(self._due, self._tick)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        cpu = time.thread_time()
        late = max(0.0, now - self._due)
        held = min(late, cpu - self._cpu)
        self._cpu = cpu
        self.histogram.observe(held)
        if held > STALL:
            log.warning("loop.stalled", ms=round(held * 1000, 1), late_ms=round(late * 1000, 1))
        self._due = now + TICK
        self._handle = loop.call_at(self._due, self._tick)
