"""A cluster take-over retried after one that failed half-way keeps what the previous owner
stored readable, on real parts (a topic catalog on disk, the cloud tail and manifests over the
local object store backend, the tail committer) with an in-memory stand-in for etcd.

The first take-over restarts the local log at the tail's end E (the previous owner's chunks
below E read in place), then fails loading the cursors (etcd unreachable). The retry finds a
local log ending at E with E verified; it must not keep that log as if it held everything above
the manifest's segments: keeping it dropped the chunks in place, so offsets below E were
unreadable and a subscription from earliest started at E (acknowledged messages never read
back). Fixed in 33b6f27.

A subscription created here between a take-over's local part and the coordinator's SERVING flip
(a consumer's SUBSCRIBE reaching the new owner as the partition moves) must take the previous
owner's cursor: the take-over loaded cursors only for the subscriptions it knew, and the new
subscription's checkpointing looked only at the partitions already SERVING, so neither did, and
a `latest` subscription skipped what it had not read (test_cluster_attack's joined-broker test,
now and then under load)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import headwater
from headwater.durables.cursor import PartitionCursor
from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.cluster.cluster_partitions import ClusterPartitions, checkpoint_key
from headwater.server.cluster.coordinator_state import Standing
from headwater.server.cluster.tail_commit import TailCommitter
from headwater.server.config import ObjectStoreConfig, ServerConfig
from headwater.server.subscriptions.reliable_subscription import ReliableSubscription
from headwater.server.topics.placement import LocalPlacement
from headwater.server.topics.topic import LogTopic
from headwater.storage.archive import ObjectArchive
from headwater.storage.cloud_tail import Chunk, CloudTail
from headwater.storage.objectstore import LocalObjectStore
from headwater.storage.partition_manifest import PartitionManifests
from headwater.storage.state import StateStore
from headwater.storage.uploader import Uploader
from headwater.wire import messages as m
from headwater.wire.errors import StorageError
from headwater.wire.records import build_batch, read_records, stamp_base_offset

TOPIC = "orders"
PREVIOUS_EPOCH = 3
FIRST = [b"m0", b"m1"]  # the previous owner's first chunk: offsets [0, 2)
SECOND = [b"m2", b"m3", b"m4"]  # and its second: [2, 5)


def stamped(values: list[bytes], base: int) -> bytes:
    batch = bytearray(build_batch([(None, v, ()) for v in values]))
    stamp_base_offset(batch, base)
    return bytes(batch)


class Checkpoints:
    """The cluster metadata (etcd) for one partition owned here: cursors in a dict; with
    `flaky`, the first read of one fails as when etcd is unreachable. `serving` is the
    coordinator's flip to SERVING, after `acquire` returned."""

    def __init__(self, topic: str, partition: int, flaky: bool = False) -> None:
        self.key = (topic, partition)
        self.current: int | None = None  # our epoch for the partition, once acquiring
        self.serving = False
        self.values: dict[str, bytes] = {}
        self.reads = 0
        self.flaky = flaky

    async def put_checkpoint(self, key: str, value: bytes) -> None:
        self.values[key] = value

    async def create_checkpoint(
        self, key: str, value: bytes, since: int = 0, topic: str | None = None
    ) -> bytes | None:
        if key in self.values:
            return self.values[key]
        self.values[key] = value
        return None

    async def get_checkpoint(self, key: str, since: int = 0) -> bytes | None:
        self.reads += 1
        if self.flaky and self.reads == 1:
            raise StorageError("cluster metadata unavailable")
        return self.values.get(key)

    def incarnation(self, name: str) -> int:
        return 0

    def owned(self) -> list[tuple[str, int]]:
        return [self.key] if self.current is not None and self.serving else []

    def epoch(self, topic: str, partition: int) -> int | None:
        return self.current if (topic, partition) == self.key else None


class TestPlacement(LocalPlacement):
    """A cluster's placement, as far as the catalog sees it: ownership, and the hook a
    subscription created here calls (ClusterMode's checkpoints it)."""

    __test__ = False

    def __init__(self, serves: Callable[[str, int], bool]) -> None:
        self._serves = serves
        self.created: Callable[[LogTopic, str, dict[str, Any]], Awaitable[None]] | None = None

    @property
    def serves(self) -> Callable[[str, int], bool] | None:
        return self._serves

    async def subscription_created(
        self, topic: LogTopic, name: str, definition: dict[str, Any]
    ) -> None:
        if self.created is not None:
            await self.created(topic, name, definition)


class Broker:
    """This broker, built as serve.py and ClusterMode build it, over the previous owner's
    tail: chunks [0, 5) of epoch 3."""

    def __init__(self, tmp_path: Path, checkpoints: Checkpoints) -> None:
        self.store = LocalObjectStore(tmp_path / "objects")
        self.tail = CloudTail(self.store)
        config = ServerConfig(
            data_dir=tmp_path / "data",
            object_store=ObjectStoreConfig(backend="local", path=tmp_path / "objects"),
        )
        self.state = StateStore(tmp_path / "data" / "state")
        uploader = Uploader(self.store, self.state, 0.01, 0.1)
        self.checkpoints = checkpoints

        def serves(topic: str, partition: int) -> bool:
            return checkpoints.epoch(topic, partition) is not None

        self.placement = TestPlacement(serves)
        self.catalog = TopicCatalog(
            config, self.state, uploader, ObjectArchive(self.store, uploader), self.placement
        )

        self.committer = TailCommitter(
            self.tail,
            0.001,
            lambda topic, partition: Standing.HELD if serves(topic, partition) else Standing.GONE,
            checkpoints.epoch,
            lambda topic, partition: headwater.NotOwner("owner=none"),
        )
        self.partitions = ClusterPartitions(
            self.catalog, self.tail, self.committer, checkpoints, serves
        )
        self.committer.on_stored = self.partitions.stored
        uploader.may_upload = serves
        uploader.purges = False
        uploader.publisher = self.partitions
        self.uploader = uploader

    async def __aenter__(self) -> LogTopic:
        # the previous owner (epoch 3) claimed the partition and stored [0, 5) in two chunks
        await PartitionManifests(self.store).claim(TOPIC, 0, PREVIOUS_EPOCH)
        await self.tail.mark_epoch(TOPIC, 0, PREVIOUS_EPOCH, 0)
        await self.tail.put(TOPIC, 0, Chunk(0, 2, PREVIOUS_EPOCH), stamped(FIRST, 0))
        await self.tail.put(TOPIC, 0, Chunk(2, 5, PREVIOUS_EPOCH), stamped(SECOND, 2))
        self.uploader.start()
        await self.catalog.open()
        topic = await self.catalog.create_topic(
            m.CreateTopicRequest(
                TOPIC, 1, m.DispatchMode.RELIABLE, (m.ConfigEntry("fsync", "never"),)
            )
        )
        assert isinstance(topic, LogTopic)
        return topic

    async def __aexit__(self, *exc: object) -> None:
        self.checkpoints.current = None
        await self.partitions.close()
        self.committer.reset(TOPIC, 0)
        await self.committer.settle(TOPIC, 0)
        await self.catalog.close()
        await self.store.close()
        self.state.close()


EARLIEST = m.SubscriptionSettings(start=m.StartPosition.EARLIEST)


async def test_a_take_over_retried_after_failing_to_load_cursors_keeps_the_chunks_readable(
    tmp_path: Path,
) -> None:
    """Chunks [0, 5) of epoch 3 in the tail; epoch 7's take-over fails loading the cursors after
    restarting the log at 5, epoch 8's succeeds: offsets 0..4 are still readable here."""
    checkpoints = Checkpoints(TOPIC, 0, flaky=True)
    broker = Broker(tmp_path, checkpoints)
    async with broker as topic:
        catalog, partitions = broker.catalog, broker.partitions
        # the take-over reads a cursor from etcd for each reliable subscription: with one, the
        # cursors are loaded, and the first load fails
        subscription = await catalog.subscriptions.get_or_create(
            topic, "s", m.SubscriptionType.EXCLUSIVE, EARLIEST
        )
        assert isinstance(subscription, ReliableSubscription)

        checkpoints.current = 7
        with pytest.raises(StorageError, match="cluster metadata unavailable"):
            await partitions.acquire(TOPIC, 0, 7)
        assert topic.partitions[0].log.start_offset == 5  # restarted at E, [0, 5) in place
        assert checkpoints.reads == 1

        # the coordinator gave the key up and won it again: a new epoch
        checkpoints.current = 8
        await partitions.acquire(TOPIC, 0, 8)
        assert checkpoints.reads == 2

        assert topic.start_offset(0) == 0
        batches = await topic.read(0, 0)
        assert batches
        assert [r.value for r in read_records(batches[0])] == FIRST
        # a subscription with no cursor in etcd starts at the oldest stored message, and so
        # does one created from earliest after the take-over
        assert subscription.core.position(0) == 0
        later = await catalog.subscriptions.get_or_create(
            topic, "later", m.SubscriptionType.EXCLUSIVE, EARLIEST
        )
        assert isinstance(later, ReliableSubscription)
        assert later.core.position(0) == 0


async def test_a_subscription_created_before_the_partition_is_served_takes_the_checkpoint(
    tmp_path: Path,
) -> None:
    """The previous owner checkpointed subscription `s` at 2 (it read [0, 2) of [0, 5)). Our
    take-over's local part is done, the coordinator has not flipped the partition to SERVING
    yet, and a consumer's SUBSCRIBE from `latest` creates `s` here: it continues at 2, and the
    cursor it checkpoints is 2, not 5 (three unread messages skipped)."""
    checkpoints = Checkpoints(TOPIC, 0)
    checkpoints.values[checkpoint_key(TOPIC, "s", 0)] = PartitionCursor.starting_at(2).encode()
    broker = Broker(tmp_path, checkpoints)
    async with broker as topic:
        catalog, partitions = broker.catalog, broker.partitions

        async def created(topic: LogTopic, name: str, definition: dict[str, object]) -> None:
            await partitions.checkpoint_new(topic, name)  # as ClusterMode's hook does

        broker.placement.created = created
        checkpoints.current = 7
        await partitions.acquire(TOPIC, 0, 7)  # no subscription known here yet
        latest = m.SubscriptionSettings(start=m.StartPosition.LATEST)
        async with catalog.turn(TOPIC):  # as a SUBSCRIBE holds it
            subscription = await catalog.subscriptions.get_or_create(
                topic, "s", m.SubscriptionType.EXCLUSIVE, latest
            )
        checkpoints.serving = True  # the coordinator's flip, a moment later
        assert isinstance(subscription, ReliableSubscription)
        assert subscription.core.position(0) == 2
        stored = checkpoints.values[checkpoint_key(TOPIC, "s", 0)]
        assert PartitionCursor.decode(stored).floor == 2
