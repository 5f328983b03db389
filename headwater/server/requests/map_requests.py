"""Map durables' requests: MAP_GET, MAP_SET, MAP_SCAN, MAP_SIZE on a topic's last-value state.

Get and set are synchronous when the topic's state is ready (no task, no await) and wait for an
fsync only when the topic's policy needs one. A read (get, scan, size) never changes a topic: on a
topic without last-value state it is refused with INVALID_REQUEST (`no_last_value_state`). The
first MAP_SET builds the state (`TopicCatalog.enable_last_value`); the broker runs such a request
in the topic's turn, so the build never races a delete or another build. A set checks every
compare-and-set expectation and appends with no await in between, and writes each key to its
partition, `crc32(key) % n`, where its revisions are unique. A set reads its writes as the
columns the decoder made (`wire.api.maps.WriteColumns`: keys, values, expected revisions), checks
them with `min`/`max` over whole columns, and looks a key up only for a write that compares.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence

from headwater.durables.lastvalue import KeyedBatch, StoredValue, check_key
from headwater.server.catalog.topic_catalog import TopicCatalog, last_value_topic
from headwater.server.reply import AfterWork, Reply, after
from headwater.server.request_table import handles
from headwater.server.requests.partition_ownership import Ownership, not_owner
from headwater.server.topics.lastvalue_index import LastValueIndex
from headwater.server.topics.subscription_contract import ConsumerSession as Session
from headwater.server.topics.topic import LogTopic, Topic
from headwater.wire import messages as m
from headwater.wire.api.maps import WriteColumns, encode_map_entries
from headwater.wire.errors import InvalidRequest, RevisionMismatch, UnknownTopic
from headwater.wire.keys import ABSENT_REVISION, ANY_REVISION
from headwater.wire.limits import MAX_KEY_SIZE, MAX_MAP_KEYS
from headwater.wire.records import BatchBuilder


class MapHandlers:
    def __init__(self, catalog: TopicCatalog, ownership: Ownership) -> None:
        self._catalog = catalog
        self._ownership = ownership  # keys of partitions served here only (a cluster's)

    def _check_served(self, topic: str, index: LastValueIndex, keys: Iterable[bytes]) -> None:
        ownership = self._ownership
        if ownership.serves_every(topic, index.partitions):
            return
        for record_key in keys:
            partition = index.partition_of(record_key)
            if not ownership.serves(topic, partition):
                raise not_owner(ownership, topic, partition)

    def ready(self, topic_name: str) -> bool:
        """Whether map requests on `topic_name` can be answered without building its state."""
        topic = self._catalog.topics.get(topic_name)
        return topic is None or (topic.last_value is not None and topic.last_value.ready)

    def _topic(self, name: str) -> Topic:
        topic = self._catalog.topics.get(name)
        if topic is None:
            raise UnknownTopic(f"topic {name!r} does not exist")
        return topic

    async def _index(self, topic_name: str) -> tuple[LogTopic, LastValueIndex]:
        """The topic's last values, built first if need be (the broker runs a map request whose
        index is not ready in the topic's turn). Only writes call this."""
        topic = last_value_topic(self._topic(topic_name))
        return topic, await self._catalog.enable_last_value(topic)

    async def _read_index(self, topic_name: str) -> LastValueIndex:
        """The topic's last values for a read, which must not create them: a topic without the
        state is refused rather than switched to keeping it (a read changes no configuration)."""
        topic = last_value_topic(self._topic(topic_name))
        if topic.last_value is None:
            raise no_last_value_state(topic.name)
        return await self._catalog.enable_last_value(topic)  # finishes a build under way

    @handles(m.MapGetRequest, "topic", "consume", last_value=True)
    def map_get(self, session: Session, request: m.MapGetRequest) -> Reply:
        if not request.keys or len(request.keys) > MAX_MAP_KEYS:
            raise InvalidRequest(f"a get names 1..{MAX_MAP_KEYS} keys, not {len(request.keys)}")
        for wanted in request.keys:
            check_key(wanted)
        index = self._topic(request.topic).last_value
        if index is not None and index.ready:  # the hot path: no task, no await, no object per key
            self._check_served(request.topic, index, request.keys)
            get = index.get_head
            return encode_map_entries([(k, get(k)) for k in request.keys])
        return AfterWork(self._map_get_after_enabling(request))

    async def _map_get_after_enabling(self, request: m.MapGetRequest) -> Reply:
        index = await self._read_index(request.topic)
        self._check_served(request.topic, index, request.keys)
        return m.MapGetResponse(tuple(_entry(k, index.get(k)) for k in request.keys))

    @handles(m.MapSetRequest, "topic", "produce", last_value=True)
    def map_set(self, session: Session, request: m.MapSetRequest) -> Reply:
        writes = _columns(request)
        keys, _, expected = writes
        if not keys or len(keys) > MAX_MAP_KEYS:
            raise InvalidRequest(f"a set holds 1..{MAX_MAP_KEYS} writes")
        # min and max over the columns run in C; a bad key is then named by `check_key`
        if not (min(map(len, keys)) > 0 and max(map(len, keys)) <= MAX_KEY_SIZE):
            for record_key in keys:
                check_key(record_key)
        if min(expected) < ABSENT_REVISION:
            raise InvalidRequest("expected_revision: -1 any, -2 absent, or a revision >= 0")
        topic = self._topic(request.topic)
        if not topic.reliable or topic.last_value is None or not topic.last_value.ready:
            return AfterWork(self._map_set_after_enabling(request.topic, writes))
        return self._map_set(topic, topic.last_value, writes)

    async def _map_set_after_enabling(self, topic_name: str, writes: _Writes) -> Reply:
        topic, index = await self._index(topic_name)
        return self._map_set(topic, index, writes)

    def _map_set(self, topic: LogTopic, index: LastValueIndex, writes: _Writes) -> Reply:
        """Synchronous up to the fsync wait (if the topic's policy needs one): no task."""
        if index.key_field:
            raise InvalidRequest(
                f"topic {topic.name!r} takes keys from field {index.key_field!r} of its values: "
                "produce records to it instead of setting keys"
            )
        keys = writes[0]
        self._check_served(topic.name, index, keys)
        groups: Mapping[int, list[int] | None]  # partition -> positions of its writes
        if index.partitions == 1:
            groups = {0: None}  # None: every write, in order
        else:
            positions_of: dict[int, list[int]] = {}
            for position, record_key in enumerate(keys):  # as the producer's partitioner
                positions_of.setdefault(index.partition_of(record_key), []).append(position)
            groups = positions_of
        counts = [
            (topic.partitions[p], len(keys) if positions is None else len(positions))
            for p, positions in groups.items()
        ]
        # the checks and the appends run once every partition's offset lease covers them
        return topic.when_leased(counts, lambda: self._map_set_now(topic, index, writes, groups))

    def _map_set_now(
        self,
        topic: LogTopic,
        index: LastValueIndex,
        writes: _Writes,
        groups: Mapping[int, list[int] | None],
    ) -> Reply:
        keys, values, expected = writes
        # Check every expectation, then write, with no await between: the check holds.
        if expected.count(ANY_REVISION) != len(expected):  # some write compares: look it up
            for record_key, wanted in zip(keys, expected, strict=True):
                if wanted != ANY_REVISION:
                    _check_revision(record_key, wanted, index.get(record_key))
        timestamp = int(time.time() * 1000)
        revisions = [0] * len(keys)
        waits = []
        for partition_index, positions in groups.items():
            partition = topic.partitions[partition_index]
            if positions is None:
                group_keys, group_values = keys, values
            else:
                group_keys = [keys[position] for position in positions]
                group_values = [values[position] for position in positions]
            builder = BatchBuilder()
            builder.extend_columns(group_keys, group_values, timestamp)
            batch = builder.build()
            count = len(group_keys)
            # the keys were checked above: the topic need not decode the batch again
            keyed = KeyedBatch(group_keys, group_values, [timestamp] * count)
            base_offset, sequence = topic.append(partition, batch, count, keyed)
            if positions is None:
                revisions = list(range(base_offset, base_offset + count))
            else:
                for revision, position in enumerate(positions, base_offset):
                    revisions[position] = revision
            wait = topic.durability(partition, base_offset, batch, count, sequence)
            if wait is not None:
                waits.append(wait)
        return after(m.MapSetResponse(tuple(revisions)), *waits)

    @handles(m.MapScanRequest, "topic", "consume", last_value=True)
    def map_scan(self, session: Session, request: m.MapScanRequest) -> Reply:
        if not 1 <= request.limit <= MAX_MAP_KEYS:
            raise InvalidRequest(f"scan limit must be 1..{MAX_MAP_KEYS}")
        return AfterWork(self._map_scan(request))

    async def _map_scan(self, request: m.MapScanRequest) -> Reply:
        index = await self._read_index(request.topic)
        if self._ownership.serves_every(request.topic, index.partitions):
            values, cursor = index.scan(request.prefix, request.after, request.limit)
        else:
            values, cursor = await self._served_scan(request, index)
        return m.MapScanResponse(tuple(_entry(v.key, v) for v in values), cursor)

    async def _served_scan(
        self, request: m.MapScanRequest, index: LastValueIndex
    ) -> tuple[list[StoredValue], bytes]:
        """A cluster's scan: the keys of the partitions served here only (the client merges
        every owner's pages; a stale copy of another partition must not be counted twice)."""
        serves, topic = self._ownership.serves, request.topic
        found: list[StoredValue] = []
        after = request.after
        while len(found) < request.limit:
            page, after = index.scan(request.prefix, after, request.limit)
            found += [v for v in page if serves(topic, v.partition)]
            if not after:
                return found[: request.limit], b""
            await asyncio.sleep(0)  # a long walk past other brokers' keys lets others run
        found = found[: request.limit]
        return found, found[-1].key

    @handles(m.MapSizeRequest, "topic", "consume", last_value=True)
    def map_size(self, session: Session, request: m.MapSizeRequest) -> Reply:
        return AfterWork(self._map_size(request))

    async def _map_size(self, request: m.MapSizeRequest) -> Reply:
        index = await self._read_index(request.topic)
        if self._ownership.serves_every(request.topic, index.partitions):
            return m.MapSizeResponse(index.size())
        # a cluster: count the keys of the partitions served here (a walk over the keys)
        count, after = 0, b""
        while True:
            page, after = index.scan(b"", after, MAX_MAP_KEYS)
            count += sum(self._ownership.serves(request.topic, v.partition) for v in page)
            if not after:
                return m.MapSizeResponse(count)
            await asyncio.sleep(0)


# a set's writes as columns: keys, values (None: delete), expected revisions
_Writes = tuple[Sequence[bytes], Sequence[bytes | None], Sequence[int]]


def _columns(request: m.MapSetRequest) -> _Writes:
    """The writes of a set as columns: as decoded (`WriteColumns`), or from its `MapWrite`s."""
    writes: Sequence[m.MapWrite] = request.writes  # the decoder's are `WriteColumns`
    if type(writes) is WriteColumns:
        return writes.keys, writes.values, writes.expected
    return (
        [w.key for w in writes],
        [w.value for w in writes],
        [w.expected_revision for w in writes],
    )


def _check_revision(record_key: bytes, wanted: int, current: StoredValue | None) -> None:
    revision = ABSENT_REVISION if current is None else current.offset
    if wanted != revision:
        found = "absent" if current is None else f"at revision {revision}"
        expected = "absent" if wanted == ABSENT_REVISION else f"at revision {wanted}"
        raise RevisionMismatch(f"key {record_key!r} is {found}, expected {expected}")


def no_last_value_state(topic: str) -> InvalidRequest:
    return InvalidRequest(
        f"topic {topic!r} has no last-value state: create it with --last-value or "
        "`topic alter --last-value`, or write to it with map set"
    )


def _entry(record_key: bytes, stored: StoredValue | None) -> m.MapEntry:
    if stored is None:
        return m.MapEntry(record_key, False, -1, -1, -1, None)
    return m.MapEntry(
        record_key, True, stored.offset, stored.partition, stored.timestamp, stored.value
    )
