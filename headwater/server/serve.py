"""The composition root: build the configuration's parts, listen, run until a signal, shut down.

`serve` is a coroutine so tests and embedders can run it on their own loop; `run` is the blocking
entry point behind `headwater serve`, on uvloop when it is installed. SIGINT and SIGTERM stop the
listener, tell attached consumers SERVER_SHUTTING_DOWN, close the connections, seal and fsync
every WAL, upload what is pending (within `shutdown_timeout`) and close RocksDB cleanly.

Start-up failures (port in use, data directory locked by another server, unreadable storage,
an unreadable tokens file or TLS certificate, a non-loopback address without authentication)
raise `StartupError` with one line for the user; `headwater serve` prints it and exits 1.
SIGHUP re-reads the tokens file and the TLS certificate (both are also reloaded when they change).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import ssl
from collections.abc import Callable
from pathlib import Path

import structlog

from headwater.server import open_files
from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.config import ServerConfig
from headwater.server.kafka.kafka_listener import KafkaListener, KafkaStartupError
from headwater.server.logs import configure_logging
from headwater.server.net.listener import Listener, StartupError
from headwater.server.ops.operator_port import start_operator_port
from headwater.server.requests.broker import Broker
from headwater.server.requests.group_offsets import GroupOffsets
from headwater.server.requests.partition_ownership import BrokerAddress
from headwater.server.requests.placement import Placement, SingleBrokerPlacement
from headwater.server.security.access import Security
from headwater.server.security.tls import ServerTls, TlsError, is_loopback
from headwater.server.security.tokens import TokenFileError
from headwater.storage.archive import ObjectArchive
from headwater.storage.objectstore import LocalObjectStore, ObjectStore, S3ObjectStore
from headwater.storage.state import StateStore
from headwater.storage.uploader import Uploader
from headwater.wire.errors import HeadwaterError

__all__ = ["StartupError", "run", "serve"]

log = structlog.get_logger(__name__)


async def open_object_store(config: ServerConfig) -> ObjectStore | None:
    settings = config.object_store
    if settings.backend == "none":
        return None
    if settings.backend == "local":
        store = LocalObjectStore(settings.path or config.data_dir / "objects", settings.link)
        try:
            # once, at start-up: asyncio's default executor
            removed = await asyncio.to_thread(store.remove_abandoned, settings.abandoned_after_s)
        except OSError as exc:  # housekeeping: the store works with the files left in it
            log.warning("object_store.sweep_failed", root=str(store.root), error=str(exc))
        else:
            if removed:
                log.info("object_store.abandoned_removed", root=str(store.root), files=removed)
        return store
    if settings.backend == "s3":
        return await S3ObjectStore(
            settings.bucket, settings.prefix, settings.endpoint_url, settings.region
        ).open()
    raise ValueError(f"unknown object store backend {settings.backend!r} (local, s3 or none)")


async def serve(
    config: ServerConfig,
    stop: asyncio.Event | None = None,
    listening: Callable[[Listener], None] | None = None,
) -> None:
    """Run until `stop` is set (or SIGINT/SIGTERM); `StartupError` if the server cannot start.
    `listening` is called with the native port's listener once it serves (tests and embedders
    reach the broker and the connections through it)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, stop.set)
    open_files_limit = _raise_fd_limit(config)
    try:
        config.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StartupError(
            f"cannot create data directory {config.data_dir}: {exc.strerror}"
        ) from None
    listener = Listener(config)
    listener.shared.security, listener.shared.tls = _security(config)
    if listener.shared.security is not None or listener.shared.tls is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError, AttributeError):
            loop.add_signal_handler(signal.SIGHUP, _reload, listener)
    async with contextlib.AsyncExitStack() as stack:
        # the port first: a taken port is the likeliest start-up error, and costs nothing to check
        port = listener.bind()
        stack.callback(listener.close)
        kafka = None
        if config.kafka.port is not None:  # the Kafka protocol on a port of its own
            kafka = KafkaListener(config)
            try:
                kafka.bind()
            except KafkaStartupError as exc:
                raise StartupError(str(exc)) from None
            stack.callback(kafka.close)
        operator = await start_operator_port(config, listener, stack)  # metrics, health, status
        state = _open_state(config.data_dir / "state")
        stack.callback(state.close)
        try:
            store = await open_object_store(config)
        except (OSError, HeadwaterError, ValueError) as exc:
            raise StartupError(f"cannot open the object store: {exc}") from None
        # the deployment this broker serves in, built before the parts it decides for
        placement: Placement = SingleBrokerPlacement(BrokerAddress("local", config.host, port))
        cluster = None
        if config.cluster.etcd:
            if store is None:
                raise StartupError("a cluster needs a shared object store")
            from headwater.server.cluster.cluster_mode import (
                ClusterMode,  # grpc only when clustered
            )

            kafka_address = None
            if kafka is not None:  # registered with the broker: every broker's Metadata names it
                advertise = config.cluster.advertise.rpartition(":")[0] or None
                kafka_address = kafka.advertised(advertise)
            tls = listener.shared.tls
            peer_tls = None if tls is None else _peer_tls(config)
            cluster = ClusterMode(config, store, port, kafka_address, peer_tls)
            placement = cluster
        uploader = archive = None
        if store is not None:
            stack.push_async_callback(store.close)
            uploader = Uploader(
                store,
                state,
                config.object_store.retry_initial_ms / 1000,
                config.object_store.retry_max_ms / 1000,
                cluster,
            )
            uploader.start()
            archive = ObjectArchive(store, uploader, config.object_store.walk_limit)
        catalog = TopicCatalog(config, state, uploader, archive, placement)
        stack.push_async_callback(catalog.writer.close)  # after the catalog's own close
        try:
            await catalog.open()
        except (OSError, HeadwaterError) as exc:
            with contextlib.suppress(Exception):  # best effort: what did open is closed
                await catalog.close()
            raise StartupError(f"cannot open the topics in {config.data_dir}: {exc}") from None
        stack.push_async_callback(catalog.close)
        if cluster is not None:
            cluster.bind(catalog)
        broker = Broker(
            config,
            catalog,
            lambda: len(listener.connections),
            placement,
            GroupOffsets(catalog, None if cluster is None else cluster.group_cursors),
        )
        if cluster is not None:
            try:
                await cluster.start()
            except (OSError, HeadwaterError, ConnectionError, TimeoutError) as exc:
                raise StartupError(
                    f"cannot join the cluster at {config.cluster.etcd}: {exc}"
                ) from None
            # hands partitions off before the catalog closes
            stack.push_async_callback(cluster.stop)
            if operator is not None and operator.registry is not None:
                from headwater.server.cluster.cluster_metrics import ClusterCollector

                operator.registry.register(ClusterCollector(cluster.status))
        await broker.transactions.start()  # (ends a stop interrupted, before any request)
        stack.push_async_callback(broker.transactions.close)
        listener.start(broker)
        if kafka is not None:
            shared = listener.shared
            kafka.start(
                broker,
                shared.security,
                shared.tls,
                shared.admission,
                None if cluster is None else cluster.coordinator,
            )
            if config.kafka.port_file is not None:
                _write_port(config.kafka.port_file, kafka.port)
            if operator is not None:
                if operator.registry is not None:
                    operator.registry.register(kafka.collector())
                operator.kafka_groups = kafka.groups_status  # the status page's groups
        if listener.shared.security is not None:
            kafka_connections = kafka.connections if kafka is not None else set()
            listener.shared.security.start(
                lambda: (*listener.connections, *kafka_connections),
                lambda name: name in catalog.topics and catalog.topics[name].reliable,
            )
            stack.callback(listener.shared.security.close)
        if operator is not None:
            operator.recovered(catalog)
        # What start-up built (the modules, the recovered catalog) lives as long as the server. A
        # full collection walked all of it again, 20-30 ms with the loop held (a stall report of
        # the 100k msgs/s latency row, docs/BENCHMARKS.md): frozen, later collections walk only
        # what serving made.
        gc.collect()
        gc.freeze()
        if config.port_file is not None:
            _write_port(config.port_file, port)
        if listening is not None:
            listening(listener)
        log.info(
            "server.listening",
            host=config.host,
            port=port,
            data_dir=str(config.data_dir),
            topics=len(catalog.topics),
            object_store=config.object_store.backend,
            auth="tokens" if listener.shared.security is not None else "off",
            tls=listener.shared.tls is not None,
        )
        _log_open_files(config, open_files_limit)
        try:
            await stop.wait()
        finally:
            log.info("server.stopping", connections=len(listener.connections))
            if operator is not None:
                operator.stopping = True
            listener.close()
            if kafka is not None:
                kafka.close()
            # Consumers hear SERVER_SHUTTING_DOWN before their connection closes.
            listener.shutdown_connections()
            await _wait_closed(listener, config.shutdown_timeout)
    log.info("server.stopped")


def _write_port(path: Path, port: int) -> None:
    """Atomically: a reader polling for the file never sees it half written."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(f"{port}\n")
    os.replace(temporary, path)


def _security(config: ServerConfig) -> tuple[Security | None, ServerTls | None]:
    """The authentication and TLS parts, or `StartupError` (an exposed server without auth)."""
    settings = config.security
    if settings.auth_tokens is None and not settings.insecure and not is_loopback(config.host):
        raise StartupError(
            f"refusing to listen on {config.host or '*'} without authentication: give "
            "--auth-tokens FILE, or --insecure to let anyone who can reach it do anything"
        )
    tls = None
    if settings.tls_cert is not None and settings.tls_key is not None:
        try:
            tls = ServerTls(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
        except TlsError as exc:
            raise StartupError(str(exc)) from None
    if settings.auth_tokens is None:
        return None, tls
    try:
        return Security(settings, config.data_dir), tls
    except TokenFileError as exc:
        raise StartupError(str(exc)) from None


def _peer_tls(config: ServerConfig) -> ssl.SSLContext:
    """How a broker whose port is TLS reaches the others' (peer links, dead letters): their
    certificates checked against the system's roots and `security.tls_client_ca`, when given."""
    context = ssl.create_default_context()
    if config.security.tls_client_ca is not None:
        context.load_verify_locations(config.security.tls_client_ca)
    return context


def _reload(listener: Listener) -> None:
    log.info("server.sighup", hint="reloading the tokens file and the TLS certificate")
    if listener.shared.security is not None:
        listener.shared.security.reload(force=True)
    if listener.shared.tls is not None:
        listener.shared.tls.maybe_reload(force=True)


def _open_state(path: Path) -> StateStore:
    try:
        return StateStore(path)
    except Exception as exc:  # rocksdict raises plain Exception, with RocksDB's message
        if "lock" in str(exc).lower():
            raise StartupError(
                f"data directory {path.parent} is in use by another server "
                f"(cannot lock {path / 'LOCK'})"
            ) from None
        raise StartupError(f"cannot open the state store {path}: {exc}") from None


def _raise_fd_limit(config: ServerConfig) -> int:
    """Raise the soft open-files limit to the hard one (every connection and every reliable
    partition costs descriptors); the limit now. What it allows is logged once the server
    listens (`_log_open_files`): a start-up that fails says one line, its error."""
    limit = open_files.raise_limit()
    if limit != open_files.UNLIMITED and config.max_connections + open_files.RESERVED > limit:
        log.warning(
            "server.fd_limit_low",
            open_files=limit,
            max_connections=config.max_connections,
            hint="connections past the open-files limit are refused TOO_MANY_CONNECTIONS",
        )
    return limit


def _log_open_files(config: ServerConfig, limit: int) -> None:
    log.info(
        "server.open_files",
        open_files=limit,
        partitions=open_files.partitions_allowed(limit, config.max_connections),
        max_connections=config.max_connections,
        descriptors_per_partition=open_files.DESCRIPTORS_PER_PARTITION,
    )


async def _wait_closed(listener: Listener, timeout: float) -> None:
    """Wait (bounded) for the connections to flush their last frames and close."""
    deadline = asyncio.get_running_loop().time() + timeout
    while listener.connections and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)


def run(config: ServerConfig) -> None:
    """`headwater serve`: raises `StartupError` (one line for the user) if it cannot start."""
    configure_logging(config.log_format, config.log_level)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every platform we ship
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))
