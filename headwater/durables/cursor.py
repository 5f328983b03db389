"""A reliable subscription's acknowledgement state for one partition, and its byte encoding.

`floor` is the cursor: every offset below it is acknowledged. Offsets acknowledged out of order sit
in `acked` until the floor reaches them. `dispatched` is the first offset never delivered, so on a
restart every offset in [floor, dispatched) that is not in `acked` was delivered and not
acknowledged: it is delivered again. `counts` holds delivery counts above 1 (every offset below
`dispatched` was delivered at least once), so redelivery limits survive restarts.

Pure state, no I/O: the server persists `encode()` in RocksDB, in one WriteBatch with the other
partitions an acknowledgement touched.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

_HEAD = struct.Struct(">qqii")  # floor, dispatched, len(acked), len(counts)
_ACKED = struct.Struct(">q")
_COUNT = struct.Struct(">qi")


@dataclass(slots=True)
class PartitionCursor:
    floor: int = 0
    dispatched: int = 0
    acked: set[int] = field(default_factory=set)
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
        self.acked.add(offset)
        self._advance()
        return True

    def ack_range(self, first: int, end: int) -> bool:
        """Acknowledge every delivered offset in [first, end); False if none was outstanding.
        A run that starts at the floor (a consumer acking in order) moves the floor over it
        without adding its offsets to `acked` one by one."""
        first = max(first, self.floor)
        end = min(end, self.dispatched)
        if first >= end:
            return False
        if first == self.floor:
            # what was acked or counted inside the run goes; walked from whichever side is
            # shorter (the run's length is the client's to choose)
            if self.acked:
                self.acked.difference_update(offsets_within(self.acked, first, end))
            if self.counts:
                for offset in offsets_within(self.counts, first, end):
                    self.counts.pop(offset, None)
            self.floor = end
            self._advance()
            return True
        before = len(self.acked)
        self.acked.update(range(first, end))
        return len(self.acked) != before

    def ack_up_to(self, offset: int) -> bool:
        """Acknowledge every delivered offset up to and including `offset`."""
        end = min(offset + 1, self.dispatched)
        if end <= self.floor:
            return False
        self.floor = end
        self.acked = {o for o in self.acked if o >= end}
        self.counts = {o: c for o, c in self.counts.items() if o >= end}
        self._advance()
        return True

    def _advance(self) -> None:
        while self.floor in self.acked:
            self.acked.discard(self.floor)
            self.counts.pop(self.floor, None)
            self.floor += 1

    def unacked(self) -> list[int]:
        """Delivered and not acknowledged, in offset order."""
        return [o for o in range(self.floor, self.dispatched) if o not in self.acked]

    def reset(self, offset: int) -> None:
        self.floor = self.dispatched = offset
        self.acked.clear()
        self.counts.clear()

    def encode(self) -> bytes:
        parts = [_HEAD.pack(self.floor, self.dispatched, len(self.acked), len(self.counts))]
        parts.extend(_ACKED.pack(o) for o in sorted(self.acked))
        parts.extend(_COUNT.pack(o, c) for o, c in sorted(self.counts.items()))
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes) -> PartitionCursor:
        floor, dispatched, acked_count, counts_count = _HEAD.unpack_from(data, 0)
        position = _HEAD.size
        acked = set()
        for _ in range(acked_count):
            acked.add(_ACKED.unpack_from(data, position)[0])
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
