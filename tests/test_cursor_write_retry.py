"""A reliable subscription's cursor write that fails is retried, logged and counted.

The pump coalesces cursor writes into a task of its own (`ReliableSubscription._flush`). A write
that raised (RocksDB's I/O error) ended that task with an exception nobody retrieved, and the
partitions it had taken from `dirty` were not written again until they changed again: a restart
redelivered every acknowledgement made meanwhile, and nothing said so. Under fsync `always` a
failed sync of written cursors was only logged by the writer. Now both are retried (a failed
write after a backoff, a failed sync in the next sync window), logged as
`subscription.cursor_write_failed` and counted in `cursor_write_failures` (the
`headwater_subscription_cursor_write_failures_total` metric).

Real parts: a `PartitionLog`, a `LogTopic`, the real `AppendSignal`, a `StateWriter` over a
RocksDB `StateStore` whose next writes or syncs fail on demand, and a stand-in consumer session.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import structlog

from headwater.durables.cursor import PartitionCursor
from headwater.server.config import TopicSettings
from headwater.server.subscriptions import reliable_subscription
from headwater.server.subscriptions.reliable_subscription import ReliableSubscription
from headwater.server.topics.topic import LogTopic
from headwater.server.topics.topic_settings import log_config
from headwater.storage.state import CURSOR, StateStore, StateWriter, key
from headwater.storage.wal import FsyncPolicy, PartitionLog
from headwater.wire.messages import AckEntry, AckKind, DispatchMode, TopicInfo
from headwater.wire.records import build_batch, read_records
from tests.support.queue_session import exclusive_subscription

_MESSAGES = 5
_WAIT = 5.0  # seconds: bounds a hang; a delivery or a retry takes milliseconds


class FailingStore(StateStore):
    """A `StateStore` whose next `fail_writes` plain writes and `fail_syncs` synced writes raise,
    as rocksdict does on an I/O error."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.fail_writes = 0
        self.fail_syncs = 0

    def write(self, *args: Any, **kwargs: Any) -> None:
        if self.fail_writes:
            self.fail_writes -= 1
            raise OSError("IO error: No space left on device")
        super().write(*args, **kwargs)

    def write_all(self, *args: Any, **kwargs: Any) -> None:
        if self.fail_syncs:
            self.fail_syncs -= 1
            raise OSError("IO error: fsync failed")
        super().write_all(*args, **kwargs)


def _floor(state: StateStore) -> int | None:
    stored = state.get(key(CURSOR, "acked", "sub", 0))
    return None if stored is None else PartitionCursor.decode(stored).floor


async def _stored_floor(state: StateStore, floor: int) -> None:
    while _floor(state) != floor:
        await asyncio.sleep(0)


async def _rewritten(subscription: ReliableSubscription, failures: int) -> None:
    """Until `failures` were counted and the cursors they put back are written again."""
    while (
        subscription.cursor_write_failures < failures
        or subscription.core.dirty
        or subscription._flushing
    ):
        await asyncio.sleep(0)


@pytest.mark.parametrize("fsync", [FsyncPolicy.INTERVAL, FsyncPolicy.ALWAYS])
async def test_a_failed_cursor_write_is_retried_and_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync: FsyncPolicy
) -> None:
    monkeypatch.setattr(
        reliable_subscription, "_CURSOR_RETRY_FIRST", 0.0, raising=False
    )  # no wait to retry
    settings = TopicSettings(fsync=fsync, fsync_interval_ms=600_000)  # syncs only on flush
    partition_log = PartitionLog.open(tmp_path / "topic" / "0", log_config(settings))
    partition_log.start()
    topic = LogTopic(TopicInfo("acked", 1, DispatchMode.RELIABLE), settings, [partition_log])
    state = FailingStore(tmp_path / "state")
    writer = StateWriter(state)
    subscription, consumer, session = exclusive_subscription(topic, writer, 0, 60_000)
    try:
        for i in range(_MESSAGES):
            _, sequence = partition_log.append(build_batch([(None, b"%d" % i, [])]), 1)
        await partition_log.wait_durable(sequence)
        subscription.attach(consumer)
        offsets: list[int] = []
        while len(offsets) < _MESSAGES:
            delivery = await asyncio.wait_for(session.deliveries.get(), _WAIT)
            offsets += [r.offset for r in read_records(delivery.batch)]
        await asyncio.wait_for(writer.flush(), _WAIT)
        with structlog.testing.capture_logs() as logged:
            state.fail_writes = 2
            subscription.ack(consumer, [AckEntry(0, o) for o in offsets], AckKind.INDIVIDUAL)
            # written once the two failures are behind it, with no new ack to make it dirty
            await asyncio.wait_for(_stored_floor(state, _MESSAGES), _WAIT)
        assert subscription.cursor_write_failures == 2
        failed = [e for e in logged if e["event"] == "subscription.cursor_write_failed"]
        assert len(failed) == 2 and failed[0]["partitions"] == [0]
        assert "No space left" in failed[0]["error"]
        if fsync != FsyncPolicy.ALWAYS:
            return
        # under `always`: the written cursor's sync fails, and is tried again
        commits = writer.commits
        state.fail_syncs = 1
        with structlog.testing.capture_logs() as logged:
            await asyncio.wait_for(writer.flush(), _WAIT)  # the sync: fails
            assert writer.commits == commits
            await asyncio.wait_for(_rewritten(subscription, 3), _WAIT)
            await asyncio.wait_for(writer.flush(), _WAIT)  # the retry's sync
        assert writer.commits == commits + 1, "the failed sync was not tried again"
        assert [e["event"] for e in logged if e["event"].endswith("failed")] == [
            "state.sync_failed",
            "subscription.cursor_write_failed",
        ]
    finally:
        await subscription.close()
        await writer.flush()
        await partition_log.close()
        state.close()
