"""Bounded work per client in the broker: consumer caps, consumer groups that stay cheap at ten
thousand consumers, appends whose cost does not grow with idle subscriptions, a failed create that
leaks nothing, and non-reliable consumers told how many messages they missed."""

from __future__ import annotations

import asyncio
import random
import resource
import socket
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import headwater
from headwater.durables.group import ConsumerGroup
from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.config import ObjectStoreConfig, ServerConfig
from headwater.server.memory_budget import MemoryBudget
from headwater.server.topics.subscription_contract import Consumer
from headwater.storage.state import StateStore
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import (
    OverMemoryBudget,
    StorageError,
    TooManyConsumers,
    TooManySubscriptions,
)
from headwater.wire.limits import MAX_CREDITS
from headwater.wire.protocol import decode_push
from headwater.wire.records import build_batch, read_records
from tests.support.rawwire import RawPeer
from tests.support.secure import secure_server


def _server_with(tmp_path: Path, settings: str) -> ServerProcess:
    config = tmp_path / "headwater.toml"
    config.write_text(f"[server]\n{settings}\n")
    return ServerProcess(tmp_path / "data", extra_args=("--config", str(config))).start()


async def test_consumer_caps(tmp_path: Path) -> None:
    server = _server_with(
        tmp_path, "max_consumers_per_subscription = 3\nmax_consumers_per_connection = 5"
    )
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic("capped", dispatch="non-reliable")
            for _ in range(3):
                await client.subscribe("capped", "shared", type="shared")
            with pytest.raises(TooManyConsumers, match="max_consumers_per_subscription"):
                await client.subscribe("capped", "shared", type="shared")
            await client.subscribe("capped", "other-1")
            await client.subscribe("capped", "other-2")
            with pytest.raises(TooManySubscriptions, match="max_consumers_per_connection"):
                await client.subscribe("capped", "other-3")
            async with await headwater.connect(server.address) as second:
                await second.subscribe("capped", "other-3")  # the cap is per connection
    finally:
        server.kill()


async def test_failed_create_closes_every_file_it_opened(fresh_server: ServerProcess) -> None:
    assert fresh_server.process is not None
    resource.prlimit(fresh_server.process.pid, resource.RLIMIT_NOFILE, (256, 256))
    async with await headwater.connect(fresh_server.address) as client:
        with pytest.raises(StorageError, match="cannot create topic 'wide'"):
            await client.create_topic("wide", partitions=1024, dispatch="reliable")
        assert await client.list_topics() == []
        assert not (fresh_server.data_dir / "topics" / "wide").exists()
        # nothing leaked: new connections and a topic with 100 partitions still fit
        others = [await headwater.connect(fresh_server.address) for _ in range(40)]
        await client.create_topic("narrow", partitions=100, dispatch="reliable")
        for other in others:
            await other.close()
    assert "[error" not in fresh_server.log()


async def test_dropped_messages_are_reported_before_the_next_delivery(tmp_path: Path) -> None:
    server = _server_with(tmp_path, "subscription_backlog = 10")
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic("lossy", dispatch="non-reliable")
            peer = await RawPeer.open(server.address)
            subscribed = await peer.call(
                m.SubscribeRequest("lossy", "slow", m.SubscriptionType.EXCLUSIVE, "c", 0, 0)
            )
            assert isinstance(subscribed, m.SubscribeResponse)
            producer = client.producer("lossy")
            for i in range(25):  # one batch each: 10 fit the backlog, 15 are dropped
                await (await producer.send(b"%d" % i))
            await producer.close()
            await peer.request(m.FlowRequest(subscribed.consumer_id, 100))
            pushes = []
            while sum(len(read_records(p.batch)) for p in pushes if isinstance(p, m.Delivery)) < 10:
                frame = await peer.frame(timeout=5)
                if frame.header.is_push:
                    pushes.append(decode_push(frame.header, frame.body))
            assert pushes[0] == m.MessagesDropped(15)
            assert all(isinstance(p, m.Delivery) for p in pushes[1:])
            await peer.close()
    finally:
        server.kill()


async def _held_for_a_consumer_not_reading(
    address: str, topic: str, batches: list[list[bytes]]
) -> tuple[int, int]:
    """Produce `batches` (one produce batch each) to a non-reliable topic whose one consumer has
    granted no credit yet, then grant and read: (messages delivered, messages reported
    dropped)."""
    async with await headwater.connect(address) as client:
        await client.create_topic(topic, dispatch="non-reliable")
        peer = await RawPeer.open(address)
        subscribed = await peer.call(
            m.SubscribeRequest(topic, "paused", m.SubscriptionType.EXCLUSIVE, "c", 0, 0)
        )
        assert isinstance(subscribed, m.SubscribeResponse)
        producer = client.producer(topic)
        for values in batches:
            await (await producer.send_batch(values))
        await producer.close()
        sent = sum(len(values) for values in batches)
        await peer.request(m.FlowRequest(subscribed.consumer_id, MAX_CREDITS))
        delivered = dropped = 0
        while delivered + dropped < sent:
            frame = await peer.frame(timeout=10)
            if frame.header.is_push:
                push = decode_push(frame.header, frame.body)
                if isinstance(push, m.Delivery):
                    delivered += len(read_records(push.batch))
                elif isinstance(push, m.MessagesDropped):
                    dropped += push.count
        await peer.close()
        return delivered, dropped


async def test_a_burst_waits_for_a_consumer_that_is_not_reading(server: ServerProcess) -> None:
    """With the default bounds, 50,000 small messages sent while the consumer is not reading
    (descheduled, or busy) wait for it: none is dropped. At the old default of 10,000 messages
    per backlog, 40,000 were (a consumer off its core for 5 ms at 2M msgs/s lost messages)."""
    batches = [[b"%06d" % (i * 1000 + j) * 10 for j in range(1000)] for i in range(50)]
    assert await _held_for_a_consumer_not_reading(server.address, "backlog-burst", batches) == (
        50_000,
        0,
    )


async def test_a_backlog_of_tiny_batches_counts_what_holding_them_costs(tmp_path: Path) -> None:
    """Each held batch is charged its bytes plus what holding it costs in objects, so 20,000
    bytes of backlog hold fewer than 200 one-record batches of about 80 bytes (by payload alone
    all 200 fit), and every other message is reported dropped."""
    server = _server_with(tmp_path, "subscription_backlog_bytes = 20000")
    try:
        delivered, dropped = await _held_for_a_consumer_not_reading(
            server.address, "tiny", [[b"x" * 10] for _ in range(200)]
        )
    finally:
        server.kill()
    assert 20_000 // (128 + 200) <= delivered < 200
    assert dropped == 200 - delivered


async def test_appends_cost_nothing_per_idle_reliable_subscription(tmp_path: Path) -> None:
    """With 300 subscriptions and no consumer, 200 appends run no subscription's pump: the
    topic's one append listener has no one waiting (before: every append woke every pump)."""
    config = ServerConfig(data_dir=tmp_path, object_store=ObjectStoreConfig(backend="none"))
    state = StateStore(tmp_path / "state")
    catalog = TopicCatalog(config, state)
    await catalog.open()
    try:
        topic = await catalog.create_topic(
            m.CreateTopicRequest(
                "many", 2, m.DispatchMode.RELIABLE, (m.ConfigEntry("fsync", "never"),)
            )
        )
        subscriptions = [
            await catalog.subscriptions.get_or_create(
                topic, f"s{i}", m.SubscriptionType.EXCLUSIVE, m.SubscriptionSettings()
            )
            for i in range(300)
        ]
        for _ in range(100):  # let every pump run its first round and go to sleep
            await asyncio.sleep(0)
        rounds = [s.rounds for s in subscriptions]  # type: ignore[union-attr]
        assert all(rounds)
        for i in range(200):
            topic.append(topic.partitions[i % 2], build_batch([(None, b"x", ())]), 1)
        for _ in range(100):
            await asyncio.sleep(0)
        assert [s.rounds for s in subscriptions] == rounds  # type: ignore[union-attr]
    finally:
        await catalog.close()
        state.close()


@dataclass
class _Session:
    """The consumer's side a group looks at: whether its socket takes more."""

    writable: bool = True
    consumers: dict[int, Consumer] = field(default_factory=dict)
    peer: str = "test"


def _consumer(consumer_id: int, credits: int, priority: int = 0) -> Consumer:
    return Consumer(consumer_id, f"c{consumer_id % 97}", priority, _Session(), None, credits)  # type: ignore[arg-type]


def test_shared_group_with_ten_thousand_consumers_picks_like_a_scan() -> None:
    """The heap-based group agrees with the obvious O(n) rule at every step, and keeps its heap
    bounded by the live consumers."""
    rng = random.Random(9)
    group = ConsumerGroup("t", "s", m.SubscriptionType.SHARED)
    consumers = {i: _consumer(i, rng.randrange(0, 50)) for i in range(10_000)}
    for consumer in consumers.values():
        group.add(consumer)
    for step in range(3_000):
        action = rng.random()
        if action < 0.1 and consumers:
            gone = consumers.pop(rng.choice(list(consumers)))
            assert group.remove(gone)
        elif action < 0.2:
            new = _consumer(10_000 + step, rng.randrange(0, 50))
            consumers[new.consumer_id] = new
            group.add(new)
        elif action < 0.3 and consumers:
            group.grant(consumers[rng.choice(list(consumers))], rng.randrange(1, 20))
        elif action < 0.35 and consumers:
            session = consumers[rng.choice(list(consumers))].session
            session.writable = not session.writable  # type: ignore[misc]
        else:
            picked = group.pick()
            eligible = [c for c in consumers.values() if c.credits > 0 and c.session.writable]
            if not eligible:
                assert picked is None
                continue
            assert picked is not None
            assert picked.credits == max(c.credits for c in eligible)
            group.charge(picked, 1)
        assert len(group._heap) <= 2 * len(group.consumers) + 64


def test_failover_group_elects_the_lowest_consumer_as_it_changes() -> None:
    rng = random.Random(3)
    group = ConsumerGroup("t", "s", m.SubscriptionType.FAILOVER)
    consumers: dict[int, Consumer] = {}
    for step in range(5_000):
        if consumers and rng.random() < 0.45:
            assert group.remove(consumers.pop(rng.choice(list(consumers))))
        else:
            new = _consumer(step, 1, priority=rng.randrange(0, 5))
            consumers[step] = new
            group.add(new)
        expected = min(consumers.values(), key=lambda c: c.sort_key, default=None)
        assert group.active is expected
        assert len(group._heap) <= 2 * len(group.consumers) + 64


@dataclass
class _Receiving(_Session):
    """A session that records its deliveries."""

    delivered: list[int] = field(default_factory=list)

    def send_delivery(
        self, consumer_id: int, partition: int, batch: bytes, delivery_count: int = 1
    ) -> None:
        self.delivered.append(len(read_records(batch)))


async def test_a_subscription_whose_consumer_left_with_unacked_messages_sleeps(
    tmp_path: Path,
) -> None:
    """Its unacked messages fall due for redelivery at once, but nobody can take them: the pump
    must sleep until a consumer or credit arrives (before: it woke every millisecond, ~5% of a
    core for each such subscription, e.g. every subscription after a restart)."""
    config = ServerConfig(data_dir=tmp_path, object_store=ObjectStoreConfig(backend="none"))
    state = StateStore(tmp_path / "state")
    catalog = TopicCatalog(config, state)
    await catalog.open()
    try:
        topic = await catalog.create_topic(
            m.CreateTopicRequest(
                "t", 1, m.DispatchMode.RELIABLE, (m.ConfigEntry("fsync", "never"),)
            )
        )
        topic.append(topic.partitions[0], build_batch([(None, b"x", ())] * 5), 5)
        subscription = await catalog.subscriptions.get_or_create(
            topic,
            "s",
            m.SubscriptionType.EXCLUSIVE,
            m.SubscriptionSettings(start=m.StartPosition.EARLIEST),
        )
        session = _Receiving()
        consumer = Consumer(1, "c", 0, session, subscription, 0)  # type: ignore[arg-type]
        subscription.attach(consumer)
        subscription.grant(consumer, 10)
        deadline = asyncio.get_running_loop().time() + 10
        while sum(session.delivered) < 5 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.001)
        assert sum(session.delivered) == 5
        subscription.detach(consumer)  # 5 unacked: due for redelivery now
        for _ in range(100):  # let the pump see the detach and go to sleep
            await asyncio.sleep(0)
        rounds = subscription.rounds  # type: ignore[attr-defined]
        await asyncio.sleep(0.2)  # an interval in which a spinning pump runs ~200 rounds
        assert subscription.rounds - rounds <= 1  # type: ignore[attr-defined]
        comeback = Consumer(2, "c", 0, session, subscription, 0)  # type: ignore[arg-type]
        subscription.attach(comeback)
        subscription.grant(comeback, 10)
        while sum(session.delivered) < 10 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.001)
        assert sum(session.delivered) == 10  # the five redelivered to the next consumer
    finally:
        await catalog.close()
        state.close()


async def test_a_zero_credit_subscription_holds_bytes_not_gigabytes(tmp_path: Path) -> None:
    """A principal's own topic, a subscription granting no credit and 1 MiB batches: the server
    keeps at most subscription_backlog_bytes (here 32 MiB) for it, drops the rest, tells the
    consumer MESSAGES_DROPPED, shows the budget in SERVER_INFO, and gives the bytes back when
    the subscription ends. Before the fix the backlog was bounded only in messages (10,000):
    400 MiB produced here were all kept (2.1 GiB in the report)."""
    server = _server_with(
        tmp_path, f"subscription_backlog_bytes = {32 << 20}\nmemory_max_bytes = {96 << 20}"
    )
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic("hoard", dispatch="non-reliable")
            peer = await RawPeer.open(server.address)
            subscribed = await peer.call(
                m.SubscribeRequest("hoard", "never", m.SubscriptionType.EXCLUSIVE, "c", 0, 0)
            )
            assert isinstance(subscribed, m.SubscribeResponse)
            before = server.peak_rss()
            producer = client.producer("hoard", linger=0.0)
            for _ in range(400):
                await (await producer.send(bytes((1 << 20) - 1024)))
            await producer.close()
            grown = server.peak_rss() - before
            # 32 MiB of backlog, plus read buffers and allocator slack; 400 MiB before the fix
            assert grown < 160 << 20, f"server grew {grown >> 20} MiB"
            info = await client.server_info()
            assert info.memory_budget_bytes == 96 << 20
            assert 0 < info.memory_used_bytes <= 32 << 20
            (described,) = (await client.describe_topic("hoard")).subscriptions
            assert described.dropped > 300
            await peer.request(m.FlowRequest(subscribed.consumer_id, 1))
            frame = await peer.frame(timeout=10)
            while not frame.header.is_push:
                frame = await peer.frame(timeout=10)
            assert decode_push(frame.header, frame.body) == m.MessagesDropped(described.dropped)
            await peer.close()  # the subscription ends with its only consumer
            deadline = asyncio.get_running_loop().time() + 10
            while (await client.server_info()).memory_used_bytes:
                assert asyncio.get_running_loop().time() < deadline, "bytes never given back"
                await asyncio.sleep(0.05)
    finally:
        server.kill()


async def _zero_credit_peer(address: str, token: str, topic: str, name: str) -> RawPeer:
    """An authenticated raw connection with a subscription that grants no credit: everything
    produced to `topic` waits in its backlog, charged to the token's principal."""
    peer = await RawPeer.open(address)
    authenticated = await peer.call(m.AuthenticateRequest("token", token.encode()))
    assert isinstance(authenticated, m.AuthenticateResponse), authenticated
    subscribed = await peer.call(
        m.SubscribeRequest(topic, name, m.SubscriptionType.EXCLUSIVE, "c", 0, 0)
    )
    assert isinstance(subscribed, m.SubscribeResponse), subscribed
    return peer


async def test_a_principal_filling_its_memory_share_leaves_other_principals_unaffected(
    tmp_path: Path,
) -> None:
    """Three zero-credit subscriptions of one principal (`hoarder`) and 1 MiB batches: the
    hoarder holds at most its 24 MiB share of the 64 MiB budget, a new subscription of its own is
    refused with the retriable OVER_MEMORY_BUDGET, and another principal (`worker`) produces and
    consumes every one of its messages meanwhile, none dropped. Before the share the hoarder's
    backlogs (3 x 32 MiB) filled the whole budget and every batch of the worker's subscription
    was dropped: its consumer received nothing."""
    config = tmp_path / "headwater.toml"
    config.write_text(
        f"[server]\nsubscription_backlog_bytes = {32 << 20}\nmemory_max_bytes = {64 << 20}\n"
        f"memory_max_bytes_per_principal = {24 << 20}\n"
    )
    port_file = tmp_path / "http.port"
    with secure_server(
        tmp_path, "--config", str(config), "--http-port", "0", "--http-port-file", str(port_file)
    ) as server:
        hoarder = server.token("hoarder", "all:hoard.*")
        async with await headwater.connect(server.address, token=server.admin) as admin:
            await admin.create_topic("hoard.t", dispatch="non-reliable")
            await admin.create_topic("work.t", dispatch="non-reliable")
            peers = [
                await _zero_credit_peer(server.address, hoarder, "hoard.t", f"s{i}")
                for i in range(3)
            ]
            async with await headwater.connect(server.address, token=hoarder) as hoarding:
                producer = hoarding.producer("hoard.t", linger=0.0)
                for _ in range(100):  # 100 MiB for each of the 3 subscriptions
                    await (await producer.send(bytes((1 << 20) - 1024)))
                await producer.close()
                with pytest.raises(OverMemoryBudget, match="'hoarder'") as refused:
                    await hoarding.subscribe("hoard.t", "one-more")
                assert refused.value.retriable
            info = await admin.server_info()
            held = {p.principal: p.used_bytes for p in info.memory_principals}
            assert info.memory_principal_share_bytes == 24 << 20
            assert (24 << 20) - (1 << 20) < held["hoarder"] <= 24 << 20, held
            assert info.memory_used_bytes <= 32 << 20  # the hoarder's share and little else

            worker = server.token("worker", "all:work.*")
            async with await headwater.connect(server.address, token=worker) as working:
                consumer = await working.subscribe("work.t", "w")
                producer = working.producer("work.t", linger=0.0)
                sent = [b"%d" % i + bytes(64 << 10) for i in range(200)]
                for value in sent:
                    await asyncio.wait_for(await producer.send(value), 10)
                await producer.close()
                received = [(await consumer.receive(timeout=10)).value for _ in sent]
                assert received == sent
                (described,) = (await admin.describe_topic("work.t")).subscriptions
                assert described.dropped == 0
            (_, dropped, *_) = [
                s.dropped for s in (await admin.describe_topic("hoard.t")).subscriptions
            ] + [0]
            assert dropped > 50

        port = int(port_file.read_text())
        scrape = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {server.admin}"}
        )
        with urllib.request.urlopen(scrape, timeout=10) as response:
            text = response.read().decode()
        samples = dict(
            line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#")
        )
        assert float(samples["headwater_memory_principal_share_bytes"]) == 24 << 20
        assert float(samples['headwater_memory_principal_used_bytes{principal="hoarder"}']) > 0
        for peer in peers:
            await peer.close()


async def _unread_peer(address: str) -> RawPeer:
    """A connection whose receive buffer is fixed small: loopback's autotuning would otherwise
    let the kernel take 32 MiB of deliveries per connection, which the server never holds."""
    host, port = address.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock)
    return RawPeer(reader, writer)


async def test_a_principals_unread_deliveries_across_connections_cost_its_own_share(
    tmp_path: Path,
) -> None:
    """Twenty connections of one principal, each subscribed to a topic of its own with all the
    credit it may give, never read: each could hold 8 MiB of deliveries (its write buffer's
    high-water mark), 160 MiB in all. Charged to the principal's 16 MiB share, its connections
    get no more deliveries once it is over (the rest are dropped from the backlogs), so the
    server grows by about the share, and another principal produces and consumes meanwhile.
    Before, only backlogs counted: the server grew by every connection's mark. (A topic each:
    uvloop keeps one batch written to many connections once, so a shared topic costs little.)"""
    config = tmp_path / "headwater.toml"
    config.write_text(
        f"[server]\nmemory_max_bytes = {256 << 20}\nmemory_max_bytes_per_principal = {16 << 20}\n"
        f"consumer_write_buffer = {8 << 20}\nmax_pending_response_bytes = {8 << 20}\n"
    )
    with secure_server(tmp_path, "--config", str(config)) as server:
        hoarder = server.token("hoarder", "all:hoard.*")
        async with await headwater.connect(server.address, token=server.admin) as admin:
            await admin.create_topic("work.t", dispatch="non-reliable")
            peers = []
            for i in range(20):
                await admin.create_topic(f"hoard.{i}", dispatch="non-reliable")
                peer = await _unread_peer(server.address)
                authenticated = await peer.call(m.AuthenticateRequest("token", hoarder.encode()))
                assert isinstance(authenticated, m.AuthenticateResponse), authenticated
                subscribed = await peer.call(
                    m.SubscribeRequest(
                        f"hoard.{i}", "s", m.SubscriptionType.EXCLUSIVE, "c", 0, MAX_CREDITS
                    )
                )
                assert isinstance(subscribed, m.SubscribeResponse), subscribed
                peers.append(peer)  # never read from again: the test's reader stops at 128 KiB
            before = server.process.peak_rss()
            async with await headwater.connect(server.address, token=hoarder) as hoarding:
                for i in range(20):
                    producer = hoarding.producer(f"hoard.{i}", linger=0.0)
                    for _ in range(12):  # 8 MiB to buffer and 4 MiB for the kernel's queues
                        await (await producer.send(bytes((1 << 20) - 1024)))
                    await producer.close()
            grown = server.process.peak_rss() - before
            info = await admin.server_info()
            held = {p.principal: p.used_bytes for p in info.memory_principals}
            # the share, plus what one connection took past it before it was counted
            assert held["hoarder"] <= (16 + 8 + 1) << 20, held
            assert grown < 64 << 20, f"server grew {grown >> 20} MiB"  # 160 MiB before
            dropped = [
                (await admin.describe_topic(f"hoard.{i}")).subscriptions[0].dropped
                for i in range(20)
            ]
            assert sum(dropped) > 100, dropped
            worker = server.token("worker", "all:work.*")
            async with await headwater.connect(server.address, token=worker) as working:
                consumer = await working.subscribe("work.t", "w")
                producer = working.producer("work.t", linger=0.0)
                sent = [b"%d" % i + bytes(64 << 10) for i in range(100)]
                for value in sent:
                    await asyncio.wait_for(await producer.send(value), 10)
                await producer.close()
                received = [(await consumer.receive(timeout=10)).value for _ in sent]
                assert received == sent
            for peer in peers:
                await peer.close()


def test_memory_budget_shares_per_principal() -> None:
    """The share bounds what one principal is charged; the anonymous principal (no
    authentication) is every client, so its share is the budget; unsent output is charged
    whatever the budget and puts its principal over its share."""
    budget = MemoryBudget(100, 30)
    assert budget.take(30, "a") and not budget.take(1, "a")  # a's share is spent...
    assert budget.take(30, "b")  # ...not b's
    assert budget.refused_by_share == 1 and budget.room("a") == 0 and budget.room("b") == 0
    assert budget.take(40, "") and budget.used == 100 and not budget.take(1, "c")
    budget.charge(5, "a")  # a connection's write buffer grew
    assert budget.over_share("a") and not budget.over_share("b")
    assert budget.largest(2) == [("", 40), ("a", 35)]
    budget.give_back(35, "a")
    assert "a" not in budget.by_principal and budget.used == 70
