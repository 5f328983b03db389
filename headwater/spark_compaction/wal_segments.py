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

Transactions (`DecidedBatches`): a Spark task's batches go through `wire.transaction_fold` in
offset order, so markers never become rows, an aborted transaction's records are never decoded
(its batches' headers are counted), a committed one's are decoded at their own offsets, and what
follows an undecided batch is held back with it. A plain batch with nothing held passes on one test
of its attributes. A task whose batches end with a transaction still open reads the headers of the
partition's next segments (`following`, fetched one at a time) until that transaction's marker,
so a transaction that a group boundary cuts is decided in the task that holds its batches. One
still open at the end of the partition's segments stays undecided: its first offset is reported
(`undecided`), nothing from it on is folded, and the job's horizon stops there (job.py); the raw
reader (`headwater_wal` without `fold`) leaves out only its records.
"""

from __future__ import annotations

import gc
import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import pyarrow as pa
import structlog

from headwater.spark_compaction.schema import FOLDED_SCHEMA, HEADER_TYPE, HEADERS_TYPE, WAL_SCHEMA
from headwater.spark_compaction.store import BlockingStore
from headwater.storage.objectstore import ObjectInfo
from headwater.storage.partition_manifest import Manifest, manifest_prefix
from headwater.storage.segments import BatchLocation, walk_batches
from headwater.wire.errors import CorruptBatch, ObjectNotFound, StorageError
from headwater.wire.markers import BatchHeader, marker_type
from headwater.wire.records import (
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    CONTROL_FLAG,
    TRANSACTIONAL_FLAG,
    Headers,
    decode_records,
    read_base_offset,
)
from headwater.wire.transaction_fold import Fate, TransactionFold

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


class StoredBatch(NamedTuple):
    """A valid batch of a segment object, and where it lies."""

    segment: SegmentObject
    position: int
    data: bytes

    @property
    def where(self) -> str:
        return f"{self.segment.key} at byte {self.position}"


def batch_header(location: BatchLocation) -> BatchHeader:
    """What `wire.transaction_fold` reads of a batch, from where the walk found it."""
    flags = location.attributes
    return BatchHeader(
        location.base_offset,
        location.next_offset,
        location.producer_id,
        location.producer_epoch,
        bool(flags & TRANSACTIONAL_FLAG),
        bool(flags & CONTROL_FLAG),
    )


class DecidedBatches:
    """One Spark task's batches of one partition, followed in offset order through a
    `TransactionFold`: each visible batch is handed on once its fate is known (markers and
    aborted batches never are), in offset order; see the module docstring. `until` (the job's
    second pass over a partition whose horizon an open transaction stops) leaves out the batches
    at or past it."""

    def __init__(self, until: int | None = None) -> None:
        self._until = until
        self._fold: TransactionFold[StoredBatch | None] = TransactionFold()
        self._next = 0  # past the last batch followed: reading ahead looks above it only
        self.aborted = 0  # records of aborted transactions left out
        self.last_offset: int | None = None  # of the last batch followed, markers included
        self.undecided: int | None = None  # after `finish`: where a transaction left open begins

    def add(
        self, segment: SegmentObject, data: bytes, from_offset: int
    ) -> Iterator[str | StoredBatch]:
        """The segment's visible batches holding records at or past `from_offset`, and a report
        of each damaged stretch, as they come (a batch held back comes out later, in order)."""
        start = max(from_offset, segment.base_offset)  # a manifest's object may start lower
        until, fold, view = self._until, self._fold, memoryview(data)
        for step in walk_batches(data, segment.base_offset):
            location = step.batch
            if location is None:
                yield _skipped(segment, data, step.position, step.length, step.reason)
                continue
            if location.next_offset <= start:
                continue
            end = step.position + step.length
            if until is not None and location.base_offset >= until:
                yield from self._ahead(location, view[step.position : end])
                continue
            batch = StoredBatch(segment, step.position, bytes(view[step.position : end]))
            self.last_offset = location.next_offset - 1
            self._next = location.next_offset
            if location.attributes & TRANSACTIONAL_FLAG or fold.holding:
                yield from self._follow(location, batch.data, batch)
            else:
                yield batch

    def finish(
        self, following: Iterable[tuple[SegmentObject, bytes]], held_visible: bool
    ) -> Iterator[StoredBatch]:
        """End the task. While a transaction is undecided, read the headers of `following` (the
        partition's next segments, fetched as the iteration asks for them) for the markers of
        the producers it waits for, and hand on what they release. Then what is still held:
        with `held_visible` its visible batches (the raw reader), without nothing (the fold:
        it lies past the horizon)."""
        fold = self._fold
        for segment, data in following:
            if not fold.holding:
                break
            floor = max(segment.base_offset, self._next)
            view = memoryview(data)
            for step in walk_batches(data, segment.base_offset):
                location = step.batch
                if location is None or location.base_offset < floor:
                    continue
                yield from self._ahead(location, view[step.position : step.position + step.length])
                if not fold.holding:
                    break
        self.undecided = fold.stable_offset
        for batch, fate in fold.drain():
            if batch is None or not held_visible:
                continue
            if fate.visible:
                yield batch
            elif fate is Fate.ABORTED:
                self.aborted += _record_count(batch.data)

    def _ahead(self, location: BatchLocation, data: memoryview) -> Iterator[StoredBatch]:
        """A batch past the task's own, read only for the marker of an undecided transaction."""
        self._next = location.next_offset
        if location.attributes & CONTROL_FLAG and location.producer_id in self._fold.waiting_for:
            yield from self._follow(location, bytes(data), None)

    def _follow(
        self, location: BatchLocation, data: bytes, item: StoredBatch | None
    ) -> Iterator[StoredBatch]:
        marker = marker_type(data) if location.attributes & CONTROL_FLAG else None
        for batch, fate in self._fold.follow(batch_header(location), marker, item):
            if batch is None:
                continue
            if fate.visible:
                yield batch
            elif fate is Fate.ABORTED:
                self.aborted += _record_count(batch.data)


def _record_count(batch: bytes) -> int:
    return int(BATCH_HEADER.unpack_from(batch)[12])


def decoded(batch: StoredBatch) -> tuple[str | None, list[Row]]:
    """A batch's records as rows, or why they do not decode."""
    try:
        records = decode_records(batch.data, row)
        base = read_base_offset(batch.data)
        if records[0][0] != base or records[-1][0] != base + len(records) - 1:
            raise CorruptBatch("record offset deltas are not 0, 1, 2, ...")
    except CorruptBatch as exc:
        return f"{batch.where}: {exc}", []
    return None, records


def decode_group(
    segments: Iterable[tuple[SegmentObject, bytes]],
    from_offset: int = 0,
    following: Iterable[tuple[SegmentObject, bytes]] = (),
    rows_per_batch: int = ROWS_PER_BATCH,
) -> Iterator[pa.RecordBatch]:
    """The visible records of consecutive segments of one partition at or above `from_offset`,
    as WAL rows (a transaction still open after `following` is left out), and one row per
    corrupt stretch."""
    batches = DecidedBatches()
    rows: list[Row] = []
    problems: list[str] = []
    first: SegmentObject | None = None

    def walked() -> Iterator[str | StoredBatch]:
        nonlocal first
        for segment, data in segments:
            first = first or segment
            yield from batches.add(segment, data, from_offset)
        yield from batches.finish(following, held_visible=True)

    for item in walked():
        if isinstance(item, str):
            problems.append(item)
            continue
        problem, records = decoded(item)
        if problem is not None:
            problems.append(problem)
            continue
        floor = max(from_offset, item.segment.base_offset)
        if records[0][0] < floor:
            records = [r for r in records if r[0] >= floor]
        rows.extend(records)
        if len(rows) >= rows_per_batch:
            yield records_batch(item.segment.topic, item.segment.partition, rows)
            rows = []
    if first is not None and rows:
        yield records_batch(first.topic, first.partition, rows)
    if first is not None and problems:
        yield _problems_batch(first.topic, first.partition, problems)


def decode_segment(
    segment: SegmentObject, data: bytes, from_offset: int = 0, rows_per_batch: int = ROWS_PER_BATCH
) -> Iterator[pa.RecordBatch]:
    """One segment's records at or above `from_offset` as WAL rows (`decode_group` of one)."""
    return decode_group([(segment, data)], from_offset, (), rows_per_batch)


class Folder:
    """Folds the records of one partition's segments as they are decoded: the map-side combiner.

    Keeps the newest record per key and counts records per key, so a task hands Spark one row per
    key it saw instead of one per record. Past `max_keys` keys it hands over what it has and starts
    again (Spark's own fold merges the pieces), so a task's memory stays bounded. Its batches come
    through `DecidedBatches`, in offset order, so the last record of a key wins; `finish` adds a
    row about the task (`info_batch`).
    """

    def __init__(
        self, segment: SegmentObject, max_keys: int = 1_000_000, until: int | None = None
    ) -> None:
        self._topic = segment.topic
        self._partition = segment.partition
        self._max_keys = max_keys
        self._batches = DecidedBatches(until)
        self._from = 0
        self._winners: dict[bytes | None, Row] = {}
        self._counts: Counter[bytes | None] = Counter()
        self._problems: list[str] = []

    def add(
        self, segment: SegmentObject, data: bytes, from_offset: int
    ) -> Iterator[pa.RecordBatch]:
        self._from = from_offset
        yield from self._fold(self._batches.add(segment, data, from_offset))

    def finish(
        self, following: Iterable[tuple[SegmentObject, bytes]] = ()
    ) -> Iterator[pa.RecordBatch]:
        """What is left, after reading `following` for the markers of transactions still open."""
        yield from self._fold(self._batches.finish(following, held_visible=False))
        yield from self._flush()
        batches = self._batches
        if batches.last_offset is not None:
            last, aborted, undecided = batches.last_offset, batches.aborted, batches.undecided
            yield info_batch(self._topic, self._partition, last, aborted, undecided)

    def _fold(self, walked: Iterable[str | StoredBatch]) -> Iterator[pa.RecordBatch]:
        winners, counts = self._winners, self._counts
        # Decoding makes millions of short-lived tuples (with header lists), none in a cycle: the
        # cyclic collector would only rescan the survivors, a quarter of the CPU time here.
        collecting = gc.isenabled()
        gc.disable()
        try:
            for item in walked:
                if isinstance(item, str):
                    self._problems.append(item)
                    continue
                problem, records = decoded(item)
                if problem is not None:
                    self._problems.append(problem)
                    continue
                floor = max(self._from, item.segment.base_offset)
                if records[0][0] < floor:
                    records = [r for r in records if r[0] >= floor]
                keys = [r[2] for r in records]
                winners.update(zip(keys, records, strict=True))  # offset order: the last wins
                counts.update(keys)
                if len(winners) > self._max_keys:
                    yield from self._flush()
                    winners, counts = self._winners, self._counts
        finally:
            if collecting:
                gc.enable()

    def _flush(self) -> Iterator[pa.RecordBatch]:
        if self._winners:
            rows = list(self._winners.values())
            keyless = self._winners.get(None)
            if keyless is not None:  # the key-null row only carries the keyless count and offset
                self._winners[None] = (keyless[0], keyless[1], None, None, ())
                rows = list(self._winners.values())
            batch = records_batch(self._topic, self._partition, rows)
            counts = pa.array([self._counts[r[2]] for r in rows], pa.int64())
            yield _folded(batch, counts)
        if self._problems:
            batch = _problems_batch(self._topic, self._partition, self._problems)
            yield _folded(batch, pa.array([0] * len(self._problems), pa.int64()))
        self._winners, self._counts, self._problems = {}, Counter(), []


def _folded(
    batch: pa.RecordBatch,
    records: pa.Array,
    aborted: pa.Array | None = None,
    undecided: pa.Array | None = None,
) -> pa.RecordBatch:
    count = batch.num_rows
    return pa.RecordBatch.from_arrays(
        [
            *batch.columns,
            records,
            pa.nulls(count, pa.int64()) if aborted is None else aborted,
            pa.nulls(count, pa.int64()) if undecided is None else undecided,
        ],
        schema=FOLDED_SCHEMA,
    )


def info_batch(
    topic: str, partition: int, last_offset: int, aborted: int, undecided: int | None
) -> pa.RecordBatch:
    """A task's one row about itself (key null, no record, `records` 0): `offset` is the last
    offset it followed, markers and aborted batches included (so a horizon passes them),
    `aborted` the records of aborted transactions it left out, `undecided` the first offset of a
    transaction still open at the end of the partition's segments (None: none)."""
    info = pa.RecordBatch.from_arrays(
        [
            pa.array([topic], pa.string()),
            pa.array([partition], pa.int32()),
            pa.array([last_offset], pa.int64()),
            pa.nulls(1, pa.int64()),
            pa.nulls(1, pa.binary()),
            pa.nulls(1, pa.binary()),
            _headers([()]),
            pa.nulls(1, pa.string()),
        ],
        schema=WAL_SCHEMA,
    )
    return _folded(
        info,
        pa.array([0], pa.int64()),
        pa.array([aborted], pa.int64()),
        pa.array([undecided], pa.int64()),
    )


def iter_batches(segment: SegmentObject, data: bytes) -> Iterator[tuple[str | None, list[Row]]]:
    """One segment's visible records batch by batch, decided on its own (a transaction still
    open at its end left out), and `(report, [])` for each damaged stretch: for tools and tests
    that read a segment object alone."""
    batches = DecidedBatches()
    walked = itertools.chain(batches.add(segment, data, 0), batches.finish((), held_visible=True))
    for item in walked:
        yield (item, []) if isinstance(item, str) else decoded(item)


def _skipped(segment: SegmentObject, data: bytes, position: int, length: int, reason: str) -> str:
    """Report a damaged stretch: got past as the server's readers get past it
    (storage.segments.walk_batches), and logged under the same event as theirs."""
    problem = f"{segment.key} at byte {position}: {_damage(reason, data, position, length)}"
    log.error(
        "topic.data_skipped",
        topic=segment.topic,
        partition=segment.partition,
        segment=segment.key,
        position=position,
        length=length,
        reason=problem,
    )
    return problem


def _damage(reason: str, data: bytes, position: int, length: int) -> str:
    left = len(data) - position
    if left < BATCH_HEADER_SIZE:
        return f"{left} trailing bytes, shorter than a batch header"
    if position + length >= len(data):
        return f"{reason} ({left} bytes left); the rest of the segment is skipped"
    return f"{reason}; {length} bytes skipped up to the next valid batch"
