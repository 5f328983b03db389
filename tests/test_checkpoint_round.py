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

import pytest
import structlog

from headwater.durables.cursor import PartitionCursor
from headwater.server.cluster.cluster_partitions import ClusterPartitions, checkpoint_key
from headwater.server.config import TopicSettings
from headwater.server.topics.topic import LogTopic
from headwater.server.topics.topic_settings import log_config
from headwater.storage.state import StateStore, StateWriter
from headwater.storage.wal import PartitionLog
from headwater.wire.messages import DispatchMode, TopicInfo
from headwater.wire.records import build_batch, read_records
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


class Etcd:
    """etcd's checkpoints as `ClusterPartitions` sees them: compare-and-swap on a dict."""

    def __init__(self, owned: list[tuple[str, int]]) -> None:
        self._owned = owned
        self.values: dict[str, bytes] = {}

    async def swap_checkpoint(
        self,
        key: str,
        value: bytes,
        expected: bytes | None,
        since: int = 0,
        topic: str | None = None,
    ) -> tuple[bool, bytes | None]:
        current = self.values.get(key)
        if current != expected:
            return False, current
        self.values[key] = value
        return True, None

    async def create_checkpoint(
        self, key: str, value: bytes, since: int = 0, topic: str | None = None
    ) -> bytes | None:
        if key in self.values:
            return self.values[key]
        self.values[key] = value
        return None

    async def get_checkpoint(self, key: str, since: int = 0) -> bytes | None:
        return self.values.get(key)

    def incarnation(self, name: str) -> int:
        return 0

    def owned(self) -> list[tuple[str, int]]:
        return self._owned


@pytest.mark.parametrize("racing", ["checkpoint_round", "checkpoint_new"])
async def test_the_start_another_broker_wrote_does_not_deliver_again_what_is_in_flight(
    tmp_path: Path, racing: str
) -> None:
    """A Shared subscription created through several brokers at once: each writes its start to
    etcd, and the owner's round (or its own `checkpoint_new`) meets the start another one wrote,
    the same acknowledgements as its own. Taking it as a take-over's checkpoint forgot the
    messages in flight to the consumer and delivered them again at once (a consumer of the
    subscription got a partition's messages twice and another partition's not at all:
    test_cluster_transactions' exactly-once tests flaked under load). They stay in flight, and
    the cursor here is what etcd holds afterwards."""
    settings = TopicSettings()
    state = StateStore(tmp_path / "state")
    writer = StateWriter(state)
    partition_log = PartitionLog.open(tmp_path / "in" / "0", log_config(settings))
    partition_log.start()
    topic = LogTopic(TopicInfo("in", 1, DispatchMode.RELIABLE), settings, [partition_log])
    subscription, consumer, session = exclusive_subscription(topic, writer, 0, 60_000)
    topic.subscriptions["sub"] = subscription
    etcd = Etcd([("in", 0)])
    partitions = ClusterPartitions(
        cast(Any, SimpleNamespace(topics={"in": topic})),
        cast(Any, SimpleNamespace(store=None)),
        cast(Any, None),
        etcd,
        lambda topic, partition: True,
        checkpoint_interval=3600,
    )
    partitions._taken[("in", 0)] = 0  # taken over here, in incarnation 0 of the stand-in
    key = checkpoint_key("in", "sub", 0)
    try:
        for i in range(3):
            _, sequence = partition_log.append(build_batch([(None, b"%d" % i, [])]), 1)
        await partition_log.wait_durable(sequence)
        subscription.attach(consumer)
        delivered = 0
        while delivered < 3:
            delivery = await asyncio.wait_for(session.deliveries.get(), _WAIT)
            delivered += len(read_records(delivery.batch))
        # another broker created the subscription first: its start is in etcd
        etcd.values[key] = PartitionCursor.starting_at(0).encode()
        if racing == "checkpoint_new":
            await partitions.checkpoint_new(topic, "sub")
        assert not await partitions.checkpoint_now("in", 0)
        assert subscription.core.in_flight(0) == 3
        assert subscription.core.held_by(consumer.consumer_id, 0, 0, 3)
        assert etcd.values[key] == subscription.core.cursors[0].encode()
        assert session.deliveries.empty()
    finally:
        await partitions.close()
        await subscription.close()
        await writer.flush()
        await partition_log.close()
        state.close()
