"""A new owner's rebuild of a partition's transactions (docs/CLUSTER.md, "Transactions"), in
process over the previous owner's data in a local object store, the take-over as
tests/test_cluster_idempotent_takeover.py builds it: the aborted ranges the previous owners kept
are restored before the partition is served; a transaction the states have in progress there
holds the LSO at the scan's start until the scan finds where it begins; an abort the scan meets
whose range was not kept gets its object; a transaction left open with no state in progress is
aborted (hanging). The cluster's own side (etcd, the objects' listing) is
tests/test_cluster_transactions.py's."""

from __future__ import annotations

import asyncio
from pathlib import Path

from headwater.durables.partition_transactions import AbortedRange
from headwater.durables.transaction_state import Transaction, TxnState
from headwater.storage.cloud_tail import Chunk
from headwater.wire.markers import Marker, build_marker, peek
from headwater.wire.records import BatchBuilder, stamp_base_offset
from tests.test_cluster_idempotent_takeover import TOPIC, new_owner

PRODUCER = 7


def stamped(batch: bytes, base: int) -> bytes:
    data = bytearray(batch)
    stamp_base_offset(data, base)
    return bytes(data)


def transactional(sequence: int, value: bytes, base: int) -> bytes:
    builder = BatchBuilder(
        producer_id=PRODUCER, producer_epoch=0, base_sequence=sequence, transactional=True
    )
    builder.append(None, value)
    return stamped(builder.build(), base)


class Transactions:
    """The cluster's transactions as a take-over sees them: kept aborted ranges, the states in
    progress, and what the take-over asked for."""

    def __init__(self, kept: list[AbortedRange], in_progress: bool) -> None:
        self.loaded = asyncio.Event()
        self.loaded.set()
        self._kept = kept
        self._in_progress = in_progress
        self.kept_now: list[AbortedRange] = []
        self.hanging: list[int] = []

    async def aborted(
        self, topic: str, partition: int, since: int
    ) -> list[tuple[AbortedRange, str]]:
        return [(r, f"{topic}/{partition}/txn-aborted/{r.last_offset}") for r in self._kept]

    async def forget(self, keys: list[str]) -> None:
        return None

    async def keep_aborted(self, topic: str, partition: int, aborted: AbortedRange) -> None:
        self.kept_now.append(aborted)

    def in_progress(self, topic: str, partition: int) -> dict[int, Transaction]:
        if not self._in_progress:
            return {}
        txn = Transaction(
            "app", PRODUCER, 0, 60_000, TxnState.ONGOING, frozenset({(topic, partition)})
        )
        return {PRODUCER: txn}

    async def abort_hanging(self, topic: str, partition: int, producer_id: int) -> None:
        self.hanging.append(producer_id)


# the previous owner's log: an aborted transaction ([0, 1), its marker at 1) in a segment, then
# a transaction still open ([2, 3)) in a tail chunk
ABORTED = transactional(0, b"aborted", 0)
SEGMENT = [ABORTED, stamped(build_marker(PRODUCER, 0, Marker.ABORT), 1)]
CHUNK = (2, 3, transactional(1, b"open", 2))
RANGE = AbortedRange(PRODUCER, 0, 1)


async def test_kept_aborts_are_restored_at_once_and_an_open_transaction_holds_the_lso(
    tmp_path: Path,
) -> None:
    transactions = Transactions([RANGE], in_progress=True)
    async with new_owner(tmp_path, [SEGMENT], CHUNK, transactions) as o:
        topic, tail = o.topic, o.tail
        reads_go = asyncio.Event()
        read, read_chunk = topic.read, tail.read

        async def held_read(partition: int, offset: int) -> list[bytes]:
            await reads_go.wait()
            return await read(partition, offset)

        async def held_chunk(name: str, partition: int, chunk: Chunk) -> list[bytes]:
            await reads_go.wait()
            return await read_chunk(name, partition, chunk)

        topic.read = held_read  # type: ignore[method-assign]
        tail.read = held_chunk  # type: ignore[method-assign]
        o.etcd.current = 7
        await o.partitions.acquire(TOPIC, 0, 7)
        holder = topic.partitions[0]
        # served before the scan: the aborted batch is hidden already, and nothing of the open
        # transaction is readable (the LSO held at the scan's start)
        assert topic.hides(holder, ABORTED)
        assert topic.stable_end(holder) == 0
        reads_go.set()
        assert holder.producers_ready is not None
        await asyncio.wait_for(holder.producers_ready, 10)
        assert holder.transactions.held is None
        assert holder.transactions.open == {PRODUCER: 2}
        assert topic.stable_end(holder) == 2  # the open transaction's first offset
        assert transactions.kept_now == [] and transactions.hanging == []


async def test_an_abort_not_kept_is_kept_by_the_scan_and_a_hanging_one_aborted(
    tmp_path: Path,
) -> None:
    """The previous owner died between an abort marker and its object; the open transaction
    has no state in progress (its producer was fenced before its state was stored)."""
    transactions = Transactions([], in_progress=False)
    async with new_owner(tmp_path, [SEGMENT], CHUNK, transactions) as o:
        o.etcd.current = 7
        await o.partitions.acquire(TOPIC, 0, 7)
        holder = o.topic.partitions[0]
        assert holder.transactions.held is None  # nothing in progress: not held
        assert holder.producers_ready is not None
        await asyncio.wait_for(holder.producers_ready, 10)
        assert transactions.kept_now == [RANGE]
        assert o.topic.hides(holder, ABORTED)
        assert not peek(CHUNK[2]).control
        for _ in range(100):  # (the hanging abort is spawned: bounded wait for the call)
            if transactions.hanging:
                break
            await asyncio.sleep(0.01)
        assert transactions.hanging == [PRODUCER]
        assert holder.transactions.open == {PRODUCER: 2}  # held until its abort marker
        assert o.topic.stable_end(holder) == 2
