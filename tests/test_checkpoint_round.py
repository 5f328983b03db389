"""A cluster broker's checkpoint round goes on past a partition that fails.

`ClusterPartitions._checkpoint_loop` writes, every `checkpoint_interval`, the cursors of each
partition this broker owns. A failure of one partition's write (etcd refusing it, or a cursor of
its own) used to `break` the round: every partition after it in `owned()` went unchecked, round
after round, for as long as the first one failed, and a take-over then redelivered all their
acknowledgements since. Real parts for the subscriptions (a `PartitionLog`, a `LogTopic`, a
`ReliableSubscription` over a RocksDB `StateWriter`), a stand-in for etcd's checkpoints whose
writes of one topic fail.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import structlog

from headwater.server.cluster.cluster_partitions import ClusterPartitions, checkpoint_key
from headwater.server.config import TopicSettings
from headwater.server.topics.topic import LogTopic
from headwater.server.topics.topic_settings import log_config
from headwater.storage.state import StateStore, StateWriter
from headwater.storage.wal import PartitionLog
from headwater.wire.messages import DispatchMode, TopicInfo
from tests.support.queue_session import exclusive_subscription

_WAIT = 5.0  # seconds: a round takes milliseconds unless the failing partition ends it


class FailingFirst:
    """etcd's checkpoints as `ClusterPartitions` sees them: every write of topic `broken`
    fails; the others are recorded."""

    def __init__(self, owned: list[tuple[str, int]]) -> None:
        self._owned = owned
        self.written: dict[str, bytes] = {}
        self.failed = 0
        self.wrote_healthy = asyncio.Event()

    async def swap_checkpoint(
        self,
        key: str,
        value: bytes,
        expected: bytes | None,
        since: int = 0,
        topic: str | None = None,
    ) -> tuple[bool, bytes | None]:
        if key.startswith("broken/"):
            self.failed += 1
            raise ConnectionError("etcd: request timed out")
        self.written[key] = value
        self.wrote_healthy.set()
        return True, None

    async def create_checkpoint(
        self, key: str, value: bytes, since: int = 0, topic: str | None = None
    ) -> bytes | None:
        raise AssertionError("not used by the checkpoint loop")

    async def get_checkpoint(self, key: str, since: int = 0) -> bytes | None:
        raise AssertionError("not used by the checkpoint loop")

    def incarnation(self, name: str) -> int:
        return 0

    def owned(self) -> list[tuple[str, int]]:
        return self._owned

    def epoch(self, topic: str, partition: int) -> int | None:
        return 1


async def test_a_failing_partition_does_not_end_the_round_for_the_others(tmp_path: Path) -> None:
    settings = TopicSettings()
    state = StateStore(tmp_path / "state")
    writer = StateWriter(state)
    topics: dict[str, LogTopic] = {}
    logs = []
    subscriptions = []
    for name in ("broken", "healthy"):
        partition_log = PartitionLog.open(tmp_path / name / "0", log_config(settings))
        partition_log.start()
        logs.append(partition_log)
        topic = LogTopic(TopicInfo(name, 1, DispatchMode.RELIABLE), settings, [partition_log])
        subscription, _, _ = exclusive_subscription(topic, writer, 7, 60_000)
        topic.subscriptions["sub"] = subscription
        topics[name] = topic
        subscriptions.append(subscription)
    # the failing partition comes first in the round
    checkpoints = FailingFirst([("broken", 0), ("healthy", 0)])
    partitions = ClusterPartitions(
        cast(Any, SimpleNamespace(topics=topics)),
        cast(Any, SimpleNamespace(store=None)),
        cast(Any, None),
        checkpoints,
        lambda topic, partition: True,
        checkpoint_interval=0,
    )
    # both taken over here (as a take-over records them), in incarnation 0 of the stand-in
    partitions._taken.update({("broken", 0): 0, ("healthy", 0): 0})
    try:
        with structlog.testing.capture_logs() as logged:
            partitions.start()
            await asyncio.wait_for(checkpoints.wrote_healthy.wait(), _WAIT)
        assert checkpoints.written.keys() == {checkpoint_key("healthy", "sub", 0)}
        assert checkpoints.failed >= 1
        assert partitions.checkpoint_failures == checkpoints.failed
        failures = [e for e in logged if e["event"] == "cluster.checkpoint_failed"]
        assert failures and failures[0]["topic"] == "broken"
    finally:
        await partitions.close()
        for subscription in subscriptions:
            await subscription.close()
        await writer.flush()
        for partition_log in logs:
            await partition_log.close()
        state.close()
