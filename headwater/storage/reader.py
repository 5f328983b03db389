"""Reading batches back from a segment file, getting past damage instead of stopping at it.

A read starts at a sparse-index position at or below the wanted offset and walks batch by batch.
Batches wholly below the offset are skipped on their header alone (plausible magic and length,
offsets increasing); every batch returned has its CRC checked. Bytes that hold no valid batch are
damage: a read that has returned batches stops in front of it, and one that meets it first
resynchronises on the next valid batch (`segments.find_batch`), reports the damaged range, and goes
on, so one bad batch never ends a consumer's stream. So the offsets damage hides are always at the
start of a read, never inside one; whether they can be read elsewhere (the object store's copy) is
the caller's decision (`storage.log_reader`).

Reads never go past `limit`, the segment length when the read began: the active segment grows while
a worker thread reads it, and a batch being written is not damage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from headwater.storage.segments import (
    BatchLocation,
    Damage,
    batch_length,
    batch_location,
    check_batch,
    find_batch,
)
from headwater.wire.records import BATCH_HEADER_SIZE


@dataclass(frozen=True, slots=True)
class LogRead:
    """A read of a partition (`PartitionLog.read_span`, `ObjectArchive.read_span`)."""

    batches: list[bytes]
    damaged: bool  # damage was skipped before the first batch returned (offsets may be hidden)


@dataclass(slots=True)
class SegmentRead:
    batches: list[bytes] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)


def read_batches(
    path: Path, position: int, offset: int, max_bytes: int, limit: int, base_offset: int
) -> SegmentRead:
    """Batches of `path` holding offsets >= `offset`, about `max_bytes` (at least one)."""
    result = SegmentRead()
    size = 0
    min_offset = base_offset
    with path.open("rb") as file:
        while position < limit and size < max_bytes:
            file.seek(position)
            header = file.read(min(BATCH_HEADER_SIZE, limit - position))
            total = batch_length(header, 0, len(header))
            found: BatchLocation | None = None
            if total is not None and position + total <= limit:
                location = batch_location(header, position)
                if location.base_offset >= min_offset and location.next_offset <= offset:
                    position += total  # wholly below the offset: its header is enough
                    min_offset = location.next_offset
                    continue
                data = header + file.read(total - len(header))
                found = check_batch(data, 0, len(data), min_offset)
                if found is not None:
                    result.batches.append(data)
                    size += total
                    position += total
                    min_offset = found.next_offset
                    continue
            if result.batches:
                # a hole after what was read: stop before it, so the offsets it hides are the
                # start of the next read, where the caller sees them (and looks for a copy)
                # instead of them vanishing inside this one
                break
            resume = _resync(file, position, limit, min_offset)
            length = (resume if resume is not None else limit) - position
            result.damage.append(Damage(path, position, length, "unreadable batch"))
            if resume is None:
                break
            position = resume
    return result


def _resync(file: BinaryIO, position: int, limit: int, min_offset: int) -> int | None:
    file.seek(position)
    data = file.read(limit - position)
    found = find_batch(data, 1, len(data), min_offset)
    return None if found is None else position + found


def read_range(path: Path, position: int, length: int) -> bytes:
    with path.open("rb") as file:
        file.seek(position)
        return file.read(length)
