"""The cloud tail: a partition's newest acknowledged batches as small objects, for a cluster.

In a cluster a reliable produce is acknowledged only once its batch is in the object store, so
that any broker can take the partition over (docs/CLUSTER.md). Whole segments are uploaded only
when they seal; until then the owner writes, every few milliseconds, one *chunk* per partition
holding the batches appended since the last one:

    <topic>/<partition>/tail/<first offset>-<end offset>-<epoch>.log   (each 20 digits)

(the stamped batches, back to back). The epoch is the ownership key's etcd revision, which grows
at every change of owner. A broker that takes a partition over writes a marker first,

    <topic>/<partition>/tail/epoch-<epoch, 20 digits>-<start offset, 20 digits>

naming the offset its epoch starts at (the end of the chain it found), so that a listing alone
gives every epoch's start (markers written before the start was in the name hold it instead). A
chunk counts only when it lies inside its epoch's range, [its marker's offset, the next epoch's
marker's offset): a chunk an old owner put after it was fenced (its PUT was in flight when its
lease ran out; it never acknowledged it) starts at or past the next marker and is ignored, so an
offset is never given to two messages even then. `resolve` applies that rule and gives the valid
chain's chunks above the partition manifest's end (storage/partition_manifest.py: everything
below is in the segments it names): a new owner reads them in place, starts its local WAL at the
chain's end, and folds them into one segment object (`fold`) in the background.

Chunks are deleted only below the end of a manifest already written (`collect`): never one a
reader of the newest manifest still needs. The newest chunk always stays, so the end of the log
is known from a listing alone. Readers take chunks in place through the archive
(`storage.archive`), which checks every batch as every reader of the log does
(`storage.log_reader`): a damaged batch no intact copy holds is skipped visibly.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from headwater.storage.objectstore import ObjectStore
from headwater.storage.segments import BatchLocation, build_index, check_stored

_CHUNK = re.compile(r"^(\d{20})-(\d{20})-(\d{20})\.log$")
_MARKER = re.compile(r"^epoch-(\d{20})(?:-(\d{20}))?$")
_LENGTH = struct.Struct(">i")


@dataclass(frozen=True, slots=True, order=True)
class Chunk:
    first: int
    end: int
    epoch: int
    # a slice of a broker's shared tail object (cluster `tail_layout = "broker"`,
    # server/cluster/shared_tail.py): that object's key and where the slice lies in it; ""
    # for a chunk that is an object of its own (`name`)
    shared: str = field(default="", compare=False)
    position: int = field(default=0, compare=False)
    length: int = field(default=0, compare=False)

    def name(self, topic: str, partition: int) -> str:
        prefix = tail_prefix(topic, partition)
        return f"{prefix}{self.first:020d}-{self.end:020d}-{self.epoch:020d}.log"

    def key(self, topic: str, partition: int) -> str:
        """The object holding the chunk's bytes (from `position` on, when shared)."""
        return self.shared or self.name(topic, partition)


@dataclass(frozen=True, slots=True)
class TailState:
    """What a listing of one partition's tail shows."""

    chunks: list[Chunk]
    markers: dict[int, int]  # epoch -> the offset it starts at
    sizes: dict[Chunk, int] = field(default_factory=dict)  # bytes of each chunk's object

    def since(self, epoch: int) -> TailState:
        """Only what epochs from `epoch` on wrote: a topic deleted and re-created under the same
        name shares the prefix, and its incarnation's epochs are all larger than the old ones."""
        return TailState(
            [c for c in self.chunks if c.epoch >= epoch],
            {e: start for e, start in self.markers.items() if e >= epoch},
            self.sizes,
        )

    def resolve(self, floor: int = 0) -> tuple[int, list[Chunk]]:
        """(the end of the valid chain, the chunks of its last contiguous run ending above
        `floor` (the manifest's end), in order). The run starts at or below `floor` unless
        chunks the chain needs are missing."""
        epochs = sorted(self.markers)
        valid: list[Chunk] = []
        for chunk in self.chunks:
            start = self.markers.get(chunk.epoch)
            if start is None:
                continue  # no marker: written by an owner that never wrote one (cannot happen)
            later = [self.markers[e] for e in epochs if e > chunk.epoch]
            limit = min(later) if later else None
            if chunk.first < start or (limit is not None and chunk.end > limit):
                continue
            valid.append(chunk)
        valid.sort()
        # the chain ends at its newest valid chunk, its newest epoch's start, or the segments'
        # end, whichever is furthest (chunks below the segments' end may all be collected)
        end = max(
            max((c.end for c in valid), default=0), max(self.markers.values(), default=0), floor
        )
        run: list[Chunk] = []
        for chunk in valid:
            if chunk.end <= floor:
                continue  # held by the manifest's segments
            if run and chunk.first == run[-1].end:
                run.append(chunk)
            elif not run or chunk.first > run[-1].end:
                run = [chunk]  # a gap: the caller finds the run starting above `floor`
            # (an overlapping chunk of a later epoch cannot be valid; one of an older epoch was
            # replaced by a re-upload at the same offsets: keep the first)
        return end, run


def tail_prefix(topic: str, partition: int) -> str:
    return f"{topic}/{partition}/tail/"


def split_batches(data: bytes) -> list[bytes]:
    """The stamped batches a chunk holds, back to back (length at bytes 8..12 of each)."""
    batches = []
    position = 0
    while position + 12 <= len(data):
        size = _LENGTH.unpack_from(data, position + 8)[0] + 12
        if size < 12 or position + size > len(data):
            raise ValueError(f"chunk cut at byte {position}")
        batches.append(data[position : position + size])
        position += size
    if position != len(data):
        raise ValueError(f"chunk cut at byte {position}")
    return batches


class CloudTail:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    async def prepare(self, topic: str, partition: int, epoch: int) -> None:
        """A take-over is about to read the tail: nothing to do here (the epoch's marker, once
        the chain's end is known, fences earlier owners); the shared tail fences them now."""

    async def state(self, topic: str, partition: int) -> TailState:
        prefix = tail_prefix(topic, partition)
        chunks: list[Chunk] = []
        sizes: dict[Chunk, int] = {}
        markers: dict[int, int] = {}
        unnamed: list[tuple[int, str]] = []
        for info in await self.store.list(prefix):
            name = info.key[len(prefix) :]
            if match := _CHUNK.match(name):
                first, end, epoch = (int(g) for g in match.groups())
                chunk = Chunk(first, end, epoch)
                chunks.append(chunk)
                sizes[chunk] = info.size
            elif match := _MARKER.match(name):
                if match.group(2) is None:
                    unnamed.append((int(match.group(1)), info.key))
                else:
                    markers[int(match.group(1))] = int(match.group(2))
        for epoch, object_key in unnamed:
            markers[epoch] = int((await self.store.get(object_key)).decode())
        return TailState(sorted(chunks), markers, sizes)

    async def mark_epoch(
        self, topic: str, partition: int, epoch: int, start: int, listed: TailState | None = None
    ) -> None:
        """Record where `epoch` starts; refuses to move an existing marker (a second take-over
        with the same epoch must find the same start). `listed`: a listing of the tail the
        caller just made (only the epoch's owner writes its marker), spares listing again."""
        prefix = f"{tail_prefix(topic, partition)}epoch-{epoch:020d}"
        if listed is not None:
            existing = listed.markers.get(epoch)
            if existing is not None and existing != start:
                raise ValueError(
                    f"epoch {epoch} of {topic}/{partition} starts at {existing}, not {start}"
                )
            if existing is None:
                await self.store.put_if_absent(f"{prefix}-{start:020d}", b"")
            return
        for info in await self.store.list(prefix):
            match = _MARKER.match(info.key[len(tail_prefix(topic, partition)) :])
            if match is None:
                continue
            named = match.group(2)
            if named is None:
                named = (await self.store.get(info.key)).decode()
            if int(named) != start:
                raise ValueError(
                    f"epoch {epoch} of {topic}/{partition} starts at {int(named)}, not {start}"
                )
        await self.store.put_if_absent(f"{prefix}-{start:020d}", b"")

    async def put(self, topic: str, partition: int, chunk: Chunk, data: bytes) -> None:
        await self.store.put(chunk.name(topic, partition), data)

    async def read(self, topic: str, partition: int, chunk: Chunk) -> list[bytes]:
        return split_batches(await self.store.get(chunk.name(topic, partition)))

    async def purge(self, topic: str, before: int) -> int:
        """Delete a deleted topic's chunks and markers: those of epochs below `before` (the
        delete's etcd revision), so that a topic re-created under the name meanwhile keeps its
        own; returns how many went."""
        gone = 0
        for info in await self.store.list(f"{topic}/"):
            parts = info.key.split("/")
            if len(parts) != 4 or parts[2] != "tail":
                continue
            if (match := _CHUNK.match(parts[3])) is not None:
                epoch = int(match.group(3))
            elif (match := _MARKER.match(parts[3])) is not None:
                epoch = int(match.group(1))
            else:
                continue
            if epoch < before:
                await self.store.delete(info.key)
                gone += 1
        return gone

    async def collect(self, topic: str, partition: int, below: int) -> int:
        """Delete the chunks that end at or below `below`, the end of a manifest written already
        (its segments hold those offsets, or the chunk is not valid there), except the newest
        chunk of the partition; returns how many went."""
        state = await self.state(topic, partition)
        if not state.chunks:
            return 0
        newest = max(state.chunks, key=lambda c: (c.end, c.epoch))
        gone = 0
        for chunk in state.chunks:
            if chunk != newest and chunk.end <= below:
                await self.store.delete(chunk.name(topic, partition))
                gone += 1
        return gone


def fold(batches: list[bytes]) -> tuple[bytes, bytes]:
    """One segment object, and its sparse index object, holding `batches` (stamped, in offset
    order): what a run of chunks becomes when it is folded."""
    locations = []
    position = 0
    for batch in batches:
        info = check_stored(batch)
        locations.append(
            BatchLocation(
                info.base_offset,
                info.base_offset + info.record_count,
                position,
                len(batch),
                info.max_timestamp,
            )
        )
        position += len(batch)
    return b"".join(batches), build_index(locations).encode()
