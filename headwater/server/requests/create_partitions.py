"""CREATE_PARTITIONS: a topic grows to more partitions (never fewer).

The handler runs in the topic's turn (`server.topic_turns`), so it never interleaves with a
create, a delete, a subscribe or another alter of the topic; produce and consumer requests go on
meanwhile and see the new partitions from the moment they are published, all at once, with no await
in between:

1. a reliable topic's new WALs are opened (`<topic>/<p>/`, each directory emptied first: files
   there are a crash's leftovers of an alter that was never recorded, so they hold no record);
2. one synced WriteBatch records the new count in the topic's key and a cursor at offset 0 for
   each new partition of every reliable subscription. A kill -9 before it leaves the topic as it
   was (the next alter empties the directories again); after it, a restart opens the new
   partitions with the subscriptions' cursors at their beginning;
3. the partitions join the topic, the subscriptions (reliable ones track the new cursors, so
   nothing produced to a new partition is missed; Failover groups spread over the new count) and
   the topic's append signal.

A topic keeping last values per key (last-value or map) is refused: a key's partition is
`crc32(key) % partitions`, and moving keys would leave their old revisions in the old partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil

import structlog

from headwater.durables.cursor import PartitionCursor
from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.subscriptions.reliable_subscription import ReliableSubscription
from headwater.server.topics.topic import LogPartition, LogTopic, MemoryPartition, Topic
from headwater.server.topics.topic_settings import log_config
from headwater.storage.state import CURSOR, TOPIC, key
from headwater.storage.wal import PartitionLog
from headwater.wire import messages as m
from headwater.wire.errors import InvalidRequest, StorageError, UnknownTopic
from headwater.wire.limits import MAX_PARTITIONS

log = structlog.get_logger(__name__)


def check_growth(catalog: TopicCatalog, request: m.CreatePartitionsRequest) -> bool:
    """Whether the request grows the topic (False: it has that count already, an alter retried
    after its answer was lost); raises what refuses it. A cluster checks before it records the
    new count in etcd."""
    topic = catalog.topics.get(request.name)
    if topic is None:
        raise UnknownTopic(f"topic {request.name!r} does not exist")
    current = len(topic.partitions)
    wanted = request.partitions
    if wanted == current:
        return False
    if wanted < current:
        raise InvalidRequest(
            f"topic {topic.name!r} has {current} partitions: partitions can be added, "
            f"never removed ({wanted} asked)"
        )
    if wanted > MAX_PARTITIONS:
        raise InvalidRequest(f"partitions must be 1..{MAX_PARTITIONS}, not {wanted}")
    data = catalog.state.get_json(key(TOPIC, topic.name))
    if topic.last_value is not None or "last_value" in data:
        raise InvalidRequest(
            f"topic {topic.name!r} keeps last values per key: adding partitions would move "
            "keys away from their revisions"
        )
    return True


async def add_partitions(catalog: TopicCatalog, request: m.CreatePartitionsRequest) -> m.Response:
    """Grow a topic; the caller holds its turn."""
    if not check_growth(catalog, request):
        return m.EmptyResponse()
    topic = catalog.topics[request.name]
    current = len(topic.partitions)
    wanted = request.partitions
    data = catalog.state.get_json(key(TOPIC, topic.name))
    data["partitions"] = wanted
    puts = {key(TOPIC, topic.name): _json(data)}
    if topic.reliable:
        logs = await _open_logs(catalog, topic, current, wanted)
        grown: list[tuple[ReliableSubscription, list[PartitionCursor]]] = []
        for subscription in topic.subscriptions.values():
            if isinstance(subscription, ReliableSubscription):
                cursors = [PartitionCursor.starting_at(0) for _ in range(current, wanted)]
                grown.append((subscription, cursors))
                for p, cursor in enumerate(cursors, current):
                    puts[key(CURSOR, topic.name, subscription.name, p)] = cursor.encode()
        try:
            await catalog.writer.synced(puts)
        except BaseException:
            await _close(logs)
            raise
        _publish_reliable(catalog, topic, logs, grown)
    else:
        await catalog.writer.synced(puts)
        topic.partitions.extend(MemoryPartition(p) for p in range(current, wanted))
        _publish(topic, wanted)
    log.info("topic.partitions_added", topic=topic.name, partitions=wanted, previous=current)
    catalog.grew(wanted - current)
    return m.EmptyResponse()


async def _open_logs(
    catalog: TopicCatalog, topic: LogTopic, current: int, wanted: int
) -> list[PartitionLog]:
    directory = catalog.topic_dir(topic.name)
    config = log_config(topic.settings)
    logs: list[PartitionLog] = []

    def open_all() -> None:
        for p in range(current, wanted):
            shutil.rmtree(directory / str(p), ignore_errors=True)
            logs.append(
                PartitionLog.open(
                    directory / str(p), config, on_sealed=catalog.sealed(topic.name, p)
                )
            )

    # rare admin work: asyncio's default executor (docs/OPERATIONS.md, Threads)
    opening = asyncio.ensure_future(asyncio.to_thread(open_all))
    try:
        await asyncio.shield(opening)
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            await opening  # a cancelled wait: let the thread end before closing what it opened
        await _close(logs)
        if not isinstance(exc, OSError):
            raise
        raise StorageError(
            f"cannot add partition {current + len(logs)} to topic {topic.name!r}: "
            f"{exc.strerror or exc}"
        ) from None
    return logs


async def _close(logs: list[PartitionLog]) -> None:
    for partition_log in logs:
        with contextlib.suppress(OSError):
            await partition_log.close()


def _publish_reliable(
    catalog: TopicCatalog,
    topic: LogTopic,
    logs: list[PartitionLog],
    grown: list[tuple[ReliableSubscription, list[PartitionCursor]]],
) -> None:
    """No await from here to the end: every reader sees the partitions and cursors together."""
    current = len(topic.partitions)
    for p, partition_log in enumerate(logs, current):
        partition_log.start()
        topic.partitions.append(LogPartition(p, partition_log))
    catalog.subscriptions.partitions_added(topic, logs)
    for subscription, cursors in grown:
        subscription.grow(cursors)
    _publish(topic, len(topic.partitions))


def _publish(topic: Topic, count: int) -> None:
    topic.info = dataclasses.replace(topic.info, partitions=count)
    for subscription in topic.subscriptions.values():
        group = getattr(subscription, "group", None)
        if group is not None:
            group.partitions = count


def _json(data: object) -> bytes:
    return json.dumps(data).encode()
