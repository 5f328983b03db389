"""The cloud tail with one object per broker per commit window, indexed in etcd (`tail_layout =
"broker"`, issue 21 item 2; docs/DECISIONS.md "Object-store batching per broker").

The broker's committer (`shared_commit.SharedCommitter`) writes every window's batches of all its
partitions as one object, `shared/<broker id>/<ms since the epoch>-<sequence>-<random>.log`, each
partition's batches a contiguous *slice* of it. Which slice holds which offsets of which
partition is said by etcd alone:

    <prefix>/tail/<topic>/<partition>/<first, 20 digits>
        {"object": key, "position": p, "length": n, "end": e, "epoch": E}

written by one transaction per window (`commit`) that compares, for every partition in it, the
partition's claim key `<prefix>/tail-claims/<topic>/<partition>` with the token the broker wrote
there when it took the partition over (`prepare`, itself a transaction comparing the ownership
key's create_revision with our epoch). A new owner writes its token before it reads the index,
so every entry an earlier owner (or this broker before a loss, same epoch) committed is in its
read, and none can be committed after it: that compare is the fence the epoch markers are in the
per-partition layout. The index is read as a `TailState` whose chunks carry their slice, so the
take-over, the reads in place, the folds and the producer-table rebuild work as with per-partition
chunks (`storage.cloud_tail`); the markers are made up from the entries (an epoch starts at its
first entry), and every entry is valid by construction.

Entries go below the end of a manifest already written (`collect`, as chunks do) and with their
topic (`purge`). A shared object goes (`collect_objects`, every broker, once a minute) only once it
is older than `RETIRE_AFTER` and no entry named it in two passes in a row: the committer never
commits an entry for an object older than `REPUT_AFTER` (it writes the bytes again under a new
name first), and a reader of a just-folded slice keeps finding it meanwhile.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from headwater.server.cluster.layout import Layout
from headwater.storage.cloud_tail import Chunk, CloudTail, TailState, split_batches
from headwater.storage.objectstore import ObjectStore
from headwater.wire.errors import NotOwner, StorageError

log = structlog.get_logger(__name__)

SHARED_PREFIX = "shared/"
RETIRE_AFTER = 600.0  # seconds a shared object lives at least, named or not
REPUT_AFTER = 300.0  # an entry is never committed for an object older than this
# etcd refuses a transaction of more than 128 operations per branch by default (--max-txn-ops)
TXN_OPS = 100

EtcdCall = Callable[[Callable[[Any], Awaitable[Any]]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Slice:
    """One partition's batches in a window's object, to be named in the index."""

    topic: str
    partition: int
    token: bytes  # the claim token the entry is committed under
    chunk: Chunk  # first, end, epoch, and where it lies in the object


def shared_name(broker_id: str, sequence: int) -> str:
    """A new object's key: unique (a broker restarted under the same id restarts its sequence)
    and dated, so its age is known from a listing alone."""
    now = int(time.time() * 1000)
    return f"{SHARED_PREFIX}{broker_id}/{now:015d}-{sequence:012d}-{uuid.uuid4().hex[:8]}.log"


def _age(key: str, now: float) -> float | None:
    """Seconds since the object named `key` was written (None: not a shared object's name)."""
    stamp = key.rsplit("/", 1)[-1].split("-", 1)[0]
    return now - int(stamp) / 1000 if stamp.isdigit() else None


class SharedTail(CloudTail):
    def __init__(self, store: ObjectStore, call: EtcdCall, layout: Layout) -> None:
        super().__init__(store)
        self._call = call
        self._layout = layout
        self._tokens: dict[tuple[str, int], bytes] = {}
        self._unnamed: set[str] = set()  # shared objects no entry named at the last pass
        self.collected = 0

    def token(self, topic: str, partition: int) -> bytes | None:
        return self._tokens.get((topic, partition))

    async def prepare(self, topic: str, partition: int, epoch: int) -> None:
        """Write a new claim token for the partition, if the ownership key is still ours under
        `epoch`: from now on no entry is committed under an earlier token (an earlier owner's,
        or ours from before a loss)."""
        token = f"{epoch}-{uuid.uuid4().hex}".encode()
        owner = self._layout.owner(topic, partition)
        claim = self._layout.tail_claim(topic, partition)
        won, _ = await self._call(
            lambda c: c.transaction(
                compare=[c.transactions.create(owner) == epoch],
                success=[c.transactions.put(claim, token)],
                failure=[],
            )
        )
        if not won:
            raise NotOwner(f"{topic}/{partition} is no longer ours under epoch {epoch}")
        self._tokens[topic, partition] = token

    async def commit(self, slices: list[Slice]) -> set[tuple[str, int]]:
        """Name the slices in the index, each only while its partition's claim holds its token;
        returns the partitions whose claim had changed (their slices were not named). Sent again
        unchanged after an unknown outcome, it names the same entries (puts are idempotent)."""
        lost: set[tuple[str, int]] = set()
        for start in range(0, len(slices), TXN_OPS):
            part = slices[start : start + TXN_OPS]
            for _ in range(len(part) + 1):  # each failed round drops at least one partition
                if not part or await self._named(part):
                    break
                moved = await self._moved(part)
                lost |= moved
                part = [s for s in part if (s.topic, s.partition) not in moved]
            else:
                raise StorageError("the shared tail's index transaction keeps failing")
        return lost

    async def _named(self, part: list[Slice]) -> bool:
        layout = self._layout

        async def transaction(c: Any) -> Any:
            return await c.transaction(
                compare=[
                    c.transactions.value(layout.tail_claim(s.topic, s.partition)) == s.token
                    for s in part
                ],
                success=[
                    c.transactions.put(
                        layout.tail_entry(s.topic, s.partition, s.chunk.first), _entry(s.chunk)
                    )
                    for s in part
                ],
                failure=[],
            )

        won, _ = await self._call(transaction)
        return bool(won)

    async def _moved(self, part: list[Slice]) -> set[tuple[str, int]]:
        """The partitions of `part` whose claim no longer holds the slice's token."""
        moved = set()
        for piece in part:
            key = self._layout.tail_claim(piece.topic, piece.partition)

            async def get(c: Any, key: bytes = key) -> Any:
                return await c.get(key)

            found = await self._call(get)
            if found is None or bytes(found.value) != piece.token:
                moved.add((piece.topic, piece.partition))
        return moved

    async def state(self, topic: str, partition: int) -> TailState:
        found = await self._call(lambda c: c.get_prefix(self._layout.tail_of(topic, partition)))
        chunks = sorted(_chunk(bytes(kv.value)) for kv in found)
        markers: dict[int, int] = {}
        for chunk in chunks:
            markers[chunk.epoch] = min(markers.get(chunk.epoch, chunk.first), chunk.first)
        return TailState(chunks, markers, {c: c.length for c in chunks})

    async def mark_epoch(
        self, topic: str, partition: int, epoch: int, start: int, listed: TailState | None = None
    ) -> None:
        """Nothing to write: `prepare` fenced the earlier owners already."""

    async def read(self, topic: str, partition: int, chunk: Chunk) -> list[bytes]:
        return split_batches(
            await self.store.get(chunk.shared, chunk.position, chunk.position + chunk.length)
        )

    async def collect(self, topic: str, partition: int, below: int) -> int:
        """Delete the entries that end at or below `below`, the end of a manifest written
        already, except the newest (the end of the log stays known from the index alone)."""
        state = await self.state(topic, partition)
        if not state.chunks:
            return 0
        newest = max(state.chunks, key=lambda c: (c.end, c.epoch))
        keys = [
            self._layout.tail_entry(topic, partition, c.first)
            for c in state.chunks
            if c != newest and c.end <= below
        ]
        await self._delete(keys)
        return len(keys)

    async def purge(self, topic: str, before: int) -> int:
        """Delete a deleted topic's entries and claims: those of epochs below `before`."""
        found = await self._call(lambda c: c.get_prefix(self._layout.tail_of(topic)))
        keys = [bytes(kv.key) for kv in found if _chunk(bytes(kv.value)).epoch < before]
        claims = await self._call(
            lambda c: c.get_prefix(self._layout.root("tail-claims") + f"{topic}/".encode())
        )
        for kv in claims:
            epoch = bytes(kv.value).split(b"-", 1)[0]
            if epoch.isdigit() and int(epoch) < before:
                keys.append(bytes(kv.key))
        await self._delete(keys)
        return len(keys)

    async def _delete(self, keys: list[bytes]) -> None:
        for start in range(0, len(keys), TXN_OPS):
            part = keys[start : start + TXN_OPS]

            async def transaction(c: Any, part: list[bytes] = part) -> Any:
                return await c.transaction(
                    compare=[], success=[c.transactions.delete(k) for k in part], failure=[]
                )

            await self._call(transaction)

    async def collect_objects(self) -> int:
        """Delete the shared objects older than `RETIRE_AFTER` that no entry named at this pass
        nor at the previous one; returns how many went."""
        now = time.time()
        old = {
            info.key
            for info in await self.store.list(SHARED_PREFIX)
            if (age := _age(info.key, now)) is not None and age > RETIRE_AFTER
        }
        if not old:
            self._unnamed = set()
            return 0
        found = await self._call(lambda c: c.get_prefix(self._layout.root("tail")))
        named = {_chunk(bytes(kv.value)).shared for kv in found}
        unnamed = old - named
        gone = unnamed & self._unnamed
        for key in sorted(gone):
            await self.store.delete(key)
        self._unnamed = unnamed - gone
        self.collected += len(gone)
        if gone:
            log.info("cluster.shared_objects_collected", objects=len(gone))
        return len(gone)


def _entry(chunk: Chunk) -> bytes:
    return json.dumps(
        {
            "object": chunk.shared,
            "position": chunk.position,
            "length": chunk.length,
            "end": chunk.end,
            "epoch": chunk.epoch,
            "first": chunk.first,
        },
        separators=(",", ":"),
    ).encode()


def _chunk(value: bytes) -> Chunk:
    found = json.loads(value)
    return Chunk(
        int(found["first"]),
        int(found["end"]),
        int(found["epoch"]),
        shared=str(found["object"]),
        position=int(found["position"]),
        length=int(found["length"]),
    )
