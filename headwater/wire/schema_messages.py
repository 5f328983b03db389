"""Schema requests and responses (docs/SCHEMAS.md): REGISTER_SCHEMA, GET_SCHEMA, LIST_SCHEMAS,
CHECK_SCHEMA. Re-exported by `wire.messages`, which would otherwise pass 500 lines. Types and
compatibility modes travel as their names."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "COMPATIBILITY_MODES",
    "LATEST_SCHEMA",
    "SCHEMA_TYPES",
    "SCHEMA_VERSION_HEADER",
    "CheckSchemaRequest",
    "CheckSchemaResponse",
    "GetSchemaRequest",
    "GetSchemaResponse",
    "ListSchemasRequest",
    "ListSchemasResponse",
    "RegisterSchemaRequest",
    "RegisterSchemaResponse",
    "SchemaInfo",
]

SCHEMA_TYPES = ("bytes", "string", "int64", "json", "avro")
COMPATIBILITY_MODES = ("none", "backward", "forward", "full")
SCHEMA_VERSION_HEADER = "hw-schema-version"  # on each record: the version its value was encoded by
LATEST_SCHEMA = -1  # GET_SCHEMA's version for the newest one


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    topic: str
    version: int  # 1, 2, ...
    schema_type: str  # one of SCHEMA_TYPES
    definition: bytes  # JSON Schema or Avro schema text; empty for bytes, string, int64, any JSON
    registered_ms: int


@dataclass(frozen=True, slots=True)
class RegisterSchemaRequest:
    """Add a version (or find an identical one). `compatibility`, if not empty, first sets the
    topic's mode, which then decides this registration."""

    topic: str
    schema_type: str
    definition: bytes = b""
    compatibility: str = ""


@dataclass(frozen=True, slots=True)
class RegisterSchemaResponse:
    version: int
    created: bool  # False: an identical version existed and is answered instead


@dataclass(frozen=True, slots=True)
class GetSchemaRequest:
    topic: str
    version: int = LATEST_SCHEMA


@dataclass(frozen=True, slots=True)
class GetSchemaResponse:
    schema: SchemaInfo
    compatibility: str


@dataclass(frozen=True, slots=True)
class ListSchemasRequest:
    topic: str


@dataclass(frozen=True, slots=True)
class ListSchemasResponse:
    """Every version without its definition (GET_SCHEMA gives that)."""

    compatibility: str
    versions: tuple[SchemaInfo, ...]


@dataclass(frozen=True, slots=True)
class CheckSchemaRequest:
    """Would REGISTER_SCHEMA accept this? Changes nothing."""

    topic: str
    schema_type: str
    definition: bytes = b""
    compatibility: str = ""


@dataclass(frozen=True, slots=True)
class CheckSchemaResponse:
    compatible: bool
    existing_version: int  # an identical version already registered, else 0
    reasons: tuple[str, ...]  # why not, when not compatible
