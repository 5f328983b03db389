"""The client's routing table and lookup backoff, sans I/O: LOOKUP answers applied, NOT_OWNER
with and without an owner address, a broker vanishing, partitions moving, stale routes. Then the
client's routing against two real servers whose ownership a script decides (below)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

import headwater
from headwater.client.blocking import BlockingClient
from headwater.client.consumer import Consumer
from headwater.client.consumer_legs import ClusterLegs
from headwater.client.producer import AtLeastOnce, AtMostOnce, RetryPolicy
from headwater.client.routing_table import BrokerAddress, LookupBackoff, RoutingTable
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import ErrorCode, HeadwaterError, NotOwner, UnknownTopic
from headwater.wire.frames import Frame, FrameDecoder, encode_frame
from headwater.wire.keys import partition_for_key
from headwater.wire.protocol import decode_request, encode_error, encode_response

BOOT = BrokerAddress("", "127.0.0.1", 7000)
A = m.LookupBroker("a", "127.0.0.1", 7001)
B = m.LookupBroker("b", "127.0.0.1", 7002)
C = m.LookupBroker("c", "127.0.0.1", 7003)


def answer(
    brokers: tuple[m.LookupBroker, ...], owners: list[str], epochs: list[int] | None = None
) -> m.LookupResponse:
    epochs = epochs or [1] * len(owners)
    partitions = tuple(
        m.LookupPartition(p, o, e) for p, (o, e) in enumerate(zip(owners, epochs, strict=True))
    )
    return m.LookupResponse(brokers, (m.LookupTopic("t", 0, "", partitions),))


def address(broker: m.LookupBroker) -> BrokerAddress:
    return BrokerAddress(broker.broker_id, broker.host, broker.port)


def test_single_broker_routes_everything_to_the_bootstrap_address() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((m.LookupBroker("local", "0.0.0.0", 0),), ["local", "local"]), 0.0)
    assert not table.multi_broker
    assert table.owner("t", 0) == table.owner("t", 1) == BOOT
    assert table.owner("t", -1) == BOOT
    assert table.partitions("t") == 2


def test_routes_follow_the_owners_lookup_names() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((A, B, C), ["a", "b", "c", "a"]), 0.0)
    assert table.multi_broker
    assert [table.owner("t", p) for p in range(4)] == [address(x) for x in (A, B, C, A)]
    assert table.owned_by("t") == {address(A): [0, 3], address(B): [1], address(C): [2]}
    assert table.owner("t", 9) is None  # beyond the partitions known
    assert table.owner("t", -1) == address(A)  # "any partition": an owner picks


def test_a_cluster_shrunk_to_one_broker_still_routes_to_it() -> None:
    """The survivor need not be the bootstrap broker: routes keep naming the owner."""
    table = RoutingTable(BrokerAddress("", A.host, A.port))
    table.apply(answer((A, B), ["a", "b"]), 0.0)
    table.apply(answer((B,), ["b", "b"], [2, 1]), 1.0)
    assert table.multi_broker
    assert table.owner("t", 0) == table.owner("t", 1) == address(B)


def test_a_partition_without_owner_has_no_route() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((A, B), ["a", ""]), 0.0)
    assert table.owner("t", 1) is None
    assert table.owned_by("t") == {address(A): [0]}


def test_not_owner_naming_a_known_broker_moves_the_partition_at_once() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((A, B), ["a", "a"]), 0.0)
    error = NotOwner("partition 1 of topic 't' is not served here: owner=b@127.0.0.1:7002")
    assert table.not_owner("t", 1, error) == address(B)
    assert table.owner("t", 1) == address(B)
    assert table.owner("t", 0) == address(A)
    assert table.needs_lookup("t", 0.0)  # stale: confirmed by the next lookup


def test_not_owner_without_owner_leaves_the_partition_unrouted() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((A, B), ["a", "b"]), 0.0)
    error = NotOwner("partition 1 of topic 't' is not served here: owner=none")
    assert error.owner_address is None
    assert table.not_owner("t", 1, error) is None
    assert table.owner("t", 1) is None
    assert table.needs_lookup("t", 0.0)


def test_not_owner_naming_an_unknown_broker_waits_for_the_lookup() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((A, B), ["a", "b"]), 0.0)
    error = NotOwner("partition 0 of topic 't' is not served here: owner=z@10.0.0.9:7999")
    assert table.not_owner("t", 0, error) is None
    assert table.owner("t", 0) is None
    table.apply(answer((A, B, m.LookupBroker("z", "10.0.0.9", 7999)), ["z", "b"]), 1.0)
    assert table.owner("t", 0) == BrokerAddress("z", "10.0.0.9", 7999)
    assert not table.needs_lookup("t", 1.0)


def test_a_lost_broker_unroutes_its_partitions_and_stales_the_topic() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((A, B, C), ["a", "b", "c", "b"]), 0.0)
    assert table.broker_lost((B.host, B.port)) == ["t"]
    assert table.owner("t", 1) is None and table.owner("t", 3) is None
    assert table.owner("t", 0) == address(A)
    assert table.needs_lookup("t", 0.0)
    assert table.broker_lost(("127.0.0.1", 1)) == []  # a broker nobody routes to


def test_a_broker_vanishing_from_lookup_leaves_its_partitions_ownerless() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((A, B, C), ["a", "b", "c"], [1, 1, 1]), 0.0)
    # c's lease lapsed: the live brokers no longer include it, its partition not yet re-owned
    table.apply(answer((A, B), ["a", "b", "c"], [1, 1, 1]), 1.0)
    assert table.owner("t", 2) is None
    assert "c" not in table.brokers
    # then b takes it over, with a newer epoch
    table.apply(answer((A, B), ["a", "b", "b"], [1, 1, 2]), 2.0)
    assert table.owner("t", 2) == address(B)


def test_partitions_moving_between_brokers() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((A, B), ["a", "a", "b", "b"], [1, 1, 1, 1]), 0.0)
    table.apply(answer((A, B), ["b", "a", "a", "b"], [2, 1, 2, 1]), 1.0)
    assert [table.owner("t", p) for p in range(4)] == [address(x) for x in (B, A, A, B)]
    assert table.owned_by("t") == {address(B): [0, 3], address(A): [1, 2]}


def test_an_older_epoch_does_not_undo_a_move() -> None:
    """A broker that has not seen the move yet answers with the old owner and epoch."""
    table = RoutingTable(BOOT)
    table.apply(answer((A, B), ["b", "a"], [5, 1]), 0.0)
    table.apply(answer((A, B), ["a", "a"], [4, 1]), 1.0)
    assert table.owner("t", 0) == address(B)


def test_an_unknown_topic_keeps_its_error_and_is_asked_again_later() -> None:
    table = RoutingTable(BOOT, refresh_interval=2.0, single_refresh=30.0)
    response = m.LookupResponse(
        (A, B), (m.LookupTopic("gone", ErrorCode.UNKNOWN_TOPIC, "topic 'gone' does not exist", ()),)
    )
    table.apply(response, 0.0)
    assert isinstance(table.error("gone"), UnknownTopic)
    assert table.owner("gone", 0) is None and table.partitions("gone") is None
    assert not table.needs_lookup("gone", 1.0)
    assert table.needs_lookup("gone", 2.0)


def test_owner_check_follows_the_lease_lookup_carries_unless_the_application_set_it() -> None:
    table = RoutingTable(BOOT)
    assert table.owner_check == 1.0  # half the default 2 s lease, before any answer
    table.apply(answer((A, B), ["a", "b"]), 0.0)  # an older server: no lease in its answer
    assert table.owner_check == 1.0
    table.apply(replace(answer((A, B), ["a", "b"]), lease_ms=6000), 0.0)
    assert table.owner_check == 3.0  # half the lease the brokers were granted
    table.owner_check, table.owner_check_fixed = 0.4, True  # Client.owner_check = 0.4
    table.apply(replace(answer((A, B), ["a", "b"]), lease_ms=2000), 0.0)
    assert table.owner_check == 0.4


def test_refresh_intervals_single_and_multi_broker() -> None:
    table = RoutingTable(BOOT, refresh_interval=2.0, single_refresh=30.0)
    assert table.needs_lookup("t", 0.0)  # never looked up
    table.apply(answer((A,), ["a"]), 0.0)
    assert not table.needs_lookup("t", 29.0) and table.needs_lookup("t", 30.0)
    table.apply(answer((A, B), ["a"]), 0.0)
    assert not table.needs_lookup("t", 1.9) and table.needs_lookup("t", 2.0)
    table.invalidate("t")
    assert table.needs_lookup("t", 0.0)


def test_every_change_to_the_table_bumps_its_version() -> None:
    """A decision cached from the table (the producer's keyless sends) holds while `version`
    stands; `fresh_until` says what `needs_lookup` says, as a time."""
    table = RoutingTable(BOOT, refresh_interval=2.0, single_refresh=30.0)
    assert table.fresh_until("t") == float("-inf")
    seen = [table.version]

    def bumped() -> bool:
        seen.append(table.version)
        return seen[-1] > seen[-2]

    table.apply(answer((A,), ["a", "a"]), 5.0)
    assert bumped() and table.fresh_until("t") == 35.0
    assert not table.needs_lookup("t", 34.9) and table.needs_lookup("t", 35.0)
    table.not_owner("t", 0, NotOwner("moved"))
    assert bumped() and table.fresh_until("t") == float("-inf")
    table.apply(answer((A, B), ["a", "b"]), 6.0)
    assert bumped() and table.fresh_until("t") == 8.0
    assert table.broker_lost(("127.0.0.1", 7002)) == ["t"]
    assert bumped()
    table.invalidate("t")
    assert bumped()
    table.unsupported(["t"], 7.0)
    assert bumped() and table.fresh_until("t") == float("inf")


def test_a_server_without_lookup_is_one_broker_for_good() -> None:
    table = RoutingTable(BOOT)
    table.unsupported(["t"], 0.0)
    assert not table.lookup_supported and not table.multi_broker
    assert table.owner("t", 3) == BOOT
    assert not table.needs_lookup("t", 1e9)


def test_lookup_backoff_grows_jittered_and_ends_within_its_timeout() -> None:
    backoff = LookupBackoff(initial=0.05, maximum=1.0, timeout=5.0)
    delays = list(backoff.delays(random.Random(7)))
    assert 0.025 <= delays[0] <= 0.05
    assert all(delay <= 1.0 for delay in delays)
    assert max(delays) > 0.5  # it grows toward the maximum
    assert sum(delays) <= 5.0
    assert sum(delays) > 5.0 - 1.0  # and uses the time it has
    assert len(delays) < 200  # bounded in count too


def test_default_lookup_backoff_waits_at_most_250_ms_between_lookups() -> None:
    # a client waits out its current delay once the new owner serves: at 1 s that was up to
    # a third of a kill -9 failover
    delays = list(LookupBackoff().delays(random.Random(3)))
    assert max(delays) <= 0.25
    assert 29.0 < sum(delays) <= 30.0  # the episode still lasts its 30 s


# The client against two real servers, each behind a broker front that answers LOOKUP from a
# shared script (as the cluster's coordinator would let a broker answer) and refuses PRODUCE for
# the partitions the script says it does not own (NOT_OWNER naming the owner). Everything else
# reaches the real server unchanged. This stands in for the etcd coordinator until it is merged;
# the client's code and the servers are the real ones.


@dataclass
class Script:
    ports: dict[str, int] = field(default_factory=dict)  # broker id -> its front's port
    owners: dict[str, list[str]] = field(default_factory=dict)  # topic -> owner per partition
    epoch: int = 1
    lookups: int = 0
    looked_up: asyncio.Event = field(default_factory=asyncio.Event)  # set by every LOOKUP
    long_polls: int = 0  # LOOKUPs that asked to wait for a new owner (version 1)
    moved: asyncio.Event = field(default_factory=asyncio.Event)  # `move` sets it

    def move(self, topic: str, owners: list[str]) -> None:
        """A change of owners, under a new epoch: the long polls waiting see it."""
        self.owners[topic] = owners
        self.epoch += 1
        self.moved.set()
        self.moved = asyncio.Event()

    async def long_poll(self, request: m.LookupRequest) -> m.LookupResponse:
        """As the server's: the answer once one of `wait_for`'s partitions has an owner under
        a newer epoch (here every partition shares the script's epoch), or at `max_wait_ms`."""
        self.long_polls += 1
        self.looked_up.set()
        deadline = asyncio.get_running_loop().time() + request.max_wait_ms / 1000
        while not any(
            self.epoch > w.epoch and self.owners.get(w.topic, [""] * (w.partition + 1))[w.partition]
            for w in request.wait_for
        ):
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            await asyncio.wait([asyncio.ensure_future(self.moved.wait())], timeout=left)
        return self.answer(request)

    def answer(self, request: m.LookupRequest) -> m.LookupResponse:
        self.lookups += 1
        self.looked_up.set()
        brokers = tuple(m.LookupBroker(b, "127.0.0.1", p) for b, p in sorted(self.ports.items()))
        topics = []
        for name in request.topics:
            owners = self.owners.get(name)
            if owners is None:
                topics.append(m.LookupTopic(name, ErrorCode.UNKNOWN_TOPIC, "no such topic", ()))
                continue
            partitions = tuple(m.LookupPartition(p, o, self.epoch) for p, o in enumerate(owners))
            topics.append(m.LookupTopic(name, 0, "", partitions))
        return m.LookupResponse(brokers, tuple(topics))


class BrokerFront:
    def __init__(self, broker_id: str, target_port: int, script: Script) -> None:
        self.broker_id = broker_id
        self.target_port = target_port
        self.script = script
        self.refused = 0
        self.taking_over = 0  # produces for its own partitions still to answer NOT_OWNER
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        # cleared: the broker is frozen (SIGSTOP): it reads nothing, answers nothing, delivers
        # nothing, and its connections stay open
        self.awake = asyncio.Event()
        self.awake.set()
        self.pings = 0  # API_VERSIONS requests seen after the handshake's
        self.pinged = asyncio.Event()

    async def start(self) -> BrokerFront:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.script.ports[self.broker_id] = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.script.ports[self.broker_id]}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers |= {writer, upstream}
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        await asyncio.gather(
            self._requests(reader, writer, upstream),
            self._forward(upstream_reader, writer),
            return_exceptions=True,
        )
        for end in (writer, upstream):
            end.close()

    async def _answer_later(
        self, writer: asyncio.StreamWriter, correlation_id: int, request: m.LookupRequest
    ) -> None:
        answer = await self.script.long_poll(request)
        await self.awake.wait()
        writer.write(encode_response(m.ApiKey.LOOKUP, correlation_id, answer))

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        while data := await reader.read(65536):
            for frame in decoder.feed(data):
                assert isinstance(frame, Frame)
                await self.awake.wait()
                writer.write(_encode(frame))  # whole frames: answers of ours come between
        writer.close()

    async def _requests(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: asyncio.StreamWriter,
    ) -> None:
        decoder = FrameDecoder()
        while data := await reader.read(65536):
            for frame in decoder.feed(data):
                assert isinstance(frame, Frame)
                await self.awake.wait()
                header = frame.header
                if header.api_key == m.ApiKey.API_VERSIONS:
                    self.pings += 1
                    self.pinged.set()
                if header.api_key == m.ApiKey.LOOKUP:
                    request = decode_request(header, frame.body)
                    assert isinstance(request, m.LookupRequest)
                    if request.max_wait_ms and request.wait_for:  # answered later, in order
                        task = asyncio.ensure_future(
                            self._answer_later(writer, header.correlation_id, request)
                        )
                        self._tasks.add(task)
                        continue
                    answer = self.script.answer(request)
                    writer.write(encode_response(m.ApiKey.LOOKUP, header.correlation_id, answer))
                    continue
                if header.api_key == m.ApiKey.PRODUCE:
                    request = decode_request(header, frame.body)
                    assert isinstance(request, m.ProduceRequest)
                    owner = self.script.owners[request.topic][request.partition]
                    if owner == self.broker_id and self.taking_over > 0:
                        # the owner's key is ours, the take-over not finished: the coordinator
                        # answers NOT_OWNER naming no owner (partition_ownership.not_owner)
                        self.taking_over -= 1
                        self.refused += 1
                        error = NotOwner(
                            f"partition {request.partition} of topic {request.topic!r} is not "
                            "served here: owner=none"
                        )
                        writer.write(encode_error(header.api_key, 0, header.correlation_id, error))
                        continue
                    if owner != self.broker_id:
                        self.refused += 1
                        port = self.script.ports[owner]
                        error = NotOwner(
                            f"partition {request.partition} of topic {request.topic!r} is not "
                            f"served here: owner={owner}@127.0.0.1:{port}"
                        )
                        writer.write(encode_error(header.api_key, 0, header.correlation_id, error))
                        continue
                upstream.write(_encode(frame))
        upstream.close()

    def cut(self) -> None:
        """Drop every connection, as a broker dying would."""
        for writer in self._writers:
            writer.transport.abort()

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        self.awake.set()
        self.cut()
        await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), 10)


def _encode(frame: Frame) -> bytes:
    h = frame.header
    return encode_frame(h.api_key, h.api_version, h.correlation_id, h.flags, frame.body)


@pytest.fixture
async def two_brokers(tmp_path: Path) -> AsyncIterator[tuple[Script, BrokerFront, BrokerFront]]:
    servers = [ServerProcess(tmp_path / name).start() for name in ("a", "b")]
    script = Script()
    fronts = [
        await BrokerFront(n, s.port, script).start() for n, s in zip("ab", servers, strict=True)
    ]
    try:
        yield script, fronts[0], fronts[1]
    finally:
        for front in fronts:
            await front.close()
        for server in servers:
            server.kill()


async def _offsets(front: BrokerFront, topic: str) -> list[int]:
    """The next offset of each partition at the real server behind `front`."""
    async with await headwater.connect(f"127.0.0.1:{front.target_port}") as direct:
        return list((await direct.describe_topic(topic)).next_offsets)


async def _create(topic: str, partitions: int, *fronts: BrokerFront, **options: Any) -> None:
    for front in fronts:
        async with await headwater.connect(f"127.0.0.1:{front.target_port}") as direct:
            await direct.create_topic(topic, partitions=partitions, **options)


def _key_for(partition: int, partitions: int) -> bytes:
    return next(
        k for i in range(1000) if partition_for_key(k := f"k{i}".encode(), partitions) == partition
    )


async def test_producer_sends_each_partition_to_its_owner(
    two_brokers: tuple[Script, BrokerFront, BrokerFront],
) -> None:
    script, a, b = two_brokers
    await _create("t", 4, a, b)
    script.owners["t"] = ["a", "b", "a", "b"]
    async with await headwater.connect(a.address) as client:
        producer = client.producer("t")
        futures = [await producer.send(b"keyed", key=_key_for(p % 4, 4)) for p in range(40)]
        futures += [await producer.send(b"keyless") for _ in range(40)]
        await producer.flush()
        sent = [await f for f in futures]
        assert {x.partition for x in sent} == {0, 1, 2, 3}  # keyless spread by the client
        owners = await client.lookup("t")
        assert [o.broker_id if o else None for o in owners.values()] == ["a", "b", "a", "b"]
    on_a, on_b = await _offsets(a, "t"), await _offsets(b, "t")
    assert on_a[1] == on_a[3] == 0 and on_b[0] == on_b[2] == 0  # nothing at a non-owner
    assert sum(on_a) + sum(on_b) == 80
    assert a.refused == b.refused == 0


async def test_keyless_sends_ask_the_routes_again_once_they_change(
    two_brokers: tuple[Script, BrokerFront, BrokerFront],
) -> None:
    """A keyless send on one broker skips the router while the routes stand (the per-record
    fast path); once the table changes (here: marked stale, as NOT_OWNER or a lost broker
    would), the next send looks the topic up, and learns that it is now in a cluster."""
    script, a, b = two_brokers
    await _create("t", 2, a, b)
    b_port = script.ports.pop("b")  # LOOKUP names one broker
    script.owners["t"] = ["a", "a"]
    async with await headwater.connect(a.address) as client:
        producer = client.producer("t")
        for _ in range(20):
            await producer.send(b"keyless")
        await producer.flush()
        lookups = script.lookups
        for _ in range(20):
            await producer.send(b"keyless")
        await producer.flush()
        assert script.lookups == lookups  # the routes stood: no lookup per record
        router = producer._router
        assert router is not None and not router.multi_broker
        script.ports["b"], script.owners["t"] = b_port, ["a", "b"]
        router.table.invalidate("t")
        sent = [await producer.send(b"keyless") for _ in range(20)]
        await producer.flush()
        assert script.lookups > lookups and router.multi_broker
        assert {(await f).partition for f in sent} == {0, 1}  # now spread by the client


async def test_producer_follows_not_owner_to_the_new_owner(
    two_brokers: tuple[Script, BrokerFront, BrokerFront],
) -> None:
    script, a, b = two_brokers
    await _create("t", 2, a, b)
    script.owners["t"] = ["a", "b"]
    key = _key_for(0, 2)
    async with await headwater.connect(a.address) as client:
        producer = client.producer("t")
        first = [await producer.send(b"before", key=key) for _ in range(10)]
        await producer.flush()
        script.owners["t"] = ["b", "b"]  # partition 0 moved to b
        script.epoch += 1
        second = [await producer.send(b"after", key=key) for _ in range(10)]
        await producer.flush()  # raises if any send failed
        assert all(f.result().partition == 0 for f in first + second)
    assert a.refused >= 1  # a answered NOT_OWNER, and the batches went to b
    assert (await _offsets(a, "t"))[0] == 10
    assert (await _offsets(b, "t"))[0] == 10


async def test_at_most_once_fails_batches_refused_as_not_owner(
    two_brokers: tuple[Script, BrokerFront, BrokerFront],
) -> None:
    script, a, b = two_brokers
    await _create("t", 2, a, b)
    script.owners["t"] = ["a", "b"]
    async with await headwater.connect(a.address) as client:
        producer = client.producer("t", delivery=AtMostOnce(wait_for_offsets=True))
        await (await producer.send(b"x", key=_key_for(0, 2)))
        script.owners["t"] = ["b", "b"]
        future = await producer.send(b"y", key=_key_for(0, 2))
        with pytest.raises(NotOwner):
            await future
        with pytest.raises(NotOwner):
            await producer.flush()
        # the next send is routed to the new owner (the refusal made the routes stale)
        assert (await (await producer.send(b"z", key=_key_for(0, 2)))).offset == 0
    assert (await _offsets(b, "t"))[0] == 1


async def test_consumer_merges_every_owner_and_acks_where_each_came_from(
    two_brokers: tuple[Script, BrokerFront, BrokerFront],
) -> None:
    script, a, b = two_brokers
    await _create("t", 2, a, b)
    script.owners["t"] = ["a", "b"]
    async with await headwater.connect(a.address) as client:
        client.metadata_refresh = 0.2
        producer = client.producer("t")
        for i in range(20):
            await producer.send(f"m{i}".encode(), key=_key_for(i % 2, 2))
        await producer.flush()
        consumer = await client.subscribe("t", "s", start="earliest", type="shared")
        got = []
        for _ in range(20):
            message = await consumer.receive(timeout=30)
            got.append(message.value)
            await message.ack()
        assert sorted(got) == sorted(f"m{i}".encode() for i in range(20))
        await consumer.close()
    for front in (a, b):
        async with await headwater.connect(f"127.0.0.1:{front.target_port}") as direct:
            (sub,) = await direct.list_subscriptions("t")
            assert sub.lag == 0 and sub.unacked == 0  # every ack reached its broker


async def test_consumer_leg_follows_its_partition_after_the_broker_is_lost(
    two_brokers: tuple[Script, BrokerFront, BrokerFront],
) -> None:
    script, a, b = two_brokers
    await _create("t", 2, a, b)
    script.owners["t"] = ["a", "b"]
    async with await headwater.connect(a.address) as client:
        client.metadata_refresh = 0.2
        consumer = await client.subscribe("t", "s", start="earliest")
        producer = client.producer("t")
        await (await producer.send(b"on b", key=_key_for(1, 2)))
        assert (await consumer.receive(timeout=30)).value == b"on b"
        script.owners["t"] = ["a", "a"]  # b is gone; a took partition 1 over
        script.epoch += 1
        del script.ports["b"]
        b.cut()
        await (await producer.send(b"on a", key=_key_for(1, 2)))
        message = await consumer.receive(timeout=15)
        assert (message.value, message.partition) == (b"on a", 1)
        await message.ack()
    assert (await _offsets(a, "t"))[1] == 1


async def test_map_keys_go_to_their_owner_and_scan_merges(
    two_brokers: tuple[Script, BrokerFront, BrokerFront],
) -> None:
    script, a, b = two_brokers
    await _create("m", 2, a, b, configs={"last.value": "true"})
    script.owners["m"] = ["a", "b"]
    keys = [f"key{i:02d}" for i in range(20)]
    async with await headwater.connect(a.address) as client:
        table = client.map("m")
        await table.set_many({k: k.upper() for k in keys})
        await table.set("key00", "again")
        assert (await table.get("key00")) is not None
        values = await table.get_many([*keys, "absent"])
        assert [v.value if v else None for v in values] == [
            b"again",
            *(k.upper().encode() for k in keys[1:]),
            None,
        ]
        assert await table.size() == 20
        seen = []
        async for entry in table.items(page_size=3):
            seen.append(entry.key)
        assert seen == sorted(k.encode() for k in keys)
    for front, partition in ((a, 0), (b, 1)):
        async with await headwater.connect(f"127.0.0.1:{front.target_port}") as direct:
            here = await direct.map("m").get_many(keys)
            assert all(
                (v is not None) == (partition_for_key(k.encode(), 2) == partition)
                for k, v in zip(keys, here, strict=True)
            )


async def test_admin_requests_go_to_another_broker_when_the_bootstrap_is_lost(
    two_brokers: tuple[Script, BrokerFront, BrokerFront],
) -> None:
    script, a, b = two_brokers
    await _create("t", 2, a, b)
    script.owners["t"] = ["a", "b"]
    client = await headwater.connect(a.address)
    try:
        await client.lookup("t")
        await a.close()  # broker a is gone: its connections cut, no new ones
        deadline = asyncio.get_running_loop().time() + 10
        while client.connected and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)  # the loss is seen when the socket reports it
        assert not client.connected
        await client.create_topic("u", partitions=1)
    finally:
        await client.close()
    async with await headwater.connect(f"127.0.0.1:{b.target_port}") as direct:
        assert "u" in [t.name for t in await direct.list_topics()]


async def test_consumer_goes_on_when_the_bootstrap_broker_is_lost(
    two_brokers: tuple[Script, BrokerFront, BrokerFront],
) -> None:
    """The application's consumer is the leg at the bootstrap broker: losing that connection
    (no reconnection policy) suspends it instead of ending it, and the other legs go on."""
    script, a, b = two_brokers
    await _create("t", 2, a, b)
    script.owners["t"] = ["a", "b"]
    async with await headwater.connect(a.address) as client:
        client.metadata_refresh = 0.2
        consumer = await client.subscribe("t", "s", start="earliest")
        producer = client.producer("t")
        for partition in (0, 1):
            await (await producer.send(b"before", key=_key_for(partition, 2)))
        assert {(await consumer.receive(timeout=30)).partition for _ in range(2)} == {0, 1}
        script.owners["t"] = ["b", "b"]  # a is gone; b took partition 0 over
        script.epoch += 1
        del script.ports["a"]
        await a.close()
        await (await producer.send(b"after", key=_key_for(0, 2)))
        message = await consumer.receive(timeout=15)
        assert (message.value, message.partition) == (b"after", 0)
        await message.ack()
    assert (await _offsets(b, "t"))[0] == 1


async def test_placements_never_put_two_legs_at_one_broker(
    two_brokers: tuple[Script, BrokerFront, BrokerFront],
) -> None:
    """The periodic refresh, the resync after a lost leg and others may place legs at once: one
    at a time, so a broker never gets a second leg (whose messages nobody would take)."""
    script, a, b = two_brokers
    await _create("t", 2, a, b)
    script.owners["t"] = ["a", "b"]
    loop = asyncio.get_running_loop()

    async def consumers_at_b() -> int:
        async with await headwater.connect(f"127.0.0.1:{b.target_port}") as direct:
            (sub,) = await direct.list_subscriptions("t")
            return sub.consumers

    async with await headwater.connect(a.address) as client:
        await client.lookup("t")
        consumer = await client.subscribe("t", "s", type="shared")
        legs = consumer._cluster
        assert legs is not None
        leg = legs.legs[("127.0.0.1", script.ports["b"])]
        leg._connection._fail(leg._connection.lost("cut by the test"))  # its resync is due
        await client._router.refresh("t")  # b still owns partition 1
        await asyncio.gather(*(legs._sync() for _ in range(3)))
        deadline = loop.time() + 10
        while await consumers_at_b() != 1 and loop.time() < deadline:
            await asyncio.sleep(0.05)  # the server drops the cut connection's consumer
        assert await consumers_at_b() == 1
        assert len(legs.legs) == 2


async def test_producer_resends_to_the_new_owner_after_losing_a_broker(
    two_brokers: tuple[Script, BrokerFront, BrokerFront],
) -> None:
    script, a, b = two_brokers
    await _create("t", 2, a, b)
    script.owners["t"] = ["a", "b"]
    key = _key_for(1, 2)
    async with await headwater.connect(a.address) as client:
        producer = client.producer("t")
        await (await producer.send(b"to b", key=key))
        script.owners["t"] = ["a", "a"]  # b dies; a takes partition 1 over
        script.epoch += 1
        del script.ports["b"]
        await b.close()
        later = [await producer.send(b"to a", key=key) for _ in range(20)]
        await producer.flush()  # raises if any was lost
        assert all(f.result().partition == 1 for f in later)
    assert (await _offsets(a, "t"))[1] == 20


async def test_a_producer_waits_for_a_dead_owners_successor_with_one_long_poll(
    two_brokers: tuple[Script, BrokerFront, BrokerFront],
) -> None:
    """b dies and nobody owns its partition for a while (its lease has not expired): the
    producer asks for the new owner with a LOOKUP long poll, answered when the cluster names
    one, and resends there at once, instead of a LOOKUP every 125-250 ms meanwhile."""
    script, a, b = two_brokers
    await _create("t", 2, a, b)
    script.owners["t"] = ["a", "b"]
    key = _key_for(1, 2)
    async with await headwater.connect(a.address) as client:
        producer = client.producer("t")
        await (await producer.send(b"to b", key=key))
        script.move("t", ["a", ""])  # b's key gone with its lease; no new owner yet
        del script.ports["b"]
        await b.close()
        lookups = script.lookups
        sent = await producer.send(b"after b", key=key)
        await _until(script.looked_up, lambda: script.lookups > lookups)  # it knows b is gone
        lookups = script.lookups
        # the span a take-over takes, during which the producer must not poll
        await asyncio.sleep(1.5)
        waited = script.lookups - lookups
        script.move("t", ["a", "a"])  # a takes partition 1 over
        acked = await asyncio.wait_for(sent, 10)
    assert acked.partition == 1 and acked.offset == 0
    # a poll every 125-250 ms would have made 6-12; the metadata refresh may make one
    assert waited <= 1, f"{waited} LOOKUPs while waiting: polled, not a long poll"
    assert script.long_polls >= 1


async def test_a_batch_at_a_frozen_owner_is_checked_though_an_earlier_check_still_asks(
    two_brokers: tuple[Script, BrokerFront, BrokerFront],
) -> None:
    """An earlier batch's check of its silent owner may still be asking (a long poll, up to 5 s)
    after that batch was answered; a batch left unanswered there meanwhile is checked once it
    ends, and goes to the new owner when the cluster names one. It was not: its check found the
    earlier one running and was never made again, and the batch waited for the frozen owner to
    wake (seen as 12 s first acks after a 12 s freeze, 2 rounds in about 120)."""
    script, a, b = two_brokers
    await _create("t", 2, a, b)
    script.owners["t"] = ["b", "b"]
    async with await headwater.connect(a.address) as client:
        client.owner_check = 0.3
        producer = client.producer("t")
        await (await producer.send(b"first", partition=0))
        router = client._router
        assert router is not None
        await router.refresh("t")  # the epoch the checks wait past is the script's
        try:
            b.awake.clear()  # slow: this batch goes unanswered past owner_check
            slow = await producer.send(b"slow", partition=0)
            await _until(script.looked_up, lambda: script.long_polls >= 1)  # its check asks
            b.awake.set()  # answered; its check's long poll goes on: b is still the owner
            await asyncio.wait_for(slow, 10)
            b.awake.clear()  # frozen now
            stuck = await producer.send(b"stuck", partition=1)
            # the first check's long poll ends with b still named; then this batch's check
            await _until(script.looked_up, lambda: script.long_polls >= 2, timeout=20)
            script.move("t", ["b", "a"])  # a took partition 1 over
            acked = await asyncio.wait_for(stuck, 10)
        finally:
            b.awake.set()
    assert acked.partition == 1 and acked.offset == 0  # a's first record of partition 1


async def test_a_batch_whose_partition_never_gets_an_owner_fails_and_close_returns(
    two_brokers: tuple[Script, BrokerFront, BrokerFront],
) -> None:
    """A partition that stays without an owner: its batch, never sent, fails NOT_OWNER once
    the router's backoff and then the retry policy's time have run out, and `close` returns
    (raising it, as its flush does).
    The policy's time counted from the batch's first transmission, which never came: it was
    put back after every backoff for ever, and `flush` and `close` waited for it for ever."""
    script, a, b = two_brokers
    await _create("t", 2, a, b)
    script.owners["t"] = ["a", ""]  # nobody takes partition 1
    policy = RetryPolicy(timeout=1.0)
    async with await headwater.connect(a.address) as client:
        router = client._router
        assert router is not None
        router.backoff = LookupBackoff(initial=0.05, maximum=0.1, timeout=1.0)
        producer = client.producer("t", delivery=AtLeastOnce(policy))
        await (await producer.send(b"to a", partition=0))  # a cluster, as LOOKUP says
        sent = await producer.send(b"nowhere", partition=1)
        with pytest.raises(NotOwner):
            await asyncio.wait_for(sent, 30)
        with pytest.raises(NotOwner):  # its flush reports the failure: no success claimed
            await asyncio.wait_for(producer.close(), 30)


async def test_producer_reaching_an_owner_mid_take_over_acks_without_using_its_retries(
    two_brokers: tuple[Script, BrokerFront, BrokerFront],
) -> None:
    """LOOKUP names the new owner as soon as its key is in etcd, while it is still taking the
    partition over: it answers NOT_OWNER naming no owner until it serves. The producer waits
    for it within its policy's time budget, not its retry count (5 quick retries ran out in
    0.3 s, well inside a take-over)."""
    script, a, b = two_brokers
    await _create("t", 2, a, b)
    script.owners["t"] = ["a", "b"]
    key = _key_for(0, 2)
    policy = RetryPolicy(max_retries=2, initial_delay=0.01, timeout=30.0)
    async with await headwater.connect(a.address) as client:
        producer = client.producer("t", delivery=AtLeastOnce(policy))
        assert (await (await producer.send(b"before", key=key))).offset == 0
        script.owners["t"] = ["b", "b"]  # partition 0 moved to b, which is still taking it over
        script.epoch += 1
        b.taking_over = 6  # its next 6 produces for partition 0 answer NOT_OWNER, owner=none
        acked = await asyncio.wait_for(await producer.send(b"after", key=key), 20)
        await producer.flush()  # raises if any send failed
    assert acked.partition == 0 and acked.offset == 0
    assert b.taking_over == 0  # all 6 refusals were met: more than the policy's 2 retries
    assert (await _offsets(b, "t"))[0] == 1
    assert (await _offsets(a, "t"))[0] == 1  # only the first, nothing resent to a


async def test_blocking_client_goes_to_the_owner_and_follows_not_owner(
    two_brokers: tuple[Script, BrokerFront, BrokerFront],
) -> None:
    """A partition's produce goes to the owner LOOKUP names (bootstrapped at a, the owner b:
    nothing refused), on a connection kept for the next produces; when the partition moves
    without the client knowing, the NOT_OWNER naming the new owner is followed there."""
    script, a, b = two_brokers
    await _create("t", 2, a, b)
    script.owners["t"] = ["b", "b"]

    def produce() -> list[int]:
        with BlockingClient(a.address, timeout=10) as client:
            offsets = [client.produce("t", [(None, b"x", ())], partition=0) for _ in range(3)]
            script.owners["t"] = ["a", "b"]  # moved: b refuses, naming a
            script.epoch += 1
            offsets += [client.produce("t", [(None, b"y", ())], partition=0) for _ in range(2)]
            return offsets

    assert await asyncio.to_thread(produce) == [0, 1, 2, 0, 1]
    assert (a.refused, b.refused) == (0, 1)  # once: then the route is a
    assert (await _offsets(b, "t"))[0] == 3 and (await _offsets(a, "t"))[0] == 2


async def _until(event: asyncio.Event, condition: Any, timeout: float = 30) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            event.clear()
            await event.wait()


async def test_consumer_leg_at_a_silent_broker_is_dropped_once_another_owner_is_named(
    two_brokers: tuple[Script, BrokerFront, BrokerFront],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A leg whose broker sends nothing is checked after `owner_check`: an idle broker answers
    the check (API_VERSIONS) and keeps its leg; a frozen one (its front reads and answers
    nothing, its connection open) is looked up through the other broker, and keeps its leg
    while the cluster still names it (only slow); once another owner is named the leg is
    dropped and the partition's messages come from the new owner."""
    script, a, b = two_brokers
    await _create("t", 2, a, b)
    script.owners["t"] = ["a", "b"]
    async with await headwater.connect(a.address) as client:
        client.owner_check = 0.2
        consumer = await client.subscribe("t", "s", start="earliest")
        producer = client.producer("t")
        await (await producer.send(b"on b", key=_key_for(1, 2)))
        message = await consumer.receive(timeout=30)
        assert (message.value, message.partition) == (b"on b", 1)
        await message.ack()
        legs = consumer._cluster
        assert isinstance(legs, ClusterLegs)
        leg_b = legs.legs[("127.0.0.1", script.ports["b"])]
        dropped = asyncio.Event()
        leg_lost = legs.leg_lost

        def lost(leg: Consumer, error: HeadwaterError) -> None:
            if leg is leg_b:
                dropped.set()
            leg_lost(leg, error)

        monkeypatch.setattr(legs, "leg_lost", lost)
        # idle: nothing delivered, the check answered, the leg kept
        await _until(b.pinged, lambda: b.pings >= 3)
        assert legs._alive(leg_b) and not dropped.is_set()
        b.awake.clear()  # frozen
        pings = b.pings
        try:
            # silent, but the cluster still names it (a slow owner): looked up, the leg kept
            lookups = script.lookups
            await _until(script.looked_up, lambda: script.lookups >= lookups + 3)
            assert legs._alive(leg_b) and not dropped.is_set()
            script.owners["t"] = ["a", "a"]  # a took partition 1 over
            script.epoch += 1
            await asyncio.wait_for(dropped.wait(), 15)
            assert not legs._alive(leg_b) and b.pings == pings  # nothing read since the freeze
            await (await producer.send(b"on a", key=_key_for(1, 2)))
            message = await consumer.receive(timeout=15)
            assert (message.value, message.partition) == (b"on a", 1)
            assert message._consumer is not leg_b
            await message.ack()
        finally:
            b.awake.set()
