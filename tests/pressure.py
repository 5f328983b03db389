"""Runs a command under CPU pressure: busy-loop processes beside it, stopped when it ends.

    python -m tests.pressure [--busy 2] [--runs 3] -- python -m pytest -q tests/test_reliable.py

`--busy N` starts N processes that spin (`while True: pass`) at the same priority as the command,
so that on a 2-core machine the command gets about half of the CPU it would have idle. `--runs R`
runs the command R times in a row and stops at the first failure (its exit status is returned).
The busy processes are started by this script and stopped by their PIDs when it ends, also on
Ctrl-C or SIGTERM; nothing else is touched.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

BUSY_LOOP = "while True:\n    pass\n"


def start_busy(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
    for process in processes:
        process.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=2, help="busy-loop processes (default 2)")
    parser.add_argument("--runs", type=int, default=1, help="runs in a row (default 1)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")

    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    busy = start_busy(args.busy)
    print(
        f"pressure: {args.busy} busy processes (PIDs {' '.join(str(p.pid) for p in busy)})",
        flush=True,
    )
    status = 0
    try:
        for run in range(1, args.runs + 1):
            started = time.monotonic()
            status = subprocess.call(command)
            elapsed = time.monotonic() - started
            verdict = "passed" if status == 0 else f"FAILED (exit status {status})"
            print(f"pressure: run {run}/{args.runs} {verdict} in {elapsed:.0f} s", flush=True)
            if status != 0:
                break
    except KeyboardInterrupt:
        status = 130
    finally:
        stop(busy)
        print("pressure: busy processes stopped", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
