"""Listening sockets accepted by hand, shared by the message port and the operator's HTTP port.

uvloop's `create_server` closes the listening socket for good on an `accept` error such as EMFILE,
which locked every client out until a restart. An `Acceptor` instead watches its sockets with
`add_reader` and accepts at most `burst` connections per wake-up (a connection storm does not hog
the loop). Out of descriptors, it asks its owner first (the message port releases a spare
descriptor to refuse the waiting client properly); if the owner cannot help, accepting pauses for
`retry_delay` and resumes by itself. Other accept errors (ECONNABORTED and the like) concern one
client that is already gone and are skipped.

`listen_on` binds every address a host name resolves to, all on one port (the first address's
when the port asked for is 0), as non-blocking sockets.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable
from typing import Final

OUT_OF_FDS: Final = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class ListenError(Exception):
    """A listen address cannot be resolved or bound: one line for the operator."""


def listen_on(host: str, port: int, backlog: int, what: str = "") -> list[socket.socket]:
    """Non-blocking listening sockets on every address of `host`; `what` names the port in
    errors ("cannot listen{what} on HOST:PORT: reason")."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenError(f"cannot resolve listen address {host!r}: {exc.strerror}") from None
    sockets: list[socket.socket] = []
    for family, kind, proto, _name, address in infos:
        if sockets and port == 0:  # further addresses get the port the first one got
            address = (address[0], sockets[0].getsockname()[1], *address[2:])
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            for bound in sockets:
                bound.close()
            where = f"{host or '*'}:{address[1]!s}"
            raise ListenError(f"cannot listen{what} on {where}: {exc.strerror or exc}") from None
        sockets.append(sock)
    return sockets


class Acceptor:
    """Accepts on `sockets` and hands each new socket to `admit`.

    `out_of_fds(listening, error)` returns True when it dealt with the waiting client and
    accepting may go on, False to pause for `retry_delay`; `resumed()` runs before accepting
    resumes after a pause."""

    def __init__(
        self,
        sockets: list[socket.socket],
        admit: Callable[[socket.socket], None],
        *,
        burst: int,
        retry_delay: float,
        out_of_fds: Callable[[socket.socket, OSError], bool] = lambda _sock, _error: False,
        resumed: Callable[[], None] = lambda: None,
    ) -> None:
        self.sockets = sockets
        self._admit = admit
        self._burst = burst
        self._retry_delay = retry_delay
        self._out_of_fds = out_of_fds
        self._resumed = resumed
        self._loop = asyncio.get_running_loop()
        self._watching: set[socket.socket] = set()

    def start(self) -> None:
        for sock in self.sockets:
            self._watch(sock)

    def close(self) -> None:
        """Stop accepting and close the listening sockets."""
        for sock in self.sockets:
            self._unwatch(sock)
            sock.close()
        self.sockets = []

    def _watch(self, sock: socket.socket) -> None:
        if sock not in self._watching and sock.fileno() >= 0:
            self._watching.add(sock)
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _unwatch(self, sock: socket.socket) -> None:
        if sock in self._watching:
            self._watching.discard(sock)
            self._loop.remove_reader(sock.fileno())

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(self._burst):
            try:
                sock, _address = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno not in OUT_OF_FDS:
                    continue  # ECONNABORTED and the like: that client is gone
                if not self._out_of_fds(listening, exc):
                    # accept would fail again at once: wait for descriptors to free up
                    self._unwatch(listening)
                    self._loop.call_later(self._retry_delay, self._resume, listening)
                return
            self._admit(sock)

    def _resume(self, listening: socket.socket) -> None:
        if listening in self.sockets:
            self._resumed()
            self._watch(listening)
