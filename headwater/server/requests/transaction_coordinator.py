"""The transaction coordinator: each transactional id's state, stored, and the end of transactions.

The state machine is `durables.transaction_state` (no I/O); this module keeps one `Transaction`
per transactional id in memory, stored where the deployment keeps it (`TransactionPlacement`,
`requests.transaction_placement`: the state store on one broker, etcd in a cluster; every change
stored before it is answered), serialises the requests of one id (a lock per id), and does what
an end needs:

1. Commit: every partition of the transaction is made durable first (one broker: an fsync, its
   records are then durable whatever the topic's fsync policy; a cluster: nothing to do, every
   produce was answered once in the object store), then PREPARE_COMMIT is stored: the decision.
   Abort: PREPARE_ABORT is stored.
2. A marker (`wire.markers`) is written to each partition, carrying the producer's id and
   epoch, by the broker serving it (this one, or in a cluster its owner over a peer link:
   WRITE_TXN_MARKER, `marker_at_owner`), and made durable.
3. At a commit, the acknowledgements a native producer added (ADD_ACKS_TO_TXN) are acked on
   their reliable subscription as ACK_RANGES acks them, the cursors written synced (in a
   cluster by each partition's owner, over a peer link: WRITE_TXN_ACKS, `acks_at_owner`, the
   cursors then in etcd), and the offsets sent in the transaction move their groups' cursors
   (`requests.group_offsets`: a Kafka group's offsets are its subscription's cursor); at an
   abort both are dropped (the messages are delivered again once their ack timeout passes, as
   any unacked).
4. COMPLETE_* is stored (synced, so the partitions' own state writes before it are on disk too).

A server that stops anywhere in 2-4 finds PREPARE_* on start and does 2-4 again (`start`; in a
cluster the broker doing the id's duties finds it unchanged for `STALE_PREPARE_MS`): a marker for
a transaction a partition no longer has open changes nothing there, and moving a cursor to the
same offset, or acking an acknowledged offset, again changes nothing. So a transaction is all-
committed or all-aborted, never half. EndTxn is answered after step 4, so the producer's next
transaction never races its previous one's markers.

Produce asks `verify` before it appends a transactional batch: the producer's id must be a
transactional id's, at its current epoch (else INVALID_PRODUCER_EPOCH: fenced), with a
transaction in progress that added the partition (else INVALID_TXN_STATE). A batch arriving after
its transaction ended is refused rather than left open in the partition for ever.

In a cluster any broker serves any transactional id: each request first reads the id's state
again (`refresh`), and a store compares it with what was read, so two brokers never both move it.
The partition's owner checks a produce against its replica (`verify`; a miss waits for the state
to be read again, `unverified`/`catch_up`) and writes a marker only when the state says so
(`marker_at_owner`: PREPARE_* of that producer naming the partition, checked again with no await
before the append).

Every `EXPIRY_INTERVAL` the transactions past their timeout are aborted under a bumped epoch
(`Transaction.fence`), which fences their producer. A partition with a transaction open that no
coordinator state knows of (its state lost, or written by a producer fenced before its state was
stored) is aborted with a marker on start (`_abort_hanging`; in a cluster the owner does it when
it takes the partition over), so its last stable offset moves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Awaitable, Iterable
from typing import Final, Protocol

import structlog

from headwater.durables.transaction_state import (
    DEFAULT_TIMEOUT_MS,
    PendingOffset,
    Transaction,
    TxnState,
    initialized,
    merge_ranges,
    plan_store,
)
from headwater.server.catalog.bounded import bounded_gather
from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.reply import resolve
from headwater.server.requests.partition_ownership import Ownership, not_owner
from headwater.server.requests.placement import ProducerIds
from headwater.server.requests.transaction_placement import TransactionPlacement, append_marker
from headwater.server.subscriptions.reliable_subscription import ReliableSubscription
from headwater.server.topics.topic import LogPartition, LogTopic
from headwater.server.topics.transaction_index import stored_abort_starts
from headwater.storage.tasks import spawn
from headwater.wire import messages as m
from headwater.wire.errors import (
    ConcurrentTransactions,
    HeadwaterError,
    InvalidPartition,
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    InvalidRequest,
    InvalidTxnState,
    NotSupported,
    ProducerFenced,
    StorageError,
    UnknownSubscription,
    UnknownTopic,
)
from headwater.wire.limits import MAX_TRANSACTIONAL_ID
from headwater.wire.markers import Marker

log = structlog.get_logger(__name__)

EXPIRY_INTERVAL: Final = 1.0  # seconds between two looks for transactions past their timeout
# an id with no transaction in progress for this long is forgotten (Kafka's
# transactional.id.expiration.ms): its next producer starts with a new producer id
ID_EXPIRATION_MS: Final = 7 * 24 * 3600 * 1000
# transactional ids kept at most: a client that starts producers with ever new ids is refused
# past it rather than growing the server's memory and state without end
MAX_TRANSACTIONAL_IDS: Final = 100_000
# an end left in PREPARE_* this long (its broker died, or cannot reach a partition's owner) is
# completed by the broker that does the id's duties
STALE_PREPARE_MS: Final = 5_000
# seconds an end tries to write a marker to a partition between owners before it gives up
# (the end stays decided; a take-over takes a few seconds)
MARKER_PATIENCE: Final = 20.0
# markers written at a time by one end: 10,000 at once held each one's append, durability wait and
# state write alive together, and the full collections walking them stalled the loop for 6-8 s
MARKERS_AT_ONCE: Final = 256


class OffsetSink(Protocol):
    """Where a committed transaction's offsets go (`requests.group_offsets.GroupOffsets`)."""

    async def commit(
        self, group: str, topic_name: str, offsets: dict[int, int]
    ) -> dict[int, HeadwaterError | None]: ...


def _now_ms() -> int:
    return int(time.time() * 1000)


class TransactionCoordinator:
    def __init__(
        self,
        catalog: TopicCatalog,
        producer_ids: ProducerIds,
        ownership: Ownership,
        offsets: OffsetSink,
        placement: TransactionPlacement,
    ) -> None:
        """`placement`: where states are kept and markers written (the deployment's)."""
        self._placement = placement
        self._catalog = catalog
        self._producer_ids = producer_ids
        self._ownership = ownership
        self._offsets = offsets
        self._transactions: dict[str, Transaction] = {}
        self._by_producer: dict[int, str] = {}  # producer id -> its transactional id
        # one lock per id while anything holds or waits on it (weak: an idle id keeps none)
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._tasks: set[asyncio.Task[None]] = set()
        self._expiry: asyncio.Task[None] | None = None
        self.committed = 0  # transactions completed, by outcome (metrics)
        self.aborted = 0
        self.timed_out = 0

    # Start and stop

    async def start(self) -> None:
        """Load every transactional id's state; finish the ends a stop interrupted; abort what
        partitions hold open that no state knows of; start the timeout checks."""
        for txn in await self._placement.load(self._changed):
            self._remember(txn)
        if not self._placement.local_partitions:
            # a cluster: the ends a dead broker left are the duty broker's (`_expire_forever`),
            # hanging transactions the partitions' owners' (at take-over)
            self._expiry = spawn(self._expire_forever(), "transactions.expiry_failed")
            return
        for txn in list(self._transactions.values()):
            if txn.state.preparing:
                log.info(
                    "transactions.resuming_end",
                    transactional_id=txn.transactional_id,
                    state=str(txn.state),
                )
                async with self._lock(txn.transactional_id):
                    await self._complete(txn)
        await self._abort_hanging()
        self._expiry = spawn(self._expire_forever(), "transactions.expiry_failed")

    async def close(self) -> None:
        await self._placement.close()
        for task in (self._expiry, *self._tasks):
            if task is not None:
                task.cancel()
        for task in (self._expiry, *self._tasks):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    # Requests

    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int, producer_id: int = -1, epoch: int = -1
    ) -> tuple[int, int]:
        """(producer id, epoch) for a transactional producer starting (or restarting after an
        error: `producer_id` and `epoch` the ones it held, KIP-360)."""
        _check_id(transactional_id)
        if (producer_id, epoch) != (-1, -1) and (producer_id < 0 or epoch < 0):
            raise InvalidRequest(
                f"producer id {producer_id} and epoch {epoch}: both -1 (a new instance) or "
                "both the ones the producer holds"
            )
        timeout_ms = timeout_ms if timeout_ms > 0 else DEFAULT_TIMEOUT_MS
        async with self._lock(transactional_id):
            await self._placement.refresh(transactional_id)
            existing = self._transactions.get(transactional_id)
            if existing is not None and producer_id >= 0:
                held = (producer_id, epoch)
                if held not in (
                    (existing.producer_id, existing.epoch),
                    (existing.producer_id, existing.last_epoch),
                ):
                    raise ProducerFenced(
                        f"transactional id {transactional_id!r} is at producer id "
                        f"{existing.producer_id} epoch {existing.epoch}, not {producer_id}/{epoch}"
                    )
            if existing is not None and existing.state == TxnState.ONGOING:
                # a new instance: its predecessor's transaction is aborted under a bumped epoch
                # (fencing it), and this one retries once that is done
                fenced = existing.fence(_now_ms())
                await self._store(fenced)
                self._tasks.add(
                    spawn(
                        self._complete_locked(fenced),
                        "transactions.fencing_abort_failed",
                        self._tasks,
                        transactional_id=transactional_id,
                    )
                )
                raise ConcurrentTransactions(
                    f"transactional id {transactional_id!r}: aborting the transaction of the "
                    "producer this one replaces; retry"
                )
            if existing is None and len(self._transactions) >= MAX_TRANSACTIONAL_IDS:
                raise InvalidRequest(
                    f"the server keeps {MAX_TRANSACTIONAL_IDS} transactional ids at most; ids "
                    "idle for 7 days are forgotten"
                )
            new_id = -1
            if existing is None or existing.epoch >= 32_766:
                issued = await resolve(self._producer_ids.init_producer_id())
                assert isinstance(issued, m.InitProducerIdResponse)
                new_id = issued.producer_id
            txn = initialized(existing, transactional_id, timeout_ms, new_id, _now_ms())
            await self._store(txn)
            log.info(
                "transactions.producer_initialized",
                transactional_id=transactional_id,
                producer_id=txn.producer_id,
                epoch=txn.epoch,
            )
            return txn.producer_id, txn.epoch

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        partitions: Iterable[tuple[str, int]],
    ) -> None:
        """Add partitions to the transaction in progress (beginning one if none is). Each must
        be a reliable topic's partition (`UnknownTopic`, `InvalidPartition`, `NotSupported`)."""
        wanted = list(partitions)
        for topic_name, index in wanted:
            self._log_partition(topic_name, index)
        async with self._lock(transactional_id):
            txn = await self._current(transactional_id)
            changed = txn.add_partitions(producer_id, epoch, wanted, _now_ms())
            if changed.partitions != txn.partitions or changed.state != txn.state:
                await self._store(changed)

    async def add_offsets(
        self, transactional_id: str, producer_id: int, epoch: int, group: str
    ) -> None:
        """The transaction will send offsets of `group` (Kafka's AddOffsetsToTxn)."""
        async with self._lock(transactional_id):
            txn = await self._current(transactional_id)
            changed = txn.add_offsets(producer_id, epoch, group, _now_ms())
            if changed.groups != txn.groups or changed.state != txn.state:
                await self._store(changed)

    async def commit_offsets(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        offsets: Iterable[PendingOffset],
    ) -> None:
        """Offsets applied when the transaction commits (Kafka's TxnOffsetCommit)."""
        pending = list(offsets)
        for offset in pending:
            self._log_partition(offset.topic, offset.partition)
        async with self._lock(transactional_id):
            txn = await self._current(transactional_id)
            await self._store(txn.commit_offsets(producer_id, epoch, pending, _now_ms()))

    async def add_acks(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        topic_name: str,
        subscription: str,
        ranges: Iterable[m.AckRange],
        positions: Iterable[m.AckEntry] = (),
    ) -> None:
        """Acknowledgements of messages of a reliable subscription, applied when the
        transaction commits (ADD_ACKS_TO_TXN): `ranges` as ACK_RANGES acknowledges them,
        `positions` as a Kafka group's committed offsets. Begins a transaction if none is in
        progress."""
        wanted: dict[int, list[tuple[int, int]]] = {}
        for entry in ranges:
            if entry.count < 1 or entry.first_offset < 0:
                raise InvalidRequest(
                    f"an acknowledged range is 1 or more offsets from offset 0 or above, not "
                    f"{entry.count} from {entry.first_offset}"
                )
            wanted.setdefault(entry.partition, []).append(
                (entry.first_offset, entry.first_offset + entry.count)
            )
        moved: dict[int, int] = {}
        for position in positions:
            if position.offset < 0:
                raise InvalidRequest(f"a position is an offset, 0 or above, not {position.offset}")
            moved[position.partition] = position.offset
        for index in sorted(wanted.keys() | moved.keys()):
            self._log_partition(topic_name, index)
        topic = self._catalog.topics[topic_name]
        if not isinstance(topic.subscriptions.get(subscription), ReliableSubscription):
            raise UnknownSubscription(
                f"topic {topic_name!r} has no reliable subscription {subscription!r} to "
                "acknowledge messages of"
            )
        pending = [
            PendingOffset(
                subscription,
                topic_name,
                index,
                moved.get(index, -1),
                merge_ranges(wanted.get(index, ())),
            )
            for index in sorted(wanted.keys() | moved.keys())
        ]
        async with self._lock(transactional_id):
            txn = await self._current(transactional_id)
            now = _now_ms()
            added = txn.add_offsets(producer_id, epoch, subscription, now)
            await self._store(added.commit_offsets(producer_id, epoch, pending, now))

    async def end(self, transactional_id: str, producer_id: int, epoch: int, commit: bool) -> None:
        """Commit or abort the transaction in progress; answered once it is complete."""
        async with self._lock(transactional_id):
            txn = await self._current(transactional_id)
            prepared = txn.end(producer_id, epoch, commit, _now_ms())
            if prepared is None:
                return  # already so (a retry)
            if commit:
                await self._placement.make_durable(prepared.partitions)
            # the decision and its completion go on if the caller goes (a producer killed
            # mid-commit: its connection's close cancels the request); cut short, the id stayed
            # in PREPARE_* until a restart, refusing every new instance
            decided = spawn(
                self._decide(prepared),
                "transactions.end_failed",
                self._tasks,
                transactional_id=transactional_id,
            )
            try:
                await asyncio.shield(decided)
            except asyncio.CancelledError:
                # the caller went: the id's lock is kept until the decision is complete, so no
                # other request sees the id between its end's start and its stored outcome
                with contextlib.suppress(Exception):
                    await decided
                raise

    async def _decide(self, prepared: Transaction) -> None:
        await self._store(prepared)
        await self._complete(prepared)

    def unverified(self, producer_id: int, epoch: int, topic: str, partition: int) -> bool:
        """Whether `verify` would refuse now while the state may say otherwise once read again
        (a cluster's replica behind the coordinator that answered the producer): the produce
        waits for `catch_up` first."""
        if not self._placement.may_lag():
            return False
        try:
            self.verify(producer_id, epoch, topic, partition)
        except HeadwaterError:
            return True
        return False

    def catch_up(self, producer_id: int) -> Awaitable[None]:
        """Read the producer's transactional id's state again (every id's, when the producer
        id is not known here yet)."""
        return self._placement.catch_up(self._by_producer.get(producer_id))

    async def marker_at_owner(
        self, topic: str, partition: int, producer_id: int, epoch: int, commit: bool
    ) -> None:
        """WRITE_TXN_MARKER: a coordinator (any broker) asks this one, the partition's owner,
        to end a producer's transaction here. Written only when the producer's transactional
        id is deciding that end and names the partition (the state read again if the replica
        does not say so yet), checked once more with no await before the append: a late marker
        of an end completed since never lands in the producer's next transaction. Answered
        once durable; a transaction already complete is answered at once."""
        marker = Marker.COMMIT if commit else Marker.ABORT
        self._log_partition(topic, partition)

        def decided() -> bool | None:
            """True: write it; None: already complete; False: not decided."""
            tid = self._by_producer.get(producer_id)
            txn = None if tid is None else self._transactions.get(tid)
            if txn is None or txn.producer_id != producer_id or txn.epoch != epoch:
                return False
            wanted = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
            if txn.state == wanted and (topic, partition) in txn.partitions:
                return True
            done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
            return None if txn.state == done else False

        found = decided()
        if found is False:
            await self.catch_up(producer_id)
            found = decided()
        if found is None:
            return
        if found is False:
            raise InvalidTxnState(
                f"no end of producer {producer_id} epoch {epoch} is being decided for "
                f"partition {partition} of topic {topic!r}"
            )

        def check() -> None:
            if not self._ownership.serves(topic, partition):
                raise not_owner(self._ownership, topic, partition)
            if decided() is not True:
                raise InvalidTxnState(
                    f"producer {producer_id}: its transaction's end moved on before the marker"
                )

        await self._placement.marker_here(topic, partition, producer_id, epoch, marker, check)

    async def acks_at_owner(self, request: m.WriteTxnAcksRequest) -> None:
        """WRITE_TXN_ACKS: a coordinator (any broker) asks this one, the partition's owner, to
        apply what a committed transaction acknowledges there (the placement checks the
        state and applies it: `TransactionPlacement.acks_here`)."""
        self._log_partition(request.topic, request.partition)
        await self._placement.acks_here(request)

    def verify(self, producer_id: int, epoch: int, topic: str, partition: int) -> None:
        """Raise unless a transactional batch of this producer may be appended to the partition
        now (the module doc)."""
        transactional_id = self._by_producer.get(producer_id)
        txn = None if transactional_id is None else self._transactions.get(transactional_id)
        if txn is None:
            raise InvalidTxnState(
                f"producer id {producer_id} has no transactional id: initialise the producer "
                "with one before it writes transactional batches"
            )
        if epoch != txn.epoch:
            raise InvalidProducerEpoch(
                f"producer {producer_id}: epoch {epoch}, the transactional id is at {txn.epoch}"
            )
        if txn.state != TxnState.ONGOING or (topic, partition) not in txn.partitions:
            raise InvalidTxnState(
                f"producer {producer_id}: partition {partition} of topic {topic!r} is not in "
                "a transaction in progress (add it to the transaction first)"
            )

    def transactions(self) -> list[Transaction]:
        """Every transactional id's state (for listing and describing)."""
        return [self._transactions[t] for t in sorted(self._transactions)]

    def get(self, transactional_id: str) -> Transaction | None:
        return self._transactions.get(transactional_id)

    # Internals

    def _get(self, transactional_id: str) -> Transaction:
        txn = self._transactions.get(transactional_id)
        if txn is None:
            raise InvalidProducerIdMapping(
                f"transactional id {transactional_id!r} was never initialised here "
                "(init the producer first)"
            )
        return txn

    async def _current(self, transactional_id: str) -> Transaction:
        """The id's state as stored now (read again where the copy may lag)."""
        await self._placement.refresh(transactional_id)
        return self._get(transactional_id)

    def _changed(self, transactional_id: str, txn: Transaction | None) -> None:
        """Another broker changed the id's state (a cluster's replica)."""
        if txn is not None:
            self._remember(txn)
            return
        gone = self._transactions.pop(transactional_id, None)
        if gone is not None and self._by_producer.get(gone.producer_id) == transactional_id:
            del self._by_producer[gone.producer_id]

    def _lock(self, transactional_id: str) -> asyncio.Lock:
        lock = self._locks.get(transactional_id)
        if lock is None:
            lock = self._locks[transactional_id] = asyncio.Lock()
        return lock

    def _remember(self, txn: Transaction) -> None:
        previous = self._transactions.get(txn.transactional_id)
        if previous is not None and previous.producer_id != txn.producer_id:
            self._by_producer.pop(previous.producer_id, None)
        self._transactions[txn.transactional_id] = txn
        self._by_producer[txn.producer_id] = txn.transactional_id

    async def _store(self, txn: Transaction) -> None:
        """Stored (durably) before anything is answered or done on it: what changed since the
        stored state (`plan_store`: the partitions added, not the whole transaction again)."""
        stored, change = plan_store(self._transactions.get(txn.transactional_id), txn)
        await self._placement.store(stored, change)
        self._remember(stored)

    def _log_partition(self, topic_name: str, index: int) -> tuple[LogTopic, LogPartition]:
        topic = self._catalog.topics.get(topic_name)
        if topic is None:
            raise UnknownTopic(f"topic {topic_name!r} does not exist")
        if not topic.reliable:
            raise NotSupported(
                f"topic {topic_name!r} is non-reliable: transactions write reliable topics only"
            )
        if not 0 <= index < len(topic.partitions):
            raise InvalidPartition(f"topic {topic_name!r} has no partition {index}")
        return topic, topic.partitions[index]

    async def _complete_locked(self, txn: Transaction) -> None:
        async with self._lock(txn.transactional_id):
            current = self._transactions.get(txn.transactional_id)
            if current is not None and current.state.preparing:
                await self._complete(current)

    async def _complete(self, txn: Transaction) -> None:
        """Steps 2-4 of the module doc, for a stored PREPARE_*."""
        commit = txn.state == TxnState.PREPARE_COMMIT
        marker = Marker.COMMIT if commit else Marker.ABORT
        waits = [
            self._write_marker(topic, index, txn.producer_id, txn.epoch, commit)
            for topic, index in sorted(txn.partitions)
        ]
        if waits:
            try:
                await bounded_gather(waits, MARKERS_AT_ONCE)
            except InvalidTxnState:
                # an owner saw the end already complete and the producer's next transaction
                # begun: another broker completed it (a cluster's duty broker, say)
                await self._placement.refresh(txn.transactional_id)
                current = self._transactions.get(txn.transactional_id)
                if current is not None and (current.state, current.epoch, current.started_ms) == (
                    txn.state,
                    txn.epoch,
                    txn.started_ms,
                ):
                    raise  # still this end's to complete: the refusal stands
                log.info("transactions.completed_elsewhere", transactional_id=txn.transactional_id)
                return
        if commit:
            await self._placement.apply_acks(txn)  # (in a cluster, by each partition's owner)
            await self._apply_offsets(txn.offsets)
        await self._store(txn.completed(_now_ms()))
        if commit:
            self.committed += 1
        else:
            self.aborted += 1
        log.debug(
            "transactions.completed",
            transactional_id=txn.transactional_id,
            outcome=marker.name.lower(),
            partitions=len(txn.partitions),
            offsets=len(txn.offsets),
        )

    async def _write_marker(
        self, topic_name: str, index: int, producer_id: int, epoch: int, commit: bool
    ) -> None:
        """The marker written by the partition's owner: here (`marker_at_owner`), or asked of
        it (a cluster). A partition between owners, or an owner that does not answer, is tried
        again with doubling delays for `MARKER_PATIENCE` seconds, then STORAGE_ERROR: the end
        stays decided, and is completed later (a retry of the end, or the duty broker)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + MARKER_PATIENCE
        delay = 0.05
        marker = Marker.COMMIT if commit else Marker.ABORT
        while True:
            topic = self._catalog.topics.get(topic_name)
            if not isinstance(topic, LogTopic) or index >= len(topic.partitions):
                return  # deleted meanwhile: no partition left to end the transaction in
            try:
                if self._ownership.serves(topic_name, index):
                    await self.marker_at_owner(topic_name, index, producer_id, epoch, commit)
                else:
                    await self._placement.marker_elsewhere(
                        topic_name, index, producer_id, epoch, marker
                    )
                return
            except (UnknownTopic, InvalidPartition):
                return  # deleted at its owner
            except HeadwaterError as exc:
                if not exc.retriable or loop.time() + delay > deadline:
                    if exc.retriable:
                        raise StorageError(
                            f"the {marker.name.lower()} marker of producer {producer_id} could "
                            f"not be written to partition {index} of topic {topic_name!r} in "
                            f"{MARKER_PATIENCE:g} s ({exc}); the end is decided and will be "
                            "completed"
                        ) from None
                    raise
                log.info(
                    "transactions.marker_retry",
                    topic=topic_name,
                    partition=index,
                    producer_id=producer_id,
                    error=str(exc),
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _apply_offsets(self, offsets: Iterable[PendingOffset]) -> None:
        """A committed transaction's positions applied (its acknowledgements are the
        placement's: `apply_acks`)."""
        by_subscription: dict[tuple[str, str], dict[int, int]] = {}
        for offset in offsets:
            where = (offset.group, offset.topic)
            if offset.offset >= 0:
                by_subscription.setdefault(where, {})[offset.partition] = offset.offset
        for (group, topic_name), positions in by_subscription.items():
            if topic_name not in self._catalog.topics:
                continue  # deleted meanwhile
            results = await self._offsets.commit(group, topic_name, positions)
            for partition, error in results.items():
                if error is not None:
                    log.error(
                        "transactions.offset_not_applied",
                        group=group,
                        topic=topic_name,
                        partition=partition,
                        error=str(error),
                    )

    async def _abort_hanging(self) -> None:
        """Transactions open in a partition that no coordinator state has in progress there."""
        in_progress = {
            (txn.producer_id, topic, index)
            for txn in self._transactions.values()
            if txn.state == TxnState.ONGOING
            for topic, index in txn.partitions
        }
        for topic in list(self._catalog.topics.values()):
            if not topic.reliable:
                continue
            for partition in topic.partitions:
                for producer_id in list(partition.transactions.open):
                    if (producer_id, topic.name, partition.index) in in_progress:
                        continue
                    entry = partition.producers.producers.get(producer_id)
                    epoch = entry.epoch if entry is not None else 0
                    first = partition.transactions.open[producer_id]
                    marker = self._hanging_end(producer_id, epoch, topic.name, partition, first)
                    log.warning(
                        "transactions.hanging_aborted"
                        if marker == Marker.ABORT
                        else "transactions.hanging_committed",
                        topic=topic.name,
                        partition=partition.index,
                        producer_id=producer_id,
                        first_offset=first,
                    )
                    try:
                        await append_marker(
                            self._catalog,
                            topic.name,
                            partition.index,
                            producer_id,
                            epoch,
                            marker,
                        )
                    except HeadwaterError as exc:
                        log.error(
                            "transactions.hanging_abort_failed",
                            topic=topic.name,
                            partition=partition.index,
                            error=str(exc),
                        )

    def _hanging_end(
        self, producer_id: int, epoch: int, topic: str, partition: LogPartition, first: int
    ) -> Marker:
        """The marker a hanging transaction gets: COMMIT when its producer's last end at that
        epoch was a commit and no aborted range of its own starts where it opens (the commit's
        marker there was lost: a damaged batch, quarantined or cut at start; aborting it made
        the commit half, its other partitions committed), otherwise ABORT. An earlier
        transaction of the same epoch that was aborted had its range stored when its marker was
        written (kept in the store even when the WAL lost that marker), so it is told apart; a
        fenced one has an older epoch than its id's."""
        tid = self._by_producer.get(producer_id)
        txn = None if tid is None else self._transactions.get(tid)
        if (
            txn is None
            or (txn.producer_id, txn.epoch) != (producer_id, epoch)
            or txn.state != TxnState.COMPLETE_COMMIT
        ):
            return Marker.ABORT
        overlapping = partition.transactions.aborted_overlapping(first, first + 1)
        if any(r.producer_id == producer_id for r in overlapping) or first in stored_abort_starts(
            self._catalog.state, topic, partition.index, producer_id
        ):
            return Marker.ABORT
        return Marker.COMMIT

    async def _expire_forever(self) -> None:
        while True:
            await asyncio.sleep(EXPIRY_INTERVAL)
            try:
                await self._duties()
            except HeadwaterError as exc:  # (etcd away, say) the next round tries again
                log.warning("transactions.duties_failed", error=str(exc))

    async def _duties(self) -> None:
        """The ids this broker looks after (`TransactionPlacement.duties`): the idle ones
        forgotten, the transactions past their timeout aborted, the ends left in PREPARE_* for
        `STALE_PREPARE_MS` completed (a cluster: the broker that decided them died)."""
        await self._forget_idle(_now_ms())
        now = _now_ms()
        due = [
            t
            for t in self._transactions.values()
            if (t.expired(now) or (t.state.preparing and now - t.updated_ms > STALE_PREPARE_MS))
            and self._placement.duties(t.transactional_id)
        ]
        for txn in due:
            async with self._lock(txn.transactional_id):
                await self._placement.refresh(txn.transactional_id)
                current = self._transactions.get(txn.transactional_id)
                now = _now_ms()
                if current is None:
                    continue
                try:
                    if current.expired(now):
                        log.info(
                            "transactions.timed_out",
                            transactional_id=current.transactional_id,
                            producer_id=current.producer_id,
                            timeout_ms=current.timeout_ms,
                        )
                        fenced = current.fence(now)
                        await self._store(fenced)
                        await self._complete(fenced)
                        self.timed_out += 1
                    elif current.state.preparing and now - current.updated_ms > STALE_PREPARE_MS:
                        log.info(
                            "transactions.resuming_end",
                            transactional_id=current.transactional_id,
                            state=str(current.state),
                        )
                        await self._complete(current)
                except HeadwaterError as exc:
                    log.error(
                        "transactions.duty_failed",
                        transactional_id=current.transactional_id,
                        error=str(exc),
                    )

    async def _forget_idle(self, now_ms: int) -> None:
        """Drop the ids idle for `ID_EXPIRATION_MS` (from memory and where they are stored)."""
        idle = [
            t
            for t in self._transactions.values()
            if t.state.idle
            and now_ms - t.updated_ms > ID_EXPIRATION_MS
            and self._placement.duties(t.transactional_id)
        ]
        for txn in idle:
            async with self._lock(txn.transactional_id):
                current = self._transactions.get(txn.transactional_id)
                if current is None or current != txn:
                    continue  # used meanwhile
                await self._placement.delete(txn)
                self._changed(txn.transactional_id, None)


def _check_id(transactional_id: str) -> None:
    if not transactional_id or len(transactional_id) > MAX_TRANSACTIONAL_ID:
        raise InvalidRequest(
            f"a transactional id is 1..{MAX_TRANSACTIONAL_ID} characters, "
            f"not {len(transactional_id)}"
        )
