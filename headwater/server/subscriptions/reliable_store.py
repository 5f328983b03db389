"""Reliable subscriptions' definitions and cursors in RocksDB: load, create, seek, delete.

A subscription's definition (`sub/<topic>\\0<name>`) and its cursors (`cursor/...`, one per
partition) are written in one synced WriteBatch when it is created, and removed together when it is
deleted. The callers hold the topic's admin lock (`server.topic_turns`), so a create, a
seek and a delete of one subscription, or a delete of its topic, never interleave. A create first
asks the placement to define it (in a cluster, put-if-absent in etcd): made through two brokers at
once, both make it from the first creator's definition, start included.

A subscription started (or moved) at `snapshot` gets a `SnapshotFeed` over the newest snapshot of
each partition that has a readable one (the others start at earliest); its definition keeps those
horizons, so after a restart a partition whose cursor is still below its horizon goes on reading
the snapshot.

Each reliable topic has one `AppendSignal`, made on its first subscription and registered as the
only append listener of the topic's partition logs (each log's call names its partition), whatever
the number of subscriptions.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import structlog

from headwater.durables.cursor import PartitionCursor
from headwater.durables.delivery import ReliableSettings
from headwater.server.config import ServerConfig
from headwater.server.subscriptions.append_signal import AppendSignal
from headwater.server.subscriptions.deadletter import DeadLetters
from headwater.server.subscriptions.reliable_subscription import ReliableSubscription
from headwater.server.subscriptions.snapshot_feed import SnapshotFeed
from headwater.server.topics.placement import TopicPlacement
from headwater.server.topics.subscription_contract import SubscriptionKind
from headwater.server.topics.topic import LogTopic, Topic
from headwater.storage.objectstore import ObjectStore
from headwater.storage.snapshots import newest_horizons
from headwater.storage.state import CURSOR, SUBSCRIPTION, StateWriter, key
from headwater.storage.wal import PartitionLog
from headwater.wire import messages as m
from headwater.wire.errors import InvalidRequest, StorageError, UnknownSubscription

log = structlog.get_logger(__name__)


class SubscriptionStore:
    def __init__(
        self,
        config: ServerConfig,
        writer: StateWriter,
        dead_letters: DeadLetters,
        placement: TopicPlacement,
        snapshots: ObjectStore | None = None,
    ) -> None:
        self._config = config
        self._snapshots = snapshots
        self._writer = writer
        self._state = writer.store
        self._dead_letters = dead_letters
        self._signals: dict[str, AppendSignal] = {}
        # pumps send only the partitions served here (a cluster's); the placement hears of a
        # subscription created or deleted here (a cluster records it in etcd)
        self._placement = placement

    def signal(self, topic: LogTopic) -> AppendSignal:
        signal = self._signals.get(topic.name)
        if signal is None:
            signal = self._signals[topic.name] = AppendSignal()
            for partition in topic.partitions:
                # each log tells its partition: a FETCH long poll waits for its own only
                partition.log.add_append_listener(partial(signal.fire, partition.index))
        return signal

    def partitions_added(self, topic: LogTopic, logs: list[PartitionLog]) -> None:
        """New partitions (the last `len(logs)` of the topic's) append to the topic's signal too
        (if it has one yet)."""
        signal = self._signals.get(topic.name)
        if signal is not None:
            first = len(topic.partitions) - len(logs)
            for index, partition_log in enumerate(logs, first):
                partition_log.add_append_listener(partial(signal.fire, index))

    def forget_topic(self, name: str) -> None:
        self._signals.pop(name, None)

    def load(self, topic: LogTopic, name: str, definition: dict[str, Any]) -> None:
        cursors = []
        for partition in topic.partitions:
            data = self._state.get(key(CURSOR, topic.name, name, partition.index))
            cursors.append(
                PartitionCursor.decode(data)
                if data
                # a partition with no cursor was added after the subscription: from its start
                else PartitionCursor.starting_at(topic.start_offset(partition.index))
            )
        subscription = self._new(
            topic,
            name,
            m.SubscriptionType(definition["type"]),
            _settings_of(definition),
            cursors,
            self._feed(topic, definition, cursors),
        )
        topic.subscriptions[name] = subscription

    def _feed(
        self, topic: LogTopic, definition: dict[str, Any], cursors: list[PartitionCursor]
    ) -> SnapshotFeed | None:
        """The snapshot a loaded subscription still reads below its horizons, if any."""
        horizons = {
            int(p): h
            for p, h in definition.get("snapshot", {}).items()
            if int(p) < len(cursors) and cursors[int(p)].floor < h
        }
        if not horizons or self._snapshots is None:
            return None
        return SnapshotFeed(self._snapshots, topic.name, horizons)

    async def get_or_create(
        self,
        topic: LogTopic,
        name: str,
        sub_type: m.SubscriptionType,
        settings: m.SubscriptionSettings,
        adopted_start: m.StartPosition | None = None,
    ) -> SubscriptionKind:
        """The existing subscription `name` (of any kind), or a new reliable one. It is made as
        the deployment defines it (`TopicPlacement.define_subscription`): from `sub_type` and
        `settings` unless a cluster defines it already (made through another broker, maybe this
        very moment), whose definition it then takes, its start too unless `adopted_start`
        says otherwise. The caller holds the topic's admin lock."""
        existing = topic.subscriptions.get(name)
        if existing is not None:
            return existing
        resolved = self._resolve(settings)
        ours: dict[str, Any] = {
            "type": int(sub_type),
            "ack_timeout_ms": resolved.ack_timeout_ms,
            "max_deliveries": resolved.max_deliveries,
            "backoff": int(resolved.backoff),
            "backoff_initial_ms": resolved.backoff_initial_ms,
            "backoff_max_ms": resolved.backoff_max_ms,
            "committed_only": resolved.committed_only,
            "start": int(_position(settings.start)),
            "start_value": settings.start_value,
        }
        definition = await self._placement.define_subscription(topic.name, name, ours)
        if definition != ours:
            sub_type = m.SubscriptionType(definition["type"])
            resolved = _settings_of(definition)
            # (a definition written before starts were recorded: from the oldest, lose nothing)
            start = definition.get("start", m.StartPosition.EARLIEST)
            if adopted_start is not None:  # (LATEST is 0)
                start = adopted_start
            definition = {**definition, "start": int(start)}
            definition.pop("snapshot", None)  # (horizons are this broker's own)
            log.info("subscription.adopted", topic=topic.name, subscription=name, start=start)
        offsets, feed = await self._start(
            topic, definition["start"], definition.get("start_value", 0)
        )
        cursors = [PartitionCursor.starting_at(o) for o in offsets]
        if feed is not None:
            definition["snapshot"] = {str(p): h for p, h in feed.horizons.items()}
        puts = {key(SUBSCRIPTION, topic.name, name): json.dumps(definition).encode()}
        for partition, cursor in enumerate(cursors):
            puts[key(CURSOR, topic.name, name, partition)] = cursor.encode()
        await self._writer.synced(puts)
        subscription = self._new(topic, name, sub_type, resolved, cursors, feed)
        topic.subscriptions[name] = subscription
        await self._placement.subscription_created(topic, name, definition)
        log.info(
            "subscription.created",
            topic=topic.name,
            subscription=name,
            type=sub_type.name.lower(),
            start=list(offsets),
        )
        return subscription

    def _new(
        self,
        topic: LogTopic,
        name: str,
        sub_type: m.SubscriptionType,
        settings: ReliableSettings,
        cursors: list[PartitionCursor],
        feed: SnapshotFeed | None = None,
    ) -> ReliableSubscription:
        subscription = ReliableSubscription(
            topic,
            name,
            sub_type,
            settings,
            cursors,
            self._writer,
            self._dead_letters.sender(topic, name),
            self.signal(topic),
            feed,
            self._config.max_decompressed_batch,
        )
        subscription.serves = self._placement.serves
        subscription.start()
        return subscription

    def _resolve(self, settings: m.SubscriptionSettings) -> ReliableSettings:
        defaults = self._config.subscription_defaults
        for field in ("ack_timeout_ms", "max_deliveries", "backoff_initial_ms", "backoff_max_ms"):
            if getattr(settings, field) < 0:
                raise InvalidRequest(f"{field} must be >= 0")
        try:
            backoff = m.Backoff(settings.backoff)
        except ValueError:
            raise InvalidRequest(
                f"unknown backoff {settings.backoff} (0 fixed, 1 exponential)"
            ) from None
        return ReliableSettings(
            ack_timeout_ms=settings.ack_timeout_ms or defaults.ack_timeout_ms,
            max_deliveries=settings.max_deliveries or defaults.max_deliveries,
            backoff=backoff,
            backoff_initial_ms=settings.backoff_initial_ms or defaults.backoff_initial_ms,
            backoff_max_ms=settings.backoff_max_ms or defaults.backoff_max_ms,
            committed_only=bool(settings.committed_only),
        )

    async def start_offsets(self, topic: LogTopic, start: int, value: int) -> list[int]:
        position = _position(start)
        offsets = []
        for partition in topic.partitions:
            earliest = topic.start_offset(partition.index)
            latest = partition.next_offset
            if position == m.StartPosition.LATEST:
                # a Kafka read_committed consumer's latest: a transaction open now (and what
                # follows it) is delivered if it commits
                offsets.append(partition.transactions.stable_end(latest))
            elif position in (m.StartPosition.EARLIEST, m.StartPosition.SNAPSHOT):
                offsets.append(earliest)
            elif position == m.StartPosition.OFFSET:
                offsets.append(min(max(value, earliest), latest))
            else:
                offsets.append(await topic.offset_for_timestamp(partition.index, value))
        return offsets

    async def _start(
        self, topic: LogTopic, start: int, value: int
    ) -> tuple[list[int], SnapshotFeed | None]:
        """Where each partition starts, and the snapshot feed of a `snapshot` start (None when
        no partition has a readable snapshot: then the start is earliest everywhere)."""
        offsets = await self.start_offsets(topic, start, value)
        if start != m.StartPosition.SNAPSHOT or self._snapshots is None:
            return offsets, None
        try:
            horizons = await newest_horizons(self._snapshots, topic.name)
        except StorageError as exc:
            log.error("subscription.snapshot_unreadable", topic=topic.name, error=str(exc))
            return offsets, None
        usable = {
            p: h
            for p, h in horizons.items()
            if p < len(topic.partitions) and 0 < h <= topic.partitions[p].next_offset
        }
        feed = SnapshotFeed(self._snapshots, topic.name, usable)
        for partition in sorted(usable):
            first = await feed.start(partition)
            if first is not None:
                offsets[partition] = first
        return offsets, feed if feed.horizons else None

    async def seek(self, topic: Topic, name: str, start: int, value: int) -> None:
        subscription = topic.subscriptions.get(name)
        if subscription is None:
            raise UnknownSubscription(f"topic {topic.name!r} has no subscription {name!r}")
        if not subscription.persistent or not topic.reliable:
            raise InvalidRequest(
                f"subscription {name!r} of topic {topic.name!r} is not a reliable one: "
                "only those can seek"
            )
        offsets, feed = await self._start(topic, start, value)
        subscription.seek(offsets)
        if isinstance(subscription, ReliableSubscription):
            subscription.snapshot = feed
            definition = self._state.get_json(key(SUBSCRIPTION, topic.name, name))
            before = definition.pop("snapshot", None)
            if feed is not None:
                definition["snapshot"] = {str(p): h for p, h in feed.horizons.items()}
            if definition.get("snapshot") != before:
                await self._writer.put_json(key(SUBSCRIPTION, topic.name, name), definition)
        log.info("subscription.seek", topic=topic.name, subscription=name, start=start, value=value)

    async def delete(self, topic: Topic, name: str) -> None:
        """Close and remove a subscription whose consumers were already detached."""
        subscription = topic.subscriptions.pop(name, None)
        if subscription is None:
            raise UnknownSubscription(f"topic {topic.name!r} has no subscription {name!r}")
        await subscription.close()
        await self._writer.flush()  # no cursor write of it may land after the delete
        self._state.delete_prefix(key(CURSOR, topic.name, name) + b"\0")
        await self._writer.synced(deletes=[key(SUBSCRIPTION, topic.name, name)])
        await self._placement.subscription_deleted(topic.name, name)
        log.info("subscription.deleted", topic=topic.name, subscription=name)


def _position(start: int) -> m.StartPosition:
    try:
        return m.StartPosition(start)
    except ValueError:
        raise InvalidRequest(
            f"unknown start position {start} "
            "(0 latest, 1 earliest, 2 offset, 3 timestamp, 4 snapshot)"
        ) from None


def _settings_of(definition: dict[str, Any]) -> ReliableSettings:
    return ReliableSettings(
        definition["ack_timeout_ms"],
        definition["max_deliveries"],
        m.Backoff(definition["backoff"]),
        definition["backoff_initial_ms"],
        definition["backoff_max_ms"],
        bool(definition.get("committed_only", False)),
    )
