"""A Kafka consumer group's committed offsets are the cursor of the reliable subscription of the
same name on each topic: one model, two protocols (docs/KAFKA.md).

OffsetCommit creates the subscription on first use (Failover, starting at the earliest offset,
so `headwater subscription list` shows the group's lag from the start) and moves each partition's
cursor to the committed offset, in the topic's turn as every change to a subscription is; the
answer waits for a synced write of the moved cursors, so an acknowledged commit survives kill -9.
`subscription reset` moves it for a Kafka group as for a native one. OffsetFetch reads the
cursor's floor (every offset below it is acknowledged: Kafka's "next offset to consume"); a
topic the group never committed on answers -1. Non-reliable topics keep no cursors: a commit there
is refused (INVALID_REQUEST).

Where the offsets live beyond this broker's cursors is a `SharedCursors` given at construction:
`LocalCursors` on one broker (this broker's cursors are the whole truth); in a cluster the
cluster's cursor checkpoints in etcd, which a partition's next owner takes its cursors from
(`server.cluster.cluster_mode.GroupCursors`). There the group's coordinator may not serve every
partition the group commits on: each committed offset is written to the partition's checkpoint
in etcd before the commit is answered (and moves the local cursor too where the partition is
served here), and OffsetFetch reads the checkpoint. So offsets survive the coordinator's move or
kill -9, and a native consumer of the subscription starts where the group left it.
"""

from __future__ import annotations

from typing import Protocol

from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.subscriptions.reliable_subscription import ReliableSubscription
from headwater.storage.state import CURSOR, key
from headwater.wire import messages as m
from headwater.wire.errors import (
    HeadwaterError,
    InvalidPartition,
    NotSupported,
    SubscriptionTypeMismatch,
    UnknownTopic,
)


class SharedCursors(Protocol):
    """A cluster's subscription cursors, as every broker reads them (`server.cluster`'s
    checkpoints in etcd); `StorageError` when etcd does not answer."""

    def serves(self, topic: str, partition: int) -> bool: ...

    async def load(
        self, topic: str, subscription: str, partitions: list[int]
    ) -> dict[int, int | None]:
        """Each partition's cursor floor, None where there is none (one etcd round trip per
        hundred partitions)."""
        ...

    async def store(self, topic: str, subscription: str, offsets: dict[int, int]) -> None:
        """Cursors at these offsets (everything below each acknowledged); a failure fails the
        whole commit, though some may have been written (the client's retry writes them again)."""
        ...


class LocalCursors:
    """One broker: it serves every partition, and a group's offsets are its own cursors."""

    def __init__(self, catalog: TopicCatalog) -> None:
        self._catalog = catalog

    def serves(self, topic: str, partition: int) -> bool:
        return True

    async def load(
        self, topic: str, subscription: str, partitions: list[int]
    ) -> dict[int, int | None]:
        found = self._catalog.topics.get(topic)
        subscribed = None if found is None else found.subscriptions.get(subscription)
        if not isinstance(subscribed, ReliableSubscription):
            return dict.fromkeys(partitions)
        cursors = subscribed.core.cursors
        return {p: cursors[p].floor if p < len(cursors) else None for p in partitions}

    async def store(self, topic: str, subscription: str, offsets: dict[int, int]) -> None:
        return None  # the cursors moved are on disk already (`GroupOffsets.commit`)


class GroupOffsets:
    def __init__(self, catalog: TopicCatalog, shared: SharedCursors | None = None) -> None:
        """`shared`: where the offsets are kept beyond this broker (a cluster's); by default
        this broker's cursors alone."""
        self._catalog = catalog
        self._shared: SharedCursors = shared or LocalCursors(catalog)

    async def commit(
        self, group: str, topic_name: str, offsets: dict[int, int]
    ) -> dict[int, HeadwaterError | None]:
        """Move `group`'s cursor of each partition to its offset; each partition's refusal, or
        None once its cursor is on disk."""
        results: dict[int, HeadwaterError | None] = {}
        async with self._catalog.turn(topic_name):
            try:
                subscription = await self._subscription(group, topic_name)
            except HeadwaterError as exc:
                return dict.fromkeys(offsets, exc)
            topic = self._catalog.topics[topic_name]
            cursors = subscription.core.cursors
            positions = [cursor.floor for cursor in cursors]
            moved: list[int] = []
            elsewhere: dict[int, int] = {}  # a cluster's partitions served by another broker
            shared = self._shared
            for partition, offset in offsets.items():
                if not 0 <= partition < len(cursors):
                    results[partition] = InvalidPartition(
                        f"topic {topic_name!r} has no partition {partition}"
                    )
                    continue
                if not shared.serves(topic_name, partition):
                    # our copy's ends are not the partition's: its owner's are
                    elsewhere[partition] = max(0, offset)
                    continue
                # within what the partition holds: a cursor past the end would count negative lag
                start = topic.start_offset(partition)
                positions[partition] = max(
                    start, min(offset, topic.partitions[partition].next_offset)
                )
                moved.append(partition)
            if moved:
                subscription.seek(positions)
                await self._catalog.writer.synced(
                    {key(CURSOR, topic_name, group, p): cursors[p].encode() for p in moved}
                )
            # in the topic's turn: two commits of a partition reach etcd in their order
            stored = {p: cursors[p].floor for p in moved} | elsewhere
            try:
                await shared.store(topic_name, group, stored)
            except HeadwaterError as exc:
                results |= dict.fromkeys(stored, exc)
            moved = [p for p in stored if p not in results]
        for partition in moved:
            results[partition] = None
        return results

    async def _subscription(self, group: str, topic_name: str) -> ReliableSubscription:
        topic = self._catalog.topics.get(topic_name)
        if topic is None:
            raise UnknownTopic(f"topic {topic_name!r} does not exist")
        if not topic.reliable:
            raise NotSupported(
                f"topic {topic_name!r} is non-reliable: it keeps no subscription cursors"
            )
        subscription = await self._catalog.subscriptions.get_or_create(
            topic,
            group,
            m.SubscriptionType.FAILOVER,
            m.SubscriptionSettings(start=m.StartPosition.EARLIEST),
        )
        if not isinstance(subscription, ReliableSubscription):
            raise SubscriptionTypeMismatch(
                f"subscription {group!r} of topic {topic_name!r} is not a reliable one"
            )
        return subscription

    async def committed(self, group: str, topic_name: str, partitions: list[int]) -> dict[int, int]:
        """The group's committed offset of each partition, -1 where it has none."""
        topic = self._catalog.topics.get(topic_name)
        if topic is None:
            raise UnknownTopic(f"topic {topic_name!r} does not exist")
        offsets = dict.fromkeys(partitions, -1)
        known = [p for p in partitions if 0 <= p < len(topic.partitions)]
        if known:
            found = await self._shared.load(topic_name, group, known)
            offsets |= {p: floor for p, floor in found.items() if floor is not None}
        return offsets

    def partitions(self, topic_name: str) -> list[int]:
        topic = self._catalog.topics.get(topic_name)
        return [] if topic is None else list(range(len(topic.partitions)))

    def topics_of(self, group: str) -> list[str]:
        """The topics with a subscription named `group` (OffsetFetch of every topic)."""
        return sorted(
            name
            for name, topic in self._catalog.topics.items()
            if isinstance(topic.subscriptions.get(group), ReliableSubscription)
        )

    def groups(self) -> dict[str, list[str]]:
        """Every reliable subscription's name (a group with offsets) and the topics it is on."""
        found: dict[str, list[str]] = {}
        for name, topic in self._catalog.topics.items():
            for subscription, subscribed in topic.subscriptions.items():
                if isinstance(subscribed, ReliableSubscription):
                    found.setdefault(subscription, []).append(name)
        return found
