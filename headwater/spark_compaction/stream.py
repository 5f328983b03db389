"""The Structured Streaming source `headwater`: a live reliable topic, read by offset with FETCH.

    spark.readStream.format("headwater").option("server", "127.0.0.1:6650")
        .option("topic", "orders").option("startingOffsets", "earliest").load()

Offsets are per partition, `{"<partition>": <next offset>}` as JSON, and live in Spark's checkpoint
only: the server keeps nothing for the query (no subscription, no acks). Each micro-batch, on the
driver, `latestOffset` asks DESCRIBE_TOPIC for every partition's next offset (partitions added to
the topic appear there and start at 0), capped by `maxRecordsPerTrigger` shared across the
partitions in proportion to their backlog; Spark writes that end offset to its offset log before
the batch runs. `partitions(start, end)` makes one task per partition with records in
[start, end), and each task, on an executor, reads its range with FETCH (`Client.fetch`) and yields
Arrow batches of `schema.STREAM_SCHEMA`: the `headwater_wal` rows without `corrupt`.

Why exactly once: a range [start, end) of an offset-addressed log always holds the same records,
so a batch Spark runs again after a crash (its end is in the offset log, its commit is not) reads
exactly what the first attempt read, and a sink that commits per batch id (the file sink's
metadata log) keeps one copy. The end offset is DESCRIBE's next offset, which may be above the
readable end for a moment (an fsync under `fsync=always`, the cloud tail in a cluster): a task
long-polls (FETCH `max_wait_ms`) until its range is readable, for at most `readTimeoutMs`.

Options (strings, as Spark passes them): `server`, `topic`, `startingOffsets` (`earliest`,
`latest`, or JSON `{"0": 42, "1": -2}` with -2 for earliest and -1 for latest; partitions left out
start at earliest), `maxRecordsPerTrigger`, `token`, `tls` (`true`), `tls.ca`, `tls.cert`,
`tls.key`, `tls.serverHostname`, `fetchMaxBytes` (default 1 MiB), `readTimeoutMs` (default
120000), `maxRetries` (default 20), `retryBackoffMs` (default 100), `retryMaxBackoffMs` (default
5000). docs/COMPACTION.md has the table.

Transactions: a task reads the log as stored (a raw FETCH, markers and aborted transactions'
batches included) and decides transactions itself, from the markers, with `wire.transaction_fold`:
the compaction job's fold, so a DataFrame and a snapshot are decided alike, from the log itself
rather than from the server's index of aborted ranges. Markers are never rows nor are aborted
transactions' records; a transactional batch and what follows it wait for its producer's next
marker (read past the range's end if need be, long-polling while the transaction is open, within
`readTimeoutMs`), so a range always yields the same rows, in offset order. Offsets step by the
answer's `next_offset`, past markers, aborted batches and gaps alike.

Riding through a server restart: the driver's DESCRIBE (`initialOffset`, `latestOffset`) and a
task's FETCH loop retry an error the server or the network may get over (`retriable`: a refused
or lost connection, a server shutting down, a storage error) on a new connection, waiting
`retryBackoffMs`, doubling up to `retryMaxBackoffMs`, at most `maxRetries` times in a row; a task
resumes at the offset after the last record it fetched, so nothing is read twice or skipped. Only
when the retries run out does the query fail, with the last error. In a cluster the client goes to
each partition's owner, so a take-over (an owner killed, its partitions served by another broker
once its lease lapses) is the same: the FETCH fails, and a new connection finds the new owner.
`server` may list several brokers, comma-separated: a connection tries them in turn, so the
broker named first can be the one that died.

This module imports pyspark; only Spark's Python workers and the compaction job import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Iterator, Sequence
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from headwater.client.client import Client, connect
from headwater.client.credentials import Tls, TlsOption
from headwater.spark_compaction.schema import STREAM_DDL, STREAM_SCHEMA
from headwater.spark_compaction.wal_segments import ROWS_PER_BATCH, Columns
from headwater.wire.errors import CannotConnect, HeadwaterError, InvalidRequest, RequestTimeout
from headwater.wire.limits import MAX_FETCH_WAIT_MS
from headwater.wire.markers import marker_type, peek
from headwater.wire.transaction_fold import TransactionFold

T = TypeVar("T")
Offsets = dict[str, int]

EARLIEST, LATEST = -2, -1  # in startingOffsets JSON, as Spark's Kafka source spells them
DEFAULT_FETCH_BYTES = 1024 * 1024
DEFAULT_READ_TIMEOUT_MS = 120_000
DEFAULT_MAX_RETRIES = 20  # with the backoffs below: about 80 s of a server away before failing
DEFAULT_RETRY_BACKOFF_MS = 100
DEFAULT_RETRY_MAX_BACKOFF_MS = 5_000
POLL_MS = 5_000  # one long poll's wait while a task's range is not readable yet


class Endpoint:
    """Where and how to connect: `server`, `topic`, `token`, `tls` and `tls.*`, shared by the
    source and the sink (headwater/spark_compaction/sink.py). `options` are Spark's, with their
    names lower-cased (Spark's option names ignore case)."""

    def __init__(self, options: dict[str, str], role: str) -> None:
        try:
            self.server = options["server"]
            self.topic = options["topic"]
        except KeyError as missing:
            raise InvalidRequest(f"the headwater {role} needs the option {missing}") from None
        if not self.servers:
            raise InvalidRequest(f"the headwater {role}'s option server names no broker")
        self._answered = 0  # the index in `servers` of the broker that answered last
        self.token = options.get("token") or None
        self.tls: TlsOption = None
        if options.get("tls", "false").lower() == "true":
            names = ("tls.ca", "tls.cert", "tls.key", "tls.serverhostname")
            if any(options.get(n) for n in names):
                ca, cert, key, host = (options.get(n) or None for n in names)
                self.tls = Tls(ca, cert, key, host)
            else:
                self.tls = True

    @property
    def servers(self) -> list[str]:
        """`server` may name several brokers of a cluster, comma-separated (as Kafka's
        `bootstrap.servers`): any one of them leads the client to every partition's owner."""
        return [s.strip() for s in self.server.split(",") if s.strip()]

    async def connect(self) -> Client:
        """A connection to the first of `servers` that answers, starting with the one that
        answered last, so that a broker gone for good (killed, its partitions taken over) costs
        one refused connection, not a query."""
        servers = self.servers
        last: HeadwaterError | None = None
        for step in range(len(servers)):
            index = (self._answered + step) % len(servers)
            try:
                client = await connect(servers[index], token=self.token, tls=self.tls)
            except CannotConnect as exc:
                last = exc
                continue
            self._answered = index
            return client
        assert last is not None  # `server` names at least one broker: checked at start
        raise last


def lowered(given: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in given.items()}


def number(options: dict[str, str], name: str, spelled: str, default: int, least: int) -> int:
    """An integer option, at least `least`, with an error naming it (`spelled` as documented)."""
    text = options.get(name)
    try:
        value = default if text is None else int(text)
    except ValueError:
        raise InvalidRequest(f"{spelled} must be an integer, not {text!r}") from None
    if value < least:
        raise InvalidRequest(f"{spelled} must be at least {least}, not {value}")
    return value


class Settings(Endpoint):
    """The source's options, checked once on the driver (a bad one fails the query at start)."""

    def __init__(self, given: dict[str, str]) -> None:
        options = lowered(given)
        super().__init__(options, "source")
        self.starting = options.get("startingoffsets", "latest")
        limit = options.get("maxrecordspertrigger")
        self.max_records = (
            None
            if limit is None
            else number(options, "maxrecordspertrigger", "maxRecordsPerTrigger", 0, 1)
        )
        self.fetch_bytes = number(options, "fetchmaxbytes", "fetchMaxBytes", DEFAULT_FETCH_BYTES, 1)
        timeout = number(options, "readtimeoutms", "readTimeoutMs", DEFAULT_READ_TIMEOUT_MS, 1)
        self.read_timeout = timeout / 1000
        self.max_retries = number(options, "maxretries", "maxRetries", DEFAULT_MAX_RETRIES, 0)
        backoff = number(options, "retrybackoffms", "retryBackoffMs", DEFAULT_RETRY_BACKOFF_MS, 1)
        most = number(
            options, "retrymaxbackoffms", "retryMaxBackoffMs", DEFAULT_RETRY_MAX_BACKOFF_MS, 1
        )
        self.backoff = backoff / 1000
        self.max_backoff = max(most, backoff) / 1000

    def delay(self, failures: int) -> float:
        """Seconds to wait before retry number `failures` (1, 2, ...)."""
        return float(min(self.max_backoff, self.backoff * 2 ** min(failures - 1, 30)))


def retrying(error: BaseException) -> bool:
    """Whether a failed DESCRIBE or FETCH is worth another try on a new connection."""
    return isinstance(error, HeadwaterError) and error.retriable


def _run(settings: Endpoint, work: Any) -> Any:
    """`work(client)` on a connection of its own, in an event loop of its own (Spark calls the
    reader from plain threads and processes); the source's settings retry it, on a new
    connection each time, while it fails with a retriable error."""

    async def run() -> Any:
        failures = 0
        while True:
            try:
                async with await settings.connect() as client:
                    return await work(client)
            except HeadwaterError as exc:
                failures += 1
                if not isinstance(settings, Settings) or not retrying(exc):
                    raise
                if failures > settings.max_retries:
                    raise
                await asyncio.sleep(settings.delay(failures))

    return asyncio.run(run())


def parse_offsets(value: str) -> dict[int, int]:
    try:
        parsed = json.loads(value)
        return {int(p): int(o) for p, o in parsed.items()}
    except (ValueError, AttributeError, TypeError):
        raise InvalidRequest(
            f"startingOffsets must be earliest, latest or JSON {{partition: offset}}, not {value!r}"
        ) from None


def offsets(values: dict[int, int]) -> Offsets:
    """Spark's offset: JSON keys are strings, in partition order (Spark compares the JSON)."""
    return {str(p): values[p] for p in sorted(values)}


def capped(start: dict[int, int], latest: dict[int, int], limit: int | None) -> dict[int, int]:
    """`latest`, or at most `limit` records past `start` in all, shared by the partitions in
    proportion to their backlog (the remainder one by one in partition order): deterministic,
    so the same state gives the same end."""
    backlog = {p: max(0, latest[p] - start.get(p, 0)) for p in latest}
    total = sum(backlog.values())
    if limit is None or total <= limit:
        return dict(latest)
    share = {p: backlog[p] * limit // total for p in backlog}
    left = limit - sum(share.values())
    for p in sorted(backlog):
        if left <= 0:
            break
        extra = min(left, backlog[p] - share[p])
        share[p] += extra
        left -= extra
    return {p: start.get(p, 0) + share[p] for p in latest}


class PartitionRange(InputPartition):
    """One task: `partition`'s records in [start, end)."""

    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__((partition, start, end))
        self.partition = partition
        self.start = start
        self.end = end


class TopicStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.settings = Settings(options)
        self.target: dict[int, int] | None = None  # Trigger.AvailableNow: where to stop

    def _describe(self) -> tuple[list[int], list[int]]:
        async def describe(client: Client) -> tuple[list[int], list[int]]:
            answer = await client.describe_topic(self.settings.topic)
            return list(answer.start_offsets), list(answer.next_offsets)

        result: tuple[list[int], list[int]] = _run(self.settings, describe)
        return result

    def initialOffset(self) -> dict[str, Any]:
        starts, nexts = self._describe()
        starting = self.settings.starting
        if starting in ("earliest", "latest"):
            chosen = starts if starting == "earliest" else nexts
            return offsets(dict(enumerate(chosen)))
        asked = parse_offsets(starting)
        found: dict[int, int] = {}
        for p in range(len(nexts)):
            offset = asked.get(p, EARLIEST)
            found[p] = starts[p] if offset == EARLIEST else nexts[p] if offset == LATEST else offset
        return offsets(found)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.settings.max_records is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.settings.max_records)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        _, nexts = self._describe()
        latest = dict(enumerate(nexts))
        if self.target is not None:
            latest = {p: min(o, self.target.get(p, 0)) for p, o in latest.items()}
        begun = {int(p): int(o) for p, o in start.items()}
        latest = {p: max(o, begun.get(p, 0)) for p, o in latest.items()}  # never backwards
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return offsets(capped(begun, latest, cap))

    def prepareForTriggerAvailableNow(self) -> None:
        _, nexts = self._describe()
        self.target = dict(enumerate(nexts))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begun = {int(p): int(o) for p, o in start.items()}
        ranges = []
        for p, o in sorted((int(p), int(o)) for p, o in end.items()):
            first = begun.get(p, 0)  # a partition added since `start`: from its beginning
            if o > first:
                ranges.append(PartitionRange(p, first, o))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, PartitionRange)
        return read_range(self.settings, partition.partition, partition.start, partition.end)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # the offsets are in Spark's checkpoint; the server keeps nothing for the query


def read_range(
    settings: Settings, partition: int, start: int, end: int
) -> Iterator[pa.RecordBatch]:
    """The visible records of `partition` in [start, end) as Arrow batches, fetched in order;
    waits (long polls) while the range is not readable yet, or while a transaction with batches
    in it has not ended, at most `readTimeoutMs` in all. Transactions are decided from the
    markers in what FETCH answers (`wire.transaction_fold`): markers are never rows, an aborted
    transaction's records neither, and what follows a transaction still open is held back with
    it; past `end` the task reads only for the markers it waits for."""
    loop = asyncio.new_event_loop()
    client: Client | None = None

    def wait(work: Awaitable[T]) -> T:
        return loop.run_until_complete(work)

    try:
        offset, columns = start, Columns()
        fold: TransactionFold[bytes | None] = TransactionFold()
        deadline = loop.time() + settings.read_timeout
        max_wait = min(POLL_MS, MAX_FETCH_WAIT_MS) / 1000
        failures = 0
        # each round moves on, or waits a poll; the deadline ends it
        while offset < end or fold.holding:
            if offset >= end and loop.time() > deadline:  # moving on, but past the range
                raise RequestTimeout(_undecided(settings, partition, fold, end))
            try:
                if client is None:
                    client = wait(settings.connect())
                fetched = wait(
                    client.fetch(
                        settings.topic, partition, offset, settings.fetch_bytes, max_wait, raw=True
                    )
                )
            except HeadwaterError as exc:  # a server restarting: again from `offset`, on a new
                failures += 1  # connection, after a backoff
                if not retrying(exc) or failures > settings.max_retries:
                    raise
                if client is not None:
                    with contextlib.suppress(Exception):
                        wait(client.close())
                    client = None
                time.sleep(settings.delay(failures))
                continue
            failures = 0
            for batch in fetched.batches():
                header = peek(batch)
                if header.base_offset >= end:  # past the range: a held transaction's marker?
                    if not header.control or header.producer_id not in fold.waiting_for:
                        continue
                    item: bytes | None = None
                elif header.transactional or fold.holding:
                    item = batch
                else:
                    columns.add(batch, start, end)
                    continue
                marker = marker_type(batch) if header.control else None
                for released, fate in fold.follow(header, marker, item):
                    if released is not None and fate.visible:
                        columns.add(released, start, end)
            if fetched.next_offset > offset:  # past what came, and past a gap the server stepped
                offset = fetched.next_offset
            elif loop.time() > deadline:  # nothing readable yet: the long poll waited
                raise RequestTimeout(
                    f"partition {partition} of topic {settings.topic!r}: offsets "
                    f"{offset}..{end} not readable after {settings.read_timeout:.0f}s "
                    f"(readable end {fetched.end_offset})"
                    if offset < end
                    else _undecided(settings, partition, fold, end)
                )
            if len(columns) >= ROWS_PER_BATCH:
                yield _stream_batch(columns.take(settings.topic, partition))
        if len(columns):
            yield _stream_batch(columns.take(settings.topic, partition))
    finally:
        if client is not None:
            wait(client.close())
        loop.close()


def _undecided(
    settings: Settings, partition: int, fold: TransactionFold[bytes | None], end: int
) -> str:
    producers = ", ".join(str(p) for p in sorted(fold.waiting_for))
    return (
        f"partition {partition} of topic {settings.topic!r}: the transaction open at offset "
        f"{fold.stable_offset} (producer {producers}), before the range's end {end}, has not "
        f"ended after {settings.read_timeout:.0f}s (readTimeoutMs)"
    )


def _stream_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(batch.columns[: len(STREAM_SCHEMA)], schema=STREAM_SCHEMA)


class TopicStreamSource(DataSource):
    """`spark.readStream.format("headwater").option("server", ...).option("topic", ...).load()`"""

    @classmethod
    def name(cls) -> str:
        return "headwater"

    def schema(self) -> str:
        return STREAM_DDL

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TopicStreamReader(dict(self.options))
