"""Map durables' requests: MAP_GET, MAP_SET, MAP_SCAN, MAP_SIZE on a topic's last-value state.

Get and set are synchronous when the topic's state is ready (no task, no await) and wait for an
fsync only when the topic's policy needs one. The first map request of a topic builds the state
(`TopicCatalog.enable_last_value`); the broker runs such a request in the topic's turn, so the
build never races a delete or another build. A set checks every compare-and-set expectation and
appends with no await in between, and writes each key to its partition, `crc32(key) % n`, where
its revisions are unique.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from typing import Any

from durables.lastvalue import LastValueIndex, StoredValue, check_key
from server.catalog import TopicCatalog
from server.subscription import ConsumerSession as Session
from server.topics import Topic
from wire import messages as m
from wire.errors import InvalidRequest, RevisionMismatch, UnknownTopic
from wire.keys import ABSENT_REVISION, ANY_REVISION
from wire.records import build_batch

Result = m.Response | Awaitable[m.Response]


class MapHandlers:
    def __init__(self, catalog: TopicCatalog) -> None:
        self._catalog = catalog

    def ready(self, topic_name: str) -> bool:
        """Whether map requests on `topic_name` can be answered without building its state."""
        topic = self._catalog.topics.get(topic_name)
        return topic is None or (topic.last_value is not None and topic.last_value.ready)

    def _topic(self, name: str) -> Topic:
        topic = self._catalog.topics.get(name)
        if topic is None:
            raise UnknownTopic(f"topic {name!r} does not exist")
        return topic

    async def _index(self, topic_name: str) -> tuple[Topic, LastValueIndex]:
        """The topic's last values, built first if need be (the broker runs a map request whose
        index is not ready in the topic's turn)."""
        topic = self._topic(topic_name)
        return topic, await self._catalog.enable_last_value(topic)

    def map_get(self, session: Session, request: m.MapGetRequest) -> Result:
        if len(request.keys) > MAX_MAP_KEYS:
            raise InvalidRequest(f"at most {MAX_MAP_KEYS} keys per request")
        for wanted in request.keys:
            check_key(wanted)
        index = self._topic(request.topic).last_value
        if index is not None and index.ready:  # the hot path: no task, no await
            return m.MapGetResponse(tuple(_entry(k, index.get(k)) for k in request.keys))
        return self._map_get_after_enabling(request)

    async def _map_get_after_enabling(self, request: m.MapGetRequest) -> m.Response:
        _, index = await self._index(request.topic)
        return m.MapGetResponse(tuple(_entry(k, index.get(k)) for k in request.keys))

    def map_set(self, session: Session, request: m.MapSetRequest) -> Result:
        if not request.writes or len(request.writes) > MAX_MAP_KEYS:
            raise InvalidRequest(f"a set holds 1..{MAX_MAP_KEYS} writes")
        for write in request.writes:
            check_key(write.key)
            if write.expected_revision < ABSENT_REVISION:
                raise InvalidRequest("expected_revision: -1 any, -2 absent, or a revision >= 0")
        topic = self._topic(request.topic)
        if topic.last_value is None or not topic.last_value.ready:
            return self._map_set_after_enabling(request)
        return self._map_set(topic, topic.last_value, request)

    async def _map_set_after_enabling(self, request: m.MapSetRequest) -> m.Response:
        topic, index = await self._index(request.topic)
        result = self._map_set(topic, index, request)
        if inspect.isawaitable(result):
            return await result
        return result

    def _map_set(self, topic: Topic, index: LastValueIndex, request: m.MapSetRequest) -> Result:
        """Synchronous up to the fsync wait (if the topic's policy needs one): no task."""
        if index.key_field:
            raise InvalidRequest(
                f"topic {topic.name!r} takes keys from field {index.key_field!r} of its values: "
                "produce records to it instead of setting keys"
            )
        # Check every expectation, then write, with no await between: the check holds.
        for write in request.writes:
            current = index.get(write.key)
            revision = ABSENT_REVISION if current is None else current.offset
            if write.expected_revision not in (ANY_REVISION, revision):
                found = "absent" if current is None else f"at revision {revision}"
                wanted = (
                    "absent"
                    if write.expected_revision == ABSENT_REVISION
                    else f"at revision {write.expected_revision}"
                )
                raise RevisionMismatch(f"key {write.key!r} is {found}, expected {wanted}")
        by_partition: dict[int, list[tuple[int, m.MapWrite]]] = {}
        for position, write in enumerate(request.writes):
            index_of_partition = index.partition_of(write.key)  # as the producer's partitioner
            by_partition.setdefault(index_of_partition, []).append((position, write))
        revisions = [0] * len(request.writes)
        waits = []
        for partition_index, writes in by_partition.items():
            partition = topic.partitions[partition_index]
            batch = build_batch([(w.key, w.value, ()) for _, w in writes])
            base_offset, sequence = topic.append(partition, batch, len(writes))
            for delta, (position, _) in enumerate(writes):
                revisions[position] = base_offset + delta
            assert partition.log is not None
            if partition.log.must_wait(sequence):
                waits.append(partition.log.wait_durable(sequence))
        response = m.MapSetResponse(tuple(revisions))
        if not waits:
            return response
        return _after(asyncio.gather(*waits), response)

    async def map_scan(self, session: Session, request: m.MapScanRequest) -> m.Response:
        if not 1 <= request.limit <= MAX_MAP_KEYS:
            raise InvalidRequest(f"scan limit must be 1..{MAX_MAP_KEYS}")
        _, index = await self._index(request.topic)
        values, cursor = index.scan(request.prefix, request.after, request.limit)
        return m.MapScanResponse(tuple(_entry(v.key, v) for v in values), cursor)

    async def map_size(self, session: Session, request: m.MapSizeRequest) -> m.Response:
        _, index = await self._index(request.topic)
        return m.MapSizeResponse(index.size())


MAX_MAP_KEYS = 1000  # keys per get/set request, entries per scan page


def _entry(record_key: bytes, stored: StoredValue | None) -> m.MapEntry:
    if stored is None:
        return m.MapEntry(record_key, False, -1, -1, -1, None)
    return m.MapEntry(
        record_key, True, stored.offset, stored.partition, stored.timestamp, stored.value
    )


async def _after(waiting: Awaitable[Any], response: m.Response) -> m.Response:
    await waiting
    return response
