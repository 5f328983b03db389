"""The I/O-free delivery core, driven directly with a fake clock (`now` is a number the test
moves): no server, no sleeps. Each durables class on its own: `PartitionCursor`,
`ReliableDelivery`, `ConsumerGroup`, `LastValueKeys`; and the state writer's group commit."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.durables.cursor import PartitionCursor
from headwater.durables.delivery import DEAD_LETTER_RETRY, ReliableDelivery, ReliableSettings, runs
from headwater.durables.group import ConsumerGroup
from headwater.durables.lastvalue import KeyedBatch, LastValueKeys, StoredValue
from headwater.storage.known_keys import ENTRY_OVERHEAD, KnownKeys
from headwater.storage.lastvalue_store import LastValueStore
from headwater.storage.state import StateStore, StateWriter
from headwater.wire import messages as m
from headwater.wire.errors import ConsumerBusy, InvalidRequest, StorageError, WrongPartition
from headwater.wire.keys import partition_for_key
from headwater.wire.records import Record


def _settings(**overrides: object) -> ReliableSettings:
    values: dict[str, object] = {
        "ack_timeout_ms": 1000,
        "max_deliveries": 0,
        "backoff": m.Backoff.FIXED,
        "backoff_initial_ms": 100,
        "backoff_max_ms": 1000,
    }
    values.update(overrides)
    return ReliableSettings(**values)  # type: ignore[arg-type]


def _core(partitions: int = 1, shared: bool = False, **settings: object) -> ReliableDelivery:
    cursors = [PartitionCursor.starting_at(0) for _ in range(partitions)]
    return ReliableDelivery(_settings(**settings), cursors, shared, now=0.0, topic="t")


def _record(offset: int) -> Record:
    return Record(offset, 0, None, b"v", ())


# PartitionCursor


def test_cursor_floor_advances_over_out_of_order_acks_and_survives_encoding() -> None:
    cursor = PartitionCursor.starting_at(10)
    cursor.record_delivery(10, 15)
    cursor.record_delivery(12, 13)  # a redelivery counts
    assert cursor.ack(11) and cursor.ack(13)
    assert cursor.floor == 10 and cursor.unacked() == [10, 12, 14]
    assert cursor.delivery_count(12) == 2 and cursor.delivery_count(15) == 0
    decoded = PartitionCursor.decode(cursor.encode())
    assert decoded == cursor
    assert cursor.ack(10)
    assert cursor.floor == 12 and not cursor.ack(11)
    assert cursor.ack_up_to(20) and cursor.floor == 15 and cursor.unacked() == []


# ReliableDelivery


def test_new_messages_are_planned_in_ranges_cut_to_credit() -> None:
    core = _core(partitions=2)
    assert core.next_partition([0, 0]) is None
    assert core.next_partition([5, 3]) == 0
    assert core.next_partition([5, 3]) == 1  # round-robin
    assert core.plan_new(0, 0, 5, credits=3) == (0, 3)
    core.sent(7, 0, 0, 3, now=0.0)
    assert core.position(0) == 3 and core.unacked == 3 and core.delivered == 3
    assert core.plan_new(0, 0, 5, credits=10) == (3, 5)  # the batch again, from the position
    assert core.plan_new(0, 0, 3, credits=10) is None  # already past it
    assert core.take_dirty() == {0: core.cursors[0].encode()}
    assert core.take_dirty() == {}


def test_a_gap_before_a_batch_is_stepped_over_not_delivered() -> None:
    core = _core()
    core.sent(1, 0, 0, 2, now=0.0)
    assert core.plan_new(0, 5, 2, credits=10) == (5, 7)  # offsets 2..4 hold no record
    assert core.cursors[0].unacked() == [0, 1]
    core.ack([m.AckEntry(0, 0), m.AckEntry(0, 1)], m.AckKind.INDIVIDUAL)
    assert core.cursors[0].floor == 5


def test_ack_timeout_redelivers_after_the_backoff() -> None:
    core = _core(ack_timeout_ms=1000, backoff_initial_ms=100)
    core.sent(1, 0, 0, 3, now=0.0)
    core.ack([m.AckEntry(0, 1)], m.AckKind.INDIVIDUAL)
    assert core.wake_at() == 1.0
    core.expire(0.999)
    assert core.take_due(0.999, credits=10) is None
    core.expire(1.0)
    assert core.unacked == 0
    assert core.take_due(1.05, credits=10) is None  # the backoff: 100 ms
    assert core.wake_at() == pytest.approx(1.1)
    due = core.take_due(1.1, credits=10)
    assert due is not None and (due.partition, due.offsets) == (0, [0, 2])
    plan = core.split_due(0, [_record(0), _record(2)])
    assert plan.dead == [] and [[r.offset for r in run] for run in plan.send] == [[0], [2]]
    assert core.delivery_count(0, [0]) == 2


def test_exponential_backoff_grows_with_deliveries_and_is_capped() -> None:
    settings = _settings(backoff=m.Backoff.EXPONENTIAL, backoff_initial_ms=100, backoff_max_ms=350)
    assert [settings.redelivery_delay(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.35, 0.35]


def test_nack_delay_and_consumer_leaving() -> None:
    core = _core()
    core.sent(1, 0, 0, 2, now=0.0)
    core.sent(2, 0, 2, 4, now=0.0)
    core.nack([m.AckEntry(0, 0)], delay_ms=500, now=0.0)
    core.nack([m.AckEntry(0, 0)], delay_ms=500, now=0.0)  # not in flight any more: ignored
    core.consumer_left(2, now=0.1)  # its offsets are due at once
    due = core.take_due(0.1, credits=10)
    assert due is not None and due.offsets == [2, 3]
    assert core.take_due(0.4, credits=10) is None
    due = core.take_due(0.5, credits=10)
    assert due is not None and due.offsets == [0]
    with pytest.raises(InvalidRequest, match="nack delay"):
        core.nack([m.AckEntry(0, 1)], delay_ms=-1, now=0.0)


def test_redelivery_is_limited_by_credit_and_skips_what_was_acked_meanwhile() -> None:
    core = _core()
    core.sent(1, 0, 0, 5, now=0.0)
    core.consumer_left(1, now=0.0)
    core.ack([m.AckEntry(0, 1)], m.AckKind.INDIVIDUAL)
    first = core.take_due(0.0, credits=2)
    assert first is not None and first.offsets == [0, 2]
    second = core.take_due(0.0, credits=2)
    assert second is not None and second.offsets == [3, 4]


def test_max_deliveries_dead_letters_and_a_refused_dead_letter_is_retried() -> None:
    core = _core(max_deliveries=2)
    core.sent(1, 0, 0, 2, now=0.0)
    core.consumer_left(1, now=0.0)
    core.sent(1, 0, 0, 2, now=0.0)  # the second delivery
    core.consumer_left(1, now=0.0)
    due = core.take_due(0.0, credits=10)
    assert due is not None and due.offsets == [0, 1]
    plan = core.split_due(0, [_record(0), _record(1)])
    assert [(r.offset, count) for r, count in plan.dead] == [(0, 2), (1, 2)]
    assert plan.send == []
    core.dead_letter_written(0, 0)
    core.dead_letter_failed(0, 1, now=0.0)
    assert core.dead_lettered == 1 and core.cursors[0].floor == 1
    assert core.take_due(DEAD_LETTER_RETRY - 0.01, credits=10) is None
    retry = core.take_due(DEAD_LETTER_RETRY, credits=10)
    assert retry is not None and retry.offsets == [1]


def test_a_restart_redelivers_what_was_dispatched_and_not_acked_at_once() -> None:
    cursor = PartitionCursor.starting_at(0)
    cursor.record_delivery(0, 3)
    cursor.ack(1)
    core = ReliableDelivery(_settings(), [cursor], shared=False, now=50.0)
    due = core.take_due(50.0, credits=10)
    assert due is not None and due.offsets == [0, 2]


def test_acks_are_checked_and_seek_forgets_everything_in_flight() -> None:
    core = _core(shared=True)
    core.sent(1, 0, 0, 3, now=0.0)
    with pytest.raises(InvalidRequest, match="cumulative"):
        core.ack([m.AckEntry(0, 2)], m.AckKind.CUMULATIVE)
    with pytest.raises(InvalidRequest, match="topic 't' has no partition 3"):
        core.ack([m.AckEntry(3, 0)], m.AckKind.INDIVIDUAL)
    core.reset([10])
    assert core.unacked == 0 and core.wake_at() is None and core.position(0) == 10
    core.expire(100.0)
    assert core.take_due(100.0, credits=10) is None


def test_cumulative_ack_clears_everything_below() -> None:
    core = _core()
    core.sent(1, 0, 0, 4, now=0.0)
    core.ack([m.AckEntry(0, 2)], m.AckKind.CUMULATIVE)
    assert core.unacked == 1 and core.cursors[0].floor == 3
    assert core.backlog([10]) == 7


def test_cursor_ack_range_from_the_floor_jumps_and_elsewhere_adds() -> None:
    cursor = PartitionCursor.starting_at(0)
    cursor.record_delivery(0, 10)
    cursor.record_delivery(2, 4)  # redelivered: counts 2
    assert cursor.ack_range(5, 8) and cursor.floor == 0 and cursor.acked.ranges() == [(5, 8)]
    assert not cursor.ack_range(5, 8)  # nothing new
    assert cursor.ack_range(-3, 5)  # below the floor is clamped; reaches the acked run
    assert cursor.floor == 8 and not cursor.acked and cursor.counts == {}
    assert cursor.ack_range(8, 1_000_000) and cursor.floor == 10  # past dispatched: clamped
    assert not cursor.ack_range(0, 10)


_ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["send", "ack", "nack", "expire", "redeliver", "late", "retention"]),
        st.integers(0, 40),
        st.integers(1, 8),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_ACTIONS)
def test_acking_ranges_is_acking_each_offset(actions: list[tuple[str, int, int]]) -> None:
    """ACK_RANGES and ACK of every offset one by one leave the same cursor, the same messages
    in flight and due, and the same redeliveries, whatever was sent, nacked or timed out."""
    by_range, by_offset = _core(), _core()
    now = 0.0
    for kind, offset, size in actions:
        for core in (by_range, by_offset):
            if kind == "send":
                planned = core.plan_new(0, 0, 1_000, credits=size)
                if planned is not None:
                    core.sent(1, 0, *planned, now=now)
            elif kind == "ack" and core is by_range:
                core.ack_ranges([m.AckRange(0, offset, size)])
            elif kind == "ack":
                entries = [m.AckEntry(0, o) for o in range(offset, offset + size)]
                core.ack(entries, m.AckKind.INDIVIDUAL)
            elif kind == "nack":
                core.nack([m.AckEntry(0, offset)], 0, now)
            elif kind == "redeliver":
                due = core.take_due(now, credits=size)
                for run in runs([_record(o) for o in due.offsets] if due else []):
                    core.sent(2, 0, run[0].offset, run[-1].offset + 1, now=now)
            elif kind == "late":  # the first offset due is acked while its redelivery is read
                due = core.take_due(now, credits=size)
                if due and due.offsets:
                    late = due.offsets[0]
                    if core is by_range:
                        core.ack_ranges([m.AckRange(0, late, 1)])
                    else:
                        core.ack([m.AckEntry(0, late)], m.AckKind.INDIVIDUAL)
                    for run in core.split_due(0, [_record(o) for o in due.offsets]).send:
                        core.sent(2, 0, run[0].offset, run[-1].offset + 1, now=now)
            elif kind == "retention":  # the log's start passed the cursor
                cursor = core.cursors[0]
                if offset > cursor.floor:
                    core.restart_at(0, max(offset, cursor.dispatched))
            else:
                core.expire(now)
        if kind == "expire":
            now += size / 4  # past some ack timeouts (1 s) and backoffs (0.1 s), not all
    assert by_range.cursors[0].encode() == by_offset.cursors[0].encode()
    assert by_range.unacked == by_offset.unacked
    assert by_range.in_flight(0) == by_offset.in_flight(0)
    assert by_range.open_deliveries == by_offset.open_deliveries
    assert by_range.wake_at() == by_offset.wake_at()
    later = now + 100.0
    for core in (by_range, by_offset):
        core.expire(later)
    due_range, due_offset = by_range.take_due(later, 10_000), by_offset.take_due(later, 10_000)
    assert (due_range and due_range.offsets) == (due_offset and due_offset.offsets)


def test_a_delivery_acked_to_the_last_offset_is_forgotten_at_once() -> None:
    core = _core()
    core.sent(1, 0, 0, 4, now=0.0)
    core.sent(1, 0, 4, 8, now=0.0)
    core.ack_ranges([m.AckRange(0, 0, 3)])
    assert core.open_deliveries == 2
    core.ack([m.AckEntry(0, 3)], m.AckKind.INDIVIDUAL)
    assert core.open_deliveries == 1  # the first, all acked: no ack timeout to wait out
    core.nack([m.AckEntry(0, o) for o in range(4, 8)], 0, now=0.0)
    assert core.open_deliveries == 0 and core.unacked == 0
    with pytest.raises(InvalidRequest, match="topic 't' has no partition 2"):
        core.ack_ranges([m.AckRange(2, 0, 1)])


class _CountingDict(dict[int, int]):
    """An in-flight map that counts the lookups and the walks made over it."""

    pops = walks = 0

    def pop(self, *args: object) -> int:  # type: ignore[override]
        self.pops += 1
        return super().pop(*args)  # type: ignore[arg-type,no-any-return]

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.walks += 1
        return super().__iter__()


def test_an_acks_work_follows_what_is_in_flight_not_what_is_asked() -> None:
    """One message left unacked at the floor keeps [floor, dispatched) open over everything
    acked after it: a range re-acking 10,000 of those offsets looks up only what is in flight
    (it looked up every offset: 26 ms for a 38-byte request). And 10,000 cumulative entries
    walk what is in flight once, not once an entry (10,000 walks of 100,000 held the loop)."""
    core = _core()
    core.sent(1, 0, 0, 20_000, now=0.0)
    core.ack_ranges([m.AckRange(0, 1, 9_999)])
    core.ack_ranges([m.AckRange(0, 10_000, 10_000)])
    assert core.in_flight(0) == 1 and core.cursors[0].floor == 0
    counting = core._in_flight[0] = _CountingDict(core._in_flight[0])
    core.ack_ranges([m.AckRange(0, 5_000, 10_000)])  # all acked already
    assert counting.pops <= 1 and core.in_flight(0) == 1
    counting.walks = 0
    core.ack([m.AckEntry(0, o) for o in range(10_000)], m.AckKind.CUMULATIVE)
    assert counting.walks == 1
    assert core.in_flight(0) == 0 and core.cursors[0].floor == 20_000


def test_runs_split_at_missing_offsets() -> None:
    records = [_record(o) for o in (1, 2, 4, 5, 6, 9)]
    assert [[r.offset for r in run] for run in runs(records)] == [[1, 2], [4, 5, 6], [9]]


# ConsumerGroup


@dataclass
class _Session:
    writable: bool = True


@dataclass(eq=False)
class _Member:
    consumer_id: int
    name: str
    priority: int = 0
    credits: int = 0
    session: _Session = field(default_factory=_Session)


def test_exclusive_admits_one_consumer() -> None:
    group: ConsumerGroup[_Member] = ConsumerGroup("t", "s", m.SubscriptionType.EXCLUSIVE)
    first = _Member(1, "a", credits=1)
    group.add(first)
    with pytest.raises(ConsumerBusy):
        group.add(_Member(2, "b"))
    assert group.pick() is first
    first.session.writable = False
    assert group.pick() is None


def test_failover_elects_the_lowest_and_reports_each_change() -> None:
    elected: list[str | None] = []
    group: ConsumerGroup[_Member] = ConsumerGroup(
        "t", "s", m.SubscriptionType.FAILOVER, lambda c: elected.append(c.name if c else None)
    )
    b, a = _Member(1, "b", credits=1), _Member(2, "a", credits=1)
    group.add(b)
    group.add(a)
    assert group.pick() is a
    group.remove(a)
    assert group.pick() is b
    group.remove(b)
    assert elected == ["b", "a", "b", None]


def test_shared_picks_the_most_credit_and_rotates_among_equals() -> None:
    group: ConsumerGroup[_Member] = ConsumerGroup("t", "s", m.SubscriptionType.SHARED)
    members = [_Member(i, f"c{i}") for i in range(3)]
    for member in members:
        group.add(member)
        group.grant(member, 2)
    picked = []
    for _ in range(6):
        chosen = group.pick()
        assert chosen is not None
        picked.append(chosen.consumer_id)
        group.charge(chosen, 1)
    assert sorted(picked) == [0, 0, 1, 1, 2, 2] and picked[:3] == [0, 1, 2]
    assert group.pick() is None


# LastValueKeys


def test_last_value_changes_keep_the_newest_value_per_key() -> None:
    keys = LastValueKeys("t", 1)
    records = [
        Record(0, 5, b"a", b"1", ()),
        Record(1, 6, None, b"unkeyed", ()),
        Record(2, 7, b"a", b"2", ()),
        Record(3, 8, b"b", None, ()),
    ]
    batch = KeyedBatch.of_records(records, keys.check(records))
    changes = batch.changes(0, 100, batch.newest())
    assert [(c.key, c.offset, c.value) for c in changes] == [(b"a", 102, b"2"), (b"b", 103, None)]


_HEADERS = st.lists(
    st.tuples(st.sampled_from(["h", "é"]), st.none() | st.binary(max_size=3)), max_size=2
).map(tuple)
_RECORDS = st.lists(
    st.tuples(
        st.none() | st.sampled_from([b"a", b"b", b"c", b"d"]),
        st.none() | st.binary(max_size=8),
        st.integers(0, 2**40),
        st.none() | _HEADERS,
    ),
    max_size=12,
)


@given(records=_RECORDS, base=st.integers(0, 2**40))
@settings(max_examples=300, deadline=None)
def test_a_keyed_batch_plans_what_applying_its_records_in_order_leaves(
    records: list[
        tuple[bytes | None, bytes | None, int, tuple[tuple[str, bytes | None], ...] | None]
    ],
    base: int,
) -> None:
    """Applying the records one by one to a dict is the model: the plan stores each key's newest
    value (bytes that decode to it, headers included) and deletes each key whose newest record
    is a tombstone; the changes name the same values; a map set's columns (no headers) and the
    records' columns plan alike."""
    as_records = [Record(i, ts, k, v, h or ()) for i, (k, v, ts, h) in enumerate(records)]
    model: dict[bytes, StoredValue] = {}
    for position, record in enumerate(as_records):
        if record.key is not None:
            model[record.key] = StoredValue(
                record.key, 3, base + position, record.timestamp, record.value, record.headers
            )
    batch = KeyedBatch.of_records(as_records, [r.key for r in as_records])
    newest = batch.newest()
    puts, deletes = batch.plan(3, base, newest)
    assert {k: StoredValue.decode(k, data) for k, data in puts.items()} == {
        k: v for k, v in model.items() if v.value is not None
    }
    assert sorted(deletes) == sorted(k for k, v in model.items() if v.value is None)
    assert {c.key: c for c in batch.changes(3, base, newest)} == model
    if not any(h for *_, h in records):
        timestamps = [r.timestamp for r in as_records]
        columns = KeyedBatch([r.key for r in as_records], [r.value for r in as_records], timestamps)
        assert columns.plan(3, base, columns.newest()) == (puts, deletes)


@given(batches=st.lists(_RECORDS, max_size=6))
@settings(max_examples=100, deadline=None)
def test_the_stored_key_count_follows_the_keys_that_exist(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[list[tuple[bytes | None, bytes | None, int, object]]],
) -> None:
    """The count kept beside the values (MAP_SIZE) equals the keys with a value, after any
    sequence of batches with repeated keys and tombstones, and after reopening the store."""
    state = StateStore(tmp_path_factory.mktemp("count") / "state")
    try:
        store = LastValueStore(state, "t", 1)
        alive: set[bytes] = set()
        for records in batches:
            batch = KeyedBatch(
                [k for k, *_ in records], [v for _, v, *_ in records], [0] * len(records)
            )
            newest = batch.newest()
            puts, deletes = batch.plan(0, store.applied(0), newest)
            store.write(0, store.applied(0) + len(records), puts, deletes)
            alive = (alive | puts.keys()) - set(deletes)
            assert store.size() == len(alive)
        assert LastValueStore(state, "t", 1).size() == len(alive)
    finally:
        state.close()


@given(
    steps=st.lists(
        st.one_of(_RECORDS, st.just("clear"), st.just("reopen"), st.just("forget")), max_size=10
    ),
    generation=st.integers(1, 400),
)
@settings(max_examples=150, deadline=None)
def test_the_key_count_stays_exact_whatever_the_known_keys_remember(
    tmp_path_factory: pytest.TempPathFactory,
    steps: list[list[tuple[bytes | None, bytes | None, int, object]] | str],
    generation: int,
) -> None:
    """`KnownKeys` spares the count a lookup per key written before; with generations of a few
    bytes (keys forgotten at every turn), a partition cleared, the store reopened and the known
    keys dropped between batches, the count still equals the keys with a value."""
    state = StateStore(tmp_path_factory.mktemp("known") / "state")
    try:
        state.known_last_values = KnownKeys(generation_bytes=generation)
        store = LastValueStore(state, "t", 1)
        alive: set[bytes] = set()
        for step in steps:
            if step == "clear":
                store.clear(0, lambda data: True)
                alive = set()
            elif step == "reopen":
                store = LastValueStore(state, "t", 1)
            elif step == "forget":
                state.known_last_values.clear()
            else:
                assert not isinstance(step, str)
                batch = KeyedBatch([k for k, *_ in step], [v for _, v, *_ in step], [0] * len(step))
                puts, deletes = batch.plan(0, store.applied(0), batch.newest())
                store.write(0, store.applied(0) + len(step), puts, deletes)
                alive = (alive | puts.keys()) - set(deletes)
            assert store.size() == len(alive)
            assert store.size() == len(store.scan(b"")[0])
    finally:
        state.close()


def test_a_key_written_before_is_counted_without_a_lookup(tmp_path: Path) -> None:
    """The count looks a key up only the first time it is written (and after a delete): a
    key set again, or deleted, while known costs no RocksDB read."""
    state = StateStore(tmp_path / "state")
    lookups: list[int] = []
    get_many = state.get_many
    state.get_many = lambda keys: lookups.append(len(keys)) or get_many(keys)  # type: ignore[method-assign]
    try:
        store = LastValueStore(state, "t", 1)
        store.write(0, 2, {b"a": b"1", b"b": b"2"}, [])
        assert lookups == [2] and store.size() == 2
        store.write(0, 4, {b"a": b"3", b"b": b"4"}, [])
        assert lookups == [2] and store.size() == 2  # both known: no lookup
        store.write(0, 5, {}, [b"a"])
        assert lookups == [2] and store.size() == 1  # known: it existed
        store.write(0, 6, {}, [b"a"])  # deleted, so no longer known: looked up, absent
        assert lookups == [2, 1] and store.size() == 1
        store.write(0, 7, {b"a": b"5", b"c": b"6"}, [])
        assert lookups == [2, 1, 2] and store.size() == 3
    finally:
        state.close()


def test_known_keys_hold_no_deleted_key_and_stay_within_two_generations() -> None:
    known = KnownKeys(generation_bytes=10 * (ENTRY_OVERHEAD + 2))
    known.add([b"k0", b"k1"])
    assert known.unknown([b"k0", b"k1", b"k2"]) == {b"k2"}
    known.discard([b"k1"])
    assert known.unknown([b"k0", b"k1"]) == {b"k1"}
    for start in range(0, 100, 5):  # twenty batches of five new keys: the young set turns over
        known.add([b"%02d" % i for i in range(start, start + 5)])
    held = [b"%02d" % i for i in range(100)]
    remembered = len(held) - len(known.unknown(held))
    assert 0 < remembered <= 20 and b"k0" not in known  # at most two generations of ten keys
    assert b"99" in known and b"95" in known
    known.add([b"95"])  # a key of the old generation written again joins the young one
    known.clear()
    assert known.unknown([b"95"]) == {b"95"}


def test_known_keys_stay_within_their_memory_bound() -> None:
    """Two generations of `generation_bytes` at most, measured: 400,000 distinct keys written
    through a 1 MiB bound hold under 2 MiB (they would need about 40 MiB)."""
    import tracemalloc

    tracemalloc.start()
    try:
        known = KnownKeys(generation_bytes=1 << 20)
        for start in range(0, 400_000, 50):
            known.add([b"lv/topic\0key%012d" % i for i in range(start, start + 50)])
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 2 << 20, held
    assert b"lv/topic\0key000000399999" in known


def test_last_value_keys_from_a_field_and_their_partition() -> None:
    keys = LastValueKeys("t", 4, key_field="user.id")
    record = Record(0, 0, None, b'{"user": {"id": 42}}', ())
    assert keys.key_of(record) == b"42"
    home = partition_for_key(b"42", 4)
    assert keys.partition_for([record]) == home
    with pytest.raises(WrongPartition):
        keys.check([record], (home + 1) % 4)
    with pytest.raises(InvalidRequest, match="not JSON"):
        keys.key_of(Record(0, 0, None, b"nope", ()))


# StateWriter


async def test_state_writer_group_commits_concurrent_synced_writes(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    try:
        writer = StateWriter(store)
        waits = [writer.synced({f"k{i}".encode(): b"%d" % i}) for i in range(50)]
        assert writer.write({b"plain": b"x"}) is None  # not synced: written at once
        assert store.get(b"plain") == b"x"
        await asyncio.gather(*waits)
        assert writer.commits <= 2  # the first write, then everything queued behind it
        assert all(store.get(f"k{i}".encode()) == b"%d" % i for i in range(50))
        second = writer.synced({b"k0": b"new"})
        third = writer.synced({b"k0": b"newer"})
        await asyncio.gather(second, third)
        assert store.get(b"k0") == b"newer"  # in order: the later write wins
        await writer.flush()
    finally:
        store.close()


async def test_writes_synced_within_a_time_are_readable_at_once_and_share_one_sync(
    tmp_path: Path,
) -> None:
    store = StateStore(tmp_path / "state")
    try:
        writer = StateWriter(store)
        # a window longer than the test: only `flush` syncs it
        pending = {writer.write_within(600.0, {b"c%d" % i: b"%d" % i}) for i in range(100)}
        assert all(store.get(b"c%d" % i) == b"%d" % i for i in range(100))  # written at once
        (synced,) = pending  # one sync for the window
        assert not synced.done() and writer.commits == 0
        await writer.flush()
        assert synced.done() and writer.commits == 1

        # the timer's own path; a synced write queued meanwhile is covered by the same commit
        soon = writer.write_within(0.01, {b"c0": b"new"})
        assert soon is not synced
        await asyncio.wait_for(soon, 5)
        assert writer.commits == 2 and store.get(b"c0") == b"new"
    finally:
        store.close()


class _FailingSyncs(StateStore):
    """RocksDB whose synced writes fail, as on a disk gone bad (rocksdict raises a plain
    Exception for an I/O error); writes without a sync still succeed."""

    def write_all(
        self, changes: Sequence[tuple[dict[bytes, bytes], list[bytes]]], sync: bool = False
    ) -> None:
        if sync:
            raise Exception("IO error: No space left on device")
        super().write_all(changes, sync)


async def test_a_failed_sync_within_the_interval_is_logged_and_left_to_whoever_waits(
    tmp_path: Path,
) -> None:
    """Nobody waits for a cursor's sync (the ack was answered): a failure came out only as
    asyncio's "exception was never retrieved", at garbage collection."""
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    store = _FailingSyncs(tmp_path / "state")
    try:
        writer = StateWriter(store)
        with structlog.testing.capture_logs() as logs:
            writer.write_within(600.0, {b"cursor": b"1"})  # dropped, as the subscription does
            await writer.flush()
            gc.collect()
        assert store.get(b"cursor") == b"1"  # written at once; only the sync failed
        assert [e["event"] for e in logs if e["log_level"] == "error"] == ["state.sync_failed"]
        assert "No space left" in logs[-1]["error"]
        waited = writer.write_within(600.0, {b"cursor": b"2"})
        await writer.flush()
        with pytest.raises(StorageError, match="No space left"):
            await waited
        gc.collect()
        assert unhandled == []
    finally:
        loop.set_exception_handler(None)
        store.close()


async def test_producer_ids_are_counted_in_memory_and_survive_a_restart(tmp_path: Path) -> None:
    from headwater.server.topics.idempotent_producers import ProducerIds

    store = StateStore(tmp_path / "state")
    try:
        ids = ProducerIds(StateWriter(store))
        first, durable = ids.issue()
        second, durable_too = ids.issue()
        assert (first, second) == (0, 1)
        assert ids.issued(1) and not ids.issued(2)  # known before the writes complete
        await asyncio.gather(durable, durable_too)
        third, durable = ProducerIds(StateWriter(store)).issue()
        await durable
        assert third == 2
    finally:
        store.close()
