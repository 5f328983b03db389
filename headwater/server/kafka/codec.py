"""Kafka frames, request headers and message bodies, decoded with bounded work into the typed
message classes of `kafka.messages` and encoded from them.

The codec is ours: each message class declares its fields and the versions each is in
(`messages.declare.Field`, written from Kafka's JSON specs by tools/kafka_messages.py), and
`layout` turns a class at one version into a reader and a writer for exactly that version's
bytes (compact forms and tagged fields in a flexible version). A field absent in the version
keeps its Kafka default. Decoding is bounded whatever the peer declares:

- the frame is at most the listener's frame size limit before any of it is buffered (`frame_size`);
- an array's count, read before any element, must fit in the bytes left at the element type's
  smallest encoded size: a count of two billion in a 40-byte frame is an error at once, not a
  loop; so is a tagged-field count;
- every read is checked against the end of the body: a short field is `MalformedKafka`, never a
  partial value;
- a request announces at most `MAX_ELEMENTS` array elements in all, so the handlers' work per
  request (a partition each) is bounded whatever the frame holds.

So decoding costs at most one step per byte of the frame. A null string, array or bytes reads as
None where the field is nullable (typed `X | None`: Metadata's "every topic"), as the empty value
elsewhere: the handlers never see a null where they do not look for one. Record data stays the
bytes of the frame (one slice, no copy after it); tagged fields are skipped (the versions served
define none we read) and written empty.

Decoding and encoding cost about 2 us per array element, so a request of `MAX_ELEMENTS` (an
OffsetCommit of 49,000 partitions held the loop 57-154 ms) is too much for the event loop. A
reader given `inline` stops with `Deferred` as soon as more elements are announced, before
reading them: the connection decodes that body again on a thread, and encodes the answer there
too when it holds more than `INLINE_ELEMENTS` (`many`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from operator import attrgetter
from typing import Any, Final, Generic, TypeVar

from headwater.server.kafka.messages.declare import Field, Message, Struct

M = TypeVar("M", bound=Message)

_SIZE = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_HEADER = struct.Struct(">hhi")
_FIXED: Final = {
    "int8": struct.Struct(">b"),
    "int16": _INT16,
    "uint16": struct.Struct(">H"),
    "int32": _SIZE,
    "int64": struct.Struct(">q"),
    "float64": struct.Struct(">d"),
    "bool": struct.Struct(">?"),
    "uuid": struct.Struct("16s"),  # a topic id: 16 bytes
}
# Array elements in one request, all arrays together: each becomes work for the handlers (a
# partition to produce to, fetch or commit, a topic to describe), and an 8 MiB frame holds half a
# million 16-byte Fetch partitions. Kafka clients name every partition they fetch in one request:
# 50,000 is far past any real one.
MAX_ELEMENTS: Final = 50_000
# APIs whose flexible requests may carry bytes past their last field, ignored as Kafka's broker
# ignores them: librdkafka's Metadata v9+ for every topic reserves 4 bytes for the topics' count
# and writes a 1-byte null there, leaving 3 zero bytes before the rest (what Kafka then reads as
# allow_auto_topic_creation and include_topic_authorized_operations false, and no tags)
_TRAILING_IGNORED: Final = frozenset({3})
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


class Reader:
    """Reads the values of one request body, never past its end."""

    __slots__ = ("_data", "_end", "elements", "inline", "pos")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self._data = data
        self._end = len(data)
        self.pos = pos
        self.elements = 0  # array elements announced so far, in all
        self.inline = MAX_ELEMENTS  # past this many, `Deferred` (a bound no larger body breaks)

    @property
    def left(self) -> int:
        return self._end - self.pos

    def take(self, size: int) -> bytes:
        if size < 0 or size > self._end - self.pos:
            raise MalformedKafka(
                f"a field of {size} bytes at byte {self.pos} runs past the {self._end}-byte body"
            )
        start = self.pos
        self.pos += size
        return self._data[start : self.pos]

    def fixed(self, packer: struct.Struct) -> Any:
        if packer.size > self._end - self.pos:
            raise MalformedKafka(f"the body ends inside a field at byte {self.pos}")
        (value,) = packer.unpack_from(self._data, self.pos)
        self.pos += packer.size
        return value

    def uvarint(self) -> int:
        value = shift = 0
        for _ in range(5):  # an unsigned varint32 is at most 5 bytes
            (byte,) = self.take(1)
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        raise MalformedKafka(f"a varint at byte {self.pos} is longer than 5 bytes")

    def size(self, compact: bool, width: struct.Struct = _SIZE) -> int:
        """A length or count: -1 for null."""
        return self.uvarint() - 1 if compact else int(self.fixed(width))

    def count(self, compact: bool, element: int) -> int:
        """An array's count (-1: null), checked against the bytes left at `element` bytes each
        at least before any element is read."""
        count = self.size(compact)
        if count == -1:
            return -1
        if count < 0:
            raise MalformedKafka(f"negative array count {count}")
        if count * max(1, element) > self.left:
            raise MalformedKafka(
                f"an array of {count} elements cannot fit in the {self.left} bytes left"
            )
        self.elements += count
        if self.elements > MAX_ELEMENTS:
            raise MalformedKafka(f"more than {MAX_ELEMENTS} array elements in one request")
        if self.elements > self.inline:
            raise Deferred
        return count

    def text(self, size: int) -> str:
        try:
            return self.take(size).decode()
        except UnicodeDecodeError:
            raise MalformedKafka(f"a string before byte {self.pos} is not UTF-8") from None

    def string(self, compact: bool = False) -> str | None:
        size = self.size(compact, _INT16)
        return None if size == -1 else self.text(size)

    def tagged(self) -> dict[int, bytes]:
        """Tagged fields: kept raw (the versions served define none we read)."""
        count = self.uvarint()
        if 2 * count > self.left:  # a tag and a size, a byte each at least
            raise MalformedKafka(f"{count} tagged fields cannot fit in the {self.left} bytes left")
        fields: dict[int, bytes] = {}
        for _ in range(count):
            tag = self.uvarint()
            fields[tag] = self.take(self.uvarint())
        return fields


Read = Callable[[Reader], Any]
Write = Callable[[list[bytes], Any], None]  # appends a value's bytes to the parts of a frame


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length(compact: bool, width: struct.Struct = _SIZE) -> Callable[[int], bytes]:
    """A length's (or count's) bytes; -1: null."""
    if compact:
        return lambda size: _uvarint(size + 1)
    return width.pack


def _field(field: Field, default: Any, version: int, flexible: bool) -> tuple[Read, Write, int]:
    """A reader, a writer and the fewest bytes of one field's value (an element's, for an array,
    before its count)."""
    optional = field.nullable is not None or default is None
    kind = field.type
    if isinstance(kind, type):
        read, write, least = _struct(kind, version, flexible)
        if not field.array and field.nullable is not None and version >= field.nullable:
            read, write, least = _nullable(read, write)
    elif kind in _FIXED:
        packer = _FIXED[kind]
        pack = packer.pack

        def read(reader: Reader) -> Any:
            return reader.fixed(packer)

        def write(out: list[bytes], value: Any) -> None:
            out.append(pack(value))

        least = packer.size
    elif kind == "string":
        read, write, least = _text(optional and not field.array, flexible)
    else:  # bytes, records
        read, write, least = _bytes(optional, flexible)
    if not field.array:
        return read, write, least
    return (*_array(read, write, least, optional, flexible), 1 if flexible else 4)


def _nullable(read: Read, write: Write) -> tuple[Read, Write, int]:
    """A struct that may be null (not in an array): an int8 before it, -1 null, 1 present."""
    marker = _FIXED["int8"]

    def read_nullable(reader: Reader) -> Any:
        present = reader.fixed(marker)
        if present == -1:
            return None
        if present != 1:
            raise MalformedKafka(f"a nullable struct's marker is {present}, not -1 or 1")
        return read(reader)

    def write_nullable(out: list[bytes], value: Any) -> None:
        if value is None:
            out.append(b"\xff")
        else:
            out.append(b"\x01")
            write(out, value)

    return read_nullable, write_nullable, 1


def _text(optional: bool, compact: bool) -> tuple[Read, Write, int]:
    empty = None if optional else ""
    length = _length(compact, _INT16)
    null = length(-1)

    def read(reader: Reader) -> str | None:
        size = reader.size(compact, _INT16)
        return empty if size == -1 else reader.text(size)

    def write(out: list[bytes], value: str | None) -> None:
        if value is None:
            out.append(null)
        else:
            data = value.encode()
            out.append(length(len(data)))
            out.append(data)

    return read, write, 1 if compact else 2


def _bytes(optional: bool, compact: bool) -> tuple[Read, Write, int]:
    empty = None if optional else b""
    length = _length(compact)
    null = length(-1)

    def read(reader: Reader) -> bytes | None:
        size = reader.size(compact)
        return empty if size == -1 else reader.take(size)

    def write(out: list[bytes], value: bytes | memoryview | None) -> None:
        if value is None:
            out.append(null)
        else:
            out.append(length(len(value)))
            out.append(value)  # type: ignore[arg-type]  # a memoryview joins as bytes do

    return read, write, 1 if compact else 4


def _array(
    element: Read, put: Write, least: int, optional: bool, compact: bool
) -> tuple[Read, Write]:
    empty: tuple[()] | None = None if optional else ()
    length = _length(compact)
    null = length(-1)

    def read(reader: Reader) -> list[Any] | tuple[()] | None:
        count = reader.count(compact, least)
        return empty if count == -1 else [element(reader) for _ in range(count)]

    def write(out: list[bytes], values: Any) -> None:
        if values is None:
            out.append(null)
            return
        out.append(length(len(values)))
        for value in values:
            put(out, value)

    return read, write


_STRUCTS: dict[tuple[type[Struct], int, bool], tuple[Read, Write, int]] = {}


def _struct(cls: type[Struct], version: int, flexible: bool) -> tuple[Read, Write, int]:
    """`cls` in a message of `version` (its fields' versions are the message's)."""
    found = _STRUCTS.get((cls, version, flexible))
    if found is None:
        found = _STRUCTS[cls, version, flexible] = _compile(cls, version, flexible)
    return found


def _compile(cls: type[Struct], version: int, flexible: bool) -> tuple[Read, Write, int]:
    declared = dataclass_fields(cls)  # type: ignore[arg-type]
    if [f.name for f in declared] != [f.name for f in cls.FIELDS]:
        raise TypeError(f"{cls.__name__}: FIELDS are not its dataclass fields in order")
    template = [f.default for f in declared]
    reads: list[tuple[int, Read]] = []
    writes: list[tuple[Callable[[Any], Any], Write]] = []
    least = 1 if flexible else 0  # the tagged fields' count
    for index, field in enumerate(cls.FIELDS):
        if not field.within(version):
            continue
        read, write, size = _field(field, template[index], version, flexible)
        reads.append((index, read))
        writes.append((attrgetter(field.name), write))
        least += size

    def read_struct(reader: Reader) -> Struct:
        values = template.copy()
        for index, read in reads:
            values[index] = read(reader)
        if flexible:
            reader.tagged()
        return cls(*values)

    def write_struct(out: list[bytes], value: Struct) -> None:
        for get, write in writes:
            write(out, get(value))
        if flexible:
            out.append(b"\x00")  # no tagged fields

    return read_struct, write_struct, least


@dataclass(frozen=True, slots=True)
class Layout(Generic[M]):
    """One message class at one version: how its body reads and writes."""

    message: type[M]
    version: int
    flexible: bool
    read: Callable[[Reader], M]
    write: Callable[[list[bytes], M], None]


def layout(message: type[M], version: int) -> Layout[M]:
    low, high = message.VERSIONS
    if not low <= version <= high:
        raise ValueError(f"{message.__name__} is served at versions {low}-{high}, not {version}")
    flexible = message.FLEXIBLE_FROM is not None and version >= message.FLEXIBLE_FROM
    read, write, _least = _struct(message, version, flexible)
    return Layout(message, version, flexible, read, write)


def read_header(body: bytes, flexible: bool) -> tuple[RequestHeader, Reader]:
    """The request header (v1; v2 with tagged fields when the API version is flexible) and a
    reader positioned at the body."""
    key, version, correlation = peek_header(body)
    reader = Reader(body, _HEADER.size)
    client_id = reader.string()
    if flexible:
        reader.tagged()
    return RequestHeader(key, version, correlation, client_id), reader


def decode_body(reader: Reader, layout: Layout[M]) -> M:
    """The body as its message class; bytes left over after the last field are an error: the
    peer and the server disagree on the version."""
    message = layout.read(reader)
    if reader.left and not (layout.flexible and layout.message.API_KEY in _TRAILING_IGNORED):
        raise MalformedKafka(f"{reader.left} bytes left after the request's last field")
    return message


def decode_request(body: bytes, layout: Layout[M], inline: int) -> tuple[RequestHeader, M, int]:
    """The header, the body and the array elements it holds; `Deferred` past `inline` elements
    (`MAX_ELEMENTS`: never)."""
    header, reader = read_header(body, layout.flexible)
    reader.inline = inline
    message = decode_body(reader, layout)
    return header, message, reader.elements


def encode(layout: Layout[M], message: M) -> bytes:
    """A body alone (a request's, in tests and tools)."""
    out: list[bytes] = []
    layout.write(out, message)
    return b"".join(out)


def encode_response(
    correlation_id: int, layout: Layout[M], message: M, *, flexible_header: bool = False
) -> bytes:
    """A whole response frame: size, header (v0; v1 adds empty tagged fields), body. Record data
    is copied once, into the frame."""
    out = [b"", _SIZE.pack(correlation_id)]
    if flexible_header:
        out.append(b"\x00")
    layout.write(out, message)
    out[0] = _SIZE.pack(sum(map(len, out)))
    return b"".join(out)


_ARRAYS: dict[type[Struct], tuple[tuple[str, bool], ...]] = {}


def _arrays(cls: type[Struct]) -> tuple[tuple[str, bool], ...]:
    """(name, of structs) of each array field of `cls`."""
    found = _ARRAYS.get(cls)
    if found is None:
        found = _ARRAYS[cls] = tuple(
            (f.name, isinstance(f.type, type)) for f in cls.FIELDS if f.array
        )
    return found


def many(message: Struct, limit: int = INLINE_ELEMENTS) -> bool:
    """Whether a message holds more than `limit` array elements (counted until it does, so the
    count costs `limit` steps at most): such an answer is encoded off the loop."""
    count = 0
    stack = [message]
    while stack:
        value = stack.pop()
        for name, nested in _arrays(type(value)):
            items = getattr(value, name)
            if items:
                count += len(items)
                if count > limit:
                    return True
                if nested:
                    stack.extend(items)
    return False


def encode_error_only(correlation_id: int, error_code: int) -> bytes:
    """A response carrying only an error code after its header (UNSUPPORTED_VERSION for an API
    or version not served: the layout of ApiVersions v0, which every client can read)."""
    return _SIZE.pack(6) + _SIZE.pack(correlation_id) + _INT16.pack(error_code)


def encode_sasl_token(token: bytes = b"") -> bytes:
    """A bare SASL token frame (after a SaslHandshake v0): its size, then its bytes."""
    return _SIZE.pack(len(token)) + token
