"""structlog setup: dotted event names with key/value fields, to stderr, as text or JSON lines.

A line that cannot be written (a full disk under the log) is dropped and counted, never raised
into the code that logged (`LossyPrintLogger`).

`ProtocolErrorLog` keeps a flood of bad frames from flooding the log: a connection's first bad
frame is logged (at most `burst` such lines per `interval` across the server, since an attacker
can open a connection per bad frame), every other one is only counted, and the counts go out as
one summary line per `interval` while they keep coming.
"""

from __future__ import annotations

import logging
import sys
from typing import Final

import structlog

LOG_FORMATS: Final = ("console", "json")
LOG_LEVELS: Final = ("debug", "info", "warning", "error")


def configure_logging(log_format: str = "console", level: str = "info") -> None:
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log_format must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    if level not in LOG_LEVELS:
        raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}, not {level!r}")
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if log_format == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=_factory,
        cache_logger_on_first_use=True,
    )


class LossyPrintLogger(structlog.PrintLogger):
    """A line that cannot be written (the log's disk full, or failing) is dropped and counted,
    and the count is written with the next line that can be. Raising it instead raised in
    whatever code logged: a commit's marker retries on a full disk ended in an OSError, and
    its answer, which logs too, was never sent (the client timed out)."""

    lost = 0  # lines dropped since the last one written (all loggers: one stream)

    def msg(self, message: str) -> None:
        try:
            if LossyPrintLogger.lost:
                super().msg(f"log.lines_lost count={LossyPrintLogger.lost} (could not be written)")
                LossyPrintLogger.lost = 0
            super().msg(message)
        except (OSError, ValueError):  # (ValueError: the stream was closed)
            LossyPrintLogger.lost += 1

    log = debug = info = warn = warning = err = error = critical = exception = fatal = msg


def _factory(*args: object) -> LossyPrintLogger:
    return LossyPrintLogger(sys.stderr)


class ProtocolErrorLog:
    """Rate-limited logging of the protocol errors clients cause (bad frames, timeouts)."""

    def __init__(self, interval: float = 10.0, burst: int = 20) -> None:
        self._log = structlog.get_logger(__name__)
        self._interval = interval
        self._burst = burst
        self._window_start = 0.0
        self._logged = 0
        self._suppressed = 0
        self._suppressed_peers: set[str] = set()

    def note(self, now: float, peer: str, first: bool, event: str, **fields: object) -> None:
        """Log `event` if it is the connection's first and the burst allows, else count it."""
        self.tick(now)
        if first and self._logged < self._burst:
            self._logged += 1
            self._log.info(event, peer=peer, **fields)
            return
        self._suppressed += 1
        if len(self._suppressed_peers) < 1000:  # a count, not a list, past that
            self._suppressed_peers.add(peer)

    def tick(self, now: float) -> None:
        """Close the window once `interval` has passed, with a summary if anything was counted."""
        if now - self._window_start < self._interval:
            return
        if self._suppressed:
            self._log.info(
                "conn.protocol_errors_suppressed",
                count=self._suppressed,
                connections=len(self._suppressed_peers),
                seconds=self._interval,
            )
        self._window_start = now
        self._logged = 0
        self._suppressed = 0
        self._suppressed_peers.clear()
