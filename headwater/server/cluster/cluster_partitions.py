"""A cluster broker's side of taking a partition over, handing it off, and losing it.

The etcd coordinator (`server.cluster`) decides who owns each partition; this module is the
`PartitionHandler` it calls, and keeps what a new owner needs where it can find it:

- **acquire** (the ownership key is ours, not yet served): under the topic's turn, list the
  partition's cloud tail (`storage.cloud_tail`), resolve the valid chain and its end E, write our
  epoch's marker at E (first time only), and make the local WAL equal to the chain. The local log
  is kept only when it already ends at E with everything up to E stored by us; otherwise it is
  rebuilt: closed, removed, opened again at the start of the chain's last contiguous run (what is
  below is in uploaded segments, adopted for reads), and the run's batches appended, offsets
  unchanged. Last-value state of a rebuilt partition is cleared and caught up (snapshot + log).
  Then each reliable subscription's cursor for the partition is replaced by the checkpoint the
  previous owner left (unacked messages due again: at-least-once).
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
import shutil
import time
from collections.abc import Callable
from typing import Protocol

import structlog

from headwater.durables.cursor import PartitionCursor
from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.cluster.tail_commit import TailCommitter
from headwater.server.subscriptions.reliable_subscription import ReliableSubscription
from headwater.server.topics.topic import LogTopic
from headwater.server.topics.topic_settings import log_config
from headwater.storage.cloud_tail import Chunk, CloudTail, Hole
from headwater.storage.log_reader import skip
from headwater.storage.uploader import UploadedSegment
from headwater.storage.wal import PartitionLog
from headwater.wire.errors import StorageError
from headwater.wire.records import inspect_batch

log = structlog.get_logger("headwater.cluster")


class Checkpoints(Protocol):
    async def put_checkpoint(self, key: str, value: bytes) -> None: ...

    async def get_checkpoint(self, key: str, since: int = 0) -> bytes | None: ...

    def incarnation(self, name: str) -> int: ...

    def owned(self) -> list[tuple[str, int]]: ...


def checkpoint_key(topic: str, subscription: str, partition: int) -> str:
    return f"{topic}/{subscription}/{partition}"


class ClusterPartitions:
    def __init__(
        self,
        catalog: TopicCatalog,
        tail: CloudTail,
        committer: TailCommitter,
        checkpoints: Checkpoints,
        serves: Callable[[str, int], bool],
        checkpoint_interval: float = 0.5,
    ) -> None:
        self._catalog = catalog
        self._serves = serves
        self._tail = tail
        self._committer = committer
        self._checkpoints = checkpoints
        self._interval = checkpoint_interval
        self._written: dict[tuple[str, str, int], bytes] = {}
        # (topic, partition) -> the offset up to which our local log is known to equal the
        # object store's chain (set by a take-over, moved by our stored chunks)
        self._verified: dict[tuple[str, int], int] = {}
        self._task: asyncio.Task[None] | None = None
        self.rebuilt = 0
        self.kept = 0
        self.wake: Callable[[], None] = lambda: None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._checkpoint_loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def stored(self, topic: str, partition: int, end: int) -> None:
        """The committer stored our chunk up to `end`: subscriptions may now send it."""
        self._verified[topic, partition] = end
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
        async with self._catalog.turn(topic):
            found = self._catalog.topics.get(topic)
            if found is None:
                raise LookupError(f"topic {topic!r} is not known here yet")
            if not isinstance(found, LogTopic):
                return  # non-reliable: nothing is kept, nothing to take over
            started = time.monotonic()
            await self._committer.settle(topic, partition)
            # what a deleted topic of the same name left in the shared store is not ours
            since = self._checkpoints.incarnation(topic)
            state = (await self._tail.state(topic, partition)).since(since)
            end, run = state.resolve()
            if epoch not in state.markers:
                await self._tail.mark_epoch(topic, partition, epoch, end)
            local = found.partitions[partition].log
            if local.next_offset == end and self._verified.get((topic, partition)) == end:
                self.kept += 1
            else:
                await self._rebuild(found, partition, run, end)
                self.rebuilt += 1
            self._verified[topic, partition] = end
            await self._load_cursors(found, partition, since)
            log.info(
                "cluster.partition_acquired",
                topic=topic,
                partition=partition,
                epoch=epoch,
                end=end,
                chunks=len(run),
                ms=round((time.monotonic() - started) * 1000, 1),
            )
        self._wake_subscriptions(topic)

    async def release(self, topic: str, partition: int) -> None:
        with contextlib.suppress(Exception):
            await self._committer.drain(topic, partition)
        await self._checkpoint_partition(topic, partition, force=True)
        log.info("cluster.partition_released", topic=topic, partition=partition)

    def lost(self, topic: str, partition: int) -> None:
        self._committer.reset(topic, partition)
        self._verified.pop((topic, partition), None)
        log.warning("cluster.partition_lost", topic=topic, partition=partition)

    # Take-over

    async def _rebuild(self, topic: LogTopic, partition: int, run: list[Chunk], end: int) -> None:
        start = run[0].first if run else end
        # everything is fetched before the old log is touched: a failed read leaves it as it was
        # checked batches; a damaged one comes from an uploaded copy, else as a Hole to skip
        batches = await self._tail.read_run(topic.name, partition, run)
        segments = await self._segments(topic.name, partition, start)
        holder = topic.partitions[partition]
        old = holder.log
        listeners = list(old._append_listeners)  # the topic's AppendSignal
        await old.close()
        await asyncio.to_thread(shutil.rmtree, old.directory, True)
        if self._catalog.uploader is not None:
            self._catalog.uploader.adopt(topic.name, partition, segments)
        fresh = await asyncio.to_thread(
            PartitionLog.open,
            old.directory,
            log_config(topic.settings),
            start,
            self._catalog.sealed(topic.name, partition),
        )
        try:
            for batch in batches:
                if isinstance(batch, Hole):
                    if batch.end > fresh.next_offset >= batch.first:
                        first = fresh.next_offset
                        skip(topic.name, partition, first, batch.reason, holder)
                        fresh.skip_to(batch.end)
                        continue
                    if batch.end <= fresh.next_offset:
                        continue
                    raise StorageError(
                        f"{topic.name}/{partition}: the cloud tail jumps from "
                        f"{fresh.next_offset} to {batch.first}"
                    )
                info = inspect_batch(batch)
                if info.base_offset < fresh.next_offset:
                    continue  # the run's first chunk may start inside an uploaded segment
                if info.base_offset != fresh.next_offset:
                    raise StorageError(
                        f"{topic.name}/{partition}: the cloud tail jumps from "
                        f"{fresh.next_offset} to {info.base_offset}"
                    )
                fresh.append(batch, info.record_count)
        except BaseException:
            await fresh.close()
            raise
        fresh.start()
        for listener in listeners:
            fresh.add_append_listener(listener)
        holder.log = fresh
        holder.producers.producers.clear()  # the previous owner's sequences are not known here
        index = topic.last_value
        if index is not None:
            index.restart_partition(partition)
            await self._catalog.catch_up_last_values(topic, index)

    async def _segments(self, topic: str, partition: int, start: int) -> list[UploadedSegment]:
        """The segments in the object store below `start`, as the archive needs them."""
        prefix = f"{topic}/{partition}/"
        found = sorted(
            (int(o.key[len(prefix) : -len(".log")]), o.size)
            for o in await self._tail.store.list(prefix)
            if o.key.endswith(".log") and o.key.count("/") == 2
        )
        segments = []
        for i, (base, size) in enumerate(found):
            following = found[i + 1][0] if i + 1 < len(found) else start
            if base < start:
                segments.append(UploadedSegment(base, max(following, base + 1), size))
        return segments

    async def _load_cursors(self, topic: LogTopic, partition: int, since: int) -> None:
        now = time.monotonic()
        for subscription in _reliable(topic):
            data = await self._checkpoints.get_checkpoint(
                checkpoint_key(topic.name, subscription.name, partition), since
            )
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
        """A subscription was just created here: its start, for the partitions owned here,
        unless the cluster has a cursor for it there already (it was created on another broker,
        which served the partition before us): that cursor is taken, as by a take-over, and
        the start asked for here applies only where the subscription is new. Otherwise a
        `latest` start would skip what the subscription has not read yet."""
        found = topic.subscriptions.get(subscription)
        since = self._checkpoints.incarnation(topic.name)
        now = time.monotonic()
        for name, partition in self._checkpoints.owned():
            if name != topic.name:
                continue
            data = await self._checkpoints.get_checkpoint(
                checkpoint_key(name, subscription, partition), since
            )
            if data is not None and isinstance(found, ReliableSubscription):
                cursor = PartitionCursor.decode(data)
                found.core.replace_cursor(partition, cursor, now)
                found.persist()
                self._written[name, subscription, partition] = cursor.encode()
                continue
            await self._checkpoint_partition(name, partition, force=True, only=subscription)
        if isinstance(found, ReliableSubscription):
            found.wake()

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            for topic, partition in self._checkpoints.owned():
                try:
                    await self._checkpoint_partition(topic, partition)
                except Exception as exc:  # etcd away: the next round tries again
                    log.warning(
                        "cluster.checkpoint_failed",
                        topic=topic,
                        partition=partition,
                        error=str(exc),
                    )
                    break

    async def _checkpoint_partition(
        self, topic: str, partition: int, force: bool = False, only: str | None = None
    ) -> None:
        found = self._catalog.topics.get(topic)
        if not isinstance(found, LogTopic):
            return
        for subscription in _reliable(found):
            if only is not None and subscription.name != only:
                continue
            data = subscription.core.cursors[partition].encode()
            ident = (topic, subscription.name, partition)
            if not force and self._written.get(ident) == data:
                continue
            await self._checkpoints.put_checkpoint(
                checkpoint_key(topic, subscription.name, partition), data
            )
            self._written[ident] = data


def _reliable(topic: LogTopic) -> list[ReliableSubscription]:
    return [s for s in topic.subscriptions.values() if isinstance(s, ReliableSubscription)]


__all__ = ["ClusterPartitions", "checkpoint_key"]
