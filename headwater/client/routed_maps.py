"""Map requests routed over a cluster: each key to the owner of its partition (`RoutedMap`).

Used by headwater/client/map_client.py when the topic's routes are not known to be on one broker.
Keys are grouped by owner, one request per owner, and the answers put back in the order asked. A
scan asks every owner for a page after the same cursor and keeps the first `limit` entries of the
merge in key order: no owner can have an entry before the last one kept that its page left out (its
page is the `limit` keys after the cursor), so that key is the next cursor. NOT_OWNER is looked up
again and retried within the router's backoff; nothing is retried once a request was sent on a
connection that was then lost (a write may have been applied).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from headwater.wire import messages as m
from headwater.wire.errors import ConnectionClosed, NotOwner
from headwater.wire.keys import partition_for_key

if TYPE_CHECKING:
    from headwater.client.router import Router
    from headwater.client.routing_table import BrokerAddress


class Requester(Protocol):
    async def request(self, request: m.Request) -> m.Response: ...


class RoutedMap:
    def __init__(self, router: Router, topic: str) -> None:
        self.router = router
        self.topic = topic

    async def _partitions(self) -> int | None:
        """The partition count when several brokers own the topic; None: one broker serves it."""
        await self.router.settle(self.topic)
        if not self.router.multi_broker:
            return None
        return self.router.table.partitions(self.topic)

    async def _send(self, partition: int, request: m.Request) -> m.Response:
        """To the partition's owner (any owner for -1), following NOT_OWNER within the backoff."""
        router = self.router
        delays = router.backoff.delays()
        while True:
            owner = await router.route(self.topic, max(partition, 0))
            try:
                assert router.peers is not None
                connection = await router.peers.get(owner)
            except ConnectionClosed:
                router.lost(owner.address)
                error: Exception = ConnectionClosed(f"cannot reach {owner}")
            else:
                try:
                    return await connection.request(request)
                except NotOwner as exc:
                    router.not_owner(self.topic, max(partition, 0), exc)
                    error = exc
            delay = next(delays, None)
            if delay is None:
                raise error
            await asyncio.sleep(delay)

    async def _groups(self, keys: Sequence[bytes]) -> dict[BrokerAddress, list[int]] | None:
        """Key indexes by the owner of their partition (None: one broker serves the topic)."""
        partitions = await self._partitions()
        if not partitions:
            return None
        groups: dict[BrokerAddress, list[int]] = {}
        for index, key in enumerate(keys):
            owner = await self.router.route(self.topic, partition_for_key(key, partitions))
            groups.setdefault(owner, []).append(index)
        return groups

    async def get(self, keys: list[bytes], bootstrap: Requester) -> list[m.MapEntry]:
        groups = await self._groups(keys)
        if groups is None:
            response = await bootstrap.request(m.MapGetRequest(self.topic, tuple(keys)))
            assert isinstance(response, m.MapGetResponse)
            return list(response.entries)
        partitions = self.router.table.partitions(self.topic) or 1
        entries: list[m.MapEntry | None] = [None] * len(keys)

        async def one(indexes: list[int]) -> None:
            wanted = tuple(keys[i] for i in indexes)
            response = await self._send(
                partition_for_key(wanted[0], partitions), m.MapGetRequest(self.topic, wanted)
            )
            assert isinstance(response, m.MapGetResponse)
            for index, entry in zip(indexes, response.entries, strict=True):
                entries[index] = entry

        await asyncio.gather(*(one(indexes) for indexes in groups.values()))
        return [e for e in entries if e is not None]

    async def set(self, writes: list[m.MapWrite], bootstrap: Requester) -> list[int]:
        groups = await self._groups([w.key for w in writes])
        if groups is None:
            response = await bootstrap.request(m.MapSetRequest(self.topic, tuple(writes)))
            assert isinstance(response, m.MapSetResponse)
            return list(response.revisions)
        partitions = self.router.table.partitions(self.topic) or 1
        revisions = [0] * len(writes)

        async def one(indexes: list[int]) -> None:
            part = tuple(writes[i] for i in indexes)
            response = await self._send(
                partition_for_key(part[0].key, partitions), m.MapSetRequest(self.topic, part)
            )
            assert isinstance(response, m.MapSetResponse)
            for index, revision in zip(indexes, response.revisions, strict=True):
                revisions[index] = revision

        await asyncio.gather(*(one(indexes) for indexes in groups.values()))
        return revisions

    async def _each_owner(self, request: m.Request, bootstrap: Requester) -> list[m.Response]:
        """The request asked of every owner of the topic's partitions."""
        if await self._partitions() is None:
            return [await bootstrap.request(request)]
        owners: dict[BrokerAddress, int] = {}  # each owner, with one partition it owns
        for partition in range(self.router.table.partitions(self.topic) or 1):
            # waits (bounded) for a partition without owner: a partial answer is not an answer
            owners.setdefault(await self.router.route(self.topic, partition), partition)
        return list(await asyncio.gather(*(self._send(part, request) for part in owners.values())))

    async def scan(self, request: m.MapScanRequest, bootstrap: Requester) -> m.MapScanResponse:
        pages = await self._each_owner(request, bootstrap)
        entries = sorted(
            (e for page in pages if isinstance(page, m.MapScanResponse) for e in page.entries),
            key=lambda e: e.key,
        )
        more = any(isinstance(p, m.MapScanResponse) and p.cursor for p in pages)
        if len(entries) > request.limit > 0:
            entries, more = entries[: request.limit], True
        cursor = entries[-1].key if more and entries else b""
        return m.MapScanResponse(tuple(entries), cursor)

    async def size(self, bootstrap: Requester) -> int:
        pages = await self._each_owner(m.MapSizeRequest(self.topic), bootstrap)
        return sum(p.size for p in pages if isinstance(p, m.MapSizeResponse))
