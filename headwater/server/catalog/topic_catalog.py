"""The topic catalog: topics, their files, state and lifecycle.

It owns what outlives a connection: topic metadata in RocksDB, one WAL per reliable partition under
`<data_dir>/topics/<topic>/<partition>/`, the uploader that ships sealed segments to the object
store, and the housekeeping loop (`server.catalog.housekeeping`). Reliable subscriptions' state is
in `server.subscriptions.reliable_store`, producer ids in `server.topics.idempotent_producers`,
dead-letter topics in `server.subscriptions.deadletter`. Synced state writes go through the
catalog's `StateWriter` (group commit off the event loop); `close` flushes it before the logs are
closed.

Admin operations run in a turn of their topic name (`server.topic_turns`) from start to
end, so they never interleave with each other, with subscribe or with the last-value catch-up. The
broker takes the turn (`turn`) when it reads the request, so the methods here that say so expect the
caller to hold it.

A delete is made to stick before anything is removed: one synced WriteBatch deletes the topic's
key and records `deleting/<topic>`; then subscriptions and logs are closed, the files, state keys
(subscriptions, cursors, producers, last values, uploads) removed, and the marker deleted last. A
crash anywhere in between leaves the marker, and the next start (or a create of the same name)
finishes the removal, so a deleted topic never comes back and a re-created name never inherits
the old topic's files or state: the create waits for the delete's lock and starts from nothing.

A create that fails part-way (say at the fd limit, 700 partitions into 1,024) closes every log it
opened and removes its directory before answering STORAGE_ERROR: nothing leaks.

Last-value state is built on first use (`enable_last_value`) by a catch-up over each partition's
history, from the newest snapshot's horizon on when the state is behind a snapshot
(`LastValueIndex.bootstrap`). The index is attached to the topic before the catch-up starts, so
appends made meanwhile are applied at once for partitions already caught up and read from the WAL
for the others; readers wait for `index.ready`. The catch-up takes each batch through the index
as its append did (`_replay`): plain batches applied, transactional ones held, markers ending
their transactions (docs/DURABLES.md, "Transactions").
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import structlog

from headwater.durables.lastvalue import KeyedBatch
from headwater.server.catalog.bounded import bounded_gather
from headwater.server.catalog.housekeeping import HOUSEKEEPING_INTERVAL, housekeep_once
from headwater.server.config import ServerConfig, TopicSettings
from headwater.server.schemas.schema_registry import SchemaRegistry
from headwater.server.subscriptions.deadletter import LAST_VALUE_CONFIGS, DeadLetters
from headwater.server.subscriptions.reliable_store import SubscriptionStore
from headwater.server.topic_turns import NameLocks, Turn
from headwater.server.topics.idempotent_producers import ProducerIds
from headwater.server.topics.lastvalue_index import LastValueIndex
from headwater.server.topics.placement import LocalPlacement, TopicPlacement
from headwater.server.topics.topic import Archive, LogTopic, MemoryTopic, Topic
from headwater.server.topics.topic_settings import (
    log_config,
    parse_settings,
    settings_from_json,
    settings_to_configs,
    settings_to_json,
)
from headwater.server.topics.transaction_index import TransactionIndexes
from headwater.storage.fileio import remove_tree
from headwater.storage.lastvalue_store import drop_last_values
from headwater.storage.snapshots import HorizonCache
from headwater.storage.state import (
    CURSOR,
    LOG_START,
    PRODUCER,
    SUBSCRIPTION,
    TOPIC,
    TXN_ABORTED,
    TXN_OPEN,
    StateStore,
    StateWriter,
    key,
)
from headwater.storage.tasks import end_tasks
from headwater.storage.uploader import Uploader
from headwater.storage.wal import PartitionLog, SealedSegment
from headwater.wire import messages as m
from headwater.wire.errors import InvalidRequest, StorageError, TopicExists, UnknownTopic
from headwater.wire.limits import MAX_PARTITIONS
from headwater.wire.markers import Marker, marker_type, peek
from headwater.wire.names import check_topic_name
from headwater.wire.records import Record, read_records

log = structlog.get_logger(__name__)

# partitions created (or added) after which what the server holds is frozen out of the cyclic
# collector again (`TopicCatalog.grew`)
REFREEZE_PARTITIONS = 1_000
OPEN_THREADS = 8  # partitions of a new topic opened at a time (`_open_new`)

DELETING = b"deleting/"  # a delete in progress: its files and state keys are still being removed


class TopicCatalog:
    def __init__(
        self,
        config: ServerConfig,
        state: StateStore,
        uploader: Uploader | None = None,
        archive: Archive | None = None,
        placement: TopicPlacement | None = None,
    ) -> None:
        """`placement`: the deployment this broker serves in (`server.topics.placement`; one
        broker, `LocalPlacement`, by default)."""
        self._config = config
        self.placement: TopicPlacement = placement or LocalPlacement()
        self._state = state
        self.writer = StateWriter(state)
        self.producers = ProducerIds(self.writer)
        self.transaction_indexes = TransactionIndexes(self.writer)
        self.uploader = uploader
        # newest snapshot horizons, for describe (docs/COMPACTION.md)
        self.horizons = HorizonCache(uploader.store) if uploader is not None else None
        self._archive = archive
        self.topics: dict[str, Topic] = {}
        self._housekeeping: asyncio.Task[None] | None = None
        self._locks = NameLocks()
        self._grown = 0  # partitions added since the last gc.freeze (`grew`)
        self.dead_letters = DeadLetters(
            self.topics, self._locks, self.placement, self.create_locked
        )
        self.subscriptions = SubscriptionStore(
            config,
            self.writer,
            self.dead_letters,
            self.placement,
            uploader.store if uploader else None,
        )
        self.schemas = SchemaRegistry(state, self.writer)

    def _topic_dir(self, name: str) -> Path:
        return self._config.data_dir / "topics" / name

    # for `server.requests.create_partitions`, which adds partitions to an open topic
    topic_dir = _topic_dir

    @property
    def state(self) -> StateStore:
        return self._state

    def sealed(self, topic: str, partition: int) -> Callable[[SealedSegment], None]:
        return self._sealed(topic, partition)

    def turn(self, name: str, produces_pass: bool = False) -> Turn:
        """A place, taken now, in the line of operations on topic name `name` (`produces_pass`:
        one produces need not wait for, `topic_turns.NameLocks.turn`)."""
        return self._locks.turn(name, produces_pass)

    def busy(self, name: str) -> bool:
        return self._locks.busy(name)

    def blocks_produce(self, name: str) -> bool:
        return self._locks.blocks_produce(name)

    # Startup and shutdown

    async def open(self) -> None:
        """Load topics and subscriptions from state; open and recover every WAL."""
        await self._finish_deletions()
        entries = [(raw.decode(), json.loads(value)) for raw, value in self._state.scan(TOPIC)]
        opened = await self._open_all_reliable(entries)
        for name, data in entries:
            dispatch = m.DispatchMode(data["dispatch"])
            if dispatch == m.DispatchMode.RELIABLE:
                self.topics[name] = opened[name]
            else:
                self.topics[name] = MemoryTopic(m.TopicInfo(name, data["partitions"], dispatch))
            if "last_value" in data:
                try:
                    await self.enable_last_value(self.topics[name], data["last_value"]["key_field"])
                except Exception:  # one topic's state must not keep the server down
                    log.exception("last_value.rebuild_failed", topic=name)
        for topic in self.topics.values():
            if not topic.reliable:
                continue
            for partition in topic.partitions:
                partition.log.start()
                for segment in partition.log.sealed_segments():
                    self._sealed(topic.name, partition.index)(segment)
        self.producers.load(self.topics)
        await self.transaction_indexes.load(self.topics)
        self.schemas.load(self.topics)
        for raw_key, value in self._state.scan(SUBSCRIPTION):
            topic_name, name = raw_key.decode().split("\0")
            owner = self.topics.get(topic_name)
            if owner is None or not owner.reliable:
                continue
            self._load_subscription(owner, name, json.loads(value))
        self._housekeeping = asyncio.get_running_loop().create_task(self._housekeep())
        log.info("catalog.opened", topics=len(self.topics))

    def _load_subscription(self, topic: LogTopic, name: str, definition: dict[str, int]) -> None:
        self.subscriptions.load(topic, name, definition)

    async def _open_all_reliable(
        self, entries: list[tuple[str, dict[str, Any]]]
    ) -> dict[str, LogTopic]:
        """Open and recover the reliable topics' WALs, several at a time: an open is mostly
        waiting on the disk (the lease's fsyncs), and one after another 10,000 topics took
        minutes to start."""
        reliable = [(n, d) for n, d in entries if d["dispatch"] == m.DispatchMode.RELIABLE]
        defaults = self._config.topic_defaults
        topics = await bounded_gather(
            (
                asyncio.to_thread(
                    self._open_reliable,
                    name,
                    data["partitions"],
                    settings_from_json(data.get("settings", {}), defaults),
                )
                for name, data in reliable
            ),
            _OPENING_AT_ONCE,
        )
        return {name: topic for (name, _), topic in zip(reliable, topics, strict=True)}

    def _open_reliable(self, name: str, partitions: int, settings: TopicSettings) -> LogTopic:
        logs = [
            PartitionLog.open_or_offline(
                self._topic_dir(name) / str(p),
                log_config(settings),
                on_sealed=self._sealed(name, p),
            )
            for p in range(partitions)
        ]
        info = m.TopicInfo(name, partitions, m.DispatchMode.RELIABLE, settings_to_configs(settings))
        topic = LogTopic(info, settings, logs, self._archive, self.placement.durability)
        for partition in range(partitions):  # where DeleteRecords moved each start to
            moved = self._state.get(key(LOG_START, name, partition))
            if moved is not None:
                topic.deleted_below[partition] = int(moved)
        return topic

    async def delete_records(self, topic: LogTopic, partition: int, offset: int) -> int:
        """Move `partition`'s start to `offset` (never back, never past its end), synced before
        it is answered; the start it is now. Nothing is read below it any more; the segments
        below it go as retention takes them."""
        start = max(
            topic.start_offset(partition), min(offset, topic.partitions[partition].next_offset)
        )
        if start > topic.deleted_below.get(partition, 0):
            await self.writer.synced({key(LOG_START, topic.name, partition): str(start).encode()})
            topic.deleted_below[partition] = max(topic.deleted_below.get(partition, 0), start)
        return topic.start_offset(partition)

    def _sealed(self, topic: str, partition: int) -> Callable[[SealedSegment], None]:
        def enqueue(segment: SealedSegment) -> None:
            if self.uploader is not None:
                self.uploader.enqueue(topic, partition, segment)

        return enqueue

    async def _housekeep(self) -> None:
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL)
            try:
                housekeep_once(self.topics, self.uploader)
                for topic in list(self.topics.values()):
                    if topic.reliable:  # aborted ranges retention took past can hide nothing
                        for partition in topic.partitions:
                            start = topic.start_offset(partition.index)
                            self.transaction_indexes.forget_below(topic, partition, start)
            except Exception:
                log.exception("catalog.housekeeping_failed")

    async def close(self) -> None:
        """Let running admin operations finish (bounded), then seal and fsync every WAL, persist
        every cursor, upload what is pending (bounded)."""
        self._locks.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._config.shutdown_timeout):
                await self._locks.idle()
        await end_tasks(self._housekeeping)
        topics = list(self.topics.values())
        subscriptions = [s for t in topics for s in list(t.subscriptions.values())]
        await bounded_gather((s.close() for s in subscriptions), _CLOSING_AT_ONCE)
        await self.writer.flush()
        seal = self.uploader is not None
        # a partition's close is a few fsyncs; one after another, 10,000 topics took longer than
        # the shutdown timeout, while the disk takes many at once about as fast as one
        await bounded_gather((topic.close(seal) for topic in topics), _CLOSING_AT_ONCE)
        if self.uploader is not None:
            uploaded = await self.uploader.drain(self._config.shutdown_timeout)
            if not uploaded:
                log.warning("catalog.upload_incomplete", pending=self.uploader.pending)
            await self.uploader.close()

    # Topics

    def grew(self, partitions: int) -> None:
        """`partitions` were added (a topic created or grown). What a partition holds lives as
        long as it (its log, index, tail cache, subscriptions' state: some hundred objects):
        once `REFREEZE_PARTITIONS` were added since, what the server holds now is frozen out
        of the cyclic collector (`gc.freeze`, as after start-up), or every full collection
        walks it again. 10,000 partitions made after start-up turned each one into a 300-400 ms
        stall of the loop (loadtest/hostile_bench.py, docs/BENCHMARKS.md). Only what is alive
        now is frozen, objects freed by their count still go; a cycle alive now and dropped
        later is not collected, which is why this is by growth, not by time."""
        self._grown += partitions
        if self._grown >= REFREEZE_PARTITIONS:
            self._grown = 0
            gc.freeze()

    async def create_topic(self, request: m.CreateTopicRequest) -> Topic:
        check_topic_name(request.name)
        async with self._locks.hold(request.name):
            return await self.create_locked(request)

    async def create_locked(self, request: m.CreateTopicRequest) -> Topic:
        """Create a topic; the caller holds the lock of its name."""
        check_topic_name(request.name)
        if not 1 <= request.partitions <= MAX_PARTITIONS:
            raise InvalidRequest(
                f"partitions must be 1..{MAX_PARTITIONS}, not {request.partitions}"
            )
        try:
            dispatch = m.DispatchMode(request.dispatch)
        except ValueError:
            raise InvalidRequest(
                f"unknown dispatch mode {request.dispatch} (0 non-reliable, 1 reliable)"
            ) from None
        schema_configs, configs = self.schemas.split_configs(request.configs)
        if dispatch == m.DispatchMode.NON_RELIABLE and configs:
            raise InvalidRequest(
                "non-reliable topics take no configs but schema.* (they keep nothing)"
            )
        last_value = {c.name: c.value for c in configs if c.name in LAST_VALUE_CONFIGS}
        settings = parse_settings(
            [c for c in configs if c.name not in LAST_VALUE_CONFIGS],
            self._config.topic_defaults,
        )
        if last_value.get("last.value", "true") not in ("true", "false"):
            raise InvalidRequest("last.value must be true or false")
        key_field = last_value.get("key.field", "")
        wants_last_value = last_value.get("last.value") == "true" or bool(key_field)
        if request.name in self.topics:
            raise TopicExists(f"topic {request.name!r} already exists")
        if self._state.get(key(DELETING, request.name)) is not None:
            await self._purge(request.name)  # a delete of this name that did not finish
            if self._state.get(key(DELETING, request.name)) is not None:
                raise StorageError(
                    f"the files of deleted topic {request.name!r} could not be removed yet; "
                    "see the server log"
                )
        schemas, schema_puts = await self.schemas.prepare(request.name, schema_configs)
        data: dict[str, object] = {"partitions": request.partitions, "dispatch": int(dispatch)}
        topic: Topic
        if dispatch == m.DispatchMode.RELIABLE:
            data["settings"] = settings_to_json(settings)
            topic = await self._open_new(request.name, request.partitions, settings)
            for partition in topic.partitions:
                partition.log.start()
        else:
            topic = MemoryTopic(m.TopicInfo(request.name, request.partitions, dispatch))
        try:
            topic_key = {key(TOPIC, request.name): json.dumps(data).encode()}
            await self.writer.synced(topic_key | (schema_puts if schema_configs else {}))
        except BaseException:
            await self._discard(topic)
            raise
        self.topics[request.name] = topic
        if schema_configs:
            self.schemas.install(schemas)
        if wants_last_value:
            await self.enable_last_value(topic, key_field)
        log.info(
            "topic.created",
            topic=request.name,
            partitions=request.partitions,
            dispatch=dispatch.name.lower(),
        )
        self.grew(request.partitions)
        return topic

    async def _open_new(self, name: str, partitions: int, settings: TopicSettings) -> LogTopic:
        """Open a new topic's logs; on failure close those already open and remove them."""
        directory = self._topic_dir(name)
        # Files of a name with no topic in the state are a create that crashed before recording
        # it: not this topic's data.
        await asyncio.to_thread(shutil.rmtree, directory, True)
        if self.uploader is not None:
            self.uploader.forget_topic(name)
        logs: list[PartitionLog] = []
        failed_at: list[int] = []

        def open_one(p: int) -> PartitionLog:
            return PartitionLog.open(
                directory / str(p), log_config(settings), on_sealed=self._sealed(name, p)
            )

        def open_all() -> None:
            # a few at a time: a partition's files are made durable with four fsyncs, one after
            # the other (10 ms on a loaded disk): 1,001 partitions took 10-30 s in one thread.
            # On a failure, those not started are not, and every one opened is in `logs`
            with ThreadPoolExecutor(OPEN_THREADS, thread_name_prefix="hw-open") as pool:
                opening = [pool.submit(open_one, p) for p in range(partitions)]
                error: BaseException | None = None
                for p, future in enumerate(opening):
                    try:
                        logs.append(future.result())
                    except BaseException as exc:
                        if error is None:
                            error = exc
                            failed_at.append(p)
                            for later in opening[p + 1 :]:
                                later.cancel()
                    # (a cancelled one raises CancelledError: nothing was opened)
            if error is not None:
                raise error

        opening = asyncio.ensure_future(asyncio.to_thread(open_all))
        try:
            await asyncio.shield(opening)
        except BaseException as exc:
            # Cancelled or failed: the thread may still be opening; let it end, then close
            # everything it opened, so no fd outlives the failed create.
            with contextlib.suppress(BaseException):
                await opening
            await self._close_logs(logs)
            await asyncio.to_thread(shutil.rmtree, directory, True)
            log.warning("topic.create_failed", topic=name, opened=len(logs), error=str(exc))
            if not isinstance(exc, OSError):
                raise
            raise StorageError(
                f"cannot create topic {name!r}: partition "
                f"{failed_at[0] if failed_at else len(logs)} of {partitions}: "
                f"{exc.strerror or exc}"
            ) from None
        info = m.TopicInfo(name, partitions, m.DispatchMode.RELIABLE, settings_to_configs(settings))
        topic = LogTopic(info, settings, logs, self._archive, self.placement.durability)
        self.transaction_indexes.attach(topic)
        return topic

    async def _discard(self, topic: Topic) -> None:
        if topic.reliable:
            await self._close_logs([p.log for p in topic.partitions])
            await asyncio.to_thread(remove_tree, self._topic_dir(topic.name))

    @staticmethod
    async def _close_logs(logs: list[PartitionLog]) -> None:
        """Close the logs of a topic whose files are removed next (deleted, or not created):
        neither synced nor leased, and a few at a time (one after the other, deleting a topic
        of 1,001 partitions took 15 s)."""

        async def close(partition_log: PartitionLog) -> None:
            with contextlib.suppress(OSError):
                await partition_log.close(discard=True)

        await bounded_gather((close(partition_log) for partition_log in logs), _CLOSING_AT_ONCE)

    async def delete_topic(self, name: str, on_removed: Callable[[Topic], None]) -> None:
        """Delete topic `name` (the caller holds its turn): `on_removed` runs once it is gone
        from `topics`, before any await, to tell its consumers."""
        topic = self.topics.get(name)
        if topic is None:
            raise UnknownTopic(f"topic {name!r} does not exist")
        await self.writer.synced({key(DELETING, name): b""}, [key(TOPIC, name)])
        del self.topics[name]
        self.schemas.forget(name)
        on_removed(topic)
        for subscription in list(topic.subscriptions.values()):
            await subscription.close()
        topic.subscriptions.clear()
        self.subscriptions.forget_topic(name)
        if topic.reliable:
            await self._close_logs([p.log for p in topic.partitions])
        await self.writer.flush()  # no queued write of the topic may land after the purge
        await self._purge(name)
        log.info("topic.deleted", topic=name)

    async def _purge(self, name: str) -> None:
        """Remove a deleted topic's files and state keys, then its `deleting/` marker (kept if
        the files could not all be removed, so the removal is tried again)."""
        directory = self._topic_dir(name)
        await asyncio.to_thread(remove_tree, directory)
        for prefix in (SUBSCRIPTION, CURSOR, PRODUCER, LOG_START, TXN_OPEN, TXN_ABORTED):
            self._state.delete_prefix(key(prefix, name) + b"\0")
        drop_last_values(self._state, name)
        self._state.delete_prefix(self.schemas.purge_prefix(name))
        if self.uploader is not None:
            self.uploader.forget_topic(name)
        if directory.exists():
            log.warning("topic.delete_incomplete", topic=name, directory=str(directory))
            return
        await self.writer.synced(deletes=[key(DELETING, name)])

    async def _finish_deletions(self) -> None:
        for raw_name, _ in list(self._state.scan(DELETING)):
            name = raw_name.decode()
            log.info("topic.delete_resumed", topic=name)
            await self._purge(name)

    # Last-value state

    async def enable_last_value(self, topic: Topic, key_field: str = "") -> LastValueIndex:
        """Keep the last value per key of `topic` from now on, built first from its history
        (FTL's dynamic durables: the first last-value subscriber or map request pays for it).
        The caller holds the topic's turn (or the server is starting)."""
        topic = last_value_topic(topic)
        if topic.last_value is not None:
            return topic.last_value  # built by an earlier turn
        index = LastValueIndex(self._state, topic.name, len(topic.partitions), key_field)
        topic.last_value = index  # appends apply from here on, in offset order (see apply)
        try:
            await self._catch_up(topic, index)
            data = self._state.get_json(key(TOPIC, topic.name))
            data["last_value"] = {"key_field": key_field}
            await self.writer.put_json(key(TOPIC, topic.name), data)
        except BaseException:
            topic.last_value = None
            raise
        index.ready = True
        configs = [*topic.info.configs, m.ConfigEntry("last.value", "true")]
        if key_field:
            configs.append(m.ConfigEntry("key.field", key_field))
        topic.info = dataclasses.replace(topic.info, configs=tuple(configs))
        log.info(
            "last_value.enabled",
            topic=topic.name,
            keys=index.size(),
            replayed=index.replayed,
            snapshots=index.snapshot_horizons,
        )
        return index

    async def catch_up_last_values(self, topic: LogTopic, index: LastValueIndex) -> None:
        """A partition's state was restarted (a cluster take-over): apply what it misses."""
        await self._catch_up(topic, index)

    async def _catch_up(self, topic: LogTopic, index: LastValueIndex) -> None:
        """Apply every stored record the index has not seen. A partition, once caught up, stays
        so: its later appends start at its position and `Topic.append` applies them."""
        store = self.uploader.store if self.uploader is not None else None
        horizons = await index.snapshots(store, [p.next_offset for p in topic.partitions])
        for partition in topic.partitions:
            p = partition.index
            await index.bootstrap(
                store, p, topic.start_offset(p), partition.next_offset, horizons.get(p)
            )
            index.skip_to(p, topic.start_offset(p))
            while index.applied(p) < partition.next_offset:
                skipped = partition.skipped
                batches = await topic.read(p, index.applied(p))
                if not batches:
                    if (
                        partition.skipped > skipped
                        and index.applied(p) < partition.log.start_offset
                    ):
                        # the read skipped damaged or missing archived data (logged and counted)
                        # and found nothing after it up to where its walk stopped (the local
                        # log, or its walk limit): go on from there (a damaged last tail chunk
                        # failed every take-over of the partition; going on at the local log
                        # after a walk cut short skipped the archived records past the hole)
                        goes_on = partition.walked.past(index.applied(p))[1]
                        if goes_on <= index.applied(p):  # (no walk noted: the local log)
                            goes_on = partition.log.start_offset
                        index.skip_to(p, goes_on)
                        continue
                    if index.applied(p) >= partition.log.start_offset:
                        # nothing stored from here to the end: offsets a recovery skipped
                        index.skip_to(p, partition.next_offset)
                        break
                    raise StorageError(
                        f"cannot read partition {p} of topic {topic.name!r} at offset "
                        f"{index.applied(p)} to build its last values"
                    )
                for batch in batches:
                    _replay(index, p, batch)


def last_value_topic(topic: Topic) -> LogTopic:
    """`topic`, if it can keep last values (it is reliable)."""
    if not topic.reliable:
        raise InvalidRequest(
            f"topic {topic.name!r} is non-reliable: last-value and map durables need a "
            "reliable topic"
        )
    return topic


def _replay(index: LastValueIndex, partition: int, batch: bytes) -> None:
    """One stored batch through the index as its append went through it: a plain batch applied,
    a transactional one held, a marker ending its producer's transaction (so a transaction open
    across a restart is applied when its marker comes, and an aborted one never is)."""
    header = peek(batch)
    if header.base_offset > index.applied(partition):
        # skipped damage or a recovery gap: those offsets hold no record
        index.skip_to(partition, header.base_offset)
    if header.control:
        commit = marker_type(batch) == Marker.COMMIT
        index.end_transaction(partition, header.producer_id, header.base_offset, commit)
        return
    position = index.applied(partition)
    records = [r for r in read_records(batch) if r.offset >= position]
    if not records:
        return
    keyed = KeyedBatch.of_records(records, [_key_or_none(index, record) for record in records])
    if header.transactional:
        index.hold(partition, header.producer_id, records[0].offset, keyed)
    else:
        index.apply(partition, records[0].offset, keyed)
    index.replayed += len(records)


def _key_or_none(index: LastValueIndex, record: Record) -> bytes | None:
    """History written before the state existed may hold records without a usable key."""
    try:
        return index.key_of(record)
    except InvalidRequest:
        return None


_CLOSING_AT_ONCE = 64
_OPENING_AT_ONCE = 16  # the default executor's threads bound it further
