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

Loading a snapshot into a partition (`begin_load`, `put_rows`, `finish_load`) takes many
WriteBatches, so it is bracketed: `begin_load` sets the partition's position to 0 and writes the
`lvload` marker in one WriteBatch, then removes the partition's keys; `finish_load` moves the
position to the snapshot's horizon and removes the marker in one WriteBatch. A partition found
with the marker (a load a crash or a bad file interrupted) holds an unknown mix of keys:
`loading` says so, and the caller clears it (`clear`) before building it again by any means.
"""

from __future__ import annotations

from collections.abc import Callable

from headwater.storage.state import StateStore, key

LV = b"lv/"
LVPOS = b"lvpos/"
LVCOUNT = b"lvcount/"
LVLOAD = b"lvload/"
_CLEAR_CHUNK = 10_000  # keys deleted per WriteBatch while a partition is cleared


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

    def applied(self, partition: int) -> int:
        return self._applied[partition]

    def write(
        self, partition: int, end: int, puts: dict[bytes, bytes], deletes: list[bytes]
    ) -> None:
        """Set and delete keys (record keys), and move `partition`'s position to `end`."""
        self._write(puts, deletes, {self._position_keys[partition]: str(end).encode()})
        self._applied[partition] = end

    def _write(
        self, puts: dict[bytes, bytes], deletes: list[bytes], extra: dict[bytes, bytes]
    ) -> None:
        """One WriteBatch: the keys set and deleted, the key count kept up to date, and `extra`
        state keys (a partition's position) written with them."""
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
        self._state.write(rows, removed)
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
        them), leaving its position and marker as they are."""
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
    state.write(deletes=[key(LVCOUNT, topic)])


def _int(raw: bytes | None) -> int:
    return int(raw) if raw else 0
