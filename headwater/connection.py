"""The client's side of one TCP connection: requests matched to responses, pushes routed.

Each request gets a fresh correlation id and a future; the response with that id resolves it (or
fails it with the `HeadwaterError` the server named). Frames flagged PUSH carry a consumer id in the
correlation id field and go to that consumer's handler. When the connection ends, every pending
future fails and every consumer is told: with `ConnectionClosed` when the application closed
it, with `ConnectionLost` when the server or the network ended it (then `on_lost` runs, which is
how a reconnecting client learns it must reconnect). An error response to a request sent with
NO_RESPONSE has no future waiting; it goes to `on_unsolicited_error`.

Writes respect asyncio's write-buffer watermarks: `drain()` waits while the socket is backed up,
which is how a fast producer feels a slow network instead of growing memory. A THROTTLE push
(the principal is over its produce quota) sets `throttled_until`; producers wait it out
(`throttle()`) before sending more. `open` can wrap the socket in TLS and authenticate first
(headwater/auth.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from collections.abc import Callable
from typing import Protocol, cast

from headwater.auth import certificate_refused, tls_refusal
from wire import messages as m
from wire.codec import decode_push, decode_response, encode_request, produce_request_parts
from wire.errors import (
    AuthenticationFailed,
    ConnectionClosed,
    ConnectionLost,
    HeadwaterError,
    RequestTimeout,
    error_for_code,
)
from wire.frames import Flags, Frame, FrameDecoder

logger = logging.getLogger("headwater.client")

DEFAULT_PORT = 6650


class PushHandler(Protocol):
    def on_delivery(self, delivery: m.Delivery) -> None: ...

    def on_closed(self, error: HeadwaterError) -> None: ...

    def on_dropped(self, count: int) -> None: ...


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


class _Protocol(asyncio.Protocol):
    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._decoder = FrameDecoder()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._connection._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except HeadwaterError as exc:
            self._connection._fail(
                self._connection.lost(f"the server sent an invalid frame: {exc}")
            )
            return
        for frame in frames:
            if isinstance(frame, Frame):
                self._connection._on_frame(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        # After close() this is a no-op: the connection already failed with ConnectionClosed.
        refused = tls_refusal(exc)
        if refused is not None:
            self._connection._fail(refused)
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
        self._correlation = itertools.count(1)
        self._pending: dict[int, asyncio.Future[m.Response]] = {}
        self._callbacks: dict[int, Callable[[m.Response], None]] = {}
        self.consumers: dict[int, PushHandler] = {}
        self.before_request: list[Callable[[], None]] = []
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed: HeadwaterError | None = None
        self.on_unsolicited_error: Callable[[HeadwaterError], None] = self._log_error
        self.on_lost: Callable[[ConnectionLost], None] | None = None
        self.throttled_until = 0.0  # loop time until which the server asked us to hold produce
        self.principal: str | None = None  # as the handshake named it ("" if auth is off)

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
            await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Protocol(connection),
                    host,
                    port,
                    ssl=tls,
                    server_hostname=(server_hostname or host) if tls is not None else None,
                ),
                timeout,
            )
        except (TimeoutError, OSError) as exc:
            refused = tls_refusal(exc) or certificate_refused(exc, client_certificate)
            if refused is not None:
                raise refused from None
            raise ConnectionClosed(
                f"cannot connect to {host}:{port}: {exc or 'timed out'}"
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
        delay = self.throttled_until - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)

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
        correlation_id = next(self._correlation)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[m.Response] = loop.create_future()
        self._pending[correlation_id] = future
        if on_response is not None:
            self._callbacks[correlation_id] = on_response
        transport.write(encode_request(request, correlation_id))
        if timeout is not None:
            # A timer rather than asyncio.wait_for, which costs a task per request.
            timer = loop.call_later(timeout, self._time_out, correlation_id, request)
            future.add_done_callback(lambda _: timer.cancel())
        return future

    def _time_out(self, correlation_id: int, request: m.Request) -> None:
        self._callbacks.pop(correlation_id, None)
        future = self._pending.pop(correlation_id, None)
        if future is not None and not future.done():
            future.set_exception(RequestTimeout(f"no response to {type(request).__name__} in time"))

    def produce(
        self, request: m.ProduceRequest, response: asyncio.Future[m.Response] | None
    ) -> None:
        """Write a produce frame without copying its batch; `response` (if any) gets the answer."""
        transport = self._check_open()
        correlation_id = next(self._correlation)
        if response is not None:
            self._pending[correlation_id] = response
        flags = 0 if response is not None else Flags.NO_RESPONSE
        transport.writelines(produce_request_parts(request, correlation_id, flags))

    def send_nowait(self, request: m.Request) -> None:
        """Send with NO_RESPONSE: the server answers only an error (to on_unsolicited_error)."""
        transport = self._check_open()
        transport.write(encode_request(request, next(self._correlation), Flags.NO_RESPONSE))

    @property
    def writable(self) -> bool:
        return self._writable.is_set() and self._closed is None

    async def drain(self) -> None:
        """Wait while the socket's write buffer is above its high-water mark."""
        if not self._writable.is_set():
            await self._writable.wait()
        self._check_open()

    def _on_frame(self, frame: Frame) -> None:
        header = frame.header
        if header.is_push and header.api_key == m.ApiKey.THROTTLE:
            self._throttled(frame)
            return
        if header.is_push:
            handler = self.consumers.get(header.correlation_id)
            if handler is None:
                return  # a delivery racing our unsubscribe
            try:
                push = decode_push(header, frame.body)
            except HeadwaterError as exc:
                handler.on_closed(exc)
                return
            if isinstance(push, m.Delivery):
                handler.on_delivery(push)
            elif isinstance(push, m.MessagesDropped):
                handler.on_dropped(push.count)
            elif isinstance(push, m.ConsumerClosed):
                self.consumers.pop(header.correlation_id, None)
                error = error_for_code(push.error_code, push.message)
                if isinstance(error, ConnectionClosed):
                    # a plain ConnectionClosed ends iteration quietly; the server never means that
                    error = ConnectionLost(error.message)
                handler.on_closed(error)
            return
        future = self._pending.pop(header.correlation_id, None)
        try:
            response = decode_response(header, frame.body)
        except HeadwaterError as exc:
            if header.correlation_id == 0 and isinstance(exc, AuthenticationFailed):
                self._fail(exc)  # the credential was revoked or expired: every request fails
                return
            if future is None:
                self.on_unsolicited_error(exc)
            elif not future.done():
                future.set_exception(exc)
            return
        callback = self._callbacks.pop(header.correlation_id, None)
        if callback is not None:
            callback(response)
        if future is not None and not future.done():
            future.set_result(response)

    def _throttled(self, frame: Frame) -> None:
        try:
            push = decode_push(frame.header, frame.body)
        except HeadwaterError:
            return
        if isinstance(push, m.Throttle):
            until = asyncio.get_running_loop().time() + push.throttle_ms / 1000
            self.throttled_until = max(self.throttled_until, until)
            logger.debug("throttled by the server for %d ms", push.throttle_ms)

    def _fail(self, error: HeadwaterError) -> None:
        if self._closed is not None:
            return
        self._closed = error
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        if isinstance(error, ConnectionLost) and self.on_lost is not None:
            self.on_lost(error)  # before the consumers hear of it, so they know a reconnect is due
        for handler in list(self.consumers.values()):
            handler.on_closed(error)
        self.consumers.clear()
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
