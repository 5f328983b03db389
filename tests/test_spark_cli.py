"""`headwater compact`: what a real server uploaded becomes a snapshot; the JSON summary; usage and
configuration errors exit 2, a failed run exits 1 with one line, and `--every` runs until told to
stop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import headwater
from headwater.cli.main import main
from headwater.spark_compaction.loader import load_snapshot
from headwater.storage.objectstore import LocalObjectStore
from headwater.testing import ServerProcess
from tests.support.s3 import free_port

SUMMARY_KEYS = {
    "segments",
    "records_in",
    "keys_out",
    "tombstones_dropped",
    "keyless_skipped",
    "seconds",
}


async def _produce(address: str) -> dict[bytes, bytes]:
    """Keyed overwrites, a few deletes, some keyless records; returns the live value per key."""
    expected: dict[bytes, bytes] = {}
    async with await headwater.connect(address) as client:
        await client.create_topic(
            "prices",
            partitions=2,
            dispatch="reliable",
            configs={"segment.bytes": 2048, "fsync": "never"},
        )
        producer = client.producer("prices")
        for i in range(300):  # one batch each (awaited), so segments roll often
            key, value = b"k%02d" % (i % 40), b"price-%d" % i
            await (await producer.send(value, key=key))
            expected[key] = value
        for i in range(5):
            await (await producer.send(None, key=b"k%02d" % i))
            del expected[b"k%02d" % i]
        for i in range(10):
            await (await producer.send(b"no key %d" % i))
        await producer.close()
    return expected


async def _snapshot_rows(objects: Path, partitions: int) -> dict[bytes, bytes]:
    store = LocalObjectStore(objects)
    rows: dict[bytes, bytes] = {}
    for partition in range(partitions):
        snapshot = await load_snapshot(store, "prices", partition)
        assert snapshot is not None
        async for row in snapshot.rows():
            rows[row.key] = row.value
    return rows


def test_compact_makes_snapshots_of_what_a_real_server_uploaded(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        expected = asyncio.run(_produce(server.address))
    finally:
        assert server.stop() == 0  # a graceful stop uploads the active segments too
    objects = tmp_path / "data" / "objects"
    assert len(list(objects.glob("prices/*/*.log"))) > 4

    data = str(tmp_path / "data")
    status = main(["compact", "--data-dir", data, "--master", "local[2]", "--format", "json"])

    out = capsys.readouterr().out.strip().splitlines()
    assert status == 0 and len(out) == 1
    summary = json.loads(out[0])
    assert set(summary) >= SUMMARY_KEYS
    assert summary["records_in"] == 315
    assert summary["keys_out"] == 35
    assert summary["tombstones_dropped"] == 5
    assert summary["keyless_skipped"] == 10
    assert summary["segments"] == len(list(objects.glob("prices/*/*.log")))
    assert asyncio.run(_snapshot_rows(objects, 2)) == expected
    assert spark.sparkContext._jsc is not None  # the CLI left the session it joined running

    # text summary; nothing new, so nothing read
    assert main(["compact", "--data-dir", data, "--topic", "prices"]) == 0
    text = capsys.readouterr().out
    assert "segments read:        0" in text and "keys out:             0" in text


def _config(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / f"config-{len(list(tmp_path.glob('config-*')))}.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--data-dir", "{tmp}/nowhere"], "does not exist"),
        (["--data-dir", "{tmp}", "--every", "10 minutes"], "invalid duration"),
        (["--data-dir", "{tmp}", "--every", "0s"], "--every must be positive"),
        (["--data-dir", "{tmp}", "--retention=-1h"], "invalid duration"),
        (["--data-dir", "{tmp}", "--topic", "a/b"], "may contain only"),
        (["--data-dir", "{tmp}", "--conf", "spark.ui.enabled"], "KEY=VALUE"),
        (["--config", "{none}"], "compaction needs local or s3"),
        (["--config", "{bogus}"], "unknown section"),
        (["--config", "{nobucket}"], "bucket is required"),
        (["--config", "{tmp}/missing.toml"], "cannot read config file"),
    ],
)
def test_usage_and_configuration_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str], message: str
) -> None:
    (tmp_path / "objects").mkdir()
    files = {
        "tmp": str(tmp_path),
        "none": _config(tmp_path, "[object_store]", 'backend = "none"'),
        "bogus": _config(tmp_path, "[bogus]"),
        "nobucket": _config(tmp_path, "[object_store]", 'backend = "s3"'),
    }
    status = main(["compact", *(a.format(**files) for a in arguments)])
    err = capsys.readouterr().err
    assert status == 2
    assert message in err and "Traceback" not in err


def test_a_failed_run_exits_1_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"}.items():
        monkeypatch.setenv(name, value)
    config = _config(
        tmp_path,
        "[object_store]",
        'backend = "s3"',
        'bucket = "b"',
        f'endpoint_url = "http://127.0.0.1:{free_port()}"',  # nothing listens there
    )
    status = main(["compact", "--config", config, "--format", "json"])
    captured = capsys.readouterr()
    assert status == 1
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headwater: error: compaction failed: ")


def test_every_runs_on_a_schedule_until_sigterm(tmp_path: Path) -> None:
    (tmp_path / "data" / "objects").mkdir(parents=True)
    command = ["compact", "--data-dir", str(tmp_path / "data"), "--every", "200ms"]
    process = subprocess.Popen(
        [sys.executable, "-m", "headwater", *command, "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        lines = []
        deadline = time.monotonic() + 60
        while len(lines) < 3 and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            lines.append(json.loads(line))
        assert len(lines) == 3
        assert all(s["segments"] == 0 and set(s) >= SUMMARY_KEYS for s in lines)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
