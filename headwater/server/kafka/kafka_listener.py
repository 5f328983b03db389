"""The Kafka listener: its own port (`[kafka] port`, `--kafka-port`), the same broker, the same
security: with authentication on, clients authenticate with SASL PLAIN (the password a Headwater
token) and every request is checked against the principal's grants as on the native port; with
TLS on, the Kafka port takes TLS with the native port's certificate (the same `ServerTls`, so a
reloaded certificate serves both).

Sockets are accepted by the native port's `net.accepting.Acceptor` (running out of file
descriptors pauses accepting, never ends it), at most `max_connections` Kafka connections at once
(a connection past it is closed at once: Kafka has no frame to refuse with). A periodic sweep
closes connections idle for `idle_timeout` or stuck inside a frame for `frame_timeout`.
Compressed produce batches are inflated on a thread of the listener's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Final

import structlog

from headwater.server.config import ServerConfig
from headwater.server.kafka.handlers import KafkaHandlers
from headwater.server.kafka.kafka_connection import KafkaConnection
from headwater.server.kafka.kafka_metrics import KafkaCollector, KafkaStats
from headwater.server.net.accepting import Acceptor, ListenError, listen_on
from headwater.server.requests.broker import Broker
from headwater.server.security.access import Security
from headwater.server.security.tls import ServerTls

log = structlog.get_logger("headwater.server")

BACKLOG: Final = 1024


class KafkaStartupError(Exception):
    """The Kafka port cannot be opened (taken, unresolvable), or asked for where it cannot
    serve yet: one line for the operator."""


class KafkaListener:
    """`bind` first, then `start` with the broker; `close` stops accepting and closes the
    connections."""

    def __init__(self, config: ServerConfig) -> None:
        self._config = config
        self._loop = asyncio.get_running_loop()
        self._acceptor: Acceptor | None = None
        self._inflater = ThreadPoolExecutor(1, thread_name_prefix="headwater-kafka-inflate")
        self._handlers: KafkaHandlers | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections: set[KafkaConnection] = set()
        self.stats = KafkaStats()
        self.port = 0
        self._security: Security | None = None
        self._tls: ServerTls | None = None

    def bind(self) -> int:
        config = self._config
        assert config.kafka.port is not None
        if config.cluster.etcd:
            raise KafkaStartupError(
                "the Kafka listener serves one broker, not a cluster yet (docs/KAFKA.md)"
            )
        try:
            sockets = listen_on(config.host, config.kafka.port, BACKLOG, " for Kafka")
        except ListenError as exc:
            raise KafkaStartupError(str(exc)) from None
        self._acceptor = Acceptor(sockets, self._admit, burst=64, retry_delay=0.1)
        self.port = int(sockets[0].getsockname()[1])
        return self.port

    def start(
        self, broker: Broker, security: Security | None = None, tls: ServerTls | None = None
    ) -> None:
        config = self._config
        host = config.kafka.advertise_host or config.host
        if host in ("", "0.0.0.0", "::"):  # a wildcard is nowhere a client can connect to
            host = socket.gethostname()
        self._security = security
        self._tls = tls
        self._handlers = KafkaHandlers(
            broker, host, self.port, self._inflater, config.max_decompressed_batch, security
        )
        assert self._acceptor is not None, "bind first"
        self._acceptor.start()
        self._sweeper = self._loop.call_later(self._every(), self._sweep)
        log.info("kafka.listening", host=config.host, port=self.port, advertised=host)

    def collector(self) -> KafkaCollector:
        """The listener's Prometheus collector (after `start`)."""
        assert self._handlers is not None, "start first"
        coordinator = self._handlers.groups.coordinator
        return KafkaCollector(self.stats, lambda: len(self.connections), coordinator)

    def close(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
            self._acceptor = None
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for connection in list(self.connections):
            connection.close()
        self._inflater.shutdown(wait=False, cancel_futures=True)

    def _every(self) -> float:
        config = self._config
        return max(0.05, min(1.0, config.idle_timeout / 4, config.frame_timeout / 4))

    def _admit(self, sock: socket.socket) -> None:
        if len(self.connections) >= self._config.max_connections or self._handlers is None:
            sock.close()
            return
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = self._loop.create_task(self._connect(sock, self._handlers))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, sock: socket.socket, handlers: KafkaHandlers) -> None:
        tls = self._tls
        try:
            await self._loop.connect_accepted_socket(
                lambda: KafkaConnection(
                    handlers, self._config, self.connections, self._security, self.stats
                ),
                sock,
                ssl=None if tls is None else tls.context,
                ssl_handshake_timeout=None if tls is None else self._config.frame_timeout,
            )
        except OSError as exc:
            log.debug("kafka.conn_setup_failed", error=str(exc))
            sock.close()

    def _sweep(self) -> None:
        now = self._loop.time()
        config = self._config
        for connection in list(self.connections):
            connection.check_timeouts(now, config.idle_timeout, config.frame_timeout)
        if self._handlers is not None:
            self._handlers.groups.coordinator.sweep()
        self._sweeper = self._loop.call_later(self._every(), self._sweep)
