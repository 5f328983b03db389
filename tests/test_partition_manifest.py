"""A cluster partition's manifest (storage/partition_manifest.py) and the uploads it names
(storage/uploader.py with a `SegmentPublisher`, storage/archive.py reading through it). Real
files: the local object store backend, RocksDB for the uploader's records."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from headwater.storage.archive import ObjectArchive
from headwater.storage.logstate import SealedSegment
from headwater.storage.objectstore import LocalObjectStore
from headwater.storage.partition_manifest import (
    Manifest,
    ManifestFenced,
    PartitionManifests,
    SegmentEntry,
)
from headwater.storage.state import StateStore
from headwater.storage.uploader import UploadedSegment, Uploader
from headwater.wire.records import build_batch, inspect_batch, stamp_base_offset


def entry(base: int, end: int, name: str) -> SegmentEntry:
    return SegmentEntry(base, end, base, name, 100)


async def test_a_claim_fences_every_earlier_epoch(tmp_path: Path) -> None:
    manifests = PartitionManifests(LocalObjectStore(tmp_path))
    first = await manifests.claim("t", 0, 5)
    first = await manifests.add("t", 0, 5, entry(0, 10, "a"), first)
    await manifests.claim("t", 0, 9)
    with pytest.raises(ManifestFenced):  # what it knew is stale, and what it reads is later
        await manifests.add("t", 0, 5, entry(10, 20, "b"), first)
    with pytest.raises(ManifestFenced):
        await manifests.claim("t", 0, 5)
    latest = await manifests.latest("t", 0)
    assert (latest.epoch, [s.name for s in latest.segments]) == (9, ["a"])


async def test_entries_never_overlap_nor_nest(tmp_path: Path) -> None:
    manifests = PartitionManifests(LocalObjectStore(tmp_path))
    known = await manifests.claim("t", 0, 3)
    known = await manifests.add("t", 0, 3, entry(0, 100, "long"), known)
    # another owner's log began inside it (a chunk straddled its end): named from 100 on
    known = await manifests.add("t", 0, 3, entry(95, 150, "straddling"), known)
    # a segment inside what is named adds nothing: the same version stays
    same = await manifests.add("t", 0, 3, entry(100, 120, "nested"), known)
    assert same == known
    assert [(s.first, s.end, s.base, s.name) for s in known.segments] == [
        (0, 100, 0, "long"),
        (100, 150, 95, "straddling"),
    ]
    with pytest.raises(Exception, match="past the manifest's end"):
        Manifest(0, 3, known.segments).adding(entry(160, 170, "after a hole"))


def test_a_segment_replaces_the_folds_it_holds() -> None:
    manifest = Manifest(0, 1)
    for first, end in ((0, 10), (10, 20), (20, 30), (30, 40)):
        manifest = manifest.adding(entry(first, end, f"fold-{first}"))
    # a sealed segment [5, 35): holds the folds [10, 20) and [20, 30) entirely
    merged = manifest.adding(entry(5, 35, "segment"))
    assert [(s.first, s.end, s.name) for s in merged.segments] == [
        (0, 10, "fold-0"),
        (10, 30, "segment"),
        (30, 40, "fold-30"),
    ]
    assert manifest.names() - merged.names() == {"fold-10", "fold-20"}
    # one reaching past the end replaces every entry it holds and goes on from there
    longer = merged.adding(entry(10, 50, "long"))
    assert [(s.first, s.end, s.name) for s in longer.segments] == [
        (0, 10, "fold-0"),
        (10, 50, "long"),
    ]
    # holding one entry only: nothing gained
    assert merged.adding(entry(30, 40, "same")) is merged


async def test_a_writer_that_lost_a_version_reads_the_winner_first(tmp_path: Path) -> None:
    manifests = PartitionManifests(LocalObjectStore(tmp_path))
    claimed = await manifests.claim("t", 0, 4)
    # both write from the claimed version: the second finds it taken and adds onto the first's
    one, two = await asyncio.gather(
        manifests.add("t", 0, 4, entry(0, 10, "one"), claimed),
        manifests.add("t", 0, 4, entry(0, 20, "two"), claimed),
    )
    latest = await manifests.latest("t", 0)
    assert latest in (one, two)
    assert latest.version == claimed.version + 2 or latest.end == 20
    assert latest.end == 20


async def test_only_the_two_newest_versions_are_kept(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    manifests = PartitionManifests(store)
    known = await manifests.claim("t", 0, 1)
    for i in range(5):
        known = await manifests.add("t", 0, 1, entry(i * 10, i * 10 + 10, f"s{i}"), known)
    # the older ones are deleted in the background (a take-over does not wait for it)
    deadline = time.monotonic() + 10
    while len(names := [o.key.rsplit("/", 1)[1] for o in await store.list("t/0/manifest/")]) > 2:
        assert time.monotonic() < deadline, names
        await asyncio.sleep(0.01)
    assert [int(n) for n in names] == [known.version - 1, known.version]
    assert (await manifests.latest("t", 0)).end == 50


async def test_a_recreated_topic_starts_empty_and_keeps_its_manifest_through_the_purge(
    tmp_path: Path,
) -> None:
    store = LocalObjectStore(tmp_path)
    manifests = PartitionManifests(store)
    old = await manifests.claim("t", 0, 5)
    await manifests.add("t", 0, 5, entry(0, 10, "old"), old)
    # deleted at revision 17, re-created: its epochs are above
    fresh = await manifests.claim("t", 0, 21, since=18)
    assert fresh.segments == ()
    assert await manifests.purge("t", 17) >= 1  # the old versions under the new one
    deadline = time.monotonic() + 10  # (one may be going in the background)
    while len(await store.list("t/0/manifest/")) > 1:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert [o.key for o in await store.list("t/0/manifest/")] == [f"t/0/manifest/{2:020d}"]
    assert (await manifests.latest("t", 0)).epoch == 21


def stamped(base: int, count: int) -> bytes:
    data = b""
    for offset in range(base, base + count):
        batch = bytearray(build_batch([(None, f"v{offset}".encode(), ())]))
        stamp_base_offset(batch, offset)
        data += bytes(batch)
    return data


class Publisher:
    """Names uploads and records them in a manifest, as a cluster broker does."""

    def __init__(self, manifests: PartitionManifests, epoch: int, allow: bool = True) -> None:
        self.manifests = manifests
        self.epoch = epoch
        self.allow = allow
        self.known: Manifest | None = None

    async def name(self, topic: str, partition: int, segment: SealedSegment) -> str | None:
        return f"{topic}/{partition}/{segment.base_offset:020d}-{self.epoch:020d}"

    async def publish(
        self, topic: str, partition: int, segment: UploadedSegment
    ) -> UploadedSegment | None:
        if not self.allow:
            return None
        if self.known is None:
            self.known = await self.manifests.claim(topic, partition, self.epoch)
        base = segment.base_offset
        self.known = await self.manifests.add(
            topic,
            partition,
            self.epoch,
            SegmentEntry(base, segment.next_offset, base, segment.name, segment.size),
            self.known,
        )
        named = self.known.segments[-1]
        return UploadedSegment(named.base, named.end, named.size, named.name, named.first)


async def test_uploads_are_read_through_what_the_manifest_names(tmp_path: Path) -> None:
    """Two owners uploaded segments starting at the same offset; the reader follows the
    manifest's disjoint entries and reads each offset from exactly one object, after a restart
    too (the records in RocksDB)."""
    store = LocalObjectStore(tmp_path / "objects")
    manifests = PartitionManifests(store)
    state = StateStore(tmp_path / "state")
    uploader = Uploader(store, state)
    uploader.start()
    try:
        paths = []
        for base, count in ((0, 5), (0, 8), (8, 4)):
            path = tmp_path / f"{base}-{count}.log"
            path.write_bytes(stamped(base, count))
            paths.append(SealedSegment(base, base + count, path, path.stat().st_size))
        # epoch 3 uploads [0, 5), epoch 7 (its log rebuilt from 0) uploads [0, 8) and [8, 12)
        uploader.publisher = Publisher(manifests, 3)
        uploader.enqueue("t", 0, paths[0])
        assert await uploader.drain(10)
        uploader.publisher = Publisher(manifests, 7)
        uploader.publisher.known = await manifests.claim("t", 0, 7)
        uploader.enqueue("t", 0, paths[1])
        uploader.enqueue("t", 0, paths[2])
        assert await uploader.drain(10)
        named = (await manifests.latest("t", 0)).segments
        # epoch 7's [0, 8) holds epoch 3's [0, 5) entirely: it replaces it
        assert [(s.first, s.end, s.base) for s in named] == [(0, 8, 0), (8, 12, 8)]
        assert named[0].name == "t/0/00000000000000000000-00000000000000000007"
    finally:
        await uploader.close()
    state.close()
    state = StateStore(tmp_path / "state")
    try:
        archive = ObjectArchive(store, Uploader(store, state))
        offsets = []
        offset = 0
        while offset < 12:
            batches = await archive.read("t", 0, offset)
            assert batches, offset
            for batch in batches:
                info = inspect_batch(batch)
                if info.base_offset >= offset:
                    offsets.append(info.base_offset)
                    offset = info.base_offset + info.record_count
        assert offsets == list(range(12))
    finally:
        state.close()


async def test_an_upload_the_manifest_refuses_is_deleted_and_not_recorded(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    state = StateStore(tmp_path / "state")
    uploader = Uploader(store, state)
    uploader.publisher = Publisher(PartitionManifests(store), 3, allow=False)
    uploader.start()
    try:
        path = tmp_path / "0.log"
        path.write_bytes(stamped(0, 3))
        uploader.enqueue("t", 0, SealedSegment(0, 3, path, path.stat().st_size))
        assert await uploader.drain(10)
        assert not uploader.holds("t", 0, 0, 3)
        assert await store.list("t/") == []
    finally:
        await uploader.close()
        state.close()


def test_a_local_segment_is_held_only_when_the_named_entries_cover_all_of_it(
    tmp_path: Path,
) -> None:
    """Retention deletes a local segment only when uploaded segments hold every offset of it:
    in a cluster, possibly several entries of other owners, each from its `first`."""
    state = StateStore(tmp_path / "state")
    try:
        uploader = Uploader(LocalObjectStore(tmp_path / "objects"), state)
        uploader.replace("t", 0, [UploadedSegment(0, 5, 10, "t/0/a", 0)])
        assert uploader.holds("t", 0, 0, 5)
        assert not uploader.holds("t", 0, 0, 8)  # [5, 8) is in no named segment
        uploader.replace(
            "t", 0, [UploadedSegment(0, 5, 10, "t/0/a", 0), UploadedSegment(0, 8, 16, "t/0/b", 5)]
        )
        assert uploader.holds("t", 0, 0, 8)
        assert uploader.holds("t", 0, 3, 8)
        assert not uploader.holds("t", 0, 3, 9)
        # a record written before segments had names still reads
        assert UploadedSegment.decode(4, b"9,100") == UploadedSegment(4, 9, 100)
    finally:
        state.close()
