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

Each entry also holds the producer's epoch (Kafka's producer epoch, which a transactional
producer's coordinator bumps to fence an older instance): a batch of an older epoch is refused
(`InvalidProducerEpoch`), one of a newer epoch starts the numbering again at sequence 0, and a
transaction marker of a newer epoch (`fence`) moves the entry to it, so the fenced instance's
next batch is refused.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field

from headwater.wire.errors import InvalidProducerEpoch, OutOfOrderSequence

RECENT_BATCHES = 32  # more than a client keeps in flight, so every retry is recognised
_ENTRY = struct.Struct(">iiq")  # base sequence, record count, base offset
# encoding 2: this first byte (encoding 1 starts with a base sequence, a non-negative int32, so
# with a byte below 0x80), then the epoch, then the entries as in encoding 1
_WITH_EPOCH = 0x81
_EPOCH_HEAD = struct.Struct(">Bh")


@dataclass(slots=True)
class ProducerEntry:
    recent: deque[tuple[int, int, int]] = field(
        default_factory=lambda: deque(maxlen=RECENT_BATCHES)
    )
    epoch: int = -1

    @property
    def next_sequence(self) -> int:
        if not self.recent:
            return 0
        sequence, count, _ = self.recent[-1]
        return sequence + count

    def encode(self) -> bytes:
        head = _EPOCH_HEAD.pack(_WITH_EPOCH, self.epoch)
        return head + b"".join(_ENTRY.pack(*batch) for batch in self.recent)

    @classmethod
    def decode(cls, data: bytes) -> ProducerEntry:
        entry = cls(epoch=0)  # encoding 1 was written before epochs: every producer had 0
        if data[:1] == bytes((_WITH_EPOCH,)):
            _, entry.epoch = _EPOCH_HEAD.unpack_from(data)
            data = data[_EPOCH_HEAD.size :]
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

    def check(
        self, producer_id: int, base_sequence: int, count: int, epoch: int = -1
    ) -> int | None:
        """The original base offset if this batch is a retry of an appended one; None if new."""
        entry = self.producers.get(producer_id)
        if entry is not None and epoch != entry.epoch:
            if epoch < entry.epoch:
                raise InvalidProducerEpoch(
                    f"producer {producer_id}: epoch {epoch} is older than {entry.epoch} "
                    "(a newer instance of the producer fenced this one)"
                )
            entry = None  # a new epoch numbers from 0 again
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

    def recover(
        self, producer_id: int, base_sequence: int, count: int, base_offset: int, epoch: int = -1
    ) -> None:
        """A batch found in the WAL on start: record it unless the stored state already has it
        (the state is written just after the append, so it can miss at most the newest)."""
        entry = self.producers.get(producer_id)
        if entry is not None and epoch < entry.epoch:
            return
        if entry is None or epoch > entry.epoch or base_sequence >= entry.next_sequence:
            self.record(producer_id, base_sequence, count, base_offset, epoch)

    def record(
        self, producer_id: int, base_sequence: int, count: int, base_offset: int, epoch: int = -1
    ) -> ProducerEntry:
        entry = self.producers.setdefault(producer_id, ProducerEntry())
        if epoch != entry.epoch:
            entry.recent.clear()  # a new epoch numbers from 0 again
            entry.epoch = epoch
        entry.recent.append((base_sequence, count, base_offset))
        return entry

    def fence(self, producer_id: int, epoch: int) -> ProducerEntry | None:
        """A transaction marker of `epoch` was written: an older epoch's batches are refused from
        now on. The entry changed (to persist), or None."""
        entry = self.producers.get(producer_id)
        if entry is None:
            if not self.complete:
                return None  # may have written before the part of the log the table knows
            entry = self.producers[producer_id] = ProducerEntry(epoch=epoch)
            return entry
        if epoch <= entry.epoch:
            return None
        entry.recent.clear()
        entry.epoch = epoch
        return entry
