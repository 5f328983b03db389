"""Concurrent and pipelined admin requests against a live server: every request is answered,
nothing is left half-done, a delete stays deleted across restarts, and a name re-created after a
delete is a new topic whose data survives."""

from __future__ import annotations

import asyncio

import headwater
from headwater.testing import ServerProcess
from tests.rawwire import RawPeer
from wire import messages as m
from wire.codec import decode_push, decode_response, encode_request
from wire.errors import ErrorCode, HeadwaterError, UnknownSubscription, UnknownTopic
from wire.records import build_batch

RELIABLE = m.DispatchMode.RELIABLE


async def _pipelined(
    peer: RawPeer, *requests: m.Request, pushes: list[m.Push] | None = None
) -> list[m.Response | HeadwaterError]:
    """Send `requests` in one write and return their answers in request order (pushes that
    arrive meanwhile go to `pushes`)."""
    await peer.send(b"".join(encode_request(r, 1000 + i) for i, r in enumerate(requests)))
    answers: dict[int, m.Response | HeadwaterError] = {}
    while len(answers) < len(requests):
        frame = await peer.frame(timeout=10)
        if frame.header.is_push:
            if pushes is not None:
                pushes.append(decode_push(frame.header, frame.body))
            continue
        try:
            answers[frame.header.correlation_id] = decode_response(frame.header, frame.body)
        except HeadwaterError as exc:
            answers[frame.header.correlation_id] = exc
    return [answers[1000 + i] for i in range(len(requests))]


async def _produce(client: headwater.Client, topic: str, count: int) -> None:
    producer = client.producer(topic)
    for i in range(count):
        await producer.send(f"m{i}".encode())
    await producer.flush()
    await producer.close()


async def _all_values(client: headwater.Client, topic: str, subscription: str) -> list[bytes]:
    consumer = await client.subscribe(topic, subscription, start="earliest")
    values = []
    while True:
        try:
            message = await consumer.receive(timeout=1.0)
        except TimeoutError:
            break
        values.append(message.value)
        await message.ack()
    await consumer.close()
    return values


async def test_delete_topic_with_unacked_messages_is_answered_and_stays_deleted(
    fresh_server: ServerProcess,
) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        for name in ("held", "held-sub"):
            await client.create_topic(name, partitions=2, dispatch="reliable")
            consumer = await client.subscribe(name, "s", start="earliest")
            await _produce(client, name, 6)
            for _ in range(6):
                await consumer.receive(timeout=5)  # delivered, never acked
        await asyncio.wait_for(client.delete_topic("held"), 10)
        await asyncio.wait_for(client.delete_subscription("held-sub", "s"), 10)
        await client.create_topic("delivered", dispatch="reliable")
        consumer = await client.subscribe("delivered", "s", start="earliest")
        await _produce(client, "delivered", 3)
        for _ in range(3):
            await consumer.receive(timeout=5)
        await consumer.close()  # no consumer attached, deliveries still unacked
        await asyncio.wait_for(client.delete_topic("delivered"), 10)
        assert [t.name for t in await client.list_topics()] == ["held-sub"]
    assert fresh_server.stop() == 0
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        assert [t.name for t in await client.list_topics()] == ["held-sub"]
        description = await client.describe_topic("held-sub")
        assert description.subscriptions == ()


async def test_delete_then_create_pipelined_keeps_the_new_topic_and_its_data(
    fresh_server: ServerProcess,
) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("again", dispatch="reliable")
        await _produce(client, "again", 4)
        peer = await RawPeer.open(fresh_server.address)
        answers = await _pipelined(
            peer,
            m.DeleteTopicRequest("again"),
            m.CreateTopicRequest("again", 1, RELIABLE),
            *(
                m.ProduceRequest("again", 0, build_batch([(None, f"new{i}".encode(), ())]))
                for i in range(5)
            ),
        )
        await peer.close()
        assert answers[:2] == [m.EmptyResponse(), m.EmptyResponse()]
        assert all(isinstance(a, m.ProduceResponse) for a in answers[2:]), answers
        assert await _all_values(client, "again", "before") == [
            f"new{i}".encode() for i in range(5)
        ]
    assert fresh_server.stop() == 0
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        assert await _all_values(client, "again", "after") == [f"new{i}".encode() for i in range(5)]


async def test_delete_and_subscribe_pipelined_leave_no_half_done_state(
    fresh_server: ServerProcess,
) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("racy", partitions=3, dispatch="reliable")
        for name in ("a", "b", "c"):
            await (await client.subscribe("racy", name, start="earliest")).close()
        await _produce(client, "racy", 9)
        peer = await RawPeer.open(fresh_server.address)
        subscribe = [
            m.SubscribeRequest(
                "racy",
                f"late{i}",
                m.SubscriptionType.EXCLUSIVE,
                f"c{i}",
                0,
                100,
                m.SubscriptionSettings(start=m.StartPosition.EARLIEST),
            )
            for i in range(3)
        ]
        pushes: list[m.Push] = []
        answers = await _pipelined(
            peer,
            subscribe[0],
            m.DeleteTopicRequest("racy"),
            subscribe[1],
            subscribe[2],
            pushes=pushes,
        )
        assert isinstance(answers[0], m.SubscribeResponse)
        assert answers[1] == m.EmptyResponse()
        for answer in answers[2:]:
            assert isinstance(answer, UnknownTopic), answer
        # the consumer that subscribed before the delete is told, and then gets nothing more
        pushes += await _pushes(peer, idle=1.0)
        assert pushes and pushes[-1] == m.ConsumerClosed(
            ErrorCode.UNKNOWN_TOPIC, "topic 'racy' was deleted"
        )
        await peer.close()
        await client.create_topic("racy", dispatch="reliable")
        description = await client.describe_topic("racy")
        assert description.subscriptions == ()
        assert description.next_offsets == (0,)
    assert "dictionary changed size" not in fresh_server.log()
    assert "[error" not in fresh_server.log()
    assert fresh_server.stop() == 0
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        description = await client.describe_topic("racy")
        assert description.subscriptions == ()
        assert description.next_offsets == (0,)


async def test_deleted_subscription_answers_unknown_subscription(
    server: ServerProcess, topic_name: str
) -> None:
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic_name, dispatch="reliable")
        consumer = await client.subscribe(topic_name, "s", start="earliest")
        await client.delete_subscription(topic_name, "s")
        try:
            await consumer.receive(timeout=5)
        except UnknownSubscription:
            pass
        else:  # pragma: no cover - the assertion names the failure
            raise AssertionError("the consumer was not told its subscription is gone")
        for call in (
            client.delete_subscription(topic_name, "s"),
            client.seek(topic_name, "s", "earliest"),
        ):
            try:
                await call
            except UnknownSubscription:
                continue
            raise AssertionError("a deleted subscription must answer UNKNOWN_SUBSCRIPTION")


async def _pushes(peer: RawPeer, idle: float) -> list[m.Push]:
    """Every push that arrives until none has come for `idle` seconds."""
    pushes = []
    while True:
        try:
            frame = await peer.frame(idle)
        except TimeoutError:
            return pushes
        if frame.header.is_push:
            pushes.append(decode_push(frame.header, frame.body))
