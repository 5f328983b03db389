"""WAL segment objects: finding them in the object store and decoding them into Arrow batches.

The uploader (storage/uploader.py) names a segment `<topic>/<partition>/<base offset>.log`, the
offset in 20 digits; its content is record batches exactly as the WAL holds them, base offsets
stamped. Only keys of exactly that shape count as segments, so `.index` objects, snapshots
(`snapshots/...`, four or more parts) and anything else that shares the store are ignored.

Decoding walks the batches by their length fields and decodes each with `wire.records` (compressed
batches too). A batch whose CRC or records do not check is skipped and reported as a row with only
`corrupt` set; a length field that cannot be trusted ends the walk of that segment (nothing after
it can be framed) and is reported the same way. Nothing here raises on bad data: a compaction run
must report damage, not die of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from spark_compaction.schema import WAL_SCHEMA
from spark_compaction.store import BlockingStore
from storage.objectstore import ObjectInfo
from wire.errors import CorruptBatch
from wire.limits import MAX_BATCH_SIZE
from wire.records import BATCH_HEADER_SIZE, Record, read_records

_LENGTH_PREFIX = 12  # baseOffset int64 + batchLength int32
ROWS_PER_BATCH = 32_768


@dataclass(frozen=True, slots=True)
class SegmentObject:
    topic: str
    partition: int
    base_offset: int
    size: int

    @property
    def key(self) -> str:
        return f"{self.topic}/{self.partition}/{self.base_offset:020d}.log"


def parse_segment(info: ObjectInfo) -> SegmentObject | None:
    parts = info.key.split("/")
    if len(parts) != 3:
        return None
    topic, partition, name = parts
    stem = name[:-4]
    if not name.endswith(".log") or len(stem) != 20 or not stem.isdigit():
        return None
    if not partition.isdigit():
        return None
    return SegmentObject(topic, int(partition), int(stem), info.size)


def list_segments(store: BlockingStore, topics: Sequence[str] = ()) -> list[SegmentObject]:
    """Every segment object of `topics` (all topics when empty), by topic, partition, offset."""
    listings: Iterable[ObjectInfo]
    if topics:
        listings = [info for topic in sorted(set(topics)) for info in store.list(f"{topic}/")]
    else:
        listings = store.list("")
    found = [s for s in map(parse_segment, listings) if s is not None]
    if topics:
        wanted = set(topics)
        found = [s for s in found if s.topic in wanted]
    return sorted(found, key=lambda s: (s.topic, s.partition, s.base_offset))


def group_segments(
    segments: Sequence[SegmentObject], target_bytes: int
) -> list[list[SegmentObject]]:
    """Consecutive segments of one partition, about `target_bytes` a group: a Spark task each."""
    groups: list[list[SegmentObject]] = []
    size = 0
    for segment in segments:
        last = groups[-1] if groups else None
        if (
            last is None
            or (last[0].topic, last[0].partition) != (segment.topic, segment.partition)
            or size + segment.size > target_bytes
        ):
            groups.append([segment])
            size = segment.size
        else:
            last.append(segment)
            size += segment.size
    return groups


class _Columns:
    def __init__(self) -> None:
        self.offsets: list[int | None] = []
        self.timestamps: list[int | None] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[list[dict[str, object]]] = []
        self.corrupt: list[str | None] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def batch(self, topic: str, partition: int) -> pa.RecordBatch:
        count = len(self.offsets)
        return pa.RecordBatch.from_arrays(
            [
                pa.array([topic] * count, pa.string()),
                pa.array([partition] * count, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                pa.array(self.timestamps, pa.int64()),
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
                pa.array(self.headers, WAL_SCHEMA.field("headers").type),
                pa.array(self.corrupt, pa.string()),
            ],
            schema=WAL_SCHEMA,
        )


def decode_segment(
    segment: SegmentObject, data: bytes, from_offset: int = 0, rows_per_batch: int = ROWS_PER_BATCH
) -> Iterator[pa.RecordBatch]:
    """The records at or above `from_offset` as WAL rows, and one row per corrupt stretch."""
    columns = _Columns()
    for problem, records in _batches(segment, data):
        if problem is not None:
            columns.offsets.append(None)
            columns.timestamps.append(None)
            columns.keys.append(None)
            columns.values.append(None)
            columns.headers.append([])
            columns.corrupt.append(problem)
            continue
        for record in records:
            if record.offset < from_offset:
                continue
            columns.offsets.append(record.offset)
            columns.timestamps.append(record.timestamp)
            columns.keys.append(record.key)
            columns.values.append(record.value)
            columns.headers.append(
                [{"key": k, "value": v} for k, v in record.headers] if record.headers else []
            )
            columns.corrupt.append(None)
        if len(columns) >= rows_per_batch:
            yield columns.batch(segment.topic, segment.partition)
            columns = _Columns()
    if len(columns):
        yield columns.batch(segment.topic, segment.partition)


def _batches(segment: SegmentObject, data: bytes) -> Iterator[tuple[str | None, list[Record]]]:
    position = 0
    view = memoryview(data)
    while position < len(data):
        where = f"{segment.key} at byte {position}"
        if len(data) - position < BATCH_HEADER_SIZE:
            yield f"{where}: {len(data) - position} trailing bytes, shorter than a batch header", []
            return
        field = view[position + 8 : position + 12]
        length = _LENGTH_PREFIX + int.from_bytes(field, "big", signed=True)
        if length < BATCH_HEADER_SIZE or length > MAX_BATCH_SIZE or position + length > len(data):
            yield (
                f"{where}: batch length {length} does not fit the segment "
                f"({len(data) - position} bytes left); the rest of the segment is skipped",
                [],
            )
            return
        batch = bytes(view[position : position + length])
        try:
            records = read_records(batch)
        except CorruptBatch as exc:
            yield f"{where}: {exc}", []
        else:
            yield None, records
        position += length
