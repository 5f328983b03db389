"""Synthetic WAL histories, written to an object store exactly as the server's uploader writes them.

For tests and benchmarks of compaction: `generate` makes a deterministic history (seeded) of
overwrites, tombstones, keyless records and headers over a key space; `write_segments` encodes it
with `wire.records` into batches (cycling through the codecs, so compressed batches are in every
history), stamps base offsets, and stores `<topic>/<partition>/<base offset>.log` objects with
their `.index` companions, several batches per segment. The result is indistinguishable from
uploaded segments of a reliable topic, which is the point: compaction reads only those objects.

`transactional` makes a history of whole batches instead: plain batches interleaved with the
transactions of several producers, each committed or aborted by a marker (`wire.markers`), and
with `left_open` the last ones of some producers still open; each batch says what the generator
meant for it (`Written.outcome`), so a test's reference needs no reading of the markers.
`write_batches` stores such a history as segments.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from headwater.spark_compaction.store import BlockingStore
from headwater.spark_compaction.wal_segments import SegmentObject
from headwater.wire.markers import Marker, build_marker
from headwater.wire.records import BatchBuilder, Compression, stamp_base_offset

CODECS = (
    Compression.NONE,
    Compression.GZIP,
    Compression.SNAPPY,
    Compression.LZ4,
    Compression.ZSTD,
)


@dataclass(frozen=True, slots=True)
class Entry:
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


def generate(
    count: int,
    keys: int,
    *,
    seed: int = 1,
    tombstones: float = 0.05,
    keyless: float = 0.03,
    headers: float = 0.1,
    value_size: int | None = None,
    start_timestamp: int = 1_790_000_000_000,
) -> Iterator[Entry]:
    """`count` records over `keys` keys; values name their record unless `value_size` is set."""
    chance = random.Random(seed)
    for index in range(count):
        key = None if chance.random() < keyless else b"key-%08d" % chance.randrange(keys)
        if key is not None and chance.random() < tombstones:
            value = None
        elif value_size is None:
            value = b"v%d-%d" % (seed, index)
        else:
            value = (b"%d-" % index).ljust(value_size, b"x")
        extra: tuple[tuple[str, bytes | None], ...] = ()
        if chance.random() < headers:
            extra = (("source", b"gen"), ("seq", str(index).encode()))
        yield Entry(key, value, extra, start_timestamp + index)


def write_segments(
    store: BlockingStore,
    topic: str,
    partition: int,
    entries: Sequence[Entry] | Iterator[Entry],
    *,
    start_offset: int = 0,
    batch_records: int = 50,
    segment_batches: int = 8,
    codecs: Sequence[Compression] = CODECS,
) -> int:
    """Store the entries as segments from `start_offset`; returns the next offset."""
    offset = start_offset
    segment_base = offset
    segment: list[bytes] = []
    builder = BatchBuilder(codecs[0])
    batches = 0

    def seal_batch() -> None:
        nonlocal builder, offset, batches
        segment.append(builder.build(offset))
        offset += builder.count
        batches += 1
        builder = BatchBuilder(codecs[batches % len(codecs)])

    def seal_segment() -> None:
        nonlocal segment_base
        _store_segment(store, topic, partition, segment_base, segment)
        segment.clear()
        segment_base = offset

    for entry in entries:
        builder.append(entry.key, entry.value, entry.headers, entry.timestamp)
        if builder.count >= batch_records:
            seal_batch()
            if len(segment) >= segment_batches:
                seal_segment()
    if builder.count:
        seal_batch()
    if segment:
        seal_segment()
    return offset


# a batch's: plain, of a transaction committed, aborted or still open; or a marker ("commit",
# "abort") ending its producer's transaction
Outcome = Literal["plain", "committed", "aborted", "open", "commit", "abort"]


@dataclass(frozen=True, slots=True)
class Written:
    """One batch of a transactional history: its records (none for a marker), its producer
    (transactional batches and markers), and what became of it or, for a marker, what it says."""

    entries: tuple[Entry, ...]
    outcome: Outcome
    producer_id: int = -1

    @property
    def visible(self) -> bool:
        return self.outcome in ("plain", "committed")


def transactional(
    count: int,
    keys: int,
    *,
    seed: int = 1,
    producers: int = 3,
    abort: float = 0.35,
    left_open: int = 0,
    batch_records: int = 6,
) -> list[Written]:
    """About `count` records over `keys` keys (tombstones and keyless ones too), as plain batches
    and transactions of `producers` producers (ids 1..producers, each with at most one open at a
    time), a fraction `abort` of them aborted; the last transactions of `left_open` producers
    have no marker. Deterministic for a seed."""
    chance = random.Random(seed)
    entries = generate(count, keys, seed=seed)
    open_: dict[int, Outcome] = {}  # producer -> the outcome its open transaction will have
    history: list[Written] = []
    taken = 0
    while taken < count:
        producer = chance.randrange(producers + 1)  # 0: a plain batch
        if producer and producer in open_ and chance.random() < 0.3:
            ending = open_.pop(producer)
            history.append(Written((), "commit" if ending == "committed" else "abort", producer))
            continue
        size = min(count - taken, 1 + chance.randrange(batch_records))
        batch = tuple(next(entries) for _ in range(size))
        taken += size
        if not producer:
            history.append(Written(batch, "plain"))
            continue
        fate: Outcome = "aborted" if chance.random() < abort else "committed"
        history.append(Written(batch, open_.setdefault(producer, fate), producer))
    for index, (producer, ending) in enumerate(sorted(open_.items())):
        if index >= left_open:
            history.append(Written((), "commit" if ending == "committed" else "abort", producer))
            continue
        ends = [
            i
            for i, w in enumerate(history)
            if w.producer_id == producer and w.outcome in ("commit", "abort")
        ]
        start = max(ends) + 1 if ends else 0
        history[start:] = [
            Written(w.entries, "open", producer) if w.producer_id == producer else w
            for w in history[start:]
        ]
    return history


def write_batches(
    store: BlockingStore,
    topic: str,
    partition: int,
    history: Sequence[Written],
    *,
    start_offset: int = 0,
    segment_batches: int = 8,
    codecs: Sequence[Compression] = CODECS,
) -> list[int]:
    """Store a transactional history as segments from `start_offset`; returns each batch's base
    offset."""
    offset = start_offset
    bases: list[int] = []
    segment: list[bytes] = []
    segment_base = offset
    for index, written in enumerate(history):
        if written.outcome in ("commit", "abort"):
            kind = Marker.COMMIT if written.outcome == "commit" else Marker.ABORT
            batch = bytearray(build_marker(written.producer_id, 0, kind))
            stamp_base_offset(batch, offset)
            data, records = bytes(batch), 1
        else:
            transactional = written.producer_id >= 0
            builder = BatchBuilder(
                codecs[index % len(codecs)],
                producer_id=written.producer_id,
                producer_epoch=0 if transactional else -1,
                base_sequence=offset if transactional else -1,
                transactional=transactional,
            )
            for entry in written.entries:
                builder.append(entry.key, entry.value, entry.headers, entry.timestamp)
            data, records = builder.build(offset), builder.count
        bases.append(offset)
        segment.append(data)
        offset += records
        if len(segment) >= segment_batches or index == len(history) - 1:
            _store_segment(store, topic, partition, segment_base, segment)
            segment.clear()
            segment_base = offset
    return bases


def _store_segment(
    store: BlockingStore, topic: str, partition: int, base_offset: int, batches: list[bytes]
) -> None:
    """A segment object and its `.index` companion, as the uploader stores them."""
    key = SegmentObject(topic, partition, base_offset, 0).key
    store.put(key[: -len(".log")] + ".index", b"")
    store.put(key, b"".join(batches))
