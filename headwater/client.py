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
import time
import zlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from headwater.connection import Connection, parse_server
from wire import messages as m
from wire.errors import ConnectionClosed, HeadwaterError, InvalidRequest
from wire.records import BatchBuilder, read_records

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


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class Message:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    _consumer: Consumer | None = field(default=None, repr=False, compare=False)

    async def ack(self) -> None:
        if self._consumer is not None:
            await self._consumer.ack(self)


async def connect(server: str = "127.0.0.1:6650", *, timeout: float = 10.0) -> Client:
    host, port = parse_server(server)
    return Client(await Connection.open(host, port, timeout))


class Client:
    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._connection.close()

    # Admin

    async def create_topic(
        self, name: str, partitions: int = 1, dispatch: DispatchName = "non-reliable"
    ) -> None:
        mode = _DISPATCH_MODES.get(dispatch)
        if mode is None:
            raise InvalidRequest(
                f"dispatch must be one of {sorted(_DISPATCH_MODES)}, not {dispatch!r}"
            )
        await self._connection.request(m.CreateTopicRequest(name, partitions, mode))

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

    def producer(self, topic: str, *, batch_size: int = 256 * 1024) -> Producer:
        return Producer(self._connection, self, topic, batch_size)

    async def subscribe(
        self,
        topic: str,
        subscription: str,
        *,
        type: SubscriptionTypeName = "exclusive",
        name: str | None = None,
        priority: int = 0,
        prefetch: int = 1000,
    ) -> Consumer:
        sub_type = _SUBSCRIPTION_TYPES.get(type)
        if sub_type is None:
            raise InvalidRequest(
                f"subscription type must be one of {sorted(_SUBSCRIPTION_TYPES)}, not {type!r}"
            )
        if prefetch < 1:
            raise InvalidRequest("prefetch must be at least 1")
        consumer = Consumer(self._connection, topic, subscription, prefetch)
        response = await self._connection.request(
            m.SubscribeRequest(
                topic=topic,
                subscription=subscription,
                sub_type=sub_type,
                consumer_name=name or f"{subscription}-{id(consumer):x}",
                priority=priority,
                initial_credits=prefetch,
            )
        )
        assert isinstance(response, m.SubscribeResponse)
        consumer._attach(response.consumer_id)
        return consumer


class Producer:
    """Batches records per partition; `send` returns a future per record."""

    def __init__(self, connection: Connection, client: Client, topic: str, batch_size: int) -> None:
        self._connection = connection
        self._client = client
        self.topic = topic
        self._batch_size = batch_size
        self._partitions: int | None = None
        self._open: dict[
            int, tuple[BatchBuilder, list[asyncio.Future[RecordMetadata]], list[int]]
        ] = {}
        self._flush_scheduled = False
        self._in_flight: set[asyncio.Future[m.Response]] = set()

    async def send(
        self,
        value: bytes | None,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue one record; returns a future resolving to its metadata once the server has it."""
        await self._connection.drain()
        if partition is None:
            partition = await self._partition_for(key)
        entry = self._open.get(partition)
        if entry is None:
            entry = (BatchBuilder(), [], [])
            self._open[partition] = entry
        builder, futures, timestamps = entry
        timestamp = _now_ms()
        builder.append(key, value, list(headers.items()) if headers else (), timestamp)
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        futures.append(future)
        timestamps.append(timestamp)
        if builder.size() >= self._batch_size:
            self._send_batch(partition)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._send_open_batches)
        return future

    async def _partition_for(self, key: bytes | None) -> int:
        if key is None:
            return -1  # the server spreads keyless batches round-robin
        if self._partitions is None:
            self._partitions = (await self._client.describe_topic(self.topic)).topic.partitions
        return zlib.crc32(key) % self._partitions

    def _send_open_batches(self) -> None:
        self._flush_scheduled = False
        for partition in list(self._open):
            self._send_batch(partition)

    def _send_batch(self, partition: int) -> None:
        builder, futures, timestamps = self._open.pop(partition)
        try:
            response = self._connection.produce(
                m.ProduceRequest(self.topic, partition, builder.build())
            )
        except HeadwaterError as exc:
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
            return
        assert response is not None
        self._in_flight.add(response)
        response.add_done_callback(lambda done: self._resolve(done, futures, timestamps))

    def _resolve(
        self,
        done: asyncio.Future[m.Response],
        futures: list[asyncio.Future[RecordMetadata]],
        timestamps: list[int],
    ) -> None:
        self._in_flight.discard(done)
        error = done.exception() if not done.cancelled() else ConnectionClosed("cancelled")
        if error is not None:
            for future in futures:
                if not future.done():
                    future.set_exception(error)
            return
        response = done.result()
        assert isinstance(response, m.ProduceResponse)
        for position, future in enumerate(futures):
            if not future.done():
                future.set_result(
                    RecordMetadata(
                        self.topic,
                        response.partition,
                        response.base_offset + position,
                        timestamps[position],
                    )
                )

    async def flush(self) -> None:
        """Send what is queued and wait until every sent batch is answered."""
        self._send_open_batches()
        if self._in_flight:
            await asyncio.wait(list(self._in_flight))


class Consumer:
    """An async iterator of `Message`s for one subscription."""

    def __init__(
        self, connection: Connection, topic: str, subscription: str, prefetch: int
    ) -> None:
        self._connection = connection
        self.topic = topic
        self.subscription = subscription
        self.consumer_id = -1
        self._prefetch = prefetch
        self._messages: deque[Message] = deque()
        self._taken_since_grant = 0
        self._waiter: asyncio.Future[None] | None = None
        self._error: HeadwaterError | None = None

    def _attach(self, consumer_id: int) -> None:
        self.consumer_id = consumer_id
        self._connection.consumers[consumer_id] = self

    def on_delivery(self, delivery: m.Delivery) -> None:
        try:
            records = read_records(delivery.batch)
        except HeadwaterError as exc:
            self.on_closed(exc)
            return
        topic, partition = self.topic, delivery.partition
        self._messages.extend(
            Message(topic, partition, r.offset, r.timestamp, r.key, r.value, r.headers, self)
            for r in records
        )
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
        while not self._messages:
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self._waiter, timeout)
            finally:
                self._waiter = None
        message = self._messages.popleft()
        self._taken_since_grant += 1
        if self._taken_since_grant * 2 >= self._prefetch and self._error is None:
            # Top credit back up in halves, as Pulsar's receiver queue does: one FLOW per
            # prefetch/2 messages rather than one per message.
            self._connection.send_nowait(m.FlowRequest(self.consumer_id, self._taken_since_grant))
            self._taken_since_grant = 0
        return message

    async def ack(self, message: Message) -> None:
        if self._error is None:
            self._connection.send_nowait(
                m.AckRequest(self.consumer_id, (m.AckEntry(message.partition, message.offset),))
            )

    async def close(self) -> None:
        if self._error is None and not self._connection.closed:
            self._connection.consumers.pop(self.consumer_id, None)
            await self._connection.request(m.UnsubscribeRequest(self.consumer_id))
        self._error = self._error or ConnectionClosed("consumer closed")
        self._wake()

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


def _now_ms() -> int:
    return int(time.time() * 1000)
