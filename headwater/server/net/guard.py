"""The connection's security hooks, kept apart from its I/O (a mixin of
`server.net.client_connection`).

`_guard` runs before the broker for every request of a connection on a server with
authentication (and for AUTHENTICATE on any server: without authentication it is answered with
an empty principal, so a client configured with a token still connects to a development server).
The quota hooks turn a principal's debt into pauses: produce mutes the principal (as Kafka mutes
a throttled channel), so every one of its connections on this port stops being read (the
core's `Hold.MUTED`, `server.net.connection_core`) and gets a THROTTLE push, and a connection it
authenticates meanwhile is muted at once; consume makes the connection unwritable
(`Hold.DELIVERIES`), so subscriptions skip it until the debt is paid, then drains them. The core
keeps the mutes and their times; these hooks arm the timers that end them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Protocol

from headwater.server.net.connection_core import ConnectionCore
from headwater.server.reply import Reply
from headwater.server.security.access import Security, Session
from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError
from headwater.wire.protocol import encode_push


class _Host(Protocol):
    _security: Security | None
    auth: Session | None
    peer: str
    peercert: object
    consumers: dict[int, Any]
    _loop: asyncio.AbstractEventLoop
    _transport: asyncio.Transport | None
    core: ConnectionCore
    _next: int
    _queue: list[Any]

    def _write(self, data: bytes) -> None: ...

    def _schedule(self) -> None: ...

    def _update_reading(self) -> None: ...

    def _send_error(
        self, api_key: int, api_version: int, correlation_id: int, error: HeadwaterError
    ) -> None: ...

    def send_consumer_closed(self, consumer_id: int, code: int, message: str) -> None: ...

    def close(self) -> None: ...

    def _throttle(self, delay: float) -> None: ...

    def _mute(self, delay: float) -> None: ...

    def _unhold(self) -> None: ...

    def _produce_debt(self) -> float: ...

    def _principal_connections(self, principal: str) -> Iterable[_Host]: ...

    def _release_consume(self) -> None: ...

    def revoke(self, error: HeadwaterError) -> None: ...


class Guarded:
    def _fatal(self: _Host, error: HeadwaterError) -> None:
        """Answer (correlation id 0), then close: the byte stream cannot be resynchronised (or
        the connection timed out)."""
        self._send_error(0, 0, 0, error)
        self.close()

    def _guard(self: _Host, request: m.Request) -> Reply | None:
        """A response to send instead of the broker's, or None to go on; raises to refuse."""
        security = self._security
        if type(request) is m.AuthenticateRequest:
            if security is None:  # authentication is off: say so with an empty principal
                return m.AuthenticateResponse("", 0)
            return security.authenticate(self, request)
        assert security is not None
        security.check(self, request)
        size = 0
        if type(request) is m.ProduceRequest:
            size = len(request.batch)
        elif type(request) is m.MapSetRequest:
            size = sum(len(w.key) + len(w.value or b"") for w in request.writes)
        if size:
            delay = security.charge_produce(self, size)
            if delay > 0:
                self._throttle(delay)
        return None

    def _throttle(self: _Host, delay: float) -> None:
        """The principal ran into produce debt: mute every connection of it for `delay`."""
        assert self.auth is not None
        self._mute(delay)
        for other in self._principal_connections(self.auth.principal):
            if other is not self:
                other._mute(delay)

    def _mute(self: _Host, delay: float) -> None:
        """Tell the client to hold its produces, and read nothing more of it for `delay`."""
        if self._transport is None:
            return
        self._write(encode_push(0, m.Throttle(int(delay * 1000) + 1)))
        if self.core.mute(self._loop.time() + delay):
            self._loop.call_later(delay, self._unhold)
            self._update_reading()

    def _unhold(self: _Host) -> None:
        if self._transport is None:
            self.core.unmute(self._loop.time())
            return
        debt = self._produce_debt()
        if not self.core.unmute(self._loop.time(), debt):
            # the principal's debt grew meanwhile, on another connection
            self._loop.call_later(debt, self._unhold)
            return
        if self._next < len(self._queue):
            self._schedule()
        self._update_reading()

    def _produce_debt(self: _Host) -> float:
        security = self._security
        return 0.0 if security is None else security.produce_debt(self)

    def _charge_consume(self: _Host, size: int) -> None:
        assert self._security is not None
        delay = self._security.charge_consume(self, size)
        if delay > 0 and self.core.mute_deliveries(self._loop.time() + delay):
            self._loop.call_later(delay, self._release_consume)

    def _release_consume(self: _Host) -> None:
        self.core.unmute_deliveries()
        if self._transport is not None:
            for consumer in list(self.consumers.values()):
                consumer.subscription.drain()

    def revoke(self: _Host, error: HeadwaterError) -> None:
        """The connection's credential is no longer valid: tell its consumers, then close."""
        for consumer_id in list(self.consumers):
            self.send_consumer_closed(consumer_id, error.code, error.message)
        self._send_error(0, 0, 0, error)
        self.close()
