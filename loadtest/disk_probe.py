"""What a disk does to a WAL's fsyncs: three probes behind decisions in docs/DECISIONS.md.

Run it on the disk that holds (or will hold) the data directory (`--dir`, default a temporary
directory in the current one); every probe works in a temporary directory of its own there and
removes it. Nothing else should run meanwhile. Results go to stdout as a table (`--format json`
for JSON); progress to stderr on a terminal.

- `fsync`: 2,000 appends of 1,500 bytes, each followed by `fdatasync`, to a file that grows (as a
  segment does), to one written over zeros written first, and to one written over `fallocate`d
  space: p50/p99/p999 of the fdatasync ("Segments grow as they are written").
- `delete`: a thread appends and fdatasyncs every 0.5 ms while a 64 MiB file is freed, either at
  once (`unlink`) or truncated in steps of 8, 4 or 1 MiB, each committed: how long the freeing
  takes and the p99/max of the fsyncs beside it ("Deleted segments are freed a mebibyte at a
  time").
- `group-commit`: appends of 150 bytes at 10k and 50k a second, and one or two threads fsyncing
  whatever was appended (two: each on a descriptor of its own); latency from the append to the
  fsync that covers it ("two fsyncs in flight").

    python -m loadtest.disk_probe --dir /srv/headwater --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadtest.harness import percentile

MIB = 1 << 20


def _summary(durations: list[float]) -> dict[str, float]:
    durations = sorted(durations)
    return {
        f"{name}_ms": round(percentile(durations, q) * 1000, 3)
        for name, q in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999))
    } | {"max_ms": round(durations[-1] * 1000, 3)}


def fsync_kinds(directory: Path, count: int = 2000, size: int = 1500) -> list[dict[str, Any]]:
    rows = []
    for kind in ("growing", "over zeros", "over fallocate"):
        path = directory / "fsync-probe"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            if kind == "over zeros":
                os.write(fd, bytes(count * size + 4096))
                os.fsync(fd)
                os.lseek(fd, 0, os.SEEK_SET)
            elif kind == "over fallocate":
                os.posix_fallocate(fd, 0, count * size + 4096)
                os.fsync(fd)
            block, durations = b"x" * size, []
            for _ in range(count):
                os.write(fd, block)
                started = time.perf_counter()
                os.fdatasync(fd)
                durations.append(time.perf_counter() - started)
        finally:
            os.close(fd)
            path.unlink()
        rows.append({"file": kind} | _summary(durations))
    return rows


class _Fsyncer:
    """A thread appending 1,500 bytes and calling fdatasync every 0.5 ms until stopped."""

    def __init__(self, directory: Path) -> None:
        self.samples: list[tuple[float, float]] = []  # (start, duration)
        self._path = directory / "beside"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        try:
            while not self._stop.wait(0.0005):  # bounded by stop(), which every caller reaches
                os.write(fd, b"x" * 1500)
                started = time.perf_counter()
                os.fdatasync(fd)
                self.samples.append((started, time.perf_counter() - started))
        finally:
            os.close(fd)
            self._path.unlink()

    def __enter__(self) -> _Fsyncer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> list[float]:
        return [d for s, d in self.samples if start <= s <= end]


def freeing(directory: Path, size: int = 64 * MIB) -> list[dict[str, Any]]:
    rows = []
    for step in (0, 8 * MIB, 4 * MIB, MIB):
        path = directory / "doomed"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        chunk = b"y" * MIB
        for _ in range(size // MIB):
            os.write(fd, chunk)
            os.fdatasync(fd)
        os.close(fd)
        with _Fsyncer(directory) as beside:
            time.sleep(0.3)  # samples before: the thread is running
            started = time.perf_counter()
            if step == 0:
                path.unlink()
            else:
                fd = os.open(path, os.O_WRONLY)
                path.unlink()
                left = size
                while left > 0:
                    left = max(0, left - step)
                    os.ftruncate(fd, left)
                    os.fdatasync(fd)
                os.close(fd)
            ended = time.perf_counter()
            time.sleep(0.3)
        durations = beside.between(started - 0.01, ended + 0.05) or [0.0]
        summary = _summary(durations)
        rows.append(
            {
                "freed": "at once (unlink)" if step == 0 else f"{step // MIB} MiB per step",
                "took_ms": round((ended - started) * 1000, 1),
                "beside_p99_ms": summary["p99_ms"],
                "beside_max_ms": summary["max_ms"],
            }
        )
    return rows


def group_commit(directory: Path, rate: int, slots: int, seconds: float = 4.0) -> dict[str, Any]:
    path = directory / "group"
    fds = [os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)]
    fds += [os.open(path, os.O_WRONLY) for _ in range(slots - 1)]
    changed = threading.Condition()
    appended: list[float] = []
    state = {"claimed": 0, "durable": 0, "stop": False}
    latencies: list[float] = []

    def fsyncing(fd: int) -> None:
        while True:
            with changed:
                changed.wait_for(
                    lambda: state["stop"] or state["claimed"] < len(appended), timeout=1.0
                )
                if state["stop"]:
                    return
                if state["claimed"] >= len(appended):
                    continue
                target = state["claimed"] = len(appended)
            os.fdatasync(fd)
            done = time.perf_counter()
            with changed:
                if target > state["durable"]:
                    latencies.extend(done - t for t in appended[state["durable"] : target])
                    state["durable"] = target

    threads = [threading.Thread(target=fsyncing, args=(fd,)) for fd in fds]
    for thread in threads:
        thread.start()
    try:
        block, interval = b"x" * 150, 1 / rate
        tick = time.perf_counter()
        end = tick + seconds
        while tick < end:  # bounded by `seconds`
            now = time.perf_counter()
            if now < tick:
                time.sleep(max(0.0, tick - now - 0.00005))
                continue
            os.write(fds[0], block)
            with changed:
                appended.append(time.perf_counter())
                changed.notify_all()
            tick += interval
        deadline = time.monotonic() + 5
        while state["durable"] < len(appended) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        with changed:
            state["stop"] = True
            changed.notify_all()
        for thread in threads:
            thread.join()
        for fd in fds:
            os.close(fd)
        path.unlink()
    return {"rate": rate, "in_flight": slots} | _summary(latencies)


PROBES: dict[str, Callable[[Path], list[dict[str, Any]]]] = {
    "fsync": fsync_kinds,
    "delete": freeing,
    "group-commit": lambda d: [group_commit(d, r, s) for r in (10_000, 50_000) for s in (1, 2)],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="a directory on the disk")
    parser.add_argument("--only", choices=sorted(PROBES), action="append")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--format", choices=["table", "json"], default="table")
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        parser.error(f"--dir {args.dir}: not a directory")
    report: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="headwater-disk-probe-", dir=args.dir) as scratch:
        for name in args.only or list(PROBES):
            for repeat in range(args.repeats):
                if sys.stderr.isatty():
                    print(f"  {name} ({repeat + 1}/{args.repeats})", file=sys.stderr, flush=True)
                report.setdefault(name, []).extend(PROBES[name](Path(scratch)))
    if args.format == "json":
        print(json.dumps(report, indent=2))
        return 0
    for name, rows in report.items():
        print(f"\n{name}")
        columns = list(rows[0])
        print("  " + "  ".join(f"{c:>16}" for c in columns))
        for row in rows:
            print("  " + "  ".join(f"{row[c]!s:>16}" for c in columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
