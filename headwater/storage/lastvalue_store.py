"""Where a topic's last value per key is kept, in RocksDB; what to write is decided elsewhere
(`durables.lastvalue` plans it, from the records appended).

Keys:

- `lv/<topic>\\0<key>`: the current value (an encoded `durables.lastvalue.StoredValue`);
- `lvpos/<topic>\\0<partition>`: the next offset of that partition not yet applied;
- `lvcount/<topic>`: how many keys exist;
- `lvload/<topic>\\0<partition>`: a snapshot load of that partition is under way (see below).

A batch's changes, its partition's position and the count go in one WriteBatch, so after a crash
the state is exactly "everything below `lvpos`", and the server re-applies the WAL from there.
These writes are never synced: the WAL is the record, this is a view of it rebuilt from there.

The count needs to know which keys of a batch existed before it. A key the state store's
`KnownKeys` holds was written and not deleted since, so it exists; only the others are looked up,
in one multi-get per batch. `KnownKeys` is memory only and may forget keys, so the count read back
after a restart is as exact as before: it was written with the keys.

A transaction's records (docs/DURABLES.md, "Transactions") are held until its marker:

- `lvtxn/<topic>\\0<partition>\\0<producer id>\\0<key>`: the transaction's newest change of the
  key (an encoded `StoredValue`, value length -1 for a deletion), written with the position as
  its batches are applied (`hold`), removed by its marker (`release`), which writes the changes
  that win in the same WriteBatch;
- `lvdel/<topic>\\0<partition>\\0<key>`: the offset of a deletion applied while some
  transaction is held in the partition (a held change older than it must not bring the key
  back); all of the partition's are removed when its last held transaction ends.

So held transactions survive a restart with the rest, and the replay from `lvpos` finds the
state exactly as the WriteBatch of its position left it.

Loading a snapshot into a partition (`begin_load`, `put_rows`, `finish_load`) takes many
WriteBatches, so it is bracketed: `begin_load` sets the partition's position to 0 and writes the
`lvload` marker in one WriteBatch, then removes the partition's keys; `finish_load` moves the
position to the snapshot's horizon and removes the marker in one WriteBatch. A partition found
with the marker (a load a crash or a bad file interrupted) holds an unknown mix of keys:
`loading` says so, and the caller clears it (`clear`) before building it again by any means.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable

from headwater.storage.state import SEP, StateStore, key

LV = b"lv/"
LVPOS = b"lvpos/"
LVCOUNT = b"lvcount/"
LVLOAD = b"lvload/"
LVTXN = b"lvtxn/"
LVDEL = b"lvdel/"
_OFFSET = struct.Struct(">q")
_CLEAR_CHUNK = 10_000  # keys deleted per WriteBatch while a partition is cleared
# (partition, producer) pairs holding a transaction read back at most: far beyond the producers
# a topic ever has open at once
_MAX_HOLDING = 10_000_000


class LastValueStore:
    def __init__(self, state: StateStore, topic: str, partitions: int) -> None:
        self._state = state
        self.topic = topic
        self._prefix = key(LV, topic) + b"\0"
        self._count_key = key(LVCOUNT, topic)
        self._position_keys = [key(LVPOS, topic, p) for p in range(partitions)]
        # the next offset to apply per partition and the key count: mirrors of `lvpos` and
        # `lvcount`, read once (this object is their only writer while the topic exists)
        self._applied = [_int(state.get(k)) for k in self._position_keys]
        self._count = _int(state.get(self._count_key))
        self._partitions = partitions
        self._known = state.known_last_values
        # per partition, the producers whose transaction has changes held (mirrors `lvtxn`)
        self._holding: list[set[int]] = [set() for _ in range(partitions)]
        self._load_holding()

    def applied(self, partition: int) -> int:
        return self._applied[partition]

    def write(
        self,
        partition: int,
        end: int,
        puts: dict[bytes, bytes],
        deletes: list[bytes],
        deleted_at: dict[bytes, int] | None = None,
    ) -> None:
        """Set and delete keys (record keys), and move `partition`'s position to `end`;
        `deleted_at`: deletions to remember (key -> offset) while a transaction is held."""
        extra = {self._position_keys[partition]: str(end).encode()}
        if deleted_at:
            extra.update(self._deletion_rows(partition, deleted_at))
        self._write(puts, deletes, extra)
        self._applied[partition] = end

    # Transactions

    def holding(self, partition: int) -> bool:
        """Whether some transaction has changes held in `partition`."""
        return bool(self._holding[partition])

    def hold(self, partition: int, end: int, producer: int, changes: dict[bytes, bytes]) -> None:
        """Hold a transaction's changes (key -> encoded change) until its marker, and move the
        position to `end`: one WriteBatch."""
        prefix = self._held_prefix(partition, producer)
        rows = {prefix + record_key: data for record_key, data in changes.items()}
        rows[self._position_keys[partition]] = str(end).encode()
        self._state.write(rows)
        self._applied[partition] = end
        if changes:
            self._holding[partition].add(producer)

    def held(self, partition: int, producer: int) -> dict[bytes, bytes]:
        """The changes `producer`'s transaction holds in `partition` (key -> encoded change)."""
        if producer not in self._holding[partition]:
            return {}
        prefix = self._held_prefix(partition, producer)
        return {k[len(prefix) :]: data for k, data in self._state.scan_from(prefix, prefix)}

    def deleted(self, partition: int, record_keys: list[bytes]) -> list[int | None]:
        """The offset each key was deleted at while a transaction was held (None: not)."""
        prefix = key(LVDEL, self.topic, partition) + SEP
        found = self._state.get_many([prefix + record_key for record_key in record_keys])
        return [None if data is None else _OFFSET.unpack(data)[0] for data in found]

    def get_many(self, record_keys: list[bytes]) -> list[bytes | None]:
        return self._state.get_many([self._prefix + record_key for record_key in record_keys])

    def release(
        self,
        partition: int,
        end: int,
        producer: int,
        puts: dict[bytes, bytes],
        deletes: list[bytes],
        deleted_at: dict[bytes, int],
    ) -> None:
        """End `producer`'s transaction in `partition`, in one WriteBatch: the changes that won
        set and deleted, its held changes removed, the deletions remembered while another
        transaction is still held (else every remembered one removed), the position `end`."""
        holding = self._holding[partition]
        removed: list[bytes] = []
        if producer in holding:
            prefix = self._held_prefix(partition, producer)
            removed = [k for k, _ in self._state.scan_from(prefix, prefix)]
            holding.discard(producer)
            if not holding:
                removed += self._deletion_keys(partition)
        extra = {self._position_keys[partition]: str(end).encode()}
        if holding:
            extra.update(self._deletion_rows(partition, deleted_at))
        self._write(puts, deletes, extra, removed)
        self._applied[partition] = end

    def _held_prefix(self, partition: int, producer: int) -> bytes:
        return key(LVTXN, self.topic, partition, producer) + SEP

    def _deletion_rows(self, partition: int, deleted_at: dict[bytes, int]) -> dict[bytes, bytes]:
        prefix = key(LVDEL, self.topic, partition) + SEP
        return {prefix + k: _OFFSET.pack(offset) for k, offset in deleted_at.items()}

    def _deletion_keys(self, partition: int) -> list[bytes]:
        prefix = key(LVDEL, self.topic, partition) + SEP
        return [k for k, _ in self._state.scan_from(prefix, prefix)]

    def _load_holding(self) -> None:
        """Which producers hold changes, per partition: one seek per (partition, producer)."""
        prefix = key(LVTXN, self.topic) + SEP
        start = prefix
        for _ in range(_MAX_HOLDING):  # each turn seeks past one producer's rows
            found = next(iter(self._state.scan_from(start, prefix)), None)
            if found is None:
                return
            partition, producer = found[0][len(prefix) :].split(SEP)[:2]
            if int(partition) < self._partitions:
                self._holding[int(partition)].add(int(producer))
            start = prefix + partition + SEP + producer + b"\x01"  # past its rows

    def _clear_transactions(self, partition: int) -> None:
        """Forget what the partition holds of transactions (its state is rebuilt)."""
        held = key(LVTXN, self.topic, partition) + SEP
        doomed = [k for k, _ in self._state.scan_from(held, held)]
        doomed += self._deletion_keys(partition)
        self._holding[partition].clear()
        for start in range(0, len(doomed), _CLEAR_CHUNK):
            self._state.write(deletes=doomed[start : start + _CLEAR_CHUNK])

    def _write(
        self,
        puts: dict[bytes, bytes],
        deletes: list[bytes],
        extra: dict[bytes, bytes],
        extra_deletes: Iterable[bytes] = (),
    ) -> None:
        """One WriteBatch: the keys set and deleted, the key count kept up to date, and `extra`
        state keys (a partition's position) written, `extra_deletes` removed, with them."""
        prefix = self._prefix
        rows = {prefix + record_key: data for record_key, data in puts.items()}
        removed = [prefix + record_key for record_key in deletes]
        count = self._count
        known = self._known
        if rows:
            # a key written before (and not deleted since) exists: only the others are looked
            # up, in one multi-get
            unknown = known.unknown(rows.keys())
            if unknown:
                count += self._state.get_many(list(unknown)).count(None)
        if removed:
            unknown = known.unknown(removed)
            count -= len(removed) - len(unknown)  # known keys exist: each deletion removes one
            if unknown:
                count -= len(unknown) - self._state.get_many(list(unknown)).count(None)
            known.discard(removed)  # before the write: never held while possibly absent
        written = list(rows)  # before the position and the count join `rows`
        rows.update(extra)
        rows[self._count_key] = str(count).encode()
        self._state.write(rows, [*removed, *extra_deletes])
        self._count = count
        known.add(written)

    def loading(self, partition: int) -> bool:
        """Whether a snapshot load of `partition` was begun and not finished."""
        return self._state.get(key(LVLOAD, self.topic, partition)) is not None

    def begin_load(self, partition: int, belongs: Callable[[bytes], bool]) -> None:
        """Mark `partition` as being loaded (position 0) and remove its keys."""
        self._state.write(
            {key(LVLOAD, self.topic, partition): b"", self._position_keys[partition]: b"0"}
        )
        self._applied[partition] = 0
        self.clear(partition, belongs)

    def clear(self, partition: int, belongs: Callable[[bytes], bool]) -> None:
        """Remove the keys of `partition` (`belongs(data)`: whether a stored value is one of
        them) and what it holds of transactions, leaving its position and marker as they
        are."""
        self._clear_transactions(partition)
        doomed: list[bytes] = []
        for raw_key, data in self._state.scan_from(self._prefix, self._prefix):
            if self._partitions == 1 or belongs(data):
                doomed.append(raw_key)
            if len(doomed) >= _CLEAR_CHUNK:
                self._delete(doomed)
                doomed = []
        self._delete(doomed)

    def _delete(self, raw_keys: list[bytes]) -> None:
        if raw_keys:
            self._known.discard(raw_keys)
            found = self._state.get_many(raw_keys)
            count = self._count - (len(raw_keys) - found.count(None))
            self._state.write({self._count_key: str(count).encode()}, raw_keys)
            self._count = count

    def put_rows(self, puts: dict[bytes, bytes]) -> None:
        """Set keys (record keys) of a partition being loaded, leaving its position alone."""
        self._write(puts, [], {})

    def finish_load(self, partition: int, horizon: int) -> None:
        """The load is complete: everything below `horizon` is in."""
        self._state.write(
            {self._position_keys[partition]: str(horizon).encode()},
            [key(LVLOAD, self.topic, partition)],
        )
        self._applied[partition] = horizon

    def abandon_load(self, partition: int, belongs: Callable[[bytes], bool]) -> None:
        """Undo a load that failed part-way: no keys, position 0, no marker."""
        self.clear(partition, belongs)
        self._state.write(
            {self._position_keys[partition]: b"0"}, [key(LVLOAD, self.topic, partition)]
        )
        self._applied[partition] = 0

    def skip_to(self, partition: int, offset: int) -> None:
        """History below `offset` is gone (retention): start applying there."""
        if offset > self._applied[partition]:
            self._state.write({self._position_keys[partition]: str(offset).encode()})
            self._applied[partition] = offset

    def get(self, record_key: bytes) -> bytes | None:
        return self._state.get(self._prefix + record_key)

    def scan(
        self, prefix: bytes, after: bytes = b"", limit: int | None = None
    ) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """(key, data) of keys starting with `prefix` and greater than `after`, in key order;
        the cursor to pass as `after` for the next page (empty when there is none)."""
        found: list[tuple[bytes, bytes]] = []
        start = self._prefix + max(prefix, after + b"\0" if after else b"")
        skip = len(self._prefix)
        for raw_key, data in self._state.scan_from(start, self._prefix + prefix):
            if limit is not None and len(found) == limit:
                return found, found[-1][0]
            found.append((raw_key[skip:], data))
        return found, b""

    def size(self) -> int:
        return self._count

    def drop(self) -> None:
        drop_last_values(self._state, self.topic)
        self._count = 0


def drop_last_values(state: StateStore, topic: str) -> None:
    """Remove every last-value key of `topic` (a deleted topic's, also one whose delete a crash
    interrupted, when no store object exists)."""
    state.known_last_values.clear()  # every topic's: the keys of this one are not named
    state.delete_prefix(key(LV, topic) + b"\0")
    state.delete_prefix(key(LVPOS, topic) + b"\0")
    state.delete_prefix(key(LVLOAD, topic) + b"\0")
    state.delete_prefix(key(LVTXN, topic) + b"\0")
    state.delete_prefix(key(LVDEL, topic) + b"\0")
    state.write(deletes=[key(LVCOUNT, topic)])


def _int(raw: bytes | None) -> int:
    return int(raw) if raw else 0
