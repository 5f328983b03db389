"""The operator's HTTP port under the message port's security rules: HTTPS with the message port's
certificate (and its reloads), bearer tokens from the same tokens file with the `admin:*` grant,
the shared per-address failure limit, and loopback-only without authentication.

Real servers in child processes; the CA and certificates are made per test module
(tests/support/certs.py); HTTPS requests verify the server's certificate against that CA.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import headwater
from headwater.server.config import ServerConfig
from headwater.server.net.listener import Listener, StartupError
from headwater.server.ops.operator_port import start_operator_port
from headwater.server.security.tls import peer_common_name
from headwater.server.security.tokens import revoke
from headwater.testing import ServerProcess
from headwater.wire.errors import AuthenticationFailed
from tests.support.certs import Authority, Issued
from tests.support.secure import SecureServer, secure_server

Answer = tuple[int, dict[str, str], bytes]


@dataclass
class HttpsServer:
    secure: SecureServer
    port: int  # the HTTP port
    ca: Authority
    server: Issued  # the certificate files the server was started with
    directory: Path

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca.path)


def http_args(directory: Path) -> tuple[tuple[str, ...], Path]:
    port_file = directory / "http.port"
    return ("--http-port", "0", "--http-port-file", str(port_file)), port_file


@pytest.fixture(scope="module")
def https(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpsServer]:
    directory = tmp_path_factory.mktemp("https")
    pki = directory / "pki"
    pki.mkdir()
    ca = Authority.create(pki, "ca")
    issued = ca.issue(pki, "server", True)
    args, port_file = http_args(directory)
    tls = ("--tls-cert", str(issued.cert), "--tls-key", str(issued.key))
    with secure_server(directory, *tls, *args) as server:
        yield HttpsServer(server, int(port_file.read_text()), ca, issued, pki)


def get(
    port: int,
    path: str,
    token: str | None = None,
    context: ssl.SSLContext | None = None,
    method: str = "GET",
) -> Answer:
    connection: http.client.HTTPConnection
    if context is None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    else:
        connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    try:
        connection.request(method, path, headers=headers)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def secure_get(https: HttpsServer, path: str, token: str | None = None) -> Answer:
    return get(https.port, path, token, https.context())


def assert_unauthorized(answer: Answer) -> None:
    status, headers, body = answer
    assert status == 401
    assert headers["WWW-Authenticate"].startswith('Bearer realm="headwater"')
    assert b"headwater_" not in body  # no metrics, no status


# HTTPS


def test_https_serves_metrics_to_an_admin_token(https: HttpsServer) -> None:
    status, headers, body = secure_get(https, "/metrics", https.secure.admin)
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=")
    names = {family.name for family in text_string_to_metric_families(body.decode())}
    assert {"headwater_connections", "headwater_info"} <= names
    status, _, body = secure_get(https, "/status.json", https.secure.admin)
    assert status == 200 and body.startswith(b"{")


def test_plaintext_on_the_https_port_gets_nothing(https: HttpsServer) -> None:
    received = b""
    with socket.create_connection(("127.0.0.1", https.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the server closes (bounded)
            try:
                chunk = sock.recv(4096)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
        else:
            pytest.fail("the server kept a plaintext connection open")
    assert b"HTTP/1." not in received and b"ok" not in received
    # and the port still serves HTTPS afterwards
    assert secure_get(https, "/healthz")[0] == 200


def test_a_replaced_certificate_is_served_without_a_restart(https: HttpsServer) -> None:
    fresh = https.ca.issue(https.directory, "server-renewed", True)
    os.replace(fresh.key, https.server.key)  # key first: a mismatched pair is never loaded
    os.replace(fresh.cert, https.server.cert)
    deadline = time.monotonic() + 10
    name = None
    while time.monotonic() < deadline:
        with (
            socket.create_connection(("127.0.0.1", https.port), timeout=10) as raw,
            https.context().wrap_socket(raw, server_hostname="127.0.0.1") as sock,
        ):
            name = peer_common_name(sock.getpeercert())
        if name == "server-renewed":
            break
        time.sleep(0.1)  # polling the server's once-a-second file check, bounded by the deadline
    assert name == "server-renewed"
    assert secure_get(https, "/metrics", https.secure.admin)[0] == 200


# Bearer tokens


def test_no_token_gets_401_with_a_bearer_challenge_on_every_path_but_healthz(
    https: HttpsServer,
) -> None:
    for path in ("/metrics", "/status.json", "/", "/readyz", "/no-such-path"):
        assert_unauthorized(secure_get(https, path))
    status, headers, _ = get(https.port, "/metrics", None, https.context(), method="HEAD")
    assert status == 401 and "WWW-Authenticate" in headers
    status, _, body = secure_get(https, "/healthz")
    assert (status, body) == (200, b"ok\n")


def test_wrong_unknown_malformed_and_expired_tokens_get_the_same_401(https: HttpsServer) -> None:
    good = https.secure.token("scraper", "admin:*")
    token_id, secret = good.split(".")[1:]
    wrong_secret = f"hw1.{token_id}.{'A' * len(secret)}"
    unknown_id = f"hw1.000000000000.{secret}"
    expired = https.secure.token("scraper", "admin:*", expires=int(time.time()) - 1)
    answers = [
        secure_get(https, "/metrics", token)
        for token in (wrong_secret, unknown_id, "not-a-token", expired)
    ]
    for answer in answers:
        assert_unauthorized(answer)
    # nothing tells an unknown id from a known one with a wrong secret, or from an expired one
    assert len({(a[0], a[1]["WWW-Authenticate"], a[2]) for a in answers}) == 1
    log = https.secure.process.log()
    assert "auth.http_failed" in log
    assert secret not in log and "A" * len(secret) not in log  # never the secret


def test_a_revoked_token_is_refused_on_its_next_request(https: HttpsServer) -> None:
    token = https.secure.token("rotating", "admin:*")
    assert secure_get(https, "/metrics", token)[0] == 200
    revoke(https.secure.tokens, token.split(".")[1])
    assert_unauthorized(secure_get(https, "/metrics", token))


def test_a_token_without_admin_on_every_topic_gets_403(https: HttpsServer) -> None:
    for grants in (("consume:*", "produce:*"), ("admin:orders.*",), ("admin:orders",)):
        token = https.secure.token("narrow", *grants)
        status, headers, body = secure_get(https, "/metrics", token)
        assert status == 403, grants
        assert "WWW-Authenticate" not in headers
        assert b"admin:*" in body
    assert secure_get(https, "/metrics", https.secure.token("ops", "admin:*"))[0] == 200


async def test_http_failures_count_against_the_address_with_the_message_port(
    tmp_path: Path,
) -> None:
    args, port_file = http_args(tmp_path)
    with secure_server(tmp_path, *args) as server:
        port = int(port_file.read_text())
        for _ in range(10):  # the default auth_failures_per_minute
            assert_unauthorized(get(port, "/metrics", "hw1.000000000000.guess"))
        status, headers, _ = get(port, "/metrics", "hw1.000000000000.guess")
        assert status == 429 and headers["Retry-After"] == "60"
        assert get(port, "/healthz")[0] == 200
        # a valid token is never refused for the failures of others at the same address
        assert get(port, "/metrics", server.admin)[0] == 200
        async with await headwater.connect(server.address, token=server.admin) as client:
            await client.list_topics()
        # the message port counts that id's failures too: its next failure is slowed
        with pytest.raises(AuthenticationFailed, match="too many failed"):
            await headwater.connect(server.address, token="hw1.000000000000.guess")


# Without authentication


def test_auth_off_on_loopback_serves_without_a_token(tmp_path: Path) -> None:
    args, port_file = http_args(tmp_path)
    process = ServerProcess(tmp_path / "data", extra_args=args).start()
    try:
        port = int(port_file.read_text())
        status, _, body = get(port, "/metrics")
        assert status == 200
        assert any(
            f.name.startswith("headwater_") for f in text_string_to_metric_families(body.decode())
        )
    finally:
        process.kill()


async def test_the_http_port_refuses_a_non_loopback_host_without_auth(tmp_path: Path) -> None:
    # The message port refuses such a host first today; this holds the HTTP port to the rule
    # on its own, so a separate HTTP host could not bypass it.
    config = ServerConfig(host="0.0.0.0", http_port=0, data_dir=tmp_path)
    listener = Listener(config)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(listener.close)
        with pytest.raises(StartupError, match=r"refusing to serve HTTP on 0\.0\.0\.0"):
            await start_operator_port(config, listener, stack)
