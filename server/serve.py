"""The composition root: build the configuration's parts, listen, run until a signal, shut down.

`serve` is a coroutine so tests and embedders can run it on their own loop; `run` is the blocking
entry point behind `headwater serve`, on uvloop when it is installed. SIGINT and SIGTERM stop the
listener, close the connections, seal and fsync every WAL, upload what is pending (within
`shutdown_timeout`) and close RocksDB cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import structlog

from server.broker import Broker
from server.catalog import TopicCatalog
from server.config import ServerConfig
from server.connection import Connection
from server.logs import configure_logging
from storage.archive import ObjectArchive
from storage.objectstore import LocalObjectStore, ObjectStore, S3ObjectStore
from storage.state import StateStore
from storage.uploader import Uploader

log = structlog.get_logger("headwater.server")


async def open_object_store(config: ServerConfig) -> ObjectStore | None:
    settings = config.object_store
    if settings.backend == "none":
        return None
    if settings.backend == "local":
        return LocalObjectStore(settings.path or config.data_dir / "objects")
    if settings.backend == "s3":
        return await S3ObjectStore(
            settings.bucket, settings.prefix, settings.endpoint_url, settings.region
        ).open()
    raise ValueError(f"unknown object store backend {settings.backend!r} (local, s3 or none)")


async def serve(config: ServerConfig, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, stop.set)

    config.data_dir.mkdir(parents=True, exist_ok=True)
    state = StateStore(config.data_dir / "state")
    store = await open_object_store(config)
    uploader = archive = None
    if store is not None:
        uploader = Uploader(
            store,
            state,
            config.object_store.retry_initial_ms / 1000,
            config.object_store.retry_max_ms / 1000,
        )
        uploader.start()
        archive = ObjectArchive(store, uploader)
    catalog = TopicCatalog(config, state, uploader, archive)
    await catalog.open()
    broker = Broker(config, catalog)
    connections: set[Connection] = set()
    server = await loop.create_server(
        lambda: Connection(broker, config, connections),
        config.host,
        config.port,
        reuse_address=True,
    )
    port = server.sockets[0].getsockname()[1]
    if config.port_file is not None:
        temporary = config.port_file.with_suffix(".tmp")
        temporary.write_text(f"{port}\n")
        os.replace(temporary, config.port_file)
    log.info(
        "server.listening",
        host=config.host,
        port=port,
        data_dir=str(config.data_dir),
        topics=len(catalog.topics),
        object_store=config.object_store.backend,
    )
    try:
        await stop.wait()
    finally:
        log.info("server.stopping", connections=len(connections))
        server.close()
        for connection in list(connections):
            connection.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), config.shutdown_timeout)
        await catalog.close()
        if store is not None:
            await store.close()
        state.close()
        log.info("server.stopped")


def run(config: ServerConfig) -> None:
    configure_logging(config.log_format, config.log_level)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every platform we ship
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))
