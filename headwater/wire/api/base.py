"""Building blocks of the API families: the `Api` table entry, construct primitives, struct formats.

An `Api` names its request and response bodies as construct schemas (`DataclassAdapter`s over the
frozen dataclasses of `wire.messages`, so the declaration is the only description of the layout)
and may add struct fast paths. An API whose request gained fields has a `version` above 0 and keeps
the request layout of each older version in `older` (`older_message`: the fields it had, the others
taking their dataclass defaults), so a request of an older version still decodes. A fast path must
give the same bytes and the same values as the schema (tests/test_wire_roundtrip.py runs a corpus
through both); it exists where construct's interpreted parse (~20 us per frame) would dominate a
hot path. `decode_response` fast paths may return None to hand an unusual body to the schema, whose
error then names it.
"""

from __future__ import annotations

import dataclasses
import io
import struct
from collections.abc import Callable
from typing import Any, Final

from construct import (
    Adapter,
    Construct,
    ConstructError,
    GreedyBytes,
    Int16ub,
    Int32sb,
    ListContainer,
    PascalString,
    Prefixed,
    PrefixedArray,
    Struct,
)
from construct import Bytes as Bytes_

from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError, InvalidRequest, MalformedFrame


# construct ships no type hints: mypy sees its classes as Any, hence the ignores on subclasses
class DataclassAdapter(Adapter):  # type: ignore[misc]
    """Parses into a frozen dataclass (lists become tuples) and builds from one. `partial`: an
    older version's layout, which may leave out fields that have defaults."""

    def __init__(self, cls: type, subcon: Construct, partial: bool = False) -> None:
        super().__init__(subcon)
        self.cls = cls
        every = {f.name: f for f in dataclasses.fields(cls)}
        declared = [sc.name for sc in subcon.subcons]
        self.fields = declared if partial else list(every)
        missing = [
            name
            for name, f in every.items()
            if name not in declared
            and not (
                partial
                and (
                    f.default is not dataclasses.MISSING
                    or f.default_factory is not dataclasses.MISSING
                )
            )
        ]
        if not set(declared) <= set(every) or missing:
            raise TypeError(f"{cls.__name__}: schema fields {declared} != {list(every)}")

    def _decode(self, obj: Any, context: Any, path: Any) -> Any:
        values = {}
        for name in self.fields:
            value = obj[name]
            values[name] = tuple(value) if isinstance(value, list) else value
        return self.cls(**values)

    def _encode(self, obj: Any, context: Any, path: Any) -> Any:
        return {name: getattr(obj, name) for name in self.fields}


String = PascalString(Int16ub, "utf8")
Bytes = Prefixed(Int32sb, GreedyBytes)


class _NullableBytes(Adapter):  # type: ignore[misc]
    """int32 length (-1 for null) and the bytes."""

    def _decode(self, obj: Any, context: Any, path: Any) -> Any:
        return None if obj.length < 0 else bytes(obj.data)

    def _encode(self, obj: Any, context: Any, path: Any) -> Any:
        return {"length": -1, "data": b""} if obj is None else {"length": len(obj), "data": obj}


NullableBytes = _NullableBytes(
    Struct("length" / Int32sb, "data" / Bytes_(lambda this: max(this.length, 0)))
)


class BytesTuple(Adapter):  # type: ignore[misc]
    def _decode(self, obj: Any, context: Any, path: Any) -> Any:
        return tuple(bytes(item) for item in obj)

    def _encode(self, obj: Any, context: Any, path: Any) -> Any:
        return list(obj)


def over_limit(what: str, count: int, limit: int) -> InvalidRequest:
    return InvalidRequest(f"{what} holds {count} entries; at most {limit}")


class BoundedArray(Construct):  # type: ignore[misc]
    """`PrefixedArray(Int32sb, subcon)` whose count is checked before any element is parsed:
    over `limit` the request is refused (INVALID_REQUEST naming `what`, e.g. "CREATE_TOPIC
    configs"); a negative count is MALFORMED_FRAME. Builds exactly as `PrefixedArray`."""

    def __init__(self, limit: int, what: str, subcon: Construct) -> None:
        super().__init__()
        self.limit = limit
        self.what = what
        self.subcon = subcon
        self._plain = PrefixedArray(Int32sb, subcon)

    def _parse(self, stream: Any, context: Any, path: Any) -> Any:
        count = Int32sb._parsereport(stream, context, path)
        if count < 0:
            raise MalformedFrame(f"malformed {self.what}: negative count {count}")
        if count > self.limit:
            raise over_limit(self.what, count, self.limit)
        parse = self.subcon._parsereport
        return ListContainer(parse(stream, context, path) for _ in range(count))

    def _build(self, obj: Any, stream: Any, context: Any, path: Any) -> Any:
        return self._plain._build(obj, stream, context, path)


def message(cls: type, *fields: Any) -> DataclassAdapter:
    return DataclassAdapter(cls, Struct(*fields))


def older_message(cls: type, *fields: Any) -> DataclassAdapter:
    """An older version's layout of `cls`: the fields it had; the others take their defaults."""
    return DataclassAdapter(cls, Struct(*fields), partial=True)


EMPTY_RESPONSE = message(m.EmptyResponse)

ERROR_HEADER = struct.Struct(">h")
OK: Final = ERROR_HEADER.pack(0)
U16 = struct.Struct(">H")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")

# Fast paths: (request, correlation id, flags) -> frame; body -> request; (correlation id,
# response) -> frame; body after the error code -> response, or None for the schema to decide.
RequestEncoder = Callable[[Any, int, int], bytes]
RequestDecoder = Callable[[bytes], m.Request]
ResponseEncoder = Callable[[int, Any], bytes]
ResponseDecoder = Callable[[bytes], m.Response | None]
PushDecoder = Callable[[bytes], m.Push]


@dataclasses.dataclass(frozen=True, slots=True)
class Api:
    key: m.ApiKey
    request: DataclassAdapter
    response: DataclassAdapter
    encode_request: RequestEncoder | None = None
    decode_request: RequestDecoder | None = None
    encode_response: ResponseEncoder | None = None
    decode_response: ResponseDecoder | None = None
    version: int = 0  # the request's current version, which clients send
    older: tuple[DataclassAdapter, ...] = ()  # the request layouts of versions 0..version-1

    def __post_init__(self) -> None:
        if len(self.older) != self.version:
            raise TypeError(f"{self.key.name}: {self.version} older layouts expected")


@dataclasses.dataclass(frozen=True, slots=True)
class PushApi:
    key: m.ApiKey
    schema: DataclassAdapter
    decode: PushDecoder | None = None


def parse(schema: Construct, body: bytes, what: str) -> Any:
    try:
        return schema.parse(body)
    except (ConstructError, UnicodeDecodeError, ValueError, OverflowError) as exc:
        raise MalformedFrame(f"malformed {what}: {exc}") from None


def parse_request(schema: Construct, body: bytes, what: str) -> Any:
    """`parse`, and the body must end where the request ends (MALFORMED_FRAME otherwise)."""
    stream = io.BytesIO(body)
    try:
        value = schema.parse_stream(stream)
    except (ConstructError, UnicodeDecodeError, ValueError, OverflowError) as exc:
        raise MalformedFrame(f"malformed {what}: {exc}") from None
    if stream.tell() != len(body):
        raise MalformedFrame(
            f"malformed {what}: {len(body) - stream.tell()} bytes after the end of the request"
        )
    return value


def build(schema: Construct, value: Any) -> bytes:
    try:
        return bytes(schema.build(value))
    except (ConstructError, ValueError, OverflowError, TypeError) as exc:
        unencodable = exc if isinstance(exc, UnicodeEncodeError) else exc.__context__
        if isinstance(unencodable, UnicodeEncodeError):
            # text that is not UTF-8 (a shell's non-UTF-8 argument, surrogate-escaped): the
            # caller's request is refused here, before it is sent; not the server's error
            raise InvalidRequest(
                f"cannot encode {type(value).__name__}: {unencodable.object[:80]!r} is not "
                "UTF-8 text"
            ) from None
        raise HeadwaterError(f"cannot encode {type(value).__name__}: {exc}") from None


def take_topic(body: bytes, what: str) -> tuple[str, int]:
    """The leading topic name (uint16 length + UTF-8) and the position after it."""
    if len(body) < 2:
        raise MalformedFrame(f"malformed {what}: body shorter than its fixed fields")
    (topic_length,) = U16.unpack_from(body, 0)
    position = 2 + topic_length
    if len(body) < position:
        raise MalformedFrame(f"malformed {what}: topic name runs past the end of the frame")
    try:
        return body[2:position].decode(), position
    except UnicodeDecodeError:
        raise MalformedFrame(f"malformed {what}: topic name is not valid UTF-8") from None


class Reader:
    """A request body read field by field, for the struct fast paths: every read checks that the
    field fits (MALFORMED_FRAME naming the request otherwise), `count` checks an array's count
    against its maximum before its elements, `end` that nothing follows the last field. Reads
    the same values as the construct schema of the same layout."""

    __slots__ = ("body", "position", "what")

    def __init__(self, body: bytes, what: str) -> None:
        self.body = body
        self.position = 0
        self.what = what

    def fixed(self, layout: struct.Struct) -> tuple[Any, ...]:
        position = self.position
        if len(self.body) < position + layout.size:
            raise MalformedFrame(f"malformed {self.what}: fields run past the end of the frame")
        self.position = position + layout.size
        return layout.unpack_from(self.body, position)

    def string(self) -> str:
        (length,) = self.fixed(U16)
        data = self.take(length)
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise MalformedFrame(f"malformed {self.what}: a name is not valid UTF-8") from None

    def take(self, length: int) -> bytes:
        position = self.position
        if length < 0 or len(self.body) < position + length:
            raise MalformedFrame(f"malformed {self.what}: bytes run past the end of the frame")
        self.position = position + length
        return self.body[position : position + length]

    def blob(self) -> bytes:
        (length,) = self.fixed(I32)
        return self.take(length)

    def nullable_bytes(self) -> bytes | None:
        (length,) = self.fixed(I32)
        return None if length < 0 else self.take(length)

    def count(self, limit: int, field: str, element_size: int = 1) -> int:
        """An array's int32 count, at most `limit`, whose elements of at least `element_size`
        bytes each can fit in what is left of the body."""
        count: int = self.fixed(I32)[0]
        if count < 0:
            raise MalformedFrame(f"malformed {self.what}: negative {field} count {count}")
        if count > limit:
            raise over_limit(f"{self.what} {field}", count, limit)
        if count * element_size > len(self.body) - self.position:
            raise MalformedFrame(f"malformed {self.what}: {count} {field} cannot fit in the frame")
        return count

    def end(self) -> None:
        extra = len(self.body) - self.position
        if extra:
            raise MalformedFrame(
                f"malformed {self.what}: {extra} bytes after the end of the request"
            )
