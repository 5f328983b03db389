"""The last-value state and transactions, against a model, on a real RocksDB (no server).

Any interleaving of plain writes and deletions, transactional writes of a few producers, their
commits and aborts (markers for nothing open too), and reopenings of the store, taken through
`LastValueIndex` as the append path takes them (`apply`, `hold`, `end_transaction`), leaves each
key with its last record by offset among the committed ones: the fold of the log a Kafka
read_committed consumer makes once every transaction has ended. Nothing of an open or aborted
transaction is ever a value, at any step, and once no transaction is open nothing of them is
left in the store.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.durables.lastvalue import KeyedBatch
from headwater.server.topics.lastvalue_index import LastValueIndex
from headwater.storage.lastvalue_store import LVDEL, LVTXN
from headwater.storage.state import StateStore, key

_KEYS = [b"a", b"b", b"c", b"d"]
_VALUES = st.one_of(st.none(), st.sampled_from([b"1", b"2", b"3"]))
_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("plain"), st.sampled_from(_KEYS), _VALUES),
        st.tuples(st.just("txn"), st.integers(0, 2), st.sampled_from(_KEYS), _VALUES),
        st.tuples(st.sampled_from(["commit", "abort"]), st.integers(0, 2)),
        st.just(("reopen",)),
    ),
    max_size=40,
)

Record = tuple[int, bytes, bytes | None]  # offset, key, value (None: a deletion)


class Model:
    """The log's committed records, folded by offset."""

    def __init__(self) -> None:
        self.committed: list[Record] = []
        self.open: dict[int, list[Record]] = {}

    def values(self) -> dict[bytes, bytes]:
        found: dict[bytes, bytes | None] = {}
        for _, record_key, value in sorted(self.committed):
            found[record_key] = value
        return {k: v for k, v in found.items() if v is not None}


def _batch(record_key: bytes, value: bytes | None) -> KeyedBatch:
    return KeyedBatch([record_key], [value], [0])


def _values(index: LastValueIndex) -> dict[bytes, bytes]:
    rows, _ = index.scan(b"")
    return {row.key: row.value for row in rows if row.value is not None}


@given(steps=_STEPS)
@settings(max_examples=300, deadline=None)
def test_a_keys_value_is_its_last_committed_record_by_offset(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[object, ...]]
) -> None:
    state = StateStore(tmp_path_factory.mktemp("lvtxn") / "state")
    try:
        index = LastValueIndex(state, "t", 1)
        model = Model()
        offset = 0
        for step in steps:
            kind = step[0]
            if kind == "reopen":  # what a restart reads back (the position, what is held)
                index = LastValueIndex(state, "t", 1)
                continue
            if kind == "plain":
                _, record_key, value = step
                assert isinstance(record_key, bytes) and (value is None or isinstance(value, bytes))
                index.apply(0, offset, _batch(record_key, value))
                model.committed.append((offset, record_key, value))
            elif kind == "txn":
                _, producer, record_key, value = step
                assert isinstance(producer, int) and isinstance(record_key, bytes)
                assert value is None or isinstance(value, bytes)
                index.hold(0, producer, offset, _batch(record_key, value))
                model.open.setdefault(producer, []).append((offset, record_key, value))
            else:
                (_, producer) = step
                assert isinstance(producer, int)
                index.end_transaction(0, producer, offset, kind == "commit")
                ended = model.open.pop(producer, [])
                if kind == "commit":
                    model.committed += ended
            offset += 1
            assert index.applied(0) == offset
            assert _values(index) == model.values(), steps
        for producer in list(model.open):
            index.end_transaction(0, producer, offset, False)
            offset += 1
        assert _values(index) == model.values()
        for prefix in (LVTXN, LVDEL):  # nothing held, nothing remembered
            assert list(state.scan(key(prefix, "t") + b"\0")) == []
        assert index.size() == len(model.values())
    finally:
        state.close()


def test_a_rebuilt_partition_forgets_what_it_held(tmp_path: Path) -> None:
    """A partition's state restarted (a cluster take-over) loses its held changes with its
    values: the replay from offset 0 holds them again."""
    state = StateStore(tmp_path / "state")
    try:
        index = LastValueIndex(state, "t", 2)
        index.hold(1, 7, 0, _batch(b"k", b"v"))
        index.apply(0, 0, _batch(b"j", None))  # (another partition holds nothing)
        index.restart_partition(1)
        assert list(state.scan(key(LVTXN, "t") + b"\0")) == []
        assert LastValueIndex(state, "t", 2).applied(1) == 0
        index.end_transaction(1, 7, 0, True)  # the marker, at the restarted position
        assert _values(index) == {}
    finally:
        state.close()
