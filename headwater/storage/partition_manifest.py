"""A cluster partition's log in the object store, described in one place: its manifest.

Each uploaded segment of a partition is one object of a unique name (two owners may upload
segments starting at the same offset; neither may overwrite the other's). Which of them make up
the partition's history is said by the manifest alone:

    <topic>/<partition>/manifest/<version, 20 digits>     JSON: {"epoch": E, "segments": [...]}

each entry `{"first", "end", "base", "name", "size"}`: the object `<name>.log` (and `.index`),
whose first batch is at `base`, counts for the offsets [first, end). Entries are in offset order
and never overlap: a segment whose start lies below the manifest's end is named only from that
end on (`Manifest.adding`), so a reader never meets two objects for one offset, nor one nested in
another. A reader takes the highest version.

A segment holding several named entries entirely replaces them (`adding`); the objects the new
version no longer names are deleted after a grace period, so a reader of the previous version
(compaction) can still fetch them.

Versions are written with a conditional PUT (`put_if_absent`), each exactly once, and only by a
writer whose epoch (the ownership key's etcd revision, docs/CLUSTER.md) is at least the epoch of
the version it replaces. A new owner first *claims* the manifest, writing version n+1 with its
epoch; from then on a fenced owner, whose next write would be n+1 or later, finds a higher epoch
and gives up (`ManifestFenced`): it cannot name a segment, nor delete what a segment it named
would have let go, once its successor has read the manifest. What a segment holds is deleted
elsewhere (the cloud tail's chunks, `CloudTail.collect`) only below a manifest's end, after that
manifest is written; and a segment object only after a version no longer naming it is.

The two newest versions are kept (the older for a reader that listed it just before the newest
was written; a reader that finds its version gone lists again).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace

import structlog

from headwater.storage.objectstore import ObjectStore
from headwater.storage.tasks import spawn
from headwater.wire.errors import NotOwner, ObjectNotFound, StorageError

log = structlog.get_logger(__name__)

_ATTEMPTS = 20  # conditional writes lost to another writer before giving up (a live-lock bound)


class ManifestFenced(NotOwner):
    """A later owner's epoch wrote the partition's manifest: this owner may not change it."""


@dataclass(frozen=True, slots=True)
class SegmentEntry:
    first: int  # the first offset this entry counts for (the object may start lower)
    end: int  # exclusive
    base: int  # the object's first batch
    name: str  # the object key without `.log` / `.index`
    size: int  # bytes of the `.log` object


@dataclass(frozen=True, slots=True)
class Manifest:
    version: int  # -1: none written yet
    epoch: int
    segments: tuple[SegmentEntry, ...] = ()

    @property
    def end(self) -> int:
        """Where the segments end: the offsets below are read from them (0 without any)."""
        return self.segments[-1].end if self.segments else 0

    def adding(self, entry: SegmentEntry) -> Manifest:
        """This manifest with `entry` named from its end on; the entries the object holds
        entirely are replaced by it (a sealed segment replaces the folds of the tail it holds:
        fewer, larger objects). Unchanged when it adds nothing."""
        segments = self.segments
        if entry.base > self.end:
            raise StorageError(
                f"segment {entry.name} starts at {entry.base}, past the manifest's end {self.end}"
            )
        inside = [k for k, s in enumerate(segments) if s.first >= entry.base and s.end <= entry.end]
        if entry.end > self.end:
            # every entry from the first it holds on ends below it (the manifest's end is the
            # last entry's): they all go
            cut = inside[0] if inside else len(segments)
            first = segments[cut].first if inside else self.end
            named = replace(entry, first=first)
            return replace(self, segments=(*segments[:cut], named))
        if len(inside) < 2:
            return self  # held already, and replacing one object by another gains nothing
        i, j = inside[0], inside[-1]
        named = replace(entry, first=segments[i].first, end=segments[j].end)
        return replace(self, segments=(*segments[:i], named, *segments[j + 1 :]))

    def names(self) -> set[str]:
        return {s.name for s in self.segments}

    def encode(self) -> bytes:
        return json.dumps(
            {
                "epoch": self.epoch,
                "segments": [
                    {"first": s.first, "end": s.end, "base": s.base, "name": s.name, "size": s.size}
                    for s in self.segments
                ],
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, version: int, data: bytes) -> Manifest:
        try:
            found = json.loads(data)
            segments = tuple(
                SegmentEntry(
                    int(s["first"]), int(s["end"]), int(s["base"]), str(s["name"]), int(s["size"])
                )
                for s in found["segments"]
            )
            return cls(version, int(found["epoch"]), segments)
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"manifest version {version} is unreadable: {exc}") from None


def manifest_prefix(topic: str, partition: int) -> str:
    return f"{topic}/{partition}/manifest/"


class PartitionManifests:
    """Reads and writes partitions' manifests in one object store."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._deleting: set[asyncio.Task[None]] = set()

    async def latest(self, topic: str, partition: int) -> Manifest:
        """The highest version (version -1, epoch 0, no segments when there is none)."""
        prefix = manifest_prefix(topic, partition)
        for _ in range(_ATTEMPTS):
            versions = sorted(
                int(name)
                for info in await self.store.list(prefix)
                if (name := info.key[len(prefix) :]).isdigit()
            )
            if not versions:
                return Manifest(-1, 0)
            try:
                data = await self.store.get(f"{prefix}{versions[-1]:020d}")
            except ObjectNotFound:
                continue  # deleted as two newer ones were written meanwhile: list again
            return Manifest.decode(versions[-1], data)
        raise StorageError(f"the manifest of {topic}/{partition} keeps changing under its reader")

    async def claim(self, topic: str, partition: int, epoch: int, since: int = 0) -> Manifest:
        """Write a version with our epoch (a take-over), before the partition's tail is listed:
        any owner of an earlier epoch can no longer change the manifest. A manifest of an epoch
        below `since` is a deleted topic's of the same name: the claim starts empty."""
        return await self._change(topic, partition, epoch, None, since, None)

    async def add(
        self, topic: str, partition: int, epoch: int, entry: SegmentEntry, known: Manifest | None
    ) -> Manifest:
        """Name an uploaded segment; `known` is the version this owner wrote last (tried first,
        read again if another was written since). Raises `ManifestFenced` past our epoch."""
        return await self._change(topic, partition, epoch, entry, 0, known)

    async def _change(
        self,
        topic: str,
        partition: int,
        epoch: int,
        entry: SegmentEntry | None,
        since: int,
        known: Manifest | None,
    ) -> Manifest:
        prefix = manifest_prefix(topic, partition)
        current = known
        for _ in range(_ATTEMPTS):
            if current is None:
                current = await self.latest(topic, partition)
            if current.epoch > epoch:
                raise ManifestFenced(
                    f"the manifest of {topic}/{partition} is at epoch {current.epoch}, "
                    f"past ours ({epoch})"
                )
            base = current if current.epoch >= since else Manifest(current.version, epoch)
            following = replace(base, version=current.version + 1, epoch=epoch)
            if entry is not None:
                following = following.adding(entry)
                if following.segments == current.segments:
                    return current  # nothing new to name
            if await self.store.put_if_absent(
                f"{prefix}{following.version:020d}", following.encode()
            ):
                if following.version >= 2:  # not awaited: a take-over is waiting for the claim
                    spawn(
                        self._delete(f"{prefix}{following.version - 2:020d}"),
                        "manifest.delete_failed",
                        self._deleting,
                        topic=topic,
                        partition=partition,
                    )
                return following
            current = None  # another writer took that version: read it, check its epoch
        raise StorageError(f"the manifest of {topic}/{partition} keeps changing under its writer")

    async def _delete(self, key: str) -> None:
        try:
            await self.store.delete(key)
        except StorageError as exc:  # left behind: a reader takes the highest version anyway
            log.warning("manifest.delete_failed", key=key, error=str(exc))

    async def purge(self, topic: str, before: int) -> int:
        """Delete a deleted topic's manifests, those of epochs below `before` (a topic
        re-created under the name meanwhile keeps its own); returns how many went."""
        gone = 0
        for info in await self.store.list(f"{topic}/"):
            parts = info.key.split("/")
            if len(parts) != 4 or parts[2] != "manifest" or not parts[3].isdigit():
                continue
            try:
                data = await self.store.get(info.key)
            except ObjectNotFound:
                continue
            if Manifest.decode(int(parts[3]), data).epoch < before:
                await self.store.delete(info.key)
                gone += 1
        return gone
