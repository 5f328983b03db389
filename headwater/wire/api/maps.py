"""The map API: MAP_GET, MAP_SET, MAP_SCAN, MAP_SIZE.

Get and set carry their own struct fast paths both ways (a map get is a request per lookup, so
construct's parse would be most of its cost); scan and size use the schemas. A request may name
at most `wire.limits.MAX_MAP_KEYS` keys or writes: the decoders check the count against it before
reading any key (INVALID_REQUEST), the server that a get names at least one key and a set holds
at least one write.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, cast, overload

from construct import Flag, Int32sb, Int64sb, PrefixedArray

from headwater.wire import messages as m
from headwater.wire.api.base import (
    I32,
    I64,
    OK,
    U16,
    Api,
    BoundedArray,
    Bytes,
    BytesTuple,
    NullableBytes,
    String,
    message,
    over_limit,
    take_topic,
)
from headwater.wire.errors import MalformedFrame
from headwater.wire.frames import Flags, frame_prefix
from headwater.wire.limits import MAX_MAP_KEYS

_MAP_ENTRY_FIXED = struct.Struct(">?qiq")  # found, revision, partition, timestamp
_ABSENT = _MAP_ENTRY_FIXED.pack(False, -1, -1, -1) + I32.pack(-1)  # not found, null value

MAP_ENTRY = message(
    m.MapEntry,
    "key" / Bytes,
    "found" / Flag,
    "revision" / Int64sb,
    "partition" / Int32sb,
    "timestamp" / Int64sb,
    "value" / NullableBytes,
)
MAP_ENTRIES = PrefixedArray(Int32sb, MAP_ENTRY)


def encode_map_get_request(request: m.MapGetRequest, correlation_id: int, flags: int = 0) -> bytes:
    """The hot-path encoder for map get: equivalent to the construct schema (tested)."""
    topic = request.topic.encode()
    parts = [U16.pack(len(topic)), topic, I32.pack(len(request.keys))]
    for wanted in request.keys:
        parts.append(I32.pack(len(wanted)))
        parts.append(wanted)
    body = b"".join(parts)
    return frame_prefix(m.ApiKey.MAP_GET, 0, correlation_id, flags, len(body)) + body


def decode_map_get_request(body: bytes) -> m.MapGetRequest:
    """The hot-path decoder for map get: equivalent to the construct schema (tested)."""
    if len(body) < 2:
        raise MalformedFrame("malformed MAP_GET: body shorter than its fixed fields")
    (topic_length,) = U16.unpack_from(body, 0)
    position = 2 + topic_length
    if len(body) < position + 4:
        raise MalformedFrame("malformed MAP_GET: topic name runs past the end of the frame")
    try:
        topic = body[2:position].decode()
    except UnicodeDecodeError:
        raise MalformedFrame("malformed MAP_GET: topic name is not valid UTF-8") from None
    (count,) = I32.unpack_from(body, position)
    position += 4
    if count > MAX_MAP_KEYS:
        raise over_limit("MAP_GET keys", count, MAX_MAP_KEYS)
    if count < 0 or count * 4 > len(body) - position:
        raise MalformedFrame(f"malformed MAP_GET: {count} keys cannot fit in the frame")
    keys = []
    for _ in range(count):
        if len(body) < position + 4:
            raise MalformedFrame("malformed MAP_GET: key length runs past the end of the frame")
        (length,) = I32.unpack_from(body, position)
        position += 4
        if length < 0 or position + length > len(body):
            raise MalformedFrame("malformed MAP_GET: key runs past the end of the frame")
        keys.append(body[position : position + length])
        position += length
    if position != len(body):
        raise MalformedFrame("malformed MAP_GET: bytes after the last key")
    return m.MapGetRequest(topic, tuple(keys))


@dataclass(frozen=True, slots=True)
class EncodedMapGetResponse(m.MapGetResponse):
    """A MAP_GET answer built as bytes by `encode_map_entries` (the server's hot path: no
    `MapEntry` per key); `entries` stays empty. It goes on the wire as the equal `MapGetResponse`
    would, and is decoded as one."""

    body: bytes = b""


def encode_map_entries(
    found: Sequence[tuple[bytes, tuple[int, int, int, bytes] | None]],
) -> EncodedMapGetResponse:
    """(key, (partition, revision, timestamp, value) or None) per key, encoded as MAP_GET's
    entry array."""
    parts = [I32.pack(len(found))]
    append = parts.append
    fixed = _MAP_ENTRY_FIXED.pack
    for entry_key, head in found:
        append(I32.pack(len(entry_key)))
        append(entry_key)
        if head is None:
            append(_ABSENT)
        else:
            partition, revision, timestamp, value = head
            append(fixed(True, revision, partition, timestamp))
            append(I32.pack(len(value)))
            append(value)
    return EncodedMapGetResponse((), b"".join(parts))


def encode_map_get_response(correlation_id: int, response: m.MapGetResponse) -> bytes:
    """The hot-path encoder for map get responses: equivalent to the construct schema."""
    if type(response) is EncodedMapGetResponse:
        body = OK + response.body
        return frame_prefix(m.ApiKey.MAP_GET, 0, correlation_id, Flags.RESPONSE, len(body)) + body
    parts = [OK, I32.pack(len(response.entries))]
    for entry in response.entries:
        parts.append(I32.pack(len(entry.key)))
        parts.append(entry.key)
        parts.append(
            _MAP_ENTRY_FIXED.pack(entry.found, entry.revision, entry.partition, entry.timestamp)
        )
        if entry.value is None:
            parts.append(I32.pack(-1))
        else:
            parts.append(I32.pack(len(entry.value)))
            parts.append(entry.value)
    body = b"".join(parts)
    return frame_prefix(m.ApiKey.MAP_GET, 0, correlation_id, Flags.RESPONSE, len(body)) + body


def decode_map_get_response(body: bytes) -> m.MapGetResponse:
    """The hot-path decoder for successful map get responses (after the error code)."""
    try:
        (count,) = I32.unpack_from(body, 0)
        position = 4
        entries = []
        for _ in range(count):
            (length,) = I32.unpack_from(body, position)
            position += 4
            entry_key = body[position : position + length]
            position += length
            found, revision, partition, timestamp = _MAP_ENTRY_FIXED.unpack_from(body, position)
            position += _MAP_ENTRY_FIXED.size
            (length,) = I32.unpack_from(body, position)
            position += 4
            value = None if length < 0 else body[position : position + length]
            position += max(length, 0)
            entries.append(m.MapEntry(entry_key, found, revision, partition, timestamp, value))
    except struct.error:
        raise MalformedFrame("malformed MAP_GET response") from None
    return m.MapGetResponse(tuple(entries))


def encode_map_set_request(request: m.MapSetRequest, correlation_id: int, flags: int = 0) -> bytes:
    topic = request.topic.encode()
    parts = [U16.pack(len(topic)), topic, I32.pack(len(request.writes))]
    for write in request.writes:
        parts += (I32.pack(len(write.key)), write.key)
        if write.value is None:
            parts.append(I32.pack(-1))
        else:
            parts += (I32.pack(len(write.value)), write.value)
        parts.append(I64.pack(write.expected_revision))
    body = b"".join(parts)
    return frame_prefix(m.ApiKey.MAP_SET, 0, correlation_id, flags, len(body)) + body


class WriteColumns(Sequence[m.MapWrite]):
    """The writes of a MAP_SET as the server's decoder reads them: three columns (keys, values,
    expected revisions) and no `MapWrite` per write, which cost as much as the rest of the
    decode. It stands in the request's `writes` (so the request is a plain `MapSetRequest` to
    everything that dispatches on its type): reading it as a sequence builds `MapWrite`s, and it
    equals, and hashes as, the tuple of them. The map handler reads the columns."""

    __slots__ = ("expected", "keys", "values")

    def __init__(
        self,
        keys: tuple[bytes, ...],
        values: tuple[bytes | None, ...],
        expected: tuple[int, ...],
    ) -> None:
        self.keys = keys
        self.values = values
        self.expected = expected

    def __len__(self) -> int:
        return len(self.keys)

    @overload
    def __getitem__(self, index: int) -> m.MapWrite: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[m.MapWrite, ...]: ...
    def __getitem__(self, index: int | slice) -> m.MapWrite | tuple[m.MapWrite, ...]:
        if isinstance(index, slice):
            return self.as_tuple()[index]
        return m.MapWrite(self.keys[index], self.values[index], self.expected[index])

    def __iter__(self) -> Iterator[m.MapWrite]:
        return map(m.MapWrite, self.keys, self.values, self.expected)

    def as_tuple(self) -> tuple[m.MapWrite, ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, WriteColumns | tuple):
            return self.as_tuple() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.as_tuple())

    def __repr__(self) -> str:
        return repr(self.as_tuple())


def decode_map_set_request(body: bytes) -> m.MapSetRequest:
    """The hot-path decoder for map set: equivalent to the construct schema (tested)."""
    topic, position = take_topic(body, "MAP_SET")
    if len(body) < position + 4:
        raise MalformedFrame("malformed MAP_SET: write count runs past the end of the frame")
    (count,) = I32.unpack_from(body, position)
    position += 4
    if count > MAX_MAP_KEYS:
        raise over_limit("MAP_SET writes", count, MAX_MAP_KEYS)
    if count < 0 or count * 16 > len(body) - position:
        raise MalformedFrame(f"malformed MAP_SET: {count} writes cannot fit in the frame")
    keys: list[bytes] = []
    values: list[bytes | None] = []
    expected: list[int] = []
    unpack_length = I32.unpack_from
    unpack_revision = I64.unpack_from
    # every field read inline, no call per field and no object per write: this loop runs once
    # per write of the busiest map request. No bounds check per field either: positions only
    # grow, so a field that runs past the end makes the next `unpack_from` raise (every write
    # ends with its revision), and one past the last revision fails the final check.
    try:
        for _ in range(count):
            (length,) = unpack_length(body, position)
            if length < 0:
                raise MalformedFrame(f"malformed MAP_SET: negative length {length}")
            position += 4
            keys.append(body[position : position + length])
            position += length
            (length,) = unpack_length(body, position)
            position += 4
            if length < 0:  # any negative length is null, as the construct schema reads it
                values.append(None)
            else:
                values.append(body[position : position + length])
                position += length
            expected.append(unpack_revision(body, position)[0])
            position += 8
    except struct.error:
        raise MalformedFrame("malformed MAP_SET: a write runs past the end of the frame") from None
    if position != len(body):
        raise MalformedFrame("malformed MAP_SET: bytes after the last write")
    columns = WriteColumns(tuple(keys), tuple(values), tuple(expected))
    # a sequence of `MapWrite`s in all but its class (above); the handler reads its columns
    return m.MapSetRequest(topic, cast("tuple[m.MapWrite, ...]", columns))


def encode_map_set_response(correlation_id: int, response: m.MapSetResponse) -> bytes:
    count = len(response.revisions)
    body = OK + I32.pack(count) + struct.pack(f">{count}q", *response.revisions)
    return frame_prefix(m.ApiKey.MAP_SET, 0, correlation_id, Flags.RESPONSE, len(body)) + body


def decode_map_set_response(body: bytes) -> m.MapSetResponse | None:
    """The fast path for a well-formed answer; anything else goes to the schema."""
    if len(body) >= 4:
        (count,) = I32.unpack_from(body, 0)
        if count >= 0 and len(body) == 4 + 8 * count:
            return m.MapSetResponse(tuple(r for (r,) in I64.iter_unpack(body[4:])))
    return None


APIS: Final = (
    Api(
        m.ApiKey.MAP_GET,
        message(
            m.MapGetRequest,
            "topic" / String,
            "keys" / BytesTuple(BoundedArray(MAX_MAP_KEYS, "MAP_GET keys", Bytes)),
        ),
        message(m.MapGetResponse, "entries" / MAP_ENTRIES),
        encode_request=encode_map_get_request,
        decode_request=decode_map_get_request,
        encode_response=encode_map_get_response,
        decode_response=decode_map_get_response,
    ),
    Api(
        m.ApiKey.MAP_SET,
        message(
            m.MapSetRequest,
            "topic" / String,
            "writes"
            / BoundedArray(
                MAX_MAP_KEYS,
                "MAP_SET writes",
                message(
                    m.MapWrite,
                    "key" / Bytes,
                    "value" / NullableBytes,
                    "expected_revision" / Int64sb,
                ),
            ),
        ),
        message(m.MapSetResponse, "revisions" / PrefixedArray(Int32sb, Int64sb)),
        encode_request=encode_map_set_request,
        decode_request=decode_map_set_request,
        encode_response=encode_map_set_response,
        decode_response=decode_map_set_response,
    ),
    Api(
        m.ApiKey.MAP_SCAN,
        message(
            m.MapScanRequest,
            "topic" / String,
            "prefix" / Bytes,
            "limit" / Int32sb,
            "after" / Bytes,
        ),
        message(m.MapScanResponse, "entries" / MAP_ENTRIES, "cursor" / Bytes),
    ),
    Api(
        m.ApiKey.MAP_SIZE,
        message(m.MapSizeRequest, "topic" / String),
        message(m.MapSizeResponse, "size" / Int64sb),
    ),
)
