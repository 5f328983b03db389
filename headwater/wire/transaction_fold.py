"""Each batch's fate in a transaction, decided from the markers in the log itself.

A partition's log interleaves plain batches, transactional batches (the transactional bit and a
producer id) and markers (control batches, COMMIT or ABORT: `wire.markers`). A transactional batch
belongs to its producer's transaction open in the partition, and the first marker of that producer
after it ends that transaction. So one pass in offset order decides every batch:

- PLAIN: not transactional, visible;
- COMMITTED: a COMMIT marker of its producer follows, visible at its own offset;
- ABORTED: an ABORT marker of its producer follows, never visible;
- UNDECIDED: no marker of its producer follows (yet): its transaction is open where the pass
  ends, and the partition's last stable offset (LSO) is at or below its transaction's first batch;
- MARKER: a control batch, never a record.

`TransactionFold` is that pass, incremental. `follow` takes each batch's header
(`markers.peek`), the marker type of a control batch, and an item of the caller's (the batch's
bytes, where it was read), and returns the items whose fate became known, in offset order. Like a
read_committed reader it holds everything after the first undecided batch until that batch's marker
comes, so what it has released is always a prefix of the log, up to `stable_offset`. A plain batch
with nothing held goes straight back; a caller can even skip the call while `holding` is false and
the header's transactional bit is clear, so the common case (no transactions) costs one test of the
attributes per batch. `drain` ends a pass: everything still held, the undecided batches as such.
Records are never decoded: a batch's header decides.

Markers are matched by producer id alone, as Kafka matches them: the abort the coordinator writes
for a timed-out or fenced transaction carries a bumped epoch. A marker of a producer with nothing
held (its transaction's batches came before the pass began, or the marker was written twice)
decides nothing.

Pure: no I/O.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, KeysView
from typing import Generic, TypeVar

from headwater.wire.markers import BatchHeader, Marker

T = TypeVar("T")


class Fate(enum.Enum):
    PLAIN = "plain"
    COMMITTED = "committed"
    ABORTED = "aborted"
    UNDECIDED = "undecided"
    MARKER = "marker"

    @property
    def visible(self) -> bool:
        """Whether a transaction-aware reader sees the batch's records."""
        return self is Fate.PLAIN or self is Fate.COMMITTED


class _Held(Generic[T]):
    """A batch held back: undecided (`fate` None), or decided behind an undecided one."""

    __slots__ = ("fate", "item", "offset")

    def __init__(self, item: T, offset: int, fate: Fate | None) -> None:
        self.item = item
        self.offset = offset
        self.fate = fate


class TransactionFold(Generic[T]):
    """One partition's batches, followed in offset order; see the module docstring."""

    __slots__ = ("_open", "_queue")

    def __init__(self) -> None:
        self._queue: deque[_Held[T]] = deque()  # held, in offset order; the first is undecided
        self._open: dict[int, list[_Held[T]]] = {}  # producer -> its undecided batches

    @property
    def holding(self) -> bool:
        return bool(self._queue)

    @property
    def stable_offset(self) -> int | None:
        """The first offset still undecided (the LSO of what was followed); None: nothing held."""
        return self._queue[0].offset if self._queue else None

    @property
    def waiting_for(self) -> KeysView[int]:
        """The producers with an undecided transaction: only their markers can release anything."""
        return self._open.keys()

    def follow(self, header: BatchHeader, marker: Marker | None, item: T) -> list[tuple[T, Fate]]:
        """Follow the next batch (`marker`: a control batch's type); the items now decided."""
        if header.control:
            if marker is None:
                raise ValueError("a control batch is followed with its marker type")
            fate = Fate.COMMITTED if marker is Marker.COMMIT else Fate.ABORTED
            for held in self._open.pop(header.producer_id, ()):
                held.fate = fate
            if not self._queue:
                return [(item, Fate.MARKER)]
            self._queue.append(_Held(item, header.base_offset, Fate.MARKER))
            return self._release()
        if not header.transactional:
            if not self._queue:
                return [(item, Fate.PLAIN)]
            self._queue.append(_Held(item, header.base_offset, Fate.PLAIN))
            return []
        held = _Held(item, header.base_offset, None)
        self._open.setdefault(header.producer_id, []).append(held)
        self._queue.append(held)
        return []

    def drain(self) -> list[tuple[T, Fate]]:
        """End the pass: every item still held, in offset order, the undecided ones UNDECIDED."""
        drained = [(h.item, h.fate or Fate.UNDECIDED) for h in self._queue]
        self._queue.clear()
        self._open.clear()
        return drained

    def _release(self) -> list[tuple[T, Fate]]:
        released: list[tuple[T, Fate]] = []
        queue = self._queue
        while queue:
            fate = queue[0].fate
            if fate is None:
                break
            released.append((queue.popleft().item, fate))
        return released


def fates(batches: Iterable[tuple[BatchHeader, Marker | None]]) -> list[Fate]:
    """Every batch's fate, in order, given a whole pass at once."""
    fold: TransactionFold[int] = TransactionFold()
    found: dict[int, Fate] = {}
    for index, (header, marker) in enumerate(batches):
        found.update(fold.follow(header, marker, index))
    found.update(fold.drain())
    return [found[i] for i in range(len(found))]
