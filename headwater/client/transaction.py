"""A transactional producer's transactions: one `TransactionSession` per transactional id.

Every producer a client makes with the same `transactional_id` joins one session, so one
transaction spans all their topics (docs/PRODUCING.md, "Transactions"). The session speaks to the
transaction coordinator on a connection of its own:

- On creation it asks for its producer id and a new epoch (INIT_TRANSACTIONS), which fences every
  older instance of the transactional id; while the server answers CONCURRENT_TRANSACTIONS (it
  is aborting the transaction such an instance left open) it asks again.
- `transaction()` begins a transaction on the client only (the server learns of it with its first
  partition, as Kafka's). A producer's first record for a partition in the transaction waits for
  ADD_PARTITIONS_TO_TXN (`admit`) before it is queued, so no batch reaches a partition the
  transaction has not taken in. `send_acks` adds acknowledgements of a reliable subscription's
  messages (ADD_ACKS_TO_TXN): acked if the transaction commits, delivered again after their ack
  timeout if it aborts. A normal exit flushes every producer of the session, then commits
  (END_TXN); an exception, or a send that failed, aborts instead, and the error propagates.
- After an abort the session bumps its own epoch (INIT_TRANSACTIONS with the id and epoch it
  holds) and its producers number their batches from 0 again: a batch that failed may have left
  a gap in a partition's sequence. After an end whose answer never came, the next transaction
  begins with that bump, which settles the previous one at the server (aborted if the end never
  reached it).
- `transaction(hand_off=True)` flushes at the block's end and leaves the transaction open at
  the server instead of ending it: whoever holds its `TransactionHandle` (transactional id,
  producer id, epoch) ends it later with `end_transaction`, from any connection or process (the
  server binds a transaction to those three, not to a connection); the session takes no other
  transaction. Spark's sink has each task write in a transaction and its driver commit them.
- PRODUCER_FENCED, or INVALID_PRODUCER_EPOCH on a batch, means another instance took the
  transactional id (or the transaction outlived its timeout and the server aborted it under a
  bumped epoch): `ProducerFenced` is raised, and every later call of the session's producers
  raises it again. Nothing the fenced producer sends afterwards is accepted.

Each request is retried on a retriable error (a lost connection, CONCURRENT_TRANSACTIONS) with a
doubling delay, within the producer's `request_timeout`; the coordinator takes a repeated request
as the one it answered (adding a partition twice adds it once, acknowledgements added twice are
merged, an end already done is done). In a cluster any broker serves any transactional id (its
state is in etcd, docs/CLUSTER.md), so a request whose connection is lost or left unanswered is
sent again to the next broker the client's routing table knows (`Brokers`), with the same
producer id and epoch: a bootstrap broker killed mid-transaction does not end the session. An
end its broker had decided before it died is completed by another broker meanwhile (the retry
is answered CONCURRENT_TRANSACTIONS until then, and retried); one it had not is decided by the
broker the retry reaches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from headwater.client.broker_connection import Connection
from headwater.wire import messages as m
from headwater.wire.errors import (
    ConnectionClosed,
    HeadwaterError,
    InvalidProducerEpoch,
    InvalidRequest,
    InvalidTxnState,
    ProducerFenced,
    RequestTimeout,
)
from headwater.wire.limits import MAX_ACK_RANGES_PER_REQUEST, MAX_PARTITIONS

logger = logging.getLogger(__name__)

# said of an end whose answer never came (the CLI reads it)
COMMIT_UNKNOWN = "the commit may or may not have reached the server"
_FIRST_DELAY = 0.02  # seconds before a retriable request is sent again, doubled up to
_MAX_DELAY = 1.0


@dataclass(frozen=True)
class Brokers:
    """Where a transaction's requests go: the bootstrap broker (`connect`), and in a cluster the
    other brokers known (`others`, their addresses now), reached with `open_at`."""

    connect: Callable[[], Awaitable[Connection]]
    open_at: Callable[[str, int], Awaitable[Connection]] | None = None
    others: Callable[[], list[tuple[str, int]]] = lambda: []


@dataclass(frozen=True)
class TransactionHandle:
    """What names a transaction at the server: enough to end it from anywhere
    (`end_transaction`), as long as no newer instance of the transactional id started."""

    transactional_id: str
    producer_id: int
    epoch: int


class Member(Protocol):
    """What the session asks of each producer writing in its transactions (`Producer`)."""

    async def flush(self) -> None: ...

    def restart(self, producer_id: int, epoch: int) -> None:
        """A new producer id or epoch: the next batches carry it, numbered from 0."""


class TransactionSession:
    def __init__(
        self,
        transactional_id: str,
        timeout: float,
        brokers: Brokers,
        request_timeout: float,
        on_closed: Callable[[TransactionSession], None] | None = None,
    ) -> None:
        self.transactional_id = transactional_id
        self._timeout_ms = round(timeout * 1000)
        self._on_closed = on_closed
        self._link = CoordinatorLink(transactional_id, brokers, request_timeout)
        self.producer_id = -1
        self.epoch = -1
        self.members: list[Member] = []
        self.fenced: ProducerFenced | None = None
        self.closed = False
        self._in_transaction = False
        self._begun = False  # the server has a transaction in progress (something was added)
        self._handed_off = False  # a transaction was left open for another to end
        self._added: set[tuple[str, int]] = set()  # partitions of the transaction in progress
        self._lock = asyncio.Lock()  # one ADD_PARTITIONS_TO_TXN at a time
        # an end that failed: the server may still hold the transaction open, so the next one
        # begins with an epoch bump, which resolves it (aborted if it was still in progress)
        self._unresolved = False
        self._ready = self._start()

    # Producers

    def join(self, member: Member) -> None:
        self.members.append(member)
        if self.producer_id >= 0:
            member.restart(self.producer_id, self.epoch)

    async def leave(self, member: Member) -> None:
        """A producer closed; the session closes with its last one."""
        if member in self.members:
            self.members.remove(member)
        if not self.members and not self.closed:
            self.closed = True
            self._ready.cancel()
            await asyncio.gather(self._ready, return_exceptions=True)
            await self._link.close()
            if self._on_closed is not None:
                self._on_closed(self)

    async def ready(self) -> None:
        """Wait until the producer id and epoch are known; raises what the init met (and the
        next call starts it again)."""
        self._check_usable()
        ready = self._ready
        if ready.done() and not ready.cancelled() and ready.exception() is not None:
            self._ready = self._start()  # the last one failed: this call raises, the next retries
        await asyncio.shield(ready)

    def _start(self) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._init())
        task.add_done_callback(_retrieve)  # raised by `ready`, if anyone asks
        return task

    # The transaction

    @contextlib.asynccontextmanager
    async def transaction(self, hand_off: bool = False) -> AsyncIterator[TransactionHandle]:
        await self.ready()
        if self._in_transaction:
            raise InvalidTxnState(
                f"transactional id {self.transactional_id!r}: a transaction is in progress "
                "already (its producers share one)"
            )
        if self._unresolved:
            await self._init(self.producer_id, self.epoch)
            self._unresolved = False
        self._in_transaction = True
        try:
            yield TransactionHandle(self.transactional_id, self.producer_id, self.epoch)
        except BaseException as exc:
            self._close_admission()
            await self._abort(exc)
            raise
        else:
            self._close_admission()
            if hand_off:
                await self._hand_off()
            else:
                await self._commit()
        finally:
            self._in_transaction = self._begun = False
            self._added.clear()

    def _close_admission(self) -> None:
        """The block ended: no record more is admitted to the transaction, so what the end
        flushes is all of it (and no send races the epoch bump after an abort)."""
        self._in_transaction = False
        self._added.clear()

    async def admit(self, topic: str, partition: int) -> None:
        """Before a record for `partition` of `topic` is queued: the partition is in the
        transaction in progress (added now if it is its first record there)."""
        where = (topic, partition)
        if where in self._added:
            return
        self._check_usable()
        if not self._in_transaction:
            raise InvalidTxnState(
                f"transactional id {self.transactional_id!r}: a transactional producer sends "
                "inside a transaction (`async with producer.transaction():`)"
            )
        async with self._lock:
            if where in self._added:
                return
            await self._request(
                m.AddPartitionsToTxnRequest(
                    self.transactional_id, self.producer_id, self.epoch, topic, (partition,)
                )
            )
            self._added.add(where)
            self._begun = True

    async def send_acks(
        self,
        topic: str,
        subscription: str,
        offsets: Iterable[tuple[int, int]],
        positions: Mapping[int, int] | None = None,
    ) -> None:
        """Acknowledge `offsets` ((partition, offset) pairs) of `subscription`'s messages, and
        move its `positions`, when the transaction in progress commits."""
        self._check_usable()
        if not self._in_transaction:
            raise InvalidTxnState(
                f"transactional id {self.transactional_id!r}: acknowledgements go in a "
                "transaction (`async with producer.transaction():`)"
            )
        moved = tuple(m.AckEntry(p, o) for p, o in sorted((positions or {}).items()))
        if len(moved) > MAX_PARTITIONS:
            raise InvalidRequest(f"at most {MAX_PARTITIONS} positions, one per partition")
        ranges = ack_runs(offsets)
        step = MAX_ACK_RANGES_PER_REQUEST
        chunks = [tuple(ranges[i : i + step]) for i in range(0, len(ranges), step)] or [()]
        for index, chunk in enumerate(chunks):
            taken = moved if index == 0 else ()
            if not chunk and not taken:
                return
            request = m.AddAcksToTxnRequest(
                self.transactional_id,
                self.producer_id,
                self.epoch,
                topic,
                subscription,
                chunk,
                taken,
            )
            await self._request(request)
            self._begun = True

    # Internals

    async def _init(self, producer_id: int = -1, epoch: int = -1) -> None:
        request = m.InitTransactionsRequest(
            self.transactional_id, self._timeout_ms, producer_id, epoch
        )
        response = await self._request(request)
        assert isinstance(response, m.InitProducerIdResponse)
        self.producer_id, self.epoch = response.producer_id, response.producer_epoch
        for member in self.members:
            member.restart(self.producer_id, self.epoch)
        logger.debug(
            "transactional id %r: producer id %s, epoch %s",
            self.transactional_id,
            self.producer_id,
            self.epoch,
        )

    async def _flush(self) -> None:
        for member in list(self.members):
            await member.flush()

    async def _flush_or_abort(self) -> None:
        """Every send of the transaction acknowledged; if one failed, the transaction is
        aborted and its error raised."""
        try:
            await self._flush()
        except HeadwaterError as exc:
            fenced = self._fence(exc)
            if fenced is not None:
                raise fenced from None
            await self._abort(exc)
            raise

    async def _commit(self) -> None:
        await self._flush_or_abort()
        if self._begun:
            try:
                await self._request(self._end(commit=True))
            except HeadwaterError as exc:
                if self._fence(exc) is None:
                    # whatever the server holds of it is settled when the next one begins
                    self._unresolved = True
                    if exc.retriable:  # no answer came: the server may have committed
                        exc.message += (
                            f"; {COMMIT_UNKNOWN}: the transaction is committed if it did, else "
                            "aborted when the next one begins"
                        )
                        exc.args = (exc.message,)
                raise

    async def _hand_off(self) -> None:
        """Every send acknowledged, the transaction left open for its handle's holder."""
        await self._flush_or_abort()
        if not self._begun:
            raise InvalidTxnState(
                f"transactional id {self.transactional_id!r}: the transaction sent nothing, so "
                "there is none to hand off"
            )
        self._handed_off = True

    async def _abort(self, cause: BaseException) -> None:
        """End the transaction in progress with an abort, after `cause`; a failure of the abort
        itself is logged (the server aborts the transaction at its timeout), not raised over
        `cause`."""
        if self.fenced is not None or self._fence(cause) is not None:
            return
        try:
            with contextlib.suppress(HeadwaterError):
                await self._flush()  # every batch answered: none is left to send afterwards
            if self._begun:
                await self._request(self._end(commit=False))
            await self._init(self.producer_id, self.epoch)
        except HeadwaterError as exc:
            self._unresolved = self.fenced is None
            logger.warning(
                "transactional id %r: the abort after %r failed: %s",
                self.transactional_id,
                cause,
                exc,
            )

    def _end(self, commit: bool) -> m.EndTxnRequest:
        return m.EndTxnRequest(self.transactional_id, self.producer_id, self.epoch, commit)

    def _check_usable(self) -> None:
        if self.fenced is not None:
            raise self.fenced
        if self.closed:
            raise InvalidTxnState(f"transactional id {self.transactional_id!r}: producer closed")
        if self._handed_off:
            raise InvalidTxnState(
                f"transactional id {self.transactional_id!r}: its transaction was handed off "
                "(its handle's holder ends it); start a new producer for another"
            )

    def _fence(self, error: BaseException) -> ProducerFenced | None:
        """The `ProducerFenced` that `error` means (remembered), or None."""
        if not isinstance(error, ProducerFenced | InvalidProducerEpoch):
            return None
        if self.fenced is None:
            self.fenced = ProducerFenced(
                f"transactional id {self.transactional_id!r} (producer id {self.producer_id}, "
                f"epoch {self.epoch}) was fenced: {error}"
            )
            self._added.clear()
            logger.warning("%s", self.fenced.message)
        return self.fenced

    async def _request(self, request: m.Request) -> m.Response:
        try:
            return await self._link.request(request)
        except (ProducerFenced, InvalidProducerEpoch) as exc:
            fenced = self._fence(exc)
            assert fenced is not None
            raise fenced from None


class CoordinatorLink:
    """A connection to a broker serving the transactional id, opened when first needed (and
    again after it was lost); a request refused with a retriable error (a lost connection,
    CONCURRENT_TRANSACTIONS) is sent again after a doubling delay, within `request_timeout`.
    A connection lost, or a request left unanswered, moves the link to the next broker of the
    cluster (the bootstrap one first, then the others `Brokers` knows, in turn)."""

    def __init__(self, transactional_id: str, brokers: Brokers, request_timeout: float) -> None:
        self._transactional_id = transactional_id
        self._brokers = brokers
        self._request_timeout = request_timeout
        self._connection: Connection | None = None
        self._target: tuple[str, int] | None = None  # None: the bootstrap broker
        self._dropped: set[asyncio.Task[None]] = set()

    async def request(self, request: m.Request) -> m.Response:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._request_timeout
        delay = _FIRST_DELAY
        while True:
            try:
                if self._connection is None or self._connection.closed:
                    self._connection = await self._open()
                return await self._connection.request(request, self._request_timeout)
            except HeadwaterError as exc:
                if isinstance(exc, ConnectionClosed | RequestTimeout):
                    self._move_on()
                if not exc.retriable or loop.time() + delay > deadline:
                    raise
                logger.info(
                    "transactional id %r: %s refused (%s); again in %.2fs, at %s",
                    self._transactional_id,
                    type(request).__name__,
                    exc,
                    delay,
                    "the bootstrap broker" if self._target is None else self._target,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_DELAY)

    async def _open(self) -> Connection:
        if self._target is None or self._brokers.open_at is None:
            return await self._brokers.connect()
        return await self._brokers.open_at(*self._target)

    def _move_on(self) -> None:
        """The broker did not answer: the next one (a single broker's client stays)."""
        candidates: list[tuple[str, int] | None] = [None, *self._brokers.others()]
        if len(candidates) > 1 and self._brokers.open_at is not None:
            at = candidates.index(self._target) if self._target in candidates else 0
            self._target = candidates[(at + 1) % len(candidates)]
        connection, self._connection = self._connection, None
        if connection is not None and not connection.closed:
            task = asyncio.get_running_loop().create_task(connection.close())
            self._dropped.add(task)
            task.add_done_callback(self._dropped.discard)

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()


async def end_transaction(
    handle: TransactionHandle, commit: bool, brokers: Brokers, request_timeout: float
) -> None:
    """END_TXN for the transaction `handle` names, begun by another client or process (a
    repeated end of one already so is done); `ProducerFenced` when a newer instance of the
    transactional id started, or its timeout aborted it."""
    link = CoordinatorLink(handle.transactional_id, brokers, request_timeout)
    try:
        await link.request(
            m.EndTxnRequest(handle.transactional_id, handle.producer_id, handle.epoch, commit)
        )
    except InvalidProducerEpoch as exc:
        raise ProducerFenced(str(exc)) from None
    finally:
        await link.close()


def ack_runs(offsets: Iterable[tuple[int, int]]) -> list[m.AckRange]:
    """(partition, offset) pairs as ranges of consecutive offsets."""
    ranges: list[m.AckRange] = []
    for partition, offset in sorted(set(offsets)):
        last = ranges[-1] if ranges else None
        if (
            last is not None
            and last.partition == partition
            and offset == last.first_offset + last.count
        ):
            last.count += 1
        else:
            ranges.append(m.AckRange(partition, offset, 1))
    return ranges


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
