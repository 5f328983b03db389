"""The composition root: build the configuration's parts, listen, run until a signal, shut down.

`serve` is a coroutine so tests and embedders can run it on their own loop; `run` is the blocking
entry point behind `headwater serve`, on uvloop when it is installed. SIGINT and SIGTERM stop the
listener, close the connections (their write buffers get `shutdown_timeout` seconds to drain) and
close RocksDB cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import structlog

from server.broker import Broker
from server.config import ServerConfig
from server.connection import Connection
from server.logs import configure_logging
from storage.metadata import MetadataStore

log = structlog.get_logger("headwater.server")


async def serve(config: ServerConfig, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, stop.set)

    config.data_dir.mkdir(parents=True, exist_ok=True)
    broker = Broker(config, MetadataStore(config.data_dir / "state"))
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
        topics=len(broker.topics),
    )
    try:
        await stop.wait()
    finally:
        log.info("server.stopping", connections=len(connections))
        server.close()
        for connection in list(connections):
            connection.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(server.wait_closed(), config.shutdown_timeout)
        broker.close()
        log.info("server.stopped")


def run(config: ServerConfig) -> None:
    configure_logging(config.log_format, config.log_level)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every platform we ship
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))
