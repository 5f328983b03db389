"""A client's side of one connection, without the I/O: ids, pending requests, pushes, THROTTLE.

The server has its sans-I/O pieces in `wire`; so has the client. A `ClientSession` numbers requests
(correlation ids), remembers who waits for each answer (a `Waiter`: an asyncio future in
headwater/client/broker_connection.py, a plain `Answer` in the blocking clients), cuts received
bytes into frames and sends each where it belongs:

- a response resolves its waiter with the decoded response, or fails it with the
  `HeadwaterError` the server named. An error answering a frame sent with NO_RESPONSE has no
  waiter: it goes to `on_unsolicited_error`. An AUTHENTICATION_FAILED pushed with correlation id
  0 (the credential was revoked or expired) is fatal: `receive` returns it and the caller closes.
- a push goes to the `PushHandler` registered under its consumer id (or `on_push`, for a client
  that reads pushes itself; with neither it is a delivery racing an unsubscribe and is dropped).
  CONSUMER_CLOSED unregisters the consumer.
- THROTTLE (the principal is over its produce quota) moves `throttled_until` (on the clock the
  session was given); producers wait until then before sending more.

The I/O layer writes the bytes `request`/`produce` return and passes what it reads to
`receive`; when the transport ends it calls `fail`, then tells the consumers `close_consumers`
returns.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Protocol

from headwater.wire import messages as m
from headwater.wire.api.produce import produce_request_parts
from headwater.wire.errors import (
    AuthenticationFailed,
    ConnectionClosed,
    ConnectionLost,
    HeadwaterError,
    error_for_code,
)
from headwater.wire.frames import Flags, Frame, FrameDecoder
from headwater.wire.protocol import decode_push, decode_response, encode_request


class Waiter(Protocol):
    """What waits for one answer: asyncio.Future fits, and so does `Answer`."""

    def done(self) -> bool: ...

    def set_result(self, result: m.Response, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


class Answer:
    """A `Waiter` for clients without an event loop: they read until `done()`."""

    __slots__ = ("error", "response")

    def __init__(self) -> None:
        self.response: m.Response | None = None
        self.error: BaseException | None = None

    def done(self) -> bool:
        return self.response is not None or self.error is not None

    def set_result(self, result: m.Response, /) -> None:
        self.response = result

    def set_exception(self, exception: BaseException, /) -> None:
        self.error = exception

    def result(self) -> m.Response:
        if self.error is not None:
            raise self.error
        assert self.response is not None
        return self.response


class PushHandler(Protocol):
    def on_delivery(self, delivery: m.Delivery) -> None: ...

    def on_closed(self, error: HeadwaterError) -> None: ...

    def on_dropped(self, count: int) -> None: ...


def _ignore(error: HeadwaterError) -> None:
    pass


class ClientSession:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._correlation = itertools.count(1)
        self._decoder = FrameDecoder()
        self.pending: dict[int, Waiter] = {}
        self._callbacks: dict[int, Callable[[m.Response], None]] = {}
        self.consumers: dict[int, PushHandler] = {}
        self.on_push: Callable[[int, m.Push], None] | None = None
        self.on_unsolicited_error: Callable[[HeadwaterError], None] = _ignore
        self.throttled_until = 0.0  # on `clock`: until then the server asked us to hold produce
        self.throttles = 0  # THROTTLE pushes received

    # Sending

    def request(
        self,
        request: m.Request,
        waiter: Waiter | None,
        on_response: Callable[[m.Response], None] | None = None,
    ) -> tuple[int, bytes]:
        """The frame for `request` and its correlation id; `waiter` gets the answer. Without a
        waiter the frame goes with NO_RESPONSE: only a refusal comes back."""
        correlation_id = next(self._correlation)
        if waiter is None:
            return correlation_id, encode_request(request, correlation_id, Flags.NO_RESPONSE)
        # encoded before the waiter is registered: a request that cannot be encoded (a name that
        # is not UTF-8) is refused to its caller alone, and leaves no waiter behind to fail
        # unseen when the connection closes ("Future exception was never retrieved")
        frame = encode_request(request, correlation_id)
        self.pending[correlation_id] = waiter
        if on_response is not None:
            self._callbacks[correlation_id] = on_response
        return correlation_id, frame

    def produce(self, request: m.ProduceRequest, waiter: Waiter | None) -> tuple[bytes, bytes]:
        """A produce frame as (prefix, batch), so the batch is written without a copy."""
        correlation_id = next(self._correlation)
        if waiter is None:
            return produce_request_parts(request, correlation_id, Flags.NO_RESPONSE)
        parts = produce_request_parts(request, correlation_id, 0)  # first, as in `request`
        self.pending[correlation_id] = waiter
        return parts

    def forget(self, correlation_id: int) -> Waiter | None:
        """Stop waiting for an answer (a timeout); a late answer is then dropped."""
        self._callbacks.pop(correlation_id, None)
        return self.pending.pop(correlation_id, None)

    def throttle_delay(self) -> float:
        """Seconds to hold produce, by the server's last THROTTLE (0 when none is in force)."""
        return max(0.0, self.throttled_until - self._clock())

    # Receiving

    def receive(self, data: bytes) -> HeadwaterError | None:
        """Handle the frames in `data`. Returns an error that ends the connection (bytes that
        are not frames, a revoked credential); raises nothing."""
        try:
            frames = self._decoder.feed(data)
        except HeadwaterError as exc:
            return exc
        for frame in frames:
            if isinstance(frame, Frame):
                fatal = self.handle(frame)
                if fatal is not None:
                    return fatal
        return None

    def handle(self, frame: Frame) -> HeadwaterError | None:
        header = frame.header
        if header.is_push:
            self._push(frame)
            return None
        correlation_id = header.correlation_id
        waiter = self.pending.pop(correlation_id, None)
        try:
            response = decode_response(header, frame.body)
        except HeadwaterError as exc:
            self._callbacks.pop(correlation_id, None)
            if correlation_id == 0 and isinstance(exc, AuthenticationFailed):
                return exc  # the credential was revoked or expired: every request fails
            if waiter is None:
                self.on_unsolicited_error(exc)
            elif not waiter.done():
                waiter.set_exception(exc)
            return None
        callback = self._callbacks.pop(correlation_id, None)
        if callback is not None:
            callback(response)
        if waiter is not None and not waiter.done():
            waiter.set_result(response)
        return None

    def _push(self, frame: Frame) -> None:
        header = frame.header
        if header.api_key == m.ApiKey.THROTTLE:
            try:
                throttle = decode_push(header, frame.body)
            except HeadwaterError:
                return
            if isinstance(throttle, m.Throttle):
                until = self._clock() + throttle.throttle_ms / 1000
                self.throttled_until = max(self.throttled_until, until)
                self.throttles += 1
            return
        consumer_id = header.correlation_id
        handler = self.consumers.get(consumer_id)
        if handler is None:
            if self.on_push is not None:
                self.on_push(consumer_id, decode_push(header, frame.body))
            return  # else a delivery racing our unsubscribe
        try:
            push = decode_push(header, frame.body)
        except HeadwaterError as exc:
            handler.on_closed(exc)
            return
        if type(push) is m.Delivery:
            handler.on_delivery(push)
        elif isinstance(push, m.MessagesDropped):
            handler.on_dropped(push.count)
        elif isinstance(push, m.ConsumerClosed):
            self.consumers.pop(consumer_id, None)
            error = error_for_code(push.error_code, push.message)
            if isinstance(error, ConnectionClosed):
                # a plain ConnectionClosed ends iteration quietly; the server never means that
                error = ConnectionLost(error.message)
            handler.on_closed(error)

    # Ending

    def fail(self, error: HeadwaterError) -> None:
        """The connection ended: every pending request fails with `error`."""
        pending, self.pending = self.pending, {}
        self._callbacks.clear()
        for waiter in pending.values():
            if not waiter.done():
                waiter.set_exception(error)

    def close_consumers(self, error: HeadwaterError) -> None:
        """Tell every registered consumer that the connection ended with `error`."""
        consumers, self.consumers = self.consumers, {}
        for handler in consumers.values():
            handler.on_closed(error)
