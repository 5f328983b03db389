"""FETCH: a reliable topic's partition read by offset, with no subscription and no state kept.

A reader that keeps its own offsets (a Spark query keeps them in its checkpoint) asks for the
batches from an offset; the server reads them through the one read path of the log
(`LogTopic.read`: local WAL, object store, over damage) and answers whole batches, up to
`max_bytes` (at least one batch, whatever its size, so a reader always moves on), and only those
below the partition's readable end: what is visible per the topic's fsync policy on one broker
(what an fsync covers under `always`), what the object store holds in a cluster. So a reader never
sees a record that a crash or a take-over could give to another message, exactly as the reliable
subscriptions see them.

Transactions (`isolation`, FETCH version 1): a COMMITTED read (the default, and every version 0
request) answers only below the partition's last stable offset (`LogTopic.stable_end`: below it
every transaction's fate is written) and leaves out the batches a transaction-aware reader skips
(`LogTopic.hides`: the markers, and the batches of aborted transactions), so a reader never sees
an aborted or undecided record nor a marker; `end_offset` is then the last stable offset. A RAW
read (the Kafka front end's Fetch, which leaves the filtering to Kafka clients as Kafka does)
answers every batch below the readable end. `next_offset` says where the next FETCH goes on: after
the last batch read, left out or not, so a reader steps over a run of left-out batches even when
the answer holds none, and over a gap (the offsets a restart skipped to its offset lease: a read
in the local WAL below the end that finds no batch at all says that every offset up to the end is
one; `LogTopic.empty_read_is_a_gap`).

At the end with `max_wait_ms`, the answer waits (a long poll) on the topic's append
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
history), INVALID_REQUEST for `max_bytes` or `max_wait_ms` out of their bounds (`wire.limits`), an
unknown isolation or a timestamp below -2, OFFSET_OUT_OF_RANGE below the start or above the next
offset, NOT_OWNER in a cluster for a partition another broker serves.
"""

from __future__ import annotations

import asyncio
import itertools

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
from headwater.wire.markers import peek

_ISOLATIONS = frozenset(m.FetchIsolation)
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
        if request.isolation not in _ISOLATIONS:
            raise InvalidRequest(
                f"unknown FETCH isolation {request.isolation} (0 committed, 1 raw)"
            )
        end = self._check(topic, request)
        if request.offset < end:
            return AfterWork(self._read(topic, request, end))
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
        """The end a reader starting "at the end" starts from: the last stable offset, so a
        transaction open now is read once it commits (a COMMITTED FETCH from the readable end
        would have stepped past its first records)."""
        return topic.stable_end(topic.partitions[partition])

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
        """Where the request may read up to (`_end_of`), after the checks every answer
        repeats."""
        index = request.partition
        self._partition(topic, index)
        partition = topic.partitions[index]
        start, following = topic.start_offset(index), partition.next_offset
        if not start <= request.offset <= following:
            raise OffsetOutOfRange(
                f"offset {request.offset} is out of range for partition {index} of topic "
                f"{topic.name!r}: start={start} next={following}"
            )
        return _end_of(topic, request)

    async def _read(self, topic: LogTopic, request: m.FetchRequest, end: int) -> Reply:
        """The answer from a read at `request.offset`, which is below `end` (taken before the
        read): a read that finds no batch at or after the offset tells that every offset up to
        `end` is a gap (the offsets a restart skipped to its lease), which the reader steps."""
        batches = await topic.read(request.partition, request.offset)
        gap = not batches and topic.empty_read_is_a_gap(request.partition, request.offset)
        return self._answer(topic, request, batches, end if gap else request.offset)

    def _answer(
        self, topic: LogTopic, request: m.FetchRequest, batches: list[bytes], gap_end: int = -1
    ) -> Reply:
        partition = topic.partitions[request.partition]
        end = _end_of(topic, request)  # after the read: it only grows
        hide = request.isolation == m.FetchIsolation.COMMITTED
        taken: list[bytes] = []
        size = 0
        following = max(request.offset, gap_end)
        for batch in batches:
            header = peek(batch)
            if header.base_offset >= end:
                break  # not readable yet (not fsynced, not in the cloud, not decided)
            if hide and header.transactional and topic.hides(partition, batch):
                following = max(following, header.next_offset)  # stepped over
                continue
            if taken and size + len(batch) > request.max_bytes:
                break
            taken.append(batch)
            size += len(batch)
            following = max(following, header.next_offset)
        return m.FetchResponse(
            topic.start_offset(request.partition), end, b"".join(taken), following
        )

    async def _wait(self, request: m.FetchRequest) -> Reply:
        """At the end: wait for an append (or the durable offset, or the cloud tail) to
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
        end = self._check(topic, request)
        if request.offset < end:
            return await self._read(topic, request, end)
        return self._answer(topic, request, [])


def _end_of(topic: LogTopic, request: m.FetchRequest) -> int:
    """Where the request may read up to: the partition's readable end for a RAW read, its last
    stable offset for a COMMITTED one."""
    partition = topic.partitions[request.partition]
    if request.isolation == m.FetchIsolation.RAW:
        return topic.readable_end(partition, False)
    return topic.stable_end(partition)
