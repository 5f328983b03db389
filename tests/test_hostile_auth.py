"""Nothing unauthenticated costs the server more than a handshake (issue 22), against a live
server with a tokens file; the attacker runs in a process of its own (tests/support/hostile_peer.py)
while a token holder's round trips are timed, as in tests/test_hostile.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import pytest

import headwater
from headwater.wire import messages as m
from headwater.wire.errors import ErrorCode
from tests.support.secure import SecureServer, secure_server
from tests.test_hostile import ATTACK_SECONDS, Attack, NormalClient, under_attack


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureServer]:
    tmp = tmp_path_factory.mktemp("guarded")
    config = tmp / "headwater.toml"
    config.write_text("[server]\nmax_connections = 1000\n")
    with secure_server(tmp, "--config", str(config)) as server:
        yield server
    assert "Traceback" not in server.process.log()


@pytest.fixture
async def token_holder(guarded: SecureServer, topic_name: str) -> AsyncIterator[NormalClient]:
    token = guarded.token("normal", "all:*")
    client = await NormalClient.open(guarded.address, topic_name, token)
    yield client
    await client.close()


async def test_pre_auth_frames_of_every_request_type_cost_only_their_header(
    guarded: SecureServer, token_holder: NormalClient
) -> None:
    """8 MiB frames of every request type, each on a new unauthenticated connection, its body the
    largest array the type has: each is answered from its header (AUTHENTICATION_REQUIRED, or
    FRAME_TOO_LARGE for AUTHENTICATE) and the token holder's p99 stays under 50 ms. Before the
    fix the server buffered and parsed every body (an 8 MiB CREATE_TOPIC froze it for 21 s)."""
    _, result = await under_attack(token_holder, "preauth", guarded.address, str(ATTACK_SECONDS))
    required = str(int(ErrorCode.AUTHENTICATION_REQUIRED))
    too_large = str(int(ErrorCode.FRAME_TOO_LARGE))
    assert set(result["codes"]) <= {required, too_large}, result
    per_key = result["per_key"]
    for key, code in per_key.items():
        expected = too_large if int(key) == m.ApiKey.AUTHENTICATE else required
        assert code == int(expected), (key, result)
    assert len(per_key) >= 10, json.dumps(result)  # most types answered at least once


async def test_anonymous_sockets_leave_room_for_a_token_holder(guarded: SecureServer) -> None:
    """10,000 silent sockets from one address (127.0.0.2), reopened as they are closed, while a
    token holder opens 50 connections from another: all 50 succeed. Before the fix the silent
    sockets held every slot of max_connections (1,000 here) and the token holder was refused
    TOO_MANY_CONNECTIONS."""
    token = guarded.token("holder", "all:*")
    attack = Attack("anonymous", guarded.address, "60", "10000", "127.0.0.2")
    connected = 0
    try:
        await attack.started(timeout=120)
        for _ in range(50):
            assert attack.running(), attack.output()
            async with await headwater.connect(guarded.address, token=token) as client:
                await client.list_topics()
            connected += 1
    finally:
        attack.kill()
    assert connected == 50
    assert "Traceback" not in guarded.process.log()
