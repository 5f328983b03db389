"""Kafka frames, request headers and message bodies, decoded with bounded work.

The messages are declared as data by aiokafka's protocol module (`aiokafka.protocol`, pinned in
pyproject.toml): a `Schema` of named fields whose types are `Int8` ... `Int64`, `Boolean`,
`String`, `Bytes`, `Array` and their compact (flexible-version) forms. aiokafka's own decoders
read those schemas from a `BytesIO` and trust every array count (`[decode() for _ in
range(count)]`), so this module walks the same schemas with its own reader instead:

- the frame is at most the listener's frame size limit before any of it is buffered (`frame_size`);
- an array's count, read before any element, must fit in the bytes left at the element type's
  smallest encoded size (`min_size`): a count of two billion in a 40-byte frame is an error
  at once, not a loop; so is a tagged-field count;
- every read is checked against the end of the body: a short field is `MalformedKafka`, never a
  partial value;
- a request announces at most `MAX_ELEMENTS` array elements in all, so the handlers' work per
  request (a partition each) is bounded whatever the frame holds.

So decoding costs at most one step per byte of the frame, whatever the peer declares. Responses
are encoded with aiokafka's encoders (our own values, nothing to bound).

Decoding and encoding cost about 2 us per array element, so a request of `MAX_ELEMENTS` (an
OffsetCommit of 49,000 partitions held the loop 57-154 ms) is too much for the event loop. A
reader given `inline` stops with `Deferred` as soon as more elements are announced, before
reading them: the connection decodes that body again on a thread, and encodes the answer there
too when it holds more than `INLINE_ELEMENTS` (`many`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Final

from aiokafka.protocol.types import (
    Array,
    Boolean,
    Bytes,
    CompactArray,
    CompactBytes,
    CompactString,
    Float64,
    Int8,
    Int16,
    Int32,
    Int64,
    Schema,
    String,
    TaggedFields,
    UInt32,
    UnsignedVarInt32,
    VarInt32,
    VarInt64,
)

_FIXED: Final[dict[Any, struct.Struct]] = {
    Int8: struct.Struct(">b"),
    Int16: struct.Struct(">h"),
    Int32: struct.Struct(">i"),
    UInt32: struct.Struct(">I"),
    Int64: struct.Struct(">q"),
    Float64: struct.Struct(">d"),
    Boolean: struct.Struct(">?"),
}
_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">hhi")
# Array elements in one request, all arrays together: each becomes work for the handlers (a
# partition to produce to, fetch or commit, a topic to describe), and an 8 MiB frame holds half a
# million 16-byte Fetch partitions. Kafka clients name every partition they fetch in one request:
# 50,000 is far past any real one.
MAX_ELEMENTS: Final = 50_000
# Array elements decoded or encoded on the event loop: at about 2 us each, a few milliseconds.
INLINE_ELEMENTS: Final = 1024


class MalformedKafka(Exception):
    """A frame or body that does not decode per its schema: the connection is closed."""


class Deferred(Exception):
    """A body announces more array elements than its reader's `inline` allows: decode it off the
    event loop."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def frame_size(prefix: bytes | bytearray | memoryview) -> int:
    """The body size a frame's 4-byte prefix announces."""
    return int(_SIZE.unpack_from(prefix)[0])


def peek_header(body: bytes) -> tuple[int, int, int]:
    """(api key, api version, correlation id): the fixed start of every request header."""
    if len(body) < _HEADER.size:
        raise MalformedKafka(f"a request of {len(body)} bytes is shorter than its header")
    key, version, correlation = _HEADER.unpack_from(body)
    return int(key), int(version), int(correlation)


def min_size(field: Any) -> int:
    """The fewest bytes one value of `field` takes on the wire (at least 1 for an element, so a
    count is always bounded by the bytes left)."""
    if field in _FIXED:
        return int(_FIXED[field].size)
    if isinstance(field, Schema):
        return sum(min_size(f) for f in field.fields)
    if isinstance(field, (CompactArray, CompactString)):
        return 1
    if isinstance(field, Array):
        return 4
    if isinstance(field, String):
        return 2
    if field is Bytes:
        return 4
    return 1  # varints, compact bytes, tagged fields


class Reader:
    """Reads values of aiokafka field types from one request body, never past its end."""

    __slots__ = ("_data", "_end", "elements", "inline", "nullable", "pos")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        # the fields of the request being read whose null says something (`apis.Api.nullable`)
        self.nullable: frozenset[str] = frozenset()
        self._data = data
        self._end = len(data)
        self.pos = pos
        self.elements = 0  # array elements announced so far, in all
        self.inline = MAX_ELEMENTS  # past this many, `Deferred` (a bound no larger body breaks)

    @property
    def left(self) -> int:
        return self._end - self.pos

    def _take(self, size: int) -> bytes:
        if size < 0 or size > self._end - self.pos:
            raise MalformedKafka(
                f"a field of {size} bytes at byte {self.pos} runs past the {self._end}-byte body"
            )
        start = self.pos
        self.pos += size
        return self._data[start : self.pos]

    def _fixed(self, packer: struct.Struct) -> Any:
        if packer.size > self._end - self.pos:
            raise MalformedKafka(f"the body ends inside a field at byte {self.pos}")
        (value,) = packer.unpack_from(self._data, self.pos)
        self.pos += packer.size
        return value

    def uvarint(self) -> int:
        value = shift = 0
        for _ in range(5):  # an unsigned varint32 is at most 5 bytes
            (byte,) = self._take(1)
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        raise MalformedKafka(f"a varint at byte {self.pos} is longer than 5 bytes")

    def _varlong(self) -> int:
        value = shift = 0
        for _ in range(10):
            (byte,) = self._take(1)
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (value >> 1) ^ -(value & 1)
            shift += 7
        raise MalformedKafka(f"a varlong at byte {self.pos} is longer than 10 bytes")

    def _count(self, count: int, element: Any) -> int:
        """`count` elements, checked against the bytes left before any is read."""
        if count < 0:
            raise MalformedKafka(f"negative array count {count}")
        if count * max(1, min_size(element)) > self.left:
            raise MalformedKafka(
                f"an array of {count} elements cannot fit in the {self.left} bytes left"
            )
        self.elements += count
        if self.elements > MAX_ELEMENTS:
            raise MalformedKafka(f"more than {MAX_ELEMENTS} array elements in one request")
        if self.elements > self.inline:
            raise Deferred
        return count

    def read(self, field: Any, name: str = "") -> Any:
        """A value of `field`. A null array or string (count or length -1) is read as empty
        unless its name is in `nullable`, where null means something (Metadata's "every topic"):
        the handlers never see a null where they do not look for one."""
        packer = _FIXED.get(field)
        if packer is not None:
            return self._fixed(packer)
        if isinstance(field, Schema):
            return {n: self.read(f, n) for n, f in zip(field.names, field.fields, strict=True)}
        if isinstance(field, Array):
            count = self.uvarint() - 1 if isinstance(field, CompactArray) else self._fixed(_SIZE)
            if count == -1:
                return None if name in self.nullable else []
            return [self.read(field.array_of) for _ in range(self._count(count, field.array_of))]
        if isinstance(field, String):
            if isinstance(field, CompactString):
                size = self.uvarint() - 1
            else:
                size = self._fixed(_FIXED[Int16])
            if size == -1:
                return None if name in self.nullable else ""
            return self._text(size)
        if field is Bytes:
            size = self._fixed(_SIZE)
            return None if size == -1 else self._take(size)
        if field is CompactBytes:
            size = self.uvarint() - 1
            return None if size == -1 else self._take(size)
        if field is UnsignedVarInt32:
            return self.uvarint()
        if field is VarInt32 or field is VarInt64:
            return self._varlong()
        if field is TaggedFields:
            return self.tagged()
        raise TypeError(f"no decoder for field type {field!r}")  # a declaration of ours is wrong

    def _text(self, size: int) -> str:
        try:
            return self._take(size).decode()
        except UnicodeDecodeError:
            raise MalformedKafka(f"a string before byte {self.pos} is not UTF-8") from None

    def tagged(self) -> dict[int, bytes]:
        """Tagged fields: kept raw (the versions served define none we read)."""
        count = self.uvarint()
        if 2 * count > self.left:  # a tag and a size, a byte each at least
            raise MalformedKafka(f"{count} tagged fields cannot fit in the {self.left} bytes left")
        fields: dict[int, bytes] = {}
        for _ in range(count):
            tag = self.uvarint()
            fields[tag] = self._take(self.uvarint())
        return fields


def read_header(body: bytes, flexible: bool) -> tuple[RequestHeader, Reader]:
    """The request header (v1; v2 with tagged fields when the API version is flexible) and a
    reader positioned at the body."""
    key, version, correlation = peek_header(body)
    reader = Reader(body, _HEADER.size)
    reader.nullable = frozenset({"client_id"})
    client_id = reader.read(String("utf-8"), "client_id")
    reader.nullable = frozenset()
    if flexible:
        reader.tagged()
    return RequestHeader(key, version, correlation, client_id), reader


def decode_body(
    reader: Reader, schema: Schema, nullable: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The body's fields by name (nested structs as dicts too; a null array or string as empty
    unless its name is in `nullable`); bytes left over after the last field are an error: the
    peer and the server disagree on the version."""
    reader.nullable = nullable
    values: dict[str, Any] = reader.read(schema)
    if reader.left:
        raise MalformedKafka(f"{reader.left} bytes left after the request's last field")
    return values


def decode_request(
    body: bytes, flexible: bool, schema: Schema, nullable: frozenset[str], inline: int
) -> tuple[RequestHeader, dict[str, Any], int]:
    """The header, the body's fields and the array elements they hold; `Deferred` past `inline`
    elements (`MAX_ELEMENTS`: never)."""
    header, reader = read_header(body, flexible)
    reader.inline = inline
    fields = decode_body(reader, schema, nullable)
    return header, fields, reader.elements


def many(values: dict[str, Any], limit: int = INLINE_ELEMENTS) -> bool:
    """Whether a response's values hold more than `limit` array elements (counted until they do,
    so the count costs `limit` steps at most): such an answer is encoded off the loop."""
    count = 0
    stack = [values]
    while stack:
        for value in stack.pop().values():
            if type(value) is list:
                count += len(value)
                if count > limit:
                    return True
                stack.extend(item for item in value if type(item) is dict)
    return False


def shape(schema: Schema, values: dict[str, Any]) -> tuple[Any, ...]:
    """`values` (by field name, nested structs and arrays of them as dicts) in the order of
    `schema`, the version's own: a handler gives every field any version has, each version takes
    its own. A field not given is its type's zero (0, null string, empty array or tags)."""
    out: list[Any] = []
    for name, field in zip(schema.names, schema.fields, strict=True):
        value = values.get(name)
        if isinstance(field, Schema):
            out.append(shape(field, value or {}))
        elif isinstance(field, Array):
            items = [] if value is None else value
            inner = field.array_of
            out.append([shape(inner, i) for i in items] if isinstance(inner, Schema) else items)
        elif value is not None:
            out.append(value)
        elif field in _FIXED:
            out.append(0)
        elif field is TaggedFields:
            out.append({})
        else:
            out.append(None)
    return tuple(out)


def encode_response(
    correlation_id: int, schema: Schema, values: dict[str, Any], *, flexible_header: bool = False
) -> bytes:
    """A whole response frame: size, header (v0; v1 adds empty tagged fields), body."""
    header = _SIZE.pack(correlation_id) + (b"\x00" if flexible_header else b"")
    body: bytes = schema.encode(shape(schema, values))
    return _SIZE.pack(len(header) + len(body)) + header + body


def encode_error_only(correlation_id: int, error_code: int) -> bytes:
    """A response carrying only an error code after its header (UNSUPPORTED_VERSION for an API
    or version not served: the layout of ApiVersions v0, which every client can read)."""
    return _SIZE.pack(6) + _SIZE.pack(correlation_id) + struct.pack(">h", error_code)


def encode_sasl_token(token: bytes = b"") -> bytes:
    """A bare SASL token frame (after a SaslHandshake v0): its size, then its bytes."""
    return _SIZE.pack(len(token)) + token
