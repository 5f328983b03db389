"""Synthetic WAL histories, written to an object store exactly as the server's uploader writes them.

For tests and benchmarks of compaction: `generate` makes a deterministic history (seeded) of
overwrites, tombstones, keyless records and headers over a key space; `write_segments` encodes it
with `wire.records` into batches (cycling through the codecs, so compressed batches are in every
history), stamps base offsets, and stores `<topic>/<partition>/<base offset>.log` objects with
their `.index` companions, several batches per segment. The result is indistinguishable from
uploaded segments of a reliable topic, which is the point: compaction reads only those objects.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from headwater.spark_compaction.store import BlockingStore
from headwater.spark_compaction.wal_segments import SegmentObject
from headwater.wire.records import BatchBuilder, Compression

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
        key = SegmentObject(topic, partition, segment_base, 0).key
        store.put(key[: -len(".log")] + ".index", b"")
        store.put(key, b"".join(segment))
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
