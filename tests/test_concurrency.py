"""Concurrent and pipelined admin requests against a live server: every request is answered,
nothing is left half-done, a delete stays deleted across restarts, and a name re-created after a
delete is a new topic whose data survives."""

from __future__ import annotations

import asyncio
import itertools
import zlib

import pytest

import headwater
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import (
    ErrorCode,
    HeadwaterError,
    RevisionMismatch,
    UnknownSubscription,
    UnknownTopic,
    WrongPartition,
)
from headwater.wire.names import dead_letter_topic
from headwater.wire.protocol import decode_push, decode_response, encode_request
from headwater.wire.records import build_batch
from tests.support.helpers import drain
from tests.support.rawwire import RawPeer

RELIABLE = m.DispatchMode.RELIABLE
_correlation = itertools.count(1000)


async def _pipelined(
    peer: RawPeer, *requests: m.Request, pushes: list[m.Push] | None = None
) -> list[m.Response | HeadwaterError]:
    """Send `requests` in one write and return their answers in request order (pushes that
    arrive meanwhile go to `pushes`)."""
    ids = [next(_correlation) for _ in requests]
    await peer.send(b"".join(encode_request(r, i) for r, i in zip(requests, ids, strict=True)))
    return await _answers(peer, ids, pushes)


async def _answers(
    peer: RawPeer, ids: list[int], pushes: list[m.Push] | None = None
) -> list[m.Response | HeadwaterError]:
    answers: dict[int, m.Response | HeadwaterError] = {}
    while not set(ids) <= set(answers):
        frame = await peer.frame(timeout=10)
        if frame.header.is_push:
            if pushes is not None:
                pushes.append(decode_push(frame.header, frame.body))
            continue
        try:
            answers[frame.header.correlation_id] = decode_response(frame.header, frame.body)
        except HeadwaterError as exc:
            answers[frame.header.correlation_id] = exc
    return [answers[i] for i in ids]


async def _produce(client: headwater.Client, topic: str, count: int) -> None:
    producer = client.producer(topic)
    for i in range(count):
        await producer.send(f"m{i}".encode())
    await producer.flush()
    await producer.close()


async def _all_values(
    client: headwater.Client, topic: str, subscription: str, count: int
) -> list[bytes]:
    """The `count` messages of a new subscription from earliest (failing on one more at hand)."""
    consumer = await client.subscribe(topic, subscription, start="earliest")
    values = []
    for message in await drain(consumer, count):
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
                await consumer.receive(timeout=30)  # delivered, never acked
        await asyncio.wait_for(client.delete_topic("held"), 10)
        await asyncio.wait_for(client.delete_subscription("held-sub", "s"), 10)
        await client.create_topic("delivered", dispatch="reliable")
        consumer = await client.subscribe("delivered", "s", start="earliest")
        await _produce(client, "delivered", 3)
        for _ in range(3):
            await consumer.receive(timeout=30)
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
        assert await _all_values(client, "again", "before", 5) == [
            f"new{i}".encode() for i in range(5)
        ]
    assert fresh_server.stop() == 0
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        after = await _all_values(client, "again", "after", 5)
        assert after == [f"new{i}".encode() for i in range(5)]


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
        pushes = await _pushes_until_closed(peer, pushes)
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
            await consumer.receive(timeout=30)
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


async def _pushes_until_closed(peer: RawPeer, pushes: list[m.Push]) -> list[m.Push]:
    """The pushes up to a CONSUMER_CLOSED (the end marker: none may come after it), then those
    that come before the answer to one more request (any push sent before the server handled
    that request comes first on the connection): the last of them must be the CONSUMER_CLOSED."""
    pushes = list(pushes)  # those already read
    for _ in range(10_000):  # bounded: a consumer of 9 messages gets far fewer pushes
        if pushes and isinstance(pushes[-1], m.ConsumerClosed):
            break
        frame = await peer.frame(timeout=30)
        if frame.header.is_push:
            pushes.append(decode_push(frame.header, frame.body))
    await peer.request(m.ListTopicsRequest())
    for _ in range(10_000):
        frame = await peer.frame(timeout=30)
        if not frame.header.is_push:
            return pushes
        pushes.append(decode_push(frame.header, frame.body))
    raise AssertionError("pushes without end")


def _key_in(partition: int, partitions: int, prefix: str = "k") -> bytes:
    """A key whose partition (crc32 % partitions, as the producer and map set route) is given."""
    for i in range(1000):
        candidate = f"{prefix}{i}".encode()
        if zlib.crc32(candidate) % partitions == partition:
            return candidate
    raise AssertionError("no key found")


async def test_catch_up_applies_appends_made_while_it_reads(fresh_server: ServerProcess) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic(
            "lv", partitions=2, dispatch="reliable", configs={"fsync": "never"}
        )
        filler = client.producer("lv")
        for _ in range(
            160
        ):  # 16 MB in partition 1: past the tail cache, so the catch-up reads disk
            await filler.send(b"x" * 100_000, partition=1)
        await filler.flush()
        await filler.close()
        wanted = _key_in(0, 2)
        peer = await RawPeer.open(fresh_server.address)
        requests = [
            # the first map write builds the state (a read no longer does): partition 0, then 1
            m.MapSetRequest("lv", (m.MapWrite(_key_in(1, 2), b"first", -1),)),
            m.ProduceRequest("lv", 0, build_batch([(wanted, b"set-meanwhile", ())])),
            m.MapGetRequest("lv", (wanted,)),
        ]
        ids = [next(_correlation) for _ in requests]
        await peer.send(encode_request(requests[0], ids[0]))
        # Not synchronisation (the assertions hold whatever the timing): a separate write, a
        # moment later, so the produce reaches the server while the catch-up reads partition 1,
        # which is when it used to be missed.
        await asyncio.sleep(0.005)
        await peer.send(
            b"".join(encode_request(r, i) for r, i in zip(requests[1:], ids[1:], strict=True))
        )
        answers = await _answers(peer, ids)
        await peer.close()
        assert isinstance(answers[1], m.ProduceResponse), answers[1]
        assert isinstance(answers[2], m.MapGetResponse)
        assert answers[2].entries[0].value == b"set-meanwhile"
        assert (await client.map("lv").get(wanted)).value == b"set-meanwhile"  # type: ignore[union-attr]
    fresh_server.kill()
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        entry = await client.map("lv").get(wanted)
        assert entry is not None and entry.value == b"set-meanwhile"


async def test_delete_during_catch_up_answers_every_request(fresh_server: ServerProcess) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic(
            "lvd", partitions=2, dispatch="reliable", configs={"fsync": "never"}
        )
        filler = client.producer("lvd")
        for _ in range(120):
            await filler.send(b"x" * 100_000, partition=1)
        await filler.flush()
        await filler.close()
        peer = await RawPeer.open(fresh_server.address)
        answers = await _pipelined(
            peer,
            m.MapSetRequest("lvd", (m.MapWrite(b"k", b"v", -1),)),  # builds the state (a write)
            m.DeleteTopicRequest("lvd"),
            m.MapGetRequest("lvd", (b"k",)),
            m.SubscribeRequest(
                "lvd",
                "lv",
                m.SubscriptionType.EXCLUSIVE,
                "c",
                0,
                10,
                m.SubscriptionSettings(durable=m.Durable.LAST_VALUE, key_prefix=b""),
            ),
        )
        await peer.close()
        assert isinstance(answers[0], m.MapSetResponse)
        assert answers[1] == m.EmptyResponse()
        assert isinstance(answers[2], UnknownTopic) and isinstance(answers[3], UnknownTopic)
        assert await client.list_topics() == []
    assert "[error" not in fresh_server.log() and "Traceback" not in fresh_server.log()


async def test_keyed_records_go_to_their_keys_partition(
    server: ServerProcess, topic_name: str
) -> None:
    async with await headwater.connect(server.address) as client:
        await client.create_topic(
            topic_name, partitions=2, dispatch="reliable", configs={"last.value": "true"}
        )
        key = _key_in(0, 2)
        prices = client.map(topic_name)
        revision = await prices.set(key, b"100")
        assert revision == 0
        peer = await RawPeer.open(server.address)
        wrong = await peer.call(m.ProduceRequest(topic_name, 1, build_batch([(key, b"999", ())])))
        assert isinstance(wrong, WrongPartition), wrong
        # server-chosen partition: the key's
        chosen = await peer.call(m.ProduceRequest(topic_name, -1, build_batch([(key, b"101", ())])))
        assert chosen == m.ProduceResponse(0, 1)
        await peer.close()
        # the client's producer routes by key too
        producer = client.producer(topic_name)
        metadata = await (await producer.send(b"102", key=key))
        await producer.close()
        assert (metadata.partition, metadata.offset) == (0, 2)
        # so a revision names one value: compare-and-set against the first one fails
        with pytest.raises(RevisionMismatch):
            await prices.set(key, b"cas", revision=revision)
        assert (await prices.get(key)).value == b"102"  # type: ignore[union-attr]
        # keyless records are not part of the state and may go anywhere
        peer = await RawPeer.open(server.address)
        keyless = await peer.call(m.ProduceRequest(topic_name, 1, build_batch([(None, b"x", ())])))
        assert keyless == m.ProduceResponse(1, 0)
        await peer.close()


async def test_dead_letter_topic_does_not_inherit_last_value(
    server: ServerProcess, topic_name: str
) -> None:
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic_name, dispatch="reliable", configs={"last.value": "true"})
        consumer = await client.subscribe(
            topic_name,
            "s",
            start="earliest",
            max_deliveries=1,
            backoff="fixed",
            backoff_initial=0.01,
        )
        producer = client.producer(topic_name)
        await producer.send(b"no key")
        await producer.close()
        message = await consumer.receive(timeout=30)
        await message.nack()
        dlq = dead_letter_topic(topic_name, "s")
        deadline = asyncio.get_running_loop().time() + 10
        while dlq not in [t.name for t in await client.list_topics()]:
            assert asyncio.get_running_loop().time() < deadline, "never dead-lettered"
            await asyncio.sleep(0.05)
        description = await client.describe_topic(dlq)
        assert "last.value" not in {c.name for c in description.topic.configs}
        dead = await client.subscribe(dlq, "read", start="earliest")
        assert (await dead.receive(timeout=30)).value == b"no key"
