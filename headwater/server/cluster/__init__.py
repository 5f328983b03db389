"""Cluster mode: brokers coordinated by etcd, sharing the object store (docs/CLUSTER.md).

`coordinator` (the `Coordinator`) implements `requests.partition_ownership.Ownership` from
lease-backed owner keys in etcd: `etcd` is its connection (calls with deadlines, watched prefix
caches), `layout` the key layout and the rendezvous choice of owners, `assignment` the rebalance
round, `metadata` the topic and subscription definitions and cursor checkpoints, `coordinator_state`
what it knows of itself and the `PartitionHandler` it drives, `exclusive_claims` the one holder of
an Exclusive subscription in the whole cluster, fenced in etcd, `producer_ids` idempotent-producer
ids unique in the cluster (blocks taken from a counter in etcd). On the data side, `cluster_mode`
is the cluster's placement (`requests.placement.Placement`), `peer_links` the connections to the
other brokers for the records it writes to their partitions, `cluster_partitions` takes
partitions over, hands them off and loses them, and `tail_commit` acknowledges a produce once it
is in the object store (one object per partition per window), or `shared_commit` with one object
per broker per window, which `shared_tail` indexes in etcd (`cluster.tail_layout = "broker"`).
`cluster_transactions` keeps transactional ids' states in etcd, has each partition's owner write
its markers, and keeps aborted ranges for the next owner. `cluster_metrics` and `cluster_status`
report it (the latter straight from etcd)."""

from headwater.server.cluster.coordinator import Coordinator
from headwater.server.cluster.coordinator_state import (
    ClusterStartupError,
    DuplicateBroker,
    EtcdUnreachable,
    PartitionHandler,
)
from headwater.server.cluster.layout import DEFAULT_PREFIX, Layout, parse_endpoint, rendezvous

__all__ = [
    "DEFAULT_PREFIX",
    "ClusterStartupError",
    "Coordinator",
    "DuplicateBroker",
    "EtcdUnreachable",
    "Layout",
    "PartitionHandler",
    "parse_endpoint",
    "rendezvous",
]
