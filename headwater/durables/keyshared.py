"""Key_Shared: which consumer owns a key (a hash ring), and which keys must wait (per-key holds).

`HashRing` places each consumer at `VIRTUAL_NODES` points of a 64-bit ring; a key belongs to the
consumer at the first point at or after the key's hash (wrapping). A point is the hash of the
consumer's name and the point's number, so a consumer that reconnects under the same name gets the
same keys back, and a join or a leave moves only the keys between the moved points and their
neighbours (about 1/n of them), never keys between two consumers that stayed. Consumers sharing a
name are told apart by their consumer id. Records without a key have no order to keep: they are
spread by their offset's hash, which is even over the consumers.

`KeyHolds` keeps per-key order across reassignment on reliable topics. Every delivered, unacked
record of a Key_Shared subscription is held by the consumer it went to, or by nobody (holder -1)
while it waits for redelivery (a nack, an ack timeout, or its consumer left). A record may go to
consumer C only if no other holder has a record of the same key: a key moved to C waits until
the old consumer acked what it held of that key (or left, its records then waiting for
redelivery, which goes first, to C). Keys are tracked by their 64-bit hash: a collision only makes
one key wait for another.

Pure state, no I/O: the server's pumps call these.
"""

from __future__ import annotations

import bisect
import hashlib
import struct
from typing import Final

VIRTUAL_NODES: Final = 64  # points per consumer: enough for an even spread with a few consumers
DUE: Final = -1  # holder of a record waiting for redelivery

_U64 = struct.Struct(">Q")


def key_hash(key: bytes) -> int:
    """A key's place on the ring (the first 8 bytes of its BLAKE2b digest, big-endian)."""
    return int(_U64.unpack(hashlib.blake2b(key, digest_size=8).digest())[0])


def keyless_hash(partition: int, offset: int) -> int:
    return key_hash(b"\0offset:%d:%d" % (partition, offset))


class HashRing:
    def __init__(self) -> None:
        self._points: list[int] = []
        self._owners: list[int] = []  # consumer id at each point, parallel to _points
        self._members: dict[int, str] = {}  # consumer id -> the label its points derive from

    def __len__(self) -> int:
        return len(self._members)

    def add(self, consumer_id: int, name: str) -> None:
        label = name
        if label in self._members.values():
            label = f"{name}\0{consumer_id}"  # same name: its own points, still deterministic
        self._members[consumer_id] = label
        for i in range(VIRTUAL_NODES):
            point = key_hash(f"{label}\0{i}".encode())
            at = bisect.bisect_left(self._points, point)
            self._points.insert(at, point)
            self._owners.insert(at, consumer_id)

    def remove(self, consumer_id: int) -> None:
        if self._members.pop(consumer_id, None) is None:
            return
        kept = [(p, o) for p, o in zip(self._points, self._owners, strict=True) if o != consumer_id]
        self._points = [p for p, _ in kept]
        self._owners = [o for _, o in kept]

    def owner(self, hashed: int) -> int | None:
        """The consumer id owning a key hash (None: no consumer)."""
        if not self._points:
            return None
        at = bisect.bisect_left(self._points, hashed)
        return self._owners[at if at < len(self._points) else 0]


class KeyHolds:
    def __init__(self) -> None:
        self._records: dict[tuple[int, int], tuple[int, int]] = {}  # (p, o) -> (hash, holder)
        self._keys: dict[int, dict[int, int]] = {}  # hash -> holder -> records held

    def __len__(self) -> int:
        return len(self._records)

    def hold(self, partition: int, offset: int, hashed: int, holder: int) -> None:
        self.release(partition, offset)
        self._records[(partition, offset)] = (hashed, holder)
        holders = self._keys.setdefault(hashed, {})
        holders[holder] = holders.get(holder, 0) + 1

    def returned(self, partition: int, offset: int) -> None:
        """The record's consumer no longer has it; it waits for redelivery."""
        found = self._records.get((partition, offset))
        if found is not None and found[1] != DUE:
            self.hold(partition, offset, found[0], DUE)

    def returned_all(self, consumer_id: int) -> None:
        """The consumer left: everything it held waits for redelivery."""
        for (partition, offset), (_, holder) in list(self._records.items()):
            if holder == consumer_id:
                self.returned(partition, offset)

    def release(self, partition: int, offset: int) -> None:
        """Acked (or dead-lettered, or unreadable): nothing holds it any more."""
        found = self._records.pop((partition, offset), None)
        if found is None:
            return
        hashed, holder = found
        holders = self._keys[hashed]
        holders[holder] -= 1
        if not holders[holder]:
            del holders[holder]
            if not holders:
                del self._keys[hashed]

    def release_range(self, partition: int, first: int, end: int) -> None:
        """`release` of every offset in [first, end) of `partition`, in min(end - first, held)
        steps: an acked range's length is the client's to choose (up to 10,000 offsets a
        request), what is held is bounded by what was dispatched."""
        if end - first <= len(self._records):
            for offset in range(first, end):
                self.release(partition, offset)
            return
        for held_partition, offset in [
            key for key in self._records if key[0] == partition and first <= key[1] < end
        ]:
            self.release(held_partition, offset)

    def clear(self) -> None:
        self._records.clear()
        self._keys.clear()

    def hash_of(self, partition: int, offset: int) -> int | None:
        found = self._records.get((partition, offset))
        return None if found is None else found[0]

    def blocked(self, hashed: int, consumer_id: int, redelivery: bool = False) -> bool:
        """Whether a record of key `hashed` must not go to `consumer_id` now: another consumer
        holds some of the key, or (for a new record) some of the key waits for redelivery."""
        holders = self._keys.get(hashed)
        if not holders:
            return False
        for holder in holders:
            if holder == consumer_id:
                continue
            if holder == DUE and redelivery:
                continue
            return True
        return False
