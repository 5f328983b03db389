"""The server's log on a disk that fails: a line that cannot be written is dropped and counted,
never raised into the code that logged (a commit's retries on a full disk raised OSError from a
log call, and the commit was never answered: tests/test_transaction_disk_full.py end to end).
Real parts: a `LossyPrintLogger` over a real file on a file system that fills (/dev/full)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from headwater.server.logs import LossyPrintLogger


def test_a_line_the_log_cannot_take_is_dropped_and_counted() -> None:
    full = open("/dev/full", "w")  # noqa: SIM115  # every write: ENOSPC
    try:
        logger = LossyPrintLogger(full)
        logger.info("transactions.marker_retry")  # no OSError
        logger.error("transactions.end_failed")
        assert LossyPrintLogger.lost >= 2
    finally:
        with contextlib.suppress(OSError):  # (its buffer cannot be flushed either)
            full.close()
    written = io.StringIO()
    LossyPrintLogger(written).info("server.listening")
    assert written.getvalue().splitlines()[0].startswith("log.lines_lost count=")
    assert written.getvalue().splitlines()[1] == "server.listening"
    assert LossyPrintLogger.lost == 0


def test_a_closed_stream_drops_the_line(tmp_path: Path) -> None:
    stream = (tmp_path / "log").open("w")
    stream.close()
    LossyPrintLogger(stream).warning("cluster.fenced")  # ValueError: closed file
    assert LossyPrintLogger.lost == 1
    LossyPrintLogger.lost = 0
