"""FETCH: a reliable topic's partition read by offset, with no subscription and no state kept.

A reader that keeps its own offsets (a Spark query keeps them in its checkpoint) asks for the
batches from an offset; the server reads them through the one read path of the log
(`LogTopic.read`: local WAL, object store, over damage) and answers whole batches, up to
`max_bytes` (at least one batch, whatever its size, so a reader always moves on), and only those
below the partition's readable end: what is visible per the topic's fsync policy on one broker
(what an fsync covers under `always`), what the object store holds in a cluster. So a reader never
sees a record that a crash or a take-over could give to another message, exactly as the reliable
subscriptions see them.

At the readable end with `max_wait_ms`, the answer waits (a long poll) on the topic's append
signal (`subscriptions.append_signal.AppendSignal`, fired on each append and each advance of the
durable offset or the cloud tail), for its own partition's only, until data becomes readable or
the time is up; it waits as an
`AfterData`, outside the topic's turn, so the produces that bring the data are not queued behind
it. A topic deleted meanwhile answers UNKNOWN_TOPIC.

OFFSET_FOR_TIME tells such a reader where to start to read from a time: the first offset of the
first batch whose newest record is at or after it (`LogTopic.offset_for_timestamp`, a walk of
the segments' sparse indexes), or the readable end when no readable record is that recent; -2
asks for the partition's start, -1 for its readable end.

Errors: UNKNOWN_TOPIC, INVALID_PARTITION, NOT_SUPPORTED on a non-reliable topic (it keeps no
history), INVALID_REQUEST for `max_bytes` or `max_wait_ms` out of their bounds
(`wire.limits`) or a timestamp below -2, OFFSET_OUT_OF_RANGE below the start or above the next
offset, NOT_OWNER in a cluster for a partition another broker serves.
"""

from __future__ import annotations

import asyncio
import itertools
import struct

from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.reply import AfterData, AfterWork, Reply
from headwater.server.request_table import handles
from headwater.server.requests.partition_ownership import Ownership, not_owner
from headwater.server.topics.subscription_contract import ConsumerSession as Session
from headwater.server.topics.topic import LogTopic
from headwater.wire import messages as m
from headwater.wire.errors import (
    InvalidPartition,
    InvalidRequest,
    NotSupported,
    OffsetOutOfRange,
    UnknownTopic,
)
from headwater.wire.limits import MAX_FETCH_BYTES, MAX_FETCH_WAIT_MS

_BASE = struct.Struct(">q")
_waiters = itertools.count(1)  # idents for the append signal's waiting list
# wake-ups one long poll takes (each an append to its partition) before it answers
# what it has: with the deadline, what bounds its loop
_MAX_WAKEUPS = 100_000


class FetchHandler:
    def __init__(self, catalog: TopicCatalog, ownership: Ownership) -> None:
        self._catalog = catalog
        self._ownership = ownership  # only partitions served here (a cluster's)

    # reads the log by offset, no subscription: a consumer's right, nothing changes
    @handles(m.FetchRequest, "topic", "consume")
    def fetch(self, session: Session, request: m.FetchRequest) -> Reply:
        topic = self._topic(request.topic)
        if not 1 <= request.max_bytes <= MAX_FETCH_BYTES:
            raise InvalidRequest(f"FETCH max_bytes must be 1..{MAX_FETCH_BYTES}")
        if not 0 <= request.max_wait_ms <= MAX_FETCH_WAIT_MS:
            raise InvalidRequest(f"FETCH max_wait_ms must be 0..{MAX_FETCH_WAIT_MS}")
        end = self._check(topic, request)
        if request.offset < end:
            return AfterWork(self._read(topic, request))
        if request.max_wait_ms == 0:
            return self._answer(topic, request, [])
        return AfterData(self._wait(request))

    @handles(m.OffsetForTimeRequest, "topic", "consume")
    def offset_for_time(self, session: Session, request: m.OffsetForTimeRequest) -> Reply:
        topic = self._topic(request.topic)
        self._partition(topic, request.partition)
        if request.timestamp < -2:
            raise InvalidRequest(
                f"timestamp {request.timestamp}: milliseconds, -1 (the end) or -2 (the start)"
            )
        if request.timestamp == -2:
            return m.OffsetForTimeResponse(topic.start_offset(request.partition))
        if request.timestamp == -1:
            return m.OffsetForTimeResponse(self._end(topic, request.partition))
        return AfterWork(self._offset_for_time(topic, request))

    async def _offset_for_time(self, topic: LogTopic, request: m.OffsetForTimeRequest) -> Reply:
        found = await topic.offset_for_timestamp(request.partition, request.timestamp)
        return m.OffsetForTimeResponse(min(found, self._end(topic, request.partition)))

    @staticmethod
    def _end(topic: LogTopic, partition: int) -> int:
        return topic.readable_end(topic.partitions[partition], False)

    def _partition(self, topic: LogTopic, index: int) -> None:
        """Raise unless `index` is a partition of `topic` that this broker serves."""
        if not 0 <= index < len(topic.partitions):
            raise InvalidPartition(
                f"topic {topic.name!r} has partitions 0..{len(topic.partitions) - 1}, not {index}"
            )
        if not self._ownership.serves(topic.name, index):
            raise not_owner(self._ownership, topic.name, index)

    def _topic(self, name: str) -> LogTopic:
        topic = self._catalog.topics.get(name)
        if topic is None:
            raise UnknownTopic(f"topic {name!r} does not exist")
        if not topic.reliable:
            raise NotSupported(
                f"topic {name!r} is non-reliable: it keeps no history to fetch (subscribe instead)"
            )
        return topic

    def _check(self, topic: LogTopic, request: m.FetchRequest) -> int:
        """The partition's readable end, after the checks every answer repeats."""
        index = request.partition
        self._partition(topic, index)
        partition = topic.partitions[index]
        start, following = topic.start_offset(index), partition.next_offset
        if not start <= request.offset <= following:
            raise OffsetOutOfRange(
                f"offset {request.offset} is out of range for partition {index} of topic "
                f"{topic.name!r}: start={start} next={following}"
            )
        return topic.readable_end(partition, False)

    async def _read(self, topic: LogTopic, request: m.FetchRequest) -> Reply:
        batches = await topic.read(request.partition, request.offset)
        return self._answer(topic, request, batches)

    def _answer(self, topic: LogTopic, request: m.FetchRequest, batches: list[bytes]) -> Reply:
        partition = topic.partitions[request.partition]
        end = topic.readable_end(partition, False)  # after the read: it only grows
        taken: list[bytes] = []
        size = 0
        for batch in batches:
            if _BASE.unpack_from(batch)[0] >= end:
                break  # read from the WAL, not readable yet (not fsynced, not in the cloud)
            if taken and size + len(batch) > request.max_bytes:
                break
            taken.append(batch)
            size += len(batch)
        return m.FetchResponse(topic.start_offset(request.partition), end, b"".join(taken))

    async def _wait(self, request: m.FetchRequest) -> Reply:
        """At the readable end: wait for an append (or the durable offset, or the cloud tail) to
        move it, up to `max_wait_ms`; then answer what is there, or nothing."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.max_wait_ms / 1000
        ident = next(_waiters)
        for _ in range(_MAX_WAKEUPS):
            topic = self._topic(request.topic)  # deleted meanwhile: UNKNOWN_TOPIC
            end = self._check(topic, request)
            left = deadline - loop.time()
            if request.offset < end or left <= 0:
                break
            woken = asyncio.Event()
            signal = self._catalog.subscriptions.signal(topic)
            # its own partition's appends only: woken by the topic's, a poll at the end of a
            # quiet partition went round this loop once per append to the others
            signal.join_partition(request.partition, ident, woken.set)
            try:
                async with asyncio.timeout(left):
                    await woken.wait()
            except TimeoutError:
                pass
            finally:
                signal.leave_partition(request.partition, ident)
        topic = self._topic(request.topic)
        if request.offset < self._check(topic, request):
            return await self._read(topic, request)
        return self._answer(topic, request, [])
