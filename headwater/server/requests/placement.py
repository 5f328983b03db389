"""The deployment mode as the broker sees it: a constructor argument of `Broker`, never entered
afterwards.

`Placement` is `server.topics.placement.TopicPlacement` (what the catalog asks) plus what the
request handlers ask: which broker owns a partition (`ownership`: LOOKUP, and NOT_OWNER for a
partition served elsewhere), where topics are defined (`definitions`), what a SUBSCRIBE passes
before a consumer attaches (`subscribe_gate`: a cluster claims an Exclusive subscription in etcd),
who issues idempotent producer ids (`producer_ids`: this broker's counter, or the cluster's blocks
in etcd), and where transactions keep their state and write their markers (`transactions`:
`requests.transaction_placement`). `SingleBrokerPlacement` is the embedded default; the cluster's is
`server.cluster.cluster_mode.ClusterMode`. The handlers hold no "is this a cluster?" branch: a
single broker's ownership serves every partition, its gate lets every consumer through, and its
producer ids are all known at once.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.reply import AfterDurable, AfterWork, Reply
from headwater.server.requests.partition_ownership import BrokerAddress, Ownership, SingleBroker
from headwater.server.requests.topic_definitions import (
    LocalTopics,
    SubscribeGate,
    SubscribeHandler,
    TopicDefinitions,
)
from headwater.server.requests.transaction_placement import (
    LocalTransactions,
    TransactionPlacement,
)
from headwater.server.topics.placement import LocalPlacement, TopicPlacement
from headwater.server.topics.subscription_contract import Consumer
from headwater.wire import messages as m


class ProducerIds(Protocol):
    """Who issues idempotent producer ids, and whether an id was issued."""

    def init_producer_id(self) -> Reply:
        """INIT_PRODUCER_ID's answer: a new id, once it can never be issued again."""
        ...

    def issued(self, producer_id: int) -> bool:
        """Whether `producer_id` was issued (as this broker knows now)."""
        ...

    def unknown_yet(self, producer_id: int) -> bool:
        """Whether `refresh` may still find `producer_id` issued (by another broker since this
        one last looked): a produce naming it waits for `refresh` before it is refused."""
        ...

    def refresh(self) -> Awaitable[None]:
        """Learn the ids issued elsewhere since `issued` last looked."""
        ...


class Placement(TopicPlacement, Protocol):
    @property
    def ownership(self) -> Ownership: ...

    def definitions(self, catalog: TopicCatalog) -> TopicDefinitions: ...

    def subscribe_gate(self, catalog: TopicCatalog) -> SubscribeGate: ...

    def producer_ids(self, catalog: TopicCatalog) -> ProducerIds: ...

    def transactions(self, catalog: TopicCatalog) -> TransactionPlacement: ...


class SingleBrokerPlacement(LocalPlacement):
    """One broker: it owns every partition, defines topics in its catalog, lets every consumer
    attach, and issues producer ids from its own counter."""

    def __init__(self, this_broker: BrokerAddress) -> None:
        self._ownership = SingleBroker(this_broker)

    @property
    def ownership(self) -> Ownership:
        return self._ownership

    def definitions(self, catalog: TopicCatalog) -> TopicDefinitions:
        return LocalTopics(catalog)

    def subscribe_gate(self, catalog: TopicCatalog) -> SubscribeGate:
        return OpenGate()

    def producer_ids(self, catalog: TopicCatalog) -> ProducerIds:
        return LocalProducerIds(catalog)

    def transactions(self, catalog: TopicCatalog) -> TransactionPlacement:
        return LocalTransactions(catalog)


class OpenGate:
    """Every consumer attaches: one broker decides Exclusive subscriptions by itself."""

    def wrap(self, subscribe: SubscribeHandler) -> SubscribeHandler:
        return subscribe

    def detached_consumer(self, consumer: Consumer) -> None:
        return None


class LocalProducerIds:
    """This broker's counter, in its state store (`server.topics.idempotent_producers`)."""

    def __init__(self, catalog: TopicCatalog) -> None:
        self._ids = catalog.producers

    def init_producer_id(self) -> Reply:
        producer_id, durable = self._ids.issue()
        return AfterDurable(m.InitProducerIdResponse(producer_id, 0), durable)

    def issued(self, producer_id: int) -> bool:
        return self._ids.issued(producer_id)

    def unknown_yet(self, producer_id: int) -> bool:
        return False  # no other broker issues ids: `issued` is the whole truth

    async def refresh(self) -> None:
        return None


class ClusterIds(Protocol):
    """Producer ids issued by the whole cluster (`server.cluster.producer_ids`)."""

    async def issue(self) -> int: ...

    def issued(self, producer_id: int) -> bool: ...

    def refresh(self) -> Awaitable[None]: ...


class SharedProducerIds:
    """Ids issued by any broker of a cluster (blocks taken from a counter in etcd)."""

    def __init__(self, ids: ClusterIds) -> None:
        self._ids = ids

    def init_producer_id(self) -> Reply:
        return AfterWork(self._issue())

    async def _issue(self) -> Reply:
        return m.InitProducerIdResponse(await self._ids.issue(), 0)

    def issued(self, producer_id: int) -> bool:
        return self._ids.issued(producer_id)

    def unknown_yet(self, producer_id: int) -> bool:
        return not self._ids.issued(producer_id)

    def refresh(self) -> Awaitable[None]:
        return self._ids.refresh()
