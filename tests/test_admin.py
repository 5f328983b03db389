"""Topic administration, persistence of topic metadata, and server lifecycle."""

from __future__ import annotations

import pytest

import headwater
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import ServerShuttingDown, TopicExists, UnknownTopic
from headwater.wire.protocol import SUPPORTED_VERSIONS


async def test_create_list_describe_delete(fresh_server: ServerProcess) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("alpha", partitions=3, dispatch="non-reliable")
        await client.create_topic("beta", dispatch="non-reliable")
        with pytest.raises(TopicExists):
            await client.create_topic("alpha", dispatch="non-reliable")
        assert await client.list_topics() == [
            m.TopicInfo("alpha", 3, m.DispatchMode.NON_RELIABLE),
            m.TopicInfo("beta", 1, m.DispatchMode.NON_RELIABLE),
        ]
        consumer = await client.subscribe("alpha", "s1", type="shared", name="c1", prefetch=7)
        producer = client.producer("alpha")
        for partition in (0, 2, 2):
            await producer.send(b"12345", partition=partition)
        await producer.flush()
        description = await client.describe_topic("alpha")
        assert description.topic == m.TopicInfo("alpha", 3, m.DispatchMode.NON_RELIABLE)
        assert description.next_offsets == (1, 0, 2)
        assert description.messages_in == 3
        (subscription,) = description.subscriptions
        assert subscription.name == "s1" and subscription.sub_type == m.SubscriptionType.SHARED
        assert subscription.delivered == 3 and subscription.dropped == 0
        (info,) = subscription.consumers
        assert info.name == "c1" and info.credits <= 7 - 2
        await client.delete_topic("alpha")
        # the consumer learns its topic is gone
        received = [await consumer.receive(timeout=30) for _ in range(3)]
        assert len(received) == 3
        with pytest.raises(UnknownTopic, match="deleted"):
            await consumer.receive(timeout=30)
        assert [t.name for t in await client.list_topics()] == ["beta"]


async def test_topics_survive_a_restart(fresh_server: ServerProcess) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("kept", partitions=2, dispatch="non-reliable")
        await client.create_topic("gone", dispatch="non-reliable")
        await client.delete_topic("gone")
    assert fresh_server.stop() == 0  # graceful shutdown on SIGTERM
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        assert await client.list_topics() == [m.TopicInfo("kept", 2, m.DispatchMode.NON_RELIABLE)]


async def test_topics_survive_kill_9(fresh_server: ServerProcess) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("durable-metadata", dispatch="non-reliable")
    fresh_server.kill()
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        assert [t.name for t in await client.list_topics()] == ["durable-metadata"]


async def test_api_versions(client: headwater.Client) -> None:
    versions = await client.api_versions()
    assert versions == SUPPORTED_VERSIONS
    assert versions[m.ApiKey.PRODUCE] == (0, 0)


async def test_graceful_shutdown_with_connected_clients(fresh_server: ServerProcess) -> None:
    client = await headwater.connect(fresh_server.address)
    await client.create_topic("t", dispatch="non-reliable")
    consumer = await client.subscribe("t", "s")
    assert fresh_server.stop() == 0
    # the consumer is told why it ends (CONSUMER_CLOSED with SERVER_SHUTTING_DOWN), not left
    # to mistake the closed connection for the end of the topic
    with pytest.raises(ServerShuttingDown):
        async for _ in consumer:
            pass
    assert "server.stopped" in fresh_server.log()
    await client.close()
