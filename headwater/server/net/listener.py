"""The accept loop: its own, so that running out of file descriptors is survived, not fatal.

uvloop's `create_server` closes the listening socket for good on an `accept` error such as EMFILE,
which locked every client out until a restart. Here an `accepting.Acceptor` accepts by hand, at
most `ACCEPT_BURST` per wake-up so a connection storm does not hog the loop:
- past `max_connections`, a new connection gets a TOO_MANY_CONNECTIONS error frame (correlation
  id 0) and is closed; so does one past the caps on connections waiting to authenticate
  (`admission`, with authentication on), which keep the rest of `max_connections` for
  authenticated ones;
- on EMFILE/ENFILE one spare descriptor, held for this, is released to accept the waiting
  connection and refuse it the same way (so it is not left hanging in the backlog), then taken
  again; if even that fails, accepting pauses for `RETRY_DELAY` and resumes by itself.

The listener also runs the periodic sweep that applies the idle and incomplete-frame timeouts to
every connection, flushes the protocol-error log summary and reloads a changed TLS certificate.
With TLS (`Shared.tls`) an accepted socket is wrapped before its `Connection` sees a byte; a
failed TLS handshake (a client certificate from another CA, a plaintext client) closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, cast

import structlog

from headwater.server.config import ServerConfig
from headwater.server.net.accepting import Acceptor, ListenError, listen_on
from headwater.server.net.admission import Admission
from headwater.server.net.client_connection import Connection, Shared
from headwater.server.net.stage_trace import StageTrace
from headwater.server.reply import encoder_thread
from headwater.server.requests.broker import Broker
from headwater.storage.tasks import spawn
from headwater.wire.errors import HeadwaterError, TooManyConnections
from headwater.wire.protocol import encode_error

log = structlog.get_logger(__name__)

ACCEPT_BURST: Final = 64
RETRY_DELAY: Final = 0.1
BACKLOG: Final = 1024
# A refused connection is kept this long to read and discard what it sent, so that closing it
# does not reset the connection before the client has read its error frame.
REFUSAL_LINGER: Final = 1.0
MAX_LINGERING: Final = 256


class StartupError(Exception):
    """The server cannot start (port taken, data directory locked...): one line, no traceback."""


class _Refused(asyncio.Protocol):
    """Writes one error frame, half-closes, and discards input until EOF or `REFUSAL_LINGER`."""

    def __init__(self, frame: bytes, lingering: set[_Refused]) -> None:
        self._frame = frame
        self._lingering = lingering

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._lingering.add(self)
        transport.write(self._frame)
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(REFUSAL_LINGER, transport.abort)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lingering.discard(self)


class Listener:
    """`bind` first (a taken port fails start-up before anything else is opened), then `start`."""

    def __init__(self, config: ServerConfig) -> None:
        self._broker: Broker | None = None
        self._config = config
        self._loop = asyncio.get_running_loop()
        # One thread: a flood of compression bombs costs one core and one cap of memory at most.
        self._inflater = ThreadPoolExecutor(1, thread_name_prefix="headwater-inflate")
        self._encoder = encoder_thread()
        self.shared = Shared(
            inflater=self._inflater,
            encoder=self._encoder,
            trace=StageTrace(config.trace_every) if config.trace_every else None,
        )
        self._acceptor: Acceptor | None = None
        self._admitting = 0
        self._lingering: set[_Refused] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._spare: int | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._sweep_every = max(0.05, min(1.0, config.idle_timeout / 4, config.frame_timeout / 4))
        self._last_out_of_fds_log = -1e9

    @property
    def connections(self) -> set[Connection]:
        return self.shared.connections

    @property
    def broker(self) -> Broker | None:
        return self._broker

    def bind(self) -> int:
        """Bind and listen on every address of `config.host`; returns the bound port."""
        try:
            sockets = listen_on(self._config.host, self._config.port, BACKLOG)
        except ListenError as exc:
            self.close()
            raise StartupError(str(exc)) from None
        self._acceptor = Acceptor(
            sockets,
            self._admit,
            burst=ACCEPT_BURST,
            retry_delay=RETRY_DELAY,
            out_of_fds=self._out_of_fds,
            resumed=self._resumed,
        )
        bound: int = sockets[0].getsockname()[1]
        return bound

    def start(self, broker: Broker) -> None:
        """Accept connections for `broker`."""
        self._broker = broker
        if self.shared.security is not None:
            security = self._config.security
            total = security.max_unauthenticated_connections or max(
                1, self._config.max_connections // 4
            )
            self.shared.admission = Admission(total, security.max_unauthenticated_per_address)
        self._spare = _open_spare()
        self.shared.loop_lag.start()
        assert self._acceptor is not None, "bind first"
        self._acceptor.start()
        self._sweeper = self._loop.call_later(self._sweep_every, self._sweep)

    def close(self) -> None:
        """Stop accepting (existing connections stay until `shutdown_connections`)."""
        self.shared.loop_lag.close()
        if self._acceptor is not None:
            self._acceptor.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
        self._inflater.shutdown(wait=False, cancel_futures=True)
        self._encoder.shutdown(wait=False, cancel_futures=True)

    def shutdown_connections(self) -> None:
        for connection in list(self.connections):
            connection.shutdown()

    # Accepting

    def _admit(self, sock: socket.socket) -> None:
        cap = self._config.max_connections
        if len(self.connections) + self._admitting >= cap:
            self._refuse(sock, TooManyConnections(f"the server is at its {cap}-connection limit"))
            return
        address = None
        admission = self.shared.admission
        if admission is not None:
            address = _peer(sock).rpartition(":")[0]
            refusal = admission.admit(address)
            if refusal is not None:
                self._refuse(sock, refusal)
                return
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._admitting += 1
        spawn(self._connect(sock, address), "conn.setup_failed", self._tasks)

    async def _connect(self, sock: socket.socket, address: str | None) -> None:
        """`address`: counted by `Admission` (the connection releases it when it authenticates or
        closes; here, if it never opens)."""
        broker = self._broker
        assert broker is not None
        tls = self.shared.tls
        peer = _peer(sock)  # now: once the handshake failed, the socket may be closed
        made: list[Connection] = []

        def connection() -> Connection:
            made.append(Connection(broker, self._config, self.shared, address))
            return made[0]

        try:
            await self._loop.connect_accepted_socket(
                connection,
                sock,
                ssl=None if tls is None else tls.context,
                ssl_handshake_timeout=None if tls is None else self._config.frame_timeout,
            )
        except OSError as exc:  # the client left (or fds ran out, or TLS failed) meanwhile
            if tls is not None:
                self.shared.protocol_errors.note(
                    self._loop.time(), peer, True, "conn.tls_failed", error=str(exc)
                )
            log.debug("conn.setup_failed", error=str(exc))
            sock.close()
            admission = self.shared.admission
            if address is not None and admission is not None and not (made and made[0].opened):
                admission.release(address)
        finally:
            self._admitting -= 1

    def _refuse(self, sock: socket.socket, error: HeadwaterError) -> None:
        frame = encode_error(0, 0, 0, error)
        self.shared.protocol_errors.note(
            self._loop.time(), _peer(sock), True, "conn.refused", code=error.code.name
        )
        if len(self._lingering) >= MAX_LINGERING:
            _send_and_close(sock, frame)
            return
        spawn(self._linger(sock, frame), "conn.refusal_failed", self._tasks)

    async def _linger(self, sock: socket.socket, frame: bytes) -> None:
        try:
            await self._loop.connect_accepted_socket(lambda: _Refused(frame, self._lingering), sock)
        except OSError:
            sock.close()

    def _out_of_fds(self, listening: socket.socket, exc: OSError) -> bool:
        now = self._loop.time()
        if now - self._last_out_of_fds_log > 10.0:
            self._last_out_of_fds_log = now
            log.warning(
                "server.out_of_fds",
                error=exc.strerror,
                connections=len(self.connections),
                hint="raise the open-files limit (ulimit -n) or lower max_connections",
            )
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
            try:
                sock, _address = listening.accept()
            except OSError:
                pass
            else:
                _send_and_close(
                    sock,
                    encode_error(
                        0, 0, 0, TooManyConnections("the server is out of file descriptors")
                    ),
                )
            self._spare = _open_spare()
        # with a spare again, the next waiting client is refused the same way; without one,
        # accept would fail again at once: the acceptor pauses
        return self._spare is not None

    def _resumed(self) -> None:
        if self._spare is None:
            self._spare = _open_spare()

    # Timeouts

    def _sweep(self) -> None:
        now = self._loop.time()
        for connection in list(self.connections):
            connection.check_timeouts(now)
        self.shared.protocol_errors.tick(now)
        if self.shared.tls is not None:
            self.shared.tls.maybe_reload()
        self._sweeper = self._loop.call_later(self._sweep_every, self._sweep)


def _open_spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return None


def _send_and_close(sock: socket.socket, frame: bytes) -> None:
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.send(frame)
        sock.shutdown(socket.SHUT_WR)
    sock.close()


def _peer(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"
