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

A new owner's rebuild reads the newest part of the log first (`add_older`, each batch older than
every one the table holds) and answers a producer's batch before it is done when the table
already answers it as it will once done (`answers`): the producer's newest batch is in it (it is
the first one of that producer the rebuild met) and the batch is of that epoch and either the
next one or equal to one found, or the producer's recent batches are all found. The rest, a
producer not met yet above all, waits for the whole rebuild, whose table (read oldest first, as
`recover` does) then completes the entries under the batches appended meanwhile (`adopt`). It
relies on what `check` keeps for a producer it knows: its batches in the log have non-decreasing
epochs, so the newest one found carries the producer's epoch.

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

    def add_older(
        self, producer_id: int, base_sequence: int, count: int, base_offset: int, epoch: int
    ) -> None:
        """A batch older than every one the table holds of the producer (a rebuild reading the
        log newest first): the producer's newest if it is new here, else kept among the recent
        ones while they are fewer than `RECENT_BATCHES` and of its epoch (an older epoch's batches
        are not the producer's any more, as for `recover`)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            self.record(producer_id, base_sequence, count, base_offset, epoch)
            return
        recent = entry.recent
        if epoch != entry.epoch or len(recent) == RECENT_BATCHES:
            return
        if recent and base_sequence >= recent[0][0]:
            return  # not below the older one found (`recover` skips it the same way)
        recent.appendleft((base_sequence, count, base_offset))

    def answers(self, producer_id: int, base_sequence: int, count: int, epoch: int) -> bool:
        """While a rebuild fills the table newest first (`add_older`): whether `check` gives
        this batch the answer it gives once the rebuild is done. Yes for another epoch than the
        producer's (its newest batch's: an older one is refused, a newer one starts again), and
        in its epoch for the next batch, a batch equal to a recent one (a retry) or any when its
        recent batches are all there; otherwise the older batches still to come may change it
        (a producer not met yet may have written earlier, a retry be of an older batch)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return False
        if epoch != entry.epoch:
            return True
        return (
            base_sequence == entry.next_sequence
            or len(entry.recent) == RECENT_BATCHES
            or any(s == base_sequence and c == count for s, c, _ in entry.recent)
        )

    def adopt(self, rebuilt: ProducerTable) -> None:
        """The finished rebuild's table of the log below where appends here started (read
        oldest first): a producer met only by it is added; one the table holds of the same epoch
        gets the older batches it lacks, under those found newest first and appended since."""
        for producer_id, found in rebuilt.producers.items():
            entry = self.producers.get(producer_id)
            if entry is None:
                self.producers[producer_id] = found
                continue
            if entry.epoch != found.epoch:
                continue  # (not the newest epoch's, or a newer one appended here: it stands)
            oldest = entry.recent[0][2] if entry.recent else None
            older = [b for b in found.recent if oldest is None or b[2] < oldest]
            room = RECENT_BATCHES - len(entry.recent)
            if room > 0 and older:
                entry.recent.extendleft(reversed(older[-room:]))

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
