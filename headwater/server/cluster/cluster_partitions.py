"""A cluster broker's side of taking a partition over, handing it off, and losing it.

The etcd coordinator (`server.cluster`) decides who owns each partition; this module is the
`PartitionHandler` it calls, and keeps what a new owner needs where it can find it:

- **acquire** (the ownership key is ours, not yet served): claim the partition's manifest
  (`storage.partition_manifest`: no earlier owner can name a segment from now on, and none
  deletes a chunk above the claimed version's end) while listing the partition's cloud tail
  (`storage.cloud_tail`), resolve the valid chain above the manifest's segments and its end E,
  and write our epoch's marker at E (first time only). That part touches nothing local and
  starts at once, before the take-over's place in the topic's turn comes (a dead broker's
  partitions of one topic are claimed at the same time); the take-over holds the turn from then
  until it is done, and checks the topic unchanged before the local part. The local log is
  kept only when it already ends at E with everything up to E stored by us; otherwise it
  is replaced by an empty log at E, and reads below it go to the manifest's segments and to the
  chain's chunks in place (nothing is downloaded: a take-over costs the same whatever the tail),
  which are folded into one segment in the background. Last-value state of a replaced partition
  is cleared and caught up (snapshot + log). Then each reliable subscription's cursor for the
  partition is replaced by the checkpoint the previous owner left (unacked messages due again:
  at-least-once).
- **idempotent producers**: a replaced partition's producer table is rebuilt in the background
  from the batch headers of the newest part of the log the object store holds (the manifest's
  last segments, at least `REBUILD_BYTES` of them, and the chunks in place), which carry each
  batch's producer id and base sequence; idempotent produces to the partition wait for it
  (`LogPartition.producers_ready`), other produces do not, so the take-over itself costs the
  same. The chunks in place are read newest first and their batches go into the table as they
  come, newest first (`ProducerTable.add_older`): a producer's batch the table then answers as
  it will once whole (its retry of a batch found, its next one) is answered at once, not after
  the whole tail (500 chunks after a busy owner: 1.2-8 s, issue 42); the rest waits for the
  scan of it all, oldest first, whose table then completes the entries (`ProducerTable.adopt`).
  A kept log keeps its table when that table was complete.
- **transactions** (`server.cluster.cluster_transactions`): a replaced partition's aborted
  ranges are the objects its previous owners kept (listed beside the claim, so a reader never
  sees an aborted batch); its open transactions are found by the same scan as the producers:
  a transactional batch opens its producer's, a marker closes it (an abort found so whose
  range has no object yet gets one), and those left open are kept when the replica has that
  producer's transaction in progress naming the partition, aborted with a marker otherwise
  (hanging). While the replica has one in progress there, the partition's LSO is held at the
  scan's start until the scan is done; markers and transactional produces wait for it.
- **uploads** (`SegmentPublisher`): a sealed segment is uploaded under a name of its own once the
  tail holds all its batches, and counts only once the manifest names it; the chunks below the
  manifest's new end then go.
- **release** (graceful hand-off; the partition is no longer served): wait until what was
  appended is in the object store, then write every cursor's final checkpoint, so the next owner
  redelivers only what was unacked.
- **lost** (fenced): what waits for the object store is answered NOT_OWNER at once.

Cursors are also checkpointed every `checkpoint_interval` while owned (only those that changed),
so a kill -9 costs at most that interval of acks: those messages are delivered again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, Protocol

import structlog

from headwater.durables.cursor import PartitionCursor
from headwater.durables.partition_transactions import AbortedRange
from headwater.durables.producers import ProducerTable
from headwater.durables.transaction_state import Transaction
from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.cluster.shared_commit import SharedCommitter
from headwater.server.cluster.tail_commit import TailCommitter
from headwater.server.subscriptions.reliable_subscription import ReliableSubscription
from headwater.server.topics.topic import LogPartition, LogTopic
from headwater.server.topics.topic_settings import log_config
from headwater.storage.archive import READ_BYTES
from headwater.storage.cloud_tail import Chunk, CloudTail, TailState, fold
from headwater.storage.fileio import remove_tree
from headwater.storage.log_reader import Walked
from headwater.storage.partition_manifest import (
    Manifest,
    ManifestFenced,
    PartitionManifests,
    SegmentEntry,
)
from headwater.storage.segments import SparseIndex, batch_location, check_batch
from headwater.storage.tasks import end_tasks
from headwater.storage.uploader import UploadedSegment
from headwater.storage.wal import PartitionLog, SealedSegment
from headwater.wire.errors import ObjectNotFound, StorageError
from headwater.wire.markers import Marker, marker_type
from headwater.wire.records import CONTROL_FLAG, TRANSACTIONAL_FLAG

log = structlog.get_logger(__name__)

_STORED_WAIT = 1.0  # an upload waiting for the tail looks again at least this often
_FOLD_READS = 16  # chunk GETs of one fold in flight
RETIRE_AFTER = 600.0  # seconds an object the manifest no longer names stays readable
_RETRY_INITIAL = 0.05
_RETRY_MAX = 5.0
# a producer table is rebuilt from at least this much of the newest segments (plus the chunks
# above them): a producer's retries are of its newest batches, which are there
REBUILD_BYTES = 16 << 20
_REBUILD_READS = 1_000_000  # bounds a rebuild's loop of reads (each moves past one batch at least)
FOLD_AFTER_TAKE_OVER = 2.0  # seconds a take-over's fold waits at most for our first chunk
REPLICA_WAIT = 30.0  # seconds a rebuild waits at most for the transactions' states to be read


class Checkpoints(Protocol):
    async def swap_checkpoint(
        self,
        key: str,
        value: bytes,
        expected: bytes | None,
        since: int = 0,
        topic: str | None = None,
    ) -> tuple[bool, bytes | None]: ...

    async def create_checkpoint(
        self, key: str, value: bytes, since: int = 0, topic: str | None = None
    ) -> bytes | None: ...

    async def get_checkpoint(self, key: str, since: int = 0) -> bytes | None: ...

    def incarnation(self, name: str) -> int: ...

    def owned(self) -> list[tuple[str, int]]: ...

    def epoch(self, topic: str, partition: int) -> int | None: ...


class TakeOverTransactions(Protocol):
    """What a take-over asks of the cluster's transactions
    (`server.cluster.cluster_transactions.ClusterTransactions`)."""

    loaded: asyncio.Event  # set once the replica of the states was read

    async def aborted(
        self, topic: str, partition: int, since: int
    ) -> list[tuple[AbortedRange, str]]: ...

    async def forget(self, keys: list[str]) -> None: ...

    async def keep_aborted(self, topic: str, partition: int, aborted: AbortedRange) -> None: ...

    def in_progress(self, topic: str, partition: int) -> dict[int, Transaction]: ...

    async def abort_hanging(self, topic: str, partition: int, producer_id: int) -> None: ...


def checkpoint_key(topic: str, subscription: str, partition: int) -> str:
    return f"{topic}/{subscription}/{partition}"


class ClusterPartitions:
    def __init__(
        self,
        catalog: TopicCatalog,
        tail: CloudTail,
        committer: TailCommitter | SharedCommitter,
        checkpoints: Checkpoints,
        serves: Callable[[str, int], bool],
        checkpoint_interval: float = 0.5,
        fold_chunks: int = 500,
        transactions: TakeOverTransactions | None = None,
    ) -> None:
        self._catalog = catalog
        self._transactions = transactions
        self._serves = serves
        self._tail = tail
        self._committer = committer
        self._manifests = PartitionManifests(tail.store)
        # the manifest version this broker wrote last per partition it owns (set by a claim)
        self._manifest: dict[tuple[str, int], Manifest] = {}
        # set and replaced whenever a partition's stored end moves or a partition is lost: an
        # upload waiting for the tail to hold its segment looks again
        self._moved = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()
        # the previous owners' chunks above the manifest's segments, read in place after a
        # take-over until a fold names them in a segment
        self._in_place: dict[tuple[str, int], list[UploadedSegment]] = {}
        self._unfolded: dict[tuple[str, int], int] = {}  # chunks stored since the last fold
        self._folding: dict[tuple[str, int], asyncio.Task[None]] = {}
        # set when our first chunk after a take-over is stored: that take-over's fold starts
        self._first_stored: dict[tuple[str, int], asyncio.Event] = {}
        # a partition's chunks are folded into a segment once this many are stored (and after
        # a take-over): a take-over lists about that many, whatever the traffic
        self._fold_chunks = fold_chunks
        self.folds = 0
        self._checkpoints = checkpoints
        self._interval = checkpoint_interval
        self._written: dict[tuple[str, str, int], bytes] = {}
        # one checkpoint write of a partition at a time: the loop's and a committed
        # transaction's (`checkpoint_now`), both comparing with `_written`, would otherwise
        # find each other's write foreign and adopt the older cursor
        self._checkpointing: dict[tuple[str, int], asyncio.Lock] = {}
        self.checkpoint_failures = 0  # partition checkpoints that failed (retried next round)
        # (topic, partition) -> the offset up to which our local log is known to equal the
        # object store's chain (set by a take-over, moved by our stored chunks)
        self._verified: dict[tuple[str, int], int] = {}
        self._task: asyncio.Task[None] | None = None
        self.rebuilt = 0
        self.kept = 0
        # partitions whose producer table is complete for the local log (rebuilt, then kept up
        # by our own appends): a take-over that keeps the log keeps it
        self._tables: set[tuple[str, int]] = set()
        self.tables_rebuilt = 0
        # partitions whose take-over loaded the cursors (in the topic's turn), until released
        # or lost: a subscription created here (also in the turn) takes the cluster's cursors
        # for exactly these. Not the coordinator's SERVING, which comes a moment after the
        # take-over: a subscription created in between was in neither, and started afresh
        # the partitions taken over here, each with the incarnation (`Checkpoints.incarnation`)
        # it was claimed in: its cursors are written for that topic only, never for one
        # re-created under the name
        self._taken: dict[tuple[str, int], int] = {}
        self.wake: Callable[[], None] = lambda: None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._checkpoint_loop())

    async def close(self) -> None:
        tasks = [*self._background, *self._folding.values()]
        if self._task is not None:
            tasks.append(self._task)
        await end_tasks(*tasks)

    def stored(self, topic: str, partition: int, end: int) -> None:
        """The committer stored our chunk up to `end`: subscriptions may now send it."""
        self._verified[topic, partition] = end
        self._signal_moved()
        key = (topic, partition)
        first = self._first_stored.pop(key, None)
        if first is not None:
            first.set()  # the take-over's fold may start
        self._unfolded[key] = self._unfolded.get(key, 0) + 1
        if self._unfolded[key] >= self._fold_chunks:
            self._fold_soon(topic, partition)
        found = self._catalog.topics.get(topic)
        if isinstance(found, LogTopic):
            found.partitions[partition].log.notify()  # wakes the topic's pumps

    def cloud_end(self, topic: str, partition: int) -> int:
        """How far the partition is known to be in the object store, 0 unless served here."""
        if not self._serves(topic, partition):
            return 0
        return self._verified.get((topic, partition), 0)

    # PartitionHandler

    async def acquire(self, topic: str, partition: int, epoch: int) -> None:
        found = self._catalog.topics.get(topic)
        if not isinstance(found, LogTopic) or partition >= len(found.partitions):
            # not known here yet (its creation from the watch holds the turn), not reliable, or
            # not grown yet: all of it in the turn, which settles that
            async with self._catalog.turn(topic):
                await self._take_over(topic, partition, epoch)
            return
        # the object store's part starts at once, before our place in the topic's turn comes:
        # the topic's other partitions taken over at the same moment (a dead broker's) no
        # longer wait for each other's claims (a few hundred ms each under load: issue 21,
        # failover under 3 s). It touches nothing local. The take-over still holds the turn
        # from when its place comes until it is done, as before: a SUBSCRIBE coming meanwhile
        # waits for it (a subscription created while its partition was half taken over, the
        # turn free during the claim, got nothing: test_cluster_manifest). Produces do not
        # (`produces_pass`): those to this partition are refused until it is served, and the
        # topic's other partitions here went without an ack for the whole claim (issue 42)
        started = time.monotonic()
        claiming = asyncio.get_running_loop().create_task(self._claim(topic, partition, epoch))
        try:
            async with self._catalog.turn(topic, produces_pass=True):
                claimed = await asyncio.shield(claiming)
                if (
                    self._catalog.topics.get(topic) is not found
                    or self._checkpoints.incarnation(topic) != claimed.since
                ):
                    # deleted, re-created or replaced meanwhile: the key went with it, or this
                    # take-over fails and is retried with a new epoch
                    raise LookupError(f"topic {topic!r} changed while its partition was taken over")
                await self._take_local(found, partition, epoch, claimed, started)
        finally:
            if not claiming.done():  # cancelled (acquire_timeout) while waiting for the turn
                claiming.cancel()
                with contextlib.suppress(BaseException):
                    await claiming

    async def _take_over(self, topic: str, partition: int, epoch: int) -> None:
        found = self._catalog.topics.get(topic)
        if found is None:
            raise LookupError(f"topic {topic!r} is not known here yet")
        if not isinstance(found, LogTopic):
            # non-reliable: nothing is kept, nothing to take over; what we knew of its producers
            # is stale (another broker may have served it since), and they may start anywhere
            found.partitions[partition].producers.reset(complete=False)
            return
        started = time.monotonic()
        claimed = await self._claim(topic, partition, epoch)
        await self._take_local(found, partition, epoch, claimed, started)

    async def _claim(self, topic: str, partition: int, epoch: int) -> _Claimed:
        """The object store's part of a take-over: claim the manifest, list the tail, find the
        chain's end and write our epoch's marker there."""
        started = time.monotonic()
        await self._committer.settle(topic, partition)
        await self._tail.prepare(topic, partition, epoch)
        # what a deleted topic of the same name left in the shared store is not ours
        since = self._checkpoints.incarnation(topic)
        # the claim of the manifest, and the tail's listing at the same time: a previous owner
        # still running (paused, fenced) can no longer name a segment once we have written our
        # version, and it deletes chunks only below the end of a version it wrote, which our
        # claim holds (a chunk it stores after our listing starts at or past the end we find,
        # and our marker fences it)
        aborted = (
            _nothing()
            if self._transactions is None
            else self._transactions.aborted(topic, partition, since)
        )
        manifest, state, aborted_ranges = await asyncio.gather(
            self._manifests.claim(topic, partition, epoch, since),
            self._tail.state(topic, partition),
            aborted,
        )
        state = state.since(since)
        claimed = time.monotonic()
        end, run = state.resolve(manifest.end)
        if run and run[0].first > manifest.end:
            log.error(
                "cluster.tail_gap",
                topic=topic,
                partition=partition,
                segments_end=manifest.end,
                chunks_from=run[0].first,
            )
        newest = None
        if run:  # beside the marker and the local part: an idempotent producer's first answer
            newest = asyncio.get_running_loop().create_task(
                self._tail.read(topic, partition, run[-1])
            )
            newest.add_done_callback(_retrieved)  # (unused if the take-over fails)
        if epoch not in state.markers:
            await self._tail.mark_epoch(topic, partition, epoch, end, state)
        return _Claimed(
            since,
            manifest,
            state,
            end,
            run,
            aborted_ranges,
            claim_ms=round((claimed - started) * 1000, 1),
            marker_ms=round((time.monotonic() - claimed) * 1000, 1),
            newest=newest,
        )

    async def _take_local(
        self, found: LogTopic, partition: int, epoch: int, claimed: _Claimed, started: float
    ) -> None:
        """The local part of a take-over, in the topic's turn: the log kept or restarted at the
        chain's end, the cursors from the previous owner's checkpoints."""
        topic = found.name
        key = (topic, partition)
        manifest, state, end, run = claimed.manifest, claimed.state, claimed.end, claimed.run
        since = claimed.since
        turn_at = time.monotonic()
        self._manifest[key] = manifest
        local = found.partitions[partition].log
        # kept only when it holds everything above the manifest's segments: a take-over that
        # failed after restarting the log at E (etcd lost while loading cursors) left a log
        # ending at E and E verified, yet holding nothing below E; keeping it dropped the
        # chunks in place, and with them every offset below E, from reads ("earliest" was E)
        if (
            local.next_offset == end
            and self._verified.get(key) == end
            and local.start_offset <= manifest.end
        ):
            self.kept += 1
            self._in_place.pop(key, None)
            self._adopt(topic, partition, manifest)
            if key not in self._tables:  # its rebuild did not finish: again
                # (the transactions too, when that rebuild replaced them: still held)
                held = found.partitions[partition].transactions.held
                self._rebuild_producers(
                    found,
                    partition,
                    end,
                    epoch,
                    manifest,
                    run,
                    held is not None,
                    held,
                    claimed.newest,
                )
        else:
            # read in place, not downloaded: a take-over costs the same whatever the tail
            self._in_place[key] = [
                UploadedSegment(
                    c.first,
                    c.end,
                    state.sizes.get(c, 0),
                    c.key(topic, partition)[: -len(".log")],
                    max(c.first, manifest.end),
                    indexed=False,
                    position=c.position,
                )
                for c in run
            ]
            await self._restart(found, partition, end, manifest)
            self.rebuilt += 1
            start = await self._restart_transactions(found, partition, manifest, claimed.aborted)
            self._rebuild_producers(
                found, partition, end, epoch, manifest, run, True, start, claimed.newest
            )
        self._verified[key] = end
        self._unfolded[key] = len(run)
        await self._load_cursors(found, partition, since)
        self._taken[key] = since
        log.info(
            "cluster.partition_acquired",
            topic=topic,
            partition=partition,
            epoch=epoch,
            end=end,
            chunks=len(run),
            segments=len(manifest.segments),
            ms=round((time.monotonic() - started) * 1000, 1),
            # where the time went: the claim and the listing, the marker, waiting for the
            # topic's turn, the local part
            claim_ms=claimed.claim_ms,
            marker_ms=claimed.marker_ms,
            turn_ms=round((turn_at - started) * 1000 - claimed.claim_ms - claimed.marker_ms, 1),
            local_ms=round((time.monotonic() - turn_at) * 1000, 1),
        )
        if self._in_place.get((topic, partition)):
            # the previous owners' chunks into one segment, once our first chunk is stored (the
            # first produces to the new owner answered), or after FOLD_AFTER_TAKE_OVER without
            # one: folding reads and writes the whole run (tens of MB after a busy owner), and
            # at once it held up the first chunk PUTs (0.4-0.9 s from the take-over to the
            # first ack, against 0.1-0.2 s). Not later than that: a segment sealed before the
            # fold names the chunks in place cannot be named (its base is past the manifest's
            # end), and neither can the ones after it until the next fold
            first = self._first_stored[key] = asyncio.Event()
            self._fold_soon(topic, partition, first)
        self._wake_subscriptions(topic)

    async def release(self, topic: str, partition: int) -> None:
        with contextlib.suppress(Exception):
            await self._committer.drain(topic, partition)
        # only the cursors that moved here since they were loaded or last written: one that did
        # not may be older than the checkpoint (a Kafka group commits through its coordinator,
        # which writes the checkpoint of a partition served elsewhere), and the next owner
        # takes its cursors from there
        await self._checkpoint_partition(topic, partition)
        self._taken.pop((topic, partition), None)
        log.info("cluster.partition_released", topic=topic, partition=partition)

    def lost(self, topic: str, partition: int) -> None:
        self._taken.pop((topic, partition), None)
        self._committer.reset(topic, partition)
        self._verified.pop((topic, partition), None)
        self._manifest.pop((topic, partition), None)
        self._in_place.pop((topic, partition), None)
        self._tables.discard((topic, partition))
        self._first_stored.pop((topic, partition), None)
        self._signal_moved()
        log.warning("cluster.partition_lost", topic=topic, partition=partition)

    # Idempotent producers and transactions

    async def _restart_transactions(
        self,
        topic: LogTopic,
        partition: int,
        manifest: Manifest,
        aborted: list[tuple[AbortedRange, str]],
    ) -> int | None:
        """The partition's transactions as its previous owners left them: the aborted ranges
        kept in the object store at once, the open ones from the rebuild's scan. Returns where
        that scan starts when the LSO is held meanwhile (a transaction in progress names the
        partition, or the states are not read yet), else None."""
        if self._transactions is None:
            return None
        state = topic.partitions[partition].transactions
        first = topic.start_offset(partition)
        state.reset()
        state.restore({}, [r for r, _ in aborted if r.last_offset >= first])
        below = [key for r, key in aborted if r.last_offset < first]
        if below:
            self._spawn(self._transactions.forget(below))
        if self._transactions.loaded.is_set() and not self._transactions.in_progress(
            topic.name, partition
        ):
            return None
        start = await _rebuild_start(topic, partition, manifest)
        state.held = start
        return start

    def _rebuild_producers(
        self,
        topic: LogTopic,
        partition: int,
        end: int,
        epoch: int,
        manifest: Manifest,
        chunks: list[Chunk],
        transactions: bool = False,
        start: int | None = None,
        newest: asyncio.Task[list[bytes]] | None = None,
    ) -> None:
        """Forget the partition's producers and rebuild them in the background from the log
        below `end` (its `transactions` too, from `start` where its LSO is held); idempotent
        produces, transactional ones among them, wait for `producers_ready` meanwhile.
        `newest`: the read of the newest of `chunks`, started already (the take-over's)."""
        holder = topic.partitions[partition]
        self._tables.discard((topic.name, partition))
        holder.producers.reset(complete=False)
        previous = holder.producers_ready
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        holder.producers_ready = ready
        _found(holder)
        if previous is not None and not previous.done():
            previous.set_result(None)  # its waiters look again, and find this one
        self._spawn(
            self._rebuild(
                topic, partition, manifest, chunks, end, epoch, ready, transactions, start, newest
            )
        )

    async def _rebuild(
        self,
        topic: LogTopic,
        partition: int,
        manifest: Manifest,
        chunks: list[Chunk],
        end: int,
        epoch: int,
        ready: asyncio.Future[None],
        transactions: bool,
        held_from: int | None,
        newest: asyncio.Task[list[bytes]] | None = None,
    ) -> None:
        """Retried with doubling delays while the partition is ours under `epoch` and no later
        take-over started another rebuild; `ready` is done in every case (its waiters then find
        the partition not served, or the next rebuild). `transactions`: the partition's
        transactions are rebuilt from the same scan, which starts at `held_from` when the
        partition's LSO is held there until it is done."""
        holder = topic.partitions[partition]
        started = time.monotonic()
        delay = _RETRY_INITIAL
        try:
            while (
                holder.producers_ready is ready
                and self._checkpoints.epoch(topic.name, partition) == epoch
            ):
                try:
                    start = held_from
                    if start is None:
                        start = await _rebuild_start(topic, partition, manifest)
                    table, batches, scanned = await self._scan_producers(
                        topic, partition, start, end, chunks, ready, newest
                    )
                    newest = None  # a retry reads it again
                except (StorageError, ValueError) as exc:
                    log.warning(
                        "cluster.producers_rebuild_failed",
                        topic=topic.name,
                        partition=partition,
                        error=str(exc),
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _RETRY_MAX)
                    continue
                if holder.producers_ready is not ready:
                    return
                # what the table holds so far (found newest first, and appended since for the
                # batches it answered) is completed by the whole scan's
                holder.producers.adopt(table)
                if transactions:
                    await self._rebuilt_transactions(topic, partition, scanned)
                self._tables.add((topic.name, partition))
                self.tables_rebuilt += 1
                log.info(
                    "cluster.producers_rebuilt",
                    topic=topic.name,
                    partition=partition,
                    first=start,
                    end=end,
                    batches=batches,
                    # when the newest chunk was in the table: its producers' batches answered
                    newest_ms=None
                    if scanned.newest_at is None
                    else round((scanned.newest_at - started) * 1000, 1),
                    producers=len(table.producers),
                    ms=round((time.monotonic() - started) * 1000, 1),
                )
                return
        finally:
            if not ready.done():
                ready.set_result(None)
            _found(holder)

    async def _rebuilt_transactions(self, topic: LogTopic, partition: int, scan: _Scan) -> None:
        """The scan's transactions into the partition's table: the aborts it met whose range
        was not kept get their object, the open ones are kept where a transaction in progress
        names the partition and aborted otherwise; then the LSO is let go."""
        transactions = self._transactions
        state = topic.partitions[partition].transactions
        if transactions is None:
            return
        try:
            for aborted in scan.aborted:
                if state.aborted_at(aborted.last_offset) is None:
                    state.add_aborted(aborted)
                    await transactions.keep_aborted(topic.name, partition, aborted)
            if scan.open:
                async with asyncio.timeout(REPLICA_WAIT):
                    await transactions.loaded.wait()
            progress = transactions.in_progress(topic.name, partition)
            for producer_id, first in scan.open.items():
                if producer_id in progress:
                    state.open[producer_id] = first
            state.held = None
        except TimeoutError:
            raise StorageError("the transactions' states were not read from etcd") from None
        for producer_id, first in scan.open.items():
            if producer_id not in progress:
                log.warning(
                    "transactions.hanging_aborted",
                    topic=topic.name,
                    partition=partition,
                    producer_id=producer_id,
                    first_offset=first,
                )
                state.open[producer_id] = first
                self._spawn(transactions.abort_hanging(topic.name, partition, producer_id))

    async def _scan_producers(
        self,
        topic: LogTopic,
        partition: int,
        start: int,
        end: int,
        chunks: list[Chunk],
        ready: asyncio.Future[None],
        prefetched: asyncio.Task[list[bytes]] | None = None,
    ) -> tuple[ProducerTable, int, _Scan]:
        """The producers of the batches in [start, end), from their headers: the segments read
        as every reader of the log reads them, the chunks in place `_FOLD_READS` at a time (a
        take-over can find `fold_chunks` of them: one after the other, 500 GETs took seconds),
        newest first, each going into the partition's table as it comes (`_newest_first`)."""
        table = ProducerTable()
        scan = _Scan(table, end)
        floor = min(chunks[0].first, end) if chunks else end
        gate = asyncio.Semaphore(_FOLD_READS)
        loop = asyncio.get_running_loop()
        reads: dict[Chunk, asyncio.Task[list[bytes]]] = {}

        async def read(chunk: Chunk) -> list[bytes]:
            if chunk is not chunks[-1]:
                await asyncio.wait([reads[chunks[-1]]])
            async with gate:
                return await self._tail.read(topic.name, partition, chunk)

        # the newest chunk alone first (it answers an active producer's batches, and should not
        # share the object store with 31 other GETs), then the others newest first (the gate is
        # FIFO) beside the segments
        for chunk in reversed(chunks):
            if chunk is chunks[-1] and prefetched is not None:
                reads[chunk] = prefetched  # started by the take-over
            else:
                reads[chunk] = loop.create_task(read(chunk))
        newest = loop.create_task(self._newest_first(topic, partition, end, reads, ready, scan))
        try:
            if chunks:
                await asyncio.wait([reads[chunks[-1]]])
            await self._scan_segments(topic, partition, start, floor, scan)
            for chunk in chunks if scan.offset < end else []:
                try:
                    batches = await reads[chunk]
                except (ObjectNotFound, ValueError):
                    # a chunk folded and collected meanwhile, or damaged: the reads below go
                    # on from there, through the fold, over damage as readers do
                    break
                if not all(check_batch(b, 0, len(b), 0) for b in batches):
                    break
                if not scan.add(batches):
                    break
            await self._scan_reads(topic, partition, scan.offset, end, scan)
        finally:
            await end_tasks(newest, *reads.values())
        return table, scan.batches, scan

    @staticmethod
    async def _newest_first(
        topic: LogTopic,
        partition: int,
        end: int,
        reads: dict[Chunk, asyncio.Task[list[bytes]]],
        ready: asyncio.Future[None],
        scan: _Scan,
    ) -> None:
        """The chunks' batches into the partition's table newest first, as their reads come,
        while `ready`'s rebuild is the partition's: from the chain's end down, and only while
        each chunk ends where the one above began (a chunk missing or damaged ends it: a batch
        of a producer not found there could be a retry of one in the hole)."""
        holder = topic.partitions[partition]
        below = end
        for chunk, read in reads.items():
            if chunk.end != below:
                return
            await asyncio.wait([read])  # (a cancellation here leaves the read to the scan)
            if read.cancelled() or read.exception() is not None:
                return
            batches = read.result()
            if holder.producers_ready is not ready or ready.done():
                return
            if not all(check_batch(b, 0, len(b), 0) for b in batches):
                return
            for batch in reversed(batches):
                where = batch_location(batch, 0)
                if where.producer_id >= 0 and not where.attributes & CONTROL_FLAG:
                    holder.producers.add_older(
                        where.producer_id,
                        where.base_sequence,
                        where.next_offset - where.base_offset,
                        where.base_offset,
                        where.producer_epoch,
                    )
            below = chunk.first
            if scan.newest_at is None:
                scan.newest_at = time.monotonic()
            _found(holder)

    async def _scan_segments(
        self, topic: LogTopic, partition: int, start: int, floor: int, scan: _Scan
    ) -> None:
        """[start, floor) from the manifest's segments: their sparse indexes, then ranged reads
        from index entries about `READ_BYTES` apart, each `_FOLD_READS` at a time (one after
        the other, 16 MiB of small folded segments is dozens of round trips), then the ordinary
        reads for whatever they left out (a read that failed or met damage, the gaps between)."""
        scan.offset = max(scan.offset, start)
        archive = topic.archive
        if archive is None or start >= floor:
            return await self._scan_reads(topic, partition, start, floor, scan)
        # the segments holding [start, floor), then their indexes, all at once
        firsts: list[int] = []
        offset = start
        for _ in range(_REBUILD_READS):
            if offset >= floor:
                break
            firsts.append(offset)
            following = archive.next_after(topic.name, partition, offset)
            if following is None or following <= offset:
                break
            offset = following
        gate = asyncio.Semaphore(_FOLD_READS)

        async def index(at: int) -> tuple[int, SparseIndex] | None:
            async with gate:
                return await archive.segment_index(topic.name, partition, at)

        starts: list[int] = []
        for first, found in zip(
            firsts, await asyncio.gather(*map(index, firsts), return_exceptions=True), strict=True
        ):
            starts.append(first)
            if found is None or isinstance(found, BaseException):
                continue  # the ordinary reads go over it
            entries = found[1]
            position = next((e.position for e in entries if e.offset >= first), 0)
            for entry in entries:
                if first < entry.offset < floor and entry.position - position >= READ_BYTES:
                    starts.append(entry.offset)
                    position = entry.position

        async def read(at: int) -> list[bytes]:
            async with gate:
                return (await archive.read_span(topic.name, partition, at)).batches

        found_reads = await asyncio.gather(*map(read, starts), return_exceptions=True)
        for batches in found_reads:
            if isinstance(batches, BaseException) or not batches:
                continue  # the ordinary reads below go over it
            first = batch_location(batches[0], 0).base_offset
            if first > scan.offset:  # a gap before it: the ordinary reads fill it
                await self._scan_reads(topic, partition, scan.offset, min(first, floor), scan)
            if scan.offset >= floor or not scan.add(batches):
                break
        await self._scan_reads(topic, partition, scan.offset, floor, scan)

    @staticmethod
    async def _scan_reads(
        topic: LogTopic, partition: int, start: int, end: int, scan: _Scan
    ) -> None:
        scan.offset = max(scan.offset, start)
        for _ in range(_REBUILD_READS):
            if scan.offset >= end:
                return
            found = await topic.read(partition, scan.offset)
            if not found or not scan.add(found):
                return

    # Take-over

    async def _restart(self, topic: LogTopic, partition: int, end: int, manifest: Manifest) -> None:
        """A fresh, empty local log at `end`: below it, reads go to the manifest's segments and
        the tail's chunks in place."""
        holder = topic.partitions[partition]
        old = holder.log
        listeners = list(old._append_listeners)  # the topic's AppendSignal
        await old.close()
        await asyncio.to_thread(remove_tree, old.directory)  # big segments freed in steps
        self._adopt(topic.name, partition, manifest)
        fresh = await asyncio.to_thread(
            PartitionLog.open,
            old.directory,
            log_config(topic.settings),
            end,
            self._catalog.sealed(topic.name, partition),
        )
        fresh.start()
        for listener in listeners:
            fresh.add_append_listener(listener)
        holder.log = fresh
        holder.walked = Walked()  # (what reads found missing below the old log: read again)
        index = topic.last_value
        if index is not None:
            index.restart_partition(partition)
            await self._catalog.catch_up_last_values(topic, index)

    def _adopt(self, topic: str, partition: int, manifest: Manifest) -> None:
        """Reads below the local log go to the manifest's segments and the chunks above them
        read in place, and to nothing else."""
        if self._catalog.uploader is None:
            return
        in_place = [
            replace(c, first=max(c.start, manifest.end))
            for c in self._in_place.get((topic, partition), [])
            if c.next_offset > manifest.end
        ]
        if in_place:
            self._in_place[topic, partition] = in_place
        else:
            self._in_place.pop((topic, partition), None)
        self._catalog.uploader.replace(
            topic,
            partition,
            [UploadedSegment(s.base, s.end, s.size, s.name, s.first) for s in manifest.segments]
            + in_place,
        )

    def _renamed(self, topic: str, partition: int, before: Manifest, after: Manifest) -> None:
        """`after` was written: ours from now on, reads go through it, the chunks below its
        end go, and the objects it no longer names go after a grace period (a reader of the
        previous version, such as a compaction run, may still fetch them)."""
        key = (topic, partition)
        current = self._manifest.get(key)
        if current is not None:  # (None: lost meanwhile; a take-over claims afresh)
            if current.version < after.version:
                self._manifest[key] = after
            self._adopt(topic, partition, self._manifest[key])
        self._spawn(self._tail.collect(topic, partition, after.end))
        retired = before.names() - after.names()
        if retired:
            self._spawn(self._retire(retired))

    async def _retire(self, names: set[str]) -> None:
        await asyncio.sleep(RETIRE_AFTER)
        for name in names:
            for suffix in (".log", ".index"):
                await self._tail.store.delete(f"{name}{suffix}")

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # left for the next round: chunks and retired objects only cost storage
            log.warning("cluster.cleanup_failed", error=str(task.exception()))

    # Folding the tail

    def _fold_soon(self, topic: str, partition: int, after: asyncio.Event | None = None) -> None:
        key = (topic, partition)
        if key not in self._folding:
            task = asyncio.get_running_loop().create_task(self._fold(topic, partition, after))
            self._folding[key] = task
            task.add_done_callback(lambda _: self._folding.pop(key, None))

    async def _fold(self, topic: str, partition: int, after: asyncio.Event | None = None) -> None:
        """Fold the chunks above the manifest's segments, up to what is stored, into one
        segment object and name it: a take-over then lists and reads a bounded tail. Retried
        with doubling delays while the partition is ours."""
        if after is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FOLD_AFTER_TAKE_OVER):
                    await after.wait()
        key = (topic, partition)
        delay = _RETRY_INITIAL
        while (epoch := self._checkpoints.epoch(topic, partition)) is not None:
            known = self._manifest.get(key)
            stored = self._verified.get(key)
            if known is None or stored is None:
                return
            try:
                await self._fold_once(topic, partition, epoch, known, stored)
                return
            except ManifestFenced:
                return
            except (StorageError, ValueError) as exc:
                log.warning("cluster.fold_failed", topic=topic, partition=partition, error=str(exc))
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX)

    async def _fold_once(
        self, topic: str, partition: int, epoch: int, known: Manifest, stored: int
    ) -> None:
        since = self._checkpoints.incarnation(topic)
        state = (await self._tail.state(topic, partition)).since(since)
        _, run = state.resolve(known.end)
        run = [c for c in run if c.end <= stored]
        if not run or run[0].first > known.end:
            return  # nothing to fold (or a gap, reported by the take-over)
        gate = asyncio.Semaphore(_FOLD_READS)

        async def read(chunk: Chunk) -> list[bytes]:
            async with gate:
                return await self._tail.read(topic, partition, chunk)

        batches = [b for found in await asyncio.gather(*map(read, run)) for b in found]
        data, index = fold(batches)
        base = run[0].first
        name = f"{topic}/{partition}/{base:020d}-{epoch:020d}-{uuid.uuid4().hex[:8]}"
        await self._tail.store.put(f"{name}.index", index)
        await self._tail.store.put(f"{name}.log", data)
        entry = SegmentEntry(base, run[-1].end, base, name, len(data))
        try:
            after = await self._manifests.add(topic, partition, epoch, entry, known)
        except ManifestFenced:
            for suffix in (".log", ".index"):
                await self._tail.store.delete(f"{name}{suffix}")
            raise
        self.folds += 1
        self._unfolded[topic, partition] = 0
        self._renamed(topic, partition, known, after)
        log.info(
            "cluster.tail_folded",
            topic=topic,
            partition=partition,
            first=base,
            end=run[-1].end,
            chunks=len(run),
            bytes=len(data),
        )

    # Uploads (the uploader's SegmentPublisher)

    async def name(self, topic: str, partition: int, segment: SealedSegment) -> str | None:
        key = (topic, partition)
        epoch = self._checkpoints.epoch(topic, partition)
        manifest = self._manifest.get(key)
        if epoch is None or manifest is None:
            return None  # not ours
        if segment.next_offset <= manifest.end:
            # held already (by folds, or by the segments a take-over found): uploaded only if
            # it replaces several folds in the manifest (fewer, larger objects)
            base = segment.base_offset
            probe = SegmentEntry(base, segment.next_offset, base, "", segment.size)
            if manifest.adding(probe) is manifest:
                return None
        if segment.base_offset > manifest.end:
            # the chunks below it are not folded yet (a log restarted at a take-over's end, or
            # a segment of ours not named as the partition moved): they keep these offsets,
            # and folds name them. Fold now: every later segment starts above the manifest's
            # end too, so none was named (nor uploaded) until the fold after `fold_chunks` more
            # chunks (test_cluster_manifest: no upload in 20 s after a take-over)
            self._fold_soon(topic, partition)
            log.info(
                "cluster.segment_not_named",
                topic=topic,
                partition=partition,
                base_offset=segment.base_offset,
                segments_end=manifest.end,
            )
            return None
        # only what the tail holds may be named: the end of a sealed segment can hold appends
        # whose PUT has not completed, or never will (the partition moved), and so were never
        # acknowledged; their offsets may be given to other messages by the next owner
        while self._verified.get(key, -1) < segment.next_offset:
            if self._checkpoints.epoch(topic, partition) != epoch or key not in self._verified:
                return None
            moved = self._moved
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_STORED_WAIT):
                    await moved.wait()
        return f"{topic}/{partition}/{segment.base_offset:020d}-{epoch:020d}-{uuid.uuid4().hex[:8]}"

    async def publish(
        self, topic: str, partition: int, segment: UploadedSegment
    ) -> UploadedSegment | None:
        key = (topic, partition)
        epoch = self._checkpoints.epoch(topic, partition)
        known = self._manifest.get(key)
        if epoch is None or known is None:
            return None
        entry = SegmentEntry(
            segment.base_offset,
            segment.next_offset,
            segment.base_offset,
            segment.name,
            segment.size,
        )
        try:
            manifest = await self._manifests.add(topic, partition, epoch, entry, known)
        except ManifestFenced as exc:
            log.warning("cluster.manifest_fenced", topic=topic, partition=partition, error=str(exc))
            return None
        named = next((s for s in manifest.segments if s.name == segment.name), None)
        if named is None:
            return None  # it added nothing (all below the segments' end)
        self._renamed(topic, partition, known, manifest)
        return UploadedSegment(named.base, named.end, named.size, named.name, named.first)

    def _signal_moved(self) -> None:
        self._moved.set()
        self._moved = asyncio.Event()

    async def _load_cursors(self, topic: LogTopic, partition: int, since: int) -> None:
        now = time.monotonic()
        subscriptions = _reliable(topic)
        found = await asyncio.gather(
            *(
                self._checkpoints.get_checkpoint(
                    checkpoint_key(topic.name, s.name, partition), since
                )
                for s in subscriptions
            )
        )
        for subscription, data in zip(subscriptions, found, strict=True):
            if data is None:
                # nobody consumed this partition for it elsewhere: from the oldest stored
                # message (never lose one; a `latest` subscription checkpoints at creation)
                cursor = PartitionCursor.starting_at(
                    min(subscription.core.position(partition), topic.start_offset(partition))
                )
            else:
                cursor = PartitionCursor.decode(data)
            subscription.core.replace_cursor(partition, cursor, now)
            subscription.persist()
            self._written[topic.name, subscription.name, partition] = cursor.encode()

    def _wake_subscriptions(self, topic: str) -> None:
        found = self._catalog.topics.get(topic)
        if isinstance(found, LogTopic):
            for subscription in _reliable(found):
                subscription.wake()

    # Checkpoints

    async def checkpoint_new(self, topic: LogTopic, subscription: str) -> None:
        """A subscription was just created here (in the topic's turn): its start, for the
        partitions taken over here (their take-overs loaded cursors before it existed), unless
        the cluster has a cursor for it there already (it was created on another broker, which
        served the partition before us): that cursor is taken, as by a take-over, and the start
        asked for here applies only where the subscription is new. Otherwise a `latest` start
        would skip what the subscription has not read yet."""
        found = topic.subscriptions.get(subscription)
        now = time.monotonic()
        if not isinstance(found, ReliableSubscription):
            return
        for (name, partition), since in sorted(self._taken.items()):
            if name != topic.name:
                continue
            start = found.core.cursors[partition].encode()
            # the start, unless a cursor is there already: in one transaction, so a commit
            # through another broker between a read and a write is not overwritten
            data = await self._checkpoints.create_checkpoint(
                checkpoint_key(name, subscription, partition), start, since, name
            )
            if data is not None and _nothing_new(data, found.core.cursors[partition].encode()):
                # the start another broker wrote when it created the subscription (or this
                # broker's checkpoint round, racing this): the cursor here stays (the next
                # round writes it over that one); taking it forgot what this broker delivered
                # meanwhile, which was delivered again at once
                start = data
            elif data is not None:
                cursor = PartitionCursor.decode(data)
                found.core.replace_cursor(partition, cursor, now)
                found.persist()
                start = cursor.encode()
            self._written[name, subscription, partition] = start
        found.wake()

    def checkpointed(self, topic: str, subscription: str, partition: int, data: bytes) -> None:
        """This broker wrote a checkpoint itself (a Kafka group's commit of a partition it
        serves): the next write of that cursor goes over it, not a foreign one."""
        self._written[topic, subscription, partition] = data

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            for topic, partition in self._checkpoints.owned():
                # each partition on its own: one that fails (etcd away, or a cursor of its own
                # that cannot be written) is tried again next round, and does not end this round
                # for the partitions after it (a `break` here left every later partition
                # uncheckpointed for as long as the first one failed: a take-over then
                # redelivered all their acks since)
                try:
                    await self._checkpoint_partition(topic, partition)
                except Exception as exc:
                    self.checkpoint_failures += 1
                    log.warning(
                        "cluster.checkpoint_failed",
                        topic=topic,
                        partition=partition,
                        error=str(exc),
                    )

    async def checkpoint_now(self, topic: str, partition: int) -> bool:
        """The partition's changed cursors written now, as the loop writes them (a committed
        transaction's acknowledgements, before the transaction completes); whether a cursor
        took a checkpoint another broker wrote instead (what this broker had is then gone)."""
        return await self._checkpoint_partition(topic, partition)

    async def _checkpoint_partition(self, topic: str, partition: int) -> bool:
        lock = self._checkpointing.setdefault((topic, partition), asyncio.Lock())
        async with lock:
            return await self._checkpoint_locked(topic, partition)

    async def _checkpoint_locked(self, topic: str, partition: int) -> bool:
        """The partition's cursors that moved since they were loaded or last written, each
        written only over what this broker loaded or wrote last. A checkpoint another broker
        wrote since is a Kafka group's commit through its coordinator (nothing else writes a
        checkpoint of a partition this broker owns): it stands, and the cursor here takes it, as
        a seek would. Overwriting it with this broker's copy lost the commit whenever the copy
        had moved for another reason (deliveries to a native consumer, their counts)."""
        found = self._catalog.topics.get(topic)
        since = self._taken.get((topic, partition))
        if not isinstance(found, LogTopic) or since is None:
            return False  # not reliable, or its cursors not loaded here (never taken, or let go)
        adopted = False
        for subscription in _reliable(found):
            data = subscription.core.cursors[partition].encode()
            ident = (topic, subscription.name, partition)
            expected = self._written.get(ident)
            if expected == data:
                continue
            key = checkpoint_key(topic, subscription.name, partition)
            swap = self._checkpoints.swap_checkpoint
            written, theirs = await swap(key, data, expected, since, topic)
            if not written and theirs is None:  # deleted since (the subscription, re-created)
                written, theirs = await swap(key, data, None, since, topic)
            if not written and theirs is not None and _nothing_new(theirs, data):
                # the same acknowledgements (the start another broker's creation of the
                # subscription wrote, met by this round racing our own `checkpoint_new`):
                # ours goes over it, and what is in flight here stays so. Adopting it forgot
                # the deliveries in flight and delivered them again at once, as duplicates
                written, theirs = await swap(key, data, theirs, since, topic)
            if written or theirs is None:
                self._written[ident] = data
                continue
            subscription.core.replace_cursor(
                partition, PartitionCursor.decode(theirs), time.monotonic()
            )
            subscription.persist()
            subscription.wake()
            self._written[ident] = theirs
            log.info(
                "cluster.checkpoint_adopted",
                topic=topic,
                partition=partition,
                subscription=subscription.name,
                floor=PartitionCursor.decode(theirs).floor,
            )
            adopted = True
        return adopted


def _nothing_new(theirs: bytes, ours: bytes) -> bool:
    """Whether a checkpoint another broker wrote says nothing the cursor here does not: the
    same acknowledgements, and no message dispatched that this one has not dispatched too."""
    other, mine = PartitionCursor.decode(theirs), PartitionCursor.decode(ours)
    return (
        other.floor == mine.floor
        and other.acked == mine.acked
        and other.dispatched <= mine.dispatched
    )


class _Scan:
    """A rebuild's progress: batches below `offset` are in the table."""

    def __init__(self, table: ProducerTable, end: int) -> None:
        self.table = table
        self.end = end
        self.offset = 0
        self.batches = 0
        # transactions: each producer's open one (its first offset met), the aborts met
        self.open: dict[int, int] = {}
        self.aborted: list[AbortedRange] = []
        self.newest_at: float | None = None  # when the newest chunk was in the partition's table

    def add(self, batches: list[bytes]) -> bool:
        """Record the batches past `offset` and below the end; False once at the end."""
        for batch in batches:
            where = batch_location(batch, 0)
            if where.base_offset >= self.end:
                self.offset = self.end
                return False
            if where.next_offset <= self.offset:
                continue  # (a chunk may begin below where the segments end)
            self.batches += 1
            if where.attributes & TRANSACTIONAL_FLAG:
                self._transaction(batch, where.producer_id, where.base_offset, where.attributes)
            if where.producer_id >= 0 and not where.attributes & CONTROL_FLAG:
                count = where.next_offset - where.base_offset
                self.table.recover(
                    where.producer_id,
                    where.base_sequence,
                    count,
                    where.base_offset,
                    where.producer_epoch,
                )
            self.offset = where.next_offset
        return True

    def _transaction(self, batch: bytes, producer_id: int, offset: int, attributes: int) -> None:
        if not attributes & CONTROL_FLAG:
            self.open.setdefault(producer_id, offset)
            return
        first = self.open.pop(producer_id, None)
        if first is not None and marker_type(batch) == Marker.ABORT:
            self.aborted.append(AbortedRange(producer_id, first, offset))


def _found(holder: LogPartition) -> None:
    """The partition's rebuild found more (or ended): the produces waiting look again."""
    found = holder.producers_found
    if found is not None and not found.done():
        found.set_result(None)
    holder.producers_found = asyncio.get_running_loop().create_future()


async def _nothing() -> list[tuple[AbortedRange, str]]:
    return []


async def _rebuild_start(topic: LogTopic, partition: int, manifest: Manifest) -> int:
    """Where a producer table's rebuild reads from: the last `REBUILD_BYTES` of the newest
    segments (from an entry of the sparse index of the segment that holds more; all of them if
    they hold less), then the chunks above them."""
    held = 0
    start = manifest.end
    for segment in reversed(manifest.segments):
        start = segment.first
        if held + segment.size < REBUILD_BYTES:
            held += segment.size
            continue
        skip_to = segment.size - (REBUILD_BYTES - held)
        found = None
        if topic.archive is not None:
            found = await topic.archive.segment_index(topic.name, partition, segment.first)
        entries = found[1] if found is not None else SparseIndex()
        later = [e.offset for e in entries if e.position >= skip_to and e.offset >= segment.first]
        if later:
            start = later[0]
        break
    return start


@dataclass(frozen=True, slots=True)
class _Claimed:
    """What a take-over's object-store part found: the partition's history as of our claim."""

    since: int  # the topic's incarnation the claim was made for
    manifest: Manifest
    state: TailState
    end: int  # the chain's end: where our epoch starts
    run: list[Chunk]  # the chain's chunks above the manifest's segments
    aborted: list[tuple[AbortedRange, str]]  # the aborted ranges kept, with their objects' keys
    claim_ms: float
    marker_ms: float
    # the newest chunk's read, started as soon as the listing named it (None: no chunk): the
    # producer table's rebuild starts from it, one GET earlier than after the local part
    newest: asyncio.Task[list[bytes]] | None = None


def _retrieved(task: asyncio.Task[Any]) -> None:
    """A task's failure is its reader's to handle, or nobody's: never an unretrieved warning."""
    if not task.cancelled():
        task.exception()


def _reliable(topic: LogTopic) -> list[ReliableSubscription]:
    return [s for s in topic.subscriptions.values() if isinstance(s, ReliableSubscription)]


__all__ = ["ClusterPartitions", "checkpoint_key"]
