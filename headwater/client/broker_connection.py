"""The client's side of one TCP connection: the asyncio I/O around `wire.session.ClientSession`.

The session (sans-I/O, shared with the blocking clients) numbers requests, keeps the futures
waiting for answers, routes pushes to consumers by consumer id and tracks THROTTLE; this module
writes the frames it returns, feeds it what the socket reads, and ends everything when the
connection ends: every pending future fails and every consumer is told, with `ConnectionClosed`
when the application closed it, with `ConnectionLost` when the server or the network ended it
(then `on_lost` runs, which is how a reconnecting client learns it must reconnect). An error
response to a request sent with NO_RESPONSE has no future waiting; it goes to
`on_unsolicited_error`.

Writes respect asyncio's write-buffer watermarks: `drain()` waits while the socket is backed up,
which is how a fast producer feels a slow network instead of growing memory. Producers wait out a
THROTTLE (`throttle()`) before sending more. `open` can wrap the socket in TLS and authenticate
first (headwater/client/credentials.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable
from typing import cast

from headwater.client.credentials import certificate_refused, tls_refusal
from headwater.wire import messages as m
from headwater.wire.errors import (
    AuthenticationFailed,
    CannotConnect,
    ConnectionClosed,
    ConnectionLost,
    HeadwaterError,
    RequestTimeout,
)
from headwater.wire.session import ClientSession, PushHandler

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_SERVER",
    "Connection",
    "PushHandler",
    "default_server",
    "parse_server",
]

logger = logging.getLogger(__name__)

DEFAULT_PORT = 6650
DEFAULT_SERVER = f"127.0.0.1:{DEFAULT_PORT}"
SERVER_VARIABLE = "HEADWATER_SERVER"


def default_server() -> str:
    """The server to use when none is named: $HEADWATER_SERVER, else 127.0.0.1:6650."""
    return os.environ.get(SERVER_VARIABLE) or DEFAULT_SERVER


def parse_server(server: str) -> tuple[str, int]:
    """'host:port', 'host' or ':port' -> (host, port)."""
    host, _, port = server.rpartition(":") if ":" in server else (server, "", "")
    try:
        number = int(port) if port else DEFAULT_PORT
    except ValueError:
        raise ValueError(f"invalid server address {server!r}: port must be a number") from None
    if not 0 < number < 65536:
        raise ValueError(f"invalid server address {server!r}: port out of range")
    return host or "127.0.0.1", number


def other_protocol(head: bytes, address: str) -> str | None:
    """What the first bytes a server sent say about it when they are not a Headwater frame:
    the reason a connection to the wrong kind of port is lost, with the option to use."""
    if head.startswith(b"HTTP/"):
        status = head.split(b"\r\n", 1)[0].decode("ascii", "replace")
        return (
            f"{address} is an HTTP server (it answered {status!r}), such as Headwater's "
            "operator port (status page, /metrics): the message port is the server's --port "
            "(default 6650)"
        )
    if len(head) >= 2 and head[0] in (0x15, 0x16) and head[1] == 0x03:  # a TLS record
        return (
            f"{address} speaks TLS (it answered with a TLS record): connect with TLS "
            "(headwater --tls, with --ca FILE for a private CA; Tls(...) in Python)"
        )
    return None


# the reason given when a server closes a connection without a byte, before any answer
SILENT_CLOSE = (
    "closed by the server before any answer (a TLS port, to a client without TLS, and a Kafka "
    "listener both close so)"
)


class _Protocol(asyncio.Protocol):
    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._receive = connection.session.receive
        self._clock = connection._loop.time
        # the server's first bytes, kept until they show a Headwater frame or another protocol
        self._head: bytes | None = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._connection._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._connection.last_received = self._clock()
        if self._head is not None:
            self._head += data[:64]
            other = other_protocol(self._head, self._connection.address or "the server")
            if other is not None:
                self._connection._fail(self._connection.lost(other))
                return
            if len(self._head) >= 5:
                self._head = None  # a frame, as far as its first bytes tell
        fatal = self._receive(data)
        if fatal is not None:
            connection = self._connection
            if isinstance(fatal, AuthenticationFailed):  # revoked or expired: all requests fail
                connection._fail(fatal)
            else:
                connection._fail(connection.lost(f"the server sent an invalid frame: {fatal}"))

    def connection_lost(self, exc: Exception | None) -> None:
        # After close() this is a no-op: the connection already failed with ConnectionClosed.
        refused = tls_refusal(exc)
        if refused is not None:
            self._connection._fail(refused)
            return
        if exc is None and self._head == b"":
            self._connection._fail(self._connection.lost(SILENT_CLOSE))
            return
        self._connection._fail(self._connection.lost(str(exc) if exc else "closed by the server"))

    def pause_writing(self) -> None:
        self._connection._writable.clear()

    def resume_writing(self) -> None:
        self._connection._writable.set()


class Connection:
    def __init__(self, address: str = "") -> None:
        self.address = address
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self.session = ClientSession(self._loop.time)
        self.session.on_unsolicited_error = self._unsolicited
        self.before_request: list[Callable[[], None]] = []
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed: HeadwaterError | None = None
        self.on_unsolicited_error: Callable[[HeadwaterError], None] = self._log_error
        self.on_lost: Callable[[ConnectionLost], None] | None = None
        self.principal: str | None = None  # as the handshake named it ("" if auth is off)
        # loop time of the last bytes read: a consumer's leg that heard nothing for a while
        # asks whether its broker is frozen (consumer_legs.ClusterLegs._watch_loop)
        self.last_received = self._loop.time()

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        timeout: float = 10.0,
        tls: ssl.SSLContext | None = None,
        handshake: m.AuthenticateRequest | None = None,
        server_hostname: str | None = None,
        client_certificate: bool = False,
    ) -> Connection:
        """Connect, wrap in TLS if `tls`, and send `handshake` first. `client_certificate`:
        `tls` presents one, so a server closing before it answers means it refused it."""
        connection = cls(f"{host}:{port}")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(
                    lambda: _Protocol(connection),
                    host,
                    port,
                    ssl=tls,
                    server_hostname=(server_hostname or host) if tls is not None else None,
                )
        except (TimeoutError, OSError) as exc:
            refused = tls_refusal(exc) or certificate_refused(exc, client_certificate)
            if refused is not None:
                raise refused from None
            raise CannotConnect(
                f"cannot connect to {host}:{port}: {exc or 'timed out'} (is a server running"
                " there? `make run` or `headwater serve` starts one)"
            ) from None
        if handshake is not None:
            try:
                response = await connection.request(handshake, timeout)
            except ConnectionLost as exc:
                await connection.close()
                raise certificate_refused(exc, client_certificate) or exc from None
            except HeadwaterError:
                await connection.close()
                raise
            assert isinstance(response, m.AuthenticateResponse)
            connection.principal = response.principal
        return connection

    async def throttle(self) -> None:
        """Wait out a THROTTLE the server sent (the principal is over its produce quota)."""
        delay = self.session.throttle_delay()
        if delay > 0:
            logger.debug("throttled by the server for %.3f s", delay)
            await asyncio.sleep(delay)

    @property
    def throttled_until(self) -> float:
        """Loop time until which the server asked us to hold produce (THROTTLE)."""
        return self.session.throttled_until

    @property
    def consumers(self) -> dict[int, PushHandler]:
        """Consumer id -> the consumer its pushes go to (the session's routing table)."""
        return self.session.consumers

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def lost(self, reason: str) -> ConnectionLost:
        return ConnectionLost(f"connection to {self.address or 'the server'} lost: {reason}")

    def _check_open(self) -> asyncio.Transport:
        if self._closed is not None:
            # a fresh exception each time: re-raising one instance piles up its tracebacks
            raise type(self._closed)(self._closed.message)
        assert self._transport is not None
        return self._transport

    async def request(
        self,
        request: m.Request,
        timeout: float | None = 30.0,
        on_response: Callable[[m.Response], None] | None = None,
    ) -> m.Response:
        """Send and await the response (see `send_request`)."""
        return await self.send_request(request, timeout, on_response)

    def send_request(
        self,
        request: m.Request,
        timeout: float | None = 30.0,
        on_response: Callable[[m.Response], None] | None = None,
    ) -> asyncio.Future[m.Response]:
        """Send now; the future gets the response. No coroutine and no task per request, so
        pipelined requests cost little. `on_response` runs as soon as the response is decoded,
        before any later frame: a SUBSCRIBE uses it to route the deliveries that may follow its
        response in the same read."""
        transport = self._check_open()
        for flush in list(self.before_request):
            flush()  # e.g. acks batched for this turn go out before a later request
        future: asyncio.Future[m.Response] = self._loop.create_future()
        correlation_id, frame = self.session.request(request, future, on_response)
        transport.write(frame)
        if timeout is not None:
            # A timer rather than asyncio.wait_for, which costs a task per request.
            timer = self._loop.call_later(timeout, self._time_out, correlation_id, request)
            future.add_done_callback(lambda _: timer.cancel())
        return future

    def _time_out(self, correlation_id: int, request: m.Request) -> None:
        future = self.session.forget(correlation_id)
        if future is not None and not future.done():
            future.set_exception(RequestTimeout(f"no response to {type(request).__name__} in time"))

    def produce(
        self, request: m.ProduceRequest, response: asyncio.Future[m.Response] | None
    ) -> None:
        """Write a produce frame without copying its batch; `response` (if any) gets the answer."""
        transport = self._check_open()
        transport.writelines(self.session.produce(request, response))

    def send_nowait(self, request: m.Request) -> None:
        """Send with NO_RESPONSE: the server answers only an error (to on_unsolicited_error)."""
        transport = self._check_open()
        transport.write(self.session.request(request, None)[1])

    @property
    def writable(self) -> bool:
        return self._writable.is_set() and self._closed is None

    async def drain(self) -> None:
        """Wait while the socket's write buffer is above its high-water mark."""
        if not self._writable.is_set():
            await self._writable.wait()
        self._check_open()

    def _unsolicited(self, error: HeadwaterError) -> None:
        self.on_unsolicited_error(error)  # looked up per call: producers replace it

    def _fail(self, error: HeadwaterError) -> None:
        if self._closed is not None:
            return
        self._closed = error
        self.session.fail(error)
        if isinstance(error, ConnectionLost) and self.on_lost is not None:
            self.on_lost(error)  # before the consumers hear of it, so they know a reconnect is due
        self.session.close_consumers(error)
        self._writable.set()  # wake writers so they see the error
        if self._transport is not None:
            self._transport.close()

    def abandon(self) -> None:
        """Drop the connection now: every unanswered request fails with ConnectionClosed."""
        self._fail(ConnectionClosed("connection abandoned after a retriable error"))

    async def close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        self._fail(ConnectionClosed("connection closed by the client"))
        await asyncio.sleep(0)

    @staticmethod
    def _log_error(error: HeadwaterError) -> None:
        logger.warning("request sent without response failed: %s", error)
