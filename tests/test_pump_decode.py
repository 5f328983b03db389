"""A reliable subscription's pump decodes a batch under the broker's cap, once per credit split and
off the loop, and stops a partition whose batch does not decode instead of retrying it forever.

- A batch accepted under a raised `max_decompressed_batch` was decoded by the pump, to cut it to
  a consumer's credit, with the default cap: `DecompressedTooLarge` at every round, logged as
  `subscription.dispatch_failed` once a second, forever, and the message never went. The pump
  now decodes under the cap the broker accepts with (`SubscriptionStore` passes it).
- A batch that does not decode under the cap at all (it is corrupt, or the cap was lowered since
  it was accepted: here, one past the default cap, decoded under it) fails the same way at every
  try: the partition is stopped for the subscription (`subscription.partition_stopped`, the
  `stopped_partitions` gauge), the other partitions go on, nothing is acked or skipped, and a
  seek starts it again (docs/DURABLES.md). A redelivery that reads such a batch back stops it
  too.
- A credit split decoded the whole batch on the loop once per split (ten grants of 10 credits
  over a batch of 100 records: ten decodes of all 100). Now once, in a worker thread.

Real parts: `PartitionLog`s, a `LogTopic`, the real `AppendSignal`, a `StateWriter` over RocksDB,
and a stand-in consumer session (tests/support/queue_session.py) whose credit the test sets.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog

from headwater.durables.cursor import PartitionCursor
from headwater.durables.delivery import ReliableSettings
from headwater.server.config import TopicSettings
from headwater.server.subscriptions import reliable_subscription
from headwater.server.subscriptions.append_signal import AppendSignal
from headwater.server.subscriptions.reliable_subscription import ReliableSubscription
from headwater.server.topics.subscription_contract import Consumer
from headwater.server.topics.topic import LogTopic
from headwater.server.topics.topic_settings import log_config
from headwater.storage.state import StateStore, StateWriter
from headwater.storage.wal import FsyncPolicy, PartitionLog
from headwater.wire.errors import StorageError
from headwater.wire.limits import MAX_DECOMPRESSED_BATCH
from headwater.wire.messages import (
    AckEntry,
    AckKind,
    Backoff,
    DispatchMode,
    SubscriptionType,
    TopicInfo,
)
from headwater.wire.records import (
    Compression,
    Record,
    build_batch,
    read_base_offset,
    read_records,
)
from tests.support.queue_session import Delivery, QueueSession, no_dead_letters

_WAIT = 5.0  # seconds: bounds a hang; a delivery takes milliseconds
_SETTINGS = TopicSettings(fsync=FsyncPolicy.INTERVAL)


@dataclass
class Rig:
    logs: list[PartitionLog]
    topic: LogTopic
    subscription: ReliableSubscription
    consumer: Consumer
    session: QueueSession

    async def append(self, partition: int, batch: bytes, count: int) -> None:
        _, sequence = self.logs[partition].append(batch, count)
        await self.logs[partition].wait_durable(sequence)

    async def delivery(self) -> Delivery:
        return await asyncio.wait_for(self.session.deliveries.get(), _WAIT)


@pytest.fixture
async def make_rig(tmp_path: Path) -> AsyncIterator[Callable[..., Rig]]:
    """Builds a Shared (or `sub_type`) subscription "sub" over a topic of `partitions`
    partitions, every partition at 0, with a consumer of `credits` credits, not yet attached."""
    state = StateStore(tmp_path / "state")
    writer = StateWriter(state)
    made: list[Rig] = []

    def make(
        partitions: int, credits: int, sub_type: SubscriptionType = SubscriptionType.SHARED
    ) -> Rig:
        logs = [
            PartitionLog.open(tmp_path / "t" / str(p), log_config(_SETTINGS))
            for p in range(partitions)
        ]
        signal = AppendSignal()
        for index, partition_log in enumerate(logs):
            partition_log.start()
            partition_log.add_append_listener(lambda i=index: signal.fire(i))
        topic = LogTopic(TopicInfo("t", partitions, DispatchMode.RELIABLE), _SETTINGS, logs)
        subscription = ReliableSubscription(
            topic,
            "sub",
            sub_type,
            ReliableSettings(60_000, 0, Backoff.FIXED, 1, 60_000),
            [PartitionCursor.starting_at(0) for _ in range(partitions)],
            writer,
            no_dead_letters,
            signal,
        )
        session = QueueSession()
        consumer = Consumer(1, "consumer", 0, session, subscription, credits=credits)
        session.consumers[consumer.consumer_id] = consumer
        subscription.start()
        rig = Rig(logs, topic, subscription, consumer, session)
        made.append(rig)
        return rig

    try:
        yield make
    finally:
        for rig in made:
            await rig.subscription.close()
        await writer.flush()
        for rig in made:
            for partition_log in rig.logs:
                await partition_log.close()
        state.close()


@functools.cache
def _past_the_default_cap() -> bytes:
    """Two records of 34 MB of zeros: 2 KB on disk, 68 MB inflated, past the default
    `max_decompressed_batch` (64 MiB)."""
    return build_batch([(None, bytes(34_000_000), [])] * 2, compression=Compression.ZSTD)


async def _until(condition: Callable[[], bool]) -> None:
    """Loop turns until `condition` holds (the caller bounds the wait)."""
    while not condition():
        await asyncio.sleep(0)


def _offsets(delivery: Delivery) -> list[int]:
    return [r.offset for r in read_records(delivery.batch, 128 << 20)]


async def test_a_batch_accepted_under_a_raised_cap_is_cut_to_credit(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig(1, 1)
    # the broker's cap raised to 128 MiB: what it accepted, the pump must decode
    rig.subscription.max_decompressed = 128 << 20
    await rig.append(0, _past_the_default_cap(), 2)
    rig.subscription.attach(rig.consumer)
    first = await rig.delivery()
    assert _offsets(first) == [0]
    rig.subscription.grant(rig.consumer, 1)
    second = await rig.delivery()
    assert _offsets(second) == [1]
    assert rig.subscription.dispatch_failures == 0


class _CountingReads:
    """Counts a topic's reads of one partition."""

    def __init__(self, topic: LogTopic, partition: int) -> None:
        self.count = 0
        read = topic.read

        async def counted(p: int, offset: int) -> list[bytes]:
            if p == partition:
                self.count += 1
            return await read(p, offset)

        topic.read = counted  # type: ignore[method-assign]


async def test_a_batch_that_does_not_decode_stops_its_partition_and_the_others_go_on(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig(2, 1)
    subscription = rig.subscription
    reads = _CountingReads(rig.topic, 0)
    # accepted under a cap raised then, decoded under the default now (the cap lowered since)
    await rig.append(0, _past_the_default_cap(), 2)
    await rig.append(1, build_batch([(None, b"p1-0", [])]), 1)
    with structlog.testing.capture_logs() as logged:
        subscription.attach(rig.consumer)
        delivered = await rig.delivery()  # partition 1's, whatever partition 0 does
        assert delivered.partition == 1 and _offsets(delivered) == [0]
        # partition 1 goes on; partition 0 is not read again at each round
        read_when_stopped = reads.count
        for i in range(1, 4):
            subscription.ack(rig.consumer, [AckEntry(1, i - 1)], AckKind.INDIVIDUAL)
            subscription.grant(rig.consumer, 1)
            await rig.append(1, build_batch([(None, b"p1-%d" % i, [])]), 1)
            delivered = await rig.delivery()
            assert delivered.partition == 1 and _offsets(delivered) == [i]
        assert reads.count == read_when_stopped
    assert list(subscription.stopped) == [0]
    assert f"inflates past the {MAX_DECOMPRESSED_BATCH}-byte limit" in subscription.stopped[0]
    assert subscription.dispatch_failures == 0
    stops = [e for e in logged if e["event"] == "subscription.partition_stopped"]
    assert len(stops) == 1 and stops[0]["partition"] == 0 and stops[0]["offset"] == 0
    assert not [e for e in logged if e["event"] == "subscription.dispatch_failed"]
    # nothing of partition 0 was acked or stepped over
    assert subscription.core.cursors[0].floor == 0 and subscription.core.position(0) == 0
    # a seek past the batch starts it again
    subscription.seek([2, 4])
    assert not subscription.stopped
    subscription.grant(rig.consumer, 1)
    await rig.append(0, build_batch([(None, b"p0-2", [])]), 1)
    delivered = await rig.delivery()
    assert delivered.partition == 0 and _offsets(delivered) == [2]


async def test_a_redelivery_that_does_not_decode_stops_its_partition(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig(1, 10)
    subscription = rig.subscription
    await rig.append(0, _past_the_default_cap(), 2)
    subscription.attach(rig.consumer)
    first = await rig.delivery()  # whole, as stored: the pump did not decode it
    assert read_base_offset(first.batch) == 0 and len(first.batch) < 10_000
    with structlog.testing.capture_logs() as logged:
        subscription.nack(rig.consumer, [AckEntry(0, 0)], 0)  # due again after 1 ms
        told = ("subscription.partition_stopped", "subscription.dispatch_failed")
        await asyncio.wait_for(_until(lambda: any(e["event"] in told for e in logged)), _WAIT)
    assert [e["event"] for e in logged if e["event"].startswith("subscription.")] == [
        "subscription.partition_stopped"
    ]
    assert list(subscription.stopped) == [0] and subscription.dispatch_failures == 0
    assert subscription.core.cursors[0].floor == 0  # nothing acked: a seek or a restart decides


async def test_a_credit_split_decodes_the_batch_once_off_the_loop(
    make_rig: Callable[..., Rig], monkeypatch: pytest.MonkeyPatch
) -> None:
    decodes: list[str] = []
    real = reliable_subscription.read_records

    def counted(batch: bytes, *args: Any) -> Any:
        decodes.append(threading.current_thread().name)
        return real(batch, *args)

    monkeypatch.setattr(reliable_subscription, "read_records", counted)
    rig = make_rig(1, 10)
    records = [(None, b"value-%03d" % i, []) for i in range(100)]
    await rig.append(0, build_batch(records, compression=Compression.GZIP), 100)
    rig.subscription.attach(rig.consumer)
    offsets: list[int] = []
    while len(offsets) < 100:
        offsets += _offsets(await rig.delivery())
        rig.subscription.grant(rig.consumer, 10)
    assert offsets == list(range(100))
    assert len(decodes) == 1, f"{len(decodes)} decodes of the batch for 10 cuts"
    assert decodes[0] != threading.main_thread().name, "decoded on the event loop"


async def test_key_shared_stops_a_partition_whose_batch_does_not_decode(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig(2, 10, SubscriptionType.KEY_SHARED)
    subscription = rig.subscription
    subscription.max_decompressed = 128 << 20  # raised when the batch was accepted
    await rig.append(0, _past_the_default_cap(), 2)
    subscription.attach(rig.consumer)
    first = await rig.delivery()  # cut by key owner: decoded under the raised cap
    assert first.partition == 0 and _offsets(first) == [0, 1]
    subscription.max_decompressed = MAX_DECOMPRESSED_BATCH  # lowered (a restart)
    with structlog.testing.capture_logs() as logged:
        # its redelivery reads the batch back: it does not decode now
        subscription.nack(rig.consumer, [AckEntry(0, 0)], 0)
        await asyncio.wait_for(_until(lambda: bool(subscription.stopped)), _WAIT)
        # the round ended (no loop over the stopped partition's due offsets): partition 1 goes
        await rig.append(1, build_batch([(b"k", b"p1-0", [])]), 1)
        delivered = await rig.delivery()
        assert delivered.partition == 1 and _offsets(delivered) == [0]
        # and so does a new batch of partition 0 after it: the partition waits, stopped
        await rig.append(0, build_batch([(b"k", b"p0-2", [])]), 1)
        await rig.append(1, build_batch([(b"k", b"p1-1", [])]), 1)
        delivered = await rig.delivery()
        assert delivered.partition == 1 and _offsets(delivered) == [1]
    assert list(subscription.stopped) == [0] and subscription.dispatch_failures == 0
    assert [e["event"] for e in logged if e["event"].startswith("subscription.")] == [
        "subscription.partition_stopped"
    ]


async def test_key_shared_redelivers_only_the_partitions_served_here(
    make_rig: Callable[..., Rig],
) -> None:
    """In a cluster a partition's due records are redelivered by the broker that serves it now:
    the Key_Shared round took them from every partition, so a broker that lost one went on
    sending its records beside the new owner."""
    rig = make_rig(2, 10, SubscriptionType.KEY_SHARED)
    await rig.append(0, build_batch([(b"a", b"zero", [])]), 1)
    await rig.append(1, build_batch([(b"b", b"one", [])]), 1)
    rig.subscription.attach(rig.consumer)
    assert sorted([(await rig.delivery()).partition, (await rig.delivery()).partition]) == [0, 1]
    rig.subscription.serves = lambda topic, partition: partition == 0  # 1 moved away
    rig.subscription.nack(rig.consumer, [AckEntry(1, 0), AckEntry(0, 0)], 0)
    again = await rig.delivery()
    assert (again.partition, _offsets(again)) == (0, [0])
    # partition 1's record (nacked first, so due first) is still due here: never sent
    assert rig.session.deliveries.empty()
    assert rig.subscription.core.take_due(float("inf"), 10, {1}) is not None


async def test_a_refused_dead_letter_costs_one_try_per_round_not_one_per_message(
    tmp_path: Path,
) -> None:
    """A dead-letter topic that cannot take a record now (its owner frozen: each try a peer
    link's timeout) held the pump one wait per message due; now the rest of the round's dead
    letters stay due with the refused one."""
    settings = TopicSettings(fsync=FsyncPolicy.INTERVAL)
    log = PartitionLog.open(tmp_path / "t" / "0", log_config(settings))
    log.start()
    signal = AppendSignal()
    log.add_append_listener(lambda: signal.fire(0))
    topic = LogTopic(TopicInfo("t", 1, DispatchMode.RELIABLE), settings, [log])
    state = StateStore(tmp_path / "state")
    writer = StateWriter(state)
    tries: list[int] = []

    async def refused(partition: int, record: Record, count: int) -> None:
        tries.append(record.offset)
        raise StorageError("the dead-letter topic's owner does not answer")

    subscription = ReliableSubscription(
        topic,
        "sub",
        SubscriptionType.SHARED,
        ReliableSettings(60_000, 1, Backoff.FIXED, 1, 60_000),  # one delivery, then dead
        [PartitionCursor.starting_at(0)],
        writer,
        refused,
        signal,
    )
    session = QueueSession()
    consumer = Consumer(1, "consumer", 0, session, subscription, credits=10)
    session.consumers[consumer.consumer_id] = consumer
    subscription.start()
    try:
        _, sequence = log.append(build_batch([(None, b"%d" % i, ()) for i in range(5)]), 5)
        await log.wait_durable(sequence)
        subscription.attach(consumer)
        first = await asyncio.wait_for(session.deliveries.get(), _WAIT)
        assert _offsets(first) == [0, 1, 2, 3, 4]
        subscription.nack(consumer, [AckEntry(0, o) for o in range(5)], 0)
        # every one due again once the round is over: its first refused, the rest not tried
        await asyncio.wait_for(
            _until(lambda: bool(tries) and len(subscription.core._due) == 5), _WAIT
        )
        assert tries == [0]
    finally:
        await subscription.close()
        await writer.flush()
        await log.close()
        state.close()
