"""One partition's transactions: which are open, which were aborted, and the last stable offset.

A transactional producer's batches sit in the log like any other, flagged transactional, until a
marker of the same producer (`wire.markers`) ends its transaction in this partition. Following
each append, this table keeps:

- `open`: per producer, the offset of its open transaction's first batch here. The last stable
  offset (LSO, `stable_end`) is the smallest of them (or the end when none is open): below it,
  every transactional batch's fate is written, so a read_committed reader reads up to it and no
  further.
- the aborted transactions, as (producer, first offset, marker offset) ranges: a read_committed
  reader drops a producer's transactional batches inside one of its aborted ranges
  (`hides`), and a Kafka Fetch lists the ranges that overlap what it returns
  (`aborted_overlapping`), as Kafka's broker does from its transaction index.

A marker for a producer with nothing open here (a partition added to a transaction but never
written, or a marker written again after a crash) changes nothing, nor does one below the first
offset of the producer's open transaction: an earlier transaction's, followed again on start
(the stored state is already past it; closing the open one with it would store an aborted range
that hides nothing). In a cluster a new owner rebuilds the table from the log after a take-over;
meanwhile it is `held` at an offset no transaction it may find open starts below, so the LSO does
not run ahead of what is known. The table is pure state (`appended` is told each batch's header);
the server persists what changes (open transactions in the producer entries' neighbour keys,
aborted ranges once each) and rebuilds it on start.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from headwater.wire.markers import BatchHeader, Marker

# aborted ranges one lookup walks at most past the first one that ends in the range asked for
MAX_LISTED: Final = 10_000


@dataclass(frozen=True, slots=True)
class AbortedRange:
    producer_id: int
    first_offset: int
    last_offset: int  # the abort marker's offset


@dataclass(frozen=True, slots=True)
class Opened:
    """A producer's first transactional batch of a transaction, here: persist it."""

    producer_id: int
    first_offset: int


@dataclass(frozen=True, slots=True)
class Closed:
    """A marker ended a producer's transaction, here: `aborted` when it was an abort."""

    producer_id: int
    first_offset: int
    aborted: AbortedRange | None


class PartitionTransactions:
    __slots__ = ("_aborted", "_by_producer", "_lasts", "held", "open")

    def __init__(self) -> None:
        self.open: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self._aborted: list[AbortedRange] = []  # in marker order (the log's)
        self._lasts: list[int] = []  # their last offsets, for bisect
        self._by_producer: dict[int, list[AbortedRange]] = {}
        # the LSO goes no further while the table is being rebuilt (a cluster's take-over)
        self.held: int | None = None

    def reset(self, held: int | None = None) -> None:
        """Forget everything (a take-over rebuilds the table), the LSO held at `held`."""
        self.open.clear()
        self._aborted.clear()
        self._lasts.clear()
        self._by_producer.clear()
        self.held = held

    def appended(self, header: BatchHeader, marker: Marker | None = None) -> Opened | Closed | None:
        """Follow one appended batch (`marker`: a control batch's type). What changed, if
        anything the server persists."""
        producer = header.producer_id
        if header.control:
            first = self.open.get(producer)
            if first is None or header.base_offset < first:
                # nothing open here, or the marker of an earlier transaction (the last
                # segment's batches are followed again on start, over the stored state)
                return None
            del self.open[producer]
            aborted = None
            if marker == Marker.ABORT:
                aborted = AbortedRange(producer, first, header.base_offset)
                self.add_aborted(aborted)
            return Closed(producer, first, aborted)
        if not header.transactional or producer in self.open:
            return None
        self.open[producer] = header.base_offset
        return Opened(producer, header.base_offset)

    def add_aborted(self, aborted: AbortedRange) -> None:
        """An aborted range, appended in marker order (or restored in that order on start)."""
        if self._lasts and aborted.last_offset <= self._lasts[-1]:
            if aborted in self._by_producer.get(aborted.producer_id, ()):
                return  # restored twice (the state store and the WAL's recovered tail)
            at = bisect_left(self._lasts, aborted.last_offset)
            self._aborted.insert(at, aborted)
            self._lasts.insert(at, aborted.last_offset)
        else:
            self._aborted.append(aborted)
            self._lasts.append(aborted.last_offset)
        ranges = self._by_producer.setdefault(aborted.producer_id, [])
        ranges.append(aborted)
        ranges.sort(key=lambda r: r.first_offset)

    def restore(self, open_transactions: dict[int, int], aborted: Iterable[AbortedRange]) -> None:
        """The persisted state, on start (before the WAL's recovered batches are followed)."""
        self.open.update(open_transactions)
        for entry in sorted(aborted, key=lambda r: r.last_offset):
            self.add_aborted(entry)

    def stable_end(self, end: int) -> int:
        """The last stable offset given the partition's readable `end`."""
        if self.held is not None:
            end = min(end, self.held)
        if not self.open:
            return end
        return min(end, min(self.open.values()))

    def hides(self, header: BatchHeader) -> bool:
        """Whether a read_committed reader skips the batch: a marker, or an aborted batch."""
        if header.control:
            return True
        if not header.transactional:
            return False
        ranges = self._by_producer.get(header.producer_id)
        if not ranges:
            return False
        offset = header.base_offset
        # few per producer: each aborted transaction it wrote here
        return any(r.first_offset <= offset <= r.last_offset for r in ranges)

    def aborted_at(self, marker_offset: int) -> AbortedRange | None:
        """The aborted range whose marker is at `marker_offset`, if any."""
        at = bisect_left(self._lasts, marker_offset)
        if at < len(self._lasts) and self._lasts[at] == marker_offset:
            return self._aborted[at]
        return None

    def aborted_overlapping(self, start: int, end: int) -> list[AbortedRange]:
        """The aborted ranges that overlap [start, end): what a Kafka read_committed Fetch of
        those offsets lists, for its client to drop their batches."""
        found: list[AbortedRange] = []
        at = bisect_left(self._lasts, start)
        for aborted in self._aborted[at : at + MAX_LISTED]:
            if aborted.first_offset < end:
                found.append(aborted)
        return found

    def forget_below(self, offset: int) -> list[AbortedRange]:
        """Retention removed everything below `offset`: the aborted ranges that end below it
        can no longer hide anything. Returns them (to delete from the state store)."""
        at = bisect_left(self._lasts, offset)
        gone, self._aborted, self._lasts = self._aborted[:at], self._aborted[at:], self._lasts[at:]
        for aborted in gone:
            ranges = self._by_producer.get(aborted.producer_id, [])
            if aborted in ranges:
                ranges.remove(aborted)
            if not ranges:
                self._by_producer.pop(aborted.producer_id, None)
        return gone

    def forget_from(self, offset: int) -> None:
        """A crash took away what was at or past `offset` (recovery found the data ending
        there): what the state store said of it is forgotten. An abort whose marker was lost and
        whose batches were not is open again, so nothing shows its batches before the
        coordinator writes the marker again (it does: the transaction is not complete until its
        markers are synced)."""
        for producer, first in list(self.open.items()):
            if first >= offset:
                del self.open[producer]
        at = bisect_left(self._lasts, offset)
        for aborted in self._aborted[at:]:
            ranges = self._by_producer.get(aborted.producer_id, [])
            if aborted in ranges:
                ranges.remove(aborted)
            if aborted.first_offset < offset:
                known = self.open.get(aborted.producer_id, aborted.first_offset)
                self.open[aborted.producer_id] = min(known, aborted.first_offset)
        del self._aborted[at:]
        del self._lasts[at:]

    @property
    def aborted_count(self) -> int:
        return len(self._aborted)
