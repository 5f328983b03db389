"""The key/value API of a map durable: `client.map(topic)`.

A map is a reliable topic whose last value per key the server keeps (RocksDB). Reading is a
lookup in that state; writing appends a record to the topic, so subscribers see every change, and
a delete appends a tombstone. Each value has a *revision*: the offset of the record that holds it,
which compare-and-set checks against. Keys and values are bytes; `str` keys and values are
encoded as UTF-8.

    prices = client.map("prices")
    revision = await prices.set("IBM", b"142.1")
    entry = await prices.get("IBM")          # MapValue(key, value, revision, ...) or None
    await prices.set("IBM", b"143.0", revision=revision)  # fails if someone wrote in between
    page = await prices.scan(prefix="I", limit=100)       # MapPage(entries, cursor)

In a cluster (a router given, LOOKUP naming several brokers) each key goes to its partition's
owner (`wire.keys.partition_for_key` over the partition count LOOKUP gave): `get_many` and
`set_many` send one request per owner, so a `set_many` spanning brokers is not atomic. `scan`
asks every owner for a page and merges them in key order (the cursor, a key, works for each);
`size` adds the owners' sizes. A NOT_OWNER answer is looked up again and retried, within the
router's backoff; a request whose connection was lost after it was sent is not (a write may
have been applied). Routing: headwater/client/routed_maps.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from headwater.client.routed_maps import RoutedMap
from headwater.wire import messages as m
from headwater.wire.keys import ABSENT_REVISION, ANY_REVISION

if TYPE_CHECKING:
    from headwater.client.router import Router


class Requester(Protocol):
    """The client (or a connection): what a map sends its requests through."""

    def send_request(self, request: m.Request) -> asyncio.Future[m.Response]: ...

    async def request(self, request: m.Request) -> m.Response: ...


ANY = ANY_REVISION
ABSENT = ABSENT_REVISION


@dataclass(frozen=True, slots=True)
class MapValue:
    key: bytes
    value: bytes
    revision: int
    partition: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class MapPage:
    entries: list[MapValue]
    cursor: bytes  # pass to scan(cursor=...) for the next page; empty when done


def _bytes(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else data


def _value(entry: m.MapEntry) -> MapValue | None:
    if not entry.found or entry.value is None:
        return None
    return MapValue(entry.key, entry.value, entry.revision, entry.partition, entry.timestamp)


class Map:
    def __init__(self, connection: Requester, topic: str, router: Router | None = None) -> None:
        self._connection = connection
        self.topic = topic
        self._routes = None if router is None else RoutedMap(router, topic)

    def _routed(self) -> RoutedMap | None:
        """The cluster routes, unless the topic is known to live on one broker (no round trip
        then: the request goes straight to the bootstrap connection, as without routing)."""
        routes = self._routes
        if routes is None or (routes.router.fresh(self.topic) and not routes.router.multi_broker):
            return None
        return routes

    def get(self, key: str | bytes) -> asyncio.Future[MapValue | None]:
        """The key's value, or None. Returns a future (await it): many gets in flight cost
        one future each, with no task, which is what pipelining needs."""
        routes = self._routed()
        if routes is not None:
            return asyncio.ensure_future(_first(routes.get([_bytes(key)], self._connection)))
        response = self._connection.send_request(m.MapGetRequest(self.topic, (_bytes(key),)))
        result: asyncio.Future[MapValue | None] = asyncio.get_running_loop().create_future()
        response.add_done_callback(lambda done: _first_value(done, result))
        return result

    async def get_many(self, keys: Iterable[str | bytes]) -> list[MapValue | None]:
        wanted = [_bytes(k) for k in keys]
        if not wanted:  # the server takes 1..1000 keys a request
            return []
        routes = self._routed()
        if routes is not None:
            return [_value(e) for e in await routes.get(wanted, self._connection)]
        response = await self._connection.request(m.MapGetRequest(self.topic, tuple(wanted)))
        assert isinstance(response, m.MapGetResponse)
        return [_value(entry) for entry in response.entries]

    async def set(self, key: str | bytes, value: str | bytes, revision: int | None = None) -> int:
        """Write `value`; with `revision`, only if the key is still at it. Returns the new
        revision. Raises `RevisionMismatch` when the expectation fails."""
        return (await self._write([m.MapWrite(_bytes(key), _bytes(value), _expect(revision))]))[0]

    async def create(self, key: str | bytes, value: str | bytes) -> int:
        """Write `value` only if the key does not exist."""
        return (await self._write([m.MapWrite(_bytes(key), _bytes(value), ABSENT)]))[0]

    async def set_many(self, items: Mapping[str | bytes, str | bytes]) -> list[int]:
        return await self._write([m.MapWrite(_bytes(k), _bytes(v), ANY) for k, v in items.items()])

    async def write_many(
        self, items: Sequence[tuple[str | bytes, str | bytes | None]]
    ) -> list[int]:
        """Set each key to its value, or delete it where the value is None, in the order given
        (a key written twice keeps the later write), without revision checks: one request (per
        owner, in a cluster), as `set_many`. Returns each write's revision (a delete's: its
        tombstone's offset). At most 1,000 writes a call (`wire.limits.MAX_MAP_KEYS`)."""
        return await self._write(
            [m.MapWrite(_bytes(k), None if v is None else _bytes(v), ANY) for k, v in items]
        )

    async def delete(self, key: str | bytes, revision: int | None = None) -> int:
        """Delete the key (a tombstone record); returns the tombstone's offset."""
        return (await self._write([m.MapWrite(_bytes(key), None, _expect(revision))]))[0]

    async def _write(self, writes: list[m.MapWrite]) -> list[int]:
        routes = self._routed()
        if routes is not None:
            return await routes.set(writes, self._connection)
        response = await self._connection.request(m.MapSetRequest(self.topic, tuple(writes)))
        assert isinstance(response, m.MapSetResponse)
        return list(response.revisions)

    async def scan(
        self, prefix: str | bytes = b"", limit: int = 100, cursor: bytes = b""
    ) -> MapPage:
        """One page of keys starting with `prefix`, in key order, after `cursor`."""
        request = m.MapScanRequest(self.topic, _bytes(prefix), limit, cursor)
        routes = self._routed()
        if routes is not None:
            response: m.Response = await routes.scan(request, self._connection)
        else:
            response = await self._connection.request(request)
        assert isinstance(response, m.MapScanResponse)
        entries = [v for v in (_value(e) for e in response.entries) if v is not None]
        return MapPage(entries, response.cursor)

    async def items(
        self, prefix: str | bytes = b"", page_size: int = 500
    ) -> AsyncIterator[MapValue]:
        """Every entry with `prefix`, a page at a time (each page is consistent)."""
        cursor = b""
        while True:
            page = await self.scan(prefix, page_size, cursor)
            for entry in page.entries:
                yield entry
            if not page.cursor:
                return
            cursor = page.cursor

    async def size(self) -> int:
        routes = self._routed()
        if routes is not None:
            return await routes.size(self._connection)
        response = await self._connection.request(m.MapSizeRequest(self.topic))
        assert isinstance(response, m.MapSizeResponse)
        return response.size


def _first_value(
    response: asyncio.Future[m.Response], result: asyncio.Future[MapValue | None]
) -> None:
    if result.done():
        return
    if response.cancelled():
        result.cancel()
    elif (error := response.exception()) is not None:
        result.set_exception(error)
    else:
        answer = response.result()
        assert isinstance(answer, m.MapGetResponse)
        result.set_result(_value(answer.entries[0]))


async def _first(entries: Awaitable[list[m.MapEntry]]) -> MapValue | None:
    return _value((await entries)[0])


def _expect(revision: int | None) -> int:
    if revision is None:
        return ANY
    if revision < 0:
        raise ValueError("a revision is an offset, >= 0")
    return revision
