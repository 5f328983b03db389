"""A reliable subscription's pump does not lose an append that lands while a round reads the log.

The pump (`server.subscriptions.reliable_subscription`) sleeps on one event, which the topic's
`AppendSignal` sets on an append or when a partition's durable offset advances, but only for a
pump that joined the signal, and a pump joins only once a round has found nothing to send. A round
that awaits a disk read is not joined: an append and its fsync landing during that read used to
wake nobody, and the pump cleared its event after the round anyway. It then slept until the next
ack timeout (none here: forever) with a message to deliver. This showed after a kill -9: the WAL
goes on at the offset lease (4096), a cursor at 10 sits in the gap, and every round reads the disk
(tests/test_client_failures.py::test_reconnect_resubscribes_and_keeps_at_least_once, sometimes).

The race is made on purpose, with no sleeps: real parts (a `PartitionLog` on `fsync=always`
reopened after a simulated kill -9, a `LogTopic`, a `StateWriter` over RocksDB, the real
`AppendSignal`), a topic whose first read is held on an `asyncio.Event` while the test appends a
batch and waits for its fsync, and a stand-in consumer session that queues what it is sent. The
batch must then arrive within a bounded wait; the ack timeout (60 s) is far longer, so only a lost
wake-up can make it miss. Two orders: the held read returns what the disk held before the append
(nothing: the round sees an empty read), or reads after it (the round sees the new batch past the
end it took before reading, and counts it as not visible yet).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from headwater.server.config import TopicSettings
from headwater.server.subscriptions.reliable_subscription import ReliableSubscription
from headwater.server.topics.subscription_contract import Consumer
from headwater.server.topics.topic import LogTopic
from headwater.server.topics.topic_settings import log_config
from headwater.storage.state import StateStore, StateWriter
from headwater.storage.wal import FsyncPolicy, PartitionLog
from headwater.wire.messages import DispatchMode, TopicInfo
from headwater.wire.records import build_batch, read_records
from tests.support.queue_session import QueueSession, exclusive_subscription

_BEFORE_CRASH = 10  # records appended (and acked by the subscription) before the kill -9
_ACK_TIMEOUT_MS = 60_000  # what a lost wake-up waited for in the failing test
_DELIVERY_WAIT = 5.0  # seconds: the delivery takes milliseconds unless the wake-up is lost
_SETTINGS = TopicSettings(fsync=FsyncPolicy.ALWAYS)


class HeldReadTopic(LogTopic):
    """A `LogTopic` whose next read, once `hold` is called, waits for `release` (before or after
    reading the log): the pump's round is then suspended inside its read for as long as the test
    likes, as it is while a slow disk read runs in a worker thread."""

    def __init__(self, info: TopicInfo, settings: TopicSettings, logs: list[PartitionLog]) -> None:
        super().__init__(info, settings, logs)
        self.reading = asyncio.Event()  # set once the held read has started
        self.held_at: int | None = None  # the offset the held read is at
        self._release: asyncio.Event | None = None
        self._read_first = False

    def hold(self, read_first: bool) -> asyncio.Event:
        """Hold the next read; returns the event that lets it go on."""
        self._release = asyncio.Event()
        self._read_first = read_first
        return self._release

    async def read(self, partition: int, offset: int) -> list[bytes]:
        release, self._release = self._release, None
        if release is None:
            return await super().read(partition, offset)
        batches = await super().read(partition, offset) if self._read_first else None
        self.held_at = offset
        self.reading.set()
        await release.wait()
        return batches if batches is not None else await super().read(partition, offset)


async def _kill(partition_log: PartitionLog) -> None:
    """What kill -9 leaves: the syncer stops, nothing is closed cleanly, the lease stays as is."""
    partition_log.syncer.halt()
    for segment in partition_log._segments:
        if segment.write_fd is not None:
            os.close(segment.write_fd)
            segment.write_fd = None


def _batch(value: bytes) -> bytes:
    return build_batch([(None, value, [])])


@dataclass
class Rig:
    topic: HeldReadTopic
    log: PartitionLog
    subscription: ReliableSubscription
    consumer: Consumer
    session: QueueSession


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    """A reliable subscription with its cursor at 10, in the gap a kill -9 left before the WAL
    goes on at the lease, and a consumer with credit not yet attached."""
    directory = tmp_path / "topic" / "0"
    crashed = PartitionLog.open(directory, log_config(_SETTINGS))
    crashed.start()
    _, sequence = crashed.append(
        build_batch([(None, b"before-%d" % i, []) for i in range(_BEFORE_CRASH)]), _BEFORE_CRASH
    )
    await crashed.wait_durable(sequence)
    await _kill(crashed)

    partition_log = PartitionLog.open(directory, log_config(_SETTINGS))
    partition_log.start()
    assert partition_log.next_offset > _BEFORE_CRASH, "no lease gap after the kill"
    assert partition_log.visible_offset == partition_log.next_offset
    topic = HeldReadTopic(TopicInfo("pumped", 1, DispatchMode.RELIABLE), _SETTINGS, [partition_log])
    state = StateStore(tmp_path / "state")
    writer = StateWriter(state)
    subscription, consumer, session = exclusive_subscription(
        topic, writer, _BEFORE_CRASH, _ACK_TIMEOUT_MS
    )
    try:
        yield Rig(topic, partition_log, subscription, consumer, session)
    finally:
        await subscription.close()
        await writer.flush()
        await partition_log.close()
        state.close()


@pytest.mark.parametrize(
    "read_first", [True, False], ids=["read-before-append", "read-after-append"]
)
async def test_append_made_durable_during_a_rounds_read_is_delivered(
    rig: Rig, read_first: bool
) -> None:
    release = rig.topic.hold(read_first)
    rig.subscription.attach(rig.consumer)  # wakes the pump: a round that reads at 10, held
    await rig.topic.reading.wait()
    assert rig.topic.held_at == _BEFORE_CRASH  # in the gap before the WAL goes on at the lease

    # while the round is inside its read: append past the gap, and let the fsync make it visible
    # (fsync=always: the append and the durable offset's advance each fire the signal)
    base, sequence = rig.log.append(_batch(b"after-the-gap"), 1)
    assert base > _BEFORE_CRASH
    await rig.log.wait_durable(sequence)
    assert rig.log.visible_offset == base + 1
    release.set()

    try:
        delivery = await asyncio.wait_for(rig.session.deliveries.get(), _DELIVERY_WAIT)
    except TimeoutError:
        pytest.fail(
            f"offset {base} not delivered within {_DELIVERY_WAIT} s after {rig.subscription.rounds}"
            " pump rounds: the wake-up of an append during the round's read was lost"
        )
    assert (delivery.consumer_id, delivery.partition, delivery.delivery_count) == (1, 0, 1)
    assert [(r.offset, r.value) for r in read_records(delivery.batch)] == [(base, b"after-the-gap")]
