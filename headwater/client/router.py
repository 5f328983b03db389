"""The client's routing I/O: LOOKUP requests around the routing table, and connections per broker.

`Router` keeps one `routing.RoutingTable` for a client (its producers, consumers and maps share
it). `route(topic, partition)` answers from the table when its routes are fresh (no round trip:
the hot path costs a dictionary lookup), else sends one LOOKUP for the topic first; concurrent
callers share that one request. While a partition has no owner (a failover under way) it looks up
again after `LookupBackoff` delays, and raises NOT_OWNER when the backoff's time runs out. A
LOOKUP goes through the bootstrap connection; when that fails, or, in a cluster, leaves it
unanswered for `owner_check` (a frozen bootstrap broker), through each other known broker in
turn. A server that predates LOOKUP answers UNSUPPORTED_API: a single broker, routed as one.

`Peers` holds connections to the brokers other than the bootstrap one, opened on first use with
the client's opener (TLS, the handshake) and dropped when lost, which also tells the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from headwater.client.broker_connection import Connection
from headwater.client.routing_table import BrokerAddress, LookupBackoff, RoutingTable
from headwater.wire import messages as m
from headwater.wire.errors import (
    ConnectionClosed,
    ConnectionLost,
    HeadwaterError,
    InvalidPartition,
    NotOwner,
    RequestTimeout,
    UnsupportedApi,
    UnsupportedVersion,
)
from headwater.wire.limits import MAX_LOOKUP_WAITS

__all__ = ["Peers", "Router"]

logger = logging.getLogger(__name__)

Requester = Callable[[m.Request], Awaitable[m.Response]]
Opener = Callable[[str, int], Awaitable[Connection]]

# How long one LOOKUP long poll for a partition's new owner may wait (then the caller asks
# again): well under the server's limit (20 s) and any request timeout.
LONG_POLL = 5.0


class Router:
    def __init__(
        self,
        table: RoutingTable,
        request: Requester,
        backoff: LookupBackoff | None = None,
    ) -> None:
        self.table = table
        self._request = request  # through the bootstrap connection
        self.backoff = backoff or LookupBackoff()
        self.peers: Peers | None = None  # set by the client: the other brokers, for fallbacks
        self._pending: dict[str, asyncio.Task[None]] = {}
        self._loop = asyncio.get_running_loop()
        # brokers that left a request unanswered past `owner_check` (dead or frozen) -> until
        # when (loop time) lookups do not go through them first
        self._silent: dict[tuple[str, int], float] = {}
        self._long_polls = True  # False once a broker refused LOOKUP version 1 (it predates it)
        self._polls: dict[tuple[str, tuple[str, int] | None], asyncio.Task[bool]] = {}
        # the broker that answered the last LOOKUP: alive then, so a long poll goes there first
        # (one through a frozen broker would wait out its whole timeout)
        self._answered_by: tuple[str, int] | None = None

    @property
    def multi_broker(self) -> bool:
        return self.table.multi_broker

    def fresh(self, topic: str) -> bool:
        return not self.table.needs_lookup(topic, self._loop.time())

    async def ensure(self, topic: str) -> None:
        """Look the topic up unless its routes are fresh."""
        if self.table.needs_lookup(topic, self._loop.time()):
            await self.refresh(topic)

    async def settle(self, topic: str, force: bool = False) -> None:
        """`ensure` (or `refresh` when `force`), where a failed LOOKUP leaves the routes as they
        are: on a single broker, the caller's own connection then meets the failure (and its
        reconnection policy), as without routing; in a cluster, `route` asks again."""
        try:
            await (self.refresh(topic) if force else self.ensure(topic))
        except (ConnectionClosed, RequestTimeout) as exc:
            logger.debug("lookup of %s failed: %s", topic, exc)

    async def refresh(self, topic: str) -> None:
        """One LOOKUP for the topic (shared with whoever asks meanwhile)."""
        task = self._pending.get(topic)
        if task is None:
            task = self._loop.create_task(self._lookup(topic))
            self._pending[topic] = task
            task.add_done_callback(lambda done: self._done(topic, done))
        await asyncio.shield(task)  # a caller cancelled does not cancel the others' lookup

    def _done(self, topic: str, task: asyncio.Task[None]) -> None:
        if self._pending.get(topic) is task:
            del self._pending[topic]
        if not task.cancelled():
            task.exception()  # its waiters got it; with none left it is not worth a warning

    def close(self) -> None:
        for task in [*self._pending.values(), *self._polls.values()]:
            task.cancel()

    async def _lookup(self, topic: str) -> None:
        request = m.LookupRequest((topic,))
        try:
            if self._is_silent(self.table.bootstrap.address):
                raise RequestTimeout("the bootstrap broker left a request unanswered")
            response = await self._through_bootstrap(request)
            self._answered_by = self.table.bootstrap.address
        except UnsupportedApi:
            self.table.unsupported([topic], self._loop.time())
            return
        except (ConnectionClosed, RequestTimeout) as exc:
            response = await self._lookup_elsewhere(request, exc)
        assert isinstance(response, m.LookupResponse)
        self.table.apply(response, self._loop.time())
        logger.debug("looked up %s: %s", topic, self.table.owners(topic))

    async def _through_bootstrap(self, request: m.LookupRequest) -> m.Response:
        """The LOOKUP through the bootstrap connection. In a cluster, answered within
        `owner_check` or asked elsewhere: a frozen bootstrap broker keeps its connection open
        and answers nothing, and every lookup waiting on this one (the sender's, the consumer
        legs') waited the client's request timeout; it took 4.2-5.5 s to deliver a frozen
        bootstrap broker's partitions from their new owner (issue 42)."""
        if not self.table.multi_broker:
            return await self._request(request)
        check = self.table.owner_check
        try:
            async with asyncio.timeout(check):
                return await self._request(request)
        except TimeoutError:
            bootstrap = self.table.bootstrap.address
            self._silent[bootstrap] = self._loop.time() + 2 * self.table.refresh_interval
            raise RequestTimeout(
                f"the bootstrap broker left a LOOKUP unanswered for {check:.1f}s"
            ) from None

    async def _lookup_elsewhere(
        self, request: m.LookupRequest, error: HeadwaterError
    ) -> m.Response:
        """The bootstrap connection is lost: ask the other brokers we know, in turn, then the
        bootstrap address again on a connection of our own (the broker may be back there,
        restarted, and the only one left)."""
        if self.peers is None:
            raise error
        bootstrap = self.table.bootstrap
        others = [b for b in self.table.brokers.values() if b.address != bootstrap.address]
        others.sort(key=lambda b: self._is_silent(b.address))  # the silent ones last
        for broker in [*others, bootstrap] if self.table.multi_broker else others:
            try:
                connection = await self.peers.get(broker)
                response = await connection.request(request, self.peers.timeout)
            except (ConnectionClosed, RequestTimeout) as exc:
                error = exc
                continue
            self._answered_by = broker.address
            return response
        raise error

    def _is_silent(self, address: tuple[str, int]) -> bool:
        until = self._silent.get(address)
        if until is None:
            return False
        if until <= self._loop.time():
            del self._silent[address]
            return False
        return True

    async def moved(self, topic: str, partition: int, silent: tuple[str, int]) -> bool:
        """The broker at `silent` left a request for the partition unanswered for
        `owner_check` seconds: ask the other brokers (not it, which may be frozen) and say
        whether the partition is no longer its own (another owner, or none while its lease has
        expired and a take-over is under way). A long poll (`new_owner`): the answer comes when
        they see a new owner, or after `LONG_POLL` s with the silent one still named."""
        # lookups avoid it for a while: a frozen bootstrap broker would hold them to the timeout
        self._silent[silent] = self._loop.time() + 2 * self.table.refresh_interval
        if self.peers is None:
            return False
        if not await self.new_owner(topic, partition, silent):
            request = m.LookupRequest((topic,))
            response = await self._ask_others(request, silent, self.table.owner_check)
            self.table.apply(response, self._loop.time())
        owner = self.table.owner(topic, partition)
        return owner is None or owner.address != silent

    async def new_owner(
        self,
        topic: str,
        partition: int,
        avoid: tuple[str, int] | None = None,
        wait: float = LONG_POLL,
    ) -> bool:
        """Wait for the cluster to name a new owner of the partition: a LOOKUP long poll
        (version 1) for an owner under a newer epoch than the table's, through a broker other
        than `avoid` (dead or frozen), answered as soon as that broker sees the new owner's
        key (a take-over starts with it) or after `wait` s (at most `LONG_POLL`). Its answer
        goes into the table. One long poll per topic and avoided broker at a time, waiting for
        every partition of the topic without an owner or owned by `avoid`, is shared by all
        who wait (a dead broker's thousand partitions are one request, not a thousand). False
        when no long poll could be made: the brokers predate it (asked once), or none
        answered, or `wait` is too short; the caller then asks again after a backoff."""
        wait = min(wait, LONG_POLL)
        if self.peers is None or not self._long_polls or wait < 0.05:
            return False
        key = (topic, avoid)
        poll = self._polls.get(key)
        if poll is None:
            poll = self._loop.create_task(self._long_poll(topic, partition, avoid, wait))
            self._polls[key] = poll
            poll.add_done_callback(lambda done: self._polled(key, done))
        return await asyncio.shield(poll)  # a caller cancelled leaves it to the others

    def _polled(self, key: tuple[str, tuple[str, int] | None], poll: asyncio.Task[bool]) -> None:
        if self._polls.get(key) is poll:
            del self._polls[key]
        if not poll.cancelled():
            poll.exception()  # raised to its waiters already

    async def _long_poll(
        self, topic: str, partition: int, avoid: tuple[str, int] | None, wait: float
    ) -> bool:
        routes = self.table.topics.get(topic)
        waits = {partition: 0}
        if routes is not None and routes.error is None:
            for index, owner in enumerate(routes.owners):
                address = self.table.brokers.get(owner)
                if index == partition or address is None or address.address == avoid:
                    waits[index] = routes.epochs[index]
        waiting = tuple(m.LookupWait(topic, p, e) for p, e in sorted(waits.items()))
        request = m.LookupRequest((topic,), int(wait * 1000), waiting[:MAX_LOOKUP_WAITS])
        logger.debug("long poll for %s partitions %s (avoiding %s)", topic, sorted(waits), avoid)
        try:
            response = await self._ask_others(request, avoid, wait + self.table.owner_check)
        except UnsupportedVersion:
            self._long_polls = False
            return False
        except (ConnectionClosed, RequestTimeout) as exc:
            logger.debug("long poll for %s failed: %s", topic, exc)
            return False
        self.table.apply(response, self._loop.time())
        return True

    async def _ask_others(
        self, request: m.LookupRequest, avoid: tuple[str, int] | None, timeout: float
    ) -> m.LookupResponse:
        """`request` through the first broker that answers, other than `avoid`: the known
        brokers (the silent ones last, the one that answered last first), or the bootstrap
        one when no other is known."""
        assert self.peers is not None
        others = [b for b in self.table.brokers.values() if b.address != avoid]
        if not others and self.table.bootstrap.address != avoid:
            others = [self.table.bootstrap]
        others.sort(key=lambda b: (self._is_silent(b.address), b.address != self._answered_by))
        error: HeadwaterError = ConnectionLost("no other broker known")
        for broker in others:
            try:
                connection = await self.peers.get(broker)
                response = await connection.request(request, timeout)
            except (ConnectionClosed, RequestTimeout) as exc:
                error = exc
                continue
            assert isinstance(response, m.LookupResponse)
            self._answered_by = broker.address
            logger.debug("%s answered by %s", type(request).__name__, broker)
            return response
        raise error

    async def route(self, topic: str, partition: int) -> BrokerAddress:
        """The broker to send the partition's requests to, waiting (bounded) while it has none:
        a long poll for its new owner (`new_owner`), else a lookup after each backoff delay."""
        await self.settle(topic)
        address = self.table.owner(topic, partition)
        if address is not None:
            return address
        if self.table.error(topic) is not None:
            return self.table.bootstrap  # the server answers with the topic's error
        deadline = self._loop.time() + self.backoff.timeout
        for delay in self.backoff.delays():
            polled = await self.new_owner(topic, partition, wait=deadline - self._loop.time())
            if not polled:
                await asyncio.sleep(delay)
                await self.settle(topic, force=True)
            address = self.table.owner(topic, partition)
            if address is not None or self.table.error(topic) is not None:
                return address or self.table.bootstrap
            self._check_partition(topic, partition)
            if self._loop.time() >= deadline:
                break
            if polled:  # answered with no owner yet (its time ran out): no hot loop
                await asyncio.sleep(delay)
        raise NotOwner(
            f"partition {partition} of topic {topic!r} has no owner after "
            f"{self.backoff.timeout:.0f}s of lookups: owner=none"
        )

    def _check_partition(self, topic: str, partition: int) -> None:
        """A partition past the topic's count will never get an owner (the topic was deleted
        and re-created with fewer partitions while a batch for it waited): fail it now rather
        than after the whole owner backoff, with everything queued behind it."""
        count = self.table.partitions(topic)
        if count is not None and partition >= count:
            raise InvalidPartition(
                f"topic {topic!r} has partitions 0..{count - 1}, not {partition}"
            )

    async def lookup(self, topic: str) -> dict[int, BrokerAddress | None]:
        """Each partition's owner, looked up now (None: nobody owns it now). Raises the topic's
        error (UnknownTopic, ...)."""
        await self.refresh(topic)
        error = self.table.error(topic)
        if error is not None:
            raise type(error)(error.message)
        table = self.table
        routes = table.topics[topic]
        if not table.multi_broker:  # the one broker is the bootstrap (its own view may be 0.0.0.0)
            only = next(iter(table.brokers.values()), None)
            here = (
                table.bootstrap
                if only is None
                else BrokerAddress(only.broker_id, *table.bootstrap.address)
            )
            return {p: here for p in range(len(routes.owners))}
        return {p: table.brokers.get(owner) for p, owner in enumerate(routes.owners)}

    def not_owner(self, topic: str, partition: int, error: NotOwner) -> None:
        moved = self.table.not_owner(topic, partition, error)
        logger.info("%s; now %s", error.message, moved or "looking it up again")

    def lost(self, address: tuple[str, int]) -> None:
        topics = self.table.broker_lost(address)
        if topics:
            logger.info("broker %s:%s lost; looking up %s again", *address, ", ".join(topics))


class Peers:
    """Connections to brokers by address; the bootstrap one comes from `bootstrap()`."""

    def __init__(
        self,
        bootstrap: Callable[[], Awaitable[Connection]],
        bootstrap_address: tuple[str, int],
        open_at: Opener,
        router: Router,
        timeout: float,
    ) -> None:
        self._bootstrap = bootstrap
        self._bootstrap_address = bootstrap_address
        self._open_at = open_at
        self._router = router
        self.timeout = timeout
        self._connections: dict[tuple[str, int], Connection] = {}
        self._opening: dict[tuple[str, int], asyncio.Task[Connection]] = {}
        self.on_lost: list[Callable[[Connection, ConnectionLost], None]] = []

    def is_bootstrap(self, broker: BrokerAddress) -> bool:
        return broker.broker_id == "" or broker.address == self._bootstrap_address

    async def get(self, broker: BrokerAddress) -> Connection:
        """A connection to `broker`. The bootstrap broker's is the client's own connection while
        it is open (or being reopened by the client's reconnection policy); once it is closed
        for good, in a cluster, a connection of ours to that address like any other broker's:
        a bootstrap broker restarted on its address is reached again without `reconnect`."""
        if self.is_bootstrap(broker):
            try:
                own = await self._bootstrap()
            except ConnectionLost:  # the client's reconnection gave up
                if not self._router.multi_broker:
                    raise
            else:
                if not own.closed or not self._router.multi_broker:
                    return own
        address = self._bootstrap_address if self.is_bootstrap(broker) else broker.address
        connection = self._connections.get(address)
        if connection is not None and not connection.closed:
            return connection
        task = self._opening.get(address)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._open(address))
            self._opening[address] = task
            task.add_done_callback(lambda done: self._opened(address, done))
        return await asyncio.shield(task)

    def _opened(self, address: tuple[str, int], task: asyncio.Task[Connection]) -> None:
        if self._opening.get(address) is task:
            del self._opening[address]
        if not task.cancelled():
            task.exception()  # raised to its waiters already

    async def _open(self, address: tuple[str, int]) -> Connection:
        try:
            connection = await self._open_at(*address)
        except ConnectionClosed:
            self._router.lost(address)
            raise
        connection.on_lost = lambda error: self._lost(address, connection, error)
        connection.on_unsolicited_error = self._unsolicited
        self._connections[address] = connection
        return connection

    def _unsolicited(self, error: HeadwaterError) -> None:
        """An ack, nack or flow refused: NOT_OWNER means partitions moved (which ones the
        error does not say): every topic is looked up again on its next use."""
        logger.warning("request sent without response failed: %s", error)
        if isinstance(error, NotOwner):
            for topic in list(self._router.table.topics):
                self._router.table.invalidate(topic)

    def _lost(
        self, address: tuple[str, int], connection: Connection, error: ConnectionLost
    ) -> None:
        if self._connections.get(address) is connection:
            del self._connections[address]
        self._router.lost(address)
        for listener in list(self.on_lost):
            listener(connection, error)

    async def close(self) -> None:
        for task in list(self._opening.values()):
            task.cancel()
        for connection in list(self._connections.values()):
            with contextlib.suppress(HeadwaterError):
                await connection.close()
        self._connections.clear()
