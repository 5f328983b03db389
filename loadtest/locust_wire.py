"""A blocking connection for locust users that consume and fire-and-forget (loadtest/locustfile.py).

`headwater.client.blocking.BlockingClient` answers one request at a time and does not consume;
locust's users also need to send frames with NO_RESPONSE (at-most-once producers, FLOW, ACK) and to
receive pushed deliveries. This class does that over a plain socket, which gevent makes cooperative
under locust, with the same sans-I/O session as the other clients (`wire.session.ClientSession`:
correlation ids, pending answers, THROTTLE):

- `send(request, no_response=True)`: write a frame; the server answers it only with an error,
  which is collected in `refusals` by the next read;
- `call(request)`: write and read until its answer, keeping the pushes that arrive meanwhile;
- `poll(seconds)`: read what arrives within `seconds`; returns the pushed frames (deliveries,
  MESSAGES_DROPPED, CONSUMER_CLOSED) decoded. The session's `on_push` hands them over as they
  are, since locust users route them themselves.

Any socket error or a server that closes the connection raises `ConnectionLost`.
"""

from __future__ import annotations

import socket
import time

from headwater.client.broker_connection import parse_server
from headwater.wire import messages as m
from headwater.wire.errors import ConnectionLost, HeadwaterError
from headwater.wire.session import Answer, ClientSession


class WireConnection:
    def __init__(self, server: str, timeout: float = 10.0) -> None:
        host, port = parse_server(server)
        self._timeout = timeout
        self._socket = socket.create_connection((host, port), timeout=timeout)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._session = ClientSession(time.monotonic)
        self._session.on_push = self._pushed
        self._session.on_unsolicited_error = self._refused
        self._pushes: list[m.Push] = []
        self.refusals: list[HeadwaterError] = []  # errors answering NO_RESPONSE frames

    def send(self, request: m.Request, no_response: bool = True) -> int:
        return self._send(request, None if no_response else Answer())

    def _send(self, request: m.Request, answer: Answer | None) -> int:
        correlation_id, frame = self._session.request(request, answer)
        try:
            self._socket.sendall(frame)
        except OSError as exc:
            raise ConnectionLost(f"send failed: {exc}") from None
        return correlation_id

    def call(self, request: m.Request) -> m.Response:
        """Send and wait (at most `timeout`) for the answer; raises the error it carries."""
        answer = Answer()
        correlation_id = self._send(request, answer)
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            self._read(deadline - time.monotonic())
            if answer.done():
                return answer.result()
        self._session.forget(correlation_id)
        raise ConnectionLost(f"no answer to {type(request).__name__} in {self._timeout}s")

    def poll(self, seconds: float) -> list[m.Push]:
        """Pushed frames that arrive within `seconds` (at least those already buffered)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self._pushes:
            self._read(deadline - time.monotonic())
        pushes, self._pushes = self._pushes, []
        return pushes

    def _pushed(self, consumer_id: int, push: m.Push) -> None:
        self._pushes.append(push)

    def _refused(self, error: HeadwaterError) -> None:
        self.refusals.append(error)

    def _read(self, seconds: float) -> None:
        self._socket.settimeout(max(0.001, seconds))
        try:
            data = self._socket.recv(1 << 20)
        except TimeoutError:
            return
        except OSError as exc:
            raise ConnectionLost(f"receive failed: {exc}") from None
        finally:
            self._socket.settimeout(self._timeout)
        if not data:
            raise ConnectionLost("closed by the server")
        fatal = self._session.receive(data)
        if fatal is not None:
            raise ConnectionLost(f"connection unusable: {fatal}")

    def close(self) -> None:
        self._socket.close()
