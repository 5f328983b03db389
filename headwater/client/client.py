"""The asyncio client: topic admin, producers and consumers over one connection.

    client = await headwater.connect("127.0.0.1:6650", reconnect=True)

    await client.create_topic("events", partitions=2)
    producer = client.producer("events")
    future = await producer.send(b"hello", key=b"k")   # waits for queue room only
    meta = await future                                 # RecordMetadata with the offset
    consumer = await client.subscribe("events", "audit", type="shared")
    async for message in consumer:
        await message.ack()

`fetch` reads a partition by offset with no subscription (the reader keeps the offsets;
headwater/client/fetched.py). The producer batches: records sent in the same event-loop turn (or
up to `batch_size` bytes) for the same partition travel as one RecordBatch, and each record's
future resolves with the batch's base offset plus its position. Consumers:
headwater/client/consumer.py. The operator requests (alter topic configs, list and reset
subscriptions, server info) come from headwater/client/admin_calls.py.

With `reconnect`, losing the connection starts one reconnection task: it opens a new connection
after the policy's delay, resubscribes every open consumer with its original request (a reliable
subscription then redelivers what was not acknowledged: at-least-once holds), and repeats until it
succeeds or the policy gives up. Requests already sent fail with `ConnectionLost` (the producers,
on connections of their own, retry as their delivery policy says); requests made meanwhile wait
for the reconnection and then go out.

In a cluster (LOOKUP names several brokers; docs/CLUSTER.md) the client routes by partition:
producers send each batch to its partition's owner, a consumer subscribes at every owner and
merges what they deliver (headwater/client/consumer_legs.py), maps send each key to its owner. The
routes come from one LOOKUP per topic, cached (headwater/client/router.py); on one broker everything
stays on this one connection, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import ssl
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from headwater.client.admin_calls import AdminMixin, StartName, start_position
from headwater.client.broker_connection import Connection, default_server, parse_server
from headwater.client.cluster_calls import ClusterMixin
from headwater.client.consumer import Consumer, Message, ms
from headwater.client.credentials import Tls, TlsOption, handshake_request, ssl_context
from headwater.client.fetched import Fetched
from headwater.client.map_client import Map
from headwater.client.producer import Producer, ProducerConfig
from headwater.client.reconnect import ReconnectPolicy
from headwater.client.schema_codec import Definition, SchemaAdmin, SchemaCodec, schema_configs
from headwater.client.transaction import (
    Brokers,
    TransactionHandle,
    TransactionSession,
    end_transaction,
)
from headwater.wire import messages as m
from headwater.wire.errors import (
    AuthenticationFailed,
    ConnectionClosed,
    ConnectionLost,
    ConsumerBusy,
    HeadwaterError,
    InvalidRequest,
    NotOwner,
    TopicExists,
)

__all__ = ["Client", "Consumer", "Message", "ReconnectPolicy", "Tls", "connect"]

logger = logging.getLogger(__name__)

SubscriptionTypeName = Literal["exclusive", "shared", "failover", "key_shared"]
DispatchName = Literal["non-reliable", "reliable"]

_SUBSCRIPTION_TYPES: dict[str, m.SubscriptionType] = {
    "exclusive": m.SubscriptionType.EXCLUSIVE,
    "shared": m.SubscriptionType.SHARED,
    "failover": m.SubscriptionType.FAILOVER,
    "key_shared": m.SubscriptionType.KEY_SHARED,
}
_DISPATCH_MODES: dict[str, m.DispatchMode] = {
    "non-reliable": m.DispatchMode.NON_RELIABLE,
    "reliable": m.DispatchMode.RELIABLE,
}
DISPATCH_NAMES: dict[int, str] = {mode: name for name, mode in _DISPATCH_MODES.items()}
SUBSCRIPTION_TYPE_NAMES: dict[int, str] = {kind: name for name, kind in _SUBSCRIPTION_TYPES.items()}


async def connect(
    server: str | None = None,
    *,
    timeout: float = 10.0,
    reconnect: bool | ReconnectPolicy = False,
    token: str | None = None,
    tls: TlsOption = None,
) -> Client:
    """Connect to `server` ("host:port"; by default $HEADWATER_SERVER, else 127.0.0.1:6650).
    With `reconnect` (True for the default policy), a lost connection is reopened and the
    consumers resubscribed; the first connection is not retried.

    `token` authenticates every connection the client opens (`headwater token create` makes
    one); `tls` is True (verify the server with the system's CAs), a `headwater.Tls` naming the
    CA and a client certificate, or an `ssl.SSLContext`. A client certificate without a token
    authenticates as the certificate's common name. A refused credential raises
    `AuthenticationFailed`."""
    host, port = parse_server(server or default_server())
    policy = ReconnectPolicy() if reconnect is True else reconnect or None
    opener = _Opener(host, port, timeout, token, tls)
    return Client(await opener.open(), host, port, timeout, policy, opener)


class _Opener:
    """Opens the client's connections: TLS and the handshake, the same for every one."""

    def __init__(
        self, host: str, port: int, timeout: float, token: str | None, tls: TlsOption
    ) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.context: ssl.SSLContext | None = ssl_context(tls)
        self.handshake = handshake_request(token, tls)
        self.server_hostname = tls.server_hostname if isinstance(tls, Tls) else None
        self.client_certificate = isinstance(tls, Tls) and tls.cert is not None

    async def open(self) -> Connection:
        return await self.open_at(self.host, self.port)

    async def open_at(self, host: str, port: int) -> Connection:
        """A connection to another broker of the cluster, set up as the bootstrap one."""
        return await Connection.open(
            host,
            port,
            self.timeout,
            self.context,
            self.handshake,
            self.server_hostname,
            self.client_certificate,
        )


class Client(ClusterMixin, AdminMixin, SchemaAdmin):
    def __init__(
        self,
        connection: Connection,
        host: str,
        port: int,
        timeout: float,
        reconnect: ReconnectPolicy | None = None,
        opener: _Opener | None = None,
    ) -> None:
        self._connection = connection
        self._opener = opener or _Opener(host, port, timeout, None, None)
        self._host = host
        self._port = port
        self._timeout = timeout
        self._producers: list[Producer] = []
        # transactional id -> the transactions its producers share (`producer`)
        self._sessions: dict[str, TransactionSession] = {}
        self._policy = reconnect
        self._consumers: set[Consumer] = set()  # the ones to resubscribe after a reconnection
        self._online = asyncio.Event()  # clear while reconnecting
        self._online.set()
        self._reconnecting: asyncio.Task[None] | None = None
        self._gave_up: ConnectionLost | None = None
        self._closed = False
        self.reconnections = 0  # successful ones, for monitoring
        if reconnect is not None:
            connection.on_lost = self._on_lost
        self._init_cluster(host, port, timeout)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Flush and close this client's producers, then the connection. Send errors not yet
        collected by `flush()` are not raised here: they were reported on the send futures.
        Consumers end their iteration normally."""
        self._closed = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
            await asyncio.gather(self._reconnecting, return_exceptions=True)
        for producer in self._producers:
            with contextlib.suppress(HeadwaterError):
                await producer.close()
        await self._close_cluster()
        await self._connection.close()
        for consumer in list(self._consumers):
            consumer._end(ConnectionClosed("client closed"))
        self._consumers.clear()
        self._online.set()  # wake requests waiting for a reconnection; they see the close

    @property
    def connected(self) -> bool:
        """Whether the client has a working connection now (False while reconnecting)."""
        return self._online.is_set() and self._gave_up is None and not self._connection.closed

    # Requests, across reconnections

    async def _ready(self) -> Connection:
        """The connection to use, after waiting out a reconnection in progress."""
        if not self._online.is_set():
            await self._online.wait()
        if self._gave_up is not None:
            raise ConnectionLost(self._gave_up.message)
        return self._connection

    async def _request(self, request: m.Request, timeout: float | None = 30.0) -> m.Response:
        return await (await self._ready_or_other()).request(request, timeout)

    def send_request(
        self,
        request: m.Request,
        timeout: float | None = 30.0,
        on_response: Callable[[m.Response], None] | None = None,
    ) -> asyncio.Future[m.Response]:
        """As `Connection.send_request`; while reconnecting, the request waits for it."""
        if self._online.is_set() and self._gave_up is None:
            return self._connection.send_request(request, timeout, on_response)
        return asyncio.ensure_future(self._request(request, timeout))

    async def request(self, request: m.Request, timeout: float | None = 30.0) -> m.Response:
        return await self._request(request, timeout)

    # Reconnection

    def _on_lost(self, error: ConnectionLost) -> None:
        if self._closed or self._gave_up is not None:
            return
        self._online.clear()
        if self._reconnecting is None or self._reconnecting.done():
            logger.warning("%s; reconnecting", error.message)
            self._reconnecting = asyncio.get_running_loop().create_task(self._reconnect(error))

    async def _reconnect(self, error: ConnectionLost) -> None:
        assert self._policy is not None
        loop = asyncio.get_running_loop()
        started, attempts = loop.time(), 0
        last: HeadwaterError = error
        for delay in self._policy.delays():
            timeout = self._policy.timeout
            if timeout is not None and loop.time() + delay - started > timeout:
                break
            await asyncio.sleep(delay)
            attempts += 1
            if self._connection.closed:
                try:
                    connection = await self._opener.open()
                except AuthenticationFailed as exc:  # revoked meanwhile: retrying cannot help
                    last = exc
                    break
                except ConnectionClosed as exc:
                    last = exc
                    continue
                connection.on_lost = self._on_lost
                self._connection = connection
            try:
                again = await self._resubscribe(self._connection)
            except ConnectionClosed as exc:  # lost again: the next attempt reopens it
                last = exc
                continue
            if self._connection.closed:
                continue
            if not self._online.is_set():
                self.reconnections += 1
                logger.info("reconnected to %s:%s", self._host, self._port)
            self._online.set()
            if again is None:
                return
            last = again
        self._give_up(last, attempts, loop.time() - started)

    async def _resubscribe(self, connection: Connection) -> HeadwaterError | None:
        """Subscribe every suspended consumer again; the last error worth another round, if
        any. An Exclusive subscription may still hold our old consumer (the server has not yet
        noticed that connection die): CONSUMER_BUSY, like a retriable error, leaves the consumer
        suspended for the next round; any other refusal ends the consumer with it."""
        again = None
        for consumer in list(self._consumers):
            if not consumer.resumable:
                continue  # attached already, or ended (and forgotten)
            try:
                await consumer._resubscribe(connection)
            except ConnectionClosed:
                raise
            except HeadwaterError as exc:
                if exc.retriable or isinstance(exc, ConsumerBusy):
                    again = exc
                else:
                    consumer._end(exc)
        return again

    def _give_up(self, last: HeadwaterError, attempts: int, elapsed: float) -> None:
        if self._connection.closed:
            self._gave_up = ConnectionLost(
                f"connection to {self._host}:{self._port} lost; gave up reconnecting after "
                f"{attempts} attempts in {elapsed:.1f}s: {last.message}"
            )
            logger.error("%s", self._gave_up.message)
        for consumer in list(self._consumers):
            if consumer.resumable:
                consumer._end(self._gave_up or last)
        self._online.set()  # wake the waiting requests: they raise ConnectionLost

    # Admin

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        dispatch: DispatchName = "reliable",
        configs: Mapping[str, str | int] | None = None,
        *,
        exist_ok: bool = False,
        schema: str | None = None,
        schema_definition: Definition = None,
        compatibility: str | None = None,
    ) -> None:
        """Create a topic, reliable unless `dispatch="non-reliable"` (in memory, fire and forget:
        a slow consumer misses messages); `configs` are reliable-topic settings such as
        {"fsync": "interval"}.
        With `exist_ok`, a topic of that name that exists already is not an error (as
        `os.makedirs`: its settings are not compared). `schema` (bytes, string, int64, json,
        avro), its definition and the compatibility mode make the topic's schema version 1
        (docs/SCHEMAS.md)."""
        mode = _DISPATCH_MODES.get(dispatch)
        if mode is None:
            raise InvalidRequest(
                f"dispatch must be one of {sorted(_DISPATCH_MODES)}, not {dispatch!r}"
            )
        settings = {**(configs or {}), **schema_configs(schema, schema_definition, compatibility)}
        entries = tuple(m.ConfigEntry(k, str(v)) for k, v in settings.items())
        try:
            await self._request(m.CreateTopicRequest(name, partitions, mode, entries))
        except TopicExists:
            if not exist_ok:
                raise

    async def delete_topic(self, name: str) -> None:
        await self._request(m.DeleteTopicRequest(name))

    async def create_partitions(self, name: str, partitions: int) -> None:
        """Grow topic `name` to `partitions` partitions in all (they are never removed; the
        same count again is not an error). Keyed records route by the new count from then on."""
        await self._request(m.CreatePartitionsRequest(name, partitions))

    async def list_topics(self) -> list[m.TopicInfo]:
        response = await self._request(m.ListTopicsRequest())
        assert isinstance(response, m.ListTopicsResponse)
        return list(response.topics)

    async def describe_topic(self, name: str) -> m.DescribeTopicResponse:
        response = await self._request(m.DescribeTopicRequest(name))
        assert isinstance(response, m.DescribeTopicResponse)
        return await self._owners_offsets(response)

    async def api_versions(self) -> dict[int, tuple[int, int]]:
        response = await self._request(m.ApiVersionsRequest())
        assert isinstance(response, m.ApiVersionsResponse)
        return {a.api_key: (a.min_version, a.max_version) for a in response.apis}

    # Messages

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int = 1024 * 1024,
        max_wait: float = 0.0,
        *,
        raw: bool = False,
    ) -> Fetched:
        """Read `topic`'s `partition` from `offset` with no subscription (FETCH; a reliable
        topic's): whole batches up to `max_bytes` (at least one), only below the partition's
        last stable offset, without transaction markers nor aborted transactions' records
        (`raw`: every batch below the readable end, markers and aborted ones included). At the
        end, waits up to `max_wait` seconds (at most 20) for data. Raises
        `OffsetOutOfRange` below the partition's start or past its next offset,
        `NotSupported` on a non-reliable topic. In a cluster it goes to the partition's owner."""
        isolation = m.FetchIsolation.RAW if raw else m.FetchIsolation.COMMITTED
        request = m.FetchRequest(
            topic, partition, offset, max_bytes, round(max_wait * 1000), isolation
        )
        timeout = self._timeout + max_wait + 30.0
        await self._router.settle(topic)
        response = await self._at_owner(request, timeout)
        assert isinstance(response, m.FetchResponse)
        return Fetched(
            topic,
            partition,
            offset,
            response.start_offset,
            response.end_offset,
            response.records,
            response.next_offset,
        )

    async def offset_for_time(self, topic: str, partition: int, timestamp: int) -> int:
        """Where to `fetch` from to read `topic`'s `partition` from `timestamp` (ms since the
        epoch; -2: the partition's start, -1: its readable end): the first offset of the first
        batch whose newest record is at or after it, so a few earlier records may come first,
        or the readable end when no readable record is that recent (OFFSET_FOR_TIME)."""
        request = m.OffsetForTimeRequest(topic, partition, timestamp)
        await self._router.settle(topic)
        response = await self._at_owner(request, self._timeout)
        assert isinstance(response, m.OffsetForTimeResponse)
        return response.offset

    async def _at_owner(
        self, request: m.FetchRequest | m.OffsetForTimeRequest, timeout: float
    ) -> m.Response:
        """A request about one partition, at the partition's owner in a cluster, following
        NOT_OWNER (bounded by the router's backoff)."""
        if not self._router.multi_broker:
            return await self._request(request, timeout)
        router = self._router
        delays = router.backoff.delays()
        while True:  # each round takes a delay of the backoff's, which ends
            owner = await router.route(request.topic, request.partition)
            try:
                return await (await self._peers.get(owner)).request(request, timeout)
            except NotOwner as exc:
                router.not_owner(request.topic, request.partition, exc)
                error: HeadwaterError = exc
            except ConnectionClosed as exc:
                router.lost(owner.address)
                error = exc
            delay = next(delays, None)
            if delay is None:
                raise error
            await asyncio.sleep(delay)

    def producer(
        self,
        topic: str,
        config: ProducerConfig | None = None,
        *,
        schema: SchemaCodec | int | Literal["auto"] | None = None,
        **options: Any,
    ) -> Producer:
        """A producer for `topic` on a connection of its own (so it can reconnect and retry).
        Settings come from `config`, or from `ProducerConfig` fields given as keywords:
        `client.producer("t", delivery=AtMostOnce(), linger=0.005)`. With `schema` ("auto":
        the topic's latest version when the first record is sent; a version number; or a
        `SchemaCodec`) `send` takes values of the schema's type and encodes them.

        With `transactional_id` the producer writes in transactions (`producer.transaction()`,
        docs/PRODUCING.md): the client's producers with the same transactional id share them,
        so one transaction spans their topics."""
        config = config or ProducerConfig(**options)
        session = None
        if config.transactional_id is not None:
            session = self._sessions.get(config.transactional_id)
            if session is None:
                session = TransactionSession(
                    config.transactional_id,
                    config.transaction_timeout,
                    self._coordinators(),
                    config.request_timeout,
                    self._forget_session,
                )
                self._sessions[config.transactional_id] = session
        producer = Producer(
            self._opener.open,
            topic,
            config,
            schema,
            self._router,
            self._opener.open_at,
            session,
        )
        self._producers.append(producer)
        return producer

    async def subscribe(
        self,
        topic: str,
        subscription: str,
        *,
        type: SubscriptionTypeName = "exclusive",
        name: str | None = None,
        priority: int = 0,
        prefetch: int = 1000,
        limit: int | None = None,
        start: StartName | int = "latest",
        start_timestamp: int | None = None,
        ack_timeout: float | None = None,
        max_deliveries: int | None = None,
        backoff: Literal["fixed", "exponential"] = "exponential",
        backoff_initial: float | None = None,
        backoff_max: float | None = None,
        committed_only: bool = False,
        durable: DurableName = "default",
        keys: Iterable[str | bytes] = (),
        key_prefix: str | bytes | None = None,
        on_dropped: Callable[[int], None] | None = None,
        partitions: Iterable[int] = (),
    ) -> Consumer:
        """Attach a consumer. The settings after `prefetch` apply to reliable topics and take
        effect when the subscription is created (its first consumer); None means the server's
        default. `start` is "latest", "earliest", "snapshot" or an offset; `start_timestamp` (ms
        since the epoch) starts at the first message at or after that time instead. "snapshot"
        delivers the topic's newest compaction snapshot first (one current value per live key,
        with its original offset), then the log after the snapshot's horizon; a partition with
        no snapshot starts at earliest (docs/COMPACTION.md). With `limit`, the
        consumer never asks for more than `limit` messages in all (a bounded read leaves nothing
        delivered-and-unacked behind). `committed_only` delivers only records an fsync already
        covers (the consumer side of `Isolation.FSYNCED`).

        `durable` picks what the subscription keeps (FTL's durable types): "standard" (one
        subscriber's stream, until acked), "shared" (apportioned, kept until one acks), "none"
        (live only), "last-value" or "map" (the current value of each of `keys` and of every key
        starting with `key_prefix`, then their updates); "default" is standard or shared on
        reliable topics, by subscription type, and none on non-reliable ones.

        `on_dropped(count)` is called when the server reports that it dropped `count` messages
        this consumer's subscription could not take (non-reliable topics; without a callback the
        client logs a warning). The consumer counts them in `dropped`.

        `partitions` attaches the consumer to those partitions only (default: every one): the
        server sends it nothing else; Failover then spreads each partition over the consumers
        that chose it."""
        sub_type = _SUBSCRIPTION_TYPES.get(type)
        if sub_type is None:
            raise InvalidRequest(
                f"subscription type must be one of {sorted(_SUBSCRIPTION_TYPES)}, not {type!r}"
            )
        if prefetch < 1:
            raise InvalidRequest("prefetch must be at least 1")
        if limit is not None:
            if limit < 1:
                raise InvalidRequest("limit must be at least 1")
            prefetch = min(prefetch, limit)
        connection = await self._ready()
        consumer = Consumer(
            connection,
            topic,
            subscription,
            prefetch,
            limit,
            resumable=self._policy is not None,
            on_dropped=on_dropped,
            on_end=self._consumers.discard,
        )
        settings = m.SubscriptionSettings(
            *start_position(start, start_timestamp),
            ack_timeout_ms=ms(ack_timeout),
            max_deliveries=max_deliveries or 0,
            backoff=m.Backoff.FIXED if backoff == "fixed" else m.Backoff.EXPONENTIAL,
            backoff_initial_ms=ms(backoff_initial),
            backoff_max_ms=ms(backoff_max),
            committed_only=committed_only,
            durable=_durable_kind(durable),
            keys=tuple(k.encode() if isinstance(k, str) else k for k in keys),
            key_prefix=key_prefix.encode() if isinstance(key_prefix, str) else key_prefix,
        )
        consumer._request = m.SubscribeRequest(
            topic=topic,
            subscription=subscription,
            sub_type=sub_type,
            # unique across processes: in a cluster the name is the Exclusive holder's identity
            consumer_name=name or f"{subscription}-{secrets.token_hex(6)}",
            priority=priority,
            initial_credits=prefetch,
            settings=settings,
            partitions=tuple(partitions),
        )
        try:
            response = await connection.request(consumer._request, on_response=consumer._attach)
        except NotOwner:  # a cluster broker serving none of the topic: the owners' legs only
            if not await self._subscribe_cluster(consumer, refused=True):
                raise
            return consumer
        assert isinstance(response, m.SubscribeResponse)
        if self._policy is not None:
            self._consumers.add(consumer)
        await self._subscribe_cluster(consumer)
        return consumer

    async def end_transaction(self, handle: TransactionHandle, *, commit: bool) -> None:
        """Commit (or abort) a transaction another client began and handed off
        (`producer.transaction(hand_off=True)`), by its handle. Ending it again is done; raises
        `ProducerFenced` if a newer instance of its transactional id started, or its timeout
        aborted it (nothing of it is then committed)."""
        await end_transaction(handle, commit, self._coordinators(), self._timeout)

    def _coordinators(self) -> Brokers:
        """Where a transaction's requests go: the bootstrap broker, and in a cluster, when it
        is lost, the other brokers the routing table knows (any serves any transactional
        id)."""

        def others() -> list[tuple[str, int]]:
            bootstrap = (self._host, self._port)
            known = self._router.table.brokers.values()
            return sorted({b.address for b in known if b.address != bootstrap})

        return Brokers(self._opener.open, self._opener.open_at, others)

    def _forget_session(self, session: TransactionSession) -> None:
        if self._sessions.get(session.transactional_id) is session:
            del self._sessions[session.transactional_id]

    def map(self, topic: str) -> Map:
        """The key/value API of a map durable on `topic` (a reliable topic)."""
        return Map(self, topic, self._router)


DurableName = Literal["default", "none", "standard", "shared", "last-value", "map"]


def _durable_kind(name: str) -> int:
    try:
        return m.Durable[name.upper().replace("-", "_")]
    except KeyError:
        raise InvalidRequest(
            f"durable must be one of default, none, standard, shared, last-value, map; not {name!r}"
        ) from None
