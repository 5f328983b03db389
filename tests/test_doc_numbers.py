"""The numbers and names the documents quote, checked against the code's (issue 41): a default
or a metric that changes without its document fails here. No server: the unit tier."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from headwater.server.config import ServerConfig

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "CONFIGURATION.md").read_text()
OPERATIONS = (ROOT / "docs" / "OPERATIONS.md").read_text()
MIB = 1024 * 1024


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_slow_consumer_bounds_quoted_are_the_defaults() -> None:
    config = ServerConfig()
    messages, size = config.subscription_backlog, config.subscription_backlog_bytes
    quoted = re.search(r"holds at most ([\d,]+) undelivered messages or (\d+) MiB", _flat(README))
    assert quoted is not None, "README's slow-consumer bound is gone or reworded"
    assert (int(quoted[1].replace(",", "")), int(quoted[2]) * MIB) == (messages, size)
    assert f"subscription_backlog = {messages} " in CONFIGURATION
    assert f"subscription_backlog_bytes = {size} " in CONFIGURATION
    assert f"`subscription_backlog_bytes` | {size} ({size // MIB} MiB)" in CONFIGURATION
    assert f"`subscription_backlog` ({messages} messages)" in CONFIGURATION


def test_the_ports_quoted_are_the_defaults() -> None:
    config = ServerConfig()
    assert f"\nport = {config.port}\n" in CONFIGURATION
    assert config.port == 6650 and "127.0.0.1:6650" in README


def _counters_in_the_code() -> set[str]:
    """The counters named by a literal in the server's source (the exposition adds `_total`)."""
    names = set()
    for path in (ROOT / "headwater").rglob("*.py"):
        text = path.read_text()
        names |= set(re.findall(r'CounterMetricFamily\(\s*"(headwater_\w+)"', text))
        for prefix, block in re.findall(
            r'CounterMetricFamily\(f"(headwater_\w+_)\{name\}".*?'
            r"for name, text in \((.*?)\n\s*\)\n",
            text,
            re.S,
        ):
            names |= {prefix + name for name in re.findall(r'\(\s*"(\w+)",', block)}
    return names


def test_every_counter_is_documented_with_its_total_suffix() -> None:
    counters = _counters_in_the_code()
    assert len(counters) > 20  # the patterns still find them
    assert "headwater_topic_messages_in" in counters  # the f-string families too
    for counter in counters:
        assert f"`{counter}_total`" in OPERATIONS, f"{counter}_total is not in OPERATIONS.md"
    # a name without its suffix matches nothing in Prometheus: an alert copied from it is silent
    bare = sorted(
        name for name in set(re.findall(r"\b(headwater_\w+)\b", OPERATIONS)) if name in counters
    )
    assert bare == [], f"counters quoted without _total in OPERATIONS.md: {bare}"
    for row in re.findall(r"^\| `(headwater_\w+)` \| counter \|", OPERATIONS, re.M):
        assert row.endswith("_total"), f"counter {row} is listed without _total"


def test_make_run_takes_the_three_ports_the_readme_names() -> None:
    """issue 41: `make run` had no way to move a port that is busy."""
    for variable in ("PORT", "HTTP_PORT", "KAFKA_PORT"):
        assert f"{variable}=" in README, f"README does not say `make run {variable}=`"
    dry = subprocess.run(
        ["make", "-n", "run", "PORT=7001", "HTTP_PORT=7002", "KAFKA_PORT=7003"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    serve = _flat(dry.stdout.replace("\\\n", " "))
    assert "headwater serve --host 127.0.0.1 --port 7001 --http-port 7002 --kafka-port 7003" in (
        serve
    ), dry.stdout
    defaults = _flat(
        subprocess.run(
            ["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True, timeout=60
        ).stdout.replace("\\\n", " ")
    )
    config = ServerConfig()
    assert f"--port {config.port} --http-port 9650 --kafka-port 9092" in defaults
    assert "http://127.0.0.1:9650/" in README and "127.0.0.1:9092" in README


def test_the_open_files_arithmetic_is_the_codes() -> None:
    """OPERATIONS.md's partitions-per-open-files formula and its example, against
    headwater/server/open_files.py (issue 41)."""
    from headwater.server import open_files

    per, reserved = open_files.DESCRIPTORS_PER_PARTITION, open_files.RESERVED
    text = _flat(OPERATIONS)
    assert f"partitions = (open_files - {reserved} - max_connections) // {per}" in text
    assert (
        f"**{per} per reliable partition.**" in text
        and f"**{reserved} of the server's own**" in text
    )
    example = re.search(r"max_connections=(\d+) open_files=(\d+) partitions=(\d+)", text)
    assert example is not None
    connections, limit, partitions = (int(g) for g in example.groups())
    assert connections == ServerConfig().max_connections
    assert open_files.partitions_allowed(limit, connections) == partitions
    assert f"open files: {limit} (allows {partitions} reliable partitions" in text
