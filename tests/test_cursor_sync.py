"""Under fsync `always`, a subscription's acknowledgements are written at once and synced within
the topic's fsync interval: one RocksDB sync for every ack made meanwhile, not one per round.

An ack is answered before its cursor is written, and a cursor that loses its last writes
redelivers, never skips; what the per-round sync cost was a second stream of fsyncs beside the
topic's own (docs/DECISIONS.md, "Acknowledgements are synced within the fsync interval"). Real
parts: a `PartitionLog` on `fsync=always`, a `LogTopic`, the real `AppendSignal`, a
`StateWriter` over RocksDB, and a stand-in consumer session that queues what it is sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from headwater.durables.cursor import PartitionCursor
from headwater.server.config import TopicSettings
from headwater.server.topics.topic import LogTopic
from headwater.server.topics.topic_settings import log_config
from headwater.storage.state import CURSOR, StateStore, StateWriter, key
from headwater.storage.wal import FsyncPolicy, PartitionLog
from headwater.wire.messages import (
    AckEntry,
    AckKind,
    DispatchMode,
    TopicInfo,
)
from headwater.wire.records import build_batch, read_records
from tests.support.queue_session import exclusive_subscription

MESSAGES = 40
DELIVERY_WAIT = 5.0  # seconds; a delivery takes milliseconds


async def _cursor_floor(state: StateStore, floor: int) -> None:
    """Wait (a bounded number of loop turns) until the stored cursor's floor is `floor`."""
    for _ in range(1000):
        stored = state.get(key(CURSOR, "acked", "sub", 0))
        if stored is not None and PartitionCursor.decode(stored).floor == floor:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"the stored cursor never reached {floor}")


async def test_acks_under_fsync_always_are_written_at_once_and_share_one_sync(
    tmp_path: Path,
) -> None:
    # an interval far longer than the test: only `flush` can sync before it ends
    settings = TopicSettings(fsync=FsyncPolicy.ALWAYS, fsync_interval_ms=600_000)
    partition_log = PartitionLog.open(tmp_path / "topic" / "0", log_config(settings))
    partition_log.start()
    topic = LogTopic(TopicInfo("acked", 1, DispatchMode.RELIABLE), settings, [partition_log])
    state = StateStore(tmp_path / "state")
    writer = StateWriter(state)
    subscription, consumer, session = exclusive_subscription(topic, writer, 0, 60_000)
    try:
        for i in range(MESSAGES):
            _, sequence = partition_log.append(build_batch([(None, b"%d" % i, [])]), 1)
        await partition_log.wait_durable(sequence)
        subscription.attach(consumer)
        offsets: list[int] = []
        while len(offsets) < MESSAGES:
            delivery = await asyncio.wait_for(session.deliveries.get(), DELIVERY_WAIT)
            offsets += [r.offset for r in read_records(delivery.batch)]
        assert offsets == list(range(MESSAGES))

        for offset in offsets:  # one round of acks, and one cursor write, at a time
            subscription.ack(consumer, [AckEntry(0, offset)], AckKind.INDIVIDUAL)
            await _cursor_floor(state, offset + 1)
        assert writer.commits == 0, "a synced write per round of acks"

        await writer.flush()
        assert writer.commits == 1  # every round's write, synced once
        # the policy is read at each write: on `interval`, acks are never synced on their own
        topic.settings = dataclasses.replace(settings, fsync=FsyncPolicy.INTERVAL)
        partition_log.append(build_batch([(None, b"late", [])]), 1)
        delivery = await asyncio.wait_for(session.deliveries.get(), DELIVERY_WAIT)
        (record,) = read_records(delivery.batch)
        subscription.ack(consumer, [AckEntry(0, record.offset)], AckKind.INDIVIDUAL)
        await _cursor_floor(state, MESSAGES + 1)
        await writer.flush()
        assert writer.commits == 1
    finally:
        await subscription.close()
        await writer.flush()
        await partition_log.close()
        state.close()
