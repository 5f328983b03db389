"""A cluster take-over retried after one that failed half-way keeps what the previous owner
stored readable, on real parts (a topic catalog on disk, the cloud tail and manifests over the
local object store backend, the tail committer) with an in-memory stand-in for etcd.

The first take-over restarts the local log at the tail's end E (the previous owner's chunks
below E read in place), then fails loading the cursors (etcd unreachable). The retry finds a
local log ending at E with E verified; it must not keep that log as if it held everything above
the manifest's segments: keeping it dropped the chunks in place, so offsets below E were
unreadable and a subscription from earliest started at E (acknowledged messages never read
back). Fixed in 33b6f27."""

from __future__ import annotations

from pathlib import Path

import pytest

import headwater
from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.cluster.cluster_partitions import ClusterPartitions
from headwater.server.cluster.coordinator_state import Standing
from headwater.server.cluster.tail_commit import TailCommitter
from headwater.server.config import ObjectStoreConfig, ServerConfig
from headwater.server.subscriptions.reliable_subscription import ReliableSubscription
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


class FlakyCheckpoints:
    """The cluster metadata (etcd) for one partition owned here: cursors in a dict, and the
    first read of one fails as when etcd is unreachable."""

    def __init__(self, topic: str, partition: int) -> None:
        self.key = (topic, partition)
        self.current: int | None = None  # our epoch for the partition, once acquiring
        self.values: dict[str, bytes] = {}
        self.reads = 0

    async def put_checkpoint(self, key: str, value: bytes) -> None:
        self.values[key] = value

    async def get_checkpoint(self, key: str, since: int = 0) -> bytes | None:
        self.reads += 1
        if self.reads == 1:
            raise StorageError("cluster metadata unavailable")
        return self.values.get(key)

    def incarnation(self, name: str) -> int:
        return 0

    def owned(self) -> list[tuple[str, int]]:
        return [self.key] if self.current is not None else []

    def epoch(self, topic: str, partition: int) -> int | None:
        return self.current if (topic, partition) == self.key else None


async def test_a_take_over_retried_after_failing_to_load_cursors_keeps_the_chunks_readable(
    tmp_path: Path,
) -> None:
    """Chunks [0, 5) of epoch 3 in the tail; epoch 7's take-over fails loading the cursors after
    restarting the log at 5, epoch 8's succeeds: offsets 0..4 are still readable here."""
    store = LocalObjectStore(tmp_path / "objects")
    tail = CloudTail(store)
    # the previous owner (epoch 3) claimed the partition and stored [0, 5) in two chunks
    await PartitionManifests(store).claim(TOPIC, 0, PREVIOUS_EPOCH)
    await tail.mark_epoch(TOPIC, 0, PREVIOUS_EPOCH, 0)
    await tail.put(TOPIC, 0, Chunk(0, 2, PREVIOUS_EPOCH), stamped(FIRST, 0))
    await tail.put(TOPIC, 0, Chunk(2, 5, PREVIOUS_EPOCH), stamped(SECOND, 2))

    # this broker, built as serve.py and ClusterMode build it
    config = ServerConfig(
        data_dir=tmp_path / "data",
        object_store=ObjectStoreConfig(backend="local", path=tmp_path / "objects"),
    )
    state = StateStore(tmp_path / "data" / "state")
    uploader = Uploader(store, state, 0.01, 0.1)
    catalog = TopicCatalog(config, state, uploader, ObjectArchive(store, uploader))
    checkpoints = FlakyCheckpoints(TOPIC, 0)

    def serves(topic: str, partition: int) -> bool:
        return checkpoints.epoch(topic, partition) is not None

    committer = TailCommitter(
        tail,
        0.001,
        lambda topic, partition: Standing.HELD if serves(topic, partition) else Standing.GONE,
        checkpoints.epoch,
        lambda topic, partition: headwater.NotOwner("owner=none"),
    )
    partitions = ClusterPartitions(catalog, tail, committer, checkpoints, serves)
    committer.on_stored = partitions.stored
    uploader.may_upload = serves
    uploader.purges = False
    uploader.publisher = partitions
    uploader.start()
    try:
        await catalog.open()
        topic = await catalog.create_topic(
            m.CreateTopicRequest(
                TOPIC, 1, m.DispatchMode.RELIABLE, (m.ConfigEntry("fsync", "never"),)
            )
        )
        assert isinstance(topic, LogTopic)
        # the take-over reads a cursor from etcd for each reliable subscription: with one, the
        # cursors are loaded, and the first load fails
        earliest = m.SubscriptionSettings(start=m.StartPosition.EARLIEST)
        subscription = await catalog.subscriptions.get_or_create(
            topic, "s", m.SubscriptionType.EXCLUSIVE, earliest
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
            topic, "later", m.SubscriptionType.EXCLUSIVE, earliest
        )
        assert isinstance(later, ReliableSubscription)
        assert later.core.position(0) == 0
    finally:
        checkpoints.current = None
        await partitions.close()
        committer.reset(TOPIC, 0)
        await committer.settle(TOPIC, 0)
        await catalog.close()
        await store.close()
        state.close()
