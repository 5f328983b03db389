"""Idempotent produce: per partition, the recent batches of each producer id, for deduplication.

An idempotent producer numbers its records per partition (the batch header's base sequence) and
resends a batch with the same numbers after a failure. For each producer the table keeps the last
`RECENT_BATCHES` batches it appended, as (base sequence, record count, base offset):

- a batch whose sequence is the next expected one is new: append it, then `record` it;
- a batch equal to a recent one (same base sequence and count) is a retry of something already
  appended: answer with the offset it got, append nothing;
- anything else is a gap or a stale retry: `OutOfOrderSequence`, and nothing is appended.

A producer's first batch on a partition must start at sequence 0, unless the table is not
`complete`: in a cluster a new owner rebuilds it from the newest part of the partition's log only
(`server.cluster.cluster_partitions`), so a producer it does not know may have written earlier,
and its first batch here starts where it is (Kafka accepts any sequence from a producer whose
state it no longer has the same way). `encode`/`decode` let the server persist a producer's entry
(RocksDB) so a restart keeps deduplicating.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field

from headwater.wire.errors import OutOfOrderSequence

RECENT_BATCHES = 32  # more than a client keeps in flight, so every retry is recognised
_ENTRY = struct.Struct(">iiq")  # base sequence, record count, base offset


@dataclass(slots=True)
class ProducerEntry:
    recent: deque[tuple[int, int, int]] = field(
        default_factory=lambda: deque(maxlen=RECENT_BATCHES)
    )

    @property
    def next_sequence(self) -> int:
        if not self.recent:
            return 0
        sequence, count, _ = self.recent[-1]
        return sequence + count

    def encode(self) -> bytes:
        return b"".join(_ENTRY.pack(*batch) for batch in self.recent)

    @classmethod
    def decode(cls, data: bytes) -> ProducerEntry:
        entry = cls()
        entry.recent.extend(_ENTRY.iter_unpack(data))
        return entry


class ProducerTable:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        # False: built from part of the log only, so a producer not in it may start anywhere
        self.complete = True

    def reset(self, complete: bool) -> None:
        """Forget every producer (a cluster's new owner, before it rebuilds the table)."""
        self.producers.clear()
        self.complete = complete

    def check(self, producer_id: int, base_sequence: int, count: int) -> int | None:
        """The original base offset if this batch is a retry of an appended one; None if new."""
        entry = self.producers.get(producer_id)
        if entry is None and not self.complete:
            return None  # not in the part of the log the table was built from: new here
        expected = entry.next_sequence if entry else 0
        if base_sequence == expected:
            return None
        if entry is not None:
            for sequence, recorded_count, base_offset in entry.recent:
                if sequence == base_sequence and recorded_count == count:
                    return base_offset
        raise OutOfOrderSequence(
            f"producer {producer_id}: batch starts at sequence {base_sequence}, expected {expected}"
        )

    def recover(self, producer_id: int, base_sequence: int, count: int, base_offset: int) -> None:
        """A batch found in the WAL on start: record it unless the stored state already has it
        (the state is written just after the append, so it can miss at most the newest)."""
        entry = self.producers.get(producer_id)
        if entry is None or base_sequence >= entry.next_sequence:
            self.record(producer_id, base_sequence, count, base_offset)

    def record(
        self, producer_id: int, base_sequence: int, count: int, base_offset: int
    ) -> ProducerEntry:
        entry = self.producers.setdefault(producer_id, ProducerEntry())
        entry.recent.append((base_sequence, count, base_offset))
        return entry
