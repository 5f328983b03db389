"""Where this broker stands in its deployment, as the topics see it: one object, given to the
catalog when it is built, never swapped in afterwards.

A `TopicPlacement` answers the questions whose answer differs between one broker and a cluster:
what a reliable append's answer waits for and how far readers may read (`durability`), which
partitions this broker serves (`serves`), how a topic is defined (`define_topic`: the catalog
alone, or etcd and every broker's catalog), how a record the server writes itself reaches its
partition (`write`: appended here, or sent to the broker that owns it), how a reliable
subscription is defined (`define_subscription`: once for the whole deployment) and who hears of
one created or deleted here. `server.requests.placement` adds the broker's side (ownership for
LOOKUP and NOT_OWNER, the subscribe gate, producer ids); `LocalPlacement` below is the single
broker's, `server.cluster.cluster_mode.ClusterMode` the cluster's.

Every topic the server creates for itself (dead-letter topics) goes through `define_topic` and
every record it writes for itself through `write`, the same two steps a client's CREATE_TOPIC
and PRODUCE take: in a cluster such a topic is in etcd, owned by one broker, and its records are
acknowledged once in the object store, as any other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from headwater.server.reply import AfterWork, Reply
from headwater.server.topics.topic import LOCAL_DURABILITY, Durability, LogTopic, Topic
from headwater.wire import messages as m

# the catalog's own creation of a topic's local copy (the caller holds the name's turn)
CreateLocal = Callable[[m.CreateTopicRequest], Awaitable[Topic]]


class TopicPlacement(Protocol):
    @property
    def durability(self) -> Durability:
        """For every reliable topic this broker opens or creates."""
        ...

    @property
    def serves(self) -> Callable[[str, int], bool] | None:
        """Whether this broker serves a partition now; None: every partition, always."""
        ...

    async def define_topic(self, request: m.CreateTopicRequest, create_local: CreateLocal) -> None:
        """Create a topic as CREATE_TOPIC does; the caller holds the name's turn. Afterwards
        the topic is in this broker's catalog."""
        ...

    def write(
        self, topic: LogTopic, partition: int, batch: bytes, record_count: int
    ) -> Awaitable[None]:
        """Append a batch the server made itself (base offset 0) to `partition` where it is
        served: resolves once it is as durable as an acknowledged produce (fsynced here; in a
        cluster, in the object store), raises a `HeadwaterError` if it could not be written
        (nothing was then acknowledged; the caller may try again)."""
        ...

    async def define_subscription(
        self, topic: str, name: str, definition: dict[str, Any]
    ) -> dict[str, Any]:
        """Record a reliable subscription's definition (its type, settings and start) before it
        is made here, unless the deployment defines it already: the definition that stands (a
        cluster's first creator's: put-if-absent in etcd), which the caller makes it from."""
        ...

    async def subscription_created(
        self, topic: LogTopic, name: str, definition: dict[str, Any]
    ) -> None: ...

    async def subscription_deleted(self, topic: str, name: str) -> None: ...


class LocalPlacement:
    """One broker, no cluster: it serves everything, defines topics in its catalog alone and
    appends its own records to its own WAL, answered after the fsync whatever the topic's policy
    (a dead letter stands for a message whose ack follows it)."""

    @property
    def durability(self) -> Durability:
        return LOCAL_DURABILITY

    @property
    def serves(self) -> Callable[[str, int], bool] | None:
        return None

    async def define_topic(self, request: m.CreateTopicRequest, create_local: CreateLocal) -> None:
        await create_local(request)

    def write(
        self, topic: LogTopic, partition: int, batch: bytes, record_count: int
    ) -> Awaitable[None]:
        return append_here(topic, partition, batch, record_count)

    async def define_subscription(
        self, topic: str, name: str, definition: dict[str, Any]
    ) -> dict[str, Any]:
        return definition  # the catalog is the only definition (made in the topic's turn)

    async def subscription_created(
        self, topic: LogTopic, name: str, definition: dict[str, Any]
    ) -> None:
        return None

    async def subscription_deleted(self, topic: str, name: str) -> None:
        return None


def append_here(
    topic: LogTopic, partition: int, batch: bytes, record_count: int
) -> Awaitable[None]:
    """Append to this broker's copy of the partition, through the topic's durability (a
    fsynced-isolation append: the fsync is waited for even under policy `batch` or `never`), once
    the offset lease covers it (`LogTopic.when_leased`: never written on the loop)."""
    target = topic.partitions[partition]
    durable: list[Awaitable[None] | None] = []

    def append() -> Reply:
        durable.append(topic.accept(target, batch, record_count, committed=True)[1])
        return m.EmptyResponse()

    reply = topic.when_leased([(target, record_count)], append)
    if isinstance(reply, AfterWork):
        return _appended(reply, durable)
    return durable[0] if durable[0] is not None else _done()


async def _appended(leased: AfterWork, durable: list[Awaitable[None] | None]) -> None:
    await leased.work
    if durable[0] is not None:
        await durable[0]


async def _done() -> None:
    return None
