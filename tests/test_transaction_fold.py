"""`wire.transaction_fold`: each batch's fate from the markers that follow it, released in offset
order as a read_committed reader would see the log; against a naive model (for every batch, look
ahead for its producer's next marker) on random histories; and the walk of stored segments the
Spark WAL source reads them with, which takes markers as batches."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.storage.segments import walk_batches
from headwater.wire.markers import BatchHeader, Marker, build_marker
from headwater.wire.records import (
    CONTROL_FLAG,
    TRANSACTIONAL_FLAG,
    BatchBuilder,
    stamp_base_offset,
)
from headwater.wire.transaction_fold import Fate, TransactionFold, fates

# one batch of a history: ("plain", -), ("data", producer), ("commit" | "abort", producer)
Step = tuple[str, int]


def headers(history: list[Step]) -> list[tuple[BatchHeader, Marker | None]]:
    """Headers of one-offset batches at offsets 0, 1, 2, ... (offsets are the indexes)."""
    out: list[tuple[BatchHeader, Marker | None]] = []
    for offset, (kind, producer) in enumerate(history):
        control = kind in ("commit", "abort")
        marker = {"commit": Marker.COMMIT, "abort": Marker.ABORT}.get(kind)
        header = BatchHeader(
            offset, offset + 1, producer, 0, transactional=kind != "plain", control=control
        )
        out.append((header, marker))
    return out


def naive(history: list[Step]) -> list[Fate]:
    """The definition: a transactional batch's fate is its producer's next marker's."""
    found = []
    for index, (kind, producer) in enumerate(history):
        if kind == "plain":
            found.append(Fate.PLAIN)
        elif kind != "data":
            found.append(Fate.MARKER)
        else:
            ending = next(
                (k for k, p in history[index + 1 :] if p == producer and k in ("commit", "abort")),
                None,
            )
            fate = {"commit": Fate.COMMITTED, "abort": Fate.ABORTED, None: Fate.UNDECIDED}
            found.append(fate[ending])
    return found


def test_a_committed_an_aborted_and_an_open_transaction_among_plain_batches() -> None:
    history: list[Step] = [
        ("plain", -1),  # 0
        ("data", 7),  # 1 committed
        ("data", 8),  # 2 aborted
        ("plain", -1),  # 3 behind 1: held until 1 is decided
        ("data", 7),  # 4 committed
        ("commit", 7),  # 5
        ("data", 9),  # 6 open
        ("abort", 8),  # 7
        ("plain", -1),  # 8 behind 6
    ]
    fold: TransactionFold[int] = TransactionFold()
    released = []
    for offset, (header, marker) in enumerate(headers(history)):
        released.append(fold.follow(header, marker, offset))
    assert released[0] == [(0, Fate.PLAIN)]
    assert released[1:5] == [[], [], [], []]
    assert released[5] == [(1, Fate.COMMITTED)]  # 2 (producer 8) still open: 3, 4, 5 wait
    assert released[7] == [
        (2, Fate.ABORTED),
        (3, Fate.PLAIN),
        (4, Fate.COMMITTED),
        (5, Fate.MARKER),
    ]  # 6 is open: 7 waits behind it
    assert fold.stable_offset == 6
    assert set(fold.waiting_for) == {9}
    assert fold.drain() == [(6, Fate.UNDECIDED), (7, Fate.MARKER), (8, Fate.PLAIN)]
    assert not fold.holding and fold.stable_offset is None
    assert fates(headers(history)) == naive(history)


def test_a_marker_matches_its_producer_whatever_its_epoch_and_a_stray_one_decides_nothing() -> None:
    fold: TransactionFold[str] = TransactionFold()
    data = BatchHeader(10, 13, 5, 2, transactional=True, control=False)
    assert fold.follow(data, None, "data") == []
    # the coordinator aborts a timed-out transaction under a bumped epoch
    abort = BatchHeader(13, 14, 5, 3, transactional=True, control=True)
    assert fold.follow(abort, Marker.ABORT, "abort") == [
        ("data", Fate.ABORTED),
        ("abort", Fate.MARKER),
    ]
    stray = BatchHeader(14, 15, 6, 0, transactional=True, control=True)
    assert fold.follow(stray, Marker.COMMIT, "stray") == [("stray", Fate.MARKER)]
    with pytest.raises(ValueError, match="marker type"):
        fold.follow(stray, None, "no type")


steps = st.lists(
    st.one_of(
        st.just(("plain", -1)),
        st.tuples(st.sampled_from(["data", "data", "commit", "abort"]), st.integers(1, 4)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_the_fold_agrees_with_the_naive_model_and_releases_a_prefix(history: list[Step]) -> None:
    expected = naive(history)
    fold: TransactionFold[int] = TransactionFold()
    released: list[tuple[int, Fate]] = []
    for seen, (header, marker) in enumerate(headers(history), 1):
        released.extend(fold.follow(header, marker, header.base_offset))
        # what is out is exactly what a reader of the first `seen` batches may see: the
        # prefix before the first batch still undecided there, with the fates it will keep
        so_far = naive(history[:seen])
        prefix = next((i for i, f in enumerate(so_far) if f is Fate.UNDECIDED), seen)
        assert released == [(i, expected[i]) for i in range(prefix)]
        assert fold.stable_offset == (prefix if prefix < seen else None)
    released.extend(fold.drain())
    assert released == list(enumerate(expected))
    assert fates(headers(history)) == expected


def test_the_walker_of_stored_segments_takes_markers_as_batches() -> None:
    """What the Spark WAL source walks: a segment holding a marker (`storage.segments`)."""
    marker = bytearray(build_marker(4, 1, Marker.COMMIT, coordinator_epoch=2))
    stamp_base_offset(marker, 1234)  # outside the CRC, as the log stamps it
    builder = BatchBuilder()
    builder.append(b"k", b"v")
    segment = builder.build(1233) + bytes(marker)
    walked = list(walk_batches(segment, 1233))
    assert [(w.batch.base_offset, w.batch.attributes) for w in walked if w.batch] == [
        (1233, 0),
        (1234, CONTROL_FLAG | TRANSACTIONAL_FLAG),
    ]
    damaged = bytearray(marker)
    damaged[-3] ^= 0x01
    broken = segment[: -len(marker)] + bytes(damaged)
    assert [w.batch is None for w in walk_batches(broken, 1233)] == [False, True]
