"""The producer: batching, delivery semantics, retries, idempotence, isolation, compression.

Built, as aiokafka's, from an accumulator (headwater/client/accumulator.py: records into batches,
backpressure) and a sender (headwater/client/sender.py: one task writing batches, retries), on
connections from a factory (`Client.producer` passes its opener), so it needs nothing else of the
client. This module is the application's side: `send`, partitioning, `flush`, `confirm`, `close`.

`send` appends a record to its partition's open batch and returns a `SendFuture` at once
(`send_batch` appends many, encoded in one loop per batch, with one `BatchSendFuture`); it waits
only while `max_queued_batches` batches are already waiting to be sent or answered
(backpressure: memory stays bounded). A batch closes when it reaches `batch_size` bytes, or after
`linger` seconds (0: at the end of the current event-loop turn, so records sent together travel
together), or when `flush()` is called; it never grows past `max_request_size`.

One sender task writes closed batches in order on the producer's own connection, with up to
`max_in_flight` unanswered:

- `AtMostOnce()`: frames go out with NO_RESPONSE; each record's future resolves when its batch is
  written to the socket, with `offset=None`. A failure is reported on the future and never
  retried; the producer never waits for the server. A refusal the server sends back (an unknown
  topic, say) is raised by the next `flush()`; `confirm()` waits one round trip for such
  refusals, which is what `headwater produce --delivery at-most-once` does before it reports
  success. `AtMostOnce(wait_for_offsets=True)` asks for
  responses (futures then carry offsets) but still never retries.
- `AtLeastOnce(RetryPolicy)`: a batch is done when the server acknowledges it. A retriable error
  (the connection failing, a timeout, the server shutting down or its storage failing) puts every
  unanswered batch back, in order, and they are sent again on a new connection after the policy's
  next delay, until `max_retries` or the policy's total `timeout` runs out. A non-retriable error
  fails that batch's futures at once.

With `idempotent=True` the producer takes a producer id from the server and numbers its records
per partition (RecordBatch's producer id and base sequence). A resent batch that the server had
already appended is answered with its original offsets instead of being stored twice, so retries
cannot duplicate. `isolation=Isolation.FSYNCED` asks reliable topics to acknowledge only once an
fsync covers the batch.

With `transactional_id` the producer writes in transactions (headwater/client/transaction.py):
`async with producer.transaction():` around its sends (and those of the client's other producers
with the same transactional id), `send_acks` to acknowledge a subscription's messages in it; all
of it is committed at a normal exit, or aborted.

In a cluster (docs/CLUSTER.md) the client's router sends each batch to its partition's owner
(headwater/client/sender.py), and keyless records are spread round-robin by the producer itself (the
server can only place a record on a partition it owns); `flush`, `confirm` and `close` cover the
connection to every broker.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Literal

from headwater.client.accumulator import (
    BATCH_OVERHEAD,
    RECORD_OVERHEAD,
    BatchSendFuture,
    ProducerBatch,
    RecordAccumulator,
    SendFuture,
    SentBatch,
)
from headwater.client.broker_connection import Connection
from headwater.client.message_batch import Message, MessageBatch
from headwater.client.producer_config import (
    AtLeastOnce,
    AtMostOnce,
    DeliverySemantic,
    Isolation,
    ProducerConfig,
    RecordMetadata,
    RetryPolicy,
    RetryStrategy,
)
from headwater.client.schema_codec import SchemaCodec
from headwater.client.sender import AddressedFactory, ConnectionFactory, Sender
from headwater.client.transaction import TransactionHandle, TransactionSession
from headwater.wire import messages as m
from headwater.wire.errors import ConnectionClosed, InvalidRequest, RecordTooLarge
from headwater.wire.keys import partition_for_key

if TYPE_CHECKING:
    from headwater.client.consumer import Consumer
    from headwater.client.router import Router

HeaderList = list[tuple[str, bytes | None]]


class Producer:
    def __init__(
        self,
        connect: ConnectionFactory,
        topic: str,
        config: ProducerConfig,
        schema: SchemaCodec | int | Literal["auto"] | None = None,
        router: Router | None = None,
        connect_to: AddressedFactory | None = None,
        session: TransactionSession | None = None,
    ) -> None:
        """`session`: the transactions of the producer's transactional id, which the client's
        producers with that id share (`Client.producer` finds or makes it)."""
        self.topic = topic
        self._router = router
        self.config = config
        self._schema = schema  # what to encode values by; "auto"/a number until fetched
        loop = asyncio.get_running_loop()
        self._accumulator = RecordAccumulator(loop, topic, config, self._ready)
        self._sender = Sender(loop, topic, config, self._accumulator, connect, router, connect_to)
        self._partitions: int | None = None
        self._partitions_at = 0.0  # when `_partitions` was learned (time.monotonic())
        self._next_partition = 0
        self._closed = False
        self._loop = loop
        # A keyless record of a producer that is not idempotent goes to partition -1 (the server
        # picks) unless the routes say otherwise: `_partition_for` says until when (loop time)
        # that holds, for the routing table's version of then, so `send` need not ask it again
        # for every record.
        self._unrouted_until = -math.inf
        self._unrouted_version = 0
        self._session = session
        if session is not None:
            session.join(self)

    def _ready(self) -> None:
        self._sender.wake()

    @property
    def _connection(self) -> Connection | None:
        """The connection the producer sends on (None before its first send)."""
        return self._sender.connection

    # Sending records

    async def send(
        self,
        value: bytes | Any | None,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> SendFuture:
        """Queue one record; waits only while the producer's queue is full. With a schema,
        `value` is of its type (str, int, a JSON value, a dict for Avro) and is encoded here."""
        # The common case (no headers, no schema, keyless) is this method's straight line: it is
        # every record's cost when an application sends one at a time.
        if self._closed:
            raise ConnectionClosed("producer is closed")
        header_list: list[tuple[str, bytes]] = list(headers.items()) if headers else []
        if self._schema is not None:
            codec = await self.schema()
            value = codec.encode(value)
            if codec.header is not None:
                header_list.append(codec.header)
        accumulator = self._accumulator
        room = accumulator.room
        while not room.is_set():
            await room.wait()
        size = RECORD_OVERHEAD + (len(key) if key else 0) + (len(value) if value else 0)
        if header_list:
            size += sum(len(k) + len(v or b"") for k, v in header_list)
        config = self.config
        if size + BATCH_OVERHEAD > config.max_request_size:
            raise RecordTooLarge(
                f"record of about {size} bytes exceeds max_request_size {config.max_request_size}"
            )
        if config.idempotent and accumulator.producer_id < 0:
            await self._init_producer_id()
        if partition is None:
            router = self._router
            if (
                key is None
                and self._loop.time() < self._unrouted_until
                and (router is None or router.table.version == self._unrouted_version)
            ):
                partition = -1
            else:
                partition = await self._partition_for(key)
        if self._session is not None:
            await self._session.admit(self.topic, partition)
        if self._closed:  # closed while this send waited: a close's flush is past it
            raise ConnectionClosed("producer is closed")
        return accumulator.append(partition, key, value, header_list, size)

    async def send_batch(
        self,
        values: Sequence[bytes | Any | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[Mapping[str, bytes] | None] | None = None,
        partition: int | None = None,
    ) -> BatchSendFuture:
        """Queue many records in one call: as `send` for each value in order (same batching,
        delivery semantic, retries and backpressure), with the records encoded by the C codec
        in one loop per produce batch and one future for the call. `keys` and `headers`, when
        given, hold one entry per value. Without keys (and without `partition`) every record of
        the call goes to one partition: the server's choice, or the next partition in turn for
        an idempotent producer. With a schema, values are of its type, as for `send`. Raises
        RecordTooLarge, before queuing anything, if a record would exceed max_request_size."""
        if self._closed:
            raise ConnectionClosed("producer is closed")
        count = len(values)
        if (keys is not None and len(keys) != count) or (
            headers is not None and len(headers) != count
        ):
            raise ValueError("send_batch: keys and headers need one entry per value")
        header_lists: list[HeaderList] | None = (
            None if headers is None else [list(h.items()) if h else [] for h in headers]
        )
        if self._schema is not None:  # values of the schema's type, encoded and versioned here
            codec = await self.schema()
            values = [codec.encode(value) for value in values]
            if codec.header is not None:
                header_lists = [[*h, codec.header] for h in header_lists or ([],) * count]
        self._check_sizes(values, keys, header_lists)
        if self.config.idempotent and self._accumulator.producer_id < 0:
            await self._init_producer_id()
        if partition is not None or keys is None:
            if partition is None:
                partition = await self._partition_for(None)
            if self._session is not None:
                await self._session.admit(self.topic, partition)
            segments = await self._extend(partition, values, keys, header_lists)
            return BatchSendFuture(self.topic, segments)
        # Keyed: each partition's share, in the order given (order holds within a partition).
        shares: dict[int, list[int]] = {}
        for index, key in enumerate(keys):
            shares.setdefault(await self._partition_for(key), []).append(index)
        if self._session is not None:
            for target in shares:
                await self._session.admit(self.topic, target)
        segments = []
        for target, indexes in shares.items():
            segments += await self._extend(
                target,
                [values[i] for i in indexes],
                [keys[i] for i in indexes],
                None if header_lists is None else [header_lists[i] for i in indexes],
            )
        # the metadata answers in the order given, not partition by partition
        placed = [0] * count
        queued = (i for indexes in shares.values() for i in indexes)
        for position, index in enumerate(queued):
            placed[index] = position
        return BatchSendFuture(self.topic, segments, placed)

    def _check_sizes(
        self,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: list[HeaderList] | None,
    ) -> None:
        sizes = [len(v) if v is not None else 0 for v in values]
        if keys is not None:
            sizes = [s + (len(k) if k is not None else 0) for s, k in zip(sizes, keys, strict=True)]
        if headers is not None:
            sizes = [
                s + sum(len(k) + len(v or b"") for k, v in h)
                for s, h in zip(sizes, headers, strict=True)
            ]
        largest = max(sizes, default=0) + RECORD_OVERHEAD
        if largest + BATCH_OVERHEAD > self.config.max_request_size:
            raise RecordTooLarge(
                f"record of about {largest} bytes exceeds max_request_size "
                f"{self.config.max_request_size}"
            )

    async def _extend(
        self,
        partition: int,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: list[HeaderList] | None,
    ) -> list[tuple[ProducerBatch, int, int]]:
        accumulator = self._accumulator
        segments = []
        start = 0
        while start < len(values):
            while not accumulator.room.is_set():
                await accumulator.room.wait()
            if self._closed:
                raise ConnectionClosed("producer is closed")
            batch, first, stop = accumulator.extend(partition, values, keys, headers, start)
            segments.append((batch, first, stop - start))
            start = stop
        return segments

    async def _partition_for(self, key: bytes | None) -> int:
        router = self._router
        if router is not None and not router.fresh(self.topic):
            await router.settle(self.topic)
        spread = router is not None and router.multi_broker
        if key is None and not self.config.idempotent and not spread:
            # the server spreads keyless batches round-robin; so it stays while the routes do
            if router is None:
                self._unrouted_until = math.inf
            else:
                self._unrouted_until = router.table.fresh_until(self.topic)
                self._unrouted_version = router.table.version
            return -1
        now = time.monotonic()
        sender = self._sender
        routed = router.table.partitions(self.topic) if router is not None and spread else None
        if routed:  # a cluster: the count LOOKUP gave, fresh as the routes are
            self._partitions, self._partitions_at = routed, now
        elif (
            self._partitions is None
            or sender.metadata_stale
            or now - self._partitions_at > self.config.metadata_max_age
        ):
            sender.metadata_stale = False
            response = await (await sender.open()).request(m.DescribeTopicRequest(self.topic))
            assert isinstance(response, m.DescribeTopicResponse)
            self._partitions = response.topic.partitions
            self._partitions_at = now
        if key is None:
            self._next_partition = (self._next_partition + 1) % self._partitions
            return self._next_partition
        return partition_for_key(key, self._partitions)

    async def schema(self) -> SchemaCodec:
        """The codec values are encoded by (fetched on the first call for "auto" or a number)."""
        if not isinstance(self._schema, SchemaCodec):
            wanted = m.LATEST_SCHEMA if self._schema in ("auto", None) else int(self._schema)
            request = m.GetSchemaRequest(self.topic, wanted)
            response = await (await self._sender.open()).request(request)
            assert isinstance(response, m.GetSchemaResponse)
            self._schema = SchemaCodec(response.schema)
        return self._schema

    async def _init_producer_id(self) -> None:
        """Idempotent producers get their id before building their first batch (a transactional
        one from its session, `restart`)."""
        if self._session is not None:
            await self._session.ready()
            return
        response = await (await self._sender.open()).request(m.InitProducerIdRequest())
        assert isinstance(response, m.InitProducerIdResponse)
        self._accumulator.producer_id = response.producer_id

    def restart(self, producer_id: int, epoch: int) -> None:
        """The session's producer id and epoch, new or bumped: the next batches carry them."""
        self._accumulator.restart(producer_id, epoch)

    # Transactions

    async def init_transactions(self) -> None:
        """Wait until the transactional producer holds its producer id and epoch (Kafka's
        `init_transactions`; it starts on its own when the producer is made). Once it returns,
        whatever an earlier instance of the transactional id left is settled: a commit it had
        decided is complete (its acknowledgements applied), a transaction it left open aborted.
        A consume-transform-produce application awaits it before it subscribes: subscribed
        first, it could be delivered messages whose acknowledgements a decided commit of its
        predecessor was still applying, and process them twice."""
        await self._transactional().ready()

    def transaction(
        self, *, hand_off: bool = False
    ) -> AbstractAsyncContextManager[TransactionHandle]:
        """`async with producer.transaction():` a transaction around what the block sends (with
        every producer of this client with the same transactional id) and the acks it adds
        (`send_acks`): committed once everything sent is acknowledged, when the block ends
        normally; aborted if it raises, or if a send failed (whose error is raised then).
        Raises `ProducerFenced` once a newer producer took the transactional id (or this
        transaction outlived `transaction_timeout`): the producer is unusable from then on.

        With `hand_off`, a normal end flushes and leaves the transaction open: the block's
        value, a `TransactionHandle`, is what `Client.end_transaction` ends it with, from any
        client (before `transaction_timeout`); this producer's session takes no other."""
        return self._transactional().transaction(hand_off)

    async def send_acks(
        self, consumer: Consumer, messages: Iterable[Message | MessageBatch]
    ) -> None:
        """Acknowledge `messages`, received from `consumer` (a reliable subscription's), in the
        transaction in progress: they are acknowledged if it commits; if it aborts they stay
        unacknowledged, and are delivered again once their ack timeout passes (or nack them).
        Do not also ack them through the consumer. Kafka's `send_offsets_to_transaction`."""
        offsets: list[tuple[int, int]] = []
        for message in messages:
            if isinstance(message, MessageBatch):
                offsets.extend((message.partition, o) for o in message.offsets())
            else:
                offsets.append((message.partition, message.offset))
        await self._transactional().send_acks(consumer.topic, consumer.subscription, offsets)

    async def send_positions(
        self, topic: str, subscription: str, positions: Mapping[int, int]
    ) -> None:
        """Move `subscription`'s cursor on `topic` to `positions` (partition -> the offset below
        which everything is acknowledged, a Kafka group's committed offset) if the transaction
        in progress commits: for a reader that keeps its place in a subscription, reading with
        `fetch` rather than consuming."""
        await self._transactional().send_acks(topic, subscription, (), positions)

    def _transactional(self) -> TransactionSession:
        if self._session is None:
            raise InvalidRequest(
                f"the producer of {self.topic!r} has no transactional id (give the producer "
                "`transactional_id=`)"
            )
        return self._session

    # Flushing and closing

    async def flush(self) -> None:
        """Send everything queued, wait until every send made before this call is resolved
        (sends other tasks make meanwhile are not waited for, as in Kafka), raise the first
        error since the last flush."""
        accumulator = self._accumulator
        accumulator.close_all()
        if accumulator.unresolved:
            await asyncio.wait(list(accumulator.unresolved))
        error = self._sender.take_error()
        if error is not None:
            raise error

    async def confirm(self, timeout: float = 2.0) -> None:
        """`flush()`, then wait (at most `timeout` s) until the server has handled every frame
        sent so far, and raise the first error it reported. For at-most-once producers, whose
        frames get no answer unless refused: one round trip on the producer's connection, which
        the server answers after every request sent before it. A refusal that only comes later
        (a reliable topic's fsync failing after the append) is not waited for."""
        await self.flush()
        connections = self._sender.connections()
        if connections:
            await asyncio.gather(
                *(c.request(m.ApiVersionsRequest(), timeout=timeout) for c in connections)
            )
        error = self._sender.take_error()
        if error is not None:
            raise error

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True  # sends are refused from here: what the flush waits for is bounded
        try:
            await self.flush()
        finally:
            await self._sender.close()
            if self._session is not None:
                await self._session.leave(self)

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


__all__ = [
    "AtLeastOnce",
    "AtMostOnce",
    "BatchSendFuture",
    "DeliverySemantic",
    "Isolation",
    "Producer",
    "ProducerConfig",
    "RecordMetadata",
    "RetryPolicy",
    "RetryStrategy",
    "SendFuture",
    "SentBatch",
]
