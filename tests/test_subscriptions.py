"""Each subscription type's delivery rule, end to end over TCP with several consumers."""

from __future__ import annotations

from collections import Counter

import pytest

import headwater
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import ConsumerBusy, SubscriptionTypeMismatch
from headwater.wire.records import build_batch
from tests.support.helpers import (
    drain,
    drain_spread,
    eventually,
    nothing_at_hand,
    subscription_info,
)
from tests.support.rawwire import RawPeer


async def _produce(client: headwater.Client, topic: str, count: int, prefix: str = "m") -> None:
    producer = client.producer(topic)
    futures = [await producer.send(f"{prefix}{i}".encode()) for i in range(count)]
    await producer.flush()
    for future in futures:
        future.result()


async def test_exclusive_refuses_a_second_consumer(client: headwater.Client, topic: str) -> None:
    first = await client.subscribe(topic, "only", type="exclusive")
    with pytest.raises(ConsumerBusy, match="exclusive"):
        await client.subscribe(topic, "only", type="exclusive")
    await _produce(client, topic, 5)
    assert [m.value for m in await drain(first, 5)] == [f"m{i}".encode() for i in range(5)]
    # once the first leaves, the subscription may be taken again
    await first.close()
    second = await client.subscribe(topic, "only", type="exclusive")
    await _produce(client, topic, 1, prefix="after")
    assert [m.value for m in await drain(second, 1)] == [b"after0"]


async def test_subscription_type_must_match(client: headwater.Client, topic: str) -> None:
    await client.subscribe(topic, "s", type="shared")
    with pytest.raises(SubscriptionTypeMismatch):
        await client.subscribe(topic, "s", type="failover")


async def test_shared_delivers_each_message_to_exactly_one_consumer(
    server: ServerProcess, topic: str
) -> None:
    clients = [await headwater.connect(server.address) for _ in range(3)]
    consumers = [
        await c.subscribe(topic, "workers", type="shared", name=f"w{i}", prefetch=50)
        for i, c in enumerate(clients)
    ]
    producer_client = await headwater.connect(server.address)
    producer = producer_client.producer(topic)
    for i in range(300):
        future = await producer.send(f"job{i}".encode())
        await future  # one record per batch, so batches can spread
    # 300 in all, spread over the consumers by credit and timing: read them all at once
    received = await drain_spread(consumers, 300)
    info = await subscription_info(producer_client, topic, "workers")
    assert (info.pending, info.delivered) == (0, 300)  # every job sent, and sent once
    values = [m.value for batch in received for m in batch]
    assert sorted(values) == sorted(f"job{i}".encode() for i in range(300))
    assert len(set(values)) == 300
    assert all(len(batch) > 30 for batch in received), [len(b) for b in received]
    for c in [*clients, producer_client]:
        await c.close()


async def test_shared_and_exclusive_subscriptions_each_get_every_message(
    client: headwater.Client, topic: str
) -> None:
    a = await client.subscribe(topic, "a", type="exclusive")
    b = await client.subscribe(topic, "b", type="shared")
    await _produce(client, topic, 20)
    assert len(await drain(a, 20)) == 20
    assert len(await drain(b, 20)) == 20


async def test_failover_one_active_then_takeover(server: ServerProcess, topic: str) -> None:
    first_client = await headwater.connect(server.address)
    second_client = await headwater.connect(server.address)
    standby = await second_client.subscribe(topic, "fo", type="failover", name="b", priority=1)
    active = await first_client.subscribe(topic, "fo", type="failover", name="a", priority=0)
    async with await headwater.connect(server.address) as producer_client:
        await _produce(producer_client, topic, 10, prefix="before")
        assert len(await drain(active, 10)) == 10

        # all 10 went to the active consumer: the server holds none, and sent none to the standby
        subscription = await subscription_info(producer_client, topic, "fo")
        assert [(c.name, c.active) for c in subscription.consumers] == [("a", True), ("b", False)]
        assert (subscription.pending, subscription.delivered) == (0, 10)
        await nothing_at_hand(standby)

        await first_client.close()  # the active consumer disconnects

        async def standby_active() -> bool:
            info = await subscription_info(producer_client, topic, "fo")
            return [(c.name, c.active) for c in info.consumers] == [("b", True)]

        await eventually(standby_active, what="the standby taking over")
        await _produce(producer_client, topic, 10, prefix="after")
        after = [f"after{i}".encode() for i in range(10)]
        assert [m.value for m in await drain(standby, 10)] == after
    await second_client.close()


async def test_failover_orders_by_priority_then_name(client: headwater.Client, topic: str) -> None:
    zed = await client.subscribe(topic, "fo", type="failover", name="zed", priority=0)
    alpha = await client.subscribe(topic, "fo", type="failover", name="alpha", priority=5)
    amy = await client.subscribe(topic, "fo", type="failover", name="amy", priority=0)
    await _produce(client, topic, 3)
    assert len(await drain(amy, 3)) == 3
    info = await subscription_info(client, topic, "fo")
    assert [(c.name, c.active) for c in info.consumers if c.active] == [("amy", True)]
    assert (info.pending, info.delivered) == (0, 3)
    await nothing_at_hand(zed)
    await nothing_at_hand(alpha)
    await amy.close()

    async def zed_active() -> bool:
        info = await subscription_info(client, topic, "fo")
        return [c.name for c in info.consumers if c.active] == ["zed"]

    await eventually(zed_active, what="zed (priority 0, then name) taking over")
    await _produce(client, topic, 2)
    assert len(await drain(zed, 2)) == 2
    await nothing_at_hand(alpha)


async def test_flow_control_never_sends_more_than_granted(
    server: ServerProcess, client: headwater.Client, topic: str
) -> None:
    """A raw client grants 10 credits: exactly 10 records arrive, then 5 more after FLOW 5."""
    peer = await RawPeer.open(server.address)
    response = await peer.call(m.SubscribeRequest(topic, "flow", 0, "raw", 0, 0))
    assert isinstance(response, m.SubscribeResponse)
    consumer_id = response.consumer_id
    async with await headwater.connect(server.address) as producer_client:
        producer = producer_client.producer(topic)
        # batches of 7: a grant of 10 must split the second batch
        for start in range(0, 98, 7):
            for i in range(start, start + 7):
                await producer.send(f"r{i}".encode())
            await producer.flush()
    # no credit yet: the server holds all 98 and has sent none
    info = await subscription_info(client, topic, "flow")
    assert (info.pending, info.delivered) == (98, 0)
    await peer.request(m.FlowRequest(consumer_id, 10))
    deliveries = await peer.deliveries(records=10)
    from headwater.wire.records import read_records

    records = [r for _, d in deliveries for r in read_records(d.batch)]
    assert [r.value for r in records] == [f"r{i}".encode() for i in range(10)]
    assert [r.offset for r in records] == list(range(10))
    await peer.request(m.FlowRequest(consumer_id, 5))
    deliveries = await peer.deliveries(records=5)
    records = [r for _, d in deliveries for r in read_records(d.batch)]
    assert [r.offset for r in records] == list(range(10, 15))
    info = await subscription_info(client, topic, "flow")
    assert (info.pending, info.delivered) == (98 - 15, 15)  # not one more than granted
    await peer.close()


async def test_slow_consumer_drops_are_counted_and_never_stall_the_producer(
    server: ServerProcess, topic: str
) -> None:
    peer = await RawPeer.open(server.address)
    response = await peer.call(m.SubscribeRequest(topic, "slow", 0, "raw", 0, 1))
    assert isinstance(response, m.SubscribeResponse)
    async with await headwater.connect(server.address) as producer_client:
        producer = producer_client.producer(topic)
        batch_values = [b"x" * 10_000] * 1000
        for _ in range(10):  # 100 MB against the backlog's default bound of 64 MiB
            futures = [await producer.send(v) for v in batch_values]
            await producer.flush()
            assert all(f.done() and not f.exception() for f in futures)
        description = await producer_client.describe_topic(topic)
    (subscription,) = description.subscriptions
    assert subscription.delivered == 1
    assert subscription.pending * 10_000 <= 64 << 20
    assert subscription.dropped == 10_000 - 1 - subscription.pending
    assert subscription.dropped > 0
    await peer.close()


async def test_keyed_messages_keep_their_partition(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, partitions=4, dispatch="non-reliable")
    consumer = await client.subscribe(topic_name, "k")
    producer = client.producer(topic_name)
    futures = [await producer.send(b"v", key=f"key{i % 5}".encode()) for i in range(50)]
    await producer.flush()
    partitions: dict[bytes, set[int]] = {}
    for message in await drain(consumer, 50):
        assert message.key is not None
        partitions.setdefault(message.key, set()).add(message.partition)
    assert all(len(p) == 1 for p in partitions.values())
    assert len(partitions) == 5
    assert Counter(f.result().partition for f in futures) == Counter(
        p for k, ps in partitions.items() for p in ps for _ in range(10)
    )


async def test_send_futures_resolve_to_the_offsets_consumers_read(
    client: headwater.Client, topic: str
) -> None:
    consumer = await client.subscribe(topic, "offsets")
    producer = client.producer(topic)
    futures = [
        await producer.send(f"v{i}".encode(), headers={"n": str(i).encode()}) for i in range(25)
    ]
    metadata = [await f for f in futures]
    received = await drain(consumer, 25)
    assert [(m.partition, m.offset) for m in metadata] == [
        (r.partition, r.offset) for r in received
    ]
    assert [r.headers for r in received] == [(("n", str(i).encode()),) for i in range(25)]
    assert [r.timestamp for r in received] == [m.timestamp for m in metadata]


async def test_raw_batch_reaches_consumer_byte_for_byte_except_base_offset(
    server: ServerProcess, topic: str
) -> None:
    consumer_peer = await RawPeer.open(server.address)
    response = await consumer_peer.call(m.SubscribeRequest(topic, "bytes", 0, "raw", 0, 100))
    assert isinstance(response, m.SubscribeResponse)
    producer_peer = await RawPeer.open(server.address)
    batch = build_batch([(b"k", b"v1", []), (None, b"v2", [("h", b"x")])])
    first = await producer_peer.call(m.ProduceRequest(topic, 0, batch))
    second = await producer_peer.call(m.ProduceRequest(topic, 0, batch))
    assert first == m.ProduceResponse(0, 0) and second == m.ProduceResponse(0, 2)
    deliveries = await consumer_peer.deliveries(records=4)
    assert [d.batch[8:] for _, d in deliveries] == [batch[8:], batch[8:]]
    assert [int.from_bytes(d.batch[:8], "big") for _, d in deliveries] == [0, 2]
    await consumer_peer.close()
    await producer_peer.close()
