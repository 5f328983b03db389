"""Reading history back from the object store: the part of a partition older than its local WAL.

The uploader's record says which offsets each uploaded segment holds. A read finds the segment
holding the offset, fetches its sparse index (cached), and makes one ranged GET from the index
entry at or below the offset: about `READ_BYTES`, extended if a single batch is larger. Only whole
batches are returned; the caller reads on from the offset after the last one, so a replay moves
from object store to local WAL to live tail by offset, with no gap and no duplicate.

Damage in an object is met like damage in a local segment: a read stops in front of it, and the
read that starts at it resynchronises on the next valid batch and says offsets were hidden
(`read_span`), so the caller can skip them visibly (`storage.log_reader`).

A missing index object is not fatal (the read starts at the segment's first byte); a missing log
object raises `ObjectNotFound`, and `next_after` tells the caller where the next data is, so a
replay goes on past the hole.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict

import structlog

from headwater.storage.log_reader import MAX_ARCHIVE_SKIPS
from headwater.storage.objectstore import ObjectStore
from headwater.storage.reader import LogRead
from headwater.storage.segments import (
    SparseIndex,
    batch_length,
    batch_location,
    check_batch,
    find_batch,
)
from headwater.storage.uploader import UploadedSegment, Uploader
from headwater.wire.errors import ObjectNotFound

log = structlog.get_logger(__name__)

READ_BYTES = 1 << 20
_REREADS = 3
_INDEX_CACHE = 256


class ObjectArchive:
    def __init__(
        self, store: ObjectStore, uploader: Uploader, walk_limit: int = MAX_ARCHIVE_SKIPS
    ) -> None:
        """`walk_limit`: how many missing objects and gaps one read walks over at most
        (`storage.log_reader`; `object_store.walk_limit`)."""
        self._store = store
        self._uploaded = uploader
        self._indexes: OrderedDict[str, SparseIndex] = OrderedDict()
        self.walk_limit = walk_limit

    def start_offset(self, topic: str, partition: int) -> int | None:
        segments = self._uploaded.uploaded(topic, partition)
        return segments[0].start if segments else None

    def covers(self, topic: str, partition: int, offset: int) -> bool:
        """Whether an uploaded segment holds `offset`."""
        return self._uploaded_holding(topic, partition, offset) is not None

    def next_after(self, topic: str, partition: int, offset: int) -> int | None:
        """Where archived data goes on after `offset`'s segment (or the gap `offset` is in)."""
        segments = self._uploaded.uploaded(topic, partition)
        bases = [s.start for s in segments]
        position = bisect.bisect_right(bases, offset) - 1
        if position >= 0 and offset < segments[position].next_offset:
            return segments[position].next_offset
        return bases[position + 1] if position + 1 < len(bases) else None

    def _uploaded_holding(self, topic: str, partition: int, offset: int) -> int | None:
        segments = self._uploaded.uploaded(topic, partition)
        position = bisect.bisect_right([s.start for s in segments], offset) - 1
        if position < 0 or offset >= segments[position].next_offset:
            return None
        return position

    async def segment_index(
        self, topic: str, partition: int, offset: int
    ) -> tuple[int, SparseIndex] | None:
        """The end offset and sparse index of the uploaded segment holding `offset` (None: no
        segment does), for a timestamp search that skips what the index shows is older."""
        position = self._uploaded_holding(topic, partition, offset)
        if position is None:
            return None
        segment = self._uploaded.uploaded(topic, partition)[position]
        return segment.next_offset, await self._index(topic, partition, segment)

    async def read(self, topic: str, partition: int, offset: int) -> list[bytes]:
        """Just the batches of `read_span` (readers of the log go through `storage.log_reader`,
        which needs `read_span`'s word on hidden offsets)."""
        return (await self.read_span(topic, partition, offset)).batches

    async def read_span(self, topic: str, partition: int, offset: int) -> LogRead:
        """Whole batches from the one holding `offset`, and whether damage hid offsets from
        `offset` up to the first of them (as `PartitionLog.read_span`: a read stops in front of
        damage it meets after a batch)."""
        for _ in range(_REREADS):
            segment = self._holding(topic, partition, offset)
            if segment is None:
                return LogRead([], False)
            try:
                return await self._read(topic, partition, offset, segment)
            except ObjectNotFound:
                # in a cluster the object holding an offset changes (a fold or a segment named
                # in the manifest replaces tail chunks, which then go): read the one holding it
                # now, unless it is the same
                if self._holding(topic, partition, offset) == segment:
                    raise
        raise ObjectNotFound(f"{topic}/{partition}: the object holding {offset} keeps changing")

    def _holding(self, topic: str, partition: int, offset: int) -> UploadedSegment | None:
        segments = self._uploaded.uploaded(topic, partition)
        position = bisect.bisect_right([s.start for s in segments], offset) - 1
        if position < 0 or offset >= segments[position].next_offset:
            return None
        return segments[position]

    async def _read(
        self, topic: str, partition: int, offset: int, segment: UploadedSegment
    ) -> LogRead:
        log_key = segment.key(topic, partition)
        index = await self._index(topic, partition, segment)
        start = index.start_of(offset)
        length = READ_BYTES
        while True:
            end = min(start + length, segment.size)
            # (a slice of a shared tail object starts `position` bytes into it)
            data = await self._store.get(log_key, segment.position + start, segment.position + end)
            complete = end >= segment.size
            batches, damaged = _whole_batches(data, offset, log_key, start, complete)
            if batches or end >= segment.size:
                hidden = damaged and (
                    not batches or batch_location(batches[0], 0).base_offset > offset
                )
                return LogRead(batches, hidden)
            length *= 4  # one batch larger than the range, or the offset further on

    async def _index(self, topic: str, partition: int, segment: UploadedSegment) -> SparseIndex:
        if not segment.indexed:
            return SparseIndex()  # a tail chunk: small, read from its first byte
        index_key = segment.key(topic, partition, ".index")
        cached = self._indexes.get(index_key)
        if cached is not None:
            self._indexes.move_to_end(index_key)
            return cached
        try:
            data = await self._store.get(index_key)
        except ObjectNotFound:
            log.warning("archive.index_missing", key=index_key)
            data = b""  # read from the segment's first byte
        try:
            entries = SparseIndex.decode(data)
        except ValueError as exc:
            log.warning("archive.index_damaged", key=index_key, error=str(exc))
            entries = SparseIndex()  # read from the segment's first byte
        self._indexes[index_key] = entries
        if len(self._indexes) > _INDEX_CACHE:
            self._indexes.popitem(last=False)
        return entries


def _whole_batches(
    data: bytes, offset: int, log_key: str, start: int, complete: bool
) -> tuple[list[bytes], bool]:
    """The whole, valid batches in `data` holding offsets >= `offset`, up to the first damage
    after one of them; and whether damage was met (skipped, before the first batch returned).
    `complete`: `data` runs to the object's end, so a batch claiming more bytes is damage (a
    flipped length byte), not one cut by the ranged read."""
    batches: list[bytes] = []
    damaged = False
    position = 0
    min_offset = 0
    while position < len(data):
        found = check_batch(data, position, len(data), min_offset)
        if found is None:
            total = batch_length(data, position, len(data))
            if total is not None and position + total > len(data) and not complete:
                break  # a batch cut by the end of the ranged read: the caller reads on
            if batches:
                break  # the next read starts at the damage, so the offsets it hides are seen
            resume = find_batch(data, position + 1, len(data), min_offset)
            damaged = True
            log.error(
                "archive.damaged_batch",
                key=log_key,
                position=start + position,
                length=(len(data) if resume is None else resume) - position,
            )
            if resume is None:
                break
            position = resume
            continue
        if found.next_offset > offset:
            batches.append(data[position : position + found.size])
        position += found.size
        min_offset = found.next_offset
    return batches, damaged
