"""Bounds before authentication on the Kafka port (docs/KAFKA.md, docs/SECURITY.md), against a
live server with a tokens file: connections waiting to authenticate are capped per address and in
all at accept, sharing the native port's caps, so 10,000 silent sockets leave room for a token
holder; before SaslAuthenticate a Produce is refused from its header alone (a huge size prefix
closes the connection before any of the body is sent)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from headwater.server.security.tokens import create
from headwater.testing import ServerProcess
from tests.support.kafka_support import RawKafka
from tests.test_hostile import Attack

METADATA, PRODUCE, API_VERSIONS = 3, 0, 18


def _server(root: Path, toml: str) -> tuple[ServerProcess, str, int]:
    tokens = root / "tokens.json"
    _, admin = create(tokens, "admin", ("all:*",), None, None)
    assert admin is not None
    config = root / "headwater.toml"
    config.write_text(toml)
    port_file = root / "kafka.port"
    process = ServerProcess(
        root / "data",
        extra_args=(
            "--auth-tokens", str(tokens), "--config", str(config),
            "--kafka-port", "0", "--kafka-port-file", str(port_file),
        ),
    ).start()  # fmt: skip
    return process, admin, int(port_file.read_text())


def _authenticate(raw: RawKafka, token: str) -> int:
    raw.request(17, 1, 1, struct.pack(">h", 5) + b"PLAIN")
    _, body = raw.response()
    assert struct.unpack_from(">h", body)[0] == 0
    credentials = b"\0user\0" + token.encode()
    raw.request(36, 0, 2, struct.pack(">i", len(credentials)) + credentials)
    _, body = raw.response()
    return int(struct.unpack_from(">h", body)[0])


def _answers(raw: RawKafka) -> bool:
    """An ApiVersions answered: the connection was accepted (and is counted)."""
    try:
        raw.request(API_VERSIONS, 0, 7)
        return raw.response()[0] == 7
    except OSError:  # closed at accept: reset, or EOF before the answer
        return False


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str, int]]:
    process, admin, port = _server(
        tmp_path_factory.mktemp("kafka-guarded"), "[server]\nmax_connections = 1000\n"
    )
    try:
        yield process, admin, port
    finally:
        process.kill()
    assert "Traceback" not in process.log()


async def test_anonymous_sockets_leave_room_for_an_authenticated_kafka_client(
    guarded: tuple[ServerProcess, str, int],
) -> None:
    """10,000 silent sockets on the Kafka port from one address (127.0.0.2), reopened as they
    are closed, while a token holder opens 50 Kafka connections from another, authenticates and
    asks for Metadata: all 50 are served. Before the fix the silent sockets held every one of
    the 1,000 Kafka slots (each for handshake_timeout) and the token holder's connections were
    closed at accept."""
    _, admin, port = guarded
    attack = Attack("anonymous", f"127.0.0.1:{port}", "60", "10000", "127.0.0.2")
    served = 0
    try:
        await attack.started(timeout=120)
        for _ in range(50):
            assert attack.running(), attack.output()
            raw = RawKafka(port)
            try:
                assert _authenticate(raw, admin) == 0
                raw.request(METADATA, 1, 3, struct.pack(">i", 0))
                assert raw.response()[0] == 3
            finally:
                raw.close()
            served += 1
    finally:
        attack.kill()
    assert served == 50


def test_a_pre_auth_produce_is_refused_from_its_header(
    guarded: tuple[ServerProcess, str, int],
) -> None:
    """A Produce before SaslAuthenticate closes the connection: one whose size prefix says
    64 MiB is refused after its 4-byte prefix and header, none of the body sent (nothing of it
    buffered or decoded); a small one is refused from its api key. A client that authenticated
    keeps working meanwhile."""
    _, admin, port = guarded
    holder = RawKafka(port)
    try:
        assert _authenticate(holder, admin) == 0
        header = struct.pack(">hhih", PRODUCE, 3, 1, 3) + b"raw"
        huge = RawKafka(port)
        try:
            huge.send_raw(struct.pack(">i", 64 << 20) + header)
            assert huge.closed()
        finally:
            huge.close()
        small = RawKafka(port)
        try:  # transactional id null, acks -1, timeout, no topics: well-formed
            small.request(PRODUCE, 3, 1, struct.pack(">hhii", -1, -1, 1000, 0))
            assert small.closed()
        finally:
            small.close()
        holder.request(METADATA, 1, 3, struct.pack(">i", 0))
        assert holder.response()[0] == 3
    finally:
        holder.close()


def test_kafka_connections_waiting_to_authenticate_are_capped_per_address_and_in_all(
    tmp_path: Path,
) -> None:
    """Past max_unauthenticated_per_address Kafka connections from one address waiting to
    authenticate, or max_unauthenticated_connections in all (the native port's too), a new one
    is closed at accept; authenticating frees the slot."""
    process, admin, port = _server(
        tmp_path,
        "[security]\nmax_unauthenticated_connections = 5\nmax_unauthenticated_per_address = 3\n",
    )
    opened: list[RawKafka] = []

    def open_from(source: str) -> RawKafka:
        opened.append(RawKafka(port, source=source))
        return opened[-1]

    try:
        first = [open_from("127.0.0.2") for _ in range(3)]
        assert all(_answers(raw) for raw in first)  # each answered, so each counted
        assert not _answers(open_from("127.0.0.2"))  # the fourth from the address
        second = [open_from("127.0.0.3") for _ in range(2)]
        assert all(_answers(raw) for raw in second)
        assert not _answers(open_from("127.0.0.4"))  # the sixth in all
        assert _authenticate(first[0], admin) == 0  # its slot is free for a newcomer
        assert _answers(open_from("127.0.0.4"))
    finally:
        for raw in opened:
            raw.close()
        process.kill()
    assert "Traceback" not in process.log()
