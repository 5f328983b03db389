"""locust runs loadtest/locustfile.py headless against a live server: every user kind works.

One user of each class (producers per delivery semantic, consumers measuring end-to-end latency,
map users) until every kind of request was made five times (`HEADWATER_LOCUST_ENOUGH`; the run
time only bounds a hang: a fixed 4 s run made no request at all on a loaded machine); locust's
own statistics must show requests and no failure, for each kind of request.
"""

from __future__ import annotations

from pathlib import Path

from headwater.testing import ServerProcess
from loadtest.locust_run import KINDS, run_locust


def test_locust_headless_run_has_requests_and_no_failures(
    server: ServerProcess, tmp_path: Path
) -> None:
    outcome = run_locust(server.address, users=7, seconds=120, results=tmp_path, enough=5)
    assert outcome["requests"] > 0, outcome["stderr"]
    assert outcome["failures"] == 0, outcome["stderr"]
    for kind in KINDS:
        assert outcome["by_name"].get(kind, {}).get("requests", 0) >= 5, (kind, outcome["by_name"])
    assert Path(outcome["html"]).stat().st_size > 0
