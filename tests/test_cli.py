"""The `headwater` command, run as a subprocess against a live server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from headwater.testing import ServerProcess
from tests.support.cli_process import hw, start_consumer, wait_for_consumers


def test_topic_commands(server: ServerProcess, topic_name: str) -> None:
    created = hw("topic", "create", topic_name, "--partitions", "3", server=server)
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == f"created topic {topic_name} (reliable)"  # the default
    listed = hw("topic", "list", server=server)
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["NAME", "PARTITIONS", "DISPATCH"]
    assert [topic_name, "3", "reliable"] in [row.split() for row in rows]
    described = hw("topic", "describe", topic_name, server=server)
    assert "partitions: 3" in described.stdout and "next offsets: 0, 0, 0" in described.stdout
    again = hw("topic", "create", topic_name, server=server)
    assert again.returncode == 1
    assert again.stderr.strip() == (
        f"headwater: error: TOPIC_EXISTS: topic '{topic_name}' already exists"
    )
    deleted = hw("topic", "delete", topic_name, server=server)
    assert deleted.returncode == 0
    missing = hw("topic", "describe", topic_name, server=server)
    assert missing.returncode == 1 and "UNKNOWN_TOPIC" in missing.stderr


def test_produce_and_consume_text_and_json(server: ServerProcess, topic_name: str) -> None:
    assert hw("topic", "create", topic_name, server=server).returncode == 0
    text = start_consumer(server, topic_name, "-s", "text", "--count", "3")
    as_json = start_consumer(server, topic_name, "-s", "json", "--count", "3", "--format", "json")
    wait_for_consumers(server, topic_name, 2)
    produced = hw("produce", topic_name, "one", "two", server=server)
    assert produced.returncode == 0, produced.stderr
    assert "produced 2 messages" in produced.stderr
    assert hw("produce", topic_name, "--key", "k1", "three", server=server).returncode == 0
    text_out, _ = text.communicate(timeout=60)
    json_out, _ = as_json.communicate(timeout=60)
    assert text.returncode == 0 and text_out.splitlines() == ["one", "two", "three"]
    records = [json.loads(line) for line in json_out.splitlines()]
    assert [(r["offset"], r["key"], r["value"]) for r in records] == [
        (0, None, "one"),
        (1, None, "two"),
        (2, "k1", "three"),
    ]
    assert all(r["topic"] == topic_name and r["partition"] == 0 for r in records)
    assert all(isinstance(r["timestamp"], int) for r in records)


def test_produce_from_stdin_with_key_separator(server: ServerProcess, topic_name: str) -> None:
    assert hw("topic", "create", topic_name, server=server).returncode == 0
    consumer = start_consumer(server, topic_name, "-s", "s", "--count", "3", "--format", "json")
    wait_for_consumers(server, topic_name, 1)
    result = hw(
        "produce", topic_name, "--key-separator", "=", stdin="a=1\nb=2=x\nc=\n", server=server
    )
    assert result.returncode == 0, result.stderr
    out, _ = consumer.communicate(timeout=60)
    assert [(r["key"], r["value"]) for r in map(json.loads, out.splitlines())] == [
        ("a", "1"),
        ("b", "2=x"),
        ("c", ""),
    ]


def test_line_without_separator_is_an_error(server: ServerProcess, topic_name: str) -> None:
    assert hw("topic", "create", topic_name, server=server).returncode == 0
    result = hw("produce", topic_name, "--key-separator", ":", stdin="novalue\n", server=server)
    assert result.returncode == 1
    assert "no key separator" in result.stderr


def test_unknown_topic_and_bad_server(server: ServerProcess) -> None:
    result = hw("produce", "missing-topic", "x", server=server)
    assert result.returncode == 1 and "UNKNOWN_TOPIC" in result.stderr
    unreachable = hw("topic", "list", "--server", "127.0.0.1:1")
    assert unreachable.returncode == 1
    # not CONNECTION_CLOSED (nothing was ever connected), and it says what to do
    assert unreachable.stderr.startswith("headwater: error: CANNOT_CONNECT: cannot connect to ")
    assert "headwater serve" in unreachable.stderr
    bad = hw("topic", "list", "--server", "127.0.0.1:notaport")
    assert bad.returncode == 1 and "port must be a number" in bad.stderr
    usage = hw("consume", "t")  # --subscription is required
    assert usage.returncode == 2 and "--subscription" in usage.stderr
    # a flag of another command: the usage shown is the command's own, not the top level's
    foreign = hw("topic", "list", "--subscription", "x")
    assert foreign.returncode == 2
    assert "usage: headwater topic list" in foreign.stderr
    assert "headwater topic list: error: unrecognized arguments: --subscription x" in foreign.stderr


def test_server_from_environment(server: ServerProcess, topic_name: str) -> None:
    result = hw("topic", "create", topic_name, env={"HEADWATER_SERVER": server.address})
    assert result.returncode == 0, result.stderr


def test_binary_values_print_as_base64_in_json(server: ServerProcess, topic_name: str) -> None:
    import asyncio

    import headwater

    assert hw("topic", "create", topic_name, server=server).returncode == 0
    consumer = start_consumer(server, topic_name, "-s", "b", "--count", "1", "--format", "json")
    wait_for_consumers(server, topic_name, 1)

    async def send() -> None:
        async with await headwater.connect(server.address) as client:
            await (await client.producer(topic_name).send(b"\xff\x00", key=b"ok"))

    asyncio.run(send())
    out, _ = consumer.communicate(timeout=60)
    record = json.loads(out)
    assert record["value"] == "/wA=" and record["value_encoding"] == "base64"
    assert record["key"] == "ok" and "key_encoding" not in record


def test_reliable_consume_from_ack_and_seek(server: ServerProcess, topic_name: str) -> None:
    created = hw(
        "topic",
        "create",
        topic_name,
        "--dispatch",
        "reliable",
        "--config",
        "fsync=never",
        server=server,
    )
    assert created.returncode == 0, created.stderr
    assert "fsync=never" in hw("topic", "describe", topic_name, server=server).stdout
    assert hw("produce", topic_name, "a", "b", "c", server=server).returncode == 0
    first = hw(
        "consume", topic_name, "-s", "s", "--from", "earliest", "--count", "2", server=server
    )
    assert first.stdout.splitlines() == ["a", "b"]
    # a and b were acked: the subscription resumes at c
    rest = hw("consume", topic_name, "-s", "s", "--count", "1", server=server)
    assert rest.stdout.splitlines() == ["c"]
    peek = hw(
        "consume",
        topic_name,
        "-s",
        "p",
        "--from",
        "1",
        "--count",
        "1",
        "--no-ack",
        "--format",
        "json",
        server=server,
    )
    assert json.loads(peek.stdout)["offset"] == 1
    again = hw("consume", topic_name, "-s", "p", "--count", "1", "--format", "json", server=server)
    record = json.loads(again.stdout)
    assert (record["offset"], record["delivery_count"]) == (1, 2)  # not acked: delivered again
    moved = hw("subscription", "seek", topic_name, "s", "--to", "0", server=server)
    assert moved.returncode == 0, moved.stderr
    replay = hw("consume", topic_name, "-s", "s", "--count", "3", server=server)
    assert replay.stdout.splitlines() == ["a", "b", "c"]
    assert hw("subscription", "delete", topic_name, "s", server=server).returncode == 0
    gone = hw("subscription", "seek", topic_name, "s", "--to", "0", server=server)
    assert gone.returncode == 1 and "UNKNOWN_SUBSCRIPTION" in gone.stderr


def test_bad_positions_and_configs(server: ServerProcess, topic_name: str) -> None:
    bad_config = hw(
        "topic", "create", topic_name, "--dispatch", "reliable", "--config", "fsync", server=server
    )
    assert bad_config.returncode == 1 and "NAME=VALUE" in bad_config.stderr
    assert (
        hw("topic", "create", topic_name, "--dispatch", "reliable", server=server).returncode == 0
    )
    bad_from = hw("consume", topic_name, "-s", "s", "--from", "yesterday", server=server)
    assert bad_from.returncode == 1 and "earliest, latest or an offset" in bad_from.stderr


def test_serve_refuses_a_bad_config_file(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[topics]\nfsync = "sometimes"\n')
    result = hw("serve", "--config", str(config), "--port", "0", "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 2
    assert "topics.fsync must be always, interval or never" in result.stderr
    config.write_text("[server]\nprot = 1\n")
    result = hw("serve", "--config", str(config))
    assert result.returncode == 2 and "unknown key server.prot" in result.stderr
    config.write_text("[object_store]\nbackend = 's3'\n")
    result = hw("serve", "--config", str(config))
    assert result.returncode == 2 and "bucket is required" in result.stderr
    missing = hw("serve", "--config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and "cannot read config file" in missing.stderr


def test_serve_refuses_a_config_file_that_is_not_utf8(tmp_path: Path) -> None:
    """A Windows editor's UTF-16 file, with or without its byte-order mark, and Latin-1 text:
    one line and exit 2, as for any other bad config (it was a traceback); UTF-8 with a
    byte-order mark loads."""
    config = tmp_path / "windows.toml"
    toml = '[server]\nhost = "127.0.0.1"\n'
    for data in (toml.encode("utf-16"), toml.encode("utf-16-le"), "# café\n".encode("latin-1")):
        config.write_bytes(data)
        result = hw("serve", "--config", str(config), "--port", "0")
        assert result.returncode == 2, result.stderr
        [line] = result.stderr.splitlines()
        assert line.startswith(f"headwater: error: {config}: ") and "save it as UTF-8" in line
    config.write_bytes(b"\xef\xbb\xbf" + b'[topics]\nfsync = "sometimes"\n')
    result = hw("serve", "--config", str(config))
    assert result.returncode == 2 and "topics.fsync must be always" in result.stderr  # read


def test_produce_generates_load_with_options(server: ServerProcess, topic_name: str) -> None:
    assert (
        hw("topic", "create", topic_name, "--dispatch", "reliable", server=server).returncode == 0
    )
    result = hw(
        "produce",
        topic_name,
        "--count",
        "5000",
        "--size",
        "50",
        "--compression",
        "zstd",
        "--idempotent",
        "--linger-ms",
        "2",
        "--batch-size",
        "4096",
        "--isolation",
        "fsynced",
        server=server,
    )
    assert result.returncode == 0, result.stderr
    # stderr is a pipe here: no progress bar (it redraws with \r, for terminals only)
    assert "\r" not in result.stderr and "5,000/5,000" not in result.stderr
    assert result.stderr.startswith("produced 5000 messages of 50 bytes")
    fire = hw("produce", topic_name, "--count", "10", "--delivery", "at-most-once", server=server)
    assert fire.returncode == 0, fire.stderr
    described = hw("topic", "describe", topic_name, server=server).stdout
    assert "next offsets: 5010" in described
    bad = hw("produce", topic_name, "--count", "1", "--retries", "-1", server=server)
    assert bad.returncode == 1 and "must not be negative" in bad.stderr


def test_output_into_a_closed_pipe_exits_quietly(server: ServerProcess, topic_name: str) -> None:
    for i in range(3):
        assert hw("topic", "create", f"{topic_name}-{i}", server=server).returncode == 0
    command = [sys.executable, "-m", "headwater", "topic", "list", "--server", server.address]
    lister = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert lister.stdout is not None and lister.stderr is not None
    lister.stdout.close()  # like `| head -0`: nobody reads
    assert lister.wait(timeout=30) in (0, 141)
    assert b"Traceback" not in lister.stderr.read()
