"""Which Kafka node each broker is, which one leads each partition and coordinates each group:
what Metadata and FindCoordinator answer, and what the group APIs check (docs/KAFKA.md).

On one broker (`SingleNode`) node 0 leads every partition and coordinates every group. In a
cluster (`ClusterNodes`) every answer is computed from the etcd coordinator's view (`Peers`: the
partitions' owners and the live brokers' Kafka addresses, which each broker registers), so any
broker answers alike:

- a broker's node id is the CRC-32 of its broker id, 31 bits (`node_id`): the same on every
  broker and across restarts, and a broker joining or leaving renumbers no other (clients cache
  node ids with their connections). Two live brokers with the same node id (odds about n²/2³³
  for n brokers): the lower broker id keeps it, the other is left out (`kafka.node_id_clash`)
  and its partitions have no leader until one of them goes.
- a partition's leader is its owner; none (LEADER_NOT_AVAILABLE) while nobody owns it, or its
  owner registered no Kafka port. Replicas and ISR are the leader alone: the one copy is in the
  object store.
- the controller is the named broker with the lowest broker id (the same on every broker).
- a group's coordinator is the named broker with the highest hash of (group, broker id)
  (rendezvous hashing): every broker picks the same one from the same membership, and a broker
  joining or leaving moves only the groups it takes or had.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from typing import Final, Protocol

import structlog

from headwater.server.requests.partition_ownership import Ownership

log = structlog.get_logger(__name__)

SINGLE_NODE_ID: Final = 0
_NODE_ID_MASK: Final = 0x7FFF_FFFF  # Kafka's node ids are int32, and negative ones mean "none"


@dataclass(frozen=True, slots=True)
class Node:
    node_id: int
    host: str
    port: int
    broker_id: str


class Peers(Ownership, Protocol):
    """A cluster's view (the etcd coordinator's, `server.cluster.coordinator`)."""

    def kafka_addresses(self) -> dict[str, tuple[str, int]]:
        """Live broker id -> its Kafka (host, port), for the brokers that have a Kafka port."""
        ...


class Nodes(Protocol):
    def nodes(self) -> list[Node]:
        """The brokers Metadata names."""
        ...

    def this(self) -> Node | None:
        """This broker's node (None in a cluster while it is not named)."""
        ...

    def leaders(self, topic: str, count: int) -> list[Node | None]:
        """The leader of each of the topic's `count` partitions (None: none now)."""
        ...

    def controller(self) -> int: ...

    def coordinator(self, group: str | None) -> Node | None:
        """The broker that coordinates `group` (None: no broker can now)."""
        ...


def node_id(broker_id: str) -> int:
    return zlib.crc32(broker_id.encode()) & _NODE_ID_MASK


class SingleNode:
    """One broker: node 0 leads and coordinates everything."""

    def __init__(self, host: str, port: int) -> None:
        self._node = Node(SINGLE_NODE_ID, host, port, "local")

    def nodes(self) -> list[Node]:
        return [self._node]

    def this(self) -> Node | None:
        return self._node

    def leaders(self, topic: str, count: int) -> list[Node | None]:
        return [self._node] * count

    def controller(self) -> int:
        return SINGLE_NODE_ID

    def coordinator(self, group: str | None) -> Node | None:
        return self._node


class ClusterNodes:
    def __init__(self, peers: Peers) -> None:
        self._peers = peers
        self._clashes: set[tuple[str, str]] = set()  # logged once each

    def _named(self) -> dict[str, Node]:
        """Broker id -> node, for the live brokers with a Kafka port, node ids unique."""
        named: dict[str, Node] = {}
        taken: dict[int, str] = {}
        for broker_id, (host, port) in sorted(self._peers.kafka_addresses().items()):
            ident = node_id(broker_id)
            holder = taken.get(ident)
            if holder is not None:
                if (holder, broker_id) not in self._clashes:
                    self._clashes.add((holder, broker_id))
                    log.warning(
                        "kafka.node_id_clash", node_id=ident, kept=holder, left_out=broker_id
                    )
                continue
            taken[ident] = broker_id
            named[broker_id] = Node(ident, host, port, broker_id)
        return named

    def nodes(self) -> list[Node]:
        return list(self._named().values())

    def this(self) -> Node | None:
        return self._named().get(self._peers.this_broker.broker_id)

    def leaders(self, topic: str, count: int) -> list[Node | None]:
        named, owner = self._named(), self._peers.owner  # the brokers once per request
        return [
            None if (found := owner(topic, index)) is None else named.get(found.broker_id)
            for index in range(count)
        ]

    def controller(self) -> int:
        named = self._named()
        return named[min(named)].node_id if named else -1

    def coordinator(self, group: str | None) -> Node | None:
        named = self._named()
        if not named:
            return None
        chosen = max(named, key=lambda broker_id: _score(group or "", broker_id))
        return named[chosen]


def _score(group: str, broker_id: str) -> bytes:
    # a length prefix: ("ab", "c") and ("a", "bc") are different pairs
    data = f"{len(group)}:{group}{broker_id}".encode()
    return hashlib.blake2b(data, digest_size=8).digest()
