"""What `headwater produce` and `map` take from the shell (issue 41): input seen whole is sent all
or nothing; streamed input says what was acknowledged before a failure; binary keys and values as
base64 or hex; an argument that is not UTF-8 is refused, by every command, in one line."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
from pathlib import Path

import pytest

import headwater
from headwater.cli.client_commands import WHOLE_INPUT_LINES
from headwater.cli.main import _parser
from headwater.testing import ServerProcess
from headwater.wire.errors import InvalidRequest
from tests.support.cli_process import hw
from tests.support.kafka_support import KafkaServer


def _next_offsets(server: ServerProcess, topic: str) -> str:
    described = hw("topic", "describe", topic, server=server)
    return next(line for line in described.stdout.splitlines() if line.startswith("next offsets"))


def test_produce_sends_nothing_when_any_value_is_refused(
    server: ServerProcess, topic_name: str
) -> None:
    assert hw("topic", "create", topic_name, "--schema", "int64", server=server).returncode == 0
    bad_schema = hw("produce", topic_name, "1", "2", "abc", server=server)
    assert bad_schema.returncode == 1
    assert bad_schema.stderr == (
        "headwater: error: SCHEMA_VIOLATION: value 3: not an integer for an int64 topic: "
        "'abc'; nothing was sent\n"
    )
    no_separator = hw(
        "produce", topic_name, "--key-separator", "=", stdin="a=1\nb=2\nc\n", server=server
    )
    assert no_separator.returncode == 1
    assert no_separator.stderr.startswith("headwater: error: INVALID_REQUEST: line 3: no key ")
    assert no_separator.stderr.endswith("; nothing was sent\n")
    not_utf8 = hw("produce", topic_name, stdin=b"1\n2\n\xff3\n", server=server)
    assert not_utf8.returncode == 1
    assert not_utf8.stderr.startswith("headwater: error: INVALID_REQUEST: line 3: value b'\\xff3'")
    assert "--value-encoding" in not_utf8.stderr and "nothing was sent" in not_utf8.stderr
    assert _next_offsets(server, topic_name) == "next offsets: 0"  # not 1 and 2 of any of them
    fixed = hw("produce", topic_name, "1", "2", server=server)
    assert fixed.returncode == 0 and fixed.stderr == f"produced 2 messages to {topic_name}\n"
    one = hw("produce", topic_name, "3", server=server)
    assert one.stderr == f"produced 1 message to {topic_name}\n"
    assert _next_offsets(server, topic_name) == "next offsets: 3"


def test_streamed_input_says_what_was_acknowledged_before_a_failure(
    server: ServerProcess, topic_name: str
) -> None:
    assert hw("topic", "create", topic_name, "--partitions", "2", server=server).returncode == 0
    good = WHOLE_INPUT_LINES + 10  # past the whole-input bound: the input streams
    lines = b"".join(b"k%d:v\n" % (i % 10) for i in range(good)) + b"nokey\n" + b"k0:after\n"
    result = hw("produce", topic_name, "--key-separator", ":", stdin=lines, server=server)
    assert result.returncode == 1
    described = hw("topic", "describe", topic_name, "--format", "json", server=server)
    stored = {o["partition"]: o["next"] for o in json.loads(described.stdout)["offsets"]}
    assert sum(stored.values()) == good and 0 not in stored.values()  # both partitions used
    last = ", ".join(f"{p}:{n - 1}" for p, n in sorted(stored.items()))
    assert result.stderr == (
        f"headwater: error: INVALID_REQUEST: line {good + 1}: no key separator ':' in "
        f"b'nokey'; {good} of the {good} messages sent were acknowledged (last offset per "
        f"partition {last}): sending the same input again sends them again\n"
    )


def test_binary_keys_and_values_from_the_shell(server: ServerProcess, topic_name: str) -> None:
    assert hw("topic", "create", topic_name, server=server).returncode == 0
    produced = hw(
        "produce", topic_name, "--key-encoding", "base64", "--key", "/wA=",
        "--value-encoding", "hex", "ff00", "c3a9", server=server,
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    consumed = hw(
        "consume", topic_name, "-s", "b", "--from", "earliest", "-n", "2", "--format", "json",
        server=server,
    )  # fmt: skip
    records = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert [(r["key"], r.get("key_encoding"), r["value"]) for r in records] == [
        ("/wA=", "base64", "/wA="),
        ("/wA=", "base64", "é"),
    ]
    bad = hw("produce", topic_name, "--value-encoding", "hex", "fz", server=server)
    assert bad.returncode == 1
    assert bad.stderr.startswith(
        "headwater: error: INVALID_REQUEST: value 1: value b'fz' is not hex"
    )
    written = hw(
        "map", "set", topic_name, "--key-encoding", "hex", "00ff", "--value-encoding", "base64",
        "AAEC", server=server,
    )  # fmt: skip
    assert written.returncode == 0, written.stderr
    read = hw(
        "map", "get", topic_name, "00ff", "--key-encoding", "hex", "--value-encoding", "hex",
        server=server,
    )  # fmt: skip
    assert read.returncode == 0 and read.stdout == "000102\n"
    scanned = hw(
        "map", "scan", topic_name, "--prefix", "00", "--key-encoding", "hex", "--value-encoding",
        "base64", "--format", "json", server=server,
    )  # fmt: skip
    assert [json.loads(line) for line in scanned.stdout.splitlines()] == [
        {
            "key": "00ff",
            "key_encoding": "hex",
            "value": "AAEC",
            "value_encoding": "base64",
            "revision": json.loads(scanned.stdout)["revision"],
        }
    ]


NOT_UTF8 = "bad\udcffname"  # what Python makes of the shell's b"bad\xffname"


def _leaf_commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        return [(path, parser)]
    return [
        leaf
        for name, sub in subparsers[0].choices.items()
        for leaf in _leaf_commands(sub, (*path, name))
    ]


def _text(action: argparse.Action) -> bool:
    """An argument the user writes as free text (not a choice, a number or a file)."""
    return (
        isinstance(action, argparse._StoreAction | argparse._AppendAction)
        and not action.choices
        and action.type in (None, str)
    )


def _variants(path: tuple[str, ...], parser: argparse.ArgumentParser) -> list[list[str]]:
    """The command with its required arguments, once per text argument with that one not
    UTF-8 (the rest plausible); and once with an optional text option not UTF-8 (--token for
    the commands that connect)."""
    needed = [
        action
        for action in parser._actions
        if (action.required or not action.option_strings)
        and not isinstance(action, argparse._SubParsersAction)
    ]
    optional = [a for a in parser._actions if a.option_strings and not a.required and _text(a)]
    token = [a for a in optional if a.dest == "token"]
    extra = (token or optional)[:1]
    bad_places = [a for a in needed if _text(a)] + extra
    variants = []
    for bad in bad_places:
        argv = list(path)
        for action in [*needed, *([bad] if bad in extra else [])]:
            if action is bad:
                value = NOT_UTF8
            elif action.choices:
                value = str(next(iter(action.choices)))
            elif not _text(action):
                value = "1"
            else:
                value = "x"
            argv += [*action.option_strings[:1], value]
        variants.append(argv)
    return variants


def test_every_command_refuses_an_argument_that_is_not_utf8(server: ServerProcess) -> None:
    commands = _leaf_commands(_parser())
    assert len(commands) > 25  # the walk found them all
    runs = 0
    for path, parser in commands:
        client = any(action.dest == "server" for action in parser._actions)
        variants = _variants(path, parser)
        # every command has a text argument to try, but `token list` (only a file's name,
        # which may be any bytes)
        assert variants or path == ("token", "list"), path
        for argv in variants:
            result = hw(*argv, server=server if client else None, timeout=60)
            runs += 1
            lines = result.stderr.splitlines()
            assert result.returncode != 0, argv
            assert len(lines) == 1, (argv, result.stderr)  # no traceback, no asyncio noise
            code = "INVALID_TOPIC_NAME" if "topic name" in lines[0] else "INVALID_REQUEST"
            assert lines[0].startswith(f"headwater: error: {code}: "), (argv, lines)
            assert "b'bad\\xffname' is not UTF-8" in lines[0], (argv, lines)
    assert runs > 40


async def test_the_library_refuses_a_name_it_cannot_encode_and_leaves_nothing_behind(
    server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """The client's own refusal, INVALID_REQUEST (not the server's UNKNOWN_SERVER_ERROR), and no
    waiter left to fail unseen when the connection closes."""
    client = await headwater.connect(server.address)
    with pytest.raises(InvalidRequest, match="is not UTF-8"):
        await client.create_topic(NOT_UTF8)
    assert await client.list_topics() is not None  # the connection is still good
    await client.close()
    gc.collect()
    await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text


def test_the_cli_on_the_http_or_kafka_port_says_which_port_it_is(tmp_path: Path) -> None:
    """Not only `CONNECTION_CLOSED ... closed by the server`: which kind of port answered, and
    the port to use. (A TLS port without --tls: tests/test_tls.py.)"""
    server = KafkaServer(tmp_path / "data").start()
    try:
        http_port = int(server.http_port_file.read_text())
        for address, says in (
            (f"127.0.0.1:{http_port}", "is an HTTP server (it answered 'HTTP/1.1 400"),
            (server.bootstrap, "is a Kafka listener (serve --kafka-port)"),
        ):
            # 400 at once, not 408 after the HTTP port's wait for a request head (HEAD_TIMEOUT)
            result = hw("topic", "list", "--server", address)
            assert result.returncode == 1
            [line] = result.stderr.splitlines()
            assert line.startswith("headwater: error: CONNECTION_CLOSED: "), line
            assert f"{address} {says}" in line and "--port (default 6650)" in line, line
    finally:
        server.stop()
