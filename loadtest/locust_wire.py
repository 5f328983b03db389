"""A blocking connection for locust users that consume and fire-and-forget (loadtest/locustfile.py).

`headwater.blocking.BlockingClient` answers one request at a time and does not consume; locust's
users also need to send frames with NO_RESPONSE (at-most-once producers, FLOW, ACK) and to
receive pushed deliveries. This class does that with the same sans-I/O codec (`wire`) over a
plain socket, which gevent makes cooperative under locust:

- `send(request, no_response=True)`: write a frame; the server answers it only with an error,
  which is collected in `refusals` by the next read;
- `call(request)`: write and read until its answer, keeping the pushes that arrive meanwhile;
- `poll(seconds)`: read what arrives within `seconds`; returns the pushed frames (deliveries,
  MESSAGES_DROPPED, CONSUMER_CLOSED) decoded.

Any socket error or a server that closes the connection raises `ConnectionLost`.
"""

from __future__ import annotations

import itertools
import socket
import time

from headwater.connection import parse_server
from wire import messages as m
from wire.errors import ConnectionLost, HeadwaterError
from wire.frames import Flags, Frame, FrameDecoder
from wire.protocol import decode_push, decode_response, encode_request


class WireConnection:
    def __init__(self, server: str, timeout: float = 10.0) -> None:
        host, port = parse_server(server)
        self._timeout = timeout
        self._socket = socket.create_connection((host, port), timeout=timeout)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._decoder = FrameDecoder()
        self._correlation = itertools.count(1)
        self._pushes: list[m.Push] = []
        self.refusals: list[HeadwaterError] = []  # errors answering NO_RESPONSE frames

    def send(self, request: m.Request, no_response: bool = True) -> int:
        correlation_id = next(self._correlation)
        flags = Flags.NO_RESPONSE if no_response else 0
        try:
            self._socket.sendall(encode_request(request, correlation_id, flags))
        except OSError as exc:
            raise ConnectionLost(f"send failed: {exc}") from None
        return correlation_id

    def call(self, request: m.Request) -> m.Response:
        """Send and wait (at most `timeout`) for the answer; raises the error it carries."""
        correlation_id = self.send(request, no_response=False)
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            for frame in self._read(deadline - time.monotonic()):
                if frame.header.correlation_id == correlation_id:
                    return decode_response(frame.header, frame.body)
                self._unsolicited(frame)
        raise ConnectionLost(f"no answer to {type(request).__name__} in {self._timeout}s")

    def poll(self, seconds: float) -> list[m.Push]:
        """Pushed frames that arrive within `seconds` (at least those already buffered)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self._pushes:
            for frame in self._read(deadline - time.monotonic()):
                self._unsolicited(frame)
        pushes, self._pushes = self._pushes, []
        return pushes

    def _unsolicited(self, frame: Frame) -> None:
        if frame.header.is_push:
            self._pushes.append(decode_push(frame.header, frame.body))
            return
        try:
            decode_response(frame.header, frame.body)
        except HeadwaterError as exc:
            self.refusals.append(exc)

    def _read(self, seconds: float) -> list[Frame]:
        self._socket.settimeout(max(0.001, seconds))
        try:
            data = self._socket.recv(1 << 20)
        except TimeoutError:
            return []
        except OSError as exc:
            raise ConnectionLost(f"receive failed: {exc}") from None
        finally:
            self._socket.settimeout(self._timeout)
        if not data:
            raise ConnectionLost("closed by the server")
        return [e for e in self._decoder.feed(data) if isinstance(e, Frame)]

    def close(self) -> None:
        self._socket.close()
