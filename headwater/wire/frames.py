"""Framing: the size prefix, the frame header, and an incremental decoder fed with bytes.

Every frame is `int32 size` (the byte count that follows) and a 10-byte header: `api_key int16,
api_version int16, correlation_id int32, flags uint16`, big-endian. Flags tell the three kinds of
frame apart by the header alone: a request (no flag), a response (`RESPONSE`), and a frame the
server pushes on its own (`PUSH`, e.g. a delivery to a consumer). A request may carry
`NO_RESPONSE`: the server then answers only if the request fails.

`FrameDecoder` is sans-I/O, in the manner of h11: feed it whatever bytes arrived, take the events
out. A frame announcing more than `MAX_FRAME_SIZE` bytes is reported as `FrameRejected` as soon as
its header is in, and its body is skipped as it arrives, never buffered. `max_frame_size` may be
changed between feeds (the server reads small frames until a connection has authenticated). A
size too small to hold a header cannot be skipped safely and raises `MalformedFrame`: the stream
is lost.

A body of `large_body` bytes or more (a batch of megabytes) is not grown in the buffer: the pieces
that arrive are kept as they are and joined once, into the body, when the last one is in. Growing
it and then copying the body out touched every byte twice in fresh memory; for an 8 MiB produce
that was about 25 ms of the event loop's CPU, half the stall the server allows a request. Pieces
shorter than `PIECE` are gathered into ones of that size, so a body written a byte at a time is
held in a few objects, not millions.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Final

from headwater.wire.errors import MalformedFrame
from headwater.wire.limits import MAX_FRAME_SIZE

LARGE_BODY: Final = 1 << 20
# pieces of a large body shorter than this are gathered into one of this size: a client writing
# a byte at a time must not make the server hold millions of tiny objects (~40 bytes each)
PIECE: Final = 1 << 16

SIZE = struct.Struct(">i")
HEADER = struct.Struct(">hhiH")
HEADER_SIZE: Final = HEADER.size
PREFIXED_HEADER = struct.Struct(">ihhiH")


class Flags(enum.IntFlag):
    NONE = 0
    RESPONSE = 0x01
    PUSH = 0x02
    NO_RESPONSE = 0x04


KNOWN_FLAGS: Final = int(Flags.RESPONSE | Flags.PUSH | Flags.NO_RESPONSE)


@dataclass(frozen=True, slots=True)
class FrameHeader:
    api_key: int
    api_version: int
    correlation_id: int
    flags: int

    @property
    def is_response(self) -> bool:
        return bool(self.flags & Flags.RESPONSE)

    @property
    def is_push(self) -> bool:
        return bool(self.flags & Flags.PUSH)

    @property
    def wants_response(self) -> bool:
        return not self.flags & Flags.NO_RESPONSE


@dataclass(frozen=True, slots=True)
class Frame:
    """A complete frame: its header and its body (the bytes after the header)."""

    header: FrameHeader
    body: bytes


@dataclass(frozen=True, slots=True)
class FrameRejected:
    """A frame over the size limit; its body is being skipped, not buffered."""

    header: FrameHeader
    size: int


def encode_frame(
    api_key: int, api_version: int, correlation_id: int, flags: int, body: bytes
) -> bytes:
    return (
        PREFIXED_HEADER.pack(HEADER_SIZE + len(body), api_key, api_version, correlation_id, flags)
        + body
    )


def frame_prefix(
    api_key: int, api_version: int, correlation_id: int, flags: int, body_size: int
) -> bytes:
    """Size prefix and header of a frame whose body is written separately (no copy of the body)."""
    return PREFIXED_HEADER.pack(
        HEADER_SIZE + body_size, api_key, api_version, correlation_id, flags
    )


class FrameDecoder:
    """Turns a byte stream into `Frame` and `FrameRejected` events."""

    def __init__(self, max_frame_size: int = MAX_FRAME_SIZE, large_body: int = LARGE_BODY) -> None:
        self._buffer = bytearray()
        self._skip = 0
        self.max_frame_size = max_frame_size
        self._large_body = large_body
        # a large body as it arrives: its frame's header, the pieces so far, the bytes to come
        self._large: FrameHeader | None = None
        self._pieces: list[bytes] = []
        self._small = bytearray()  # short pieces, until they make one of PIECE bytes
        self._gathered = 0
        self._missing = 0

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete frame held (or still to skip): nonzero at EOF means truncation."""
        return len(self._buffer) + self._skip + self._gathered

    def partial_header(self) -> FrameHeader | None:
        """The header of the incomplete frame in the buffer, if that much of it arrived."""
        if self._large is not None:
            return self._large
        if len(self._buffer) >= SIZE.size + HEADER_SIZE:
            return FrameHeader(*HEADER.unpack_from(self._buffer, SIZE.size))
        return None

    def feed(self, data: bytes) -> list[Frame | FrameRejected]:
        events: list[Frame | FrameRejected] = []
        if self._large is not None:
            data = self._gather(data, events)
            if not data:
                return events
        if self._skip:
            if len(data) <= self._skip:
                self._skip -= len(data)
                return events
            data = data[self._skip :]
            self._skip = 0
        buffer = self._buffer
        buffer += data
        position = 0
        available = len(buffer)
        while available - position >= SIZE.size + HEADER_SIZE:
            size, api_key, api_version, correlation_id, flags = PREFIXED_HEADER.unpack_from(
                buffer, position
            )
            if size < HEADER_SIZE:
                raise MalformedFrame(
                    f"frame size {size} is smaller than the {HEADER_SIZE}-byte header"
                )
            header = FrameHeader(api_key, api_version, correlation_id, flags)
            if size > self.max_frame_size:
                events.append(FrameRejected(header, size))
                remaining = size - HEADER_SIZE
                in_buffer = available - position - SIZE.size - HEADER_SIZE
                if in_buffer >= remaining:
                    position += SIZE.size + size
                    continue
                self._skip = remaining - in_buffer
                position = available
                break
            end = position + SIZE.size + size
            if end > available:
                if size - HEADER_SIZE >= self._large_body:  # gathered piece by piece from here
                    first = bytes(buffer[position + SIZE.size + HEADER_SIZE : available])
                    self._large, self._pieces = header, [first]
                    self._gathered, self._missing = len(first), size - HEADER_SIZE - len(first)
                    position = available
                break
            with memoryview(buffer) as view:  # one copy of the body, not two
                body = bytes(view[position + SIZE.size + HEADER_SIZE : end])
            events.append(Frame(header, body))
            position = end
        if position:
            del buffer[:position]
        return events

    def _gather(self, data: bytes, events: list[Frame | FrameRejected]) -> bytes:
        """Take the large body's next piece from `data`; the rest of `data` is returned."""
        take = min(len(data), self._missing)
        piece = data if take == len(data) else data[:take]
        if len(piece) >= PIECE:
            self._flush_small()
            self._pieces.append(bytes(piece))  # kept as it is: bytes() does not copy bytes
        else:
            self._small += piece
            if len(self._small) >= PIECE:
                self._flush_small()
        self._gathered += take
        self._missing -= take
        if self._missing:
            return b""
        assert self._large is not None
        self._flush_small()
        events.append(Frame(self._large, b"".join(self._pieces)))
        self._large, self._pieces, self._gathered = None, [], 0
        return data[take:]

    def _flush_small(self) -> None:
        if self._small:
            self._pieces.append(bytes(self._small))
            self._small = bytearray()
