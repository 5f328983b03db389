"""TLS for client connections: server certificates, client certificates as identity, a
certificate from the wrong CA, and a certificate replaced without a restart.

The CAs and certificates are made by each test (tests/support/certs.py, with `cryptography`).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import headwater
from headwater import Tls
from headwater.server.security.tokens import create
from headwater.wire.errors import AuthenticationFailed, ConnectionClosed, NotAuthorized
from tests.support.certs import Authority, Issued
from tests.support.cli_process import hw
from tests.support.secure import SecureServer, secure_server


@dataclass
class Pki:
    ca: Authority
    rogue: Authority
    server: Issued


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    directory = tmp_path / "pki"
    directory.mkdir()
    ca = Authority.create(directory, "ca")
    return Pki(ca, Authority.create(directory, "rogue"), ca.issue(directory, "server", True))


@pytest.fixture
def tls_server(tmp_path: Path, pki: Pki) -> Iterator[SecureServer]:
    args = ("--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key))
    with secure_server(tmp_path, *args, "--tls-client-ca", str(pki.ca.path)) as server:
        yield server


async def test_token_over_tls_round_trip_and_plaintext_is_refused(
    tls_server: SecureServer, pki: Pki
) -> None:
    tls = Tls(ca=pki.ca.path)
    async with await headwater.connect(
        tls_server.address, token=tls_server.admin, tls=tls
    ) as client:
        await client.create_topic("secret", dispatch="non-reliable")
        consumer = await client.subscribe("secret", "s")
        await (await client.producer("secret").send(b"over tls"))
        assert (await consumer.receive(timeout=30)).value == b"over tls"
    with pytest.raises(ConnectionClosed):  # a plaintext client never gets a frame
        await headwater.connect(tls_server.address, token=tls_server.admin, timeout=3)
    with pytest.raises(ConnectionClosed, match="certificate verify failed"):
        await headwater.connect(tls_server.address, tls=Tls(ca=pki.rogue.path))
    # the failed handshakes are logged with the peer's address (issue 22)
    deadline = time.monotonic() + 10
    while not any(
        "conn.tls_failed" in line and "peer=127.0.0.1:" in line
        for line in tls_server.process.log().splitlines()
    ):
        assert time.monotonic() < deadline, "no conn.tls_failed line with the peer address"
        await asyncio.sleep(0.05)


async def test_client_certificate_is_the_identity_and_its_grants_apply(
    tls_server: SecureServer, pki: Pki, tmp_path: Path
) -> None:
    create(tls_server.tokens, "svc", ("produce:svc.*",), certificate=True)
    async with await headwater.connect(
        tls_server.address, token=tls_server.admin, tls=Tls(ca=pki.ca.path)
    ) as admin:
        await admin.create_topic("svc.events", dispatch="non-reliable")
        await admin.create_topic("other", dispatch="non-reliable")
        issued = pki.ca.issue(tmp_path / "pki", "svc", False)
        client = await headwater.connect(
            tls_server.address, tls=Tls(pki.ca.path, issued.cert, issued.key)
        )
        assert client._connection.principal == "svc"
        await (await client.producer("svc.events").send(b"by certificate"))
        with pytest.raises(NotAuthorized):
            await (await client.producer("other").send(b"no"))
        await client.close()
        assert (await admin.describe_topic("svc.events")).messages_in == 1
        assert (await admin.describe_topic("other")).messages_in == 0


async def test_client_certificate_from_the_wrong_ca_is_refused(
    tls_server: SecureServer, pki: Pki, tmp_path: Path
) -> None:
    create(tls_server.tokens, "svc", ("all:*",), certificate=True)
    async with await headwater.connect(
        tls_server.address, token=tls_server.admin, tls=Tls(ca=pki.ca.path)
    ) as admin:
        await admin.create_topic("target", dispatch="non-reliable")
        forged = pki.rogue.issue(tmp_path / "pki", "svc", False)  # the right name, wrong CA
        with pytest.raises(AuthenticationFailed):
            await headwater.connect(
                tls_server.address, tls=Tls(pki.ca.path, forged.cert, forged.key)
            )
        with pytest.raises(AuthenticationFailed):  # nor with a valid token alongside it
            await headwater.connect(
                tls_server.address,
                token=tls_server.admin,
                tls=Tls(pki.ca.path, forged.cert, forged.key),
            )
        assert (await admin.describe_topic("target")).messages_in == 0
        # A certificate of the right CA whose name has no entry is refused by the handshake.
        stranger = pki.ca.issue(tmp_path / "pki", "stranger", False)
        with pytest.raises(AuthenticationFailed, match="no valid certificate entry"):
            await headwater.connect(
                tls_server.address, tls=Tls(pki.ca.path, stranger.cert, stranger.key)
            )


async def test_server_certificate_is_replaced_without_a_restart(tmp_path: Path, pki: Pki) -> None:
    live = Issued(tmp_path / "live.crt", tmp_path / "live.key")
    live.cert.write_bytes(pki.server.cert.read_bytes())
    live.key.write_bytes(pki.server.key.read_bytes())
    with secure_server(tmp_path, "--tls-cert", str(live.cert), "--tls-key", str(live.key)) as s:
        old = await headwater.connect(s.address, token=s.admin, tls=Tls(ca=pki.ca.path))
        with pytest.raises(ConnectionClosed):
            await headwater.connect(s.address, token=s.admin, tls=Tls(ca=pki.rogue.path))
        rotated = pki.rogue.issue(tmp_path / "pki", "server", True)
        for source, target in ((rotated.key, live.key), (rotated.cert, live.cert)):
            temporary = target.with_suffix(".new")
            temporary.write_bytes(source.read_bytes())
            os.replace(temporary, target)
        client = await _connect_within(s, Tls(ca=pki.rogue.path), seconds=10)
        assert "tls.reloaded" in s.process.log()
        await client.list_topics()
        await old.list_topics()  # an established connection keeps its session
        await client.close()
        await old.close()


async def _connect_within(server: SecureServer, tls: Tls, seconds: float) -> headwater.Client:
    deadline = time.monotonic() + seconds
    while True:
        try:
            return await headwater.connect(server.address, token=server.admin, tls=tls)
        except ConnectionClosed:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_cli_client_options(tls_server: SecureServer, pki: Pki, tmp_path: Path) -> None:
    create(tls_server.tokens, "cli", ("admin:cli.*",), certificate=True)
    issued = pki.ca.issue(tmp_path / "pki", "cli", False)
    command = [sys.executable, "-m", "headwater", "topic", "create", "cli.t"]
    command += ["--server", tls_server.address, "--tls", "--ca", str(pki.ca.path)]
    command += ["--cert", str(issued.cert), "--cert-key", str(issued.key)]
    env = {k: v for k, v in os.environ.items() if k != "HEADWATER_TOKEN"}
    result = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 0, result.stderr
    assert "created topic cli.t" in result.stdout


async def test_failed_tls_handshakes_give_back_their_admission_slot(
    tmp_path: Path, pki: Pki
) -> None:
    """A connection whose TLS handshake fails never opens, so the listener, not the connection,
    gives back its slot among those waiting to authenticate: with 2 slots per address, ten
    failed handshakes in a row still leave room for a good client."""
    config = tmp_path / "headwater.toml"
    config.write_text("[security]\nmax_unauthenticated_per_address = 2\n")
    args = ("--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key))
    with secure_server(tmp_path, *args, "--config", str(config)) as server:
        for _ in range(10):
            with pytest.raises(ConnectionClosed):
                await headwater.connect(server.address, tls=Tls(ca=pki.rogue.path), timeout=5)
        async with await headwater.connect(
            server.address, token=server.admin, tls=Tls(ca=pki.ca.path)
        ) as client:
            await client.list_topics()


def test_the_cli_without_tls_on_a_tls_port_says_to_give_tls(tls_server: SecureServer) -> None:
    """The likeliest first mistake after turning TLS on: it said only CONNECTION_CLOSED."""
    result = hw("topic", "list", "--server", tls_server.address, "--token", tls_server.admin)
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("headwater: error: CONNECTION_CLOSED: "), line
    assert "speaks TLS" in line and "--tls" in line, line
