"""The asyncio client: topic admin, producers and consumers over one connection.

    client = await headwater.connect("127.0.0.1:6650")
    await client.create_topic("events", partitions=2)
    producer = client.producer("events")
    future = await producer.send(b"hello", key=b"k")   # waits for queue room only
    meta = await future                                 # RecordMetadata with the offset
    consumer = await client.subscribe("events", "audit", type="shared")
    async for message in consumer:
        await message.ack()

The producer batches: records sent in the same event-loop turn (or up to `batch_size` bytes) for
the same partition travel as one RecordBatch, and each record's future resolves with the batch's
base offset plus its position. A consumer grants the server `prefetch` credits when it subscribes
and tops them up as the application takes messages, so at most `prefetch` messages wait in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from headwater.connection import Connection, parse_server
from headwater.maps import Map
from headwater.producer import Producer, ProducerConfig
from wire import messages as m
from wire.errors import ConnectionClosed, HeadwaterError, InvalidRequest
from wire.limits import MAX_ACKS_PER_REQUEST
from wire.records import decode_records

SubscriptionTypeName = Literal["exclusive", "shared", "failover"]
DispatchName = Literal["non-reliable", "reliable"]

_SUBSCRIPTION_TYPES: dict[str, m.SubscriptionType] = {
    "exclusive": m.SubscriptionType.EXCLUSIVE,
    "shared": m.SubscriptionType.SHARED,
    "failover": m.SubscriptionType.FAILOVER,
}
_DISPATCH_MODES: dict[str, m.DispatchMode] = {
    "non-reliable": m.DispatchMode.NON_RELIABLE,
    "reliable": m.DispatchMode.RELIABLE,
}
DISPATCH_NAMES: dict[int, str] = {mode: name for name, mode in _DISPATCH_MODES.items()}
SUBSCRIPTION_TYPE_NAMES: dict[int, str] = {kind: name for name, kind in _SUBSCRIPTION_TYPES.items()}


@dataclass(slots=True)
class Message:
    """A received record. Not frozen, unlike the wire messages: a frozen dataclass sets each field
    through object.__setattr__, which made building messages the consumer's largest cost. The
    consumer comes first so a positional `partial` can build messages (kwargs cost 15% more)."""

    _consumer: Consumer | None = field(repr=False, compare=False)
    topic: str
    partition: int
    delivery_count: int  # 1 the first time; counts redeliveries on reliable topics
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]

    async def ack(self) -> None:
        if self._consumer is not None:
            await self._consumer.ack(self)

    async def nack(self, delay: float | None = None) -> None:
        """Hand the message back for redelivery after `delay` s (default: the backoff)."""
        if self._consumer is not None:
            await self._consumer.nack(self, delay)


async def connect(server: str = "127.0.0.1:6650", *, timeout: float = 10.0) -> Client:
    host, port = parse_server(server)
    return Client(await Connection.open(host, port, timeout), host, port, timeout)


class Client:
    def __init__(self, connection: Connection, host: str, port: int, timeout: float) -> None:
        self._connection = connection
        self._host = host
        self._port = port
        self._timeout = timeout
        self._producers: list[Producer] = []

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Flush and close this client's producers, then the connection. Send errors not yet
        collected by `flush()` are not raised here: they were reported on the send futures."""
        for producer in self._producers:
            with contextlib.suppress(HeadwaterError):
                await producer.close()
        await self._connection.close()

    # Admin

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        dispatch: DispatchName = "non-reliable",
        configs: Mapping[str, str | int] | None = None,
    ) -> None:
        """Create a topic; `configs` are reliable-topic settings such as {"fsync": "interval"}."""
        mode = _DISPATCH_MODES.get(dispatch)
        if mode is None:
            raise InvalidRequest(
                f"dispatch must be one of {sorted(_DISPATCH_MODES)}, not {dispatch!r}"
            )
        entries = tuple(m.ConfigEntry(k, str(v)) for k, v in (configs or {}).items())
        await self._connection.request(m.CreateTopicRequest(name, partitions, mode, entries))

    async def delete_topic(self, name: str) -> None:
        await self._connection.request(m.DeleteTopicRequest(name))

    async def list_topics(self) -> list[m.TopicInfo]:
        response = await self._connection.request(m.ListTopicsRequest())
        assert isinstance(response, m.ListTopicsResponse)
        return list(response.topics)

    async def describe_topic(self, name: str) -> m.DescribeTopicResponse:
        response = await self._connection.request(m.DescribeTopicRequest(name))
        assert isinstance(response, m.DescribeTopicResponse)
        return response

    async def api_versions(self) -> dict[int, tuple[int, int]]:
        response = await self._connection.request(m.ApiVersionsRequest())
        assert isinstance(response, m.ApiVersionsResponse)
        return {a.api_key: (a.min_version, a.max_version) for a in response.apis}

    # Messages

    def producer(
        self, topic: str, config: ProducerConfig | None = None, **options: Any
    ) -> Producer:
        """A producer for `topic` on a connection of its own (so it can reconnect and retry).
        Settings come from `config`, or from `ProducerConfig` fields given as keywords:
        `client.producer("t", delivery=AtMostOnce(), linger=0.005)`."""
        producer = Producer(self, topic, config or ProducerConfig(**options))
        self._producers.append(producer)
        return producer

    async def _open_connection(self) -> Connection:
        return await Connection.open(self._host, self._port, self._timeout)

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
        start: Literal["latest", "earliest"] | int = "latest",
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
    ) -> Consumer:
        """Attach a consumer. The settings after `prefetch` apply to reliable topics and take
        effect when the subscription is created (its first consumer); None means the server's
        default. `start` is "latest", "earliest" or an offset; `start_timestamp` (ms since the
        epoch) starts at the first message at or after that time instead. With `limit`, the
        consumer never asks for more than `limit` messages in all (a bounded read leaves nothing
        delivered-and-unacked behind). `committed_only` delivers only records an fsync already
        covers (the consumer side of read_committed).

        `durable` picks what the subscription keeps (FTL's durable types): "standard" (one
        subscriber's stream, until acked), "shared" (apportioned, kept until one acks), "none"
        (live only), "last-value" or "map" (the current value of each of `keys` and of every key
        starting with `key_prefix`, then their updates); "default" is standard or shared on
        reliable topics, by subscription type, and none on non-reliable ones."""
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
        consumer = Consumer(self._connection, topic, subscription, prefetch, limit)
        settings = m.SubscriptionSettings(
            *_start_position(start, start_timestamp),
            ack_timeout_ms=_ms(ack_timeout),
            max_deliveries=max_deliveries or 0,
            backoff=m.Backoff.FIXED if backoff == "fixed" else m.Backoff.EXPONENTIAL,
            backoff_initial_ms=_ms(backoff_initial),
            backoff_max_ms=_ms(backoff_max),
            committed_only=committed_only,
            durable=_durable_kind(durable),
            keys=tuple(k.encode() if isinstance(k, str) else k for k in keys),
            key_prefix=key_prefix.encode() if isinstance(key_prefix, str) else key_prefix,
        )
        response = await self._connection.request(
            m.SubscribeRequest(
                topic=topic,
                subscription=subscription,
                sub_type=sub_type,
                consumer_name=name or f"{subscription}-{id(consumer):x}",
                priority=priority,
                initial_credits=prefetch,
                settings=settings,
            ),
            on_response=consumer._attach,
        )
        assert isinstance(response, m.SubscribeResponse)
        return consumer

    def map(self, topic: str) -> Map:
        """The key/value API of a map durable on `topic` (a reliable topic)."""
        return Map(self._connection, topic)

    async def seek(
        self,
        topic: str,
        subscription: str,
        start: Literal["latest", "earliest"] | int = "earliest",
        start_timestamp: int | None = None,
    ) -> None:
        """Move a reliable subscription; its unacknowledged messages are forgotten."""
        position, value = _start_position(start, start_timestamp)
        await self._connection.request(m.SeekRequest(topic, subscription, position, value))

    async def delete_subscription(self, topic: str, subscription: str) -> None:
        await self._connection.request(m.DeleteSubscriptionRequest(topic, subscription))


DurableName = Literal["default", "none", "standard", "shared", "last-value", "map"]


def _durable_kind(name: str) -> int:
    try:
        return m.Durable[name.upper().replace("-", "_")]
    except KeyError:
        raise InvalidRequest(
            f"durable must be one of default, none, standard, shared, last-value, map; not {name!r}"
        ) from None


def _ms(seconds: float | None) -> int:
    if seconds is None:
        return 0
    if seconds < 0:
        raise InvalidRequest("durations must be >= 0")
    return max(1, round(seconds * 1000))


def _start_position(
    start: Literal["latest", "earliest"] | int, timestamp: int | None
) -> tuple[int, int]:
    if timestamp is not None:
        return m.StartPosition.TIMESTAMP, timestamp
    if start == "latest":
        return m.StartPosition.LATEST, 0
    if start == "earliest":
        return m.StartPosition.EARLIEST, 0
    if isinstance(start, int) and start >= 0:
        return m.StartPosition.OFFSET, start
    raise InvalidRequest(f"start must be 'latest', 'earliest' or an offset >= 0, not {start!r}")


class Consumer:
    """An async iterator of `Message`s for one subscription."""

    def __init__(
        self,
        connection: Connection,
        topic: str,
        subscription: str,
        prefetch: int,
        limit: int | None = None,
    ) -> None:
        self._connection = connection
        self.topic = topic
        self.subscription = subscription
        self.consumer_id = -1
        self._prefetch = prefetch
        self._messages: deque[Message] = deque()
        self._taken_since_grant = 0
        # credit still to grant after the initial prefetch, when the consumer has a limit
        self._grantable = None if limit is None else limit - prefetch
        self._waiter: asyncio.Future[None] | None = None
        self._error: HeadwaterError | None = None
        self._pending_acks: list[m.AckEntry] = []
        self._ack_flush_scheduled = False

    def _attach(self, response: m.Response) -> None:
        assert isinstance(response, m.SubscribeResponse)
        self.consumer_id = response.consumer_id
        self._connection.consumers[response.consumer_id] = self

    def on_delivery(self, delivery: m.Delivery) -> None:
        build = partial(Message, self, self.topic, delivery.partition, delivery.delivery_count)
        try:
            self._messages.extend(decode_records(delivery.batch, build))
        except HeadwaterError as exc:
            self.on_closed(exc)
            return
        self._wake()

    def on_closed(self, error: HeadwaterError) -> None:
        self._error = error
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.receive()
        except ConnectionClosed:
            raise StopAsyncIteration from None

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message; raises the closing error, or TimeoutError after `timeout` seconds."""
        if not self._messages:
            await self._wait(timeout)
        message = self._messages.popleft()
        self._taken(1)
        return message

    async def receive_batch(
        self, max_messages: int = 1000, timeout: float | None = None
    ) -> list[Message]:
        """Whatever is buffered, up to `max_messages` (waiting for at least one): one await for
        many messages, for consumers that need the throughput."""
        if not self._messages:
            await self._wait(timeout)
        messages = self._messages
        count = min(max_messages, len(messages))
        taken = [messages.popleft() for _ in range(count)]
        self._taken(count)
        return taken

    async def _wait(self, timeout: float | None) -> None:
        while not self._messages:
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self._waiter, timeout)
            finally:
                self._waiter = None

    def _taken(self, count: int) -> None:
        self._taken_since_grant += count
        if self._taken_since_grant * 2 >= self._prefetch and self._error is None:
            # Top credit back up in halves, as Pulsar's receiver queue does: one FLOW per
            # prefetch/2 messages rather than one per message.
            grant = self._taken_since_grant
            if self._grantable is not None:
                grant = min(grant, self._grantable)
                self._grantable -= grant
            self._taken_since_grant = 0
            if grant > 0:
                self._connection.send_nowait(m.FlowRequest(self.consumer_id, grant))

    async def ack(self, message: Message) -> None:
        """Acknowledge one message. Acks made in one event-loop turn travel in one request."""
        self._pending_acks.append(m.AckEntry(message.partition, message.offset))
        if not self._ack_flush_scheduled:
            self._ack_flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_acks)
            self._connection.before_request.append(self._flush_acks)

    async def ack_cumulative(self, message: Message) -> None:
        """Acknowledge the message and every earlier one of its partition (not on Shared)."""
        self._flush_acks()
        if self._error is None:
            self._connection.send_nowait(
                m.AckRequest(
                    self.consumer_id,
                    (m.AckEntry(message.partition, message.offset),),
                    m.AckKind.CUMULATIVE,
                )
            )

    async def nack(self, message: Message, delay: float | None = None) -> None:
        if self._error is None:
            self._connection.send_nowait(
                m.NackRequest(
                    self.consumer_id,
                    (m.AckEntry(message.partition, message.offset),),
                    _ms(delay),
                )
            )

    def _flush_acks(self) -> None:
        if not self._ack_flush_scheduled:
            return
        self._ack_flush_scheduled = False
        with contextlib.suppress(ValueError):
            self._connection.before_request.remove(self._flush_acks)
        pending, self._pending_acks = self._pending_acks, []
        if self._error is not None:
            return
        for start in range(0, len(pending), MAX_ACKS_PER_REQUEST):
            self._connection.send_nowait(
                m.AckRequest(self.consumer_id, tuple(pending[start : start + MAX_ACKS_PER_REQUEST]))
            )

    async def close(self) -> None:
        self._flush_acks()
        if self._error is None and not self._connection.closed:
            self._connection.consumers.pop(self.consumer_id, None)
            await self._connection.request(m.UnsubscribeRequest(self.consumer_id))
        self._error = self._error or ConnectionClosed("consumer closed")
        self._wake()

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()
