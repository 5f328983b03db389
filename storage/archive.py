"""Reading history back from the object store: the part of a partition older than its local WAL.

The uploader's record says which offsets each uploaded segment holds. A read finds the segment
holding the offset, fetches its sparse index (cached), and makes one ranged GET from the index
entry at or below the offset: about `READ_BYTES`, extended if a single batch is larger. Only whole
batches are returned; the caller reads on from the offset after the last one, so a replay moves
from object store to local WAL to live tail by offset, with no gap and no duplicate.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict

from storage.objectstore import ObjectStore
from storage.segments import INDEX_ENTRY, IndexEntry
from storage.uploader import Uploader, object_key
from wire.records import BATCH_HEADER_SIZE, inspect_batch

READ_BYTES = 1 << 20
_INDEX_CACHE = 256


class ObjectArchive:
    def __init__(self, store: ObjectStore, uploader: Uploader) -> None:
        self._store = store
        self._uploader = uploader
        self._indexes: OrderedDict[str, list[IndexEntry]] = OrderedDict()

    def start_offset(self, topic: str, partition: int) -> int | None:
        segments = self._uploader.uploaded(topic, partition)
        return segments[0].base_offset if segments else None

    async def read(self, topic: str, partition: int, offset: int) -> list[bytes]:
        segments = self._uploader.uploaded(topic, partition)
        position = bisect.bisect_right([s.base_offset for s in segments], offset) - 1
        if position < 0 or offset >= segments[position].next_offset:
            return []
        segment = segments[position]
        log_key = object_key(topic, partition, segment.base_offset)
        index = await self._index(topic, partition, segment.base_offset)
        entry = bisect.bisect_right([e.offset for e in index], offset) - 1
        start = index[entry].position if entry >= 0 else 0
        length = READ_BYTES
        while True:
            end = min(start + length, segment.size)
            data = await self._store.get(log_key, start, end)
            batches = _whole_batches(data, offset)
            if batches or end >= segment.size:
                return batches
            length *= 4  # one batch larger than the range, or the offset further on

    async def _index(self, topic: str, partition: int, base_offset: int) -> list[IndexEntry]:
        index_key = object_key(topic, partition, base_offset, ".index")
        cached = self._indexes.get(index_key)
        if cached is not None:
            self._indexes.move_to_end(index_key)
            return cached
        data = await self._store.get(index_key)
        entries = [IndexEntry(*fields) for fields in INDEX_ENTRY.iter_unpack(data)]
        self._indexes[index_key] = entries
        if len(self._indexes) > _INDEX_CACHE:
            self._indexes.popitem(last=False)
        return entries


def _whole_batches(data: bytes, offset: int) -> list[bytes]:
    batches = []
    position = 0
    while len(data) - position >= BATCH_HEADER_SIZE:
        length = 12 + int.from_bytes(data[position + 8 : position + 12], "big")
        if position + length > len(data):
            break
        batch = data[position : position + length]
        info = inspect_batch(batch)
        if info.base_offset + info.record_count > offset:
            batches.append(batch)
        position += length
    return batches
