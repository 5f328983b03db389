"""The transaction model without a server: the coordinator's state machine
(`durables.transaction_state`), one partition's transactions (`durables.partition_transactions`)
as the log and a restart feed them, and a stored marker's check (`storage.segments`).

The state machine is driven through every transition a Kafka client can cause, with the error it
is told for each wrong one; the partition's table is fed the batches of a log and, like a start
after kill -9, its stored state then the last segment's batches again, which must change nothing.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from headwater.durables.partition_transactions import AbortedRange, PartitionTransactions
from headwater.durables.transaction_state import (
    MAX_EPOCH,
    PendingOffset,
    Transaction,
    TxnState,
    initialized,
)
from headwater.storage.segments import check_batch, check_stored
from headwater.wire.errors import (
    ConcurrentTransactions,
    CorruptBatch,
    InvalidProducerIdMapping,
    InvalidTransactionTimeout,
    InvalidTxnState,
    ProducerFenced,
)
from headwater.wire.markers import BatchHeader, Marker, build_marker
from headwater.wire.records import BatchBuilder

PID = 7


def _fresh() -> Transaction:
    return initialized(None, "tid", 10_000, PID, now_ms=0)


# The coordinator's state machine


def test_a_transaction_goes_through_kafkas_states_to_a_commit() -> None:
    txn = _fresh()
    assert (txn.producer_id, txn.epoch, txn.state) == (PID, 0, TxnState.EMPTY)
    txn = txn.add_partitions(PID, 0, [("t", 0), ("t", 1)], now_ms=5)
    assert (txn.state, txn.started_ms) == (TxnState.ONGOING, 5)
    txn = txn.add_offsets(PID, 0, "group", now_ms=6)
    txn = txn.commit_offsets(PID, 0, [PendingOffset("group", "in", 0, 42)], now_ms=7)
    txn = txn.commit_offsets(PID, 0, [PendingOffset("group", "in", 0, 43)], now_ms=8)
    assert txn.offsets == (PendingOffset("group", "in", 0, 43),)  # the last one sent wins
    assert txn.started_ms == 5  # a transaction's start is its first addition
    prepared = txn.end(PID, 0, commit=True, now_ms=9)
    assert prepared is not None and prepared.state == TxnState.PREPARE_COMMIT
    # a retry while it completes is told to wait; a contrary end is refused
    with pytest.raises(ConcurrentTransactions):
        prepared.end(PID, 0, commit=True, now_ms=10)
    with pytest.raises(InvalidTxnState):
        prepared.end(PID, 0, commit=False, now_ms=10)
    with pytest.raises(ConcurrentTransactions):
        prepared.add_partitions(PID, 0, [("t", 2)], now_ms=10)
    done = prepared.completed(now_ms=11)
    assert done.state == TxnState.COMPLETE_COMMIT
    assert (done.partitions, done.offsets, done.groups, done.started_ms) == (
        frozenset(),
        (),
        frozenset(),
        -1,
    )
    # a retried commit of a completed one is answered as done; the next one begins afresh
    assert done.end(PID, 0, commit=True, now_ms=12) is None
    assert done.add_partitions(PID, 0, [("t", 0)], now_ms=13).state == TxnState.ONGOING


def test_wrong_producers_and_states_are_told_kafkas_errors() -> None:
    txn = _fresh()
    with pytest.raises(InvalidProducerIdMapping):
        txn.add_partitions(PID + 1, 0, [("t", 0)], now_ms=1)
    with pytest.raises(ProducerFenced):
        txn.add_partitions(PID, 1, [("t", 0)], now_ms=1)
    with pytest.raises(InvalidTxnState):  # offsets before the group was added
        txn.commit_offsets(PID, 0, [PendingOffset("g", "t", 0, 1)], now_ms=1)
    with pytest.raises(InvalidTxnState):  # commit with nothing begun
        txn.end(PID, 0, commit=True, now_ms=1)
    assert txn.end(PID, 0, commit=False, now_ms=1) is None  # abort of nothing: nothing to do
    ongoing = txn.add_offsets(PID, 0, "g", now_ms=1)
    with pytest.raises(InvalidTxnState):  # a group not added to this transaction
        ongoing.commit_offsets(PID, 0, [PendingOffset("other", "t", 0, 1)], now_ms=2)
    with pytest.raises(InvalidTransactionTimeout):
        initialized(None, "tid", 0, PID, now_ms=0)


def test_a_timeout_or_a_new_instance_aborts_under_a_bumped_epoch_fencing_the_old() -> None:
    ongoing = _fresh().add_partitions(PID, 0, [("t", 0)], now_ms=100)
    assert not ongoing.expired(now_ms=100 + 10_000)
    assert ongoing.expired(now_ms=100 + 10_001)
    fenced = ongoing.fence(now_ms=10_200)
    assert (fenced.state, fenced.epoch, fenced.last_epoch) == (TxnState.PREPARE_ABORT, 1, 0)
    # the old producer's end is told it was fenced, whichever it asks
    for commit in (True, False):
        with pytest.raises(ProducerFenced):
            fenced.end(PID, 0, commit=commit, now_ms=10_300)
    # no new instance while the abort completes; after it, one more epoch
    with pytest.raises(ConcurrentTransactions):
        initialized(fenced, "tid", 10_000, -1, now_ms=10_300)
    again = initialized(fenced.completed(now_ms=10_400), "tid", 20_000, -1, now_ms=10_500)
    assert (again.producer_id, again.epoch, again.timeout_ms, again.last_epoch) == (
        PID,
        2,
        20_000,
        -1,
    )


def test_an_epoch_at_its_limit_takes_a_new_producer_id() -> None:
    worn = replace(_fresh(), epoch=MAX_EPOCH)
    renewed = initialized(worn, "tid", 10_000, PID + 1, now_ms=1)
    assert (renewed.producer_id, renewed.epoch) == (PID + 1, 0)


def test_the_stored_form_round_trips_every_field() -> None:
    txn = (
        _fresh()
        .add_partitions(PID, 0, [("a", 1), ("b", 0)], now_ms=3)
        .add_offsets(PID, 0, "g", now_ms=4)
        .commit_offsets(PID, 0, [PendingOffset("g", "in", 2, 9)], now_ms=5)
        .fence(now_ms=6)
    )
    assert Transaction.decode(txn.encode()) == txn


# One partition's transactions


def _data(base: int, count: int, producer: int = PID) -> BatchHeader:
    return BatchHeader(base, base + count, producer, 0, True, False)


def _marker(offset: int, producer: int = PID) -> BatchHeader:
    return BatchHeader(offset, offset + 1, producer, 0, True, True)


def test_the_last_stable_offset_and_aborted_ranges_follow_the_log() -> None:
    table = PartitionTransactions()
    assert table.stable_end(10) == 10
    table.appended(BatchHeader(0, 5, -1, -1, False, False))  # not transactional: nothing
    table.appended(_data(5, 3))
    table.appended(_data(8, 2, producer=PID + 1))
    table.appended(_data(10, 2))  # the same transaction, further on
    assert table.stable_end(12) == 5
    table.appended(_marker(12), Marker.ABORT)
    assert table.stable_end(13) == 8  # the other producer's is still open
    table.appended(_marker(13, producer=PID + 1), Marker.COMMIT)
    assert table.stable_end(14) == 14
    assert table.hides(_data(5, 3)) and table.hides(_data(10, 2))
    assert not table.hides(_data(8, 2, producer=PID + 1))
    assert table.hides(_marker(13, producer=PID + 1))  # a marker is never a record
    assert table.aborted_overlapping(0, 14) == [AbortedRange(PID, 5, 12)]
    assert table.aborted_overlapping(13, 20) == []


def test_the_last_segment_followed_again_over_the_stored_state_changes_nothing() -> None:
    """A start after kill -9: the stored state (an aborted transaction, the next one open), then
    the last segment's batches again from its start: the old abort marker must not close the
    open transaction (it did, storing a range that hid nothing)."""
    log = [
        (_data(0, 4), None),
        (_marker(4), Marker.ABORT),
        (_data(5, 2), None),
        (_marker(7), Marker.COMMIT),
        (_data(8, 3), None),  # open at the kill
    ]
    live = PartitionTransactions()
    for header, marker in log:
        live.appended(header, marker)
    restarted = PartitionTransactions()
    restarted.restore(dict(live.open), [AbortedRange(PID, 0, 4)])
    changes = [restarted.appended(header, marker) for header, marker in log]
    assert changes == [None] * len(log)
    assert restarted.open == {PID: 8} == live.open
    assert restarted.aborted_overlapping(0, 11) == [AbortedRange(PID, 0, 4)]
    assert restarted.hides(_data(0, 4)) and not restarted.hides(_data(5, 2))


def test_what_a_crash_took_from_the_log_end_is_forgotten() -> None:
    table = PartitionTransactions()
    table.appended(_data(0, 2))
    table.appended(_marker(2), Marker.ABORT)
    table.appended(_data(3, 2, producer=PID + 1))
    table.forget_from(2)  # the marker and the other producer's batch were lost
    assert table.open == {PID: 0}  # open again: hidden from read_committed until re-marked
    assert table.aborted_count == 0 and table.stable_end(3) == 0


# A stored marker's check


def test_a_stored_marker_is_a_valid_batch_and_a_damaged_one_is_not() -> None:
    marker = build_marker(PID, 3, Marker.COMMIT)
    info = check_stored(marker)
    assert (info.producer_id, info.producer_epoch, info.record_count, info.transactional) == (
        PID,
        3,
        1,
        True,
    )
    assert check_batch(marker, 0, len(marker), 0) is not None
    flipped = bytearray(marker)
    flipped[-3] ^= 0xFF
    with pytest.raises(CorruptBatch):
        check_stored(bytes(flipped))
    assert check_batch(bytes(flipped), 0, len(flipped), 0) is None
    builder = BatchBuilder()
    builder.append(None, b"plain")
    assert check_stored(builder.build()).record_count == 1
