"""Peer links (`server.cluster.peer_links`), the connections a broker writes to other brokers'
partitions over (dead letters), against a real server on this test's loop (an ephemeral port):

- with authentication, the link authenticates with its peer token first, and a produce is
  answered with the offset the peer gave it; pipelined produces from many tasks share one link;
- a token the peer refuses, a grant it lacks, a partition it does not have: each a precise
  `HeadwaterError` for the caller (which keeps its dead letter due), never a hang;
- a peer that accepts and never answers: `RequestTimeout` after the link's bound, and the next
  produce opens a new link;
- a peer that is gone: `ConnectionLost` at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import headwater
from headwater.server.cluster import peer_links
from headwater.server.cluster.peer_links import PeerLinks
from headwater.server.config import SecurityConfig, ServerConfig
from headwater.server.requests.partition_ownership import BrokerAddress
from headwater.server.security.tokens import create
from headwater.wire import messages as m
from headwater.wire.errors import (
    AuthenticationFailed,
    ConnectionLost,
    HeadwaterError,
    NotAuthorized,
    RequestTimeout,
    UnknownTopic,
)
from headwater.wire.records import build_batch
from tests.support.in_process import InProcessServer, in_process_server


@pytest.fixture
async def secure(tmp_path: Path) -> AsyncIterator[tuple[InProcessServer, dict[str, str]]]:
    tokens = tmp_path / "tokens.json"
    made = {}
    for principal, grants in (
        ("admin", ("all:*",)),
        ("peer", ("produce:orders-*",)),  # the dead-letter topics of `orders`
        ("reader", ("consume:*",)),
    ):
        _, token = create(tokens, principal, grants)
        assert token is not None
        made[principal] = token
    config = ServerConfig(data_dir=tmp_path / "data", security=SecurityConfig(auth_tokens=tokens))
    async with in_process_server(config) as server:
        yield server, made


def _address(server: InProcessServer) -> BrokerAddress:
    host, port = server.address.rsplit(":", 1)
    return BrokerAddress("peer", host, int(port))


async def test_a_link_authenticates_and_pipelined_produces_share_it(
    secure: tuple[InProcessServer, dict[str, str]],
) -> None:
    server, tokens = secure
    dlq = "orders-work-0123456789abcdef-DLQ"
    async with await headwater.connect(server.address, token=tokens["admin"]) as admin:
        await admin.create_topic("plain", dispatch="reliable")
    async with server.catalog.turn(dlq):  # as the server makes its own (CREATE_TOPIC refuses)
        await server.catalog.create_locked(
            m.CreateTopicRequest(dlq, 1, m.DispatchMode.RELIABLE, ())
        )
    links = PeerLinks(tokens["peer"])
    try:
        offsets = await asyncio.gather(
            *(
                links.produce(_address(server), dlq, 0, build_batch([(None, b"%d" % i, ())]))
                for i in range(200)
            )
        )
        assert sorted(offsets) == list(range(200))
        assert len(links._links) == 1  # one connection for all of them
        with pytest.raises(NotAuthorized):  # the peer token's grant covers those only
            await links.produce(_address(server), "plain", 0, build_batch([(None, b"x", ())]))
        with pytest.raises(UnknownTopic):
            await links.produce(
                _address(server), "orders-gone-DLQ", 0, build_batch([(None, b"", ())])
            )
    finally:
        await links.close()


async def test_a_refused_token_is_an_error_not_a_hang(
    secure: tuple[InProcessServer, dict[str, str]],
) -> None:
    server, _ = secure
    links = PeerLinks("hw1.000000000000.not-a-real-secret")
    try:
        with pytest.raises((AuthenticationFailed, ConnectionLost)):
            await links.produce(_address(server), "t-DLQ", 0, build_batch([(None, b"x", ())]))
    finally:
        await links.close()


async def test_a_silent_peer_times_out_and_the_next_produce_opens_a_new_link(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(peer_links, "PEER_TIMEOUT", 0.5)
    accepted: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # reads nothing, answers nothing

    silent = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    peer = BrokerAddress("silent", "127.0.0.1", port)
    links = PeerLinks()
    try:
        for attempt in (1, 2):
            with pytest.raises(RequestTimeout):
                await links.produce(peer, "t-DLQ", 0, build_batch([(None, b"x", ())]))
            assert len(accepted) == attempt  # the silent link was dropped, a new one opened
    finally:
        await links.close()
        for writer in accepted:
            writer.close()
        silent.close()
        await silent.wait_closed()


async def test_a_peer_that_is_gone_is_connection_lost() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()  # nothing listens on the port now
    links = PeerLinks()
    try:
        with pytest.raises(ConnectionLost) as raised:
            await links.produce(
                BrokerAddress("gone", "127.0.0.1", port), "t-DLQ", 0, build_batch([(None, b"", ())])
            )
        assert isinstance(raised.value, HeadwaterError)
    finally:
        await links.close()
