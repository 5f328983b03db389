"""One client connection: bytes in, frames decoded, handlers called, responses and deliveries out.

An `asyncio.Protocol` rather than streams: `data_received` decodes and handles every complete frame
in the chunk without a task switch, which is what lets a non-reliable produce cost a few
microseconds. Errors are contained to the connection: a request the broker refuses gets an error
response and the connection carries on; framing that cannot be resynchronised (a size below the
header) gets an error response and the connection is closed; an oversized frame is answered and
skipped. Unexpected exceptions are logged and answered with UNKNOWN_SERVER_ERROR, never raised
into the event loop.

Writing uses asyncio's write-buffer watermarks: above `consumer_write_buffer` bytes queued the
connection stops being `writable`, subscriptions stop sending to its consumers, and when the buffer
drains they resume.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from typing import cast

import structlog

from server.broker import Broker
from server.config import ServerConfig
from server.subscription import Consumer
from wire import messages as m
from wire.codec import (
    decode_request,
    delivery_prefix,
    encode_error,
    encode_produce_response,
    encode_push,
    encode_response,
)
from wire.errors import (
    FrameTooLarge,
    HeadwaterError,
    MalformedFrame,
    ProtocolError,
    TruncatedFrame,
    UnknownServerError,
)
from wire.frames import KNOWN_FLAGS, Flags, Frame, FrameDecoder, FrameHeader, FrameRejected

log = structlog.get_logger("headwater.connection")

# plain ints: enum flag arithmetic costs microseconds per frame
_NO_RESPONSE = int(Flags.NO_RESPONSE)
_NOT_ON_REQUESTS = ~KNOWN_FLAGS | int(Flags.RESPONSE | Flags.PUSH)


class Connection(asyncio.Protocol):
    def __init__(self, broker: Broker, config: ServerConfig, registry: set[Connection]) -> None:
        self._broker = broker
        self._config = config
        self._registry = registry
        self._decoder = FrameDecoder(config.max_frame_size)
        self._transport: asyncio.Transport | None = None
        self._paused = False
        self.consumers: dict[int, Consumer] = {}
        self.peer = "?"
        self._tasks: set[asyncio.Future[None]] = set()
        self._out: list[bytes] | None = None

    # asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._transport.set_write_buffer_limits(high=self._config.consumer_write_buffer)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._registry.add(self)
        log.debug("conn.opened", peer=self.peer)

    def data_received(self, data: bytes) -> None:
        try:
            events = self._decoder.feed(data)
        except MalformedFrame as exc:
            self._fatal(0, 0, 0, exc)
            return
        # Everything written while handling this chunk goes out in one write: pipelined
        # requests get their responses in one syscall, not one each.
        self._out = []
        try:
            self._handle_events(events)
        finally:
            out, self._out = self._out, None
            if out and self._transport is not None:
                self._transport.write(b"".join(out))

    def _handle_events(self, events: list[Frame | FrameRejected]) -> None:
        for event in events:
            if type(event) is Frame:
                self._handle(event)
            else:
                assert isinstance(event, FrameRejected)
                header = event.header
                self._send_error(
                    header.api_key,
                    header.api_version,
                    header.correlation_id,
                    FrameTooLarge(
                        f"frame of {event.size} bytes exceeds the "
                        f"{self._config.max_frame_size}-byte limit"
                    ),
                )
            if self._transport is None or self._transport.is_closing():
                return

    def eof_received(self) -> bool:
        if self._decoder.pending_bytes:
            header = self._decoder.partial_header()
            error = TruncatedFrame(
                f"connection closed by the client with {self._decoder.pending_bytes} bytes "
                "of an incomplete frame"
            )
            if header is None:
                self._send_error(0, 0, 0, error)
            else:
                self._send_error(header.api_key, header.api_version, header.correlation_id, error)
            log.info("conn.truncated_frame", peer=self.peer, pending=self._decoder.pending_bytes)
        return False  # close once the error is flushed

    def connection_lost(self, exc: Exception | None) -> None:
        self._registry.discard(self)
        for consumer in list(self.consumers.values()):
            self._broker.detach(consumer)
        self.consumers.clear()
        self._transport = None
        # Requests still waiting (a produce for its fsync) complete; their answers are dropped.
        log.debug("conn.closed", peer=self.peer, error=str(exc) if exc else None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        for consumer in list(self.consumers.values()):
            consumer.subscription.drain()

    # Requests

    def _handle(self, frame: Frame) -> None:
        header = frame.header
        try:
            if header.flags & _NOT_ON_REQUESTS:
                raise MalformedFrame(f"flags {header.flags:#06x} are not valid on a request")
            request = decode_request(header, frame.body)
            response = self._broker.handle(self, request)
        except Exception as exc:
            self._refuse(header, exc)
            return
        if inspect.isawaitable(response):
            task = asyncio.ensure_future(self._finish(header, response))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        self._respond(header, response)

    async def _finish(self, header: FrameHeader, pending: Awaitable[m.Response]) -> None:
        try:
            response = await pending
        except Exception as exc:
            self._refuse(header, exc)
            return
        self._respond(header, response)

    def _respond(self, header: FrameHeader, response: m.Response) -> None:
        if header.flags & _NO_RESPONSE or self._transport is None:
            return
        if type(response) is m.ProduceResponse:
            out = encode_produce_response(
                header.correlation_id, response.partition, response.base_offset
            )
        else:
            out = encode_response(header.api_key, header.correlation_id, response)
        self._write(out)

    def _refuse(self, header: FrameHeader, error: Exception) -> None:
        """Answer a request that failed: its own error, or for a bug a generic one (logged)."""
        if not isinstance(error, HeadwaterError):
            log.error("conn.handler_failed", peer=self.peer, api_key=header.api_key, exc_info=error)
            error = UnknownServerError("internal error; see the server log")
        self._send_error(header.api_key, header.api_version, header.correlation_id, error)

    def _send_error(
        self, api_key: int, api_version: int, correlation_id: int, error: HeadwaterError
    ) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._write(encode_error(api_key, api_version, correlation_id, error))
        if not isinstance(error, ProtocolError):
            return
        log.info("conn.protocol_error", peer=self.peer, code=error.code.name, error=error.message)

    def _fatal(
        self, api_key: int, api_version: int, correlation_id: int, error: HeadwaterError
    ) -> None:
        """Answer, then close: the byte stream cannot be resynchronised."""
        self._send_error(api_key, api_version, correlation_id, error)
        if self._transport is not None:
            self._transport.close()

    def _write(self, data: bytes) -> None:
        if self._out is not None:
            self._out.append(data)
        elif self._transport is not None:
            self._transport.write(data)

    # ConsumerSession

    @property
    def writable(self) -> bool:
        return not self._paused and self._transport is not None

    def send_delivery(
        self, consumer_id: int, partition: int, batch: bytes, delivery_count: int = 1
    ) -> None:
        if self._transport is not None:
            prefix = delivery_prefix(consumer_id, partition, len(batch), delivery_count)
            if self._out is not None:
                self._out += (prefix, batch)
            else:
                self._transport.writelines((prefix, batch))

    def send_consumer_closed(self, consumer_id: int, code: int, message: str) -> None:
        if self._transport is not None:
            self._write(encode_push(consumer_id, m.ConsumerClosed(code, message)))

    def send_messages_dropped(self, consumer_id: int, count: int) -> None:
        if self._transport is not None:
            self._write(encode_push(consumer_id, m.MessagesDropped(count)))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def __repr__(self) -> str:
        return f"Connection({self.peer})"
