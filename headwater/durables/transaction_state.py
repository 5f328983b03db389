"""A transactional id's state at its coordinator: the state machine, no I/O, time passed in.

Kafka's coordinator, state for state (KIP-98), so a Kafka client sees the answers it expects:

    EMPTY --add partitions or offsets--> ONGOING
    ONGOING --end(commit)--> PREPARE_COMMIT --markers, offsets--> COMPLETE_COMMIT
    ONGOING --end(abort), timeout, fencing--> PREPARE_ABORT --markers--> COMPLETE_ABORT
    COMPLETE_* behave as EMPTY for the next transaction.

`PREPARE_*` is the decision: once it is stored (durably, by the server) the transaction is
committed or aborted whatever happens next; the server then writes a marker to each partition,
applies (or drops) the offsets sent in the transaction, and stores `COMPLETE_*`. A server that
stops between the two finds `PREPARE_*` on start and does the rest again (markers and offsets are
idempotent). `ONGOING` found on start stays open until its producer ends it or its timeout aborts
it.

Stored form (`plan_store`): a transactional id's state is a head record (`Transaction.encode`)
and, for a transaction of more than `HEAD_PARTITIONS` partitions, chunks of its partitions: the
head then holds none and says how many chunks there are, and each store that adds partitions
writes one new chunk with only those (`StoredChange`). So a client adding 10,000 partitions one
AddPartitionsToTxn at a time makes each store write what it added and a head of constant size,
not the whole transaction again: linear in the partitions, not quadratic. The end of the
transaction drops its chunks. A head of the first version (partitions in the head, no chunks) is
read as a transaction of no chunks.

Epochs: `init` of a transactional id with no transaction in progress bumps the epoch (a new
producer id when the epoch would overflow), fencing every older instance; with one `ONGOING`,
it first aborts it under the bumped epoch and answers CONCURRENT_TRANSACTIONS until that abort
is complete (the client retries). A timeout aborts under a bumped epoch too, so the timed-out
producer is fenced (Kafka's behaviour before KIP-890). Every request names the producer id and
epoch it holds: another id is INVALID_PRODUCER_ID_MAPPING, an older epoch PRODUCER_FENCED.
"""

from __future__ import annotations

import enum
import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Final

from headwater.wire.errors import (
    ConcurrentTransactions,
    InvalidProducerIdMapping,
    InvalidTransactionTimeout,
    InvalidTxnState,
    ProducerFenced,
)
from headwater.wire.limits import MAX_TRANSACTION_TIMEOUT_MS

MAX_EPOCH: Final = 32_766  # Kafka's: a bump past it takes a new producer id
DEFAULT_TIMEOUT_MS: Final = 60_000
# the largest transaction timeout a producer may ask for (Kafka's transaction.max.timeout.ms)
MAX_TIMEOUT_MS: Final = MAX_TRANSACTION_TIMEOUT_MS
# partitions, offsets, and ranges of acknowledgements one transaction may hold (a bound on the
# state kept per id)
MAX_PARTITIONS: Final = 10_000
MAX_OFFSETS: Final = 10_000
MAX_ACK_RANGES: Final = 10_000
# a transaction of at most this many partitions keeps them in its head (one record, as small
# transactions are); a larger one in chunks, one per store that added partitions
HEAD_PARTITIONS: Final = 64


class TxnState(enum.StrEnum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def idle(self) -> bool:
        """No transaction in progress: a new one may begin."""
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


@dataclass(frozen=True, slots=True)
class PendingOffset:
    """What a transaction acknowledges of one partition of a subscription, applied at its
    commit and dropped at abort. `group` is a Kafka group or a native subscription (the same
    thing on Headwater). `offset` is a position (every offset below it acknowledged: a Kafka
    group's committed offset), -1 for none; `acks` are ranges [first, end) of offsets
    acknowledged as ACK_RANGES acknowledges them (a native subscription's delivered messages),
    sorted and merged."""

    group: str
    topic: str
    partition: int
    offset: int
    acks: tuple[tuple[int, int], ...] = ()

    def merged(self, later: PendingOffset) -> PendingOffset:
        """This one with `later`, sent after it in the same transaction: `later`'s position
        if it names one, and the acknowledgements of both."""
        return replace(
            self,
            offset=later.offset if later.offset >= 0 else self.offset,
            acks=merge_ranges((*self.acks, *later.acks)),
        )


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Ranges [first, end), sorted, with the overlapping and adjacent ones joined; empty ones
    left out."""
    merged: list[tuple[int, int]] = []
    for first, end in sorted(r for r in ranges if r[0] < r[1]):
        if merged and first <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((first, end))
    return tuple(merged)


@dataclass(frozen=True, slots=True)
class Transaction:
    transactional_id: str
    producer_id: int
    epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: frozenset[tuple[str, int]] = frozenset()
    offsets: tuple[PendingOffset, ...] = ()
    started_ms: int = -1  # when the transaction in progress began (-1: none)
    updated_ms: int = 0
    # the epoch a coordinator-made bump (timeout, fencing) replaced: a retry of an abort from
    # that epoch is answered as the abort it already is
    last_epoch: int = -1
    groups: frozenset[str] = field(default_factory=frozenset)
    # how many chunks of partitions the stored form has (0: the head holds them all)
    chunks: int = 0

    # The transitions: each returns the new state or raises the error the client is told.

    def check(self, producer_id: int, epoch: int) -> None:
        if producer_id != self.producer_id:
            raise InvalidProducerIdMapping(
                f"producer id {producer_id} is not transactional id "
                f"{self.transactional_id!r}'s ({self.producer_id})"
            )
        if epoch != self.epoch:
            raise ProducerFenced(
                f"transactional id {self.transactional_id!r} is at epoch {self.epoch}; epoch "
                f"{epoch} was fenced by a newer producer (or by its transaction's timeout)"
            )

    def add_partitions(
        self, producer_id: int, epoch: int, partitions: Iterable[tuple[str, int]], now_ms: int
    ) -> Transaction:
        self.check(producer_id, epoch)
        self._not_preparing()
        added = self.partitions | frozenset(partitions)
        if len(added) > MAX_PARTITIONS:
            raise InvalidTxnState(f"a transaction writes at most {MAX_PARTITIONS} partitions")
        return self._ongoing(now_ms, partitions=added)

    def add_offsets(self, producer_id: int, epoch: int, group: str, now_ms: int) -> Transaction:
        self.check(producer_id, epoch)
        self._not_preparing()
        return self._ongoing(now_ms, groups=self.groups | {group})

    def commit_offsets(
        self, producer_id: int, epoch: int, offsets: Iterable[PendingOffset], now_ms: int
    ) -> Transaction:
        self.check(producer_id, epoch)
        if self.state != TxnState.ONGOING:
            raise InvalidTxnState(
                f"offsets sent to transactional id {self.transactional_id!r} in state "
                f"{self.state}: add them to a transaction in progress first"
            )
        kept = {(o.group, o.topic, o.partition): o for o in self.offsets}
        for offset in offsets:
            if offset.group not in self.groups:
                raise InvalidTxnState(f"group {offset.group!r} was not added to the transaction")
            where = (offset.group, offset.topic, offset.partition)
            earlier = kept.get(where)
            kept[where] = offset if earlier is None else earlier.merged(offset)
        if len(kept) > MAX_OFFSETS:
            raise InvalidTxnState(f"a transaction commits at most {MAX_OFFSETS} offsets")
        if sum(len(o.acks) for o in kept.values()) > MAX_ACK_RANGES:
            raise InvalidTxnState(
                f"a transaction holds at most {MAX_ACK_RANGES} ranges of acknowledgements"
            )
        return replace(self, offsets=tuple(kept.values()), updated_ms=now_ms)

    def end(self, producer_id: int, epoch: int, commit: bool, now_ms: int) -> Transaction | None:
        """The PREPARE_* to store and complete; None when the transaction already is (or is
        being made) what was asked: a retry, answered as done."""
        if producer_id == self.producer_id and epoch == self.last_epoch:
            raise ProducerFenced(
                f"transactional id {self.transactional_id!r}: its transaction was aborted "
                "(its timeout passed, or a newer producer started) and this producer fenced"
            )
        self.check(producer_id, epoch)
        wanted = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        if self.state == TxnState.ONGOING:
            return replace(self, state=wanted, updated_ms=now_ms)
        if self.state == done:
            return None
        if self.state == wanted:
            raise ConcurrentTransactions(
                f"transactional id {self.transactional_id!r}: its end is being completed"
            )
        if self.state == TxnState.EMPTY and not commit:
            return None  # nothing was begun: nothing to abort
        raise InvalidTxnState(
            f"transactional id {self.transactional_id!r} is in state {self.state}: "
            f"cannot {'commit' if commit else 'abort'}"
        )

    def completed(self, now_ms: int) -> Transaction:
        """The markers are written and the offsets applied (or dropped): COMPLETE_*."""
        if not self.state.preparing:
            return self
        state = (
            TxnState.COMPLETE_COMMIT
            if self.state == TxnState.PREPARE_COMMIT
            else TxnState.COMPLETE_ABORT
        )
        return replace(
            self,
            state=state,
            partitions=frozenset(),
            offsets=(),
            groups=frozenset(),
            started_ms=-1,
            updated_ms=now_ms,
        )

    def expired(self, now_ms: int) -> bool:
        return (
            self.state == TxnState.ONGOING
            and self.started_ms >= 0
            and now_ms - self.started_ms > self.timeout_ms
        )

    def fence(self, now_ms: int) -> Transaction:
        """Abort what is in progress under a bumped epoch (a timeout, or a new instance's
        init): PREPARE_ABORT, the old epoch kept as `last_epoch`. The markers carry the new
        epoch, so partitions refuse the fenced instance's later batches."""
        return replace(
            self,
            state=TxnState.PREPARE_ABORT,
            epoch=self.epoch + 1,
            last_epoch=self.epoch,
            updated_ms=now_ms,
        )

    def _not_preparing(self) -> None:
        if self.state.preparing:
            raise ConcurrentTransactions(
                f"transactional id {self.transactional_id!r}: the previous transaction is "
                "being completed"
            )

    def _ongoing(self, now_ms: int, **changes: Any) -> Transaction:
        # a new transaction starts after its id's last change (its predecessor's end), so two
        # transactions of an id never share a start: a replica tells their chunks apart by it
        started = (
            self.started_ms if self.state == TxnState.ONGOING else max(now_ms, self.updated_ms + 1)
        )
        return replace(
            self, state=TxnState.ONGOING, started_ms=started, updated_ms=now_ms, **changes
        )

    # Persistence

    def encode(self) -> bytes:
        """The head record: the partitions too when the stored form has no chunks."""
        return json.dumps(
            {
                "v": 1,
                "chunks": self.chunks,
                "id": self.transactional_id,
                "pid": self.producer_id,
                "epoch": self.epoch,
                "last_epoch": self.last_epoch,
                "timeout_ms": self.timeout_ms,
                "state": str(self.state),
                "partitions": [] if self.chunks else sorted([t, p] for t, p in self.partitions),
                "groups": sorted(self.groups),
                "offsets": [_encoded(o) for o in self.offsets],
                "started_ms": self.started_ms,
                "updated_ms": self.updated_ms,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(
        cls, data: bytes, chunks: Iterable[bytes] = (), earlier: Transaction | None = None
    ) -> Transaction:
        """The state of a head record and its chunks in order (the first as many as the head
        counts are read); ValueError when there are fewer. `earlier`: the id's state as read
        before, of the same transaction, whose chunks `chunks` continues (a replica reads only
        the chunks added since); ValueError when it is another transaction's."""
        raw = json.loads(data)
        partitions = {(t, p) for t, p in raw["partitions"]}
        count = raw.get("chunks", 0)
        found = 0
        if earlier is not None and earlier.chunks:
            if (earlier.producer_id, earlier.started_ms) != (raw["pid"], raw["started_ms"]) or (
                earlier.chunks > count
            ):
                raise ValueError("the chunks read before are another transaction's")
            partitions |= earlier.partitions
            found = earlier.chunks
        for chunk in itertools.islice(chunks, count - found):
            partitions |= decode_chunk(chunk)
            found += 1
        if found != count:
            raise ValueError(f"the head counts {count} chunks of partitions, {found} were found")
        return cls(
            transactional_id=raw["id"],
            producer_id=raw["pid"],
            epoch=raw["epoch"],
            last_epoch=raw["last_epoch"],
            timeout_ms=raw["timeout_ms"],
            state=TxnState(raw["state"]),
            partitions=frozenset(partitions),
            groups=frozenset(raw["groups"]),
            offsets=tuple(_pending(entry) for entry in raw["offsets"]),
            started_ms=raw["started_ms"],
            updated_ms=raw["updated_ms"],
            chunks=count,
        )


@dataclass(frozen=True, slots=True)
class StoredChange:
    """What one store writes: the head record, the new chunk of partitions if any (its number
    and bytes), and how many chunks it deletes (numbers 0..dropped-1: the transaction's
    partitions were cleared, or moved back into the head). Never a chunk and drops together."""

    head: bytes
    chunk: tuple[int, bytes] | None = None
    dropped: int = 0


def plan_store(previous: Transaction | None, txn: Transaction) -> tuple[Transaction, StoredChange]:
    """`txn` with its stored form's chunk count, and what to write over the stored `previous`
    (the module doc): the partitions added since `previous` as one new chunk, or the head
    alone."""
    before = previous.chunks if previous is not None else 0
    old = previous.partitions if previous is not None else frozenset()
    grows = old <= txn.partitions
    if (len(txn.partitions) <= HEAD_PARTITIONS and not before) or not txn.partitions or not grows:
        # all in the head (a small transaction, none, or not a growth of the stored one)
        stored = replace(txn, chunks=0)
        return stored, StoredChange(stored.encode(), dropped=before)
    if not before:  # past HEAD_PARTITIONS: the head's partitions move to chunk 0
        stored = replace(txn, chunks=1)
        return stored, StoredChange(stored.encode(), (0, encode_chunk(txn.partitions)))
    added = txn.partitions - old
    if not added:
        stored = replace(txn, chunks=before)
        return stored, StoredChange(stored.encode())
    stored = replace(txn, chunks=before + 1)
    return stored, StoredChange(stored.encode(), (before, encode_chunk(added)))


def chunk_count(data: bytes) -> int:
    """How many chunks of partitions a head record counts."""
    return int(json.loads(data).get("chunks", 0))


def encode_chunk(partitions: Iterable[tuple[str, int]]) -> bytes:
    """Partitions as [[topic, [index, ...]], ...] (a topic's name once per chunk)."""
    by_topic: dict[str, list[int]] = {}
    for topic, index in sorted(partitions):
        by_topic.setdefault(topic, []).append(index)
    return json.dumps(list(by_topic.items()), separators=(",", ":")).encode()


def decode_chunk(data: bytes) -> set[tuple[str, int]]:
    return {(topic, int(index)) for topic, indexes in json.loads(data) for index in indexes}


def _encoded(offset: PendingOffset) -> list[Any]:
    """[group, topic, partition, offset], and [[first, end], ...] after them when it acks."""
    entry: list[Any] = [offset.group, offset.topic, offset.partition, offset.offset]
    if offset.acks:
        entry.append([list(r) for r in offset.acks])
    return entry


def _pending(entry: list[Any]) -> PendingOffset:
    """An encoded offset: [group, topic, partition, offset] as every state before native
    acknowledgements was written, and [..., [[first, end], ...]] for one that acks."""
    group, topic, partition, offset, *acks = entry
    ranges = tuple((first, end) for first, end in acks[0]) if acks else ()
    return PendingOffset(group, topic, partition, offset, ranges)


def check_timeout(timeout_ms: int) -> None:
    if not 1 <= timeout_ms <= MAX_TIMEOUT_MS:
        raise InvalidTransactionTimeout(
            f"transaction timeout {timeout_ms} ms: 1..{MAX_TIMEOUT_MS} ms"
        )


def initialized(
    existing: Transaction | None,
    transactional_id: str,
    timeout_ms: int,
    new_producer_id: int,
    now_ms: int,
) -> Transaction:
    """The state after a producer's init, for an id with no transaction in progress
    (`existing.state.idle`, or None): a bumped epoch, or a new producer id at overflow or for a
    new transactional id (`new_producer_id`, which the caller issues only when it is used)."""
    check_timeout(timeout_ms)
    if existing is None or existing.epoch >= MAX_EPOCH:
        return Transaction(transactional_id, new_producer_id, 0, timeout_ms, updated_ms=now_ms)
    if not existing.state.idle:
        raise ConcurrentTransactions(
            f"transactional id {transactional_id!r}: a transaction is being completed"
        )
    return replace(
        existing,
        epoch=existing.epoch + 1,
        last_epoch=-1,
        timeout_ms=timeout_ms,
        state=TxnState.EMPTY,
        updated_ms=now_ms,
    )
