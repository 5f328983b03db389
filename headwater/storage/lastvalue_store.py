"""Where a topic's last value per key is kept, in RocksDB; what to write is decided elsewhere
(`durables.lastvalue` plans it, from the records appended).

Keys:

- `lv/<topic>\\0<key>`: the current value (an encoded `durables.lastvalue.StoredValue`);
- `lvpos/<topic>\\0<partition>`: the next offset of that partition not yet applied;
- `lvcount/<topic>`: how many keys exist.

A batch's changes, its partition's position and the count go in one WriteBatch, so after a crash
the state is exactly "everything below `lvpos`", and the server re-applies the WAL from there.
These writes are never synced: the WAL is the record, this is a view of it rebuilt from there.
"""

from __future__ import annotations

from headwater.storage.state import StateStore, key

LV = b"lv/"
LVPOS = b"lvpos/"
LVCOUNT = b"lvcount/"


class LastValueStore:
    def __init__(self, state: StateStore, topic: str, partitions: int) -> None:
        self._state = state
        self.topic = topic
        self._prefix = key(LV, topic) + b"\0"
        self._count_key = key(LVCOUNT, topic)
        # the next offset to apply per partition (mirrors `lvpos`, read once)
        self._applied = [_int(state.get(key(LVPOS, topic, p))) for p in range(partitions)]

    def applied(self, partition: int) -> int:
        return self._applied[partition]

    def write(
        self, partition: int, end: int, puts: dict[bytes, bytes], deletes: list[bytes]
    ) -> None:
        """Set and delete keys (record keys), and move `partition`'s position to `end`."""
        count = self.size()
        prefix = self._prefix
        get = self._state.get
        rows: dict[bytes, bytes] = {}
        for record_key, data in puts.items():
            count += get(prefix + record_key) is None
            rows[prefix + record_key] = data
        removed = []
        for record_key in deletes:
            count -= get(prefix + record_key) is not None
            removed.append(prefix + record_key)
        rows[key(LVPOS, self.topic, partition)] = str(end).encode()
        rows[self._count_key] = str(count).encode()
        self._state.write(rows, removed)
        self._applied[partition] = end

    def skip_to(self, partition: int, offset: int) -> None:
        """History below `offset` is gone (retention): start applying there."""
        if offset > self._applied[partition]:
            self._state.write({key(LVPOS, self.topic, partition): str(offset).encode()})
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
        raw = self._state.get(self._count_key)
        return int(raw) if raw else 0

    def drop(self) -> None:
        drop_last_values(self._state, self.topic)


def drop_last_values(state: StateStore, topic: str) -> None:
    """Remove every last-value key of `topic` (a deleted topic's, also one whose delete a crash
    interrupted, when no store object exists)."""
    state.delete_prefix(key(LV, topic) + b"\0")
    state.delete_prefix(key(LVPOS, topic) + b"\0")
    state.write(deletes=[key(LVCOUNT, topic)])


def _int(raw: bytes | None) -> int:
    return int(raw) if raw else 0
