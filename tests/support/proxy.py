"""A fault-injecting TCP proxy on 127.0.0.1 for tests: it forwards bytes between a client and the
server and, when told, cuts connections at random (dropping the chunk it was forwarding, so a
request or a response is lost), delays every chunk (`delay` seconds), or stops forwarding
altogether or in one direction only (`pause`, `pause("request")`: a one-way blackhole)."""

from __future__ import annotations

import asyncio
import contextlib
import random


class FaultyProxy:
    def __init__(self, target_port: int, seed: int = 1) -> None:
        self.target_port = target_port
        self.rng = random.Random(seed)
        self.drop_requests = 0.0  # chance a client->server chunk is dropped with its connection
        self.drop_responses = 0.0  # chance a server->client chunk is dropped with its connection
        self.delay = 0.0  # seconds each chunk waits before it is forwarded
        self.cuts = 0
        self.connections = 0  # accepted so far (a client's reconnect shows here)
        self._flowing = {"request": asyncio.Event(), "response": asyncio.Event()}
        for flowing in self._flowing.values():
            flowing.set()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> FaultyProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def pause(self, direction: str | None = None) -> None:
        """Stop forwarding ("request": client to server only, "response": back only; None:
        both) until `resume`; connections stay open, bytes wait."""
        for name, flowing in self._flowing.items():
            if direction in (None, name):
                flowing.clear()

    def resume(self) -> None:
        for flowing in self._flowing.values():
            flowing.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port
            )
        except OSError:
            writer.close()
            return
        self._writers |= {writer, upstream_writer}
        await asyncio.gather(
            self._pipe(reader, upstream_writer, writer, "request"),
            self._pipe(upstream_reader, writer, upstream_writer, "response"),
            return_exceptions=True,
        )

    async def _pipe(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        other: asyncio.StreamWriter,
        direction: str,
    ) -> None:
        try:
            while True:
                data = await source.read(65536)
                if not data:
                    break
                await self._flowing[direction].wait()
                if self.delay:
                    await asyncio.sleep(self.delay)
                chance = self.drop_requests if direction == "request" else self.drop_responses
                if chance and self.rng.random() < chance:
                    self.cuts += 1
                    break
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            for writer in (sink, other):
                writer.close()
                self._writers.discard(writer)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
