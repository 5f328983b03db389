"""The one read path of a partition's log for every reader: local WAL, object store, and damage.

Consumers, the last-value rebuild and its catch-up (after a snapshot load too, and after a
cluster's take-over) all read a partition through `read_partition`; none walks segments itself. It
reads the object store's copy below the local WAL and the local WAL from its start, and handles
damage one way for all of them:

- offsets a damaged local batch hides are read from the object store's copy of the segment when
  there is one (`topic.damage_read_from_archive`);
- otherwise they are skipped: `topic.data_skipped` (error level, with the reason) and the
  partition's `skipped` counter (`status.partition.<p>.skipped` in `topic describe`). Damage inside
  an object (the only copy below the local WAL) and an object missing from the store are skipped
  the same way, and the read goes on with the next object, then the local WAL.

Both `PartitionLog.read_span` and `ObjectArchive.read_span` stop a read in front of damage met
after a batch, so hidden offsets are always at the start of a read, where this module sees them:
before, a read that ran into damage went on past it, and a reader that did not check the offsets
itself (the last-value rebuild) lost keys silently though the object store held them. A gap that
holds no offsets (the lease's gap after an unclean stop) is not damage and is stepped over
without a word. A cluster's take-over copies nothing: the new owner reads the previous owners'
tail chunks in place, through this path. One reader works on whole objects away from it and
follows its rules: the Spark WAL source, which walks uploaded objects with the same
resynchronisation (`segments.walk_batches`) and reports the same event.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final, Protocol

import structlog

from headwater.storage.reader import LogRead
from headwater.storage.segments import SparseIndex, batch_location
from headwater.storage.wal import PartitionLog
from headwater.wire.errors import ObjectNotFound, StorageError

log = structlog.get_logger(__name__)

# the default bound of one read's walk over missing objects and gaps (`Archive.walk_limit`)
MAX_ARCHIVE_SKIPS: Final = 10_000
_WALKS_KEPT: Final = 64  # walked ranges kept per partition (`Walked`)


class Archive(Protocol):
    """Segments that left the local WAL for the object store."""

    @property
    def walk_limit(self) -> int:
        """How many missing objects, damaged objects and gaps one read walks over at most."""
        ...

    def start_offset(self, topic: str, partition: int) -> int | None: ...

    def covers(self, topic: str, partition: int, offset: int) -> bool: ...

    def next_after(self, topic: str, partition: int, offset: int) -> int | None: ...

    async def read_span(self, topic: str, partition: int, offset: int) -> LogRead: ...

    async def segment_index(
        self, topic: str, partition: int, offset: int
    ) -> tuple[int, SparseIndex] | None: ...


class SkipCounter(Protocol):
    """Where a partition counts its skipped reads (`LogPartition`)."""

    skipped: int


class Walked:
    """A partition's offset ranges below the local WAL that a read walked over and found
    nothing readable in (missing and damaged objects, skipped visibly as they were met, and
    gaps): a read that starts in one goes on at its end. A walk cut short at the archive's
    `walk_limit` is so taken up where it stopped by the next read, which walks on; walking it
    again from its start was cut short at the same place at every read, forever, and the
    records after the hole were never reached. At most `_WALKS_KEPT` ranges, the oldest
    forgotten first (a read there walks again)."""

    def __init__(self) -> None:
        self._ranges: OrderedDict[int, int] = OrderedDict()  # first offset -> end

    def past(self, offset: int) -> tuple[int, int]:
        """(where the range holding `offset` starts, where a read there goes on): (offset,
        offset) when no walked range holds it."""
        for first, end in self._ranges.items():
            if first <= offset < end:
                return first, end
        return offset, offset

    def add(self, first: int, end: int) -> None:
        self._ranges.pop(first, None)
        self._ranges[first] = end
        while len(self._ranges) > _WALKS_KEPT:
            self._ranges.popitem(last=False)


async def read_partition(
    wal: PartitionLog,
    archive: Archive | None,
    topic: str,
    partition: int,
    offset: int,
    counter: SkipCounter,
    walked: Walked | None = None,
) -> list[bytes]:
    """Batches from the one holding `offset` (object store below the local WAL, else local),
    consecutive: the first may start above `offset` when a gap or skipped damage lies there,
    the others follow each other with no offset between them. None (an empty list) when the
    walk over missing objects found none within the archive's `walk_limit` steps or before the
    local WAL's end: what it walked over is then added to `walked`, where the next read goes
    on (`topic.read_walk_cut_short` when it was the limit)."""
    first = offset
    if walked is not None and archive is not None:
        first, offset = walked.past(offset)
    limit = MAX_ARCHIVE_SKIPS if archive is None else archive.walk_limit
    for _ in range(limit):
        if offset >= wal.start_offset or archive is None:
            batches = await _read_local(wal, archive, topic, partition, offset, counter)
            if batches or offset >= wal.start_offset or archive is None:
                if not batches and walked is not None and first < offset:
                    walked.add(first, offset)  # nothing from the walk's start to the WAL's end
                return batches
            continue  # retention deleted the segment during the read: the archive has it
        read: LogRead | None
        try:
            read = await archive.read_span(topic, partition, offset)
        except ObjectNotFound as exc:
            skip(topic, partition, offset, "object missing from the object store", counter, exc)
            read = None
        if read is not None and read.damaged:
            reason = "damaged archived data, no other copy"
            skip(topic, partition, offset, reason, counter)
        if read is not None and read.batches:
            return read.batches
        following = archive.next_after(topic, partition, offset)
        following = wal.start_offset if following is None else following
        offset = max(offset + 1, min(following, wal.start_offset))
    if walked is not None:
        walked.add(first, offset)
    log.warning(
        "topic.read_walk_cut_short",
        topic=topic,
        partition=partition,
        offset=first,
        goes_on_at=offset,
        walk_limit=limit,
    )
    return []


async def _read_local(
    wal: PartitionLog,
    archive: Archive | None,
    topic: str,
    partition: int,
    offset: int,
    counter: SkipCounter,
) -> list[bytes]:
    result = await wal.read_span(offset)
    if not result.damaged:
        return result.batches
    if archive is not None and archive.covers(topic, partition, offset):
        try:
            copy = await archive.read_span(topic, partition, offset)
        except StorageError as exc:
            log.warning("topic.archive_copy_unreadable", topic=topic, error=str(exc))
            copy = LogRead([], False)
        if copy.batches and (not result.batches or _first(copy) < _first(result)):
            log.warning(
                "topic.damage_read_from_archive", topic=topic, partition=partition, offset=offset
            )
            if copy.damaged:  # the copy is damaged there too, less: skip what it hides
                skip(topic, partition, offset, "damaged locally and in the archived copy", counter)
            return copy.batches
    skip(topic, partition, offset, "damaged local data and no intact copy", counter)
    return result.batches


def _first(read: LogRead) -> int:
    return batch_location(read.batches[0], 0).base_offset


def skip(
    topic: str,
    partition: int,
    offset: int,
    reason: str,
    counter: SkipCounter,
    error: Exception | None = None,
) -> None:
    """Count and report offsets a read stepped over because their data is damaged or gone."""
    counter.skipped += 1
    log.error(
        "topic.data_skipped",
        topic=topic,
        partition=partition,
        offset=offset,
        reason=reason,
        error=str(error) if error is not None else None,
    )
