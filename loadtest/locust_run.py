"""Run loadtest/locustfile.py headless against a server started here; keep locust's HTML report.

Starts a Headwater server (`headwater.testing.ServerProcess`: `python -m headwater serve --port 0
--port-file`, data in a temporary directory), runs `locust --headless` in its own process for
`--seconds` with `--users` users, writes the HTML report (and the CSV statistics next to it) under
`--results` (loadtest/results/ by default), stops the server by PID and prints the totals. The
totals are read from locust's JSON file, written once from the final statistics as locust quits
(the CSV files are rewritten every second by a greenlet of their own, which a loaded machine
starves: a run's CSV once said 0 requests after 11,645). Exit
status 1 when locust made no request or saw a failure. `make loadtest` runs it; the test suite
calls `run_locust` against its own server (tests/test_locust.py).

    python -m loadtest.locust_run --users 14 --seconds 30
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from headwater.testing import ServerProcess

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
# here rather than in the locustfile, which imports locust (and locust monkey-patches on import)
ENOUGH = "HEADWATER_LOCUST_ENOUGH"  # the environment variable of `run_locust(enough=N)`
# the request names every locustfile run reports (at-most-once's confirmation comes every 20th
# batch only)
KINDS = (
    "produce at-most-once x100",
    "produce at-least-once x100",
    "produce idempotent x100",
    "e2e latency locust-fast",
    "e2e latency locust-stored",
    "map get",
    "map set",
)
RESULTS = Path(__file__).with_name("results")


def run_locust(
    address: str,
    users: int,
    seconds: float,
    results: Path,
    name: str = "locust",
    enough: int | None = None,
) -> dict[str, Any]:
    """locust against `address`; returns the totals and each request name's counts. With
    `enough`, the run ends once every kind of request was made that many times (`seconds` then
    only bounds it)."""
    results.mkdir(parents=True, exist_ok=True)
    html = results / f"{name}.html"
    prefix = results / name
    command = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "-u", str(users), "-r", str(users), "-t", f"{seconds:g}s", "--host", address,
        "--html", str(html), "--csv", str(prefix), "--json-file", str(prefix),
        "--only-summary", "--stop-timeout", "5",
        "--exit-code-on-error", "0", "--loglevel", "WARNING",
    ]  # fmt: skip
    env = {**os.environ, ENOUGH: str(enough)} if enough else None
    finished = subprocess.run(
        command, capture_output=True, text=True, timeout=seconds + 60, env=env
    )
    stats_file = Path(f"{prefix}.json")  # locust adds the suffix
    if not stats_file.exists():
        raise RuntimeError(f"locust wrote no statistics: {finished.stderr[-3000:]}")
    by_name: dict[str, dict[str, int]] = {}
    for entry in json.loads(stats_file.read_text()):
        counts = by_name.setdefault(entry["name"], {"requests": 0, "failures": 0})
        counts["requests"] += entry["num_requests"]
        counts["failures"] += entry["num_failures"]
    totals = {
        "requests": sum(c["requests"] for c in by_name.values()),
        "failures": sum(c["failures"] for c in by_name.values()),
    }
    return {**totals, "by_name": by_name, "html": str(html), "returncode": finished.returncode,
            "stderr": finished.stderr[-3000:]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--users", type=int, default=14, help="spread over the 7 user classes")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--server", help="use this running server instead of starting one")
    args = parser.parse_args(argv)
    name = f"locust-{time.strftime('%Y-%m-%d-%H%M%S', time.gmtime())}"
    with tempfile.TemporaryDirectory(prefix="headwater-locust-") as scratch:
        server = None if args.server else ServerProcess(Path(scratch) / "data").start()
        address = args.server or (server.address if server else "")
        try:
            outcome = run_locust(address, args.users, args.seconds, args.results, name)
        finally:
            if server is not None:
                server.stop()
    for request, counts in sorted(outcome["by_name"].items()):
        print(f"{request:<40} {counts['requests']:>10,} requests {counts['failures']:>6,} failures")
    print(f"{'total':<40} {outcome['requests']:>10,} requests {outcome['failures']:>6,} failures")
    print(f"report: {outcome['html']}")
    if outcome["failures"] or not outcome["requests"]:
        print(outcome["stderr"], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
