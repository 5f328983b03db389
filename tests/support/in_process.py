"""A real server on this test's event loop: `serve` itself, on 127.0.0.1 and a port the OS picks,
reached over TCP, with its listener at hand so a test can read the server's own counters (bytes
read, requests waiting, the memory budget) and hold a topic's turn as a delete or a take-over
does. For tests that must see inside the server without a timing: a child process
(`headwater.testing.ServerProcess`) cannot be looked into.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.config import ServerConfig
from headwater.server.net.client_connection import Connection
from headwater.server.net.listener import Listener
from headwater.server.requests.broker import Broker
from headwater.server.serve import serve


@dataclass
class InProcessServer:
    listener: Listener
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def broker(self) -> Broker:
        broker = self.listener.broker
        assert broker is not None
        return broker

    @property
    def catalog(self) -> TopicCatalog:
        return self.broker.catalog

    def connection(self, peer: str) -> Connection:
        """The server's side of the client connection whose local address is `peer`."""
        return next(c for c in self.listener.connections if c.peer == peer)


@contextlib.asynccontextmanager
async def in_process_server(config: ServerConfig) -> AsyncIterator[InProcessServer]:
    """`config` with port 0 and a port file beside its data directory; stopped on exit."""
    port_file = config.data_dir.parent / f"{config.data_dir.name}.port"
    config = replace(config, host="127.0.0.1", port=0, port_file=port_file)
    stop = asyncio.Event()
    started: asyncio.Future[Listener] = asyncio.get_running_loop().create_future()
    running = asyncio.create_task(serve(config, stop, started.set_result))
    try:
        await asyncio.wait([started, running], return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            running.result()  # the start-up error
        yield InProcessServer(started.result(), int(port_file.read_text()))
    finally:
        stop.set()
        await running
