"""What a Kafka message class declares about its wire form, for the codec to read and write it
at any version served: each field's type and the versions it is in (`Field`), in wire order.

A field absent in a version keeps its Kafka default (the dataclass default); a field nullable in
some version served is typed `X | None`. Arrays are `Sequence`s (lists when decoded)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final

LAST: Final = 0x7FFF  # "and every later version"
# the primitive types, as Kafka's JSON specs name them
PRIMITIVES: Final = frozenset(
    {
        "int8",
        "int16",
        "uint16",
        "int32",
        "int64",
        "float64",
        "bool",
        "string",
        "bytes",
        "records",
        "uuid",
    }
)


@dataclass(frozen=True, slots=True)
class Field:
    name: str  # the attribute: Kafka's field name in snake_case
    type: str | type[Struct]  # one of PRIMITIVES, or a struct (an array's element type)
    low: int = 0  # the versions the field is in
    high: int = LAST
    array: bool = False
    nullable: int | None = None  # null from this version on (a field's null says something)

    def within(self, version: int) -> bool:
        return self.low <= version <= self.high


class Struct:
    """A Kafka struct: a frozen dataclass whose `FIELDS` are its dataclass fields, in order."""

    __slots__ = ()
    FIELDS: ClassVar[tuple[Field, ...]] = ()


class Message(Struct):
    """A request or response body: a struct with an API key and the versions served."""

    __slots__ = ()
    API_KEY: ClassVar[int]
    VERSIONS: ClassVar[tuple[int, int]]
    FLEXIBLE_FROM: ClassVar[int | None] = None
