"""A raw protocol peer for tests: sends exact bytes, reads frames, with no client logic in between.

It lets tests speak the protocol as a third-party client author would, including sending what no
well-behaved client sends.
"""

from __future__ import annotations

import asyncio
import contextlib

from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError
from headwater.wire.frames import Frame, FrameDecoder
from headwater.wire.protocol import decode_push, decode_response, encode_request
from headwater.wire.records import read_records


class RawPeer:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._decoder = FrameDecoder()
        self._frames: list[Frame] = []
        self._correlation = 0

    @classmethod
    async def open(cls, address: str) -> RawPeer:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def request(self, request: m.Request, flags: int = 0) -> int:
        self._correlation += 1
        await self.send(encode_request(request, self._correlation, flags))
        return self._correlation

    async def frame(self, timeout: float = 5.0) -> Frame:
        while not self._frames:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise EOFError("server closed the connection")
            for event in self._decoder.feed(data):
                assert isinstance(event, Frame)
                self._frames.append(event)
        return self._frames.pop(0)

    async def response(self, timeout: float = 5.0) -> m.Response | HeadwaterError:
        """The next response (skipping pushes); an error response is returned, not raised."""
        while True:
            frame = await self.frame(timeout)
            if frame.header.is_push:
                continue
            try:
                return decode_response(frame.header, frame.body)
            except HeadwaterError as exc:
                return exc

    async def call(self, request: m.Request) -> m.Response | HeadwaterError:
        await self.request(request)
        return await self.response()

    async def deliveries(
        self, idle: float | None = None, records: int | None = None, timeout: float = 30.0
    ) -> list[tuple[int, m.Delivery]]:
        """With `records`: the deliveries that carry exactly that many records, each waited for
        up to `timeout` seconds (a hang bound). With `idle` (only where the count is unknown):
        every delivery that arrives until nothing has come for `idle` seconds."""
        received: list[tuple[int, m.Delivery]] = []
        count = 0
        while records is None or count < records:
            try:
                frame = await self.frame(timeout if idle is None else idle)
            except TimeoutError:
                if records is None:
                    return received
                raise AssertionError(
                    f"{count} of {records} records, then none for {timeout} s"
                ) from None
            if frame.header.is_push:
                push = decode_push(frame.header, frame.body)
                if isinstance(push, m.Delivery):
                    received.append((frame.header.correlation_id, push))
                    count += len(read_records(push.batch))
        assert count == records, f"{count} records delivered, {records} expected"
        return received

    async def closed_by_server(self, timeout: float = 5.0) -> bool:
        try:
            while True:
                data = await asyncio.wait_for(self.reader.read(65536), timeout)
                if not data:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            await self.writer.wait_closed()
