"""A minimal HTTP/1.1 listener for operators: GET and HEAD only, one request per connection.

It serves `/metrics`, the health checks and the status page (routes in `server.ops.status`), so it
needs none of a web framework: a request head is read (at most `MAX_HEAD` bytes, within
`HEAD_TIMEOUT`), the route's handler makes the whole body, and the answer goes out with
`Connection: close`. Request bodies are never read. Anything else gets a short error status and
the connection is closed: garbage 400 (at once when the first byte cannot begin a request line:
a client of another protocol at the wrong port hears so without waiting), too large a head 431,
other methods 405, other versions 505, an unknown path 404, a handler that fails 500 (logged, no
traceback to the client).

It runs on the server's event loop, so it must never stall the message port: handlers are
coroutines that only read in-memory state (or hand disk work to a thread), each connection has a
hard lifetime (`CONNECTION_LIFETIME`), and at most `MAX_CONNECTIONS` are open: past that the
oldest one is aborted, so slow clients cannot lock scrapers out either. Accepting is done by hand
(`accepting.Acceptor`, as on the message port), so running out of file descriptors pauses it
instead of closing the listening socket for good.

Security (docs/SECURITY.md) comes from the caller: with a `ServerTls`, every accepted socket
is wrapped with its current context (the message port's, so a reloaded certificate applies to
both) and a client that does not complete a TLS handshake within `HEAD_TIMEOUT` is dropped, so
plaintext never reaches a handler; at most `MAX_CONNECTIONS` handshakes are pending at once.
A `Guard` sees every parsed request before routing and may answer it instead (401/403/429), so
an unauthenticated client cannot even learn which paths exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, Protocol, cast

import structlog

from headwater.server.net.accepting import Acceptor, ListenError, listen_on
from headwater.storage.tasks import spawn

log = structlog.get_logger(__name__)

MAX_HEAD: Final = 8 * 1024
HEAD_TIMEOUT: Final = 5.0
CONNECTION_LIFETIME: Final = 30.0
MAX_CONNECTIONS: Final = 64
ACCEPT_BURST: Final = 16
RETRY_DELAY: Final = 0.5

_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()  # extra response headers (WWW-Authenticate, ...)


Handler = Callable[[str], Awaitable[Response]]  # the query string -> the answer


@dataclass(frozen=True, slots=True)
class Request:
    """What a guard sees: the path, the headers (names lower-cased) and the peer's address."""

    method: str
    path: str
    headers: dict[str, str]
    peer: str  # the source address, without the port


Guard = Callable[[Request], Response | None]  # None: let the request through to its route


class HttpStartupError(Exception):
    pass


class TlsSource(Protocol):
    """`server.security.tls.ServerTls`: its context is read per connection, so a reload applies at
    once."""

    context: ssl.SSLContext


class _Request(asyncio.Protocol):
    def __init__(self, server: HttpListener) -> None:
        self._server = server
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._answered = False
        self._timers: list[asyncio.TimerHandle] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        loop = self._server.loop
        self._server.opened(self)
        self._timers = [
            loop.call_later(HEAD_TIMEOUT, self._head_timeout),
            loop.call_later(CONNECTION_LIFETIME, self.abort),
        ]

    def data_received(self, data: bytes) -> None:
        if self._answered:
            return  # a body, or pipelined requests: not read
        if not self._buffer and not data[:1].isupper():
            # no request line starts so (a method is an upper-case token): another protocol's
            # client at the wrong port, a Headwater or Kafka frame's size prefix; told at once,
            # so that it can say which port it reached (`headwater` does), not after HEAD_TIMEOUT
            self._reply(Response(400, b"not an HTTP request: this is the operator's HTTP port\n"))
            return
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD:
                self._reply(Response(431, b"request head too large\n"))
            return
        if end > MAX_HEAD:
            self._reply(Response(431, b"request head too large\n"))
            return
        self._answered = True
        self._timers[0].cancel()
        head = bytes(self._buffer[:end])
        self._buffer.clear()
        self._server.spawn(self._dispatch(head))

    def eof_received(self) -> bool:
        if not self._answered:
            self.abort()  # the client gave up before a whole head
        return True  # keep the write side open for an answer still being made

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in self._timers:
            timer.cancel()
        self._transport = None
        self._server.closed(self)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _head_timeout(self) -> None:
        if not self._answered:
            self._reply(Response(408, b"request head not received in time\n"))

    async def _dispatch(self, head: bytes) -> None:
        method, target, response = _parse(head)
        path, _, query = target.partition("?")
        guard = self._server.guard
        if response is None and guard is not None:
            response = guard(Request(method, path, _headers(head), self._peer()))
        if response is None:
            handler = self._server.routes.get(path)
            if handler is None:
                response = Response(404, b"not found; see / for the status page\n")
            else:
                try:
                    response = await handler(query)
                except Exception:
                    log.exception("http.handler_failed", path=path)
                    response = Response(500, b"internal error; see the server log\n")
        self._reply(response, head_only=method == "HEAD")

    def _peer(self) -> str:
        address = None if self._transport is None else self._transport.get_extra_info("peername")
        return str(address[0]) if isinstance(address, tuple) and address else ""

    def _reply(self, response: Response, head_only: bool = False) -> None:
        self._answered = True
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        head = (
            f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Error')}\r\n"
            f"Content-Type: {response.content_type}\r\n"
            f"Content-Length: {len(response.body)}\r\n"
            + "".join(f"{name}: {value}\r\n" for name, value in response.headers)
            + "Cache-Control: no-store\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        transport.write(head if head_only else head + response.body)
        transport.close()  # after the buffer is flushed; the lifetime timer bounds that


def _parse(head: bytes) -> tuple[str, str, Response | None]:
    """(method, target, None) for a request we serve, else an error response."""
    try:
        request_line = head.split(b"\r\n", 1)[0].decode("ascii")
    except UnicodeDecodeError:
        return "", "", Response(400, b"request line is not ASCII\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[1].startswith("/"):
        return "", "", Response(400, b"malformed request line\n")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        return method, target, Response(505, b"HTTP/1.0 and HTTP/1.1 only\n")
    if method not in ("GET", "HEAD"):
        return method, target, Response(405, b"GET and HEAD only\n")
    return method, target, None


def _headers(head: bytes) -> dict[str, str]:
    """The header fields of a request head (names lower-cased; a repeated name: the last)."""
    headers: dict[str, str] = {}
    for line in head.split(b"\r\n")[1:]:
        name, separator, value = line.partition(b":")
        if separator:
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return headers


class HttpListener:
    """`bind` (port conflicts fail start-up early), then `start`, then `close`."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: dict[str, Handler],
        tls: TlsSource | None = None,
        guard: Guard | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.routes = routes
        self.tls = tls
        self.guard = guard
        self._handshakes = 0
        self.loop = asyncio.get_running_loop()
        self._acceptor: Acceptor | None = None
        self._open: dict[_Request, None] = {}  # insertion-ordered: the oldest first
        self._tasks: set[asyncio.Task[Any]] = set()

    def bind(self) -> int:
        try:
            sockets = listen_on(self.host, self.port, 128, " for HTTP")
        except ListenError as exc:
            raise HttpStartupError(str(exc)) from None
        self._acceptor = Acceptor(sockets, self._admit, burst=ACCEPT_BURST, retry_delay=RETRY_DELAY)
        bound: int = sockets[0].getsockname()[1]
        return bound

    def start(self) -> None:
        assert self._acceptor is not None, "bind first"
        self._acceptor.start()

    def close(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
        for request in list(self._open):
            request.abort()
        for task in self._tasks:
            task.cancel()

    # Connections

    def opened(self, request: _Request) -> None:
        if len(self._open) >= MAX_CONNECTIONS:
            next(iter(self._open)).abort()
        self._open[request] = None

    def closed(self, request: _Request) -> None:
        self._open.pop(request, None)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        spawn(work, "http.request_failed", self._tasks)

    # Accepting

    def _admit(self, sock: socket.socket) -> None:
        if self.tls is not None and self._handshakes >= MAX_CONNECTIONS:
            sock.close()  # handshakes are bounded too, else they would be the way in
            return
        self.spawn(self._connect(sock))

    async def _connect(self, sock: socket.socket) -> None:
        tls = self.tls
        if tls is not None:
            self._handshakes += 1
        try:
            await self.loop.connect_accepted_socket(
                lambda: _Request(self),
                sock,
                ssl=None if tls is None else tls.context,
                ssl_handshake_timeout=None if tls is None else HEAD_TIMEOUT,
            )
        except (TimeoutError, OSError) as exc:  # gone, or no TLS handshake (plaintext)
            if tls is not None:
                log.info("http.tls_failed", error=str(exc) or type(exc).__name__)
            with contextlib.suppress(OSError):
                sock.close()
        finally:
            if tls is not None:
                self._handshakes -= 1
