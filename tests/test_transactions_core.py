"""The I/O-free core of transactions: markers byte for byte as Kafka's, a partition's open and
aborted transactions and its last stable offset, producer epochs in the idempotence tables, and
the coordinator's state machine (docs/TRANSACTIONS.md)."""

from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch

from headwater.durables.partition_transactions import (
    AbortedRange,
    Closed,
    Opened,
    PartitionTransactions,
)
from headwater.durables.producers import ProducerEntry, ProducerTable
from headwater.durables.transaction_state import (
    PendingOffset,
    Transaction,
    TxnState,
    initialized,
)
from headwater.wire.errors import (
    ConcurrentTransactions,
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    InvalidTransactionTimeout,
    InvalidTxnState,
    OutOfOrderSequence,
    ProducerFenced,
)
from headwater.wire.markers import BatchHeader, Marker, build_marker, marker_type, peek
from headwater.wire.records import BatchBuilder, CorruptBatch, inspect_batch

# Markers


@pytest.mark.parametrize("marker", [Marker.COMMIT, Marker.ABORT])
def test_a_marker_is_a_kafka_control_batch_a_kafka_client_reads(marker: Marker) -> None:
    batch = build_marker(producer_id=41, producer_epoch=3, marker=marker, coordinator_epoch=7)
    read = KafkaPythonBatch(batch)
    assert read.is_control_batch and read.is_transactional and read.validate_crc()
    assert (read.producer_id, read.producer_epoch) == (41, 3)
    (record,) = list(read)
    assert record.key == bytes([0, 0, 0, int(marker)])
    assert record.value == bytes([0, 0, 0, 0, 0, 7])
    assert marker_type(batch) == marker
    assert peek(batch) == BatchHeader(0, 1, 41, 3, True, True)


def test_a_client_cannot_send_a_marker_nor_a_transactional_batch_without_a_producer() -> None:
    with pytest.raises(CorruptBatch, match="control batches"):
        inspect_batch(build_marker(1, 0, Marker.COMMIT))
    builder = BatchBuilder(transactional=True)
    builder.append(b"k", b"v")
    with pytest.raises(CorruptBatch, match="without a producer id"):
        inspect_batch(builder.build())


def test_a_transactional_batch_says_so() -> None:
    builder = BatchBuilder(producer_id=5, producer_epoch=2, base_sequence=0, transactional=True)
    builder.append(b"k", b"v")
    info = inspect_batch(builder.build())
    assert (info.transactional, info.producer_id, info.producer_epoch) == (True, 5, 2)


# A partition's transactions


def _data(producer: int, base: int, count: int = 1) -> BatchHeader:
    return BatchHeader(base, base + count, producer, 0, True, False)


def _marker(producer: int, offset: int) -> BatchHeader:
    return BatchHeader(offset, offset + 1, producer, 0, True, True)


def test_the_last_stable_offset_stops_at_the_oldest_open_transaction() -> None:
    state = PartitionTransactions()
    assert state.stable_end(10) == 10
    assert state.appended(_data(1, 10, 5)) == Opened(1, 10)
    assert state.appended(_data(2, 15, 5)) == Opened(2, 15)
    assert state.appended(_data(1, 20, 5)) is None  # already open
    assert state.stable_end(25) == 10
    assert state.appended(_marker(1, 25), Marker.COMMIT) == Closed(1, 10, None)
    assert state.stable_end(26) == 15
    closed = state.appended(_marker(2, 26), Marker.ABORT)
    assert closed == Closed(2, 15, AbortedRange(2, 15, 26))
    assert state.stable_end(27) == 27


def test_aborted_batches_are_hidden_committed_ones_and_plain_ones_are_not() -> None:
    state = PartitionTransactions()
    state.appended(_data(1, 0, 3))
    state.appended(_data(2, 3, 3))
    state.appended(BatchHeader(6, 8, -1, -1, False, False))  # a plain batch in between
    state.appended(_marker(1, 8), Marker.ABORT)
    state.appended(_marker(2, 9), Marker.COMMIT)
    assert state.hides(_data(1, 0, 3))
    assert not state.hides(_data(2, 3, 3))
    assert not state.hides(BatchHeader(6, 8, -1, -1, False, False))
    assert state.hides(_marker(1, 8)) and state.hides(_marker(2, 9))
    assert not state.hides(_data(1, 10))  # the producer's next transaction: not aborted (yet)
    assert state.aborted_overlapping(0, 10) == [AbortedRange(1, 0, 8)]
    assert state.aborted_overlapping(9, 20) == []  # ended before the range


def test_a_marker_with_nothing_open_changes_nothing() -> None:
    """A partition added to a transaction but never written, or a marker written again after a
    crash: no aborted range, nothing closed."""
    state = PartitionTransactions()
    assert state.appended(_marker(1, 0), Marker.ABORT) is None
    assert state.aborted_count == 0


def test_restoring_twice_keeps_one_range_and_retention_drops_old_ones() -> None:
    state = PartitionTransactions()
    ranges = [AbortedRange(1, 0, 5), AbortedRange(2, 3, 9), AbortedRange(1, 10, 12)]
    state.restore({3: 20}, ranges)
    state.add_aborted(AbortedRange(2, 3, 9))  # followed again from the recovered tail
    assert state.aborted_count == 3 and state.stable_end(100) == 20
    assert state.forget_below(9) == [AbortedRange(1, 0, 5)]
    assert state.aborted_overlapping(0, 100) == [AbortedRange(2, 3, 9), AbortedRange(1, 10, 12)]


def test_an_abort_whose_marker_a_crash_took_is_open_again() -> None:
    """The coordinator writes the marker again (its end is not complete until the marker is
    synced): until then the batches stay behind the last stable offset, never shown."""
    state = PartitionTransactions()
    state.restore({}, [AbortedRange(1, 4, 10), AbortedRange(2, 12, 20)])
    state.forget_from(15)  # the data ends at 15: marker 20 and batches from 15 are gone
    assert state.open == {2: 12}
    assert state.stable_end(15) == 12
    assert state.aborted_overlapping(0, 100) == [AbortedRange(1, 4, 10)]


# Producer epochs


def test_a_newer_epoch_numbers_from_zero_and_fences_the_older() -> None:
    table = ProducerTable()
    assert table.check(7, 0, 2, epoch=0) is None
    table.record(7, 0, 2, 100, epoch=0)
    assert table.check(7, 0, 2, epoch=0) == 100  # a retry
    assert table.check(7, 0, 1, epoch=1) is None  # a new epoch starts at 0 again
    table.record(7, 0, 1, 200, epoch=1)
    with pytest.raises(InvalidProducerEpoch):
        table.check(7, 2, 1, epoch=0)


def test_a_marker_of_a_newer_epoch_fences_the_older_instance() -> None:
    table = ProducerTable()
    table.record(7, 0, 5, 0, epoch=0)
    entry = table.fence(7, 1)
    assert entry is not None and entry.epoch == 1
    with pytest.raises(InvalidProducerEpoch):
        table.check(7, 5, 1, epoch=0)
    assert table.check(7, 0, 1, epoch=1) is None
    with pytest.raises(OutOfOrderSequence):
        table.check(7, 3, 1, epoch=1)
    assert table.fence(7, 1) is None  # the same epoch: nothing to persist


def test_an_entry_written_before_epochs_reads_as_epoch_zero() -> None:
    legacy = b"".join(
        int.to_bytes(v, n, "big") for v, n in ((0, 4), (3, 4), (50, 8))
    )  # (sequence 0, count 3, offset 50), no epoch
    entry = ProducerEntry.decode(legacy)
    assert entry.epoch == 0 and list(entry.recent) == [(0, 3, 50)]
    assert ProducerEntry.decode(entry.encode()) == entry


# The coordinator's state machine


def _fresh(now: int = 0) -> Transaction:
    return initialized(None, "tx", 1000, 42, now)


def test_init_bumps_the_epoch_and_a_new_id_starts_at_zero() -> None:
    first = _fresh()
    assert (first.producer_id, first.epoch, first.state) == (42, 0, TxnState.EMPTY)
    again = initialized(first, "tx", 1000, -1, 5)
    assert (again.producer_id, again.epoch) == (42, 1)
    with pytest.raises(InvalidTransactionTimeout):
        initialized(None, "tx", 0, 42, 0)


def test_a_transaction_runs_add_send_offsets_commit_complete() -> None:
    txn = _fresh().add_partitions(42, 0, [("a", 0), ("b", 1)], now_ms=10)
    assert txn.state == TxnState.ONGOING and txn.started_ms == 10
    txn = txn.add_offsets(42, 0, "group", now_ms=11)
    txn = txn.commit_offsets(42, 0, [PendingOffset("group", "in", 0, 7)], now_ms=12)
    with pytest.raises(InvalidTxnState, match="not added"):
        txn.commit_offsets(42, 0, [PendingOffset("other", "in", 0, 7)], now_ms=12)
    prepared = txn.end(42, 0, commit=True, now_ms=13)
    assert prepared is not None and prepared.state == TxnState.PREPARE_COMMIT
    with pytest.raises(ConcurrentTransactions):
        prepared.add_partitions(42, 0, [("c", 0)], now_ms=14)
    done = prepared.completed(15)
    assert done.state == TxnState.COMPLETE_COMMIT and not done.partitions and not done.offsets
    assert done.end(42, 0, commit=True, now_ms=16) is None  # a retry: already so
    with pytest.raises(InvalidTxnState):
        done.end(42, 0, commit=False, now_ms=16)
    assert Transaction.decode(prepared.encode()) == prepared


def test_an_old_epoch_or_another_producer_is_refused() -> None:
    txn = initialized(_fresh(), "tx", 1000, -1, 0)  # epoch 1
    with pytest.raises(ProducerFenced):
        txn.add_partitions(42, 0, [("a", 0)], now_ms=1)
    with pytest.raises(InvalidProducerIdMapping):
        txn.add_partitions(43, 1, [("a", 0)], now_ms=1)


def test_a_timeout_aborts_under_a_bumped_epoch_and_fences_the_producer() -> None:
    txn = _fresh().add_partitions(42, 0, [("a", 0)], now_ms=100)
    assert not txn.expired(1100) and txn.expired(1101)
    fenced = txn.fence(1101)
    assert (fenced.state, fenced.epoch, fenced.last_epoch) == (TxnState.PREPARE_ABORT, 1, 0)
    with pytest.raises(ProducerFenced, match="aborted"):
        fenced.completed(1102).end(42, 0, commit=True, now_ms=1103)
