"""Where topics are defined, the one seam through which cluster mode changes the broker's topic
administration: `TopicDefinitions` is what the broker asks (create, delete, grow a topic), and
`LocalTopics` answers it from this broker's catalog alone. In a cluster,
`server.cluster.cluster_mode.ClusterMode` answers it through etcd and every broker's catalog, and
`SubscribeGate` decides Exclusive subscriptions once for the whole cluster (docs/CLUSTER.md)."""

from __future__ import annotations

from typing import Protocol

from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.reply import Reply
from headwater.server.requests.consumer_requests import close_consumers
from headwater.server.requests.create_partitions import add_partitions
from headwater.server.topics.subscription_contract import Consumer, ConsumerSession
from headwater.server.topics.topic import Topic
from headwater.wire import messages as m
from headwater.wire.errors import ErrorCode


class TopicDefinitions(Protocol):
    async def create_topic(self, request: m.CreateTopicRequest) -> None: ...

    async def delete_topic(self, name: str) -> None: ...

    async def create_partitions(self, request: m.CreatePartitionsRequest) -> m.Response: ...


class SubscribeHandler(Protocol):
    def __call__(self, session: ConsumerSession, request: m.SubscribeRequest) -> Reply: ...


class SubscribeGate(Protocol):
    """What decides, before a consumer attaches, whether it may (a cluster's Exclusive claims)."""

    def wrap(self, subscribe: SubscribeHandler) -> SubscribeHandler: ...

    def detached_consumer(self, consumer: Consumer) -> None: ...


class LocalTopics:
    """A single broker's topic definitions: its catalog."""

    def __init__(self, catalog: TopicCatalog) -> None:
        self._catalog = catalog

    async def create_topic(self, request: m.CreateTopicRequest) -> None:
        await self._catalog.create_locked(request)

    async def delete_topic(self, name: str) -> None:
        await self._catalog.delete_topic(name, close_topic_consumers)

    async def create_partitions(self, request: m.CreatePartitionsRequest) -> m.Response:
        return await add_partitions(self._catalog, request)


def close_topic_consumers(topic: Topic) -> None:
    """The topic is being deleted: every consumer of it is told so and closed."""
    for subscription in list(topic.subscriptions.values()):
        close_consumers(
            list(subscription.consumers.values()),
            ErrorCode.UNKNOWN_TOPIC,
            f"topic {topic.name!r} was deleted",
        )
