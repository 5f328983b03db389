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
  own (a producer id per task attempt), and returns once the server acknowledged them all.
- `mode=map`: each task writes its rows as map writes (MAP_SET, 1,000 writes a request): a
  non-null value sets its key, a null value deletes it. Every row needs a key.

Why the driver commits: a task cannot tell from its input that the input is complete. When an
operator before the writer in the same task fails (a Python UDF raising), Spark 4.3 ends the
writer's input iterator normally, after the rows computed so far (seen: the writer's loop ended
without an error after 1,800 of 2,000 rows), then fails the task, and runs it again. Whatever a
task does once its input ends, it may be doing for a partial input that a retry will write again;
only the driver's `commit`, called after every task succeeded, knows which attempts count. So with
`commit=task` a retried task duplicates what its failed attempt produced (at least once), and with
`commit=driver` it cannot (exactly once), at the price of every row passing through the driver's
one producer and a staging directory that executors and the driver share (local masters: any
local directory).

A streaming query's micro-batch is written once per query id and batch id: Spark logs the batch
as committed only after `commit(messages, batchId)` returned, so a stop or a crash in between
makes the restarted query run the batch again with the same id. Once every record of batch N is
acknowledged, the driver's commit sets the query's marker (key `<topic>/<query id>` of the map on
the `commitTopic` option's topic) to N, and a batch at or below the marker is skipped (by the
driver, and with `commit=task` by each task, which reads it first). The query id comes from the
tasks' local property (`sql.streaming.queryId`), carried to the driver in their commit messages.
What is left: a driver that dies after some of a batch's records are acknowledged and before the
marker is written (that batch is written again); only transactions (issue 38) close it.

A retried task's producer identity cannot be carried over from its failed attempt instead:
INIT_PRODUCER_ID hands out a new id on each call, with no name to find an old one by, and even
with the old id the server remembers only the last 32 batches per producer and partition
(durables/producers.py), while a replay would have to cut the same rows, in the same order (which
Spark does not promise after a shuffle), into the same batches. Map writes are exact in effect
either way: a replayed set or delete leaves the same last value.

This module imports pyspark; only Spark's Python workers and the compaction job import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
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
from headwater.client.producer_config import AtLeastOnce, ProducerConfig, RetryPolicy
from headwater.spark_compaction.stream import Endpoint, TopicStreamSource, lowered, number
from headwater.wire.errors import InvalidRequest, InvalidTopicName, UnknownTopic
from headwater.wire.limits import MAX_MAP_KEYS
from headwater.wire.names import check_topic_name
from headwater.wire.records import Compression

MODES: Final = ("append", "map")
COMMITS: Final = ("driver", "task")
COLUMNS: Final = ("key", "value", "headers", "partition")
DEFAULT_DELIVERY_TIMEOUT_MS: Final = 120_000
MAP_REQUEST_BYTES: Final = 1024 * 1024  # a MAP_SET carries at most this much (and 1,000 writes)
# unanswered send_batch calls a task keeps before it waits for the oldest (the producer's own
# queue bounds memory; this bounds the futures the task holds on to)
OUTSTANDING_CALLS: Final = 64
BATCH_ID: Final = "streaming.sql.batchId"  # the local property Spark gives a micro-batch's tasks
QUERY_ID: Final = "sql.streaming.queryId"  # the query's id, kept in its checkpoint across restarts
DEFAULT_COMMIT_TOPIC: Final = "headwater-sink-commits"


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
        self.commit_topic = options.get("committopic") or DEFAULT_COMMIT_TOPIC
        try:
            check_topic_name(self.commit_topic)
        except InvalidTopicName as exc:
            raise InvalidRequest(f"commitTopic: {exc}") from None

    def producer_config(self) -> ProducerConfig:
        # idempotent: the producer's own resends never duplicate; a retry budget long enough to
        # ride out a broker restart
        retry = RetryPolicy(max_retries=1_000, max_delay=1.0, timeout=self.delivery_timeout)
        return ProducerConfig(
            delivery=AtLeastOnce(retry), idempotent=True, compression=self.compression
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
    the query's id (a task's local property: the driver's commit has no other way to it)."""

    rows: int
    query: str | None = None


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


def marker_key(settings: SinkSettings, query: str) -> bytes:
    """The key of a query's marker in the commit topic's map: sink topic and query id."""
    return f"{settings.topic}/{query}".encode()


async def written_batch(client: Client, settings: SinkSettings, query: str) -> int | None:
    """The highest batch id the query's marker says was written to the topic, if any."""
    entry = await client.map(settings.commit_topic).get(marker_key(settings, query))
    return None if entry is None else int(entry.value)


def batch_written(settings: SinkSettings, query: str, batch_id: int) -> bool:
    """Whether the query's marker says its micro-batch `batch_id` is in the topic already."""

    async def check() -> bool:
        async with await settings.connect() as client:
            written = await written_batch(client, settings, query)
            return written is not None and batch_id <= written

    return asyncio.run(check())


def commit_batch(
    settings: SinkSettings, messages: Sequence[WriterCommitMessage | None], batch_id: int
) -> int | None:
    """A micro-batch's commit on the driver (append mode): unless the query's marker says the
    batch is in the topic already, produce what the tasks staged (`commit=driver`), then, once
    the server acknowledged every record, set the marker to `batch_id`. Returns the rows
    produced, or None when the batch was skipped as written already."""
    query = query_of(messages)

    async def commit() -> int | None:
        async with await settings.connect() as client:
            if query is not None:
                written = await written_batch(client, settings, query)
                if written is not None and batch_id <= written:
                    return None  # a replay of a batch whose commit Spark did not log
            rows = 0
            if settings.commit == "driver":
                rows = await _produce_on(client, settings, staged_batches(messages))
            if query is not None:
                await client.map(settings.commit_topic).set(
                    marker_key(settings, query), str(batch_id).encode()
                )
            return rows

    return asyncio.run(commit())


def check_topics(settings: SinkSettings, streaming: bool) -> None:
    """On the driver, before any task runs: the sink's topic exists (otherwise every task would
    stage or produce its rows first and the write fail only then), and a streaming append's
    commit topic exists (created, one partition with last-value state, when it does not)."""

    async def check() -> None:
        async with await settings.connect() as client:
            try:
                await client.describe_topic(settings.topic)
            except UnknownTopic:
                raise InvalidRequest(
                    f"the headwater sink's topic {settings.topic!r} does not exist: create it first"
                ) from None
            if streaming and settings.mode == "append":
                await client.create_topic(
                    settings.commit_topic, configs={"last.value": "true"}, exist_ok=True
                )

    asyncio.run(check())


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
    producer = client.producer(settings.topic, settings.producer_config())
    pending: list[Any] = []
    rows = 0
    try:
        for batch in batches:
            for call in await _send(producer, Rows(batch)):
                pending.append(call)
                if len(pending) > OUTSTANDING_CALLS:  # the oldest is likely answered already
                    await pending.pop(0)
            rows += batch.num_rows
            # the next batch is waited for outside the event loop (Spark's iterator blocks):
            # give the producer's sender its turn to write what is queued first
            await asyncio.sleep(0)
        for call in pending:
            await call  # raises the first failed produce
        await producer.flush()
    finally:
        await producer.close()
    return rows


async def _send(producer: Any, rows: Rows) -> list[Any]:
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
    """`writeStream`: with `commit=driver`, a directory per micro-batch under `staging`."""

    def __init__(self, settings: SinkSettings, staging: str | None) -> None:
        self.settings = settings
        self.staging = staging

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        batch = None if context is None else context.getLocalProperty(BATCH_ID)
        query = None if context is None else context.getLocalProperty(QUERY_ID)
        if self.staging is None:
            if (
                self.settings.mode == "append"
                and query is not None
                and batch is not None
                and batch_written(self.settings, query, int(batch))
            ):
                return SinkCommit(0, query)  # commit=task: a replay of a batch written already
            written = write_task(self.settings, iterator)
            return SinkCommit(written.rows, query)
        staged = stage_task(str(Path(self.staging) / f"batch-{batch}"), iterator)
        return Staged(staged.path, staged.rows, query)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        try:
            if self.settings.mode == "append":
                commit_batch(self.settings, messages, batchId)
        finally:
            remove_staged(messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
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
        check_topics(settings, streaming=True)
        return TopicStreamWriter(settings, _staging(settings))


def _staging(settings: SinkSettings) -> str | None:
    """This write's (or query run's) own staging directory, named on the driver and made by the
    first task that stages (Spark may ask for a writer it never runs); None when the tasks
    produce themselves."""
    if settings.mode == "map" or settings.commit == "task":
        return None
    return str(
        Path(settings.staging or tempfile.gettempdir()) / f"headwater-sink-{uuid.uuid4().hex}"
    )
