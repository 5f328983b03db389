"""Ships sealed WAL segments to the object store in the background, and remembers what it shipped.

Sealed segments are queued by the WAL (`enqueue`) and uploaded one at a time, index first, then
the log: a segment counts as uploaded only once both objects exist, which is recorded in RocksDB
(`upload/...`). The object store being down never blocks producers: uploads retry with doubling
delays (capped) until they succeed, and the queue simply grows by one entry per sealed segment.
Retention asks `holds` before deleting a local segment.

Deleting a topic (`forget_topic`) forgets its uploads and queues a purge of its objects (its
segments and its compaction snapshots, `snapshots/<topic>/...`). The queue
is worked in order, so the purge runs after any upload of the deleted topic already queued or in
flight and before any upload of a topic re-created under the same name: the new topic never
inherits an old object or upload record. Each topic name has an epoch, bumped by a delete, so an
upload that finishes after its topic was deleted is not recorded (the purge removes its objects).

Object names: `<topic>/<partition>/<base offset, 20 digits>.log` and `.index`. In a cluster a
`SegmentPublisher` names each upload uniquely and records it in the partition's manifest
(storage/partition_manifest.py) before it counts as uploaded: a segment the manifest does not
name is not read, and its objects are deleted again.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

from headwater.storage.objectstore import ObjectStore
from headwater.storage.snapshots import topic_prefix as snapshot_prefix
from headwater.storage.state import UPLOAD, StateStore, key
from headwater.storage.tasks import end_tasks, spawn
from headwater.storage.wal import SealedSegment
from headwater.wire.errors import StorageError

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class UploadedSegment:
    base_offset: int  # the object's first batch
    next_offset: int
    size: int
    # a cluster's: the object's name without suffix (unique per upload), and the first offset it
    # counts for in the partition's manifest (entries never overlap; the object may start lower)
    name: str = ""
    first: int = -1
    # False for a cloud tail chunk read in place (a cluster's take-over, until it is folded):
    # batches back to back like a segment's log, without an index object
    indexed: bool = True
    # where its bytes start in the object: a slice of a broker's shared tail object (cluster
    # `tail_layout = "broker"`) is `size` bytes from there; 0 for every other object
    position: int = 0

    @property
    def start(self) -> int:
        """The first offset read from this segment."""
        return self.first if self.first >= 0 else self.base_offset

    def key(self, topic: str, partition: int, suffix: str = ".log") -> str:
        if self.name:
            return f"{self.name}{suffix}"
        return object_key(topic, partition, self.base_offset, suffix)

    def encode(self) -> bytes:
        """The record's value; its key holds `start` (unique: two owners' objects may share a
        base offset, never a start)."""
        indexed = f"{int(self.indexed)}:{self.position}" if self.position else int(self.indexed)
        return f"{self.next_offset},{self.size},{self.base_offset},{indexed},{self.name}".encode()

    @classmethod
    def decode(cls, start: int, value: bytes) -> UploadedSegment:
        fields = value.decode().split(",", 4)
        if len(fields) == 2:  # recorded before segments had names
            return cls(start, int(fields[0]), int(fields[1]))
        next_offset, size, base, flags, name = fields
        first = start if name else -1
        indexed, _, position = flags.partition(":")  # "1", "0", or "0:<position>" for a slice
        return cls(
            int(base), int(next_offset), int(size), name, first, indexed == "1", int(position or 0)
        )


def object_key(topic: str, partition: int, base_offset: int, suffix: str = ".log") -> str:
    return f"{topic}/{partition}/{base_offset:020d}{suffix}"


class SegmentPublisher(Protocol):
    """A cluster's say on uploads: which segments to upload, under what name, and whether the
    partition's manifest now names them."""

    def may_upload(self, topic: str, partition: int) -> bool:
        """Whether this broker uploads the partition's segments (it serves the partition)."""
        ...

    async def name(self, topic: str, partition: int, segment: SealedSegment) -> str | None:
        """The name to upload `segment` under, once it may be (its batches are all in the
        object store's tail); None: do not upload it (not ours, or nothing new)."""
        ...

    async def publish(
        self, topic: str, partition: int, segment: UploadedSegment
    ) -> UploadedSegment | None:
        """Name the uploaded segment in the manifest; the entry as named, or None if it may not
        be (the partition moved): its objects are then deleted."""
        ...


class Uploader:
    def __init__(
        self,
        store: ObjectStore,
        state: StateStore,
        retry_initial: float = 0.5,
        retry_max: float = 30.0,
        publisher: SegmentPublisher | None = None,
    ) -> None:
        """`publisher`: a cluster's say on uploads (None: one broker uploads everything it
        seals, and removes a deleted topic's objects itself)."""
        self.store = store
        self._state = state
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        # (topic, partition, segment or None for a purge of the topic's objects, topic epoch)
        self._queue: asyncio.Queue[tuple[str, int, SealedSegment | None, int]] = asyncio.Queue()
        self._epochs: dict[str, int] = {}
        self._queued: set[tuple[str, int, int]] = set()
        self._uploaded: dict[tuple[str, int], list[UploadedSegment]] = {}
        self._task: asyncio.Task[None] | None = None
        self._busy = False
        self.failures = 0
        # a cluster's: upload only what this broker serves, and only what `publisher` names
        self.publisher = publisher
        self.may_upload: Callable[[str, int], bool] = (
            (lambda topic, partition: True) if publisher is None else publisher.may_upload
        )
        # False in a cluster: the objects are the cluster's, and a broker creating or dropping
        # its copy of a topic must not remove them (`purge` does, for the cluster's delete)
        self.purges = publisher is None
        for raw_key, value in state.scan(UPLOAD):
            topic, partition, start = raw_key.decode().split("\0")
            self._record(topic, int(partition), UploadedSegment.decode(int(start), value))

    def _record(self, topic: str, partition: int, segment: UploadedSegment) -> None:
        segments = self._uploaded.setdefault((topic, partition), [])
        if segment in segments:
            return  # (a cluster's publisher may have recorded its manifest already)
        bisect.insort(segments, segment, key=lambda s: s.start)

    def start(self) -> None:
        self._task = spawn(self._run(), "upload.loop_failed")

    def enqueue(self, topic: str, partition: int, segment: SealedSegment) -> None:
        ident = (topic, partition, segment.base_offset)
        if ident in self._queued or self.holds(
            topic, partition, segment.base_offset, segment.next_offset
        ):
            return
        self._queued.add(ident)
        self._queue.put_nowait((topic, partition, segment, self._epochs.get(topic, 0)))

    def holds(self, topic: str, partition: int, base_offset: int, next_offset: int) -> bool:
        """Whether uploaded segments hold every offset of [base_offset, next_offset) (in a
        cluster, possibly segments of other owners that the manifest names)."""
        position = base_offset
        for segment in self._uploaded.get((topic, partition), []):
            if segment.start <= position < segment.next_offset:
                position = segment.next_offset
        return position >= next_offset

    def uploaded(self, topic: str, partition: int) -> list[UploadedSegment]:
        return list(self._uploaded.get((topic, partition), []))

    @property
    def pending(self) -> int:
        return self._queue.qsize() + (1 if self._busy else 0)

    async def _run(self) -> None:
        while True:
            topic, partition, segment, epoch = await self._queue.get()
            if segment is not None and epoch != self._epochs.get(topic, 0):
                self._queued.discard((topic, partition, segment.base_offset))
                continue  # its topic was deleted since: the purge queued then removes the rest
            self._busy = True
            delay = self._retry_initial
            try:
                while True:
                    try:
                        if segment is None:
                            await self._purge(topic)
                        else:
                            await self._upload(topic, partition, segment, epoch)
                        break
                    except FileNotFoundError:
                        assert segment is not None
                        log.warning(
                            "upload.segment_gone",
                            topic=topic,
                            partition=partition,
                            base_offset=segment.base_offset,
                        )
                        break
                    except (StorageError, OSError) as exc:
                        self.failures += 1
                        log.warning(
                            "upload.retry",
                            topic=topic,
                            partition=partition,
                            base_offset=segment.base_offset if segment is not None else None,
                            error=str(exc),
                            delay_s=delay,
                        )
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, self._retry_max)
            finally:
                self._busy = False
                if segment is not None:
                    self._queued.discard((topic, partition, segment.base_offset))

    async def _upload(self, topic: str, partition: int, segment: SealedSegment, epoch: int) -> None:
        if not self.may_upload(topic, partition):
            log.info(
                "upload.not_served", topic=topic, partition=partition, base=segment.base_offset
            )
            return
        name = ""
        if self.publisher is not None:
            named = await self.publisher.name(topic, partition, segment)
            if named is None:
                return
            name = named
        index_path = segment.path.with_suffix(".index")
        # one small read per sealed segment: asyncio's default executor, as the store's own work
        index = await asyncio.to_thread(_read_or_empty, index_path)
        unsized = UploadedSegment(segment.base_offset, segment.next_offset, 0, name)
        await self.store.put(unsized.key(topic, partition, ".index"), index)
        size = await self.store.put_file(unsized.key(topic, partition), segment.path)
        uploaded = dataclasses.replace(unsized, size=size)
        if epoch != self._epochs.get(topic, 0):
            return  # deleted while uploading: not recorded; the purge queued since removes it
        if self.publisher is not None:
            published = await self.publisher.publish(topic, partition, uploaded)
            if published is None:  # never named, so never read: not left behind either
                for suffix in (".log", ".index"):
                    await self.store.delete(uploaded.key(topic, partition, suffix))
                log.info(
                    "upload.not_published",
                    topic=topic,
                    partition=partition,
                    base_offset=segment.base_offset,
                )
                return
            uploaded = published
        self._state.write({key(UPLOAD, topic, partition, uploaded.start): uploaded.encode()})
        self._record(topic, partition, uploaded)
        log.info(
            "upload.done",
            topic=topic,
            partition=partition,
            base_offset=segment.base_offset,
            bytes=size,
        )

    async def drain(self, timeout: float) -> bool:
        """Wait until nothing is queued or uploading; False if `timeout` passed first."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.pending:
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    def replace(self, topic: str, partition: int, segments: list[UploadedSegment]) -> None:
        """The partition's segments are these (a cluster take-over, from the manifest): reads
        below the local log go to them, and to nothing else this broker recorded before."""
        self._uploaded.pop((topic, partition), None)
        self._state.delete_prefix(key(UPLOAD, topic, partition) + b"\0")
        for segment in segments:
            self._record(topic, partition, segment)
        if segments:
            self._state.write(
                {key(UPLOAD, topic, partition, s.start): s.encode() for s in segments}
            )

    def forget_topic(self, topic: str) -> None:
        """The topic was deleted: forget its uploads and remove its objects (in queue order)."""
        for ident in [k for k in self._uploaded if k[0] == topic]:
            del self._uploaded[ident]
        self._state.delete_prefix(key(UPLOAD, topic) + b"\0")
        epoch = self._epochs.get(topic, 0) + 1
        self._epochs[topic] = epoch
        if self.purges:
            self._queue.put_nowait((topic, -1, None, epoch))

    def purge(self, topic: str) -> None:
        """Remove the topic's objects (in queue order): a cluster's delete, by its one broker."""
        self._queue.put_nowait((topic, -1, None, self._epochs.get(topic, 0)))

    async def _purge(self, topic: str) -> None:
        # the topic's segments (exactly <topic>/<partition>/<name>: a topic named `snapshots`
        # must not take other topics' snapshots with it) and its compaction snapshots
        segments = [
            o
            for o in await self.store.list(f"{topic}/")
            if o.key.count("/") == 2  # (a cluster's tail goes by epoch: CloudTail.purge)
        ]
        objects = segments + await self.store.list(snapshot_prefix(topic))
        for found in objects:
            await self.store.delete(found.key)
        if objects:  # every create purges its name first, which usually finds nothing to say
            log.info("upload.topic_purged", topic=topic, objects=len(objects))

    async def close(self) -> None:
        await end_tasks(self._task)


def _read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""
