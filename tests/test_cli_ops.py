"""Issue 13's command-line operability, end to end: `headwater ...` as a subprocess against a live
server. Global options anywhere, --version, help on every option, JSON output, headers and
partitions, map scan --all, consume --exit-at-end/--partition/--timeout/--print, safe defaults."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pty
import select
import subprocess
import sys
import time
from importlib import metadata

import headwater
from headwater.cli.main import _parser
from headwater.testing import ServerProcess
from tests.support.cli_process import hw

HEADWATER = [sys.executable, "-m", "headwater"]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`headwater ARGS` with no --server added (the tests place it themselves)."""
    return hw(*args, timeout=timeout, env={"HEADWATER_SERVER": "127.0.0.1:1"})


def test_version_is_the_installed_distributions() -> None:
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"headwater {metadata.version('headwater')}"


def _parsers(
    parser: argparse.ArgumentParser, path: str
) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _parsers(sub, f"{path} {name}")
    return found


def test_every_option_and_argument_has_help() -> None:
    missing = [
        f"{path}: {action.option_strings or action.dest}"
        for path, parser in _parsers(_parser(), "headwater")
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not action.help
    ]
    assert missing == []


def test_global_options_before_and_after_the_command(
    server: ServerProcess, topic_name: str
) -> None:
    # HEADWATER_SERVER points nowhere: only the --server given on the command line can work
    before = run("--server", server.address, "topic", "create", topic_name)
    assert before.returncode == 0, before.stderr
    middle = run("topic", "--server", server.address, "--format", "json", "list")
    assert middle.returncode == 0, middle.stderr
    assert topic_name in [t["name"] for t in json.loads(middle.stdout)]
    after = run("--format", "json", "topic", "describe", topic_name, "--server", server.address)
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout)["name"] == topic_name
    nowhere = run("topic", "list")
    assert nowhere.returncode == 1 and "cannot connect to 127.0.0.1:1" in nowhere.stderr
    bad = run("--server", server.address, "topic", "list", "--format", "yaml")
    assert bad.returncode == 2 and "--format for topic list must be table or json" in bad.stderr
    none = run("--server", server.address, "--format", "json", "map", "size", topic_name)
    assert none.returncode == 2 and "has no --format" in none.stderr


def test_topic_list_and_describe_json(server: ServerProcess, topic_name: str) -> None:
    assert hw("topic", "create", topic_name, "--partitions", "2", server=server).returncode == 0
    live = f"{topic_name}-live"
    created = hw("topic", "create", live, "--dispatch", "non-reliable", server=server)
    assert created.stdout.strip() == f"created topic {live} (non-reliable)"
    assert hw("produce", topic_name, "--partition", "1", "a", "bc", server=server).returncode == 0
    listed = json.loads(hw("topic", "list", "--format", "json", server=server).stdout)
    by_name = {t["name"]: t for t in listed}
    assert set(by_name[topic_name]) == {"name", "partitions", "dispatch", "configs"}
    assert by_name[topic_name]["partitions"] == 2
    assert by_name[topic_name]["dispatch"] == "reliable"  # the default
    assert by_name[live]["dispatch"] == "non-reliable"
    assert by_name[topic_name]["configs"]["fsync"] == "always"
    consumer = subprocess.Popen(
        [*HEADWATER, "consume", topic_name, "-s", "watch", "--server", server.address, "-n", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            described = json.loads(
                hw("topic", "describe", topic_name, "--format", "json", server=server).stdout
            )
            if described["subscriptions"] and described["subscriptions"][0]["consumers"]:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the consumer never attached")
    finally:
        consumer.kill()
        consumer.wait(timeout=60)
    assert set(described) == {
        "name",
        "partition_count",
        "partitions",
        "dispatch",
        "configs",
        "messages_in",
        "bytes_in",
        "offsets",
        "subscriptions",
    }
    assert described["offsets"] == [
        {"partition": 0, "start": 0, "next": 0},
        {"partition": 1, "start": 0, "next": 2},
    ]
    assert described["messages_in"] == 2 and described["bytes_in"] > 0
    (sub,) = described["subscriptions"]
    assert sub["name"] == "watch" and sub["type"] == "exclusive"
    assert {"pending", "delivered", "dropped", "unacked", "dead_lettered"} <= set(sub)
    (attached,) = sub["consumers"]
    assert set(attached) == {"id", "name", "priority", "credits", "active"}
    assert attached["active"] is True


def test_produce_headers_and_partition_round_trip(server: ServerProcess, topic_name: str) -> None:
    assert hw("topic", "create", topic_name, "--partitions", "3", server=server).returncode == 0
    produced = hw(
        "produce",
        topic_name,
        "--partition",
        "2",
        "--header",
        "trace=abc",
        "--header",
        "eq=x=y",
        "--key",
        "k1",
        "v1",
        "v2",
        server=server,
    )
    assert produced.returncode == 0, produced.stderr
    bad = hw("produce", topic_name, "--header", "novalue", "x", server=server)
    assert bad.returncode == 1 and "--header takes NAME=VALUE" in bad.stderr
    out_of_range = hw("produce", topic_name, "--partition", "7", "x", server=server)
    assert out_of_range.returncode == 1 and "INVALID_PARTITION" in out_of_range.stderr
    as_json = hw(
        "consume", topic_name, "-s", "j", "--from", "earliest", "--exit-at-end", "--format",
        "json", server=server,
    )  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [(r["partition"], r["offset"], r["key"], r["value"]) for r in records] == [
        (2, 0, "k1", "v1"),
        (2, 1, "k1", "v2"),
    ]
    assert records[0]["headers"] == [
        {"name": "trace", "value": "abc"},
        {"name": "eq", "value": "x=y"},
    ]
    as_text = hw(
        "consume", topic_name, "-s", "t", "--from", "earliest", "--exit-at-end",
        "--print", "key,headers,partition,offset", server=server,
    )  # fmt: skip
    assert as_text.returncode == 0, as_text.stderr
    assert as_text.stdout.splitlines() == [
        "partition=2\toffset=0\tkey=k1\theaders=trace:abc,eq:x=y\tv1",
        "partition=2\toffset=1\tkey=k1\theaders=trace:abc,eq:x=y\tv2",
    ]
    bad_field = hw("consume", topic_name, "-s", "t", "--print", "colour", server=server)
    assert bad_field.returncode == 1 and "--print takes fields from" in bad_field.stderr


def test_map_scan_all_pages_over_1000_keys(
    server: ServerProcess, client: headwater.Client, topic_name: str
) -> None:
    assert hw("topic", "create", topic_name, "--last-value", server=server).returncode == 0

    async def fill() -> None:
        async with await headwater.connect(server.address) as own:
            await own.map(topic_name).set_many({f"k{i:04d}": f"v{i}" for i in range(1000)})

    asyncio.run(fill())
    one_page = hw("map", "scan", topic_name, server=server)
    assert one_page.returncode == 0, one_page.stderr
    assert len(one_page.stdout.splitlines()) == 100
    assert "more keys after 'k0099': use --all" in one_page.stderr
    everything = hw("map", "scan", topic_name, "--all", "--limit", "64", server=server)
    assert everything.returncode == 0 and everything.stderr == ""
    assert everything.stdout.splitlines() == [f"k{i:04d}\tv{i}" for i in range(1000)]
    as_json = hw("map", "scan", topic_name, "--all", "--format", "json", server=server)
    entries = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [(e["key"], e["value"]) for e in entries] == [
        (f"k{i:04d}", f"v{i}") for i in range(1000)
    ]
    assert all(isinstance(e["revision"], int) for e in entries)
    last = hw("map", "scan", topic_name, "--prefix", "k09", server=server)
    assert len(last.stdout.splitlines()) == 100 and last.stderr == ""  # exactly one page: no note


def test_map_read_on_a_topic_without_last_value_state(
    server: ServerProcess, topic_name: str
) -> None:
    assert hw("topic", "create", topic_name, server=server).returncode == 0
    for command in (("get", topic_name, "k"), ("size", topic_name), ("scan", topic_name)):
        refused = hw("map", *command, server=server)
        assert refused.returncode == 1
        assert f"INVALID_REQUEST: topic '{topic_name}' has no last-value state" in refused.stderr
    configs = json.loads(
        hw("topic", "describe", topic_name, "--format", "json", server=server).stdout
    )
    assert "last.value" not in configs["configs"]  # the reads changed nothing
    assert hw("map", "set", topic_name, "k", "v", server=server).returncode == 0
    assert hw("map", "get", topic_name, "k", server=server).stdout == "v\n"


def test_consume_exit_at_end_partition_and_timeout(server: ServerProcess, topic_name: str) -> None:
    assert hw("topic", "create", topic_name, "--partitions", "2", server=server).returncode == 0
    for partition in (0, 1):
        values = [f"p{partition}-{i}" for i in range(5)]
        sent = hw("produce", topic_name, "--partition", str(partition), *values, server=server)
        assert sent.returncode == 0, sent.stderr
    started = time.monotonic()
    everything = hw(
        "consume", topic_name, "-s", "all", "--from", "earliest", "--exit-at-end", server=server
    )
    assert everything.returncode == 0, everything.stderr
    assert sorted(everything.stdout.splitlines()) == sorted(
        f"p{p}-{i}" for p in (0, 1) for i in range(5)
    )
    # consumed and acknowledged: the same subscription is at the end already
    again = hw("consume", topic_name, "-s", "all", "--exit-at-end", server=server)
    assert again.returncode == 0 and again.stdout == ""
    fresh = hw("consume", topic_name, "-s", "new", "--exit-at-end", server=server)  # from latest
    assert fresh.returncode == 0 and fresh.stdout == ""
    one = hw(
        "consume", topic_name, "-s", "one", "--from", "earliest", "--exit-at-end",
        "--partition", "1", "--print", "partition", "--prefetch", "2", server=server,
    )  # fmt: skip
    assert one.returncode == 0, one.stderr
    assert one.stdout.splitlines() == [f"partition=1\tp1-{i}" for i in range(5)]
    assert time.monotonic() - started < 60
    # the filter acknowledged nothing of partition 0: the subscription still holds it
    rest = hw("consume", topic_name, "-s", "one", "--exit-at-end", "--timeout", "10", server=server)
    assert sorted(rest.stdout.splitlines()) == [f"p0-{i}" for i in range(5)]
    no_such = hw("consume", topic_name, "-s", "x", "--partition", "2", server=server)
    assert no_such.returncode == 1 and "has partitions 0..1, not 2" in no_such.stderr
    waited = time.monotonic()
    short = hw("consume", topic_name, "-s", "idle", "--timeout", "0.5", server=server)
    assert short.returncode == 0 and "no message for 0.5s" in short.stderr
    unmet = hw("consume", topic_name, "-s", "idle", "--timeout", "0.5", "-n", "3", server=server)
    assert unmet.returncode == 1 and "received 0 of 3" in unmet.stderr
    assert time.monotonic() - waited < 30


def test_size_without_count_is_an_error(server: ServerProcess, topic_name: str) -> None:
    result = hw("produce", topic_name, "--size", "10", "x", server=server)
    assert result.returncode == 2 and "--size only applies to generated messages" in result.stderr


def test_progress_bar_only_on_a_terminal(server: ServerProcess, topic_name: str) -> None:
    assert hw("topic", "create", topic_name, server=server).returncode == 0
    piped = hw("produce", topic_name, "--count", "2000", "--size", "10", server=server)
    assert piped.returncode == 0 and "\r" not in piped.stderr and "[" not in piped.stderr
    master, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            [*HEADWATER, "produce", topic_name, "--count", "2000", "--server", server.address],
            stdout=subprocess.DEVNULL,
            stderr=terminal,
        )
        os.close(terminal)
        terminal = -1
        output = b""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the terminal closed: the process exited
                    break
                if not chunk:
                    break
                output += chunk
            elif process.poll() is not None:
                break
        assert process.wait(timeout=30) == 0
    finally:
        os.close(master)
        if terminal >= 0:
            os.close(terminal)
    assert b"\r[" in output and b"2,000/2,000" in output


def test_reconnect_notice_has_the_warning_prefix(fresh_server: ServerProcess) -> None:
    """issue 41: `consume --reconnect` told of the lost connection in a bare library line; it is
    one of the CLI's own, `headwater: warning: ...`, and the consumer carries on."""
    fresh_server.extra_args = (*fresh_server.extra_args, "--port", str(fresh_server.port))
    assert hw("topic", "create", "t", server=fresh_server).returncode == 0
    consumer = subprocess.Popen(
        [*HEADWATER, "consume", "t", "-s", "s", "--reconnect", "-n", "1"],
        env={**os.environ, "HEADWATER_SERVER": fresh_server.address},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60  # a hang bound
        while "consumer " not in hw("topic", "describe", "t", server=fresh_server).stdout:
            assert time.monotonic() < deadline and consumer.poll() is None
            time.sleep(0.1)
        fresh_server.kill()
        fresh_server.start()
        while True:  # resubscribed: a message now reaches it
            assert hw("produce", "t", "after", server=fresh_server).returncode == 0
            try:
                out, err = consumer.communicate(timeout=2)
                break
            except subprocess.TimeoutExpired:
                assert time.monotonic() < deadline
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.communicate()
    assert consumer.returncode == 0, err
    assert out.splitlines()[0] == "after"
    lines = err.splitlines()
    assert lines and all(line.startswith("headwater: warning: ") for line in lines), err
    assert lines[0].endswith("; reconnecting")
