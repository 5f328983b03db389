"""Operator requests: ALTER_TOPIC_CONFIGS, LIST_SUBSCRIPTIONS, SERVER_INFO, and the storage of each
partition that DESCRIBE_TOPIC reports.

An alter runs in the topic's turn (`server.topic_turns`, taken by the broker), like create
and delete. Every named config is checked before anything changes: an unknown name, a bad value or a
config that cannot change after creation (`partitions`, `dispatch`, `key.field` once last-value
state exists, `last.value=false`) refuses the whole request with INVALID_REQUEST naming it. Then the
last-value state is built if asked (the one slow step), the new settings are written to the topic's
state key (synced, so they survive a restart) and applied at once: each partition's WAL takes the
new `LogConfig` (segment size and age apply from its next roll, the fsync policy from its next
append, the syncer reads its interval every round) and housekeeping reads retention from
`topic.settings` on every pass.

LIST_SUBSCRIPTIONS and SERVER_INFO only read. A reliable subscription's counts come from its
cursor per partition: `committed` (every offset below is acknowledged), `dispatched` (the first
offset never delivered), the in-flight deliveries (`unacked`); what was delivered and is neither
acked nor in flight waits for redelivery. SERVER_INFO's data-dir usage comes from one walk in a
worker thread at a time, reused for `DISK_USAGE_TTL` seconds: every request walking on its own
let one connection pipelining thousands of them fill the shared worker threads, and the fsyncs of
every other client's produce waited behind the walks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import structlog

from headwater.server import open_files
from headwater.server.build_info import version
from headwater.server.catalog.topic_catalog import TopicCatalog, last_value_topic
from headwater.server.config import TopicSettings
from headwater.server.memory_budget import MAX_MEMORY_PRINCIPALS_SHOWN, MemoryBudget
from headwater.server.reply import AfterWork, Reply
from headwater.server.request_table import handles
from headwater.server.subscriptions.deadletter import LAST_VALUE_CONFIGS
from headwater.server.subscriptions.reliable_subscription import ReliableSubscription
from headwater.server.topics.topic import LogTopic, Topic
from headwater.server.topics.topic_settings import (
    TOPIC_CONFIG_NAMES,
    log_config,
    parse_settings,
    settings_to_configs,
    settings_to_json,
)
from headwater.storage.state import TOPIC, key
from headwater.wire import messages as m
from headwater.wire.errors import InvalidRequest, UnknownTopic

log = structlog.get_logger(__name__)

_STARTED: Final = time.time()  # the module is imported when the server starts
DISK_USAGE_TTL: Final = 1.0

# Configs fixed at creation, and what to do instead.
FIXED_CONFIGS: Final = {
    "partitions": "the partition count is changed with CREATE_PARTITIONS "
    "(`headwater topic alter NAME --partitions N`), not a config",
    "dispatch": "a topic's dispatch mode is fixed at creation: create a new topic",
}


class AdminHandlers:
    def __init__(
        self,
        catalog: TopicCatalog,
        data_dir: Path,
        connections: Callable[[], int],
        memory: MemoryBudget | None = None,
        max_connections: int = 0,
    ) -> None:
        self._memory = memory or MemoryBudget(0)
        self._max_connections = max_connections
        self._catalog = catalog
        self._data_dir = data_dir
        self._connections = connections
        self._usage: asyncio.Future[int] | None = None  # the walk running or last finished
        self._usage_at = -DISK_USAGE_TTL

    def _topic(self, name: str) -> Topic:
        topic = self._catalog.topics.get(name)
        if topic is None:
            raise UnknownTopic(f"topic {name!r} does not exist")
        return topic

    # ALTER_TOPIC_CONFIGS

    @handles(m.AlterTopicConfigsRequest, "name", "admin", in_turn=True)
    def alter_topic_configs(self, session: object, request: m.AlterTopicConfigsRequest) -> Reply:
        return AfterWork(self._alter(request))

    async def _alter(self, request: m.AlterTopicConfigsRequest) -> Reply:
        topic = self._topic(request.name)
        if not request.configs:
            raise InvalidRequest("name at least one config to change (NAME=VALUE)")
        names = [entry.name for entry in request.configs]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise InvalidRequest(f"config {repeated[0]!r} given more than once")
        for entry in request.configs:
            reason = FIXED_CONFIGS.get(entry.name)
            if reason is not None:
                raise InvalidRequest(f"config {entry.name!r} cannot be changed: {reason}")
            if entry.name not in TOPIC_CONFIG_NAMES and entry.name not in LAST_VALUE_CONFIGS:
                known = sorted((*TOPIC_CONFIG_NAMES, *LAST_VALUE_CONFIGS))
                raise InvalidRequest(
                    f"unknown topic config {entry.name!r} (known: {', '.join(known)})"
                )
        wanted = {e.name: e.value for e in request.configs if e.name in LAST_VALUE_CONFIGS}
        settings_entries = [e for e in request.configs if e.name not in LAST_VALUE_CONFIGS]
        key_field = self._check_last_value(topic, wanted)
        if settings_entries and not topic.reliable:
            raise InvalidRequest(
                f"topic {topic.name!r} is non-reliable: it keeps nothing, so it has no "
                f"{', '.join(e.name for e in settings_entries)} to change"
            )
        settings = parse_settings(settings_entries, topic.settings) if topic.reliable else None
        if key_field is not None:
            await self._catalog.enable_last_value(topic, key_field)
        if topic.reliable and settings is not None and settings_entries:
            await self._apply(topic, settings)
        log.info(
            "topic.altered",
            topic=topic.name,
            configs={e.name: e.value for e in request.configs},
        )
        return m.AlterTopicConfigsResponse(topic.info)

    @staticmethod
    def _check_last_value(topic: Topic, wanted: dict[str, str]) -> str | None:
        """The key field to build last-value state with, None to leave it as it is."""
        if not wanted:
            return None
        enable = wanted.get("last.value", "true")
        if enable not in ("true", "false"):
            raise InvalidRequest(f"last.value must be true or false, not {enable!r}")
        key_field = wanted.get("key.field", "")
        existing = topic.last_value
        if enable == "false":
            if existing is not None:
                raise InvalidRequest(
                    f"config 'last.value' cannot be changed to false: topic {topic.name!r} "
                    "keeps last-value state, which cannot be turned off (delete and re-create "
                    "the topic)"
                )
            if "key.field" in wanted:
                raise InvalidRequest("key.field needs last.value=true")
            return None
        last_value_topic(topic)  # refuses a non-reliable topic
        if existing is not None:
            if "key.field" in wanted and key_field != existing.key_field:
                raise InvalidRequest(
                    f"config 'key.field' cannot be changed: topic {topic.name!r} keeps its "
                    f"last values by key field {existing.key_field!r} (fixed once the state "
                    "exists)"
                )
            return None
        return key_field

    async def _apply(self, topic: LogTopic, settings: TopicSettings) -> None:
        catalog = self._catalog
        data = catalog.writer.store.get_json(key(TOPIC, topic.name))
        data["settings"] = settings_to_json(settings)
        await catalog.writer.put_json(key(TOPIC, topic.name), data)
        topic.settings = settings
        for partition in topic.partitions:
            wal = partition.log
            wal.config = dataclasses.replace(
                log_config(settings), tail_cache_bytes=wal.config.tail_cache_bytes
            )
            wal.syncer.wake()  # an fsync interval or policy change takes effect now
        kept = tuple(c for c in topic.info.configs if c.name in LAST_VALUE_CONFIGS)
        configs = (*settings_to_configs(settings), *kept)
        topic.info = dataclasses.replace(topic.info, configs=configs)

    # LIST_SUBSCRIPTIONS

    @handles(m.ListSubscriptionsRequest, "topic", "consume", topic_optional=True)
    def list_subscriptions(
        self, session: object, request: m.ListSubscriptionsRequest
    ) -> m.ListSubscriptionsResponse:
        if request.topic:
            topics = [self._topic(request.topic)]
        else:
            topics = [t for _, t in sorted(self._catalog.topics.items())]
        details = []
        for topic in topics:
            for _, subscription in sorted(topic.subscriptions.items()):
                info = subscription.info()
                if isinstance(subscription, ReliableSubscription):
                    details.append(_reliable_detail(topic, subscription, info))
                else:
                    details.append(_live_detail(topic, int(subscription.durable), info))
        return m.ListSubscriptionsResponse(tuple(details))

    # SERVER_INFO

    # server-wide counts and the data directory, as the operator's HTTP port shows them
    @handles(m.ServerInfoRequest, None, "admin")
    def server_info(self, session: object, request: m.ServerInfoRequest) -> Reply:
        return AfterWork(self._server_info())

    async def _server_info(self) -> Reply:
        topics = self._catalog.topics
        now = time.time()
        used = await self._data_dir_bytes()
        limit = open_files.open_files_limit()
        return m.ServerInfoResponse(
            version=version(),
            started_ms=int(_STARTED * 1000),
            uptime_ms=int((now - _STARTED) * 1000),
            connections=self._connections(),
            topic_count=len(topics),
            subscription_count=sum(len(t.subscriptions) for t in list(topics.values())),
            data_dir=str(self._data_dir.resolve()),
            data_dir_bytes=used,
            memory_budget_bytes=self._memory.max_bytes,
            memory_used_bytes=self._memory.used,
            memory_principal_share_bytes=self._memory.principal_max_bytes,
            memory_principals=tuple(
                m.PrincipalMemory(principal, used)
                for principal, used in self._memory.largest(MAX_MEMORY_PRINCIPALS_SHOWN)
            ),
            open_files_limit=limit,
            partitions_allowed=open_files.partitions_allowed(limit, self._max_connections),
        )

    async def _data_dir_bytes(self) -> int:
        now = time.monotonic()
        if self._usage is None or (self._usage.done() and now - self._usage_at > DISK_USAGE_TTL):
            # rare admin work: asyncio's default executor (docs/OPERATIONS.md, Threads)
            self._usage = asyncio.ensure_future(asyncio.to_thread(disk_usage, self._data_dir))
            self._usage_at = now
        return await asyncio.shield(self._usage)

    # DESCRIBE_TOPIC's storage

    def partitions(self, topic: Topic) -> tuple[m.PartitionInfo, ...]:
        """Storage per partition of a reliable topic (a non-reliable one stores nothing)."""
        if not topic.reliable:
            return ()
        uploader = self._catalog.uploader
        result = []
        for partition in topic.partitions:
            wal = partition.log
            segments = wal._segments  # read only: the WAL has no public list of its segments
            next_offset = partition.next_offset
            uploaded_offset = lag_offsets = lag_bytes = 0
            if uploader is None:
                uploaded_offset = -1
            else:
                uploaded = uploader.uploaded(topic.name, partition.index)
                uploaded_offset = uploaded[-1].next_offset if uploaded else 0
                local_from = max(uploaded_offset, wal.start_offset)
                lag_offsets = max(next_offset - local_from, 0)
                lag_bytes = sum(s.size for s in segments if s.next_offset > uploaded_offset)
            result.append(
                m.PartitionInfo(
                    partition=partition.index,
                    start_offset=topic.start_offset(partition.index),
                    next_offset=next_offset,
                    local_start_offset=wal.start_offset,
                    size_bytes=wal.size,
                    segments=len(segments),
                    uploaded_offset=uploaded_offset,
                    upload_lag_offsets=lag_offsets,
                    upload_lag_bytes=lag_bytes,
                )
            )
        return tuple(result)


def _reliable_detail(
    topic: Topic, subscription: ReliableSubscription, info: m.SubscriptionInfo
) -> m.SubscriptionDetail:
    core = subscription.core
    partitions = []
    for partition in topic.partitions:
        index = partition.index
        if index >= len(core.cursors):
            continue  # a partition added after the subscription was loaded
        cursor = core.cursors[index]
        end = partition.next_offset
        lag = max(end - cursor.floor - len(cursor.acked), 0)
        backlog = max(end - cursor.dispatched, 0)
        unacked = core.in_flight(index)
        partitions.append(
            m.SubscriptionPartition(
                partition=index,
                committed=cursor.floor,
                dispatched=cursor.dispatched,
                next_offset=end,
                backlog=backlog,
                lag=lag,
                unacked=unacked,
                redelivering=max(lag - backlog - unacked, 0),
                dead_lettered=core.dead_lettered_by_partition.get(index, 0),
            )
        )
    return m.SubscriptionDetail(
        topic=topic.name,
        name=subscription.name,
        sub_type=int(subscription.sub_type),
        durable=int(subscription.durable),
        consumers=len(info.consumers),
        backlog=sum(p.backlog for p in partitions),
        lag=sum(p.lag for p in partitions),
        unacked=sum(p.unacked for p in partitions),
        redelivering=sum(p.redelivering for p in partitions),
        delivered=info.delivered,
        dropped=info.dropped,
        dead_lettered=info.dead_lettered,
        partitions=tuple(partitions),
    )


def _live_detail(topic: Topic, durable: int, info: m.SubscriptionInfo) -> m.SubscriptionDetail:
    """Non-reliable and last-value subscriptions: no cursor, so no per-partition counts."""
    return m.SubscriptionDetail(
        topic=topic.name,
        name=info.name,
        sub_type=info.sub_type,
        durable=durable,
        consumers=len(info.consumers),
        backlog=max(info.pending - info.unacked, 0),
        lag=info.pending,
        unacked=info.unacked,
        redelivering=0,
        delivered=info.delivered,
        dropped=info.dropped,
        dead_lettered=info.dead_lettered,
        partitions=(),
    )


def disk_usage(directory: Path) -> int:
    """Bytes of the regular files under `directory` (files removed meanwhile are skipped), each
    file once however many names it has: a local object store's segments are hard links to the
    WAL's, and counting both would report twice the disk in use."""
    total = 0
    seen: set[tuple[int, int]] = set()
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                status = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if status.st_nlink > 1:
                if (status.st_dev, status.st_ino) in seen:
                    continue
                seen.add((status.st_dev, status.st_ino))
            total += status.st_size
    return total
