"""The cluster half of `Client`: its router, connections to the other brokers, `lookup`.

A mixin, so `headwater.client.client` stays small. The client keeps one routing table for all its
producers, consumers and maps (headwater/client/routing_table.py, headwater/client/router.py).
LOOKUP goes over the bootstrap connection (without waiting out a reconnection: the routes already
known are used meanwhile), and over the other known brokers when that one is lost. Admin requests go
to the bootstrap connection; when it is lost for good, to another known broker.

`subscribe` subscribes on the bootstrap connection first, as on a single broker. When the
topic's routes are fresh and name several brokers, the consumer gets its legs at the other owners
before `subscribe` returns (headwater/client/consumer_legs.py); when they are not known yet, one
LOOKUP is sent after the subscription and the legs are added when it names several brokers, so a
single broker sees exactly the requests it saw before routing existed, plus one LOOKUP.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import TYPE_CHECKING, Protocol

from headwater.client.consumer import Consumer
from headwater.client.consumer_legs import ClusterLegs, _watched
from headwater.client.router import Peers, Router
from headwater.client.routing_table import BrokerAddress, RoutingTable
from headwater.wire import messages as m
from headwater.wire.errors import ConnectionClosed, ConnectionLost, HeadwaterError

if TYPE_CHECKING:
    from headwater.client.broker_connection import Connection


class _Opens(Protocol):
    async def open(self) -> Connection: ...

    async def open_at(self, host: str, port: int) -> Connection: ...


class ClusterMixin:
    _connection: Connection
    _online: asyncio.Event
    _gave_up: ConnectionLost | None
    _closed: bool
    _opener: _Opens
    _consumers: set[Consumer]

    async def _ready(self) -> Connection:
        raise NotImplementedError  # `Client` has it

    def _init_cluster(self, host: str, port: int, timeout: float) -> None:
        self._router = Router(RoutingTable(BrokerAddress("", host, port)), self._lookup_request)
        self._peers = Peers(self._ready, (host, port), self._opener.open_at, self._router, timeout)
        self._router.peers = self._peers
        self._lookup_timeout = timeout
        self._watching: set[asyncio.Task[None]] = set()

    async def _lookup_request(self, request: m.Request) -> m.Response:
        if self._closed or not self._online.is_set() or self._gave_up is not None:
            raise ConnectionLost("the connection to the bootstrap broker is being reopened")
        return await self._connection.request(request, self._lookup_timeout)

    async def _ready_or_other(self) -> Connection:
        """The bootstrap connection; in a cluster, when it is lost for good (no reconnection,
        or the reconnection gave up), a connection to another live broker. Only a request not
        sent yet goes elsewhere: one lost in flight may have been applied."""
        try:
            connection = await self._ready()
        except ConnectionLost as exc:
            if not self._router.multi_broker:
                raise
            return await self._other_broker(exc)
        if connection.closed and self._router.multi_broker and not self._closed:
            return await self._other_broker(
                ConnectionLost(f"connection to {connection.address} lost")
            )
        return connection

    async def _other_broker(self, error: ConnectionLost) -> Connection:
        """Another known broker, or, when none answers, the bootstrap address again on a new
        connection of the router's (a bootstrap broker restarted there)."""
        table = self._router.table
        others = [b for b in table.brokers.values() if not self._peers.is_bootstrap(b)]
        for broker in [*others, table.bootstrap]:
            try:
                connection = await self._peers.get(broker)
            except ConnectionClosed:
                continue
            if not connection.closed:
                return connection
        raise error

    async def _close_cluster(self) -> None:
        for task in list(self._watching):
            task.cancel()
        await asyncio.gather(*self._watching, return_exceptions=True)
        self._router.close()
        await self._peers.close()

    @property
    def metadata_refresh(self) -> float:
        """Seconds a topic's routes are trusted while several brokers serve it (default 2):
        subscribed consumers look their topic up again this often, to follow partitions that
        moved without their connection noticing."""
        return self._router.table.refresh_interval

    @metadata_refresh.setter
    def metadata_refresh(self, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError("metadata_refresh must be > 0")
        self._router.table.refresh_interval = seconds

    @property
    def owner_check(self) -> float:
        """Seconds a request to a partition's owner may stay unanswered before the client asks
        the other brokers whether the partition moved: half the cluster's lease, which LOOKUP
        answers carry (1 s, half the default 2 s lease, before the first answer or from a
        server without the field), unless set here; a frozen owner's partitions are resent to
        their new owner once it has them, not after the request timeout. A consumer's leg at a
        broker that sent nothing for as long, and leaves a cheap request unanswered as long, is
        checked the same way and moved to the new owner. An owner the cluster still names keeps
        its requests and its legs."""
        return self._router.table.owner_check

    @owner_check.setter
    def owner_check(self, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError("owner_check must be > 0")
        self._router.table.owner_check = seconds
        self._router.table.owner_check_fixed = True

    @property
    def brokers(self) -> list[BrokerAddress]:
        """The brokers the last LOOKUP named (empty before any, or on a server without LOOKUP)."""
        return list(self._router.table.brokers.values())

    async def lookup(self, topic: str) -> dict[int, BrokerAddress | None]:
        """Each partition of `topic` with the broker that owns it now (None while nobody does),
        asked of the cluster now; raises `UnknownTopic` for a topic that does not exist. On a
        single broker every partition is owned by the address the client connected to."""
        return await self._router.lookup(topic)

    async def _owners_offsets(self, response: m.DescribeTopicResponse) -> m.DescribeTopicResponse:
        """In a cluster, each partition's next and start offsets as its owner knows them (the
        broker that answered DESCRIBE_TOPIC knows only its own partitions': `consume
        --exit-at-end` stopped short); the rest of the answer is the bootstrap broker's."""
        name = response.topic.name
        await self._router.settle(name)
        if not self._router.multi_broker:
            return response
        next_offsets, start_offsets = list(response.next_offsets), list(response.start_offsets)
        by_owner: dict[BrokerAddress, list[int]] = {}
        for partition, owner in (await self._router.lookup(name)).items():
            if owner is not None and partition < len(next_offsets):
                by_owner.setdefault(owner, []).append(partition)
        for owner, partitions in by_owner.items():
            answer = await (await self._peers.get(owner)).request(m.DescribeTopicRequest(name))
            assert isinstance(answer, m.DescribeTopicResponse)
            for partition in partitions:
                next_offsets[partition] = answer.next_offsets[partition]
                start_offsets[partition] = answer.start_offsets[partition]
        return dataclasses.replace(
            response, next_offsets=tuple(next_offsets), start_offsets=tuple(start_offsets)
        )

    async def _subscribe_cluster(self, consumer: Consumer, refused: bool = False) -> bool:
        """Give the consumer its legs at the other owners of its topic's partitions, now when
        the routes are known or the bootstrap broker `refused` it (NOT_OWNER), else once they
        are; whether it has them (False: one broker serves the topic, as far as known)."""
        router = self._router
        if refused:
            await router.settle(consumer.topic, force=True)
        elif not router.fresh(consumer.topic):
            task = _watched(asyncio.get_running_loop().create_task(self._watch(consumer)))
            self._watching.add(task)
            task.add_done_callback(self._watching.discard)
            return False
        if not router.multi_broker:
            return False
        await self._attach_legs(consumer, refused)
        return True

    async def _watch(self, consumer: Consumer) -> None:
        await self._router.settle(consumer.topic)
        if self._router.multi_broker and consumer._error is None and consumer._cluster is None:
            try:
                await self._attach_legs(consumer, False)
            except HeadwaterError as exc:
                consumer._end(exc)

    async def _attach_legs(self, consumer: Consumer, refused: bool) -> None:
        legs = ClusterLegs(consumer, self._router, self._peers)
        consumer._on_ready = legs.ready.set
        consumer.join_cluster(legs)
        if refused:
            consumer._suspended = True  # nothing of the topic at the bootstrap broker
        self._consumers.add(consumer)
        try:
            await legs.start()
        except HeadwaterError:
            # refused at another owner: the application gets the error and no consumer, so the
            # legs already attached go (an Exclusive one would keep the subscription's claim)
            with contextlib.suppress(HeadwaterError):
                await consumer.close()
            raise
