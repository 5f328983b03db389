"""The Kafka listener: its own port (`[kafka] port`, `--kafka-port`), the same broker, the same
security: with authentication on, clients authenticate with SASL PLAIN (the password a Headwater
token) and every request is checked against the principal's grants as on the native port; with
TLS on, the Kafka port takes TLS with the native port's certificate (the same `ServerTls`, so a
reloaded certificate serves both).

Sockets are accepted by the native port's `net.accepting.Acceptor` (running out of file
descriptors pauses accepting, never ends it), at most `max_connections` Kafka connections at once
(a connection past it is closed at once: Kafka has no frame to refuse with). With authentication
on, the native port's `net.admission.Admission` is asked too, at accept and before anything is
read: connections waiting to authenticate on either port count against the same
`max_unauthenticated_per_address` and `max_unauthenticated_connections`, so silent sockets cannot
hold every Kafka slot; one past a cap is closed at once (and counted, `refused`). A periodic sweep
closes connections idle for `idle_timeout` or stuck inside a frame for `frame_timeout`.
Compressed produce batches are inflated on a thread of the listener's own.

In a cluster (`start` with the coordinator as `peers`) the listener's address is registered in
etcd with the broker (`advertised`), Metadata and FindCoordinator answer from the cluster's view
(`kafka_nodes.ClusterNodes`) and the groups' offsets are the cluster's cursors (`cursors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import structlog

from headwater.server.config import ServerConfig
from headwater.server.kafka.handlers import KafkaHandlers
from headwater.server.kafka.kafka_connection import KafkaConnection
from headwater.server.kafka.kafka_metrics import KafkaCollector, KafkaStats
from headwater.server.kafka.kafka_nodes import ClusterNodes, Peers
from headwater.server.net.accepting import Acceptor, ListenError, listen_on
from headwater.server.net.admission import Admission
from headwater.server.requests.broker import Broker
from headwater.server.security.access import Security
from headwater.server.security.tls import ServerTls

log = structlog.get_logger(__name__)

BACKLOG: Final = 1024


class KafkaStartupError(Exception):
    """The Kafka port cannot be opened (taken, unresolvable): one line for the operator."""


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
        self._admission: Admission | None = None

    def bind(self) -> int:
        config = self._config
        assert config.kafka.port is not None
        try:
            sockets = listen_on(config.host, config.kafka.port, BACKLOG, " for Kafka")
        except ListenError as exc:
            raise KafkaStartupError(str(exc)) from None
        self._acceptor = Acceptor(sockets, self._admit, burst=64, retry_delay=0.1)
        self.port = int(sockets[0].getsockname()[1])
        return self.port

    def advertised(self, default_host: str | None = None) -> tuple[str, int]:
        """Where clients reach this listener (after `bind`): `[kafka] advertise_host`, else
        `default_host` (a cluster broker's advertised host), else the listen host."""
        config = self._config
        host = config.kafka.advertise_host or default_host or config.host
        if host in ("", "0.0.0.0", "::"):  # a wildcard is nowhere a client can connect to
            host = socket.gethostname()
        return host, self.port

    def start(
        self,
        broker: Broker,
        security: Security | None = None,
        tls: ServerTls | None = None,
        admission: Admission | None = None,
        peers: Peers | None = None,
    ) -> None:
        """`admission`: the native listener's (with `security`), shared so that the caps on
        connections waiting to authenticate hold across both ports. `peers`: a cluster's
        coordinator. The groups' offsets are the broker's (`Broker.group_offsets`)."""
        config = self._config
        host, _ = self.advertised(None if peers is None else peers.this_broker.host)
        self._security = security
        self._tls = tls
        self._admission = admission if security is not None else None
        self._handlers = KafkaHandlers(
            broker,
            host,
            self.port,
            self._inflater,
            config.max_decompressed_batch,
            security,
            config.topic_defaults,
            None if peers is None else ClusterNodes(peers),
            broker.group_offsets,
            config.kafka.auto_create_topics,
            config.kafka.auto_create_partitions,
            (config.kafka.consumer_session_timeout_ms, config.kafka.consumer_heartbeat_interval_ms),
        )
        assert self._acceptor is not None, "bind first"
        self._acceptor.start()
        self._sweeper = self._loop.call_later(self._every(), self._sweep)
        log.info("kafka.listening", host=config.host, port=self.port, advertised=host)

    def collector(self) -> KafkaCollector:
        """The listener's Prometheus collector (after `start`)."""
        assert self._handlers is not None, "start first"
        coordinator = self._handlers.groups.coordinator
        return KafkaCollector(
            self.stats,
            lambda: len(self.connections),
            coordinator,
            self._handlers.consumer_groups.groups,
            self._handlers.share,
        )

    def groups_status(self) -> list[dict[str, Any]]:
        """The Kafka groups coordinated here, for the status page: classic groups, Kafka 4's
        consumer groups (KIP-848) and share groups (KIP-932), each with its kind, state,
        members, epoch (a classic group's generation) and topics; empty before `start`."""
        handlers = self._handlers
        if handlers is None:
            return []
        found: list[dict[str, Any]] = []
        for name, classic in handlers.groups.coordinator.groups.items():
            found.append(
                _group_row(name, "classic", classic.state, len(classic.members), classic.generation)
            )
        for name, group in handlers.consumer_groups.groups.groups.items():
            state = "Stable" if group.members else "Empty"
            row = _group_row(name, "consumer", state, len(group.members), group.group_epoch)
            found.append(row | {"topics": sorted(group.metadata)})
        for name, share in handlers.share.groups.groups.items():
            topics = sorted({t for m in share.members.values() for t in m.topics})
            state = "Stable" if share.members else "Empty"
            found.append(
                _group_row(name, "share", state, len(share.members), share.epoch)
                | {"topics": topics}
            )
        return sorted(found, key=lambda row: (row["name"], row["kind"]))

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
            self._refuse(sock, "max_connections")
            return
        address = None
        if self._admission is not None:
            address = _address(sock)
            refusal = self._admission.admit(address)
            if refusal is not None:
                self._refuse(sock, refusal.message)
                return
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = self._loop.create_task(self._connect(sock, self._handlers, address))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refuse(self, sock: socket.socket, why: str) -> None:
        self.stats.refused += 1
        log.debug("kafka.conn_refused", error=why)
        sock.close()

    async def _connect(
        self, sock: socket.socket, handlers: KafkaHandlers, address: str | None
    ) -> None:
        """`address`: counted by the admission; the connection releases it when it
        authenticates or closes, and here if it never opens."""
        tls = self._tls
        made: list[KafkaConnection] = []

        def connection() -> KafkaConnection:
            made.append(
                KafkaConnection(
                    handlers,
                    self._config,
                    self.connections,
                    self._security,
                    self.stats,
                    self._admission if address is not None else None,
                    address,
                )
            )
            return made[0]

        try:
            await self._loop.connect_accepted_socket(
                connection,
                sock,
                ssl=None if tls is None else tls.context,
                ssl_handshake_timeout=None if tls is None else self._config.frame_timeout,
            )
        except OSError as exc:
            log.debug("kafka.conn_setup_failed", error=str(exc))
            sock.close()
            if made:
                made[0].leave_admission()
            elif address is not None and self._admission is not None:
                self._admission.release(address)

    def _sweep(self) -> None:
        now = self._loop.time()
        config = self._config
        for connection in list(self.connections):
            connection.check_timeouts(now, config.idle_timeout, config.frame_timeout)
        if self._handlers is not None:
            self._handlers.groups.coordinator.sweep()
            self._handlers.consumer_groups.groups.sweep()
        self._sweeper = self._loop.call_later(self._every(), self._sweep)


def _address(sock: socket.socket) -> str:
    """The peer's IP address (the admission counts by it), "?" once the peer is gone."""
    try:
        return str(sock.getpeername()[0])
    except OSError:
        return "?"


def _group_row(name: str, kind: str, state: str, members: int, epoch: int) -> dict[str, Any]:
    return {
        "name": name,
        "kind": kind,
        "state": state,
        "members": members,
        "epoch": epoch,
        "topics": [],
    }
