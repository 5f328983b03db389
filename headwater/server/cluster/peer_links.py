"""Connections from this broker to the other brokers' message ports, for the records a broker
writes to a partition another broker owns (a dead letter whose topic's partition is served
elsewhere) and for what a transaction coordinator asks a partition's owner to do at a
transaction's end: write its marker (WRITE_TXN_MARKER), apply its acknowledgements
(WRITE_TXN_ACKS; `server.cluster.cluster_transactions`).

A link is the native protocol over one TCP connection per peer (TLS when this broker's own port
is TLS), opened on first use and reused; `wire.session.ClientSession` numbers the requests and
matches the answers, as in the client library. With authentication on, the link authenticates
with `cluster.peer_token`, a token of the cluster's tokens file (it needs the produce grant on
the topics it writes: `produce:*`, or `produce:<topic>-*` for the dead-letter topics of
`<topic>`'s subscriptions, docs/CLUSTER.md). A produce goes with acks from the owner,
which answers once the batch is in the object store, as for any producer. Anything short of that
answer (the peer died, refused, the partition moved) raises a `HeadwaterError` and closes the
link: nothing was acknowledged, and the caller tries again later, so a record may be written
twice (at-least-once, as every non-idempotent producer) but is never reported written when it
was not. Every step is bounded by `PEER_TIMEOUT`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass

import structlog

from headwater.server.requests.partition_ownership import BrokerAddress
from headwater.wire import messages as m
from headwater.wire.errors import ConnectionLost, HeadwaterError, RequestTimeout
from headwater.wire.session import ClientSession

log = structlog.get_logger(__name__)

# a peer that does not answer within this long is treated as gone: the write is retried later
PEER_TIMEOUT = 10.0


@dataclass(slots=True)
class _Link:
    session: ClientSession
    writer: asyncio.StreamWriter
    reader_task: asyncio.Task[None] | None = None
    closed: bool = False


class PeerLinks:
    def __init__(self, token: str = "", tls: ssl.SSLContext | None = None) -> None:
        self._token = token
        self._tls = tls
        self._links: dict[BrokerAddress, _Link] = {}
        self._opening: dict[BrokerAddress, asyncio.Lock] = {}

    async def produce(self, peer: BrokerAddress, topic: str, partition: int, batch: bytes) -> int:
        """Append `batch` to the partition at `peer`; its base offset once `peer` acknowledged
        it. Raises `HeadwaterError` (the peer's refusal, or a lost or silent link)."""
        response = await self._request(peer, m.ProduceRequest(topic, partition, batch))
        assert isinstance(response, m.ProduceResponse)
        return response.base_offset

    async def write_marker(self, peer: BrokerAddress, request: m.WriteTxnMarkerRequest) -> None:
        """A transaction's marker written by `peer`, the partition's owner (answered once it is
        in the object store). Raises `HeadwaterError` as `produce` does."""
        await self._request(peer, request)

    async def write_acks(self, peer: BrokerAddress, request: m.WriteTxnAcksRequest) -> None:
        """A committed transaction's acknowledgements applied by `peer`, the partition's owner
        (answered once the cursors are in etcd). Raises `HeadwaterError` as `produce` does."""
        await self._request(peer, request)

    async def _request(self, peer: BrokerAddress, request: m.Request) -> m.Response:
        link = await self._link(peer)
        waiter: asyncio.Future[m.Response] = asyncio.get_running_loop().create_future()
        if isinstance(request, m.ProduceRequest):
            prefix, body = link.session.produce(request, waiter)
            link.writer.writelines((prefix, body))
        else:
            _, frame = link.session.request(request, waiter)
            link.writer.write(frame)
        try:
            async with asyncio.timeout(PEER_TIMEOUT):
                return await waiter
        except TimeoutError:
            self._close(peer, link)
            silent = f"broker {peer} did not answer within {PEER_TIMEOUT:g} s"
            raise RequestTimeout(silent) from None

    async def _link(self, peer: BrokerAddress) -> _Link:
        link = self._links.get(peer)
        if link is not None and not link.closed:
            return link
        async with self._opening.setdefault(peer, asyncio.Lock()):
            link = self._links.get(peer)
            if link is not None and not link.closed:
                return link
            try:
                async with asyncio.timeout(PEER_TIMEOUT):
                    reader, writer = await asyncio.open_connection(
                        peer.host, peer.port, ssl=self._tls
                    )
            except (OSError, TimeoutError) as exc:
                raise ConnectionLost(f"cannot reach broker {peer}: {exc}") from None
            loop = asyncio.get_running_loop()
            link = _Link(ClientSession(loop.time), writer)
            link.reader_task = loop.create_task(self._read(peer, link, reader))
            self._links[peer] = link
            log.info("cluster.peer_connected", peer=str(peer))
        if self._token:
            await self._request(peer, m.AuthenticateRequest("token", self._token.encode()))
        return link

    async def _read(self, peer: BrokerAddress, link: _Link, reader: asyncio.StreamReader) -> None:
        error: HeadwaterError = ConnectionLost(f"broker {peer} closed the connection")
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                fatal = link.session.receive(data)
                if fatal is not None:
                    error = fatal
                    break
        except OSError as exc:
            error = ConnectionLost(f"connection to broker {peer} lost: {exc}")
        finally:
            link.session.fail(error)
            self._close(peer, link)

    def _close(self, peer: BrokerAddress, link: _Link) -> None:
        if link.closed:
            return
        link.closed = True
        link.session.fail(ConnectionLost(f"connection to broker {peer} closed"))
        link.writer.close()
        if self._links.get(peer) is link:
            del self._links[peer]

    async def close(self) -> None:
        for peer, link in list(self._links.items()):
            self._close(peer, link)
            if link.reader_task is not None:
                link.reader_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await link.reader_task
