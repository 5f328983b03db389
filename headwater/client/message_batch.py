"""`Message` and `MessageBatch`: what a consumer hands out, one record or one delivery's records,
decoded only when the application asks for them.

A consumer's `batches()` (and `next_batch()`) hands out what the server delivered as it came: one
record batch, checked (header and CRC-32C) when it arrived but not decoded. The first access
decodes the whole batch in one C loop (aiokafka's codec); `values()`, `keys()`, `offsets()` and
`timestamps()` then read one field of each decoded record, and only `messages()` (or iterating,
or indexing) builds a `Message` per record: a consumer that wants the values pays no per-record
Python object of ours. A batch that does not decode raises `CorruptBatch` on access and ends its
consumer, as a per-message consumer's does when it reaches it.

Acknowledging: `ack()` acknowledges every record of the batch in one request (as many `ack`s
made in one turn would), `ack_cumulative()` its last record and everything before it in the
partition (not on Shared subscriptions).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

from headwater.client.schema_codec import SchemaCodec, version_of
from headwater.wire.errors import HeadwaterError
from headwater.wire.records import (
    NO_HEADERS,
    BatchInfo,
    Headers,
    RawRecord,
    decode_batch,
    decode_records,
)


class MessageOwner(Protocol):
    """What a message and a batch ask of the consumer that received them (`consumer.Consumer`):
    known only through this, so the consumer imports this module and not the reverse."""

    async def ack(self, message: Message) -> None: ...

    async def ack_cumulative(self, message: Message) -> None: ...

    async def nack(self, message: Message, delay: float | None = None) -> None: ...

    async def codec(self, version: int) -> SchemaCodec: ...

    def on_undecodable(self, error: HeadwaterError) -> None: ...

    async def ack_offsets(self, partition: int, offsets: list[int]) -> None: ...

    async def ack_cumulative_offset(self, partition: int, offset: int) -> None: ...


@dataclass(slots=True)
class Message:
    """A received record. Not frozen, unlike the wire messages: a frozen dataclass sets each field
    through object.__setattr__, which made building messages the consumer's largest cost. The
    consumer comes first so a positional `partial` can build messages (kwargs cost 15% more)."""

    _consumer: MessageOwner | None = field(repr=False, compare=False)
    topic: str
    partition: int
    delivery_count: int  # 1 the first time; counts redeliveries on reliable topics
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers  # a tuple of (name, value); NO_HEADERS (shared) when the record has none
    # messages the server dropped for this consumer (non-reliable topics) just before this one
    missed: int = 0

    async def ack(self) -> None:
        if self._consumer is not None:
            await self._consumer.ack(self)

    async def nack(self, delay: float | None = None) -> None:
        """Hand the message back for redelivery after `delay` s (default: the backoff)."""
        if self._consumer is not None:
            await self._consumer.nack(self, delay)

    @property
    def schema_version(self) -> int | None:
        """The schema version the value was encoded with (its `hw-schema-version` header)."""
        return version_of(self.headers)

    async def decoded(self) -> Any:
        """The value decoded by its schema version (str, int, a JSON value, a dict for Avro;
        bytes without a version), the version fetched once per consumer (docs/SCHEMAS.md)."""
        version = self.schema_version
        if version is None or self._consumer is None:
            return self.value
        return (await self._consumer.codec(version)).decode(self.value)


Build = Callable[[int, int, bytes | None, bytes | None, Headers], Message]


class MessageBatch(Sequence["Message"]):
    __slots__ = (
        "_batch",
        "_build",
        "_consumer",
        "_count",
        "_info",
        "_messages",
        "_records",
        "delivery_count",
        "missed",
        "partition",
        "received_ns",
        "topic",
    )

    def __init__(
        self,
        consumer: MessageOwner,
        topic: str,
        partition: int,
        delivery_count: int,
        batch: bytes,
        info: BatchInfo | None,
        build: Build,
        missed: int = 0,
    ) -> None:
        self._consumer = consumer
        self.topic = topic
        self.partition = partition
        self.delivery_count = delivery_count
        self.missed = missed  # messages dropped (non-reliable) just before this batch
        self._batch = batch
        self._info = info  # the checked header: the count without a decode
        self._count = info.record_count if info is not None else 0
        self._build = build
        self._records: list[RawRecord] | None = None
        self._messages: list[Message] | None = None
        # time.monotonic_ns() when its frame was read (0 if it was not read as one): with the
        # time the application takes it, the client's own queueing
        self.received_ns = 0

    @classmethod
    def of_messages(cls, consumer: MessageOwner, messages: list[Message]) -> MessageBatch:
        """Messages already decoded (a consumer that mixed `receive` and `next_batch`)."""
        first = messages[0]
        batch = cls(
            consumer,
            first.topic,
            first.partition,
            first.delivery_count,
            b"",
            None,
            first.__class__,  # never called: the messages exist
            first.missed,
        )
        batch._messages = messages
        batch._count = len(messages)
        return batch

    def _decoded(self) -> list[RawRecord]:
        if self._records is None:
            if self._messages is not None:
                self._records = list(self._messages)  # Message has the same five fields
            else:
                try:
                    self._records = decode_batch(self._batch, info=self._info)
                except HeadwaterError as exc:
                    self._consumer.on_undecodable(exc)
                    raise
                self._batch = b""  # the decoded records hold what is needed
        return self._records

    def __len__(self) -> int:
        return self._count

    def values(self) -> list[bytes | None]:
        return [r.value for r in self._decoded()]

    def keys(self) -> list[bytes | None]:
        return [r.key for r in self._decoded()]

    def offsets(self) -> list[int]:
        return [r.offset for r in self._decoded()]

    def timestamps(self) -> list[int]:
        return [r.timestamp for r in self._decoded()]

    def headers(self) -> list[Headers]:
        """Each record's headers as its `Message` holds them: a tuple of (name, value)."""
        return [tuple(r.headers) or NO_HEADERS for r in self._decoded()]

    def messages(self) -> list[Message]:
        """A `Message` per record (built on the first call)."""
        if self._messages is None:
            build = self._build
            if self._records is not None:
                messages = [
                    build(r.offset, r.timestamp, r.key, r.value, tuple(r.headers) or NO_HEADERS)
                    for r in self._records
                ]
            else:  # straight from the bytes: one pass, as the per-message consumer always did
                try:
                    messages = decode_records(self._batch, build, info=self._info)
                except HeadwaterError as exc:
                    self._consumer.on_undecodable(exc)
                    raise
                self._batch = b""
            if messages and self.missed:
                messages[0].missed = self.missed
            self._messages = messages
        return self._messages

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages())

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        return self.messages()[index]

    async def ack(self) -> None:
        """Acknowledge every record of the batch (one request with the consumer's other acks)."""
        await self._consumer.ack_offsets(self.partition, self.offsets())

    async def ack_cumulative(self) -> None:
        """Acknowledge the batch's last record and every earlier one of its partition."""
        await self._consumer.ack_cumulative_offset(self.partition, self.offsets()[-1])

    def __repr__(self) -> str:
        return (
            f"MessageBatch(topic={self.topic!r}, partition={self.partition}, "
            f"records={self._count}, decoded={self._records is not None})"
        )
