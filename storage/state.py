"""Server state in RocksDB (rocksdict) under `<data_dir>/state`, one key prefix per kind:

- `topic/<name>`: a topic's partitions, dispatch mode and settings (JSON);
- `sub/<topic>\\0<subscription>`: a reliable subscription's type and settings (JSON);
- `cursor/<topic>\\0<subscription>\\0<partition>`: its acknowledgement state (`PartitionCursor`);
- `upload/<topic>\\0<partition>\\0<base offset, 20 digits>`: a segment uploaded to the object
  store, with its next offset and size;
- `producer/<topic>\\0<partition>\\0<producer id>`: an idempotent producer's recent batches;
- `meta/next-producer-id`: the next producer id to hand out.

`\\0` separates names because no topic or subscription name may contain it. Changes that belong
together go in one WriteBatch (`write`). `sync=True` makes RocksDB fsync its own log before
returning: used for topics whose WAL fsync policy is `always`. Either way the write reaches the OS
before returning, so it survives the process being killed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

TOPIC = b"topic/"
SUBSCRIPTION = b"sub/"
CURSOR = b"cursor/"
UPLOAD = b"upload/"
PRODUCER = b"producer/"
NEXT_PRODUCER_ID = b"meta/next-producer-id"
SEP = b"\0"


def key(prefix: bytes, *parts: str | int) -> bytes:
    encoded = [f"{p:020d}" if isinstance(p, int) else p for p in parts]
    return prefix + SEP.join(part.encode() for part in encoded)


class StateStore:
    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self._db = Rdict(str(path), options)
        self._sync = WriteOptions()
        self._sync.sync = True

    def get(self, k: bytes) -> bytes | None:
        value: bytes | None = self._db.get(k)
        return value

    def get_json(self, k: bytes) -> Any:
        value = self.get(k)
        return None if value is None else json.loads(value)

    def write(
        self,
        puts: dict[bytes, bytes] | None = None,
        deletes: list[bytes] | None = None,
        sync: bool = False,
    ) -> None:
        batch = WriteBatch(raw_mode=True)
        for k, v in (puts or {}).items():
            batch.put(k, v)
        for k in deletes or []:
            batch.delete(k)
        if sync:
            self._db.write(batch, self._sync)
        else:
            self._db.write(batch)

    def put_json(self, k: bytes, value: Any, sync: bool = False) -> None:
        self.write({k: json.dumps(value).encode()}, sync=sync)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every (key without prefix, value) under `prefix`, in key order."""
        iterator = self._db.iter()
        iterator.seek(prefix)
        while iterator.valid():
            k = iterator.key()
            if not k.startswith(prefix):
                return
            yield k[len(prefix) :], iterator.value()
            iterator.next()

    def scan_from(self, start: bytes, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) from `start` on while keys begin with `prefix`. An iterator reads
        one consistent view of the database, whatever is written meanwhile."""
        iterator = self._db.iter()
        iterator.seek(start)
        while iterator.valid():
            k = iterator.key()
            if not k.startswith(prefix):
                return
            yield k, iterator.value()
            iterator.next()

    def delete_prefix(self, prefix: bytes) -> None:
        self.write(deletes=[prefix + k for k, _ in self.scan(prefix)])

    def close(self) -> None:
        self._db.close()
