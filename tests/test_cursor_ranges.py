"""A reliable subscription's acknowledgements above its floor are ranges, and what is written of
them is capped (`durables.cursor`, docs/DURABLES.md "Acknowledgement state").

A poison message at the floor of a Shared subscription with no delivery limit held the floor
while every later ack went into a set of ints, written whole, 8 bytes an offset, at every flush:
the cursor grew without bound. Now in-order acks above a held floor are one range, scattered ones
a range per hole, and only the first `MAX_PERSISTED_RANGES` ranges are written (Pulsar's
`managedLedgerMaxUnackedRangesToPersist`); after a restart those left out are delivered again.
Cursors stored in the first encoding (one int per acked offset) still decode. No I/O, no clock:
the core is driven with `now` passed in.
"""

from __future__ import annotations

import itertools
import struct

from hypothesis import example, given
from hypothesis import strategies as st

from headwater.durables.cursor import MAX_PERSISTED_RANGES, AckedRanges, PartitionCursor
from headwater.durables.delivery import ReliableDelivery, ReliableSettings
from headwater.wire.messages import AckEntry, AckKind, AckRange, Backoff

_SETTINGS = ReliableSettings(30_000, 0, Backoff.FIXED, 1_000, 60_000)  # no delivery limit


def _shared(cursors: list[PartitionCursor]) -> ReliableDelivery:
    return ReliableDelivery(_SETTINGS, cursors, shared=True, now=0.0, topic="t")


def test_a_poison_message_at_the_floor_does_not_grow_the_cursor() -> None:
    core = _shared([PartitionCursor.starting_at(0)])
    sizes = []
    sent = 0
    for total in (1_000, 50_000):
        core.sent(1, 0, sent, total, now=0.0)
        # offset 0 is never acked (each delivery of it fails); every later one is, one by one
        core.ack([AckEntry(0, o) for o in range(max(sent, 1), total)], AckKind.INDIVIDUAL)
        sent = total
        (encoded,) = core.take_dirty().values()
        sizes.append(len(encoded))
    assert sizes[0] == sizes[1] < 100, f"the cursor grew with the acks: {sizes} bytes"
    cursor = core.cursors[0]
    assert cursor.floor == 0 and cursor.acked.ranges() == [(1, 50_000)]
    # and the same through ACK_RANGES
    core.sent(1, 0, 50_000, 60_000, now=0.0)
    core.ack_ranges([AckRange(0, 50_000, 10_000)])
    (encoded,) = core.take_dirty().values()
    assert len(encoded) == sizes[0]
    # after a restart only the poison message is due again
    restarted = _shared([PartitionCursor.decode(encoded)])
    due = restarted.take_due(0.0, 1_000_000)
    assert due is not None and due.offsets == [0]


def test_past_the_cap_the_first_ranges_are_written_and_the_rest_redelivered() -> None:
    cursor = PartitionCursor.starting_at(0)
    holes = MAX_PERSISTED_RANGES + 5
    cursor.record_delivery(0, 2 * holes + 1)
    for offset in range(1, 2 * holes + 1, 2):  # every odd offset: a range per hole
        assert cursor.ack(offset)
    assert cursor.acked.range_count == holes and cursor.ranges_over_cap == 5
    encoded = cursor.encode()
    assert len(encoded) < 20 * MAX_PERSISTED_RANGES + 100
    restored = PartitionCursor.decode(encoded)
    assert restored.floor == 0 and restored.dispatched == cursor.dispatched
    assert restored.acked.ranges() == cursor.acked.ranges(MAX_PERSISTED_RANGES)
    # acked and written: not delivered again; acked past the cap: delivered again (at-least-once)
    last_written = 2 * MAX_PERSISTED_RANGES - 1
    assert restored.is_acked(last_written)
    assert not restored.is_acked(last_written + 2)
    unacked = restored.unacked()
    assert unacked[:3] == [0, 2, 4]
    assert unacked[-11:] == list(range(2 * MAX_PERSISTED_RANGES, 2 * holes + 1))


def test_the_cap_holds_for_delivery_counts_too() -> None:
    cursor = PartitionCursor.starting_at(0)
    cursor.record_delivery(0, MAX_PERSISTED_RANGES + 10)
    cursor.record_delivery(0, MAX_PERSISTED_RANGES + 10)  # every offset redelivered: counts 2
    restored = PartitionCursor.decode(cursor.encode())
    assert len(restored.counts) == MAX_PERSISTED_RANGES
    assert restored.delivery_count(MAX_PERSISTED_RANGES - 1) == 2  # nearest the floor: kept
    assert restored.delivery_count(MAX_PERSISTED_RANGES) == 1  # past the cap: starts over


def test_a_cursor_stored_in_the_first_encoding_still_decodes() -> None:
    # encoding 1: floor, dispatched, len(acked), len(counts), each acked offset, each count
    acked = [12, 13, 15]
    old = b"".join(
        [
            struct.pack(">qqii", 10, 20, len(acked), 1),
            *(struct.pack(">q", o) for o in acked),
            struct.pack(">qi", 11, 3),
        ]
    )
    cursor = PartitionCursor.decode(old)
    assert (cursor.floor, cursor.dispatched) == (10, 20)
    assert cursor.acked.ranges() == [(12, 14), (15, 16)] and len(cursor.acked) == 3
    assert cursor.counts == {11: 3} and cursor.unacked() == [10, 11, 14, *range(16, 20)]
    assert PartitionCursor.decode(cursor.encode()) == cursor  # written again as ranges
    assert cursor.encode() != old


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 60), st.integers(0, 12)),
        st.tuples(st.just("drop"), st.integers(0, 70), st.just(0)),
        st.tuples(st.just("take"), st.integers(0, 70), st.just(0)),
    ),
    max_size=40,
)


@given(_ops)
@example([("add", 0, 1), ("add", 2, 1), ("take", 2, 0)])  # a range that is not the first
def test_acked_ranges_hold_the_offsets_a_set_would(ops: list[tuple[str, int, int]]) -> None:
    ranges = AckedRanges()
    model: set[int] = set()
    for op, at, length in ops:
        if op == "add":
            added = ranges.add(at, at + length)
            assert added == len(set(range(at, at + length)) - model)
            model.update(range(at, at + length))
        elif op == "drop":
            ranges.drop_below(at)
            model = {o for o in model if o >= at}
        else:
            expected = at
            if at in model and at - 1 not in model:  # a range starts there: it goes
                while expected in model:
                    model.discard(expected)
                    expected += 1
            assert ranges.take_run_at(at) == expected
        assert len(ranges) == len(model)
        assert all((o in ranges) == (o in model) for o in range(-1, 90))
        found = ranges.ranges()
        assert all(e < f for (_, e), (f, _) in itertools.pairwise(found))
        gaps = [o for first, end in ranges.gaps(0, 90) for o in range(first, end)]
        assert gaps == [o for o in range(90) if o not in model]


def test_a_committed_transaction_acks_what_a_previous_owner_dispatched_past_the_checkpoint() -> (
    None
):
    """A cluster's new owner took its cursor from a checkpoint that says offsets 0-9 were
    dispatched; the previous owner had sent up to 30, and a transaction committed the
    acknowledgements of 20-29. They are acked (not dropped as never sent, which delivered them
    again), and 10-19, sent by that owner before them, are due at once as a take-over's
    unacked are; nothing past the partition's end is taken."""
    cursor = PartitionCursor(floor=5, dispatched=10)
    core = _shared([cursor])
    core.ack_committed([AckRange(0, 20, 10), AckRange(0, 40, 5)], [35], now=1.0)
    assert cursor.dispatched == 35  # the second range cut to the end: 30-34 taken as sent
    assert all(cursor.is_acked(o) for o in range(20, 30))
    assert not any(cursor.is_acked(o) for o in (*range(5, 20), *range(30, 35)))
    due = core.take_due(now=1.0, credits=100)
    assert due is not None and due.offsets == [*range(5, 20), *range(30, 35)]
    assert core.dirty == {0}


def test_a_committed_range_far_past_what_was_dispatched_is_acked_as_far_as_it_was() -> None:
    """A gap over MAX_COMMITTED_GAP offsets is not taken as dispatched (a bound on what one
    acknowledgement costs): the range is acked up to `dispatched` only, at-least-once."""
    from headwater.durables.delivery import MAX_COMMITTED_GAP

    cursor = PartitionCursor(floor=0, dispatched=10)
    core = _shared([cursor])
    far = 10 + MAX_COMMITTED_GAP + 1
    core.ack_committed([AckRange(0, 5, 2), AckRange(0, far, 10)], [far + 100], now=0.0)
    assert cursor.dispatched == 10 and cursor.floor == 0
    assert cursor.is_acked(5) and cursor.is_acked(6) and not cursor.is_acked(far)
    due = core.take_due(now=0.0, credits=100)  # (what a restart finds unacked: 0-9, as before)
    assert due is not None and max(due.offsets) < 10
