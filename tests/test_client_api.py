"""The client's conveniences (issue 13 item 5): exist_ok, HEADWATER_SERVER, exported errors."""

from __future__ import annotations

import inspect

import pytest

import headwater
from headwater.client.blocking import BlockingClient
from headwater.client.broker_connection import default_server
from headwater.testing import ServerProcess
from headwater.wire import errors


async def test_create_topic_exist_ok_accepts_an_existing_topic(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, exist_ok=True)  # created
    await client.create_topic(topic_name, exist_ok=True)  # exists: no error
    with pytest.raises(headwater.TopicExists):
        await client.create_topic(topic_name)
    assert [t.name for t in await client.list_topics()].count(topic_name) == 1


def test_blocking_create_topic_exist_ok(server: ServerProcess, topic_name: str) -> None:
    with BlockingClient(server.address) as client:
        client.create_topic(topic_name, exist_ok=True)
        client.create_topic(topic_name, exist_ok=True)
        with pytest.raises(headwater.TopicExists):
            client.create_topic(topic_name)


async def test_connect_without_an_address_reads_headwater_server(
    server: ServerProcess, topic_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEADWATER_SERVER", server.address)
    async with await headwater.connect() as client:
        await client.create_topic(topic_name)
    with BlockingClient() as blocking:
        blocking.create_topic(topic_name, exist_ok=True)


def test_the_default_server_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEADWATER_SERVER", raising=False)
    assert default_server() == "127.0.0.1:6650"
    monkeypatch.setenv("HEADWATER_SERVER", "")
    assert default_server() == "127.0.0.1:6650"
    monkeypatch.setenv("HEADWATER_SERVER", "10.1.2.3:7000")
    assert default_server() == "10.1.2.3:7000"


def test_every_headwater_error_is_importable_from_headwater() -> None:
    classes = {
        name: cls
        for name, cls in vars(errors).items()
        if inspect.isclass(cls) and issubclass(cls, errors.HeadwaterError) and name[0] != "_"
    }
    assert len(classes) > 30
    for name, cls in classes.items():
        assert getattr(headwater, name, None) is cls, name
        assert name in headwater.__all__, name


def test_a_turns_acks_are_split_into_requests_within_the_limits() -> None:
    from headwater.client.consumer import ack_requests
    from headwater.wire import messages as m
    from headwater.wire.limits import MAX_ACK_RANGES_PER_REQUEST, MAX_OFFSETS_PER_ACK_RANGES

    limit = MAX_OFFSETS_PER_ACK_RANGES
    long_run = [m.AckRange(0, 5, 2 * limit + limit // 2)]  # more than one request covers
    requests = list(ack_requests(3, long_run))
    assert [r.ranges for r in requests] == [
        (m.AckRange(0, 5, limit),),
        (m.AckRange(0, 5 + limit, limit),),
        (m.AckRange(0, 5 + 2 * limit, limit // 2),),
    ]
    singles = [m.AckRange(1, 2 * i, 1) for i in range(MAX_ACK_RANGES_PER_REQUEST + 1)]
    requests = list(ack_requests(3, singles))
    assert [len(r.ranges) for r in requests] == [MAX_ACK_RANGES_PER_REQUEST, 1]
    assert [x for r in requests for x in r.ranges] == singles
    for request in requests:
        assert request.consumer_id == 3
        assert sum(x.count for x in request.ranges) <= MAX_OFFSETS_PER_ACK_RANGES
    assert list(ack_requests(3, [])) == []
