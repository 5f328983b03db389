"""`headwater compact`: run the Spark compaction job once, or every so often, in the foreground.

The object store comes from the same configuration as `headwater serve` (`--config`,
`--data-dir`). Nothing of the server or of Spark is imported until the command runs, and Spark
itself only starts when there are new segments to read, so a cron run with nothing to do is quick.
Progress goes to stderr, and only when stderr is a terminal; the summary goes to stdout, as text
or (`--format json`) one JSON object per run.

Exit status: 0 when every run succeeded (corrupt batches are skipped, counted and reported on
stderr; they do not fail a run), 1 when a run failed (a `--topic` with nothing in the object
store fails it), 2 for bad usage or configuration. With
`--every`, a failed run is reported and the schedule goes on; the status is that of the last run.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)?")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def add_parser(commands: Any) -> None:
    compact = commands.add_parser(
        "compact", help="compact the WAL in the object store into per-key snapshots (Spark)"
    )
    compact.add_argument("--config", type=Path, help="the server's TOML configuration file")
    compact.add_argument("--data-dir", type=Path, help="the server's data directory")
    compact.add_argument(
        "--topic", action="append", default=[], help="a topic to compact (repeatable; default all)"
    )
    compact.add_argument("--master", default="local[*]", help="Spark master (default %(default)s)")
    compact.add_argument("--every", metavar="DURATION", help="run on a schedule, e.g. 10m")
    compact.add_argument(
        "--retention",
        default="1h",
        metavar="DURATION",
        help="how long a superseded snapshot stays readable (default %(default)s)",
    )
    compact.add_argument(
        "--delta-ratio",
        type=float,
        default=0.25,
        metavar="FRACTION",
        help="write only the changed keys (a delta layer) while a partition's deltas hold at most "
        "this fraction of its full snapshot's keys; 0: always a full snapshot "
        "(default %(default)s)",
    )
    # default SUPPRESS: a global `--format` before the command applies (headwater/cli/main.py: text)
    compact.add_argument(
        "--format",
        choices=["text", "json"],
        default=argparse.SUPPRESS,
        help="report format (default text)",
    )
    compact.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting"
    )


class UsageError(ValueError):
    pass


def parse_duration(text: str) -> float:
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise UsageError(f"invalid duration {text!r} (e.g. 30s, 10m, 2h, 1d)")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def _settings(args: argparse.Namespace) -> Any:
    from headwater.server.config import ServerConfig
    from headwater.server.config_file import ConfigError, load_config, with_overrides
    from headwater.spark_compaction.job import CompactionSettings
    from headwater.spark_compaction.store import StoreSpec
    from headwater.wire.errors import InvalidTopicName
    from headwater.wire.names import check_topic_name

    try:
        config = load_config(args.config) if args.config else ServerConfig()
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    config = with_overrides(config, data_dir=args.data_dir)
    settings = config.object_store
    if settings.backend == "local":
        spec = StoreSpec.local(settings.path or config.data_dir / "objects")
        if not Path(spec.path).is_dir():
            raise UsageError(f"object store directory {spec.path} does not exist")
    elif settings.backend == "s3":
        if not settings.bucket:
            raise UsageError("object_store.bucket is required for s3")
        spec = StoreSpec(
            "s3",
            bucket=settings.bucket,
            prefix=settings.prefix,
            endpoint_url=settings.endpoint_url,
            region=settings.region,
        )
    else:
        raise UsageError(
            f"object_store.backend is {settings.backend!r}: compaction needs local or s3"
        )
    for topic in args.topic:
        try:
            check_topic_name(topic)
        except InvalidTopicName as exc:
            raise UsageError(str(exc)) from None
    retention = parse_duration(args.retention)
    if not 0 <= args.delta_ratio <= 1:  # NaN fails both
        raise UsageError(f"--delta-ratio takes a fraction from 0 to 1, not {args.delta_ratio}")
    return CompactionSettings(spec, tuple(args.topic), retention, delta_ratio=args.delta_ratio)


def _spark_conf(pairs: list[str]) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"--conf takes KEY=VALUE, not {pair!r}")
        conf[name.strip()] = value
    return conf


def run_compact(args: argparse.Namespace) -> int:
    try:
        settings = _settings(args)
        every = parse_duration(args.every) if args.every else None
        if every is not None and every <= 0:
            raise UsageError("--every must be positive")
        conf = _spark_conf(args.conf)
    except UsageError as exc:
        print(f"headwater: error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    if every is not None:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    runner = _Runner(settings, args.master, conf, args.format)
    try:
        while True:
            status = runner.once()
            if every is None or stop.wait(every):
                return status
    except KeyboardInterrupt:
        return 130 if every is None else runner.last_status
    finally:
        runner.close()


class _Runner:
    def __init__(self, settings: Any, master: str, conf: dict[str, str], output: str) -> None:
        self.settings = settings
        self.master = master
        self.conf = conf
        self.output = output
        self.spark: Any = None
        self.owned = False
        self.last_status = 0
        self.progress = _Progress(self) if sys.stderr.isatty() else None

    def session(self) -> Any:
        if self.spark is None:
            from headwater.spark_compaction.session import running_session, spark_session

            if self.progress:
                self.progress.message(f"starting Spark ({self.master})")
            self.owned = not running_session()  # an embedding process's session is not ours
            self.spark = spark_session(self.master, self.conf, compaction=True)
        return self.spark

    def once(self) -> int:
        from headwater.spark_compaction.job import run

        progress = self.progress
        try:
            if progress:
                progress.start()
            summary = run(self.session, self.settings, progress.message if progress else None)
        except Exception as exc:  # a failed run is one line and status 1, never a traceback
            self.last_status = 1
            if progress:
                progress.stop()
            print(f"headwater: error: compaction failed: {_one_line(exc)}", file=sys.stderr)
            return 1
        if progress:
            progress.stop()
        for problem in summary.corrupt:
            print(f"headwater: warning: skipped corrupt data: {problem}", file=sys.stderr)
        if self.output == "json":
            print(json.dumps(summary.as_dict()), flush=True)
        else:
            print(_text(summary), flush=True)
        self.last_status = 0
        return 0

    def close(self) -> None:
        if self.spark is not None and self.owned:
            self.spark.stop()
        self.spark = None


def _text(summary: Any) -> str:
    lines = [
        f"segments read:        {summary.segments:,}",
        f"records in:           {summary.records_in:,}",
        f"keys out:             {summary.keys_out:,}",
        f"bytes read, written:  {summary.bytes_read:,}, {summary.bytes_written:,}",
        f"tombstones dropped:   {summary.tombstones_dropped:,}",
        f"keyless skipped:      {summary.keyless_skipped:,}",
        f"aborted skipped:      {summary.aborted_skipped:,}",
        f"corrupt batches:      {summary.corrupt_batches:,}",
        f"seconds:              {summary.seconds:.1f}",
    ]
    for snapshot in summary.snapshots:
        what = (
            f"a delta of {snapshot['rows']:,} changed keys over {snapshot['layers'] - 1} layer(s)"
            if snapshot["delta"]
            else f"{snapshot['rows']:,} keys"
        )
        lines.append(
            f"snapshot {snapshot['topic']}/{snapshot['partition']}: horizon {snapshot['horizon']}, "
            f"{what} in {snapshot['files']} file(s)"
        )
    return "\n".join(lines)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    return first[:500]


class _Progress:
    """One status line on stderr: the job's stage and, while Spark works, its task counts."""

    def __init__(self, runner: _Runner) -> None:
        self._runner = runner
        self._stage = ""
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        self._done.clear()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def message(self, text: str) -> None:
        self._stage = text
        self._draw("")

    def _poll(self) -> None:
        while not self._done.wait(0.5):
            spark = self._runner.spark
            if spark is None:
                continue
            try:
                tracker = spark.sparkContext.statusTracker()
                stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
                done = sum(s.numCompletedTasks for s in stages if s)
                total = sum(s.numTasks for s in stages if s)
            except Exception:  # the session may be stopping; the display is best effort
                continue
            self._draw(f" [{done}/{total} tasks]" if total else "")

    def _draw(self, tasks: str) -> None:
        with self._lock:
            print(f"\r\033[K{self._stage}{tasks}", end="", file=sys.stderr, flush=True)

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(2)
        with self._lock:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
