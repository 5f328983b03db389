"""The topic catalog: topics and reliable subscriptions, their files, state and lifecycle.

It owns what outlives a connection: topic metadata and subscription state in RocksDB, one WAL per
reliable partition under `<data_dir>/topics/<topic>/<partition>/`, the uploader that ships sealed
segments to the object store, and the housekeeping loop that rolls old segments (so uploads lag
by at most `segment.ms`) and applies local retention, deleting only segments already uploaded
(or any sealed segment when no object store is configured).

A reliable subscription's dead-letter topic, `<topic>-<subscription>-DLQ`, is created on first use
as a reliable topic with the source topic's settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import shutil
import time
from pathlib import Path

import structlog

from durables.cursor import PartitionCursor
from durables.lastvalue import LastValueIndex
from durables.producers import ProducerEntry
from server.config import ServerConfig, TopicSettings
from server.lastvalue import LastValueSubscription
from server.reliable import ReliableSettings, ReliableSubscription
from server.subscription import Subscription
from server.topic_settings import (
    log_config,
    parse_settings,
    settings_from_json,
    settings_to_configs,
    settings_to_json,
)
from server.topics import Archive, Topic
from storage.state import (
    CURSOR,
    NEXT_PRODUCER_ID,
    PRODUCER,
    SUBSCRIPTION,
    TOPIC,
    StateStore,
    key,
)
from storage.uploader import Uploader
from storage.wal import FsyncPolicy, PartitionLog
from wire import messages as m
from wire.errors import InvalidRequest, TopicExists, UnknownTopic
from wire.limits import MAX_PARTITIONS
from wire.names import check_topic_name
from wire.records import Record, build_batch, read_records

log = structlog.get_logger("headwater.catalog")

HOUSEKEEPING_INTERVAL = 1.0


class TopicCatalog:
    def __init__(
        self,
        config: ServerConfig,
        state: StateStore,
        uploader: Uploader | None = None,
        archive: Archive | None = None,
    ) -> None:
        self._config = config
        self._state = state
        self.uploader = uploader
        self._archive = archive
        self.topics: dict[str, Topic] = {}
        self._housekeeping: asyncio.Task[None] | None = None
        self._creating: dict[tuple[str, str], asyncio.Future[ReliableSubscription]] = {}
        self._enabling: dict[str, asyncio.Future[LastValueIndex]] = {}

    def _topic_dir(self, name: str) -> Path:
        return self._config.data_dir / "topics" / name

    # Startup and shutdown

    async def open(self) -> None:
        """Load topics and subscriptions from state; open and recover every WAL."""
        for raw_name, value in self._state.scan(TOPIC):
            name = raw_name.decode()
            data = json.loads(value)
            dispatch = m.DispatchMode(data["dispatch"])
            if dispatch == m.DispatchMode.RELIABLE:
                settings = settings_from_json(data.get("settings", {}), self._config.topic_defaults)
                self.topics[name] = await asyncio.to_thread(
                    self._open_reliable, name, data["partitions"], settings
                )
            else:
                self.topics[name] = Topic(m.TopicInfo(name, data["partitions"], dispatch))
            if "last_value" in data:
                try:
                    await self.enable_last_value(self.topics[name], data["last_value"]["key_field"])
                except Exception:  # one topic's state must not keep the server down
                    log.exception("last_value.rebuild_failed", topic=name)
        for topic in self.topics.values():
            for partition in topic.partitions:
                if partition.log is not None:
                    partition.log.start()
                    for segment in partition.log.sealed_segments():
                        self._sealed(topic.name, partition.index)(segment)
        for raw_key, value in self._state.scan(PRODUCER):
            topic_name, index, producer_id = raw_key.decode().split("\0")
            owner = self.topics.get(topic_name)
            if owner is not None and int(index) < len(owner.partitions):
                table = owner.partitions[int(index)].producers
                table.producers[int(producer_id)] = ProducerEntry.decode(value)
        for topic in self.topics.values():
            for partition in topic.partitions:
                if partition.log is None:
                    continue
                partition.forget_lost_producer_batches()
                for found in partition.log.recovered_batches():
                    if found.producer_id >= 0:
                        partition.producers.recover(
                            found.producer_id,
                            found.base_sequence,
                            found.next_offset - found.base_offset,
                            found.base_offset,
                        )
        for raw_key, value in self._state.scan(SUBSCRIPTION):
            topic_name, name = raw_key.decode().split("\0")
            owner = self.topics.get(topic_name)
            if owner is None:
                continue
            self._load_subscription(owner, name, json.loads(value))
        self._housekeeping = asyncio.get_running_loop().create_task(self._housekeep())
        log.info("catalog.opened", topics=len(self.topics))

    def _load_subscription(self, topic: Topic, name: str, definition: dict[str, int]) -> None:
        cursors = []
        for partition in topic.partitions:
            data = self._state.get(key(CURSOR, topic.name, name, partition.index))
            cursors.append(
                PartitionCursor.decode(data)
                if data
                else PartitionCursor.starting_at(partition.next_offset)
            )
        subscription = self._new_subscription(
            topic,
            name,
            m.SubscriptionType(definition["type"]),
            ReliableSettings(
                definition["ack_timeout_ms"],
                definition["max_deliveries"],
                m.Backoff(definition["backoff"]),
                definition["backoff_initial_ms"],
                definition["backoff_max_ms"],
                bool(definition.get("committed_only", False)),
            ),
            cursors,
        )
        topic.subscriptions[name] = subscription

    def _open_reliable(self, name: str, partitions: int, settings: TopicSettings) -> Topic:
        logs = [
            PartitionLog.open_or_offline(
                self._topic_dir(name) / str(p),
                log_config(settings),
                on_sealed=self._sealed(name, p),
            )
            for p in range(partitions)
        ]
        info = m.TopicInfo(name, partitions, m.DispatchMode.RELIABLE, settings_to_configs(settings))
        return Topic(info, settings, logs, self._archive)

    def _sealed(self, topic: str, partition: int):  # type: ignore[no-untyped-def]
        def enqueue(segment):  # type: ignore[no-untyped-def]
            if self.uploader is not None:
                self.uploader.enqueue(topic, partition, segment)

        return enqueue

    async def close(self) -> None:
        """Seal and fsync every WAL, persist every cursor, upload what is pending (bounded)."""
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeping
        for topic in self.topics.values():
            for subscription in topic.subscriptions.values():
                await subscription.close()
        seal = self.uploader is not None
        for topic in self.topics.values():
            for partition in topic.partitions:
                if partition.log is not None:
                    await partition.log.close(seal_active=seal)
        if self.uploader is not None:
            uploaded = await self.uploader.drain(self._config.shutdown_timeout)
            if not uploaded:
                log.warning("catalog.upload_incomplete", pending=self.uploader.pending)
            await self.uploader.close()

    # Topics

    async def create_topic(self, request: m.CreateTopicRequest) -> Topic:
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
        if dispatch == m.DispatchMode.NON_RELIABLE and request.configs:
            raise InvalidRequest("non-reliable topics take no configs (they keep nothing)")
        last_value = {c.name: c.value for c in request.configs if c.name in LAST_VALUE_CONFIGS}
        settings = parse_settings(
            [c for c in request.configs if c.name not in LAST_VALUE_CONFIGS],
            self._config.topic_defaults,
        )
        if last_value.get("last.value", "true") not in ("true", "false"):
            raise InvalidRequest("last.value must be true or false")
        key_field = last_value.get("key.field", "")
        wants_last_value = last_value.get("last.value") == "true" or bool(key_field)
        if request.name in self.topics:
            raise TopicExists(f"topic {request.name!r} already exists")
        data: dict[str, object] = {"partitions": request.partitions, "dispatch": int(dispatch)}
        if dispatch == m.DispatchMode.RELIABLE:
            data["settings"] = settings_to_json(settings)
            topic = await asyncio.to_thread(
                self._open_reliable, request.name, request.partitions, settings
            )
            for partition in topic.partitions:
                assert partition.log is not None
                partition.log.start()
        else:
            topic = Topic(m.TopicInfo(request.name, request.partitions, dispatch))
        if request.name in self.topics:  # created meanwhile by another connection
            raise TopicExists(f"topic {request.name!r} already exists")
        self.topics[request.name] = topic
        self._state.put_json(key(TOPIC, request.name), data, sync=True)
        if wants_last_value:
            await self.enable_last_value(topic, key_field)
        log.info(
            "topic.created",
            topic=request.name,
            partitions=request.partitions,
            dispatch=dispatch.name.lower(),
        )
        return topic

    async def delete_topic(self, topic: Topic) -> None:
        if self.topics.get(topic.name) is not topic:
            raise UnknownTopic(f"topic {topic.name!r} does not exist")
        del self.topics[topic.name]
        for subscription in topic.subscriptions.values():
            await subscription.close()
        topic.subscriptions.clear()
        for partition in topic.partitions:
            if partition.log is not None:
                await partition.log.close()
        self._state.delete_prefix(key(SUBSCRIPTION, topic.name) + b"\0")
        self._state.delete_prefix(key(CURSOR, topic.name) + b"\0")
        self._state.delete_prefix(key(PRODUCER, topic.name) + b"\0")
        if topic.last_value is not None:
            topic.last_value.drop()
        if self.uploader is not None:
            self.uploader.forget_topic(topic.name)
        self._state.write(deletes=[key(TOPIC, topic.name)], sync=True)
        await asyncio.to_thread(shutil.rmtree, self._topic_dir(topic.name), True)
        log.info("topic.deleted", topic=topic.name)

    # Last-value state

    async def enable_last_value(self, topic: Topic, key_field: str = "") -> LastValueIndex:
        """Keep the last value per key of `topic` from now on, built first from its history
        (FTL's dynamic durables: the first last-value subscriber or map request pays for it)."""
        if topic.last_value is not None:
            return topic.last_value
        if not topic.reliable:
            raise InvalidRequest(
                f"topic {topic.name!r} is non-reliable: last-value and map durables need a "
                "reliable topic"
            )
        pending = self._enabling.get(topic.name)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[LastValueIndex] = asyncio.get_running_loop().create_future()
        self._enabling[topic.name] = future
        try:
            index = LastValueIndex(self._state, topic.name, len(topic.partitions), key_field)
            await self._catch_up(topic, index)
            topic.last_value = index  # no await since the catch-up ended: no append missed
            data = self._state.get_json(key(TOPIC, topic.name))
            data["last_value"] = {"key_field": key_field}
            self._state.put_json(key(TOPIC, topic.name), data, sync=True)
            configs = [*topic.info.configs, m.ConfigEntry("last.value", "true")]
            if key_field:
                configs.append(m.ConfigEntry("key.field", key_field))
            topic.info = dataclasses.replace(topic.info, configs=tuple(configs))
            future.set_result(index)
            log.info("last_value.enabled", topic=topic.name, keys=index.size())
            return index
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()
            raise
        finally:
            del self._enabling[topic.name]

    async def _catch_up(self, topic: Topic, index: LastValueIndex) -> None:
        """Apply every stored record the index has not seen, partition by partition."""
        for partition in topic.partitions:
            offset = max(index.applied(partition.index), topic.start_offset(partition.index))
            while offset < partition.next_offset:
                batches = await topic.read(partition.index, offset)
                if not batches:
                    break
                for batch in batches:
                    records = read_records(batch)
                    keys = [_key_or_none(index, record) for record in records]
                    index.apply(partition.index, records[0].offset, records, keys)
                    offset = records[-1].offset + 1

    # Idempotent producers

    def new_producer_id(self) -> int:
        producer_id = int(self._state.get(NEXT_PRODUCER_ID) or b"0")
        self._state.write({NEXT_PRODUCER_ID: str(producer_id + 1).encode()}, sync=True)
        return producer_id

    def issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < int(self._state.get(NEXT_PRODUCER_ID) or b"0")

    def save_producer(
        self, topic: Topic, partition: int, producer_id: int, entry: ProducerEntry
    ) -> None:
        """Persist an idempotent producer's state with the batch it just appended (reliable)."""
        if topic.reliable:
            sync = topic.settings is not None and topic.settings.fsync == FsyncPolicy.ALWAYS
            self._state.write(
                {key(PRODUCER, topic.name, partition, producer_id): entry.encode()}, sync=sync
            )

    # Reliable subscriptions

    async def subscription(
        self,
        topic: Topic,
        name: str,
        sub_type: m.SubscriptionType,
        settings: m.SubscriptionSettings,
    ) -> Subscription | ReliableSubscription | LastValueSubscription:
        """The existing subscription `name`, or a new one created from `settings`."""
        existing = topic.subscriptions.get(name)
        if existing is not None:
            return existing
        ident = (topic.name, name)
        pending = self._creating.get(ident)
        if pending is not None:  # another consumer is creating it right now
            return await asyncio.shield(pending)
        future: asyncio.Future[ReliableSubscription] = asyncio.get_running_loop().create_future()
        self._creating[ident] = future
        try:
            resolved = self._resolve(settings)
            offsets = await self.start_offsets(topic, settings.start, settings.start_value)
            cursors = [PartitionCursor.starting_at(o) for o in offsets]
            definition = {
                "type": int(sub_type),
                "ack_timeout_ms": resolved.ack_timeout_ms,
                "max_deliveries": resolved.max_deliveries,
                "backoff": int(resolved.backoff),
                "backoff_initial_ms": resolved.backoff_initial_ms,
                "backoff_max_ms": resolved.backoff_max_ms,
                "committed_only": resolved.committed_only,
            }
            puts = {key(SUBSCRIPTION, topic.name, name): json.dumps(definition).encode()}
            for partition, cursor in enumerate(cursors):
                puts[key(CURSOR, topic.name, name, partition)] = cursor.encode()
            self._state.write(puts, sync=True)
            subscription = self._new_subscription(topic, name, sub_type, resolved, cursors)
            topic.subscriptions[name] = subscription
            future.set_result(subscription)
            log.info(
                "subscription.created",
                topic=topic.name,
                subscription=name,
                type=sub_type.name.lower(),
                start=list(offsets),
            )
            return subscription
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it
            raise
        finally:
            del self._creating[ident]

    def _new_subscription(
        self,
        topic: Topic,
        name: str,
        sub_type: m.SubscriptionType,
        settings: ReliableSettings,
        cursors: list[PartitionCursor],
    ) -> ReliableSubscription:
        subscription = ReliableSubscription(
            topic, name, sub_type, settings, cursors, self._state, self._dead_letter(name)
        )
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

    async def start_offsets(self, topic: Topic, start: int, value: int) -> list[int]:
        try:
            position = m.StartPosition(start)
        except ValueError:
            raise InvalidRequest(
                f"unknown start position {start} (0 latest, 1 earliest, 2 offset, 3 timestamp)"
            ) from None
        offsets = []
        for partition in topic.partitions:
            earliest = topic.start_offset(partition.index)
            latest = partition.next_offset
            if position == m.StartPosition.LATEST:
                offsets.append(latest)
            elif position == m.StartPosition.EARLIEST:
                offsets.append(earliest)
            elif position == m.StartPosition.OFFSET:
                offsets.append(min(max(value, earliest), latest))
            else:
                offsets.append(await topic.offset_for_timestamp(partition.index, value))
        return offsets

    async def seek(self, topic: Topic, name: str, start: int, value: int) -> None:
        subscription = topic.subscriptions.get(name)
        if not isinstance(subscription, ReliableSubscription):
            raise InvalidRequest(
                f"topic {topic.name!r} has no reliable subscription {name!r} to seek"
            )
        subscription.reset(await self.start_offsets(topic, start, value))
        log.info("subscription.seek", topic=topic.name, subscription=name, start=start, value=value)

    async def delete_subscription(self, topic: Topic, name: str) -> None:
        subscription = topic.subscriptions.pop(name, None)
        if subscription is None:
            raise InvalidRequest(f"topic {topic.name!r} has no subscription {name!r}")
        await subscription.close()
        self._state.delete_prefix(key(CURSOR, topic.name, name) + b"\0")
        self._state.write(deletes=[key(SUBSCRIPTION, topic.name, name)], sync=True)

    def _dead_letter(self, subscription: str):  # type: ignore[no-untyped-def]
        async def send(topic_name: str, partition: int, record: Record, deliveries: int) -> None:
            source = self.topics[topic_name]
            dlq_name = dead_letter_topic(topic_name, subscription)
            dlq = self.topics.get(dlq_name)
            if dlq is None:
                dlq = await self.create_topic(
                    m.CreateTopicRequest(dlq_name, 1, m.DispatchMode.RELIABLE, source.info.configs)
                )
            headers = [
                *record.headers,
                ("headwater.dlq.topic", topic_name.encode()),
                ("headwater.dlq.partition", str(partition).encode()),
                ("headwater.dlq.offset", str(record.offset).encode()),
                ("headwater.dlq.deliveries", str(deliveries).encode()),
            ]
            batch = build_batch([(record.key, record.value, headers)], timestamp=record.timestamp)
            target = dlq.partitions[0]
            _, sequence = dlq.append(target, batch, 1)
            assert target.log is not None
            await target.log.wait_durable(sequence)
            log.info(
                "subscription.dead_lettered",
                topic=topic_name,
                subscription=subscription,
                partition=partition,
                offset=record.offset,
                deliveries=deliveries,
                dlq=dlq_name,
            )

        return send

    # Housekeeping: age-based rolling and local retention

    async def _housekeep(self) -> None:
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL)
            try:
                self.housekeep_once()
            except Exception:
                log.exception("catalog.housekeeping_failed")

    def housekeep_once(self) -> None:
        now = time.time()
        for topic in list(self.topics.values()):
            settings = topic.settings
            if settings is None:
                continue
            for partition in topic.partitions:
                partition_log = partition.log
                assert partition_log is not None
                partition_log.roll_if_old()
                sealed = partition_log.sealed_segments()
                total = partition_log.size
                for segment in sealed:
                    too_big = 0 <= settings.retention_bytes < total
                    age_ms = (now - segment.path.stat().st_mtime) * 1000
                    too_old = 0 <= settings.retention_ms < age_ms
                    if not (too_big or too_old):
                        break
                    if self.uploader is not None and not self.uploader.is_uploaded(
                        topic.name, partition.index, segment.base_offset
                    ):
                        break  # never delete what only exists here
                    if partition_log.delete_segment(segment.base_offset):
                        total -= segment.size
                        log.info(
                            "retention.deleted",
                            topic=topic.name,
                            partition=partition.index,
                            base_offset=segment.base_offset,
                        )


LAST_VALUE_CONFIGS = ("last.value", "key.field")


def _key_or_none(index: LastValueIndex, record: Record) -> bytes | None:
    """History written before the state existed may hold records without a usable key."""
    try:
        return index.key_of(record)
    except InvalidRequest:
        return None


def dead_letter_topic(topic: str, subscription: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", subscription)
    return f"{topic}-{safe}-DLQ"[:249]
