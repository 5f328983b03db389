"""Idempotent-producer ids unique across a cluster, drawn from etcd.

One key, `<prefix>/producer-ids`, holds the next id no broker has been given yet. A broker takes
a block of `BLOCK` ids at a time by a transaction that compares the key's mod_revision with the one
it read (its absence, the first time) and puts the counter moved past the block: of two brokers
racing for a block one transaction fails, reads again and takes the next block. The counter only
grows and etcd persists a transaction before answering, so an id is never issued twice, across
broker crashes and etcd restarts alike (the rest of a block a broker held when it died is simply
never issued). One etcd round trip per `BLOCK` INIT_PRODUCER_ID, none for the others.

A produce's id must have been issued (`UNKNOWN_PRODUCER_ID` otherwise, as on one broker), but ids
are issued by every broker: the check accepts any id below the counter, the **issued range**.
Recording every id in etcd would cost a write per producer and a read per unknown id for no more
safety: what the check guards against is a client making ids up, which would collide with other
producers' sequences, and an id below the counter was handed out by the cluster (or lies in a
dead broker's unused block, harmless). A broker knows the counter as of its own last block or
read; an id above it (from a block another broker took since) makes the produce wait for one
read of the counter (`refresh`, shared by every produce waiting for it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from headwater.wire.errors import StorageError

BLOCK = 100  # ids a broker takes from etcd at a time
_ATTEMPTS = 32  # transactions lost to other brokers before giving up (STORAGE_ERROR)

EtcdCall = Callable[[Callable[[Any], Awaitable[Any]]], Awaitable[Any]]


class ClusterProducerIds:
    def __init__(self, etcd: EtcdCall, key: bytes) -> None:
        """`etcd`: runs one operation on the coordinator's client (StorageError when etcd does
        not answer); `key`: the counter's key."""
        self._etcd = etcd
        self._key = key
        self._next = 0  # the next id of our block
        self._end = 0  # the end of our block
        self._seen = 0  # the counter as last known: every id below it was issued
        self._taking = asyncio.Lock()
        self._refresh: asyncio.Task[None] | None = None
        self.blocks = 0

    async def issue(self) -> int:
        """A new id: from our block, or from a new block taken from etcd."""
        async with self._taking:
            if self._next >= self._end:
                self._next, self._end = await self._take_block()
            producer_id = self._next
            self._next += 1
            return producer_id

    async def _take_block(self) -> tuple[int, int]:
        key = self._key
        for _ in range(_ATTEMPTS):
            found = await self._etcd(lambda c: c.get(key))
            start = int(found.value) if found is not None else 0
            value = str(start + BLOCK).encode()
            seen = int(found.mod_revision) if found is not None else 0

            def transaction(c: Any, seen: int = seen, value: bytes = value) -> Any:
                compare = (
                    c.transactions.mod(key) == seen if seen else c.transactions.version(key) == 0
                )
                return c.transaction(
                    compare=[compare], success=[c.transactions.put(key, value)], failure=[]
                )

            won, _ = await self._etcd(transaction)
            if won:
                self.blocks += 1
                self._seen = max(self._seen, start + BLOCK)
                return start, start + BLOCK
        raise StorageError("producer ids: the counter in etcd kept changing")

    def issued(self, producer_id: int) -> bool:
        """Below the counter as last known (False: unknown yet, or never issued; `refresh`)."""
        return 0 <= producer_id < self._seen

    def refresh(self) -> Awaitable[None]:
        """Read the counter again; one read in flight, shared by every caller."""
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.get_running_loop().create_task(self._read())
        return asyncio.shield(self._refresh)

    async def _read(self) -> None:
        key = self._key
        found = await self._etcd(lambda c: c.get(key))
        if found is not None:
            self._seen = max(self._seen, int(found.value))


__all__ = ["BLOCK", "ClusterProducerIds"]
