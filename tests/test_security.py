"""Authentication, authorization, revocation and quotas against a real server with a tokens file.

Every refusal is checked for its code and for its effect: nothing written (the admin reads the
topic's counters afterwards) and nothing delivered.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import headwater
from headwater.server.security.tokens import load
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import (
    AuthenticationFailed,
    AuthenticationRequired,
    ErrorCode,
    NotAuthorized,
    TooManyConnections,
)
from headwater.wire.frames import FrameDecoder
from headwater.wire.protocol import (
    decode_push,
    decode_response,
    encode_push,
    encode_request,
    encode_response,
)
from headwater.wire.records import build_batch
from tests.support.rawwire import RawPeer
from tests.support.secure import SecureServer, secure_server


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[SecureServer]:
    with secure_server(tmp_path) as server:
        yield server


async def messages_in(server: SecureServer, topic: str) -> int:
    async with await headwater.connect(server.address, token=server.admin) as admin:
        return (await admin.describe_topic(topic)).messages_in


def produce_frame(topic: str, correlation_id: int) -> bytes:
    batch = build_batch([(None, b"intruder", ())])
    return encode_request(m.ProduceRequest(topic, 0, batch), correlation_id)


# Wire vectors (quoted in docs/PROTOCOL.md)


def test_handshake_vectors() -> None:
    request = encode_request(m.AuthenticateRequest("token", b"hw1.ab.cd"), 1)
    assert request.hex() == (
        "0000001e001e00000000000100000005746f6b656e00000009" + b"hw1.ab.cd".hex()
    )
    response = encode_response(m.ApiKey.AUTHENTICATE, 1, m.AuthenticateResponse("app", 0))
    assert response.hex() == "00000019001e0000000000010001000000036170700000000000000000"
    throttle = encode_push(0, m.Throttle(250))
    assert throttle.hex() == "0000000e00670000000000000002000000fa"
    decoded = decode_push(FrameDecoder().feed(throttle)[0].header, throttle[14:])  # type: ignore[union-attr]
    assert decoded == m.Throttle(250)
    refused = bytes.fromhex("00000010001e000000000001000100210002") + b"no"
    frame = FrameDecoder().feed(refused)[0]
    with pytest.raises(AuthenticationFailed):
        decode_response(frame.header, frame.body)  # type: ignore[union-attr]


# Authentication


async def test_wrong_token_is_refused_and_the_pipelined_produce_never_runs(
    secure: SecureServer,
) -> None:
    async with await headwater.connect(secure.address, token=secure.admin) as admin:
        await admin.create_topic("guarded", dispatch="non-reliable")
    good = secure.token("app", "all:guarded")
    entry_id = good.split(".")[1]
    for wrong in (f"hw1.{entry_id}.not-the-secret", "hw1.000000000000.x", "garbage"):
        with pytest.raises(AuthenticationFailed):
            await headwater.connect(secure.address, token=wrong)
    # A raw peer pipelines a produce after its bad handshake: the connection closes first.
    peer = await RawPeer.open(secure.address)
    await peer.send(
        encode_request(m.AuthenticateRequest("token", f"hw1.{entry_id}.S3cretGuess".encode()), 1)
        + produce_frame("guarded", 2)
    )
    answer = await peer.response()
    assert isinstance(answer, AuthenticationFailed)
    assert answer.code == ErrorCode.AUTHENTICATION_FAILED
    assert await peer.closed_by_server()
    await peer.close()
    assert await messages_in(secure, "guarded") == 0
    log = secure.process.log()
    assert "auth.failed" in log
    assert "S3cretGuess" not in log  # failures are logged without the secret
    assert "not-the-secret" not in log


async def test_no_handshake_is_refused_with_authentication_required(
    secure: SecureServer,
) -> None:
    async with await headwater.connect(secure.address, token=secure.admin) as admin:
        await admin.create_topic("quiet", dispatch="non-reliable")
        producer = admin.producer("quiet")
        await (await producer.send(b"secret"))
    peer = await RawPeer.open(secure.address)
    versions = await peer.call(m.ApiVersionsRequest())  # allowed: it tells what to speak
    assert isinstance(versions, m.ApiVersionsResponse)
    assert m.ApiKey.AUTHENTICATE in {api.api_key for api in versions.apis}
    await peer.send(
        encode_request(m.SubscribeRequest("quiet", "s", 0, "c", initial_credits=10), 2)
        + produce_frame("quiet", 3)
    )
    answer = await peer.response()
    assert isinstance(answer, AuthenticationRequired)
    assert answer.code == ErrorCode.AUTHENTICATION_REQUIRED
    assert await peer.closed_by_server()  # nothing else answered, nothing delivered
    await peer.close()
    assert await messages_in(secure, "quiet") == 1


async def test_expired_token_is_refused_and_a_live_one_is_cut_when_it_expires(
    secure: SecureServer,
) -> None:
    expired = secure.token("app", "all:*", expires=int(time.time()) - 1)
    with pytest.raises(AuthenticationFailed, match="expired"):
        await headwater.connect(secure.address, token=expired)
    soon = secure.token("app", "all:*", expires=int(time.time()) + 2)
    client = await headwater.connect(secure.address, token=soon)
    await client.create_topic("short-lived", dispatch="non-reliable")
    started = time.monotonic()
    with pytest.raises(AuthenticationFailed):
        while time.monotonic() - started < 20:
            await client.list_topics()
            await asyncio.sleep(0.1)
    # expiry is checked every second: 10x that bounds "cut when it expires" on a loaded machine
    assert time.monotonic() - started < 10
    await client.close()


async def test_revoked_token_cuts_a_live_consumer_and_producer_within_seconds(
    secure: SecureServer,
) -> None:
    token = secure.token("app", "produce:feed", "consume:feed")
    async with await headwater.connect(secure.address, token=secure.admin) as admin:
        await admin.create_topic("feed", dispatch="reliable")
        client = await headwater.connect(secure.address, token=token)
        consumer = await client.subscribe("feed", "app-sub", start="earliest")
        producer = client.producer("feed")
        await (await producer.send(b"before"))
        assert (await consumer.receive(timeout=30)).value == b"before"
        result = subprocess.run(
            [sys.executable, "-m", "headwater", "token", "revoke", "app", "--file", secure.tokens],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        revoked_at = time.monotonic()  # the file says so from here (the CLI's start-up excluded)
        with pytest.raises(AuthenticationFailed):
            await consumer.receive(timeout=30)
        # the file is re-read every second: 10x that bounds "within seconds" on a loaded machine
        assert time.monotonic() - revoked_at < 10
        await (await admin.producer("feed").send(b"after"))
        with pytest.raises(headwater.HeadwaterError):
            await (await producer.send(b"from the revoked"))
        with pytest.raises(AuthenticationFailed):
            await headwater.connect(secure.address, token=token)
        described = await admin.describe_topic("feed")
        assert described.messages_in == 2  # before, after: nothing from the revoked producer
        assert described.subscriptions[0].delivered == 1  # "after" went to no one
        await client.close()


async def test_connections_per_principal_are_capped(secure: SecureServer) -> None:
    token = secure.token("few", "consume:x", quotas={"max_connections": 2})
    first = await headwater.connect(secure.address, token=token)
    second = await headwater.connect(secure.address, token=token)
    with pytest.raises(TooManyConnections):
        await headwater.connect(secure.address, token=token)
    await first.close()
    third = await _connect_retrying(secure.address, token)
    await second.close()
    await third.close()


async def _connect_retrying(address: str, token: str) -> headwater.Client:
    deadline = time.monotonic() + 5
    while True:
        try:
            return await headwater.connect(address, token=token)
        except TooManyConnections:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def test_failed_attempts_are_slowed_but_a_valid_token_is_never_refused(
    secure: SecureServer,
) -> None:
    """Ten failed handshakes from one address, then a valid token from the same address
    succeeds at once (before the fix: refused for a minute, on both ports); the failures past
    the limit are answered only after FAILURE_DELAY, so guessing is slowed."""
    from headwater.server.security.access import FAILURE_DELAY

    good = secure.token("app", "consume:x")
    for _ in range(10):
        with pytest.raises(AuthenticationFailed):
            await headwater.connect(secure.address, token="hw1.000000000000.guess")
    async with await headwater.connect(secure.address, token=good) as client:
        await client.list_topics()
    began = time.monotonic()
    with pytest.raises(AuthenticationFailed, match="too many failed"):
        await headwater.connect(secure.address, token="hw1.000000000000.guess")
    assert time.monotonic() - began >= FAILURE_DELAY * 0.9  # the delay is the behaviour
    # another token id from the same address is not slowed by that id's failures
    with pytest.raises(AuthenticationFailed) as caught:
        await headwater.connect(secure.address, token="hw1.111111111111.guess")
    assert "too many failed" not in caught.value.message
    async with await headwater.connect(secure.address, token=good) as client:
        await client.list_topics()


async def test_connections_waiting_to_authenticate_are_capped_per_address_and_in_all(
    tmp_path: Path,
) -> None:
    """Past max_unauthenticated_per_address silent connections from one address, or
    max_unauthenticated_connections in all, a new connection is refused TOO_MANY_CONNECTIONS;
    authenticating frees the slot."""
    config = tmp_path / "headwater.toml"
    config.write_text(
        "[security]\nmax_unauthenticated_connections = 5\nmax_unauthenticated_per_address = 3\n"
    )
    with secure_server(tmp_path, "--config", str(config)) as server:
        host, port = server.address.rsplit(":", 1)

        async def open_from(source: str) -> RawPeer:
            reader, writer = await asyncio.open_connection(host, int(port), local_addr=(source, 0))
            return RawPeer(reader, writer)

        async def refused(peer: RawPeer, why: str) -> None:
            frame = await peer.frame()
            with pytest.raises(TooManyConnections, match=why):
                decode_response(frame.header, frame.body)
            await peer.close()

        first = [await open_from("127.0.0.2") for _ in range(3)]
        # each is counted once accepted: a request answered proves that
        for peer in first:
            assert isinstance(await peer.call(m.ApiVersionsRequest()), m.ApiVersionsResponse)
        await refused(await open_from("127.0.0.2"), "max_unauthenticated_per_address")
        second = [await open_from("127.0.0.3") for _ in range(2)]
        for peer in second:
            assert isinstance(await peer.call(m.ApiVersionsRequest()), m.ApiVersionsResponse)
        await refused(await open_from("127.0.0.4"), "max_unauthenticated_connections")
        # one of them authenticates: its slot is free for a newcomer
        answer = await first[0].call(m.AuthenticateRequest("token", server.admin.encode()))
        assert isinstance(answer, m.AuthenticateResponse)
        newcomer = await open_from("127.0.0.4")
        assert isinstance(await newcomer.call(m.ApiVersionsRequest()), m.ApiVersionsResponse)
        for peer in (*first, *second, newcomer):
            await peer.close()


# Authorization


async def expect_refused(call: object) -> NotAuthorized:
    with pytest.raises(NotAuthorized) as caught:
        await call  # type: ignore[misc]
    assert caught.value.code == ErrorCode.NOT_AUTHORIZED
    return caught.value


async def test_exact_and_prefix_grants_refuse_exactly_the_other_actions(
    secure: SecureServer,
) -> None:
    admin = await headwater.connect(secure.address, token=secure.admin)
    for name in ("orders", "orders2", "events.a", "events.b"):
        await admin.create_topic(name, dispatch="non-reliable")
    app = await headwater.connect(
        secure.address, token=secure.token("app", "produce:orders", "consume:events.*")
    )
    await (await app.producer("orders").send(b"ok"))
    for topic in ("orders2", "events.a"):  # exact does not prefix; consume is not produce
        with pytest.raises(NotAuthorized):
            await (await app.producer(topic).send(b"no"))
    consumer = await app.subscribe("events.a", "s")
    await expect_refused(app.subscribe("orders", "s"))
    await expect_refused(app.subscribe("orders2", "s"))
    await expect_refused(app.create_topic("events.c", dispatch="non-reliable"))
    await expect_refused(app.delete_topic("events.b"))
    await expect_refused(app.describe_topic("orders"))
    assert {t.name for t in await app.list_topics()} == {"orders", "events.a", "events.b"}
    await (await admin.producer("events.a").send(b"visible"))
    assert (await consumer.receive(timeout=30)).value == b"visible"
    counts = {t: (await admin.describe_topic(t)).messages_in for t in ("orders", "orders2")}
    assert counts == {"orders": 1, "orders2": 0}
    await app.close()
    await admin.close()


async def test_map_get_follows_consume_and_set_and_delete_follow_produce(
    secure: SecureServer,
) -> None:
    admin = await headwater.connect(secure.address, token=secure.admin)
    await admin.create_topic("maps.prices", dispatch="reliable", configs={"last.value": "true"})
    await admin.map("maps.prices").set("k", "1")
    reader = await headwater.connect(secure.address, token=secure.token("r", "consume:maps.*"))
    writer = await headwater.connect(secure.address, token=secure.token("w", "produce:maps.*"))
    table = reader.map("maps.prices")
    entry = await table.get("k")
    assert entry is not None
    assert entry.value == b"1"
    assert await table.size() == 1
    await expect_refused(table.set("k", "2"))
    await expect_refused(table.delete("k"))
    await writer.map("maps.prices").set("k", "3")
    await expect_refused(writer.map("maps.prices").get("k"))
    await expect_refused(writer.map("maps.prices").scan(""))
    entry = await admin.map("maps.prices").get("k")
    assert entry is not None
    assert entry.value == b"3"
    for client in (reader, writer, admin):
        await client.close()


async def test_subscription_seek_and_delete_need_admin_or_ownership(
    secure: SecureServer,
) -> None:
    admin = await headwater.connect(secure.address, token=secure.admin)
    await admin.create_topic("jobs.q", dispatch="reliable")
    producer = admin.producer("jobs.q")
    for value in (b"a", b"b"):
        await (await producer.send(value))
    owner = await headwater.connect(secure.address, token=secure.token("owner", "consume:jobs.*"))
    other = await headwater.connect(secure.address, token=secure.token("other", "consume:jobs.*"))
    topic_admin = await headwater.connect(secure.address, token=secure.token("ops", "admin:jobs.*"))
    consumer = await owner.subscribe("jobs.q", "work", type="shared", start="earliest")
    first = await consumer.receive(timeout=30)
    await first.ack()
    spare = await owner.subscribe("jobs.q", "spare", type="shared")
    for name in ("work", "spare"):
        await expect_refused(other.seek("jobs.q", name, "earliest"))
        await expect_refused(other.delete_subscription("jobs.q", name))
        await expect_refused(other.subscribe("jobs.q", name, type="shared"))  # no stealing
    await owner.seek("jobs.q", "work", "earliest")  # its own
    await topic_admin.seek("jobs.q", "work", "latest")  # admin on the topic
    await spare.close()
    # (deleting a subscription right after a seek can hang on this branch's base: a bug of
    # server/subscriptions/reliable_subscription.py, fixed on main by the architecture change; so
    # "spare" is deleted)
    await topic_admin.delete_subscription("jobs.q", "spare")
    described = await admin.describe_topic("jobs.q")
    assert [s.name for s in described.subscriptions] == ["work"]
    for client in (owner, other, topic_admin, admin):
        await client.close()


# Start-up and the CLI


def test_non_loopback_without_auth_is_refused_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "headwater",
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "refusing to listen on 0.0.0.0 without authentication" in lines[0]
    assert "--insecure" in lines[0]


def test_token_cli_prints_the_token_once_and_stores_only_its_hash(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "headwater", "token", *args, "--file", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )

    created = run("create", "billing", "--allow", "produce:billing.*", "--expires", "30d")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert token.startswith("hw1.")
    secret = token.split(".")[2]
    assert secret not in path.read_text()
    listed = run("list")
    assert "billing" in listed.stdout
    assert "valid" in listed.stdout
    assert secret not in listed.stdout
    bad = run("create", "x", "--allow", "write:everything")
    assert bad.returncode == 1
    assert "action must be" in bad.stderr
    revoked = run("revoke", token.split(".")[1])
    assert revoked.returncode == 0
    assert "revoked" in run("list").stdout
    assert next(iter(load(path).values())).revoked is not None


async def test_cli_client_takes_the_token_from_the_environment(secure: SecureServer) -> None:
    env_token = secure.token("cli", "admin:cli.*")
    base = [sys.executable, "-m", "headwater", "topic", "create", "cli.t", "--server"]

    def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        import os

        return subprocess.run(
            [*base, secure.address],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **env},
        )

    refused = await asyncio.to_thread(run, {"HEADWATER_TOKEN": ""})
    assert refused.returncode == 1
    assert "AUTHENTICATION_REQUIRED" in refused.stderr
    created = await asyncio.to_thread(run, {"HEADWATER_TOKEN": env_token})
    assert created.returncode == 0, created.stderr


async def test_authentication_off_answers_the_handshake_with_an_empty_principal(
    server: ServerProcess,
) -> None:
    client = await headwater.connect(server.address, token="hw1.abc.def")
    assert client._connection.principal == ""
    await client.close()


async def test_a_connection_that_never_authenticates_is_closed(secure: SecureServer) -> None:
    peer = await RawPeer.open(secure.address)
    frame = await peer.frame(timeout=15)  # handshake_timeout (5 s) and a sweep
    assert frame.header.correlation_id == 0
    with pytest.raises(AuthenticationRequired, match="no AUTHENTICATE within"):
        decode_response(frame.header, frame.body)
    assert await peer.closed_by_server()
    await peer.close()


def test_security_settings_load_from_the_config_file(tmp_path: Path) -> None:
    from headwater.server.config_file import ConfigError, load_config

    path = tmp_path / "headwater.toml"
    path.write_text(
        '[security]\nauth_tokens = "/etc/tokens.json"\ninsecure = true\n'
        "produce_bytes_per_second = 1000\n"
    )
    security = load_config(path).security
    assert security.auth_tokens == Path("/etc/tokens.json")
    assert security.insecure is True
    assert security.produce_bytes_per_second == 1000
    path.write_text('[security]\ntls_client_ca = "ca.pem"\n')
    with pytest.raises(ConfigError, match="tls_client_ca needs tls_cert"):
        load_config(path)
    path.write_text("[security]\ninsecure = 1\n")
    with pytest.raises(ConfigError, match=r"security\.insecure must be bool"):
        load_config(path)


async def test_before_authentication_frames_are_small_and_only_the_handshake_is_read(
    secure: SecureServer,
) -> None:
    """Before AUTHENTICATE succeeds: a frame over MAX_PRE_AUTH_FRAME is refused from its header
    (FRAME_TOO_LARGE for AUTHENTICATE, AUTHENTICATION_REQUIRED for anything else) and the
    connection closed; after it, frames up to max_frame_size are read again."""
    from headwater.wire.errors import FrameTooLarge
    from headwater.wire.frames import frame_prefix
    from headwater.wire.limits import MAX_PRE_AUTH_FRAME

    big = m.AuthenticateRequest("token", b"x" * (MAX_PRE_AUTH_FRAME + 1))
    peer = await RawPeer.open(secure.address)
    answer = await peer.call(big)
    assert isinstance(answer, FrameTooLarge), answer
    assert f"{MAX_PRE_AUTH_FRAME}-byte limit before authentication" in answer.message
    assert await peer.closed_by_server()
    await peer.close()
    # a large CREATE_TOPIC: only its header is read (the rest is never sent here at all)
    peer = await RawPeer.open(secure.address)
    await peer.send(frame_prefix(m.ApiKey.CREATE_TOPIC, 0, 5, 0, 8_000_000) + b"\x00\x01t")
    answer = await peer.response()
    assert isinstance(answer, AuthenticationRequired), answer
    assert await peer.closed_by_server()
    await peer.close()
    # authenticated, a 1 MiB produce is read and stored
    async with await headwater.connect(secure.address, token=secure.admin) as admin:
        await admin.create_topic("big", dispatch="non-reliable")
        peer = await RawPeer.open(secure.address)
        assert isinstance(
            await peer.call(m.AuthenticateRequest("token", secure.admin.encode())),
            m.AuthenticateResponse,
        )
        batch = build_batch([(None, b"v" * (1 << 20), ())])
        assert isinstance(await peer.call(m.ProduceRequest("big", 0, batch)), m.ProduceResponse)
        await peer.close()
        assert (await admin.describe_topic("big")).messages_in == 1


async def test_lookup_and_server_info_tell_a_principal_nothing_beyond_its_grants(
    secure: SecureServer,
) -> None:
    """LOOKUP answers a topic without a grant exactly as one that does not exist; SERVER_INFO
    (server-wide counts, the data directory) takes admin:* (before the fix both answered)."""
    async with await headwater.connect(secure.address, token=secure.admin) as admin:
        await admin.create_topic("alice.payroll-2026", partitions=3, dispatch="non-reliable")
        await admin.create_topic("bob.inbox", dispatch="non-reliable")
    peer = await RawPeer.open(secure.address)
    token = secure.token("bob", "consume:bob.*")
    assert isinstance(
        await peer.call(m.AuthenticateRequest("token", token.encode())), m.AuthenticateResponse
    )
    answer = await peer.call(m.LookupRequest(("alice.payroll-2026", "alice.nothing", "bob.inbox")))
    assert isinstance(answer, m.LookupResponse), answer
    hidden, missing, own = answer.topics
    assert hidden == m.LookupTopic.unknown("alice.payroll-2026")
    assert missing == m.LookupTopic.unknown("alice.nothing")
    assert (hidden.error_code, hidden.error_message[-15:]) == (
        missing.error_code,
        missing.error_message[-15:],
    )
    assert own.error_code == 0 and len(own.partitions) == 1
    # a long poll's answer is filtered the same; waiting on a topic without a grant is refused
    # (one that does not exist is answered at once: the wait's length would tell)
    waits = (m.LookupWait("bob.inbox", 0, 0),)
    polled = await peer.call(m.LookupRequest(("alice.payroll-2026", "bob.inbox"), 200, waits))
    assert isinstance(polled, m.LookupResponse), polled
    assert polled.topics == (hidden, own)
    for topic in ("alice.payroll-2026", "alice.nothing"):
        waited = await peer.call(m.LookupRequest((), 200, (m.LookupWait(topic, 0, 0),)))
        assert isinstance(waited, NotAuthorized), waited
        assert f"no grant on topic {topic!r}" in waited.message
    refused = await peer.call(m.ServerInfoRequest())
    assert isinstance(refused, NotAuthorized), refused
    assert "admin:*" in refused.message
    await peer.close()
    narrow = await headwater.connect(secure.address, token=secure.token("ops", "admin:bob.*"))
    with pytest.raises(NotAuthorized):
        await narrow.server_info()
    await narrow.close()
    async with await headwater.connect(secure.address, token=secure.admin) as admin:
        info = await admin.server_info()
        assert info.topic_count == 2
