"""The numbers and names the documents quote, checked against the code's (issue 41): a default
or a metric that changes without its document fails here. No server: the unit tier."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import tomllib
import typing
from pathlib import Path
from typing import Any

from headwater.server import config_file
from headwater.server.config import ServerConfig
from headwater.wire import limits

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "CONFIGURATION.md").read_text()
OPERATIONS = (ROOT / "docs" / "OPERATIONS.md").read_text()
PROTOCOL = (ROOT / "docs" / "PROTOCOL.md").read_text()
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


def _metrics_in_the_code() -> dict[str, str]:
    """Every metric family the server exports, by the name a literal or an f-string over a
    table of names gives it, and its kind (counter, gauge, histogram); the exposition adds
    `_total` to counters and `_bucket`, `_sum`, `_count` to histograms."""
    metrics: dict[str, str] = {}
    family = r"\b(Counter|Gauge|Histogram|Summary|Info)(?:MetricFamily)?\(\s*"
    for path in (ROOT / "headwater").rglob("*.py"):
        text = path.read_text()
        for kind, name in re.findall(family + r'"(headwater_\w+)"', text):
            metrics[name] = kind.lower()
        for match in re.finditer(family + r'f"(headwater_\w*)\{name\}"', text):
            kind, prefix = match[1].lower(), match[2]
            # `for name, text in (...)` after the family (a comprehension), or the loop over a
            # table of names right before it
            before = text[max(match.start() - 200, 0) : match.start()]
            inline = re.match(r".*?for name, \w+ in \((.*?)\n\s*\)\n", text[match.end() :], re.S)
            table = re.search(r"for name, \w+ in (\w+)\.items\(\):\s*(?:yield\s*)?$", before)
            if table is not None:
                block = re.search(rf"^{table[1]} = \{{\n(.*?)^\}}", text, re.S | re.M)
                assert block is not None, f"{path.name}: table {table[1]} not found"
                names = re.findall(r'^\s*"(\w+)":', block[1], re.M)
            elif inline is not None:
                names = re.findall(r'\(\s*"(\w+)",', inline[1])
            else:
                names = []
            assert names, f"{path.name}: the names of {prefix}{{name}} are not found"
            metrics |= {prefix + name: kind for name in names}
        made = len(re.findall(r"MetricFamily\(", text))
        named = len(re.findall(r'MetricFamily\(\s*f?"headwater_', text))
        assert made == named, f"{path.name}: a metric family whose name this test cannot read"
    return metrics


METRICS = _metrics_in_the_code()


def _counters_in_the_code() -> set[str]:
    """The counters named in the server's source (the exposition adds `_total`)."""
    return {name for name, kind in METRICS.items() if kind == "counter"}


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


# -- every default of CONFIGURATION.md's annotated TOML example ---------------------------------

# Keys the example sets to a value that is deliberately not the default (the default is unset or
# empty, which shows nothing), each with the reason. Stale entries fail.
EXAMPLE_VALUES = {
    ("server", "http_port"): "unset by default (no HTTP port); the example shows the usual 9650",
    ("object_store", "endpoint_url"): "unset by default (AWS); the example shows a local MinIO",
    ("object_store", "region"): "unset by default (the SDK's); the example names one",
    ("security", "auth_tokens"): "unset by default (no authentication); a typical path",
    ("security", "tls_cert"): "unset by default (no TLS); a typical path",
    ("security", "tls_key"): "unset by default (no TLS); a typical path",
    ("security", "tls_client_ca"): "unset by default (no mTLS); a typical path",
    ("cluster", "etcd"): "empty by default (one broker); the example shows a cluster",
    ("cluster", "advertise"): "empty by default (the bound address); an example address",
    ("cluster", "broker_id"): "empty by default (the advertised address); an example id",
    ("kafka", "port"): "unset by default (no Kafka listener); the example shows Kafka's 9092",
}

# Config fields the document need not mention, each with the reason. Stale entries fail.
UNDOCUMENTED_FIELDS: dict[tuple[str, str], str] = {}


def _sections() -> dict[str, type]:
    """TOML section -> dataclass, as headwater/server/config_file.py maps them."""
    return {"server": ServerConfig, **config_file._SECTIONS}


def _fields(section: str, cls: type) -> set[str]:
    skip = config_file._NESTED_FIELDS if section == "server" else set()
    return {f.name for f in dataclasses.fields(cls)} - skip


def _toml_example() -> tuple[dict[str, Any], set[tuple[str, str]]]:
    """The keys the example sets, by section, and those it shows commented out (unset)."""
    blocks = re.findall(r"```toml\n(.*?)```", CONFIGURATION, re.S)
    assert blocks, "CONFIGURATION.md has no TOML example"
    data: dict[str, Any] = {}
    commented = set()
    for block in blocks:
        for section, table in tomllib.loads(block).items():
            data.setdefault(section, {}).update(table)
        section = ""
        for line in block.splitlines():
            header = re.match(r"\[(\w+)\]", line)
            section = header[1] if header is not None else section
            key = re.match(r"#\s*(\w+) = ", line)
            if key is not None:
                commented.add((section, key[1]))
    return data, commented


def test_every_default_in_the_toml_example_is_the_codes() -> None:
    data, commented = _toml_example()
    sections = _sections()
    assert set(data) <= set(sections), f"unknown sections: {set(data) - set(sections)}"
    mentioned = set(commented)
    for section, table in data.items():
        cls = sections[section]
        fields, hints, defaults = _fields(section, cls), typing.get_type_hints(cls), cls()
        for key, value in table.items():
            assert key in fields, f"CONFIGURATION.md sets [{section}] {key}, which the code lacks"
            mentioned.add((section, key))
            shown = config_file._convert(Path("CONFIGURATION.md"), key, hints[key], value)
            default = getattr(defaults, key)
            if (section, key) in EXAMPLE_VALUES:
                assert shown != default, f"[{section}] {key} is the default now: not an exemption"
            else:
                assert shown == default, (
                    f"CONFIGURATION.md: [{section}] {key} = {value!r}, the code's default is "
                    f"{default!r}"
                )
    for section, key in commented:
        cls = sections[section]
        assert key in _fields(section, cls), f"CONFIGURATION.md: [{section}] # {key}: unknown"
        assert getattr(cls(), key) is None, f"[{section}] # {key} is shown unset but has a default"
    for section, cls in sections.items():
        for key in sorted(_fields(section, cls)):
            if (section, key) in UNDOCUMENTED_FIELDS:
                assert (section, key) not in mentioned, f"[{section}] {key}: a stale exemption"
            else:
                assert (section, key) in mentioned, (
                    f"[{section}] {key} is not in CONFIGURATION.md's TOML example"
                )
    for section, key in {*EXAMPLE_VALUES, *UNDOCUMENTED_FIELDS}:
        assert key in _fields(section, sections[section]), f"exempt [{section}] {key}: no field"


# -- every gauge and histogram in OPERATIONS.md's tables, every name there in the code ----------


def _metric_rows() -> list[tuple[list[str], str]]:
    """OPERATIONS.md's metric table rows: the names in the first cell, and the type."""
    rows = re.findall(r"^\| (`headwater_[^|]*) \| (\w+) \|", OPERATIONS, re.M)
    return [(re.findall(r"`(headwater_\w+)`", names), kind) for names, kind in rows]


def test_every_gauge_and_histogram_is_in_the_metric_tables() -> None:
    rows = _metric_rows()
    assert len(rows) > 40  # the pattern still finds the tables
    listed: dict[str, str] = {}
    for names, kind in rows:
        assert kind in ("counter", "gauge", "histogram"), f"{names}: type {kind}?"
        for name in names:
            base = name.removesuffix("_total") if kind == "counter" else name
            assert kind != "counter" or name.endswith("_total"), f"counter {name} without _total"
            assert base in METRICS, f"OPERATIONS.md lists {name}, which the server does not export"
            assert METRICS[base] == kind, f"{name} is a {METRICS[base]}, listed as a {kind}"
            listed[base] = kind
    assert {"gauge", "histogram", "counter"} <= set(METRICS.values())
    missing = sorted(set(METRICS) - set(listed))
    assert missing == [], f"exported but not in OPERATIONS.md's metric tables: {missing}"


# `headwater_` words in the documents that are not metrics, with what they are
NOT_METRICS = {
    "headwater_wal": "the Spark data source of WAL records (COMPACTION.md)",
    "headwater_snapshot": "the Spark data source of snapshots (COMPACTION.md)",
}


def test_every_metric_name_in_the_documents_is_exported() -> None:
    """Any document, not only OPERATIONS.md: an alert or query copied from one must match."""
    series = set()
    for name, kind in METRICS.items():
        suffixes = {"counter": ["_total"], "histogram": ["", "_bucket", "_sum", "_count"]}
        series |= {name + suffix for suffix in suffixes.get(kind, [""])}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for word in set(re.findall(r"\b(headwater_\w+)(\*?)", path.read_text())):
            name, glob = word
            if glob:
                assert any(s.startswith(name) for s in series), f"{path.name}: {name}* is empty"
            else:
                assert name in series or name in NOT_METRICS, (
                    f"{path.name} names {name}, which /metrics does not have"
                )


# -- the limits CONFIGURATION.md and PROTOCOL.md quote from headwater/wire/limits.py -----------

_UNITS = {"": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def _figure(text: str) -> int:
    """`8 MiB - 64 KiB`, `8 MiB less 64 KiB`, `8,388,608`, `64 KiB` as a number."""
    total, sign = 0, 1
    for part in re.split(r"( - | less | \+ )", text.strip()):
        if part in (" - ", " less ", " + "):
            sign = 1 if part == " + " else -1
            continue
        term = re.fullmatch(r"([\d,]+)\s*(KiB|MiB|GiB)?", part.strip())
        assert term is not None, f"not a figure: {text!r}"
        total += sign * int(term[1].replace(",", "")) * _UNITS[term[2] or ""]
    return total


N = r"([\d,]+(?: ?[KMG]iB)?(?: (?:-|less) [\d,]+ ?[KMG]iB)?)"  # a figure, as the docs write them

# Each constant, and the places the documents quote it: a pattern whose groups are figures.
QUOTED_LIMITS: dict[str, list[tuple[str, str]]] = {
    "MAX_FRAME_SIZE": [
        (PROTOCOL, rf"\| frame size \(`size` field\) \| {N} \({N}\) \|"),
        (CONFIGURATION, rf"\| `max_frame_size` \| {N} \({N}\) \|"),
        (CONFIGURATION, rf"max_frame_size = {N} +# FRAME_TOO_LARGE past it \({N}\)"),
    ],
    "MAX_PRE_AUTH_FRAME": [
        (PROTOCOL, rf"\| frame size before AUTHENTICATE succeeds [^|]*\| {N} \({N}\):"),
        (PROTOCOL, rf"`FRAME_TOO_LARGE` \(over {N}; then closed\)"),
        (PROTOCOL, rf"in frames of at most {N}, until AUTHENTICATE succeeds"),
        (CONFIGURATION, rf"Before AUTHENTICATE succeeds \(authentication on\) the limit is {N}"),
    ],
    "MAX_BATCH_SIZE": [
        (PROTOCOL, rf"\| record batch \| {N} \|"),
        (CONFIGURATION, rf"\| `max.message.bytes` \| 1 to {N} \|"),
        (CONFIGURATION, rf"Default {N} \({N}: the largest batch a frame carries"),
        (CONFIGURATION, rf"max_message_bytes = {N} "),
    ],
    "MAX_FETCH_BYTES": [
        (PROTOCOL, rf"\| FETCH `max_bytes` \| 1\.\.{N} \({N}, a record batch's limit\)"),
    ],
    "MAX_FETCH_WAIT_MS": [(PROTOCOL, rf"\| FETCH `max_wait_ms` \| 0\.\.{N} ")],
    "MAX_TOPIC_NAME_LENGTH": [
        (PROTOCOL, rf"\| topic name \| 1\.\.{N} bytes"),
        (PROTOCOL, rf"\| LOOKUP `topics` \| [\d,]+, each name at most {N} bytes \|"),
        (PROTOCOL, rf"each at most {N} bytes \(`INVALID_REQUEST`\)"),
        (PROTOCOL, rf"a name over {N} bytes\)"),
    ],
    "MAX_NAME_LENGTH": [(PROTOCOL, rf"\| subscription and consumer names \| 1\.\.{N} bytes")],
    "MAX_KEY_SIZE": [(PROTOCOL, rf"\| a last-value key [^|]*\| 1\.\.{N} bytes \({N}\)")],
    "MAX_PARTITIONS": [
        (PROTOCOL, rf"\| partitions per topic \| 1\.\.{N} \|"),
        (PROTOCOL, rf"ADD_ACKS_TO_TXN `positions` \| {N} \|"),
        (PROTOCOL, rf"\(at least one, at most {N}\) to the transaction"),
    ],
    "MAX_TRANSACTION_TIMEOUT_MS": [
        (PROTOCOL, rf"\| transaction timeout \(INIT_TRANSACTIONS `timeout_ms`\) \| 1\.\.{N} ms"),
        (PROTOCOL, rf"transaction may stay open before the server aborts it [^.]*1\.\.{N} \(15"),
    ],
    "MAX_TRANSACTIONAL_ID": [
        (PROTOCOL, rf"\| transactional id \| 1\.\.{N} characters \|"),
        (PROTOCOL, rf"the transactional producer `transactional_id` \(1\.\.{N} characters\)"),
    ],
    "MAX_SUBSCRIBE_PARTITIONS": [(PROTOCOL, rf"\| SUBSCRIBE `partitions` \| {N} \|")],
    "MAX_CREDITS": [
        (PROTOCOL, rf"\| credits per consumer \| {N} \|"),
        (PROTOCOL, rf"int32 credits \(1\.\.{N}\)"),
        (PROTOCOL, rf"credits outside 1\.\.{N}\)"),
    ],
    "MAX_ERROR_MESSAGE": [(PROTOCOL, rf"\| error message in an error response \| {N} bytes")],
    "MAX_WAITING_REQUESTS": [
        (PROTOCOL, rf"\| requests of one connection waiting [^|]*\| {N} \(`MAX_WAITING_REQUESTS`"),
        (PROTOCOL, rf"the Kafka port's too\): at {N} the server stops reading"),
    ],
    "MAX_TOPIC_CONFIGS": [
        (PROTOCOL, rf"\| CREATE_TOPIC `configs`, ALTER_TOPIC_CONFIGS `configs` \| {N} \|"),
        (PROTOCOL, rf"configs holds [\d,]+ entries; at most {N}\"\)"),
    ],
    "MAX_SUBSCRIPTION_KEYS": [
        (PROTOCOL, rf"\| SUBSCRIBE `settings.keys` \| {N} \|"),
        (PROTOCOL, rf"`keys` at most {N}: Limits\)"),
    ],
    "MAX_ACKS_PER_REQUEST": [(PROTOCOL, rf"\| ACK `acks`, NACK `acks` \| {N} \|")],
    "MAX_ACK_RANGES_PER_REQUEST": [
        (PROTOCOL, rf"\| ACK_RANGES `ranges` \| {N}, covering"),
        (PROTOCOL, rf"\| ADD_ACKS_TO_TXN `ranges` \| {N} \|"),
    ],
    "MAX_OFFSETS_PER_ACK_RANGES": [
        (PROTOCOL, rf"covering at most {N} offsets together \|"),
        (PROTOCOL, rf"at most {N} offsets together \(a client splits"),
        (PROTOCOL, rf"more than {N} offsets, a partition"),
    ],
    "MAX_MAP_KEYS": [
        (PROTOCOL, rf"\| MAP_GET `keys` \| 1\.\.{N} "),
        (PROTOCOL, rf"\| MAP_SET `writes` \| 1\.\.{N} \|"),
        (PROTOCOL, rf"MAP_SCAN's page \(`limit`\) is 1\.\.{N} entries"),
        (PROTOCOL, rf"array<bytes key> \(1\.\.{N} keys\)"),
        (PROTOCOL, rf"array<Write> \(1\.\.{N} writes\)"),
        (PROTOCOL, rf"int32 limit \(1\.\.{N}\)"),
    ],
    "MAX_LOOKUP_WAITS": [
        (PROTOCOL, rf"\| LOOKUP `wait_for` \(version 1\) \| {N}, each name"),
        (PROTOCOL, rf"at most {N} waits"),
    ],
    "MAX_LOOKUP_WAIT_MS": [
        (PROTOCOL, rf"\| LOOKUP `max_wait_ms` \(version 1\) \| 0\.\.{N}, as FETCH's"),
        (PROTOCOL, rf"`max_wait_ms`\s+0\.\.{N}, at most"),
    ],
    "MAX_LOOKUP_TOPICS": [
        (PROTOCOL, rf"\| LOOKUP `topics` \| {N}, each name"),
        (PROTOCOL, rf"At most {N} names, each"),
        (PROTOCOL, rf"more than {N} names, a name over"),
    ],
    "MAX_DECOMPRESSED_BATCH": [
        (PROTOCOL, rf"`max_decompressed_batch`, default {N}: `DECOMPRESSED_TOO_LARGE`"),
        (CONFIGURATION, rf"\| `max_decompressed_batch` \| {N} \({N}\) \|"),
    ],
}


def test_every_limit_the_documents_quote_is_the_constant() -> None:
    constants = {
        name: value
        for name, value in vars(limits).items()
        if name.startswith("MAX_") and isinstance(value, int)
    }
    unquoted = sorted(set(constants) - set(QUOTED_LIMITS))
    assert unquoted == [], f"limits no document quotes (add them to PROTOCOL.md): {unquoted}"
    for name, quotes in QUOTED_LIMITS.items():
        assert name in constants, f"{name} is no longer in headwater/wire/limits.py"
        for document, pattern in quotes:
            found = re.findall(pattern, _flat(document))
            assert found, f"{name}: the quote {pattern!r} is gone or reworded"
            for match in found:
                for figure in (match,) if isinstance(match, str) else match:
                    assert _figure(figure) == constants[name], (
                        f"a document quotes {name} as {figure}; the code has {constants[name]}"
                    )
