"""The `headwater` sink: `df.write` and `df.writeStream` into a topic, by produce or by map writes.

    df.write.format("headwater").option("server", "127.0.0.1:6650").option("topic", "orders")
        .mode("append").save()
    df.writeStream.format("headwater").option("server", ...).option("topic", "prices")
        .option("mode", "map").option("checkpointLocation", ...).start()

Rows take the columns Spark's Kafka sink takes: `value` (binary or string, required; null is a
tombstone), `key` (binary or string), `headers` (`array<struct<key: string, value: binary>>`),
`partition` (int: the record's partition; null or absent: by key, `crc32(key) % partitions`, or
keyless records in turn). On the driver, `writer()`/`streamWriter()` check the options and the
columns, so a bad one fails the write before any task runs. Three ways to write (`commit` and
`mode` options):

- `commit=driver` (the default): each task (`write`, on an executor) stages its rows in an Arrow
  IPC file under `stagingDir` and returns the file's name; once every task has succeeded, Spark
  calls `commit` on the driver, which produces the staged files, one after the other, with one
  idempotent producer, then deletes them. A failed attempt's file is never produced.
- `commit=task`: each task produces its rows as they arrive, with an idempotent producer of its
  own (in a streaming query a transactional one, below), and returns once the server
  acknowledged them all.
- `mode=map`: each task writes its rows as map writes (MAP_SET, 1,000 writes a request): a
  non-null value sets its key, a null value deletes it. Every row needs a key.

Why the driver commits: a task cannot tell from its input that the input is complete. When an
operator before the writer in the same task fails (a Python UDF raising), Spark 4.3 ends the
writer's input iterator normally, after the rows computed so far (seen: the writer's loop ended
without an error after 1,800 of 2,000 rows), then fails the task, and runs it again. Whatever a
task does once its input ends, it may be doing for a partial input that a retry will write again;
only the driver's `commit`, called after every task succeeded, knows which attempts count. So in a
batch write with `commit=task` a retried task duplicates what its failed attempt produced (at
least once), and with `commit=driver` it cannot (exactly once), at the price of every row passing
through the driver's one producer and a staging directory that executors and the driver share
(local masters: any local directory). In a streaming query `commit=task` is exactly once too: the
driver commits the transactions of the attempts that succeeded only.

A streaming query (append mode) writes each micro-batch once per query id and batch id. Spark
logs a batch as committed only after `commit(messages, batchId)` returned, so a stop or a crash in
between makes the restarted query run the batch again with the same id. So each batch is written
in transactions (docs/TRANSACTIONS.md) whose transactional ids derive from the query's id (Spark's
`sql.streaming.queryId`, kept in the checkpoint, which the tasks see as a local property and carry
to the driver in their commit messages), and a marker in the `commitTopic` topic's map records
what is written: key `<topic>/<query id>`, the last batch id written.

- `commit=driver`: the driver's commit is one transaction, transactional id
  `headwater-sink/<topic>/<query id>`. Its start fences any older instance of it (a killed
  driver's transaction left open is aborted first), so the marker it then reads is final: a batch
  at or below it is skipped; otherwise the staged rows and the marker set to the batch id are
  produced and committed together. A reader of committed records sees the whole batch or none.
- `commit=task`: each task writes its rows and its own marker (`<topic>/<query id>/<partition>`
  = the batch id) in a transaction of `headwater-sink/<topic>/<query id>/<partition>`, flushes,
  and leaves it open, handing its handle (transactional id, producer id, epoch) to the driver in
  its commit message. A retried attempt's start fences the failed attempt's transaction, and a
  task whose own marker already says the batch writes its marker only. The driver's `commit`
  commits the tasks' transactions (END_TXN by handle, from its own connection), then sets the
  query's marker; `abort` fences each task's id, which aborts what they left open. A task of a
  batch at or below the query's marker writes nothing. The tasks' transactions commit one after
  another, not atomically: a reader may see a batch's partitions appear a moment apart, and a
  driver killed between them leaves the committed ones visible until the restarted query writes
  the others (its tasks' starts abort what was left open): each Spark partition's rows exactly
  once provided a replayed batch gives each partition the same rows (docs/COMPACTION.md, "Sink").

The ids are per query and partition, not per batch, so their number stays bounded (the server
keeps 100,000 transactional ids). A non-reliable topic keeps no transactions (NOT_SUPPORTED,
before anything is written, as from a server older than them): the sink then writes as it did
before transactions, the marker after the records (a batch whose commit was cut short may be
written again). A write with no query id (`df.write`) is one idempotent produce, not a
transaction. Map writes need none: a replayed set or delete leaves the same last value.

This module imports pyspark; only Spark's Python workers and the compaction job import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructType,
)

from headwater.client.client import Client
from headwater.client.producer import Producer
from headwater.client.producer_config import AtLeastOnce, ProducerConfig, RetryPolicy
from headwater.client.transaction import TransactionHandle
from headwater.spark_compaction.stream import Endpoint, TopicStreamSource, lowered, number
from headwater.wire.errors import (
    InvalidRequest,
    InvalidTopicName,
    NotSupported,
    ProducerFenced,
    UnknownTopic,
)
from headwater.wire.limits import MAX_MAP_KEYS, MAX_TRANSACTION_TIMEOUT_MS, MAX_TRANSACTIONAL_ID
from headwater.wire.messages import DispatchMode
from headwater.wire.names import check_topic_name
from headwater.wire.records import Compression

logger = logging.getLogger(__name__)

MODES: Final = ("append", "map")
COMMITS: Final = ("driver", "task")
COLUMNS: Final = ("key", "value", "headers", "partition")
DEFAULT_DELIVERY_TIMEOUT_MS: Final = 120_000
# how long a micro-batch's transactions may stay open (the driver's produce with commit=driver;
# from a task's first row to the driver's commit with commit=task) before the server aborts them
DEFAULT_TRANSACTION_TIMEOUT_MS: Final = 300_000
MAP_REQUEST_BYTES: Final = 1024 * 1024  # a MAP_SET carries at most this much (and 1,000 writes)
# unanswered send_batch calls a task keeps before it waits for the oldest (the producer's own
# queue bounds memory; this bounds the futures the task holds on to)
OUTSTANDING_CALLS: Final = 64
BATCH_ID: Final = "streaming.sql.batchId"  # the local property Spark gives a micro-batch's tasks
QUERY_ID: Final = "sql.streaming.queryId"  # the query's id, kept in its checkpoint across restarts
DEFAULT_COMMIT_TOPIC: Final = "headwater-sink-commits"
TRANSACTIONAL_PREFIX: Final = "headwater-sink"
ENDS_AT_ONCE: Final = 16  # END_TXN requests the driver's commit has in flight
# tests only: a file the driver's commit writes the batch id to, then waits to be killed in, at
# the point a dying driver leaves the most to recover (its rows sent, nothing committed with
# commit=driver; one task's transaction committed, the others open, with commit=task)
PAUSE_ENV: Final = "HEADWATER_TEST_SINK_PAUSE"
PAUSE_SECONDS: Final = 300.0


class SinkSettings(Endpoint):
    """The sink's options, checked on the driver."""

    def __init__(self, given: dict[str, str]) -> None:
        options = lowered(given)
        super().__init__(options, "sink")
        self.mode = options.get("mode", "append").lower()
        if self.mode not in MODES:
            raise InvalidRequest(f"mode must be append or map, not {self.mode!r}")
        codec = options.get("compression", "none").upper()
        try:
            self.compression = Compression[codec]
        except KeyError:
            names = ", ".join(c.name.lower() for c in Compression)
            raise InvalidRequest(
                f"compression must be one of {names}, not {codec.lower()!r}"
            ) from None
        self.commit = options.get("commit", "driver").lower()
        if self.commit not in COMMITS:
            raise InvalidRequest(f"commit must be driver or task, not {self.commit!r}")
        self.staging = options.get("stagingdir") or None
        if self.staging is not None and not Path(self.staging).is_dir():
            raise InvalidRequest(f"stagingDir {self.staging!r} is not a directory")
        timeout = number(
            options, "deliverytimeoutms", "deliveryTimeoutMs", DEFAULT_DELIVERY_TIMEOUT_MS, 1
        )
        self.delivery_timeout = timeout / 1000
        held = number(
            options,
            "transactiontimeoutms",
            "transactionTimeoutMs",
            DEFAULT_TRANSACTION_TIMEOUT_MS,
            1,
        )
        if held > MAX_TRANSACTION_TIMEOUT_MS:
            raise InvalidRequest(
                f"transactionTimeoutMs is at most {MAX_TRANSACTION_TIMEOUT_MS} (the server's "
                f"limit), not {held}"
            )
        self.transaction_timeout = held / 1000
        self.commit_topic = options.get("committopic") or DEFAULT_COMMIT_TOPIC
        try:
            check_topic_name(self.commit_topic)
        except InvalidTopicName as exc:
            raise InvalidRequest(f"commitTopic: {exc}") from None

    def producer_config(self, transactional_id: str | None = None) -> ProducerConfig:
        # idempotent: the producer's own resends never duplicate; a retry budget long enough to
        # ride out a broker restart
        retry = RetryPolicy(max_retries=1_000, max_delay=1.0, timeout=self.delivery_timeout)
        return ProducerConfig(
            delivery=AtLeastOnce(retry),
            idempotent=True,
            compression=self.compression,
            transactional_id=transactional_id,
            transaction_timeout=self.transaction_timeout,
        )


def check_schema(schema: StructType, mode: str) -> None:
    """Refuse columns the sink does not take, or of the wrong type, before any task runs."""
    types: dict[str, DataType] = {f.name.lower(): f.dataType for f in schema.fields}
    unknown = sorted(set(types) - set(COLUMNS))
    if unknown:
        raise InvalidRequest(
            f"the headwater sink takes the columns key, value, headers and partition, "
            f"not {', '.join(unknown)}"
        )
    if "value" not in types:
        raise InvalidRequest("the headwater sink needs a value column (binary or string)")
    if mode == "map" and "key" not in types:
        raise InvalidRequest("mode map needs a key column (binary or string)")
    for name in ("key", "value"):
        if name in types and not isinstance(types[name], (BinaryType, StringType)):
            raise InvalidRequest(f"column {name} must be binary or string, not {types[name]}")
    if "partition" in types and not isinstance(types["partition"], IntegerType):
        raise InvalidRequest(f"column partition must be int, not {types['partition']}")
    if "headers" in types and not _headers_type(types["headers"]):
        raise InvalidRequest(
            "column headers must be array<struct<key: string, value: binary>>, "
            f"not {types['headers'].simpleString()}"
        )
    if mode == "map" and ("headers" in types or "partition" in types):
        raise InvalidRequest("mode map writes keys and values only: no headers or partition")


def _headers_type(kind: DataType) -> bool:
    if not isinstance(kind, ArrayType) or not isinstance(kind.elementType, StructType):
        return False
    fields = {f.name: f.dataType for f in kind.elementType.fields}
    return (
        set(fields) == {"key", "value"}
        and isinstance(fields["key"], StringType)
        and isinstance(fields["value"], BinaryType)
    )


@dataclass(frozen=True)
class SinkCommit(WriterCommitMessage):
    """What one task wrote: its rows (records produced, or map writes); in a streaming query,
    the query's id (a task's local property: the driver's commit has no other way to it) and,
    with `commit=task`, the task's transaction, left open for the driver to commit."""

    rows: int
    query: str | None = None
    transaction: TransactionHandle | None = None


class Rows:
    """One Arrow batch's columns as Python lists, keys and values as bytes."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        names = {name.lower(): i for i, name in enumerate(batch.schema.names)}

        def column(name: str) -> list[Any] | None:
            index = names.get(name)
            if index is None:
                return None
            array = batch.column(index)
            if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
                array = pc.cast(array, pa.binary())
            found: list[Any] = array.to_pylist()
            return found

        self.count = batch.num_rows
        values = column("value")
        assert values is not None  # check_schema made sure
        self.values: list[bytes | None] = values
        self.keys: list[bytes | None] | None = column("key")
        headers = column("headers")
        self.headers: list[dict[str, bytes] | None] | None = (
            None
            if headers is None
            else [None if h is None else {e["key"]: e["value"] for e in h} for h in headers]
        )
        self.partitions: list[int | None] | None = column("partition")


@dataclass(frozen=True)
class Staged(WriterCommitMessage):
    """A task's rows, staged for the driver's commit: the file (None: the task had no rows)."""

    path: str | None
    rows: int
    query: str | None = None


def write_task(settings: SinkSettings, batches: Iterator[pa.RecordBatch]) -> SinkCommit:
    """One task's rows into the topic (`commit=task`, `mode=map`); returns once the server has
    acknowledged every one."""
    if settings.mode == "map":
        return SinkCommit(asyncio.run(_map_writes(settings, batches)))
    return SinkCommit(asyncio.run(_produce(settings, batches)))


def stage_task(folder: str, batches: Iterator[pa.RecordBatch]) -> Staged:
    """One task's rows into a new Arrow IPC file in `folder` (`commit=driver`); nothing is
    produced here: the driver produces the files of the attempts that succeeded."""
    Path(folder).mkdir(parents=True, exist_ok=True)  # by the write's first task
    path = Path(folder) / f"{uuid.uuid4().hex}.arrow"
    writer: pa.ipc.RecordBatchStreamWriter | None = None
    rows = 0
    try:
        for batch in batches:
            if writer is None:
                writer = pa.ipc.new_stream(str(path), batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
    return Staged(str(path) if writer is not None else None, rows)


def staged_batches(messages: Sequence[WriterCommitMessage | None]) -> Iterator[pa.RecordBatch]:
    """The rows the successful tasks staged, file after file."""
    for message in messages:
        if isinstance(message, Staged) and message.path is not None:
            if not Path(message.path).exists():
                raise InvalidRequest(
                    f"a task staged its rows in {message.path}, which the driver cannot see: "
                    "stagingDir must be a directory the executors and the driver share"
                )
            with pa.memory_map(message.path) as source, pa.ipc.open_stream(source) as reader:
                yield from reader


def commit_staged(settings: SinkSettings, messages: Sequence[WriterCommitMessage | None]) -> int:
    """On the driver, once every task succeeded: produce what they staged, once."""
    return asyncio.run(_produce(settings, staged_batches(messages)))


def query_of(messages: Sequence[WriterCommitMessage | None]) -> str | None:
    """The streaming query's id, as the micro-batch's tasks found it (None: not known)."""
    for message in messages:
        query = getattr(message, "query", None)
        if isinstance(query, str) and query:
            return query
    return None


def marker_key(settings: SinkSettings, query: str, partition: int | None = None) -> bytes:
    """The key of a query's marker in the commit topic's map (sink topic and query id), or of
    one of its tasks' (and the Spark partition)."""
    key = f"{settings.topic}/{query}"
    return (key if partition is None else f"{key}/{partition}").encode()


def transactional_id(settings: SinkSettings, query: str, partition: int | None = None) -> str:
    """The transactional id of a query's driver commits, or of one of its tasks (by Spark
    partition): the same across the query's restarts, so a new instance fences an old one. A
    topic name too long to fit is replaced by its digest."""
    topic = settings.topic
    tail = f"/{query}" if partition is None else f"/{query}/{partition}"
    if len(TRANSACTIONAL_PREFIX) + 1 + len(topic) + len(tail) > MAX_TRANSACTIONAL_ID:
        topic = hashlib.sha256(topic.encode()).hexdigest()
    return f"{TRANSACTIONAL_PREFIX}/{topic}{tail}"


async def marked(client: Client, settings: SinkSettings, key: bytes, batch_id: int) -> bool:
    """Whether the marker `key` says micro-batch `batch_id` is in the topic already."""
    entry = await client.map(settings.commit_topic).get(key)
    return entry is not None and batch_id <= int(entry.value)


def batch_written(settings: SinkSettings, query: str, batch_id: int) -> bool:
    """Whether the query's marker says its micro-batch `batch_id` is in the topic already."""

    async def check() -> bool:
        async with await settings.connect() as client:
            return await marked(client, settings, marker_key(settings, query), batch_id)

    return asyncio.run(check())


def write_batch_task(
    settings: SinkSettings,
    batches: Iterator[pa.RecordBatch],
    query: str,
    batch_id: int,
    partition: int,
) -> SinkCommit:
    """One task of a streaming micro-batch (`commit=task`, append mode): nothing if the query's
    marker has the batch; else its rows and its own marker in a transaction handed to the
    driver (the module doc)."""

    async def write() -> SinkCommit:
        async with await settings.connect() as client:
            if await marked(client, settings, marker_key(settings, query), batch_id):
                return SinkCommit(0, query)  # a replay of a batch the query wrote
            tid = transactional_id(settings, query, partition)
            config = settings.producer_config(tid)
            async with (
                client.producer(settings.topic, config) as out,
                client.producer(settings.commit_topic, config) as markers,
            ):
                if not await _transactions_served(out):
                    return SinkCommit(await _produce_on(client, settings, batches), query)
                key = marker_key(settings, query, partition)
                async with out.transaction(hand_off=True) as handle:
                    # the start fenced this task's earlier attempts (a transaction one left
                    # open aborted first): the task's marker is final now
                    rows = 0
                    if not await marked(client, settings, key, batch_id):
                        rows = await _send_all(out, batches)
                    await markers.send(str(batch_id).encode(), key=key)
                return SinkCommit(rows, query, handle)

    return asyncio.run(write())


def commit_batch(
    settings: SinkSettings,
    messages: Sequence[WriterCommitMessage | None],
    batch_id: int,
    transactional: bool = True,
) -> int | None:
    """A micro-batch's commit on the driver (append mode): commit its transactions, or produce
    what the tasks staged in one (the module doc). Returns the rows written, or None when the
    query's marker says the batch is written already. `transactional` is False for a
    non-reliable topic, which keeps no transactions."""
    query = query_of(messages)

    async def commit() -> int | None:
        async with await settings.connect() as client:
            if query is None:  # no id to keep a marker by
                return await _produce_on(client, settings, staged_batches(messages))
            if settings.commit == "task":
                return await _commit_tasks(client, settings, query, messages, batch_id)
            if transactional:
                config = settings.producer_config(transactional_id(settings, query))
                async with (
                    client.producer(settings.topic, config) as out,
                    client.producer(settings.commit_topic, config) as markers,
                ):
                    if await _transactions_served(out):
                        return await _commit_staged(
                            client, settings, query, messages, batch_id, out, markers
                        )
            return await _commit_then_mark(client, settings, query, messages, batch_id)

    return asyncio.run(commit())


async def _commit_staged(
    client: Client,
    settings: SinkSettings,
    query: str,
    messages: Sequence[WriterCommitMessage | None],
    batch_id: int,
    out: Producer,
    markers: Producer,
) -> int | None:
    """`commit=driver`: the staged rows and the query's marker in one transaction."""
    key = marker_key(settings, query)
    async with out.transaction():
        # the producers' start fenced every older instance of the driver (a transaction a killed
        # one left open aborted first): the marker is final now
        if await marked(client, settings, key, batch_id):
            return None  # a replay of a batch whose Spark commit was not logged
        rows = await _send_all(out, staged_batches(messages))
        await markers.send(str(batch_id).encode(), key=key)
        await markers.flush()
        _pause_for_tests(batch_id)
    return rows


async def _commit_tasks(
    client: Client,
    settings: SinkSettings,
    query: str,
    messages: Sequence[WriterCommitMessage | None],
    batch_id: int,
) -> int | None:
    """`commit=task`: commit each task's transaction, then set the query's marker."""
    key = marker_key(settings, query)
    if await marked(client, settings, key, batch_id):
        return None  # its tasks found the marker too, and wrote nothing
    handles = [
        m.transaction for m in messages if isinstance(m, SinkCommit) and m.transaction is not None
    ]
    if handles:
        # the first alone: a test pauses after it, where a killed driver leaves a batch in part
        await _end(client, handles[0])
        _pause_for_tests(batch_id)
        gate = asyncio.Semaphore(ENDS_AT_ONCE)

        async def end(handle: TransactionHandle) -> None:
            async with gate:
                await _end(client, handle)

        await asyncio.gather(*(end(h) for h in handles[1:]))
    await client.map(settings.commit_topic).set(key, str(batch_id).encode())
    return sum(m.rows for m in messages if isinstance(m, SinkCommit))


async def _end(client: Client, handle: TransactionHandle) -> None:
    try:
        await client.end_transaction(handle, commit=True)
    except ProducerFenced as exc:
        raise ProducerFenced(
            f"{exc}. A task's transaction was aborted before the driver's commit "
            "(transactionTimeoutMs passed, or another attempt of the task started, as with "
            "speculation): the micro-batch fails, and the restarted query writes again what "
            "was not committed"
        ) from None


async def _commit_then_mark(
    client: Client,
    settings: SinkSettings,
    query: str,
    messages: Sequence[WriterCommitMessage | None],
    batch_id: int,
) -> int | None:
    """`commit=driver` without transactions (a non-reliable topic, an older server): the
    staged rows, then, once all are acknowledged, the marker; a commit cut short between the
    two writes the batch again when it is replayed."""
    key = marker_key(settings, query)
    if await marked(client, settings, key, batch_id):
        return None
    rows = await _produce_on(client, settings, staged_batches(messages))
    await client.map(settings.commit_topic).set(key, str(batch_id).encode())
    return rows


def abort_batch(settings: SinkSettings, messages: Sequence[WriterCommitMessage | None]) -> None:
    """`commit=task`: fence the transactional id of each of the micro-batch's tasks (one per
    Spark partition: the messages are in partition order, None for a task that failed), which
    aborts what they left open, rather than leave it holding readers back until its timeout
    or the batch's replay."""
    query = query_of(messages)
    if query is None:  # no task got far enough to say
        return

    async def fence() -> None:
        async with await settings.connect() as client:
            gate = asyncio.Semaphore(ENDS_AT_ONCE)

            async def one(partition: int) -> None:
                tid = transactional_id(settings, query, partition)
                async with (
                    gate,
                    client.producer(
                        settings.commit_topic, settings.producer_config(tid)
                    ) as producer,
                ):
                    await _transactions_served(producer)

            await asyncio.gather(*(one(p) for p in range(len(messages))))

    asyncio.run(fence())


async def _transactions_served(producer: Producer) -> bool:
    """Start the transactional producer, which fences every older instance of its id (the
    server aborts a transaction one left open first): an empty transaction, which ends
    nothing. False when the server does not serve transactions for the topic (a non-reliable
    one, or a server older than them)."""
    try:
        async with producer.transaction():
            pass
    except NotSupported as exc:
        logger.warning("the headwater sink writes without transactions: %s", exc)
        return False
    return True


def _pause_for_tests(batch_id: int) -> None:
    """Tests only (`PAUSE_ENV` set): write the batch id to the file it names, then wait there,
    blocking, to be killed."""
    path = os.environ.get(PAUSE_ENV)
    if not path:
        return
    Path(path).write_text(str(batch_id))
    time.sleep(PAUSE_SECONDS)
    raise RuntimeError(f"{PAUSE_ENV}: paused {PAUSE_SECONDS:.0f} s and was not killed")


def check_topics(settings: SinkSettings, streaming: bool) -> bool:
    """On the driver, before any task runs: the sink's topic exists (otherwise every task would
    stage or produce its rows first and the write fail only then), and a streaming append's
    commit topic exists (created, one partition with last-value state, when it does not).
    Returns whether the topic is reliable (only reliable topics keep transactions)."""

    async def check() -> bool:
        async with await settings.connect() as client:
            try:
                described = await client.describe_topic(settings.topic)
            except UnknownTopic:
                raise InvalidRequest(
                    f"the headwater sink's topic {settings.topic!r} does not exist: create it first"
                ) from None
            if streaming and settings.mode == "append":
                await client.create_topic(
                    settings.commit_topic, configs={"last.value": "true"}, exist_ok=True
                )
            return described.topic.dispatch == DispatchMode.RELIABLE

    return asyncio.run(check())


def remove_staged(messages: Sequence[WriterCommitMessage | None]) -> None:
    """Remove the directories the messages' files are in (the write's, or the micro-batch's:
    failed attempts' files too), then a query run's directory once it is empty. By the
    messages, not by the writer's own name for them: Spark may commit through another
    `streamWriter()` than the one whose copies ran the tasks."""
    folders = {
        Path(m.path).parent for m in messages if isinstance(m, Staged) and m.path is not None
    }
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
        if folder.name.startswith("batch-"):
            with contextlib.suppress(OSError):  # another micro-batch's directory is in it
                folder.parent.rmdir()


async def _produce(settings: SinkSettings, batches: Iterator[pa.RecordBatch]) -> int:
    async with await settings.connect() as client:
        return await _produce_on(client, settings, batches)


async def _produce_on(
    client: Client, settings: SinkSettings, batches: Iterator[pa.RecordBatch]
) -> int:
    async with client.producer(settings.topic, settings.producer_config()) as producer:
        return await _send_all(producer, batches)


async def _send_all(producer: Producer, batches: Iterator[pa.RecordBatch]) -> int:
    """Send every row, and wait until each is acknowledged (in a transaction the acks come
    before its commit; without one, `flush` raises what failed)."""
    pending: list[Any] = []
    rows = 0
    for batch in batches:
        for call in await _send(producer, Rows(batch)):
            pending.append(call)
            if len(pending) > OUTSTANDING_CALLS:  # the oldest is likely answered already
                await pending.pop(0)
        rows += batch.num_rows
        # the next batch is waited for outside the event loop (Spark's iterator blocks): give
        # the producer's sender its turn to write what is queued first
        await asyncio.sleep(0)
    for call in pending:
        await call  # raises the first failed produce
    await producer.flush()
    return rows


async def _send(producer: Producer, rows: Rows) -> list[Any]:
    """Queue one batch's rows: those naming a partition there, the others by key (or in turn)."""
    if rows.partitions is None or all(p is None for p in rows.partitions):
        return [await producer.send_batch(rows.values, keys=rows.keys, headers=rows.headers)]
    groups: dict[int | None, list[int]] = {}
    for index, partition in enumerate(rows.partitions):
        groups.setdefault(partition, []).append(index)
    calls = []
    for partition, indexes in groups.items():
        keys, headers = rows.keys, rows.headers
        calls.append(
            await producer.send_batch(
                [rows.values[i] for i in indexes],
                keys=None if keys is None else [keys[i] for i in indexes],
                headers=None if headers is None else [headers[i] for i in indexes],
                partition=partition,
            )
        )
    return calls


async def _map_writes(settings: SinkSettings, batches: Iterator[pa.RecordBatch]) -> int:
    async with await settings.connect() as client:
        written = 0
        for batch in batches:
            rows = Rows(batch)
            assert rows.keys is not None  # check_schema made sure
            if any(k is None for k in rows.keys):
                raise InvalidRequest("mode map: every row needs a key (a row has a null key)")
            written += await _write_chunks(client, settings.topic, rows.keys, rows.values)
        return written


async def _write_chunks(
    client: Client, topic: str, keys: list[bytes | None], values: list[bytes | None]
) -> int:
    """MAP_SET requests of at most 1,000 writes and about MAP_REQUEST_BYTES, one at a time, in
    row order (so a key's later row wins); a key twice in one request keeps its later value."""
    target = client.map(topic)
    chunk: dict[bytes, bytes | None] = {}
    size = 0
    for key, value in zip(keys, values, strict=True):
        assert key is not None
        grown = len(key) + (len(value) if value is not None else 0)
        if chunk and (len(chunk) >= MAX_MAP_KEYS or size + grown > MAP_REQUEST_BYTES):
            await target.write_many(list(chunk.items()))
            chunk, size = {}, 0
        chunk.pop(key, None)  # re-inserted last: the later write wins
        chunk[key] = value
        size += grown
    if chunk:
        await target.write_many(list(chunk.items()))
    return len(keys)


class TopicWriter(DataSourceArrowWriter):
    """`df.write`: `staging` is this write's own directory (`commit=driver`)."""

    def __init__(self, settings: SinkSettings, staging: str | None) -> None:
        self.settings = settings
        self.staging = staging

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        if self.staging is None:
            return write_task(self.settings, iterator)
        return stage_task(self.staging, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        try:
            if self.staging is not None:
                commit_staged(self.settings, messages)
        finally:
            self.abort(messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # with commit=task, what finished tasks produced stays
        remove_staged(messages)
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)


class TopicStreamWriter(DataSourceStreamArrowWriter):
    """`writeStream`: with `commit=driver`, a directory per micro-batch under `staging`;
    `transactional` unless the topic is non-reliable."""

    def __init__(self, settings: SinkSettings, staging: str | None, transactional: bool) -> None:
        self.settings = settings
        self.staging = staging
        self.transactional = transactional

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        batch = None if context is None else context.getLocalProperty(BATCH_ID)
        query = None if context is None else context.getLocalProperty(QUERY_ID)
        if self.staging is not None:
            staged = stage_task(str(Path(self.staging) / f"batch-{batch}"), iterator)
            return Staged(staged.path, staged.rows, query)
        if self.settings.mode == "append" and query is not None and batch is not None:
            assert context is not None
            if self.transactional:
                return write_batch_task(
                    self.settings, iterator, query, int(batch), context.partitionId()
                )
            if batch_written(self.settings, query, int(batch)):
                return SinkCommit(0, query)  # a replay of a batch written already
        return SinkCommit(write_task(self.settings, iterator).rows, query)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        try:
            if self.settings.mode == "append":
                commit_batch(self.settings, messages, batchId, self.transactional)
        finally:
            remove_staged(messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        try:
            if (
                self.transactional
                and self.settings.mode == "append"
                and self.settings.commit == "task"
            ):
                abort_batch(self.settings, messages)
        finally:
            remove_staged(messages)


class HeadwaterDataSource(TopicStreamSource):
    """`headwater`: the streaming source (stream.py) and this sink under one name."""

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        settings = SinkSettings(dict(self.options))
        if overwrite:
            raise InvalidRequest("a topic cannot be overwritten: write with mode('append')")
        check_schema(schema, settings.mode)
        check_topics(settings, streaming=False)
        return TopicWriter(settings, _staging(settings))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        settings = SinkSettings(dict(self.options))
        check_schema(schema, settings.mode)
        reliable = check_topics(settings, streaming=True)
        return TopicStreamWriter(settings, _staging(settings), reliable)


def _staging(settings: SinkSettings) -> str | None:
    """This write's (or query run's) own staging directory, named on the driver and made by the
    first task that stages (Spark may ask for a writer it never runs); None when the tasks
    produce themselves."""
    if settings.mode == "map" or settings.commit == "task":
        return None
    return str(
        Path(settings.staging or tempfile.gettempdir()) / f"headwater-sink-{uuid.uuid4().hex}"
    )
