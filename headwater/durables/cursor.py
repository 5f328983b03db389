"""A reliable subscription's acknowledgement state for one partition, and its byte encoding.

`floor` is the cursor: every offset below it is acknowledged. Offsets acknowledged out of order sit
in `acked`, as ranges (`AckedRanges`), until the floor reaches them. `dispatched` is the first
offset never delivered, so on a restart every offset in [floor, dispatched) that is not in `acked`
was delivered and not acknowledged: it is delivered again. `counts` holds delivery counts above 1
(every offset below `dispatched` was delivered at least once), so redelivery limits survive
restarts.

Acks above the floor are ranges, not one int per offset: a message that is never acknowledged at
the floor (a poison message on a Shared subscription with no delivery limit) while the consumers
ack everything after it in order costs one range, however many they ack, in memory and on disk.
Scattered acks still make a range per hole, so the encoding is capped as Pulsar caps it
(`managedLedgerMaxUnackedRangesToPersist`, 10,000 by default): only the first
`MAX_PERSISTED_RANGES` ranges above the floor, the ones nearest it, and the delivery counts below
the end of the last of them, are written. What was acknowledged above that is not in the encoding,
and after a restart it is delivered again (at-least-once, docs/DURABLES.md).

Pure state, no I/O: the server persists `encode()` in RocksDB, in one WriteBatch with the other
partitions an acknowledgement touched. The encoding is versioned: `decode` reads the first one
(one int per acknowledged offset) as it was written, and the next write of the cursor is ranges.
"""

from __future__ import annotations

import heapq
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

# Encoding 1 (no version byte): floor, dispatched, len(acked), len(counts), then each acked
# offset, then each (offset, count). Encoding 2: the byte _RANGES (a first byte no encoding 1 has:
# it begins with the floor, a non-negative int64, so with a byte below 0x80), then floor,
# dispatched, number of ranges, number of counts, then each range (first, end), then each
# (offset, count).
_HEAD = struct.Struct(">qqii")
_ACKED = struct.Struct(">q")
_COUNT = struct.Struct(">qi")
_RANGES = 0x82
_HEAD_2 = struct.Struct(">Bqqii")
_RANGE = struct.Struct(">qq")

# Ranges of acknowledged offsets above the floor written at most (Pulsar's
# managedLedgerMaxUnackedRangesToPersist): 160 KB of ranges, whatever the acks
MAX_PERSISTED_RANGES = 10_000


class AckedRanges:
    """Offsets, as sorted disjoint half-open ranges [first, end): adjacent ranges are merged, so
    offsets acknowledged in order are one range whatever their number. `len` is the number of
    offsets held."""

    __slots__ = ("_count", "_ends", "_firsts")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._firsts: list[int] = []
        self._ends: list[int] = []
        self._count = 0
        for first, end in ranges:
            self.add(first, end)

    def __contains__(self, offset: object) -> bool:
        if not isinstance(offset, int):
            return False
        at = bisect_right(self._firsts, offset) - 1
        return at >= 0 and offset < self._ends[at]

    def __len__(self) -> int:
        return self._count

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AckedRanges):
            return NotImplemented
        return self._firsts == other._firsts and self._ends == other._ends

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"AckedRanges({self.ranges()!r})"

    def __bool__(self) -> bool:
        return bool(self._firsts)

    def ranges(self, limit: int | None = None) -> list[tuple[int, int]]:
        """The ranges in order, the first `limit` of them when given."""
        return list(zip(self._firsts[:limit], self._ends[:limit], strict=True))

    @property
    def range_count(self) -> int:
        return len(self._firsts)

    def add(self, first: int, end: int) -> int:
        """Hold [first, end); returns how many of its offsets were not held before."""
        if first >= end:
            return 0
        firsts, ends = self._firsts, self._ends
        # the ranges that overlap or touch [first, end) are merged into it
        low = bisect_left(ends, first)
        high = bisect_right(firsts, end)
        if low < high:
            covered = sum(ends[i] - firsts[i] for i in range(low, high))
            merged_first = min(first, firsts[low])
            merged_end = max(end, ends[high - 1])
        else:
            covered = 0
            merged_first, merged_end = first, end
        firsts[low:high] = [merged_first]
        ends[low:high] = [merged_end]
        added = (merged_end - merged_first) - covered
        self._count += added
        return added

    def drop_below(self, offset: int) -> None:
        """Forget every offset below `offset` (the floor moved there)."""
        firsts, ends = self._firsts, self._ends
        cut = bisect_right(ends, offset)
        if cut:
            self._count -= sum(ends[i] - firsts[i] for i in range(cut))
            del firsts[:cut], ends[:cut]
        if firsts and firsts[0] < offset:
            self._count -= offset - firsts[0]
            firsts[0] = offset

    def take_run_at(self, offset: int) -> int:
        """The end of the range that starts at `offset`, removed; `offset` when none does."""
        firsts = self._firsts
        if firsts and firsts[0] == offset:  # the cursor's case: the range at its floor
            at = 0
        else:
            at = bisect_left(firsts, offset)
            if at == len(firsts) or firsts[at] != offset:
                return offset
        end = self._ends.pop(at)
        firsts.pop(at)
        self._count -= end - offset
        return end

    def gaps(self, first: int, end: int) -> Iterator[tuple[int, int]]:
        """The ranges of [first, end) not held, in order."""
        at = first
        for held_first, held_end in zip(self._firsts, self._ends, strict=True):
            if held_end <= at:
                continue
            if held_first >= end:
                break
            if held_first > at:
                yield at, held_first
            at = max(at, held_end)
        if at < end:
            yield at, end

    def clear(self) -> None:
        self._firsts.clear()
        self._ends.clear()
        self._count = 0


@dataclass(slots=True)
class PartitionCursor:
    floor: int = 0
    dispatched: int = 0
    acked: AckedRanges = field(default_factory=AckedRanges)
    counts: dict[int, int] = field(default_factory=dict)

    @classmethod
    def starting_at(cls, offset: int) -> PartitionCursor:
        return cls(floor=offset, dispatched=offset)

    def is_acked(self, offset: int) -> bool:
        return offset < self.floor or offset in self.acked

    def delivery_count(self, offset: int) -> int:
        """How many times `offset` has been delivered."""
        if offset >= self.dispatched:
            return 0
        return self.counts.get(offset, 1)

    def record_delivery(self, first: int, end: int) -> None:
        """Offsets [first, end) were just sent to a consumer."""
        if first >= self.dispatched:
            self.dispatched = max(self.dispatched, end)
            return
        # below the floor, acked already (a redelivery that raced its ack): nothing to count
        for offset in range(max(first, self.floor), min(end, self.dispatched)):
            self.counts[offset] = self.counts.get(offset, 1) + 1
        self.dispatched = max(self.dispatched, end)

    def ack(self, offset: int) -> bool:
        """Acknowledge one delivered offset; False if it was not outstanding."""
        if offset < self.floor or offset >= self.dispatched or offset in self.acked:
            return False
        self.acked.add(offset, offset + 1)
        self._advance()
        return True

    def ack_range(self, first: int, end: int) -> bool:
        """Acknowledge every delivered offset in [first, end); False if none was outstanding.
        A run that starts at the floor (a consumer acking in order) moves the floor over it."""
        first = max(first, self.floor)
        end = min(end, self.dispatched)
        if first >= end:
            return False
        if first == self.floor:
            self.acked.drop_below(end)
            self._drop_counts(first, end)
            self.floor = end
            self._advance()
            return True
        return self.acked.add(first, end) > 0

    def ack_up_to(self, offset: int) -> bool:
        """Acknowledge every delivered offset up to and including `offset`."""
        end = min(offset + 1, self.dispatched)
        if end <= self.floor:
            return False
        self.floor = end
        self.acked.drop_below(end)
        self.counts = {o: c for o, c in self.counts.items() if o >= end}
        self._advance()
        return True

    def _advance(self) -> None:
        # ranges are merged when they touch, so one range at most starts at the floor
        end = self.acked.take_run_at(self.floor)
        if end != self.floor:
            self._drop_counts(self.floor, end)
            self.floor = end

    def _drop_counts(self, first: int, end: int) -> None:
        # walked from whichever side is shorter (a range's length is the client's to choose)
        if self.counts:
            for offset in offsets_within(self.counts, first, end):
                self.counts.pop(offset, None)

    def unacked(self) -> list[int]:
        """Delivered and not acknowledged, in offset order."""
        return [
            offset
            for first, end in self.acked.gaps(self.floor, self.dispatched)
            for offset in range(first, end)
        ]

    def reset(self, offset: int) -> None:
        self.floor = self.dispatched = offset
        self.acked.clear()
        self.counts.clear()

    @property
    def ranges_over_cap(self) -> int:
        """Ranges of acknowledged offsets `encode` leaves out (0: it writes them all)."""
        return max(0, self.acked.range_count - MAX_PERSISTED_RANGES)

    def encode(self, max_ranges: int = MAX_PERSISTED_RANGES) -> bytes:
        """Encoding 2, with at most `max_ranges` ranges (the first, nearest the floor) and as
        many delivery counts (those of the lowest offsets): what it leaves out is delivered
        again after a restart, with its count starting over."""
        ranges = self.acked.ranges(max_ranges)
        counts = (
            sorted(self.counts.items())
            if len(self.counts) <= max_ranges
            else heapq.nsmallest(max_ranges, self.counts.items())
        )
        parts = [_HEAD_2.pack(_RANGES, self.floor, self.dispatched, len(ranges), len(counts))]
        parts.extend(_RANGE.pack(first, end) for first, end in ranges)
        parts.extend(_COUNT.pack(o, c) for o, c in counts)
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes) -> PartitionCursor:
        if data[0] == _RANGES:
            _, floor, dispatched, range_count, counts_count = _HEAD_2.unpack_from(data, 0)
            position = _HEAD_2.size
            acked = AckedRanges()
            for _ in range(range_count):
                acked.add(*_RANGE.unpack_from(data, position))
                position += _RANGE.size
        else:  # encoding 1, as cursors were stored before ranges: one int per acked offset
            floor, dispatched, acked_count, counts_count = _HEAD.unpack_from(data, 0)
            position = _HEAD.size
            acked = AckedRanges()
            for _ in range(acked_count):
                offset = _ACKED.unpack_from(data, position)[0]
                acked.add(offset, offset + 1)
                position += _ACKED.size
        counts = {}
        for _ in range(counts_count):
            offset, count = _COUNT.unpack_from(data, position)
            counts[offset] = count
            position += _COUNT.size
        return cls(floor, dispatched, acked, counts)


def offsets_within(found: set[int] | dict[int, int], first: int, end: int) -> Iterable[int]:
    """The offsets of [first, end) that may be in `found`, in offset order: the range itself
    when it is the shorter walk, else the members of `found` inside it. A client chooses a
    range's length; what `found` holds is bounded by what was dispatched."""
    if end - first <= len(found):
        return range(first, end)
    return sorted(o for o in found if first <= o < end)
