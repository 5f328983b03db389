"""A pipelining raw-protocol peer for the state-machine test (tests/test_statemachine.py).

Requests are encoded with `wire.protocol` and written in one `write` per round, so the server sees
them pipelined, usually in one read. A reader task decodes every frame as it arrives: a response
resolves the future of its correlation id (an error response resolves it with the
`HeadwaterError`, it is not raised), a pushed DELIVER or CONSUMER_CLOSED is stored per consumer id
for the model to check later. Nothing here decides what is right; `tests/support/fuzzmodel.py` does.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError
from headwater.wire.frames import FrameDecoder
from headwater.wire.protocol import decode_push, decode_response, encode_request
from headwater.wire.records import Record, read_records

Outcome = m.Response | HeadwaterError


@dataclass
class Pushes:
    """What the server pushed to one consumer id, in arrival order."""

    records: list[tuple[int, int, Record]] = field(default_factory=list)  # partition, count, rec
    closed: m.ConsumerClosed | None = None


class FuzzPeer:
    def __init__(self, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.index = index
        self._reader = reader
        self._writer = writer
        self._decoder = FrameDecoder()
        self._correlation = 0
        self._waiting: dict[int, asyncio.Future[Outcome]] = {}
        self.pushes: dict[int, Pushes] = {}
        self.lost: str | None = None  # why the connection ended, once it has
        self.bad_frames: list[str] = []  # frames that could not be decoded (a protocol bug)
        self._arrived = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def open(cls, index: int, address: str, token: str | None = None) -> FuzzPeer:
        """Connects; with `token`, authenticates first (docs/SECURITY.md)."""
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        peer = cls(index, reader, writer)
        if token is not None:
            answer = await peer.call(m.AuthenticateRequest("token", token.encode()), 10.0)
            if not isinstance(answer, m.AuthenticateResponse):
                await peer.close()
                raise AssertionError(f"connection {index}: AUTHENTICATE answered {answer}")
        return peer

    def encode(self, request: m.Request) -> tuple[int, bytes, asyncio.Future[Outcome]]:
        self._correlation += 1
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._waiting[self._correlation] = future
        return self._correlation, encode_request(request, self._correlation), future

    async def send(self, data: bytes) -> None:
        self._writer.write(data)
        with contextlib.suppress(ConnectionError):
            await self._writer.drain()

    async def call(self, request: m.Request, timeout: float) -> Outcome:
        """One request, answered within `timeout` (raises TimeoutError otherwise)."""
        _, data, future = self.encode(request)
        await self.send(data)
        return await asyncio.wait_for(asyncio.shield(future), timeout)

    def pushes_for(self, consumer_id: int) -> Pushes:
        return self.pushes.setdefault(consumer_id, Pushes())

    async def _read(self) -> None:
        try:
            while True:
                data = await self._reader.read(65536)
                if not data:
                    self.lost = "closed by the server"
                    self._arrived.set()
                    return
                for frame in self._decoder.feed(data):
                    header = frame.header  # type: ignore[union-attr]
                    body = frame.body  # type: ignore[union-attr]
                    if header.is_push:
                        self._push(header.correlation_id, header, body)
                        continue
                    try:
                        outcome: Outcome = decode_response(header, body)
                    except HeadwaterError as exc:
                        outcome = exc
                    future = self._waiting.pop(header.correlation_id, None)
                    if future is None:
                        self.bad_frames.append(
                            f"response to unknown correlation id {header.correlation_id}"
                        )
                    elif not future.done():
                        future.set_result(outcome)
        except (ConnectionError, OSError) as exc:
            self.lost = f"connection error {exc!r}"
        except HeadwaterError as exc:  # the byte stream itself was bad
            self.lost = f"undecodable frame from the server: {exc}"
            self.bad_frames.append(self.lost)

    async def arrival(self, timeout: float) -> None:
        """Wait until the next push arrives (or the connection ends), at most `timeout`."""
        self._arrived.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._arrived.wait(), max(0.0, timeout))

    def _push(self, consumer_id: int, header: object, body: bytes) -> None:
        self._arrived.set()
        try:
            push = decode_push(header, body)  # type: ignore[arg-type]
        except HeadwaterError as exc:
            self.bad_frames.append(f"undecodable push for consumer {consumer_id}: {exc}")
            return
        pushes = self.pushes_for(consumer_id)
        if isinstance(push, m.Delivery):
            try:
                records = read_records(push.batch)
            except HeadwaterError as exc:
                self.bad_frames.append(f"undecodable delivery for consumer {consumer_id}: {exc}")
                return
            for record in records:
                pushes.records.append((push.partition, push.delivery_count, record))
        elif isinstance(push, m.ConsumerClosed):
            pushes.closed = push

    def unanswered(self) -> list[int]:
        return sorted(self._waiting)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
