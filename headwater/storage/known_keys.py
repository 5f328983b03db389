"""State keys known to exist, so that the last-value key count skips their RocksDB lookup.

The key count beside a topic's last values (`lastvalue_store`) must know, for every key a batch
sets, whether the key existed before: a new key adds one, an overwrite adds nothing. Asking
RocksDB costs about half a microsecond a key, as much as writing it. `KnownKeys` remembers keys
that were written (and not deleted since), so a key set again is known to exist without a
lookup; a key it does not hold is looked up as before. It may forget any key at any time (that
only costs a lookup), but must never hold a key that is absent: keys are added only after the
WriteBatch that put them was written, and removed before or with any write that deletes them
(`clear` when a caller removes keys it does not name one by one).

It is bounded by bytes, with two generations: keys are added to the young set, and when that
holds `generation_bytes` (charged per key as its length plus the cost of a set entry and a bytes
object) the young set becomes the old one and the old one is dropped. A key found in the old
set is known too, and is added to the young set again by its next write, so keys written at
least once per generation stay known, whatever their number elsewhere. Nothing survives a
restart: after one, the first write of each key looks it up.

One instance per state store, shared by every topic, so the bound holds for the server however
many topics it has.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

# What one more key costs in a set beyond its bytes: the bytes object's header (33 bytes, with
# the allocator's rounding up to 40) and its share of the set's table (16-byte slots; a set of
# more than 50,000 entries doubles when 60% full, so at least 30% full: at most 53 bytes each).
# Measured with tracemalloc: 85 bytes beyond a 24-byte key at worst (160,000 keys).
ENTRY_OVERHEAD = 100
# Per generation: 16 MiB holds about 130,000 keys of 24 bytes; two generations at most.
GENERATION_BYTES = 16 << 20


class KnownKeys:
    def __init__(self, generation_bytes: int = GENERATION_BYTES) -> None:
        self._young: set[bytes] = set()
        self._old: set[bytes] = set()
        self._charged = 0  # bytes charged to the young generation
        self._generation_bytes = generation_bytes

    def unknown(self, keys: Collection[bytes]) -> set[bytes]:
        """Those of `keys` not known to exist (set differences: no Python loop per key)."""
        # `small - big` walks the small set; `small -= big` would walk the big one
        missing = set(keys) - self._young
        if missing and self._old:
            missing = missing - self._old
        return missing

    def add(self, keys: Collection[bytes]) -> None:
        """`keys` were written (call once their WriteBatch is)."""
        if not keys:
            return
        young = self._young
        before = len(young)
        young.update(keys)
        added = len(young) - before
        if added:
            # the longest key of the batch for each new one: an upper bound, computed in C
            self._charged += added * (ENTRY_OVERHEAD + max(map(len, keys)))
            if self._charged >= self._generation_bytes:
                self._old = young
                self._young = set()
                self._charged = 0

    def discard(self, keys: Iterable[bytes]) -> None:
        """`keys` are being deleted (call before or with their write)."""
        keys = list(keys)
        if keys:
            self._young.difference_update(keys)
            self._old.difference_update(keys)

    def clear(self) -> None:
        """Forget every key (keys were removed without being named)."""
        self._young = set()
        self._old = set()
        self._charged = 0

    def __contains__(self, k: object) -> bool:
        return k in self._young or k in self._old
