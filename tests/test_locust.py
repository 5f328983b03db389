"""locust runs loadtest/locustfile.py headless against a live server: every user kind works.

A few seconds of load with one user of each class (producers per delivery semantic, consumers
measuring end-to-end latency, map users); locust's own statistics must show requests and no
failure, for each kind of request.
"""

from __future__ import annotations

from pathlib import Path

from headwater.testing import ServerProcess
from loadtest.locust_run import run_locust

KINDS = [
    "produce at-most-once x100",
    "produce at-least-once x100",
    "produce idempotent x100",
    "e2e latency locust-fast",
    "e2e latency locust-stored",
    "map get",
    "map set",
]


def test_locust_headless_run_has_requests_and_no_failures(
    server: ServerProcess, tmp_path: Path
) -> None:
    outcome = run_locust(server.address, users=7, seconds=4, results=tmp_path)
    assert outcome["requests"] > 0, outcome["stderr"]
    assert outcome["failures"] == 0, outcome["stderr"]
    for kind in KINDS:
        assert outcome["by_name"].get(kind, {}).get("requests", 0) > 0, (kind, outcome["by_name"])
    assert Path(outcome["html"]).stat().st_size > 0
