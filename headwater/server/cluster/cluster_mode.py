"""Cluster mode: the deployment this broker serves in when it is one of a cluster on etcd and a
shared object store: the `server.requests.placement.Placement` the catalog and the broker are
built with (docs/CLUSTER.md).

`serve` builds it first, from the configuration alone (the etcd coordinator, the object-store
acknowledgement path `server.cluster.tail_commit`, the links to the other brokers); hands it to
the uploader, the catalog and the broker as a constructor argument; lets it build its parts over
the recovered catalog (`bind`: the take-over handler `server.cluster.cluster_partitions`, the
Exclusive claims, the Kafka group cursors); then starts it (joins etcd). Nothing of another
object is reassigned afterwards. What it answers:

- topics are defined in etcd: CREATE_TOPIC creates the topic here (which checks the request) and
  then in etcd (a transaction: a name taken meanwhile gives TOPIC_EXISTS and ours goes); every
  broker creates and deletes its local copy from the watch (`on_topic`). A broker that starts
  drops local topics etcd no longer has. The topics the server creates for itself (dead letters)
  take the same path (`define_topic`).
- a reliable append is answered once in the object store (`durability`); segments are uploaded
  only for partitions served here, each under a name of its own, and count once the partition's
  manifest names them (which lets the tail chunks they hold go).
- a record the server writes itself to a partition served by another broker is produced there
  over a peer link (`write`, `server.cluster.peer_links`).
- a reliable subscription is defined in etcd before it is made here, put-if-absent: a broker
  making one defined already (through another broker) makes it as defined there (type,
  settings, start), so two creators racing agree; its first checkpoints follow.
- the broker's Kafka listener, when it has one, is registered with it (host and port), so that
  every broker's Kafka Metadata names it (docs/KAFKA.md); a Kafka group's offsets are its
  subscription's cursor checkpoints in etcd (`GroupCursors`), which every broker reads.
- transactions keep their states in etcd and have markers written by each partition's owner
  (`server.cluster.cluster_transactions`, built by `bind`, its replica read by `start`).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from headwater.durables.cursor import PartitionCursor
from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.cluster.cluster_partitions import ClusterPartitions, checkpoint_key
from headwater.server.cluster.cluster_transactions import ClusterTransactions
from headwater.server.cluster.coordinator import Coordinator
from headwater.server.cluster.exclusive_claims import ExclusiveGate
from headwater.server.cluster.peer_links import PeerLinks
from headwater.server.cluster.shared_commit import SharedCommitter
from headwater.server.cluster.shared_tail import SharedTail
from headwater.server.cluster.tail_commit import TailCommitter
from headwater.server.config import ServerConfig
from headwater.server.requests.consumer_requests import close_consumers
from headwater.server.requests.create_partitions import add_partitions, check_growth
from headwater.server.requests.partition_ownership import BrokerAddress, Ownership, not_owner
from headwater.server.requests.placement import ProducerIds, SharedProducerIds
from headwater.server.requests.topic_definitions import (
    SubscribeGate,
    TopicDefinitions,
    close_topic_consumers,
)
from headwater.server.requests.transaction_placement import TransactionPlacement
from headwater.server.topics.placement import CreateLocal, append_here
from headwater.server.topics.topic import (
    LOCAL_DURABILITY,
    Durability,
    LogPartition,
    LogTopic,
    stamped_batch,
)
from headwater.storage.cloud_tail import CloudTail
from headwater.storage.objectstore import ObjectStore
from headwater.storage.partition_manifest import PartitionManifests
from headwater.storage.uploader import UploadedSegment
from headwater.storage.wal import SealedSegment
from headwater.wire import messages as m
from headwater.wire.errors import ErrorCode, InvalidRequest, TopicExists, UnknownTopic

log = structlog.get_logger(__name__)


class ClusterMode:
    def __init__(
        self,
        config: ServerConfig,
        store: ObjectStore,
        port: int,
        kafka: tuple[str, int] | None = None,
        peer_tls: ssl.SSLContext | None = None,
    ) -> None:
        """`kafka`: the (host, port) this broker's Kafka listener is reached at, registered
        in etcd with the broker (None: it has none)."""
        settings = config.cluster
        advertise = settings.advertise or f"{config.host}:{port}"
        host, _, advertised_port = advertise.rpartition(":")
        this = BrokerAddress(settings.broker_id or advertise, host, int(advertised_port))
        self.coordinator = Coordinator(
            settings.etcd,
            this,
            lease_ttl=settings.lease_ttl_ms / 1000,
            handoff_after=settings.handoff_after_ms / 1000,
            kafka=kafka,
        )
        coordinator = self.coordinator
        self.committer: TailCommitter | SharedCommitter
        if settings.tail_layout == "broker":
            # one object per broker per window, indexed in etcd (shared_tail.py)
            shared = SharedTail(store, coordinator.call_etcd, coordinator.layout)
            self.tail: CloudTail = shared
            self.committer = SharedCommitter(
                shared,
                this.broker_id,
                settings.commit_interval_ms / 1000,
                coordinator.epoch,
                lambda topic, partition: not_owner(coordinator, topic, partition),
            )
        else:
            self.tail = CloudTail(store)
            self.committer = TailCommitter(
                self.tail,
                settings.commit_interval_ms / 1000,
                coordinator.standing,
                coordinator.epoch,
                lambda topic, partition: not_owner(coordinator, topic, partition),
            )
        self._checkpoint_interval = settings.checkpoint_interval_ms / 1000
        self._fold_chunks = settings.fold_chunks
        self.producer_ids_issued = coordinator.producer_ids()
        self._durability = CloudDurability(self.committer, self)
        self.peers = PeerLinks(settings.peer_token, peer_tls)
        self._collecting: set[asyncio.Task[Any]] = set()
        # built over the catalog by `bind`
        self._bound: _Bound | None = None

    def bind(self, catalog: TopicCatalog) -> None:
        """Build the parts that work on the recovered catalog: the take-over handler, the
        Exclusive claims, the Kafka group cursors. Before the broker is built, after
        `catalog.open`."""
        coordinator = self.coordinator

        def checkpoint(topic: str, partition: int) -> Awaitable[bool]:
            return partitions.checkpoint_now(topic, partition)  # (built below)

        transactions = ClusterTransactions(
            coordinator, self.peers, self.tail.store, catalog, checkpoint
        )
        partitions = ClusterPartitions(
            catalog,
            self.tail,
            self.committer,
            coordinator,
            coordinator.serves,
            self._checkpoint_interval,
            self._fold_chunks,
            transactions,
        )
        self.committer.on_stored = partitions.stored
        self._bound = _Bound(
            catalog,
            partitions,
            ExclusiveGate(coordinator, catalog.topics),
            GroupCursors(coordinator, partitions),
            transactions,
        )
        coordinator.handler = partitions
        coordinator.on_topic = self._on_topic
        coordinator.on_subscription = self._on_subscription

    @property
    def _parts(self) -> _Bound:
        if self._bound is None:
            raise RuntimeError("ClusterMode.bind(catalog) comes before this")
        return self._bound

    @property
    def partitions(self) -> ClusterPartitions:
        return self._parts.partitions

    @property
    def exclusive(self) -> ExclusiveGate:
        return self._parts.exclusive

    @property
    def group_cursors(self) -> GroupCursors:
        return self._parts.group_cursors

    @property
    def _catalog(self) -> TopicCatalog:
        return self._parts.catalog

    async def start(self) -> None:
        catalog, coordinator = self._catalog, self.coordinator
        await coordinator.start()
        await self._parts.transactions.start()
        known = coordinator.topics()
        for name in [n for n in catalog.topics if n not in known]:
            await self._on_topic(name, None)  # deleted from the cluster while we were away
        self.partitions.start()
        self.exclusive.start()
        if isinstance(self.committer, SharedCommitter):
            self.committer.start()

    async def stop(self) -> None:
        await self.exclusive.close()
        await self.coordinator.stop(graceful=True)
        await self.partitions.close()
        if isinstance(self.committer, SharedCommitter):
            await self.committer.close()
        await self.peers.close()

    # The placement (server.requests.placement.Placement)

    @property
    def ownership(self) -> Ownership:
        return self.coordinator

    @property
    def durability(self) -> Durability:
        return self._durability

    @property
    def serves(self) -> Callable[[str, int], bool] | None:
        return self.coordinator.serves

    def definitions(self, catalog: TopicCatalog) -> TopicDefinitions:
        return self

    def subscribe_gate(self, catalog: TopicCatalog) -> SubscribeGate:
        return self.exclusive

    def producer_ids(self, catalog: TopicCatalog) -> ProducerIds:
        return SharedProducerIds(self.producer_ids_issued)

    def transactions(self, catalog: TopicCatalog) -> TransactionPlacement:
        return self._parts.transactions

    async def define_topic(self, request: m.CreateTopicRequest, create_local: CreateLocal) -> None:
        await self.create_topic(request)

    def write(
        self, topic: LogTopic, partition: int, batch: bytes, record_count: int
    ) -> Awaitable[None]:
        """Appended here when this broker serves the partition (answered once in the object
        store); otherwise produced at its owner over a peer link."""
        if self.coordinator.serves(topic.name, partition):
            return append_here(topic, partition, batch, record_count)
        return self._write_at_owner(topic.name, partition, batch)

    async def _write_at_owner(self, topic: str, partition: int, batch: bytes) -> None:
        owner = self.coordinator.owner(topic, partition)
        if owner is None or owner == self.coordinator.this_broker:
            raise not_owner(self.coordinator, topic, partition)  # moving: tried again later
        await self.peers.produce(owner, topic, partition, batch)

    # SegmentPublisher (storage.uploader): what this broker uploads, and under which names

    def may_upload(self, topic: str, partition: int) -> bool:
        return self.coordinator.serves(topic, partition)

    async def name(self, topic: str, partition: int, segment: SealedSegment) -> str | None:
        return await self.partitions.name(topic, partition, segment)

    async def publish(
        self, topic: str, partition: int, segment: UploadedSegment
    ) -> UploadedSegment | None:
        return await self.partitions.publish(topic, partition, segment)

    def cloud_end(self, topic: str, partition: int) -> int:
        if self._bound is None:  # the catalog opening: nothing is served, nothing is readable
            return 0
        return self._bound.partitions.cloud_end(topic, partition)

    # Topics

    async def create_topic(self, request: m.CreateTopicRequest) -> None:
        """CREATE_TOPIC, in the topic's turn (the broker holds it)."""
        await self._catalog.create_locked(request)
        definition = {
            "partitions": request.partitions,
            "dispatch": int(request.dispatch),
            "configs": [[c.name, c.value] for c in request.configs],
        }
        try:
            created = await self.coordinator.create_topic(request.name, definition)
        except BaseException:
            await self._drop_local(request.name)
            raise
        if not created:
            await self._drop_local(request.name)  # theirs arrives through the watch
            raise TopicExists(f"topic {request.name!r} already exists")

    async def create_partitions(self, request: m.CreatePartitionsRequest) -> m.Response:
        """CREATE_PARTITIONS, in the topic's turn: checked here, recorded in etcd (every broker
        grows its copy from the watch, and the coordinators assign the new partitions), then our
        own copy grown at once (the watch then finds it grown already)."""
        if not check_growth(self._catalog, request):
            return m.EmptyResponse()
        count = await self.coordinator.grow_topic(request.name, request.partitions)
        if count == 0:
            raise UnknownTopic(f"topic {request.name!r} does not exist")
        if count > request.partitions:  # grown further through another broker meanwhile
            raise InvalidRequest(
                f"topic {request.name!r} has {count} partitions: partitions can be added, "
                f"never removed ({request.partitions} asked)"
            )
        return await add_partitions(self._catalog, request)

    async def delete_topic(self, name: str) -> None:
        """DELETE_TOPIC, in the topic's turn: etcd first (every broker drops its copy from the
        watch), then ours at once."""
        revision = await self.coordinator.delete_topic(name)
        if not revision:
            raise UnknownTopic(f"topic {name!r} does not exist")
        await self._drop_local(name)
        if self._catalog.uploader is not None:
            self._catalog.uploader.purge(name)
        # the tail by epoch: a topic re-created under the name at once writes its own chunks and
        # markers under the same prefix, and they must stay (take-overs ignore the old ones)
        self._background(self._purge_tail(name, revision))

    async def _purge_tail(self, name: str, revision: int) -> None:
        try:
            gone = await self.tail.purge(name, revision)
            gone += await PartitionManifests(self.tail.store).purge(name, revision)
            gone += await self._parts.transactions.purge(name, revision)
        except Exception as exc:  # left behind: ignored by take-overs, only costs storage
            log.warning("cluster.tail_purge_failed", topic=name, error=str(exc))
            return
        log.info("cluster.tail_purged", topic=name, objects=gone)

    async def _on_topic(self, name: str, definition: dict[str, Any] | None) -> None:
        catalog = self._catalog
        if definition is None:
            async with catalog.turn(name):
                await self._drop_local(name)
            return
        request = m.CreateTopicRequest(
            name,
            int(definition["partitions"]),
            int(definition["dispatch"]),
            tuple(m.ConfigEntry(str(k), str(v)) for k, v in definition.get("configs", [])),
        )
        # in the topic's turn: a CREATE_TOPIC of ours that is losing the race to this one holds
        # it with its local copy, which it drops when etcd says no; checked before the turn,
        # that copy made us skip the winner's topic and leave this broker without it
        async with catalog.turn(name):
            existing = catalog.topics.get(name)
            if existing is not None:
                if len(existing.partitions) == request.partitions:
                    return  # ours (our own create seen through the watch), or the same
                if len(existing.partitions) < request.partitions:
                    # partitions added through another broker (CREATE_PARTITIONS): grow ours
                    await self._grow_local(name, request.partitions)
                    return
                log.warning(
                    "cluster.topic_replaced",
                    topic=name,
                    local=len(existing.partitions),
                    cluster=request.partitions,
                )
                await self._drop_local(name)
            try:
                await catalog.create_locked(request)
            except TopicExists:
                return
            except Exception:
                log.exception("cluster.topic_create_failed", topic=name)

    async def _grow_local(self, name: str, partitions: int) -> None:
        try:
            await add_partitions(self._catalog, m.CreatePartitionsRequest(name, partitions))
        except Exception:
            # its new partitions' owners fail to take them over here until it is grown: they
            # are taken by another broker (a first choice that cannot is passed over)
            log.exception("cluster.partitions_add_failed", topic=name, partitions=partitions)
        else:
            log.info("cluster.partitions_added", topic=name, partitions=partitions)

    async def _on_subscription(
        self, topic: str, name: str, definition: dict[str, Any] | None
    ) -> None:
        """A subscription deleted through another broker goes here too: its consumers here are
        closed (UNKNOWN_SUBSCRIPTION) and its cursors with it, so it neither keeps delivering nor
        leaves a stale cursor for a re-created one. (Ours, seen again through the watch, is
        gone already.)"""
        if definition is not None:
            return  # created on demand by a consumer's SUBSCRIBE here, with the checkpoints
        async with self._catalog.turn(topic):
            found = self._catalog.topics.get(topic)
            subscription = None if found is None else found.subscriptions.get(name)
            if found is None or subscription is None:
                return
            close_consumers(
                list(subscription.consumers.values()),
                ErrorCode.UNKNOWN_SUBSCRIPTION,
                f"subscription {name!r} deleted",
            )
            # (its delete hook deletes the etcd keys again: already gone, harmless)
            await self._catalog.subscriptions.delete(found, name)

    async def _drop_local(self, name: str) -> None:
        if name in self._catalog.topics:
            await self._catalog.delete_topic(name, close_topic_consumers)

    # Subscriptions and uploads

    async def define_subscription(
        self, topic: str, name: str, definition: dict[str, Any]
    ) -> dict[str, Any]:
        return await self.coordinator.define_subscription(topic, name, definition)

    async def subscription_created(
        self, topic: LogTopic, name: str, definition: dict[str, Any]
    ) -> None:
        await self.partitions.checkpoint_new(topic, name)

    async def subscription_deleted(self, topic: str, name: str) -> None:
        await self.coordinator.delete_subscription(topic, name)
        await self.coordinator.delete_checkpoints(checkpoint_key(topic, name, 0)[:-1])

    def _background(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._collecting.add(task)
        task.add_done_callback(self._collecting.discard)

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = dict(self.coordinator.status())
        status.update(
            chunks=self.committer.chunks,
            chunk_failures=self.committer.failures,
            checkpoint_failures=self.partitions.checkpoint_failures,
            rebuilt=self.partitions.rebuilt,
            kept=self.partitions.kept,
            producer_tables_rebuilt=self.partitions.tables_rebuilt,
            producer_id_blocks=self.producer_ids_issued.blocks,
        )
        return status


class GroupCursors:
    """A Kafka group's committed offsets in a cluster
    (`requests.group_offsets.SharedCursors`): the checkpoints of the subscription's cursors
    in etcd, the very ones a partition's next owner takes its cursors from, so wherever the
    group's coordinator moves its offsets are there."""

    def __init__(self, coordinator: Coordinator, partitions: ClusterPartitions) -> None:
        self._coordinator = coordinator
        self._partitions = partitions

    def serves(self, topic: str, partition: int) -> bool:
        return self._coordinator.serves(topic, partition)

    async def load(
        self, topic: str, subscription: str, partitions: list[int]
    ) -> dict[int, int | None]:
        coordinator = self._coordinator
        keys = {checkpoint_key(topic, subscription, p): p for p in partitions}
        found = await coordinator.get_checkpoints(list(keys), coordinator.incarnation(topic))
        floors: dict[int, int | None] = dict.fromkeys(partitions)
        for key, data in found.items():
            floors[keys[key]] = PartitionCursor.decode(data).floor
        return floors

    async def store(self, topic: str, subscription: str, offsets: dict[int, int]) -> None:
        cursors = {p: PartitionCursor.starting_at(offset).encode() for p, offset in offsets.items()}
        await self._coordinator.put_checkpoints(
            {checkpoint_key(topic, subscription, p): data for p, data in cursors.items()}
        )
        for partition, data in cursors.items():
            if self.serves(topic, partition):  # written by the owner itself: not a foreign commit
                self._partitions.checkpointed(topic, subscription, partition, data)


class CloudEnd(Protocol):
    def cloud_end(self, topic: str, partition: int) -> int:
        """Where the partition's batches in the object store end."""
        ...


@dataclass(frozen=True, slots=True)
class _Bound:
    """ClusterMode's parts over the catalog (`bind`)."""

    catalog: TopicCatalog
    partitions: ClusterPartitions
    exclusive: ExclusiveGate
    group_cursors: GroupCursors
    transactions: ClusterTransactions


class CloudDurability:
    """A cluster's `topics.topic.Durability`: an append is answered once its batch is in the
    object store (`tail_commit.TailCommitter`), and readers read only what is there, so no
    consumer acks an offset a take-over could give to another message."""

    def __init__(self, committer: TailCommitter | SharedCommitter, cloud: CloudEnd) -> None:
        self._committer = committer
        self._cloud = cloud

    def commit(
        self,
        topic: str,
        partition: LogPartition,
        base_offset: int,
        batch: bytes,
        record_count: int,
        sequence: int,
        committed: bool,
    ) -> Awaitable[None] | None:
        stamped = stamped_batch(batch, base_offset)
        return self._committer.add(topic, partition.index, base_offset, stamped, record_count)

    def readable_end(self, topic: str, partition: LogPartition, committed: bool) -> int:
        local = LOCAL_DURABILITY.readable_end(topic, partition, committed)
        return min(local, self._cloud.cloud_end(topic, partition.index))
