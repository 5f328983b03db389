"""The cluster as etcd records it, for `headwater cluster status` (read straight from etcd: it works
while every broker is down, and shows what the brokers would see).

One read of the brokers, owners and topics at a single revision (a transaction of three range
reads), then the remaining TTL of each broker's lease. The result is a JSON-able dict, the shape
docs/CLI.md documents.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from headwater.server.cluster.etcd import EtcdSession, entry_of
from headwater.server.cluster.layout import (
    DEFAULT_PREFIX,
    Layout,
    decode,
    parse_endpoint,
    partitions_of,
)


async def read_status(
    endpoint: str, prefix: str = DEFAULT_PREFIX, timeout: float = 3.0
) -> dict[str, Any]:
    """Raises `ValueError` for a malformed endpoint and `EtcdUnavailable` when etcd does not
    answer within `timeout` (each call)."""
    layout = Layout(prefix)
    session = EtcdSession(parse_endpoint(endpoint), timeout)
    try:
        return await _read(session, layout, endpoint)
    finally:
        await session.close()


async def _read(session: EtcdSession, layout: Layout, endpoint: str) -> dict[str, Any]:
    from aetcd.utils import prefix_range_end

    roots = [layout.root(kind) for kind in ("brokers", "owners", "topics")]

    def snapshot(c: Any) -> Any:
        return c.transaction(
            compare=[],
            success=[c.transactions.get(root, prefix_range_end(root)) for root in roots],
            failure=[],
        )

    _, ranges = await session.call(snapshot)
    brokers_kv, owners_kv, topics_kv = ([entry for _, entry in found] for found in ranges)
    now = time.time()
    brokers: dict[str, dict[str, Any]] = {}
    for kv in brokers_kv:
        broker_id = layout.name_in("brokers", bytes(kv.key))
        details = decode(bytes(kv.value)) or {}
        started = details.get("started")
        info = await session.call(_lease_info(int(kv.lease)))
        brokers[broker_id] = {
            "id": broker_id,
            "host": details.get("host"),
            "port": details.get("port"),
            "age": round(now - started, 1) if isinstance(started, int | float) else None,
            "lease_remaining": int(info.TTL) if int(info.TTL) >= 0 else None,
            "partitions": [],
        }
    topics = {
        layout.name_in("topics", bytes(kv.key)): partitions_of(decode(bytes(kv.value)) or {})
        for kv in topics_kv
    }
    owners: dict[tuple[str, int], tuple[str, int]] = {}
    for kv in owners_kv:
        key = layout.parse_owner(bytes(kv.key))
        if key is not None:
            entry = entry_of(kv)
            owners[key] = (entry.value.decode(errors="replace"), entry.create_revision)
    partitions = []
    unowned = []
    for topic, count in sorted(topics.items()):
        for partition in range(count):
            owner, epoch = owners.get((topic, partition), (None, None))
            partitions.append(
                {"topic": topic, "partition": partition, "owner": owner, "epoch": epoch}
            )
            if owner is None:
                unowned.append({"topic": topic, "partition": partition})
            elif owner in brokers:
                brokers[owner]["partitions"].append({"topic": topic, "partition": partition})
    return {
        "endpoint": endpoint,
        "prefix": layout.prefix,
        "brokers": [brokers[b] for b in sorted(brokers)],
        "topics": [{"name": t, "partitions": n} for t, n in sorted(topics.items())],
        "partitions": partitions,
        "unowned": unowned,
    }


def _lease_info(lease: int) -> Callable[[Any], Awaitable[Any]]:
    def call(c: Any) -> Awaitable[Any]:
        return c.get_lease_info(lease, keys=False)  # type: ignore[no-any-return]  # aetcd is untyped

    return call
