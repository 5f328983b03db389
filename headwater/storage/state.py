"""Server state in RocksDB (rocksdict) under `<data_dir>/state`, one key prefix per kind:

- `topic/<name>`: a topic's partitions, dispatch mode and settings (JSON);
- `sub/<topic>\\0<subscription>`: a reliable subscription's type and settings (JSON);
- `cursor/<topic>\\0<subscription>\\0<partition>`: its acknowledgement state (`PartitionCursor`);
- `upload/<topic>\\0<partition>\\0<base offset, 20 digits>`: a segment uploaded to the object
  store, with its next offset and size;
- `producer/<topic>\\0<partition>\\0<producer id>`: an idempotent producer's recent batches;
- `logstart/<topic>\\0<partition>`: the offset a Kafka DeleteRecords moved the partition's start
  to (everything below it is no longer read);
- `meta/next-producer-id`: the next producer id to hand out.

`\\0` separates names because no topic or subscription name may contain it. Changes that belong
together go in one WriteBatch (`write`). Either way the write reaches the OS before returning, so
it survives the process being killed.

Writes that must also survive a power loss (RocksDB fsyncs its log) go through the one
`StateWriter`, which group-commits them off the event loop, as the WAL's syncer does: while one
synced WriteBatch is being written on the writer's own thread (not asyncio's default executor,
where object-store transfers and admin work could hold every thread while a produce's answer
waits for its producer table's sync; one thread, since one WriteBatch is written at a time; shut
down by `close`, so two servers in one process share none), the writes that arrive queue up, and the
next WriteBatch takes them all, so n concurrent callers cost one fsync, not n, and the loop never
waits for the disk. Each caller gets a future and awaits it only where its promise needs it (a
produce's answer under fsync `always`, a topic's creation). Writes of one key are never split
between the queue and direct `write` calls (a key's writes are synced by its topic's policy, or
always, or never), so going around the queue never reorders them.

Writes that must survive a power loss only eventually (a subscription's acknowledgements under
fsync `always`: losing them redelivers, never skips) go through `write_within`: written at once,
like a plain write, and synced by one RocksDB WAL sync within the given time. Every such write
of the window shares that sync, so acks at any rate cost a few fsyncs a second, not one per
round of acks beside the topic's own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, cast

import structlog
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from headwater.storage.known_keys import KnownKeys
from headwater.storage.tasks import spawn
from headwater.wire.errors import StorageError

log = structlog.get_logger(__name__)

TOPIC = b"topic/"
SUBSCRIPTION = b"sub/"
CURSOR = b"cursor/"
UPLOAD = b"upload/"
PRODUCER = b"producer/"
LOG_START = b"logstart/"
TXN_OPEN = b"txnopen/"  # <topic>\0<partition>\0<producer id>: its open transaction's first offset
TXN_ABORTED = b"txnaborted/"  # <topic>\0<partition>\0<marker offset>: producer id, first offset
TRANSACTION = b"txn/"  # <transactional id>: its coordinator state (durables.transaction_state)
TRANSACTION_PARTS = b"txnpart/"  # <transactional id>\0<n>: a chunk of its partitions (same)
NEXT_PRODUCER_ID = b"meta/next-producer-id"
SEP = b"\0"
WRITE_BUFFER_BYTES = 8 << 20  # each of RocksDB's (at most two) memtables


def key(prefix: bytes, *parts: str | int) -> bytes:
    encoded = [f"{p:020d}" if isinstance(p, int) else p for p in parts]
    return prefix + SEP.join(part.encode() for part in encoded)


class StateStore:
    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        # The state is small and overwritten all the time (a cursor per subscription and
        # partition, rewritten as acks come): RocksDB's default 64 MiB memtable holds every
        # version until it fills, which at 10,000 acks/s took 40 minutes and looked like a leak
        # in a soak's RSS. A flush every few megabytes keeps the memory flat, and costs little:
        # the flushed table holds only the live keys.
        options.set_write_buffer_size(WRITE_BUFFER_BYTES)
        self._db = Rdict(str(path), options)
        self._sync = WriteOptions()
        self._sync.sync = True
        # last-value keys known to exist (`lastvalue_store` keeps it exact; one per server)
        self.known_last_values = KnownKeys()

    def get(self, k: bytes) -> bytes | None:
        value: bytes | None = self._db.get(k)
        return value

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of `keys`, in order (None: absent), in one call into RocksDB."""
        # rocksdict's stub types the key list as invariant over every key type it takes
        values = self._db.get(cast("list[str | int | float | bytes | bool]", keys))
        return cast("list[bytes | None]", values)

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

    def write_all(
        self, changes: Sequence[tuple[dict[bytes, bytes], list[bytes]]], sync: bool = False
    ) -> None:
        """Several writes, in order, as one WriteBatch (the later of two puts of a key wins)."""
        batch = WriteBatch(raw_mode=True)
        for puts, deletes in changes:
            for k, v in puts.items():
                batch.put(k, v)
            for k in deletes:
                batch.delete(k)
        if not sync:
            self._db.write(batch)
        elif batch.len():
            self._db.write(batch, self._sync)
        else:  # only syncs asked for (`StateWriter.write_within`): nothing to add to the log
            self.sync_wal()

    def put_json(self, k: bytes, value: Any, sync: bool = False) -> None:
        self.write({k: json.dumps(value).encode()}, sync=sync)

    def sync_wal(self) -> None:
        """fsync RocksDB's log: every write made before is then on disk."""
        self._db.flush_wal(sync=True)

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


class StateWriter:
    """The one writer of synced state: group commit in a worker thread (see the module doc)."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self._queue: list[tuple[dict[bytes, bytes], list[bytes]]] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None
        self._eventually: asyncio.Future[None] | None = None  # the next `write_within` sync
        self._eventually_timer: asyncio.TimerHandle | None = None
        self.commits = 0  # synced WriteBatches written (tests count them)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="hw-state")

    def write(
        self,
        puts: dict[bytes, bytes] | None = None,
        deletes: list[bytes] | None = None,
        sync: bool = False,
    ) -> asyncio.Future[None] | None:
        """Write now (`sync` False: nothing to wait for), or queue a synced write and return
        the future that completes once it is on disk."""
        if not sync:
            self.store.write(puts, deletes)
            return None
        return self.synced(puts, deletes)

    def synced(
        self, puts: dict[bytes, bytes] | None = None, deletes: list[bytes] | None = None
    ) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._queue.append((puts or {}, deletes or []))
        self._waiters.append(future)
        if self._task is None or self._task.done():
            self._task = spawn(self._run(), "state.writer_failed")
        return future

    def write_within(
        self,
        seconds: float,
        puts: dict[bytes, bytes] | None = None,
        deletes: list[bytes] | None = None,
    ) -> asyncio.Future[None]:
        """Write now (a killed process keeps it) and sync within `seconds`; the future
        completes once that sync is done. Every write made before the sync is covered by it."""
        self.store.write(puts, deletes)
        if self._eventually is None:
            loop = asyncio.get_running_loop()
            self._eventually = loop.create_future()
            self._eventually.add_done_callback(_report_failed_sync)
            self._eventually_timer = loop.call_later(seconds, self._sync_eventually)
        return self._eventually

    def _sync_eventually(self) -> None:
        waiting, self._eventually = self._eventually, None
        self._eventually_timer = None
        if waiting is not None:
            self.synced().add_done_callback(partial(_pass_on, waiting))

    async def put_json(self, k: bytes, value: Any) -> None:
        await self.synced({k: json.dumps(value).encode()})

    async def _run(self) -> None:
        while self._queue:
            changes, self._queue = self._queue, []
            waiters, self._waiters = self._waiters, []
            try:
                await asyncio.get_running_loop().run_in_executor(
                    self._thread, self.store.write_all, changes, True
                )
            except Exception as exc:  # rocksdict raises plain Exceptions for I/O errors
                error = StorageError(f"state write failed: {exc}")
                for future in waiters:
                    if not future.done():
                        future.set_exception(error)
                continue
            self.commits += 1
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    async def flush(self) -> None:
        """Wait until every queued write is on disk (or failed), `write_within`'s at once."""
        if self._eventually_timer is not None:
            self._eventually_timer.cancel()
            self._sync_eventually()
        while self._task is not None and not self._task.done():
            await asyncio.wait([self._task])

    async def close(self) -> None:
        """Write what is queued, then end the writer's thread (a synced write after this fails
        with `StorageError`)."""
        await self.flush()
        self._thread.shutdown(wait=True)  # nothing is queued: the idle thread's exit, at once


def _report_failed_sync(done: asyncio.Future[None]) -> None:
    """Log a failed `write_within` sync. Its callers seldom wait (a cursor's writes: the ack was
    answered already), and a failure nobody retrieved was only asyncio's "exception was never
    retrieved", at garbage collection. Retrieving it here leaves it to any caller who waits."""
    if done.cancelled():
        return
    error = done.exception()
    if error is not None:
        log.error("state.sync_failed", error=str(error), writes="synced within the interval")


def _pass_on(target: asyncio.Future[None], done: asyncio.Future[None]) -> None:
    if target.done():
        return
    error = done.exception()
    if error is None:
        target.set_result(None)
    else:
        target.set_exception(error)
