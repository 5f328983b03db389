"""WAL segment objects: finding them in the object store and decoding them into Arrow batches.

The uploader (storage/uploader.py) names a segment `<topic>/<partition>/<base offset>.log`, the
offset in 20 digits; its content is record batches exactly as the WAL holds them, base offsets
stamped. Only keys of exactly that shape count as segments, so `.index` objects, snapshots
(`snapshots/...`, four or more parts) and anything else that shares the store are ignored. A
cluster's partition has a manifest (storage/partition_manifest.py) instead: its segments are
exactly the objects the newest version names, each counting from its entry's first offset
(objects it does not name, such as an upload of an owner that lost the partition, are not read).

Decoding walks the batches with the server's own walker (`storage.segments.walk_batches`) and
decodes each visible one with `wire.records.decode_columns` (compressed batches too) into
`Columns`, which become Arrow batches; `Folder` folds them in Arrow (docs/COMPACTION.md, "Arrow
end to end"). Bytes that hold no valid batch (a bad
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

import contextlib
import gc
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
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
    decode_columns,
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


def _headers(count: int, found: Sequence[tuple[int, Headers]]) -> pa.Array:
    """`count` records' headers, from the (index, headers) of those that have any."""
    if not found:  # the usual case, built without a Python object per record
        return pa.ListArray.from_arrays(
            pa.array(itertools.repeat(0, count + 1), pa.int32()), _EMPTY_HEADERS, type=HEADERS_TYPE
        )
    every: list[Headers] = [()] * count
    for index, headers in found:
        every[index] = headers
    return pa.array([[{"key": k, "value": v} for k, v in h] for h in every], HEADERS_TYPE)


class Columns:
    """Records decoded column by column (`wire.records.decode_columns`: the codec's C loop and
    three list appends a record, no object of ours per record), until `take` turns them into one
    Arrow batch. Offsets are kept as the ranges the batches cover, so they cost nothing a record
    until the batch is built."""

    __slots__ = ("_headers", "_keys", "_offsets", "_timestamps", "_values")

    def __init__(self) -> None:
        self._offsets: list[int] = []
        self._timestamps: list[int] = []
        self._keys: list[bytes | None] = []
        self._values: list[bytes | None] = []
        self._headers: list[tuple[int, Headers]] = []

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, batch: bytes, low: int = 0, high: int | None = None) -> None:
        """A batch's records with offsets in [low, high); raises `CorruptBatch` (adding none)."""
        start, held = len(self._keys), len(self._headers)
        count = decode_columns(batch, self._timestamps, self._keys, self._values, self._headers)
        base = read_base_offset(batch)
        first = max(base, low)
        end = max(first, base + count if high is None else min(base + count, high))
        if first > base or end < base + count:  # the range cuts the batch: rare, no hurry
            keep = slice(start + first - base, start + end - base)
            self._timestamps[start:] = self._timestamps[keep]
            self._keys[start:] = self._keys[keep]
            self._values[start:] = self._values[keep]
            shift = keep.start - start
            self._headers[held:] = [
                (i - shift, h) for i, h in self._headers[held:] if keep.start <= i < keep.stop
            ]
        self._offsets.extend(range(first, end))

    def take(self, topic: str, partition: int) -> pa.RecordBatch:
        """The records as one batch of WAL_SCHEMA (`corrupt` null), and start again empty."""
        count = len(self._keys)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.repeat(pa.scalar(topic, pa.string()), count),
                pa.repeat(pa.scalar(partition, pa.int32()), count),
                pa.array(self._offsets, pa.int64()),
                pa.array(self._timestamps, pa.int64()),
                pa.array(self._keys, pa.binary()),
                pa.array(self._values, pa.binary()),
                _headers(count, self._headers),
                pa.nulls(count, pa.string()),
            ],
            schema=WAL_SCHEMA,
        )
        self._offsets, self._timestamps, self._keys, self._values = [], [], [], []
        self._headers = []
        return batch


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
            _headers(count, ()),
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
    columns = Columns()
    problems: list[str] = []
    first: SegmentObject | None = None

    def walked() -> Iterator[str | StoredBatch]:
        nonlocal first
        for segment, data in segments:
            first = first or segment
            yield from batches.add(segment, data, from_offset)
        yield from batches.finish(following, held_visible=True)

    with _collector_paused():
        for item in walked():
            _decode(item, columns, from_offset, problems)
            if len(columns) >= rows_per_batch and first is not None:
                yield columns.take(first.topic, first.partition)
    if first is not None and len(columns):
        yield columns.take(first.topic, first.partition)
    if first is not None and problems:
        yield _problems_batch(first.topic, first.partition, problems)


def _decode(
    item: str | StoredBatch, columns: Columns, from_offset: int, problems: list[str]
) -> None:
    """A decided batch's records at or past `from_offset` into `columns`, or a report of
    damage into `problems`."""
    if isinstance(item, str):
        problems.append(item)
        return
    try:
        columns.add(item.data, max(from_offset, item.segment.base_offset))
    except CorruptBatch as exc:
        problems.append(f"{item.where}: {exc}")


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Decoding makes millions of short-lived objects (keys, values, the codec's records), none in
    a cycle, and keeps the columns' long lists alive: the cyclic collector would only walk them
    again and again (a quarter of the CPU time, measured), so it waits until the batch is done."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def decode_segment(
    segment: SegmentObject, data: bytes, from_offset: int = 0, rows_per_batch: int = ROWS_PER_BATCH
) -> Iterator[pa.RecordBatch]:
    """One segment's records at or above `from_offset` as WAL rows (`decode_group` of one)."""
    return decode_group([(segment, data)], from_offset, (), rows_per_batch)


class Folder:
    """Folds the records of one partition's segments as they are decoded: the map-side combiner.

    Decodes into `Columns` and, every `chunk_rows` records, folds them with what it kept so far in
    Arrow (`newest_per_key`: a hash `group_by` on the key for each key's highest offset and record
    count, then the rows at those offsets), so a task hands Spark one row per key it saw instead
    of one per record, and no Python runs per record past the decode. Past `max_keys` keys it
    hands over what it has and starts again (Spark's own fold merges the pieces), so a task's
    memory stays bounded. Its batches come through `DecidedBatches`, in offset order, so the
    highest offset of a key is its newest record; `finish` adds a row about the task
    (`info_batch`).
    """

    def __init__(
        self,
        segment: SegmentObject,
        max_keys: int = 1_000_000,
        until: int | None = None,
        chunk_rows: int = 262_144,
    ) -> None:
        self._topic = segment.topic
        self._partition = segment.partition
        self._max_keys = max_keys
        self._chunk_rows = min(chunk_rows, max_keys)  # records are at least as many as keys
        self._batches = DecidedBatches(until)
        self._from = 0
        self._columns = Columns()
        self._kept: pa.Table | None = None  # folded so far: one row per key, in offset order
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
        with _collector_paused():
            for item in walked:
                _decode(item, self._columns, self._from, self._problems)
                if len(self._columns) >= self._chunk_rows:
                    self._merge()
                    if self._kept is not None and self._kept.num_rows > self._max_keys:
                        yield from self._flush()

    def _merge(self) -> None:
        """Fold the decoded columns into what is kept."""
        if not len(self._columns):
            return
        batch = self._columns.take(self._topic, self._partition)
        table = pa.Table.from_batches([batch]).append_column(
            "records", pa.repeat(pa.scalar(1, pa.int64()), batch.num_rows)
        )
        if self._kept is not None:
            table = pa.concat_tables([self._kept, table])
        self._kept = newest_per_key(table)

    def _flush(self) -> Iterator[pa.RecordBatch]:
        self._merge()
        if self._kept is not None:
            kept = self._kept
            keyless = pc.is_null(kept["key"])
            if pc.any(
                keyless
            ).as_py():  # the key-null row only carries the keyless count and offset
                value = pc.if_else(keyless, pa.scalar(None, pa.binary()), kept["value"])
                headers = pc.if_else(keyless, _headers(kept.num_rows, ()), kept["headers"])
                kept = kept.set_column(kept.schema.get_field_index("value"), "value", value)
                kept = kept.set_column(kept.schema.get_field_index("headers"), "headers", headers)
            for batch in kept.combine_chunks().to_batches():
                yield _folded(
                    pa.RecordBatch.from_arrays(batch.columns[:-1], schema=WAL_SCHEMA),
                    batch["records"],
                )
        if self._problems:
            batch = _problems_batch(self._topic, self._partition, self._problems)
            yield _folded(batch, pa.array([0] * len(self._problems), pa.int64()))
        self._kept, self._problems = None, []


def newest_per_key(table: pa.Table) -> pa.Table:
    """One row per key (null, the keyless records, is a key here): the row with the highest
    `offset`, its `records` the sum of the key's. Offsets are unique (one partition) and the rows
    in offset order, which the result keeps."""
    groups = (
        table.group_by("key", use_threads=False)
        .aggregate([("offset", "max"), ("records", "sum")])
        .sort_by("offset_max")
    )
    newest = table.filter(pc.is_in(table["offset"], value_set=groups["offset_max"]))
    return newest.set_column(
        newest.schema.get_field_index("records"), "records", groups["records_sum"]
    )


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
            _headers(1, ()),
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
