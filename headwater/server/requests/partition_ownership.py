"""Which broker serves each topic partition: the seam between the handlers and a cluster.

Every handler that touches a partition (produce, the reliable pumps, acks, map get/set, ...) asks
`Ownership.serves(topic, partition)`; a request for a partition it does not serve is answered
NOT_OWNER naming `owner(topic, partition)` (`not_owner`). LOOKUP answers from `owner` and
`brokers` for every partition.

`SingleBroker` is the embedded default: one broker serves everything, with no coordination. In a
cluster (`headwater serve --cluster etcd://...`, docs/CLUSTER.md) the etcd coordinator
(`server.cluster`) implements the same protocol from the ownership keys it holds and watches.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from headwater.wire.errors import NotOwner


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    broker_id: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.broker_id}@{self.host}:{self.port}"


class Ownership(Protocol):
    @property
    def this_broker(self) -> BrokerAddress: ...

    def serves(self, topic: str, partition: int) -> bool:
        """Whether this broker may serve the partition now (owns it, and its lease is live)."""
        ...

    def serves_every(self, topic: str, partitions: int) -> bool:
        """Whether this broker serves partitions 0..`partitions`-1 of `topic` now (a map scan
        then needs no walk past other brokers' keys)."""
        ...

    def owner(self, topic: str, partition: int) -> BrokerAddress | None:
        """The partition's owner as last seen (None while nobody owns it)."""
        ...

    def brokers(self) -> list[BrokerAddress]:
        """The live brokers, this one included."""
        ...

    def taking_over(self, topic: str, partition: int) -> asyncio.Future[None] | None:
        """While this broker is taking the partition over (its ownership key being won, or won
        and the take-over under way, not serving yet): a future done when that ends, served or
        given up. None otherwise. A produce arriving meanwhile waits for it."""
        ...

    def changed(self) -> asyncio.Future[None]:
        """A future done at the next change of what `owner` or `brokers` may answer (an owner
        key made or gone, a take-over done, a broker come or gone): a LOOKUP long poll waits
        on it. It may complete with nothing changed for the caller: look again."""
        ...


class SingleBroker:
    """One broker, no cluster: it serves every partition."""

    def __init__(self, this_broker: BrokerAddress) -> None:
        self._this = this_broker

    @property
    def this_broker(self) -> BrokerAddress:
        return self._this

    def serves(self, topic: str, partition: int) -> bool:
        return True

    def serves_every(self, topic: str, partitions: int) -> bool:
        return True

    def owner(self, topic: str, partition: int) -> BrokerAddress | None:
        return self._this

    def brokers(self) -> list[BrokerAddress]:
        return [self._this]

    def taking_over(self, topic: str, partition: int) -> asyncio.Future[None] | None:
        return None

    def changed(self) -> asyncio.Future[None]:
        return asyncio.get_running_loop().create_future()  # one broker: owners never change


def not_owner(ownership: Ownership, topic: str, partition: int) -> NotOwner:
    """The NOT_OWNER error for a partition this broker does not serve, naming its owner."""
    owner = ownership.owner(topic, partition)
    if owner == ownership.this_broker:
        owner = None  # held by us but not servable now (lease not confirmed, being taken over)
    return NotOwner(
        f"partition {partition} of topic {topic!r} is not served here: "
        f"owner={owner if owner is not None else 'none'}"
    )
