"""Where the transaction coordinator keeps its state and how it ends a transaction in a
partition: the deployment's part of `requests.transaction_coordinator`, a constructor argument.

The coordinator's logic (locks per id, the state machine, the order of an end) is the same on one
broker and in a cluster; what differs is behind `TransactionPlacement`:

- where a transactional id's state is stored, and whether the copy in memory may lag (one
  broker: the state store, its copy the truth; a cluster: etcd, every broker a replica that
  `refresh` brings up to date before a request acts on it, and a lost race on a store is
  CONCURRENT_TRANSACTIONS);
- how a marker reaches a partition (one broker: appended here; a cluster: by the partition's
  owner, asked over a peer link);
- what a commit makes durable first (one broker: an fsync of the partitions; a cluster: nothing,
  every produce was answered once in the object store);
- how a committed transaction's acknowledgements of a native subscription's messages are
  applied (one broker: here; a cluster: by each partition's owner, which holds the cursors);
- which broker does an id's background duties (timeouts, ends left half done).

`LocalTransactions` is the single broker's, today's behaviour; the cluster's is
`server.cluster.cluster_transactions.ClusterTransactions`. `append_marker` and `acknowledge` are
what both do at a partition they serve.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

import structlog

from headwater.durables.partition_transactions import AbortedRange
from headwater.durables.transaction_state import StoredChange, Transaction
from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.reply import AfterDurable, Reply, resolve
from headwater.server.subscriptions.reliable_subscription import ReliableSubscription
from headwater.server.topics.topic import LogTopic
from headwater.storage.state import CURSOR, TRANSACTION, TRANSACTION_PARTS, key
from headwater.wire import messages as m
from headwater.wire.errors import NotOwner, NotSupported
from headwater.wire.markers import Marker, build_marker

log = structlog.get_logger(__name__)

# told every change of a transactional id's state made elsewhere (None: the id was forgotten)
Changed = Callable[[str, Transaction | None], None]


class TransactionPlacement(Protocol):
    async def load(self, changed: Changed) -> list[Transaction]:
        """Every transactional id's state now; `changed` is told the later changes made by
        other brokers."""
        ...

    async def close(self) -> None: ...

    async def store(self, txn: Transaction, change: StoredChange) -> None:
        """Store `txn` durably over the state last seen of its id (ConcurrentTransactions when
        another broker changed it since: retriable): `change`'s head, its new chunk of
        partitions, and its dropped chunks, in one atomic write (`durables.transaction_state`,
        "Stored form")."""
        ...

    async def delete(self, txn: Transaction) -> None:
        """Forget an idle id (nothing when it changed since)."""
        ...

    async def refresh(self, transactional_id: str) -> None:
        """Bring the id's copy up to date (through `changed`) before a request acts on it."""
        ...

    def may_lag(self) -> bool:
        """Whether the copy can lag the stored state (a produce's check then waits for
        `catch_up` before it refuses)."""
        ...

    def catch_up(self, transactional_id: str | None) -> Awaitable[None]:
        """Read the id's state again (None: the producer's id is not known here yet: every
        id's)."""
        ...

    async def marker_here(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        epoch: int,
        marker: Marker,
        check: Callable[[], None],
    ) -> None:
        """The marker appended to a partition served here (`check` called with no await before
        the append), durable, and what the deployment keeps of an abort kept."""
        ...

    async def marker_elsewhere(
        self, topic: str, partition: int, producer_id: int, epoch: int, marker: Marker
    ) -> None:
        """The marker written by the partition's owner, another broker (NOT_OWNER while it has
        none)."""
        ...

    async def make_durable(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Every record written to these partitions durable, before a commit is decided."""
        ...

    async def apply_acks(self, txn: Transaction) -> None:
        """The acknowledgements (ADD_ACKS_TO_TXN `ranges`) of `txn`, a stored PREPARE_COMMIT,
        applied to their subscriptions' cursors and durable (acking again what is acked
        changes nothing: a completion done again after a crash repeats this)."""
        ...

    async def acks_here(self, request: m.WriteTxnAcksRequest) -> None:
        """WRITE_TXN_ACKS at a partition's owner: what the state decided to acknowledge there
        applied (a cluster's)."""
        ...

    def duties(self, transactional_id: str) -> bool:
        """Whether this broker times out the id's transactions and finishes ends left half done."""
        ...

    @property
    def local_partitions(self) -> bool:
        """Whether every partition is this broker's (its acknowledgements applied here, its
        hanging transactions found at start); a cluster's owners do that at take-over."""
        ...


async def append_marker(
    catalog: TopicCatalog,
    topic_name: str,
    index: int,
    producer_id: int,
    epoch: int,
    marker: Marker,
    check: Callable[[], None] = lambda: None,
) -> tuple[LogTopic, AbortedRange | None] | None:
    """Append the marker to a partition served here and wait until it is durable (fsynced, or
    in a cluster in the object store). `check` is called with no await before the append (it
    raises to refuse). The topic, and the aborted range the marker closed (an abort of a
    transaction open there); None when the partition is gone (deleted meanwhile)."""
    topic = catalog.topics.get(topic_name)
    if not isinstance(topic, LogTopic) or index >= len(topic.partitions):
        return None
    partition = topic.partitions[index]
    batch = build_marker(producer_id, epoch, marker)
    placed: list[int] = []

    def append() -> Reply:
        check()
        base_offset, durable = topic.accept(partition, batch, 1, True)
        placed.append(base_offset)
        response = m.ProduceResponse(index, base_offset)
        return response if durable is None else AfterDurable(response, durable)

    await resolve(topic.when_leased([(partition, 1)], append))
    if marker != Marker.ABORT:
        return topic, None
    return topic, partition.transactions.aborted_at(placed[0])


def acks_by_subscription(
    txn: Transaction, where: tuple[str, int] | None = None
) -> dict[tuple[str, str], list[m.AckRange]]:
    """(subscription, topic) -> the ranges `txn` acknowledges there (of partition `where`
    only, when given)."""
    found: dict[tuple[str, str], list[m.AckRange]] = {}
    for offset in txn.offsets:
        if offset.acks and where in (None, (offset.topic, offset.partition)):
            found.setdefault((offset.group, offset.topic), []).extend(
                m.AckRange(offset.partition, first, end - first) for first, end in offset.acks
            )
    return found


async def acknowledge(
    catalog: TopicCatalog, subscription: str, topic_name: str, ranges: list[m.AckRange]
) -> None:
    """A committed transaction's `ranges` acked on the reliable subscription (also what this
    broker never dispatched: `ReliableSubscription.acked_in_transaction`), its cursors written
    synced, in the topic's turn as every change to a subscription is (a deletion cannot come
    between the ack and the write). A subscription deleted meanwhile is logged and left."""
    async with catalog.turn(topic_name):
        topic = catalog.topics.get(topic_name)
        found = None if topic is None else topic.subscriptions.get(subscription)
        if topic is None or not isinstance(found, ReliableSubscription):
            log.error(
                "transactions.acks_not_applied",
                topic=topic_name,
                subscription=subscription,
                error="the subscription no longer exists",
            )
            return
        cursors = found.core.cursors
        kept = [r for r in ranges if r.partition < len(cursors)]
        found.acked_in_transaction(kept, [p.next_offset for p in topic.partitions])
        await catalog.writer.synced(
            {
                key(CURSOR, topic_name, subscription, p): cursors[p].encode()
                for p in {r.partition for r in kept}
            }
        )


def _unreadable(raw_key: bytes, exc: Exception) -> None:
    """A damaged key or value of a transactional id's state, left out of what is loaded (its
    transaction, if one was open in partitions, is aborted there as hanging)."""
    log.error(
        "transactions.state_unreadable",
        key=raw_key.decode(errors="backslashreplace"),
        error=str(exc),
    )


class LocalTransactions:
    """One broker: states in the state store (`txn/<id>` and its chunks of partitions
    `txnpart/<id>\0<n>`, synced), markers appended here, a commit's partitions fsynced first,
    every duty this broker's."""

    def __init__(self, catalog: TopicCatalog) -> None:
        self._catalog = catalog

    async def load(self, changed: Changed) -> list[Transaction]:
        chunks: dict[str, list[tuple[int, bytes]]] = {}
        for raw_key, value in self._catalog.state.scan(TRANSACTION_PARTS):
            # <id>\0<number, 20 digits> (the scan takes the prefix off): read from the end,
            # whatever the id holds. (Cutting the prefix's length off again named the chunks
            # after a part of the id, never found: a transaction of more than 64 partitions
            # was unreadable after a restart, and aborted as hanging, even a decided commit)
            try:
                name = raw_key[:-21].decode()
                chunks.setdefault(name, []).append((int(raw_key[-20:]), value))
            except ValueError as exc:  # damaged: its head then counts a chunk not found
                _unreadable(TRANSACTION_PARTS + raw_key, exc)
        found = []
        for raw_key, value in self._catalog.state.scan(TRANSACTION):
            try:
                name = raw_key.decode()
                # chunks 0, 1, 2...: a gap ends them (the head then counts more: unreadable)
                kept = sorted(chunks.get(name, ()))
                found.append(
                    Transaction.decode(value, (c for i, (n, c) in enumerate(kept) if n == i))
                )
            except (ValueError, KeyError, TypeError) as exc:
                _unreadable(TRANSACTION + raw_key, exc)
        return found

    async def close(self) -> None:
        return None

    async def store(self, txn: Transaction, change: StoredChange) -> None:
        name = txn.transactional_id
        puts = {key(TRANSACTION, name): change.head}
        if change.chunk is not None:
            puts[key(TRANSACTION_PARTS, name, change.chunk[0])] = change.chunk[1]
        drops = [key(TRANSACTION_PARTS, name, n) for n in range(change.dropped)]
        await self._catalog.writer.synced(puts, drops)

    async def delete(self, txn: Transaction) -> None:
        await self._catalog.writer.synced(deletes=[key(TRANSACTION, txn.transactional_id)])

    async def refresh(self, transactional_id: str) -> None:
        return None  # the copy is the truth

    def may_lag(self) -> bool:
        return False

    async def catch_up(self, transactional_id: str | None) -> None:
        return None

    async def marker_here(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        epoch: int,
        marker: Marker,
        check: Callable[[], None],
    ) -> None:
        await append_marker(self._catalog, topic, partition, producer_id, epoch, marker, check)

    async def marker_elsewhere(
        self, topic: str, partition: int, producer_id: int, epoch: int, marker: Marker
    ) -> None:
        raise NotOwner(f"partition {partition} of topic {topic!r} is served here")

    async def make_durable(self, partitions: Iterable[tuple[str, int]]) -> None:
        waits: list[Awaitable[None]] = []
        for topic_name, index in sorted(partitions):
            topic = self._catalog.topics.get(topic_name)
            if not isinstance(topic, LogTopic) or index >= len(topic.partitions):
                continue  # deleted meanwhile: nothing of it to commit
            wal = topic.partitions[index].log
            if wal.appended:
                waits.append(wal.wait_durable(wal.appended))
        if waits:
            await asyncio.gather(*waits)

    async def apply_acks(self, txn: Transaction) -> None:
        for (subscription, topic), ranges in acks_by_subscription(txn).items():
            await acknowledge(self._catalog, subscription, topic, ranges)

    async def acks_here(self, request: m.WriteTxnAcksRequest) -> None:
        raise NotSupported("WRITE_TXN_ACKS is between the brokers of a cluster")

    def duties(self, transactional_id: str) -> bool:
        return True

    @property
    def local_partitions(self) -> bool:
        return True
