"""The blocking client (used by the locustfile) against a real server."""

from __future__ import annotations

import pytest

from headwater.client.blocking import BlockingClient
from headwater.testing import ServerProcess
from headwater.wire.errors import ConnectionClosed, TopicExists, UnknownTopic


def test_blocking_client_produces_and_uses_maps(server: ServerProcess, topic_name: str) -> None:
    with BlockingClient(server.address) as client:
        client.create_topic(topic_name, reliable=True, configs={"last.value": "true"})
        with pytest.raises(TopicExists):
            client.create_topic(topic_name)
        assert client.produce(topic_name, [(b"k", b"v1", ()), (b"k", b"v2", ())]) == 0
        assert client.produce(topic_name, [(None, b"v3", ())]) == 2
        assert client.map_get(topic_name, b"k") == b"v2"
        assert client.map_set(topic_name, b"k", b"v4") == 3
        assert client.map_get(topic_name, b"k") == b"v4"
        assert client.map_get(topic_name, b"absent") is None
        with pytest.raises(UnknownTopic):
            client.produce("no-such-topic", [(None, b"x", ())])


def test_blocking_client_connection_errors() -> None:
    with pytest.raises(ConnectionClosed, match="cannot connect"):
        BlockingClient("127.0.0.1:1")
