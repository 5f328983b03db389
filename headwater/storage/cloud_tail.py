"""The cloud tail: a partition's newest acknowledged batches as small objects, for a cluster.

In a cluster a reliable produce is acknowledged only once its batch is in the object store, so
that any broker can take the partition over (docs/CLUSTER.md). Whole segments are uploaded only
when they seal; until then the owner writes, every few milliseconds, one *chunk* per partition
holding the batches appended since the last one:

    <topic>/<partition>/tail/<first offset>-<end offset>-<epoch>.log   (each 20 digits)

(the stamped batches, back to back). The epoch is the ownership key's etcd revision, which grows
at every change of owner. A broker that takes a partition over writes a marker first,

    <topic>/<partition>/tail/epoch-<epoch, 20 digits>

holding the offset its epoch starts at (the end of the chain it found). A chunk counts only when
it lies inside its epoch's range, [its marker's offset, the next epoch's marker's offset): a chunk
an old owner put after it was fenced (its PUT was in flight when its lease ran out; it never
acknowledged it) starts at or past the next marker and is ignored, so an offset is never given to
two messages even then. `resolve` applies that rule and gives the valid chain's last contiguous
run, which is what a new owner rebuilds its local WAL from; everything below the run's start is
in uploaded segments.

Chunks are deleted once a segment the owner uploaded holds them entirely (`collectable`); the
newest chunk always stays, so the end of the log is known from a listing alone.

A take-over reads its run with `read_run`, which checks every batch (CRC) as every reader of the
log does (`storage.log_reader`): a damaged batch is taken from an uploaded segment object that
holds the very same batch (same offsets and same CRC field: a segment of a fenced owner may hold
other messages at those offsets), else its offsets come back as a `Hole` for the caller to skip
visibly, and the chain's offsets never move.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from headwater.storage.objectstore import ObjectStore
from headwater.storage.segments import walk_batches
from headwater.wire.errors import ObjectNotFound

_CHUNK = re.compile(r"^(\d{20})-(\d{20})-(\d{20})\.log$")
_MARKER = re.compile(r"^epoch-(\d{20})$")
_LENGTH = struct.Struct(">i")
_CRC = struct.Struct(">I")
_CRC_POSITION = 17  # baseOffset, batchLength, partitionLeaderEpoch, magic; then the CRC-32C


@dataclass(frozen=True, slots=True, order=True)
class Chunk:
    first: int
    end: int
    epoch: int

    def name(self, topic: str, partition: int) -> str:
        prefix = tail_prefix(topic, partition)
        return f"{prefix}{self.first:020d}-{self.end:020d}-{self.epoch:020d}.log"


@dataclass(frozen=True, slots=True)
class TailState:
    """What a listing of one partition's tail shows."""

    chunks: list[Chunk]
    markers: dict[int, int]  # epoch -> the offset it starts at

    def since(self, epoch: int) -> TailState:
        """Only what epochs from `epoch` on wrote: a topic deleted and re-created under the same
        name shares the prefix, and its incarnation's epochs are all larger than the old ones."""
        return TailState(
            [c for c in self.chunks if c.epoch >= epoch],
            {e: start for e, start in self.markers.items() if e >= epoch},
        )

    def resolve(self) -> tuple[int, list[Chunk]]:
        """(the end of the valid chain, the chunks of its last contiguous run, in order)."""
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
        run: list[Chunk] = []
        for chunk in valid:
            if run and chunk.first == run[-1].end:
                run.append(chunk)
            elif not run or chunk.first > run[-1].end:
                run = [chunk]  # a gap: everything below is in segments
            # (an overlapping chunk of a later epoch cannot be valid; one of an older epoch was
            # replaced by a re-upload at the same offsets: keep the first)
        if not run:
            end = max(self.markers.values(), default=0)
            return end, []
        return max(run[-1].end, max(self.markers.values(), default=0)), run


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


@dataclass(frozen=True, slots=True)
class Hole:
    """Offsets [first, end) of a run that no intact copy holds (`reason` says what was wrong)."""

    first: int
    end: int
    reason: str


class CloudTail:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    async def state(self, topic: str, partition: int) -> TailState:
        prefix = tail_prefix(topic, partition)
        chunks: list[Chunk] = []
        markers: dict[int, int] = {}
        marker_names: list[tuple[int, str]] = []
        for info in await self.store.list(prefix):
            name = info.key[len(prefix) :]
            if match := _CHUNK.match(name):
                chunks.append(Chunk(*(int(g) for g in match.groups())))
            elif match := _MARKER.match(name):
                marker_names.append((int(match.group(1)), info.key))
        for epoch, object_key in marker_names:
            markers[epoch] = int((await self.store.get(object_key)).decode())
        return TailState(sorted(chunks), markers)

    async def mark_epoch(self, topic: str, partition: int, epoch: int, start: int) -> None:
        """Record where `epoch` starts; refuses to move an existing marker (a second take-over
        with the same epoch must find the same start)."""
        object_key = f"{tail_prefix(topic, partition)}epoch-{epoch:020d}"
        if not await self.store.put_if_absent(object_key, str(start).encode()):
            existing = int((await self.store.get(object_key)).decode())
            if existing != start:
                raise ValueError(
                    f"epoch {epoch} of {topic}/{partition} starts at {existing}, not {start}"
                )

    async def put(self, topic: str, partition: int, chunk: Chunk, data: bytes) -> None:
        await self.store.put(chunk.name(topic, partition), data)

    async def read(self, topic: str, partition: int, chunk: Chunk) -> list[bytes]:
        return split_batches(await self.store.get(chunk.name(topic, partition)))

    async def read_run(self, topic: str, partition: int, run: list[Chunk]) -> list[bytes | Hole]:
        """The batches of `run`'s chunks in offset order, each checked; offsets no intact copy
        holds come back as `Hole`s, in their place (see the module docstring)."""
        found: list[bytes | Hole] = []
        for chunk in run:
            data = await self.store.get(chunk.name(topic, partition))
            expected = chunk.first
            damaged: list[bytes] = []  # what is left of damaged batches, for their CRC fields
            for step in walk_batches(data, chunk.first):
                piece = data[step.position : step.position + step.length]
                if step.batch is None:
                    damaged.append(piece)
                    continue
                if step.batch.base_offset > expected:
                    found.extend(
                        await self._repair(
                            topic, partition, expected, step.batch.base_offset, damaged
                        )
                    )
                found.append(piece)
                expected = step.batch.next_offset
                damaged = []
            if expected < chunk.end:
                found.extend(await self._repair(topic, partition, expected, chunk.end, damaged))
        return found

    async def _repair(
        self, topic: str, partition: int, first: int, end: int, damaged: list[bytes]
    ) -> list[bytes | Hole]:
        """Offsets [first, end) of a chunk are damaged: the same batches from the uploaded
        segment holding them, where its batch has the damaged one's CRC field; else a Hole."""
        wanted = {
            _CRC.unpack_from(piece, _CRC_POSITION)[0]
            for piece in damaged
            if len(piece) >= _CRC_POSITION + _CRC.size
        }
        copy: list[bytes] = []
        position = first
        data = await self._segment_holding(topic, partition, first)
        if data is not None:
            for step in walk_batches(data):
                batch = step.batch
                if batch is None or batch.base_offset < position or batch.next_offset > end:
                    continue
                crc = _CRC.unpack_from(data, step.position + _CRC_POSITION)[0]
                if batch.base_offset != position or crc not in wanted:
                    break
                copy.append(data[step.position : step.position + step.length])
                position = batch.next_offset
        if position < end:
            return [*copy, Hole(position, end, "damaged batch in the cloud tail, no intact copy")]
        return list(copy)

    async def _segment_holding(self, topic: str, partition: int, offset: int) -> bytes | None:
        """The uploaded segment object whose base is the greatest at or below `offset`."""
        prefix = f"{topic}/{partition}/"
        bases = sorted(
            int(o.key[len(prefix) : -len(".log")])
            for o in await self.store.list(prefix)
            if o.key.endswith(".log")
            and o.key.count("/") == 2
            and o.key[len(prefix) : -4].isdigit()
        )
        below = [b for b in bases if b <= offset]
        if not below:
            return None
        try:
            return await self.store.get(f"{prefix}{below[-1]:020d}.log")
        except ObjectNotFound:
            return None

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

    async def collect(
        self, topic: str, partition: int, base: int, end: int, epoch: int | None = None
    ) -> int:
        """Delete the chunks an uploaded segment [base, end) holds entirely, except the newest
        chunk of the partition; returns how many went. Only chunks of epochs up to `epoch` (the
        uploader's, when given): at those offsets a later owner's chunks hold other messages
        than a segment of a log that went on past the chain (appended, never stored, never
        acknowledged) and was uploaded as the partition moved."""
        state = await self.state(topic, partition)
        if not state.chunks:
            return 0
        newest = max(state.chunks, key=lambda c: (c.end, c.epoch))
        gone = 0
        for chunk in state.chunks:
            if epoch is not None and chunk.epoch > epoch:
                continue
            if chunk != newest and base <= chunk.first and chunk.end <= end:
                await self.store.delete(chunk.name(topic, partition))
                gone += 1
        return gone
