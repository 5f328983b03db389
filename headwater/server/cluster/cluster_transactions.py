"""Transactions in a cluster: the `requests.transaction_placement.TransactionPlacement` of a
cluster broker, and what a partition's owner keeps of its transactions for the next owner.

**State in etcd.** A transactional id's state is `<prefix>/txn/<id>` (`Transaction.encode`),
written by a transaction comparing the key's mod_revision with the one this broker last saw (its
absence for a new id): of two brokers acting on the same id, one store fails, which is
CONCURRENT_TRANSACTIONS (retriable) after the key is read again. A large transaction's partitions
are chunks beside it (`<prefix>/txnpart/<id in hex>/<n>`, `durables.transaction_state`, "Stored
form"), written and dropped in the same etcd transaction as the head; a head counting chunks is
read with them in one etcd transaction (a snapshot), only the chunks the replica lacks. Every
broker keeps a replica of the whole prefix (a `PrefixWatch`; each id's copy only ever replaced by
a newer mod_revision), which the coordinator mirrors with a producer id -> transactional id
index. Any broker serves any id: each request reads its key again first (`refresh`, one etcd
read), so a copy behind another broker's store is never acted on, and its lock per id serialises
the requests it serves.

**Markers by each partition's owner.** `marker_elsewhere` asks the owner over a peer link
(WRITE_TXN_MARKER); the owner (`TransactionCoordinator.marker_at_owner`) writes it only when the
id's state decided that end naming the partition, and answers once it is in the object store
(`marker_here`). A commit makes nothing durable first: every produce was answered once its batch
was in the object store.

**Acknowledgements by each partition's owner.** A committed transaction's acknowledgements of a
native subscription's messages (ADD_ACKS_TO_TXN `ranges`) move cursors that only a partition's
owner holds. After the markers, `apply_acks` asks each owner (itself, or over a peer link:
WRITE_TXN_ACKS) to apply them; the owner (`acks_here`) reads what to ack from the id's state,
not from the request, and only from a PREPARE_COMMIT of that producer id and epoch (read again
from etcd when its replica does not show it; COMPLETE_COMMIT: done already), acks them (also
what its cursor never dispatched: the previous owner delivered it), writes the partition's
cursor checkpoints to etcd (`ClusterPartitions.checkpoint_now`) and answers only if it still
serves the partition after that write: a new owner's take-over, which reads the checkpoints,
comes after the old owner's serving deadline, so it finds the acks. A checkpoint another broker
wrote meanwhile (a Kafka group's commit) is taken and the acks applied over it again. Acking
what is acked changes nothing, so an end completed again after a kill -9 (of the broker ending
it, or of the owner) repeats this safely; COMPLETE_COMMIT is stored only once every owner
answered.

**Aborted ranges for the next owner.** After an abort marker is in the object store, and before
the owner answers, it stores one empty object per aborted range, everything in its name:
`<topic>/<partition>/txn-aborted/<marker offset, 20 digits>-<producer id>-<first offset>-<epoch>`
(`keep_aborted`). So a COMPLETE_ABORT state (stored after every marker was answered) implies the
object. A new owner lists them as it takes the partition over (`aborted`: one LIST, beside the
claim), ignoring those of an earlier incarnation of the topic and deleting those below the
partition's start (retention took their batches). Its open transactions are the ones the replica
has in progress naming the partition (`in_progress`), found in the log by the producer rebuild's
scan (`server.cluster.cluster_partitions`).

**Duties.** The broker first in the rendezvous order of the live brokers for an id
(`layout.rendezvous`) aborts its transactions past their timeout and completes an end another
broker left in PREPARE_* (`TransactionCoordinator._duties`); a broker dying moves them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final, Protocol

import structlog

from headwater.durables.partition_transactions import AbortedRange
from headwater.durables.transaction_state import (
    StoredChange,
    Transaction,
    TxnState,
    chunk_count,
)
from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.cluster.etcd import Entry, EtcdUnavailable, PrefixWatch
from headwater.server.cluster.layout import Layout, rendezvous
from headwater.server.cluster.peer_links import PeerLinks
from headwater.server.requests.partition_ownership import Ownership, not_owner
from headwater.server.requests.transaction_placement import (
    Changed,
    acknowledge,
    acks_by_subscription,
    append_marker,
)
from headwater.server.topics.topic import LogTopic
from headwater.storage.objectstore import ObjectStore
from headwater.wire import messages as m
from headwater.wire.errors import (
    ConcurrentTransactions,
    HeadwaterError,
    InvalidPartition,
    InvalidTxnState,
    StorageError,
    UnknownTopic,
)
from headwater.wire.markers import Marker

log = structlog.get_logger(__name__)

ABORTED_DIR: Final = "txn-aborted"
# seconds a marker waits at most for its partition's transactions to be rebuilt after a take-over
REBUILD_WAIT: Final = 30.0
# seconds `load` waits at most for the replica's first read
LOAD_WAIT: Final = 30.0
LOAD_ATTEMPTS: Final = 5  # reads of the states at start (doubling delays from 0.2 s)
HANGING_ATTEMPTS: Final = 30  # tries to abort a hanging transaction (doubling delays up to 2 s)
# seconds a committed transaction's acknowledgements are tried at a partition between owners
# (or whose owner does not answer) before the end gives up for now (it stays decided, and is
# completed later), as its markers are
ACKS_PATIENCE: Final = 20.0
ACKS_ATTEMPTS: Final = 5  # applications at an owner while other brokers' checkpoints land


class Cluster(Ownership, Protocol):
    """What this module asks of the etcd coordinator (`server.cluster.coordinator`)."""

    @property
    def layout(self) -> Layout: ...

    def epoch(self, topic: str, partition: int) -> int | None: ...

    def incarnation(self, name: str) -> int: ...

    async def call_etcd(self, operation: Callable[[Any], Awaitable[Any]]) -> Any: ...

    def watch(
        self, kind: str, on_change: Callable[[bytes, Entry | None], Awaitable[None]]
    ) -> PrefixWatch: ...


def aborted_prefix(topic: str, partition: int) -> str:
    return f"{topic}/{partition}/{ABORTED_DIR}/"


def aborted_key(topic: str, partition: int, aborted: AbortedRange, epoch: int) -> str:
    return (
        f"{aborted_prefix(topic, partition)}{aborted.last_offset:020d}-{aborted.producer_id}-"
        f"{aborted.first_offset}-{epoch}"
    )


def parse_aborted(name: str) -> tuple[AbortedRange, int] | None:
    """(range, epoch) of an aborted-range object's name (its last part); None for another."""
    parts = name.rsplit("/", 1)[-1].split("-")
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        return None
    last, producer, first, epoch = (int(p) for p in parts)
    return AbortedRange(producer, first, last), epoch


class ClusterTransactions:
    def __init__(
        self,
        cluster: Cluster,
        peers: PeerLinks,
        store: ObjectStore,
        catalog: TopicCatalog,
        checkpoint: Callable[[str, int], Awaitable[bool]],
    ) -> None:
        """`checkpoint`: a partition's changed cursors written to etcd now, and whether one
        took another broker's checkpoint instead (`ClusterPartitions.checkpoint_now`)."""
        self._checkpoint = checkpoint
        self._cluster = cluster
        self._peers = peers
        self._store = store
        self._catalog = catalog
        # transactional id -> (its state, the mod_revision it was stored at)
        self.states: dict[str, tuple[Transaction, int]] = {}
        self._changed: Changed | None = None
        self._watch: PrefixWatch | None = None
        self.loaded = asyncio.Event()
        self._reading: asyncio.Task[None] | None = None

    # The replica

    async def start(self) -> None:
        """Read the prefix and watch it (after the coordinator's start)."""
        self._watch = self._cluster.watch("txn", self._on_change)
        delay = 0.2
        for attempt in range(LOAD_ATTEMPTS):
            try:
                await self._watch.load()
                break
            except EtcdUnavailable as exc:  # (the coordinator has just reached it: a blip)
                if attempt + 1 == LOAD_ATTEMPTS:
                    raise StorageError(f"cannot read the transactions' states: {exc}") from None
                await asyncio.sleep(delay)
                delay *= 2
        self._watch.start()
        self.loaded.set()

    async def load(self, changed: Changed) -> list[Transaction]:
        try:
            async with asyncio.timeout(LOAD_WAIT):
                await self.loaded.wait()
        except TimeoutError:
            raise StorageError("the transactions' states were not read from etcd") from None
        self._changed = changed
        return [txn for txn, _ in self.states.values()]

    async def close(self) -> None:
        if self._watch is not None:
            await self._watch.stop()
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(BaseException):
                await self._reading

    async def _on_change(self, key: bytes, entry: Entry | None) -> None:
        transactional_id = self._cluster.layout.name_in("txn", key)
        if entry is None:
            self._apply(transactional_id, None, 0)
        else:
            await self._apply_entry(transactional_id, entry.value, entry.mod_revision)

    async def _apply_entry(self, transactional_id: str, value: bytes, revision: int) -> None:
        """A head read at `revision`; one counting chunks is read again with them."""
        known = self.states.get(transactional_id)
        if known is not None and known[1] >= revision:
            return
        try:
            if chunk_count(value):
                await self._read(transactional_id)
                return
            txn = Transaction.decode(value)
        except (ValueError, KeyError, TypeError) as exc:
            log.error(
                "transactions.state_unreadable", transactional_id=transactional_id, error=str(exc)
            )
            return
        self._apply(transactional_id, txn, revision)

    async def _read(self, transactional_id: str) -> None:
        """The id's head and the chunks the replica lacks, in one etcd transaction; all of
        them again when the ones it has are another transaction's."""
        from aetcd.utils import prefix_range_end

        layout = self._cluster.layout
        head_key = layout.transaction(transactional_id)
        parts = layout.transaction_parts(transactional_id)
        known = self.states.get(transactional_id)
        earlier = known[0] if known is not None and known[0].chunks else None
        for _ in range(2):
            start = layout.transaction_part(transactional_id, earlier.chunks if earlier else 0)

            def snapshot(c: Any, start: bytes = start) -> Any:
                return c.transaction(
                    compare=[],
                    success=[
                        c.transactions.get(head_key),
                        c.transactions.get(start, prefix_range_end(parts)),
                    ],
                    failure=[],
                )

            _, (head, chunks) = await self._cluster.call_etcd(snapshot)
            if not head:
                self._apply(transactional_id, None, 0)
                return
            value, meta = head[0]
            try:
                txn = Transaction.decode(bytes(value), (bytes(v) for v, _ in chunks), earlier)
            except ValueError:
                if earlier is None:
                    raise
                earlier = None  # another transaction's chunks: read them all
                continue
            self._apply(transactional_id, txn, int(meta.mod_revision))
            return

    def _apply(self, transactional_id: str, txn: Transaction | None, revision: int) -> None:
        """The id's state as read at `revision` (None: deleted), unless the copy is newer."""
        known = self.states.get(transactional_id)
        if txn is None:
            if known is None:
                return
            del self.states[transactional_id]
        else:
            if known is not None and known[1] >= revision:
                return
            self.states[transactional_id] = (txn, revision)
        if self._changed is not None:
            self._changed(transactional_id, txn)

    # TransactionPlacement: states

    async def store(self, txn: Transaction, change: StoredChange) -> None:
        from aetcd.utils import prefix_range_end

        layout = self._cluster.layout
        key = layout.transaction(txn.transactional_id)
        known = self.states.get(txn.transactional_id)
        expected = known[1] if known is not None else 0

        def transaction(c: Any) -> Any:
            compare = (
                c.transactions.mod(key) == expected
                if expected
                else c.transactions.version(key) == 0
            )
            writes = [c.transactions.put(key, change.head)]
            if change.chunk is not None:
                number, chunk = change.chunk
                writes.append(
                    c.transactions.put(layout.transaction_part(txn.transactional_id, number), chunk)
                )
            if change.dropped:
                parts = layout.transaction_parts(txn.transactional_id)
                writes.append(c.transactions.delete(parts, prefix_range_end(parts)))
            return c.transaction(
                compare=[compare],
                success=[*writes, c.transactions.get(key)],
                failure=[c.transactions.get(key)],
            )

        won, responses = await self._cluster.call_etcd(transaction)
        found = responses[-1]  # the key as it is now: [(value, Get)], or [] when absent
        if won:
            self.states[txn.transactional_id] = (txn, int(found[0][1].mod_revision))
            return
        if found:
            await self._apply_entry(
                txn.transactional_id, bytes(found[0][0]), int(found[0][1].mod_revision)
            )
        else:
            self._apply(txn.transactional_id, None, 0)
        raise ConcurrentTransactions(
            f"transactional id {txn.transactional_id!r} was changed through another broker "
            "meanwhile; retry"
        )

    async def delete(self, txn: Transaction) -> None:
        key = self._cluster.layout.transaction(txn.transactional_id)
        known = self.states.get(txn.transactional_id)
        if known is None:
            return
        expected = known[1]

        def transaction(c: Any) -> Any:
            return c.transaction(
                compare=[c.transactions.mod(key) == expected],
                success=[c.transactions.delete(key)],
                failure=[],
            )

        won, _ = await self._cluster.call_etcd(transaction)
        if won:
            self.states.pop(txn.transactional_id, None)

    async def refresh(self, transactional_id: str) -> None:
        key = self._cluster.layout.transaction(transactional_id)
        found = await self._cluster.call_etcd(lambda c: c.get(key))
        if found is None:
            self._apply(transactional_id, None, 0)
        else:
            await self._apply_entry(transactional_id, bytes(found.value), int(found.mod_revision))

    def may_lag(self) -> bool:
        return True

    def catch_up(self, transactional_id: str | None) -> Awaitable[None]:
        if transactional_id is not None:
            return self.refresh(transactional_id)
        # a producer id not known here yet: its init was stored through another broker and
        # the watch has not shown it; every id read again, one read shared by every waiter
        if self._reading is None or self._reading.done():
            self._reading = asyncio.get_running_loop().create_task(self._read_all())
        return asyncio.shield(self._reading)

    async def _read_all(self) -> None:
        root = self._cluster.layout.root("txn")
        answer = await self._cluster.call_etcd(lambda c: c.get_prefix(root))
        for kv in answer:
            name = self._cluster.layout.name_in("txn", bytes(kv.key))
            await self._apply_entry(name, bytes(kv.value), int(kv.mod_revision))

    def duties(self, transactional_id: str) -> bool:
        live = [b.broker_id for b in self._cluster.brokers()]
        this = self._cluster.this_broker.broker_id
        return bool(live) and rendezvous(live, transactional_id, -1)[0] == this

    @property
    def local_partitions(self) -> bool:
        return False

    # TransactionPlacement: markers

    async def make_durable(self, partitions: Iterable[tuple[str, int]]) -> None:
        return None  # every produce was answered once in the object store

    async def marker_here(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        epoch: int,
        marker: Marker,
        check: Callable[[], None],
    ) -> None:
        found = self._catalog.topics.get(topic)
        if not isinstance(found, LogTopic) or partition >= len(found.partitions):
            return
        ready = found.partitions[partition].producers_ready
        if ready is not None and not ready.done():
            # a take-over's rebuild of the partition's transactions: a marker before it is
            # done would not find the transaction open, and leave it open for ever
            try:
                async with asyncio.timeout(REBUILD_WAIT):
                    await asyncio.shield(ready)
            except TimeoutError:
                raise StorageError(
                    f"{topic}/{partition}: the transactions are not rebuilt yet"
                ) from None
        written = await append_marker(
            self._catalog, topic, partition, producer_id, epoch, marker, check
        )
        log.debug(
            "transactions.marker_written",
            topic=topic,
            partition=partition,
            producer_id=producer_id,
            marker=marker.name,
            aborted=None if written is None else str(written[1]),
        )
        if written is not None and written[1] is not None:
            await self.keep_aborted(topic, partition, written[1])

    async def marker_elsewhere(
        self, topic: str, partition: int, producer_id: int, epoch: int, marker: Marker
    ) -> None:
        owner = self._cluster.owner(topic, partition)
        if owner is None or owner == self._cluster.this_broker:
            raise not_owner(self._cluster, topic, partition)
        request = m.WriteTxnMarkerRequest(
            topic, partition, producer_id, epoch, marker == Marker.COMMIT
        )
        await self._peers.write_marker(owner, request)

    # TransactionPlacement: acknowledgements

    async def apply_acks(self, txn: Transaction) -> None:
        where = sorted({(o.topic, o.partition) for o in txn.offsets if o.acks})
        if where:
            await asyncio.gather(*(self._acks_at_owner(txn, t, p) for t, p in where))

    async def _acks_at_owner(self, txn: Transaction, topic: str, partition: int) -> None:
        """WRITE_TXN_ACKS at the partition's owner (this broker, or over a peer link), tried
        again with doubling delays for `ACKS_PATIENCE` seconds while the partition is between
        owners or its owner does not answer; then STORAGE_ERROR (the end stays decided)."""
        request = m.WriteTxnAcksRequest(
            txn.transactional_id, txn.producer_id, txn.epoch, topic, partition
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ACKS_PATIENCE
        delay = 0.05
        while True:
            try:
                owner = self._cluster.owner(topic, partition)
                if self._cluster.serves(topic, partition):
                    await self.acks_here(request)
                elif owner is None or owner == self._cluster.this_broker:
                    raise not_owner(self._cluster, topic, partition)
                else:
                    await self._peers.write_acks(owner, request)
                return
            except (UnknownTopic, InvalidPartition):
                return  # deleted meanwhile: nothing left to acknowledge there
            except InvalidTxnState:
                # the owner saw no such commit being decided: another broker completed it
                # (the duty broker, say), unless the state still holds this very end
                await self.refresh(txn.transactional_id)
                known = self.states.get(txn.transactional_id)
                if known is not None and known[0] == txn:
                    raise
                log.info("transactions.acks_completed_elsewhere", topic=topic, partition=partition)
                return
            except HeadwaterError as exc:
                if not exc.retriable or loop.time() + delay > deadline:
                    if exc.retriable:
                        raise StorageError(
                            f"the acknowledgements of producer {txn.producer_id} could not be "
                            f"applied to partition {partition} of topic {topic!r} in "
                            f"{ACKS_PATIENCE:g} s ({exc}); the commit is decided and will be "
                            "completed"
                        ) from None
                    raise
                log.info(
                    "transactions.acks_retry",
                    topic=topic,
                    partition=partition,
                    producer_id=txn.producer_id,
                    error=str(exc),
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def acks_here(self, request: m.WriteTxnAcksRequest) -> None:
        """The owner's part of `apply_acks` (the module doc)."""
        tid, topic, partition = request.transactional_id, request.topic, request.partition

        def current() -> Transaction | None:
            known = self.states.get(tid)
            txn = None if known is None else known[0]
            held = (request.producer_id, request.producer_epoch)
            return txn if txn is not None and (txn.producer_id, txn.epoch) == held else None

        txn = current()
        ending = (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT)
        if txn is None or txn.state not in ending:
            await self.refresh(tid)
            txn = current()
        if txn is not None and txn.state == TxnState.COMPLETE_COMMIT:
            return  # applied before the commit was stored complete
        if txn is None or txn.state != TxnState.PREPARE_COMMIT:
            raise InvalidTxnState(
                f"no commit of producer {request.producer_id} epoch {request.producer_epoch} "
                f"of transactional id {tid!r} is being decided"
            )
        acks = acks_by_subscription(txn, (topic, partition))
        for _ in range(ACKS_ATTEMPTS):
            if not self._cluster.serves(topic, partition):
                raise not_owner(self._cluster, topic, partition)
            for (subscription, _), ranges in acks.items():
                await acknowledge(self._catalog, subscription, topic, ranges)
            adopted = await self._checkpoint(topic, partition)
            if not self._cluster.serves(topic, partition):
                # the write may have landed after a new owner read the checkpoints: it asks
                # that owner instead
                raise not_owner(self._cluster, topic, partition)
            if not adopted:
                log.debug(
                    "transactions.acks_applied",
                    transactional_id=tid,
                    topic=topic,
                    partition=partition,
                    ranges=sum(len(r) for r in acks.values()),
                )
                return
        raise StorageError(
            f"{topic}/{partition}: other brokers' checkpoints kept replacing the cursors the "
            "transaction's acknowledgements were applied to; retry"
        )

    # The owner's part

    async def keep_aborted(self, topic: str, partition: int, aborted: AbortedRange) -> None:
        """The aborted range's object, once its marker is in the object store."""
        epoch = self._cluster.epoch(topic, partition) or 0
        await self._store.put(aborted_key(topic, partition, aborted, epoch), b"")

    async def aborted(
        self, topic: str, partition: int, since: int
    ) -> list[tuple[AbortedRange, str]]:
        """The partition's aborted ranges as its previous owners kept them, each with its
        object's key: those of this incarnation of the topic (`since`), in marker order."""
        found: list[tuple[AbortedRange, str]] = []
        for info in await self._store.list(aborted_prefix(topic, partition)):
            parsed = parse_aborted(info.key)
            if parsed is not None and parsed[1] >= since:  # (older: a deleted topic's)
                found.append((parsed[0], info.key))
        return sorted(found, key=lambda kept: kept[0].last_offset)

    async def purge(self, topic: str, before: int) -> int:
        """Delete a deleted topic's aborted-range objects: those of epochs below `before` (a
        topic re-created under the name meanwhile keeps its own); how many went."""
        gone = [
            info.key
            for info in await self._store.list(f"{topic}/")
            if info.key.split("/")[2:3] == [ABORTED_DIR]
            and (parsed := parse_aborted(info.key)) is not None
            and parsed[1] < before
        ]
        for key in gone:
            await self._store.delete(key)
        return len(gone)

    async def forget(self, keys: list[str]) -> None:
        """Delete aborted-range objects below a partition's start (retention took their
        batches); one that fails is left for the next take-over."""
        for key in keys:
            with contextlib.suppress(HeadwaterError, OSError):
                await self._store.delete(key)

    async def abort_hanging(self, topic: str, partition: int, producer_id: int) -> None:
        """A transaction a take-over found open in the partition with no state in progress
        naming it (written by a producer fenced before its state was stored, say): unless the
        state read again says otherwise, ended with an ABORT marker so the LSO moves on. Tried
        again with doubling delays while the partition is served here (bounded)."""
        delay = 0.1
        for _ in range(HANGING_ATTEMPTS):
            if not self._cluster.serves(topic, partition):
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            try:
                for transactional_id, (txn, _) in list(self.states.items()):
                    if txn.producer_id == producer_id:
                        await self.refresh(transactional_id)
                if producer_id in self.in_progress(topic, partition):
                    return  # its state was behind: the transaction goes on
                found = self._catalog.topics.get(topic)
                if not isinstance(found, LogTopic) or partition >= len(found.partitions):
                    return
                holder = found.partitions[partition]
                if producer_id not in holder.transactions.open:
                    return
                entry = holder.producers.producers.get(producer_id)
                epoch = entry.epoch if entry is not None else 0

                def check() -> None:
                    if not self._cluster.serves(topic, partition):
                        raise not_owner(self._cluster, topic, partition)

                await self.marker_here(topic, partition, producer_id, epoch, Marker.ABORT, check)
                return
            except HeadwaterError as exc:
                log.warning(
                    "transactions.hanging_abort_failed",
                    topic=topic,
                    partition=partition,
                    producer_id=producer_id,
                    error=str(exc),
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    def in_progress(self, topic: str, partition: int) -> dict[int, Transaction]:
        """Producer id -> its transactional id's state, for the transactions in progress (or
        being ended) that name the partition, as the replica has them."""
        return {
            txn.producer_id: txn
            for txn, _ in self.states.values()
            if (txn.state == TxnState.ONGOING or txn.state.preparing)
            and (topic, partition) in txn.partitions
        }
