"""An HTTP proxy on 127.0.0.1 in front of moto's S3 server that counts the requests going through
it by method: what a cluster's brokers ask of the object store, counted outside them.

It forwards bytes both ways unchanged. Client-to-server, it reads each request's head (up to the
blank line), counts its method, forwards the head, then forwards exactly the body the head
announces (`Content-Length`, or `Transfer-Encoding: chunked` up to the last chunk and its
trailers) as it arrives, so a keep-alive connection's next request is found where it starts.
Responses (including `100 Continue`) are piped as they come.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

_MAX_HEAD = 64 * 1024  # a request head longer than this is not S3's: the connection is cut
_MAX_CHUNKS = 1_000_000  # bounds a chunked body's loop


class PutCounter:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.requests: Counter[str] = Counter()  # method -> requests forwarded
        self.put_keys: list[str] = []  # the path of every PUT, in order
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def puts(self) -> int:
        return self.requests["PUT"]

    async def start(self) -> PutCounter:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port
            )
        except OSError:
            writer.close()
            return
        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(self._requests(reader, upstream_writer)),
            loop.create_task(self._pipe(upstream_reader, writer)),
        ]
        self._tasks.update(tasks)
        try:
            # either side closing ends the connection: the other pipe is cancelled
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
                self._tasks.discard(task)
            for end in (writer, upstream_writer):
                end.close()

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ValueError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if len(head) > _MAX_HEAD:
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    name.strip().lower(): value.strip()
                    for name, _, value in (line.partition(":") for line in lines[1:] if line)
                }
                self.requests[method] += 1
                if method == "PUT":
                    self.put_keys.append(path)
                writer.write(head)
                if headers.get("transfer-encoding", "").lower() == "chunked":
                    await self._chunked(reader, writer)
                else:
                    await self._copy(reader, writer, int(headers.get("content-length", "0")))
                await writer.drain()

    @staticmethod
    async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, size: int) -> None:
        while size > 0:
            data = await reader.read(min(size, 1 << 16))
            if not data:
                raise ConnectionError("body cut")
            writer.write(data)
            size -= len(data)
            await writer.drain()

    async def _chunked(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(_MAX_CHUNKS):
            line = await reader.readuntil(b"\r\n")
            writer.write(line)
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                for _ in range(_MAX_CHUNKS):  # trailers, up to the blank line
                    trailer = await reader.readuntil(b"\r\n")
                    writer.write(trailer)
                    if trailer == b"\r\n":
                        return
                raise ValueError("too many trailers")
            await self._copy(reader, writer, size + 2)  # the chunk and its CRLF
        raise ValueError("too many chunks")

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
