"""Cluster mode: brokers coordinated by etcd (docs/CLUSTER.md).

`Coordinator` implements `server.cluster.partition_ownership.Ownership` from lease-backed owner keys
in etcd, drives a `PartitionHandler` (the data path) through acquire / release / lost, and keeps the
topic and subscription definitions and the cursor checkpoints of the cluster.
`exclusive_claims` gives an Exclusive subscription one holder in the whole cluster, fenced in etcd.
"""

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
