"""WAL segment objects: finding them in the object store and decoding them into Arrow batches.

The uploader (storage/uploader.py) names a segment `<topic>/<partition>/<base offset>.log`, the
offset in 20 digits; its content is record batches exactly as the WAL holds them, base offsets
stamped. Only keys of exactly that shape count as segments, so `.index` objects, snapshots
(`snapshots/...`, four or more parts) and anything else that shares the store are ignored. A
cluster's partition has a manifest (storage/partition_manifest.py) instead: its segments are
exactly the objects the newest version names, each counting from its entry's first offset
(objects it does not name, such as an upload of an owner that lost the partition, are not read).

Decoding walks the batches with the server's own walker (`storage.segments.walk_batches`) and
decodes each with `wire.records` (compressed batches too). Bytes that hold no valid batch (a bad
CRC, a length field that cannot be trusted) are got past as the server's readers get past them:
the walk resynchronises on the next valid batch, so a flipped length byte costs one batch, not the
rest of the segment. Each damaged stretch is reported as a row with only `corrupt` set (counted in
the job's summary) and logged as `topic.data_skipped`, the server's event for skipped data.
Nothing here raises on bad data: a compaction run must report damage, not die of it.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import structlog

from headwater.spark_compaction.schema import FOLDED_SCHEMA, HEADER_TYPE, HEADERS_TYPE, WAL_SCHEMA
from headwater.spark_compaction.store import BlockingStore
from headwater.storage.objectstore import ObjectInfo
from headwater.storage.partition_manifest import Manifest, manifest_prefix
from headwater.storage.segments import walk_batches
from headwater.wire.errors import CorruptBatch, ObjectNotFound, StorageError
from headwater.wire.records import BATCH_HEADER_SIZE, Headers, decode_records, read_base_offset

log = structlog.get_logger(__name__)
ROWS_PER_BATCH = 32_768


@dataclass(frozen=True, slots=True)
class SegmentObject:
    topic: str
    partition: int
    base_offset: int  # the first offset read from it (a manifest entry's `first`)
    size: int
    name: str = ""  # a manifest's object name, without `.log`

    @property
    def key(self) -> str:
        if self.name:
            return f"{self.name}.log"
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
    for _ in range(_ATTEMPTS):
        try:
            return _list_segments(store, topics)
        except ObjectNotFound:
            continue  # a manifest version went as two newer ones were written: list again
    raise StorageError("partition manifests keep changing under the listing")


_ATTEMPTS = 5


def _list_segments(store: BlockingStore, topics: Sequence[str]) -> list[SegmentObject]:
    listings: Iterable[ObjectInfo]
    if topics:
        listings = [info for topic in sorted(set(topics)) for info in store.list(f"{topic}/")]
    else:
        listings = store.list("")
    listings = list(listings)
    newest: dict[tuple[str, int], int] = {}
    for info in listings:
        parts = info.key.split("/")
        if len(parts) == 4 and parts[2] == "manifest" and parts[1].isdigit() and parts[3].isdigit():
            ident = (parts[0], int(parts[1]))
            newest[ident] = max(newest.get(ident, -1), int(parts[3]))
    found = [
        s
        for s in map(parse_segment, listings)
        if s is not None and (s.topic, s.partition) not in newest
    ]
    for (topic, partition), version in newest.items():
        data = store.get(f"{manifest_prefix(topic, partition)}{version:020d}")
        found.extend(
            SegmentObject(topic, partition, entry.first, entry.size, entry.name)
            for entry in Manifest.decode(version, data).segments
        )
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


Row = tuple[int, int, bytes | None, bytes | None, Headers]


def row(
    offset: int,
    timestamp: int,
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
) -> Row:
    return offset, timestamp, key, value, headers


_EMPTY_HEADERS = pa.array([], HEADER_TYPE)


def _headers(headers: Sequence[Headers]) -> pa.Array:
    if not any(headers):  # the usual case, built without a Python object per record
        return pa.ListArray.from_arrays(
            pa.array([0] * (len(headers) + 1), pa.int32()), _EMPTY_HEADERS, type=HEADERS_TYPE
        )
    return pa.array([[{"key": k, "value": v} for k, v in h] for h in headers], HEADERS_TYPE)


def records_batch(topic: str, partition: int, rows: list[Row]) -> pa.RecordBatch:
    count = len(rows)
    offsets, timestamps, keys, values, headers = zip(*rows, strict=True)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(topic, pa.string()), count),
            pa.repeat(pa.scalar(partition, pa.int32()), count),
            pa.array(offsets, pa.int64()),
            pa.array(timestamps, pa.int64()),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            _headers(headers),
            pa.nulls(count, pa.string()),
        ],
        schema=WAL_SCHEMA,
    )


def _problems_batch(topic: str, partition: int, problems: list[str]) -> pa.RecordBatch:
    count = len(problems)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(topic, pa.string()), count),
            pa.repeat(pa.scalar(partition, pa.int32()), count),
            pa.nulls(count, pa.int64()),
            pa.nulls(count, pa.int64()),
            pa.nulls(count, pa.binary()),
            pa.nulls(count, pa.binary()),
            _headers([()] * count),
            pa.array(problems, pa.string()),
        ],
        schema=WAL_SCHEMA,
    )


def decode_segment(
    segment: SegmentObject, data: bytes, from_offset: int = 0, rows_per_batch: int = ROWS_PER_BATCH
) -> Iterator[pa.RecordBatch]:
    """The records at or above `from_offset` as WAL rows, and one row per corrupt stretch."""
    rows: list[Row] = []
    problems: list[str] = []
    from_offset = max(from_offset, segment.base_offset)  # a manifest's object may start lower
    for problem, records in iter_batches(segment, data):
        if problem is not None:
            problems.append(problem)
            continue
        if records[0][0] < from_offset:
            records = [r for r in records if r[0] >= from_offset]
        rows.extend(records)
        if len(rows) >= rows_per_batch:
            yield records_batch(segment.topic, segment.partition, rows)
            rows = []
    if rows:
        yield records_batch(segment.topic, segment.partition, rows)
    if problems:
        yield _problems_batch(segment.topic, segment.partition, problems)


class Folder:
    """Folds the records of one partition's segments as they are decoded: the map-side combiner.

    Keeps the newest record per key and counts records per key, so a task hands Spark one row per
    key it saw instead of one per record. Past `max_keys` keys it hands over what it has and starts
    again (Spark's own fold merges the pieces), so a task's memory stays bounded.
    """

    def __init__(self, segment: SegmentObject, max_keys: int = 1_000_000) -> None:
        self._topic = segment.topic
        self._partition = segment.partition
        self._max_keys = max_keys
        self._winners: dict[bytes | None, Row] = {}
        self._counts: Counter[bytes | None] = Counter()
        self._problems: list[str] = []

    def add(
        self, segment: SegmentObject, data: bytes, from_offset: int
    ) -> Iterator[pa.RecordBatch]:
        winners, counts = self._winners, self._counts
        from_offset = max(from_offset, segment.base_offset)  # a manifest's object may start lower
        # Decoding makes millions of short-lived tuples (with header lists), none in a cycle: the
        # cyclic collector would only rescan the survivors, a quarter of the CPU time here.
        collecting = gc.isenabled()
        gc.disable()
        try:
            for problem, records in iter_batches(segment, data):
                if problem is not None:
                    self._problems.append(problem)
                    continue
                if records[0][0] < from_offset:
                    records = [r for r in records if r[0] >= from_offset]
                keys = [r[2] for r in records]
                winners.update(zip(keys, records, strict=True))  # offset order: the last wins
                counts.update(keys)
                if len(winners) > self._max_keys:
                    yield from self.finish()
                    winners, counts = self._winners, self._counts
        finally:
            if collecting:
                gc.enable()

    def finish(self) -> Iterator[pa.RecordBatch]:
        if self._winners:
            rows = list(self._winners.values())
            keyless = self._winners.get(None)
            if keyless is not None:  # the key-null row only carries the keyless count and offset
                self._winners[None] = (keyless[0], keyless[1], None, None, ())
                rows = list(self._winners.values())
            batch = records_batch(self._topic, self._partition, rows)
            counts = pa.array([self._counts[r[2]] for r in rows], pa.int64())
            yield pa.RecordBatch.from_arrays([*batch.columns, counts], schema=FOLDED_SCHEMA)
        if self._problems:
            batch = _problems_batch(self._topic, self._partition, self._problems)
            zeros = pa.array([0] * len(self._problems), pa.int64())
            yield pa.RecordBatch.from_arrays([*batch.columns, zeros], schema=FOLDED_SCHEMA)
        self._winners, self._counts, self._problems = {}, Counter(), []


def iter_batches(segment: SegmentObject, data: bytes) -> Iterator[tuple[str | None, list[Row]]]:
    view = memoryview(data)
    for step in walk_batches(data, segment.base_offset):
        where = f"{segment.key} at byte {step.position}"
        if step.batch is None:
            # past damage as the server's readers get past it (storage.segments.walk_batches),
            # reported under the same event as theirs
            problem = f"{where}: {_damage(step.reason, data, step.position, step.length)}"
            log.error(
                "topic.data_skipped",
                topic=segment.topic,
                partition=segment.partition,
                segment=segment.key,
                position=step.position,
                length=step.length,
                reason=problem,
            )
            yield problem, []
            continue
        batch = bytes(view[step.position : step.position + step.length])
        try:
            records = decode_records(batch, row)
            base = read_base_offset(batch)
            if records[0][0] != base or records[-1][0] != base + len(records) - 1:
                raise CorruptBatch("record offset deltas are not 0, 1, 2, ...")
        except CorruptBatch as exc:
            yield f"{where}: {exc}", []
        else:
            yield None, records


def _damage(reason: str, data: bytes, position: int, length: int) -> str:
    left = len(data) - position
    if left < BATCH_HEADER_SIZE:
        return f"{left} trailing bytes, shorter than a batch header"
    if position + length >= len(data):
        return f"{reason} ({left} bytes left); the rest of the segment is skipped"
    return f"{reason}; {length} bytes skipped up to the next valid batch"
