"""`headwater serve` start-up and shutdown, as an operator sees them.

A server that cannot start prints one line on stderr and exits non-zero (2 for a configuration
error, 1 otherwise), never a traceback. On a graceful stop, attached consumers are told
SERVER_SHUTTING_DOWN before their connection closes.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import ErrorCode
from headwater.wire.protocol import decode_push
from tests.support.rawwire import RawPeer


def serve(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headwater", "serve", "--host", "127.0.0.1", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("headwater: error: ")
    for needle in needles:
        assert needle in lines[0]


def test_busy_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve("--port", str(port), "--data-dir", str(tmp_path / "data"))
    assert_one_line(result, 1, f"cannot listen on 127.0.0.1:{port}", "in use")


def test_data_dir_held_by_another_server(tmp_path: Path) -> None:
    first = ServerProcess(tmp_path / "data").start()
    try:
        result = serve("--port", "0", "--data-dir", str(tmp_path / "data"))
        assert_one_line(result, 1, "in use by another server", str(tmp_path / "data"))
        assert first.alive()
    finally:
        first.kill()


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ('log_level = "verbose"', "server.log_level must be one of debug, info, warning, error"),
        ('log_format = "xml"', "server.log_format must be console or json"),
        ("max_connections = 0", "server.max_connections must be positive"),
        ("frame_timeout = -1.0", "server.frame_timeout must be positive"),
    ],
)
def test_invalid_settings_are_config_errors(tmp_path: Path, setting: str, needle: str) -> None:
    config = tmp_path / "headwater.toml"
    config.write_text(f"[server]\n{setting}\n")
    result = serve("--config", str(config), "--port", "0", "--data-dir", str(tmp_path / "d"))
    assert_one_line(result, 2, needle, str(config))
    assert not (tmp_path / "d").exists()  # refused before anything was created


async def test_consumers_hear_server_shutting_down(fresh_server: ServerProcess) -> None:
    peer = await RawPeer.open(fresh_server.address)
    await peer.call(m.CreateTopicRequest("t"))
    subscribed = await peer.call(m.SubscribeRequest("t", "s", m.SubscriptionType.SHARED, "c"))
    assert isinstance(subscribed, m.SubscribeResponse)
    assert fresh_server.stop() == 0
    frame = await peer.frame()
    assert frame.header.is_push
    assert frame.header.correlation_id == subscribed.consumer_id
    push = decode_push(frame.header, frame.body)
    assert push == m.ConsumerClosed(ErrorCode.SERVER_SHUTTING_DOWN, "the server is shutting down")
    assert await peer.closed_by_server()
    await peer.close()
