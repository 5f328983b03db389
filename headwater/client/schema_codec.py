"""Values by schema on the client: `SchemaCodec` encodes and decodes one schema version.

    codec = await client.schema_codec("orders")        # the latest version
    producer = client.producer("orders", schema="auto")  # encodes by it, names its version
    await producer.send({"id": 7, "item": "pen"})
    message = await consumer.receive()
    order = await message.decoded()                      # by the version the record names

Types: `bytes` (bytes as they are), `string` (str, UTF-8), `int64` (int, 8 bytes big-endian),
`json` (any JSON value; the server checks it against the JSON Schema, if any), `avro` (a dict,
Avro binary by fastavro; a missing field without default or an unknown one is refused here).
A codec of version 0 (the topic has no schema) is bytes and adds no header; the others add
`hw-schema-version` to each record, which the server requires on topics with a schema.

`SchemaAdmin` is the client's side of the schema requests; `Client` inherits it.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from headwater.wire import messages as m
from headwater.wire.errors import InvalidSchema, SchemaViolation

_INT64 = struct.Struct(">q")
Definition = str | bytes | Mapping[str, Any] | bool | None


def definition_bytes(definition: Definition) -> bytes:
    """A definition as the wire carries it: text as is, a dict as JSON."""
    if definition is None:
        return b""
    if isinstance(definition, bytes):
        return definition
    if isinstance(definition, str):
        return definition.encode()
    return json.dumps(definition).encode()


class SchemaCodec:
    def __init__(self, info: m.SchemaInfo) -> None:
        self.info = info
        self.version = info.version
        self.schema_type = info.schema_type
        self.header: tuple[str, bytes] | None = (
            (m.SCHEMA_VERSION_HEADER, str(info.version).encode()) if info.version > 0 else None
        )
        self._avro: Any = None
        self._fastavro: Any = None  # the module, kept so encode and decode do no import per value
        if info.schema_type == "avro":
            # fastavro is imported by the Avro paths only: most clients and every CLI command
            # without an Avro topic would pay its import for nothing
            import fastavro

            self._fastavro = fastavro
            try:
                self._avro = fastavro.parse_schema(json.loads(info.definition))
            except Exception as exc:
                raise InvalidSchema(f"avro schema version {info.version}: {exc}") from None
        elif info.schema_type not in m.SCHEMA_TYPES:
            raise InvalidSchema(f"unknown schema type {info.schema_type!r}")

    def __repr__(self) -> str:
        return f"SchemaCodec({self.info.topic!r}, version {self.version}, {self.schema_type})"

    def encode(self, value: Any) -> bytes | None:
        """The value's bytes; SchemaViolation if it cannot be encoded by this schema."""
        if value is None:
            return None
        kind = self.schema_type
        try:
            if kind == "bytes":
                if isinstance(value, bytes | bytearray | memoryview):
                    return bytes(value)
            elif kind == "string":
                if isinstance(value, str):
                    return value.encode()
            elif kind == "int64":
                if isinstance(value, int) and not isinstance(value, bool):
                    return _INT64.pack(value)
            elif kind == "json":
                return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
            else:
                stream = io.BytesIO()
                self._fastavro.schemaless_writer(
                    stream, self._avro, value, strict_allow_default=True
                )
                return stream.getvalue()
        except (TypeError, ValueError, OverflowError, struct.error, AttributeError) as exc:
            raise SchemaViolation(f"cannot encode {self._what(value)}: {exc}") from None
        raise SchemaViolation(f"cannot encode {self._what(value)}")

    def _what(self, value: Any) -> str:
        return f"a {type(value).__name__} by schema version {self.version} ({self.schema_type})"

    def decode(self, data: bytes | None) -> Any:
        if data is None:
            return None
        kind = self.schema_type
        try:
            if kind == "bytes":
                return data
            if kind == "string":
                return data.decode()
            if kind == "int64":
                return _INT64.unpack(data)[0]
            if kind == "json":
                return json.loads(data)
            return self._fastavro.schemaless_reader(io.BytesIO(data), self._avro, None)
        except (ValueError, struct.error, EOFError, IndexError) as exc:
            raise SchemaViolation(
                f"value of {len(data)} bytes does not decode by schema version {self.version} "
                f"({kind}): {exc}"
            ) from None


def version_of(headers: Sequence[tuple[str, bytes | None]]) -> int | None:
    """The schema version a record names, if any."""
    for name, raw in headers:
        if name == m.SCHEMA_VERSION_HEADER and raw is not None and raw.isdigit():
            return int(raw)
    return None


class SchemaAdmin:
    """The schema requests (docs/SCHEMAS.md), for `Client`."""

    async def request(self, request: m.Request, timeout: float | None = 30.0) -> m.Response:
        raise NotImplementedError

    async def register_schema(
        self,
        topic: str,
        schema_type: str,
        definition: Definition = None,
        *,
        compatibility: str | None = None,
    ) -> int:
        """Register a version (or find an identical one); its number. `compatibility` first
        sets the topic's mode. IncompatibleSchema when the mode refuses it."""
        response = await self.request(
            m.RegisterSchemaRequest(
                topic, schema_type, definition_bytes(definition), compatibility or ""
            )
        )
        assert isinstance(response, m.RegisterSchemaResponse)
        return response.version

    async def get_schema(self, topic: str, version: int | None = None) -> m.GetSchemaResponse:
        """A version (the latest by default; version 0 of type bytes if there is none)."""
        wanted = m.LATEST_SCHEMA if version is None else version
        response = await self.request(m.GetSchemaRequest(topic, wanted))
        assert isinstance(response, m.GetSchemaResponse)
        return response

    async def list_schemas(self, topic: str) -> m.ListSchemasResponse:
        response = await self.request(m.ListSchemasRequest(topic))
        assert isinstance(response, m.ListSchemasResponse)
        return response

    async def check_schema(
        self,
        topic: str,
        schema_type: str,
        definition: Definition = None,
        *,
        compatibility: str | None = None,
    ) -> m.CheckSchemaResponse:
        """Would `register_schema` accept it? Nothing changes."""
        response = await self.request(
            m.CheckSchemaRequest(
                topic, schema_type, definition_bytes(definition), compatibility or ""
            )
        )
        assert isinstance(response, m.CheckSchemaResponse)
        return response

    async def schema_codec(self, topic: str, version: int | None = None) -> SchemaCodec:
        return SchemaCodec((await self.get_schema(topic, version)).schema)


def schema_configs(
    schema: str | None, definition: Definition, compatibility: str | None
) -> dict[str, str]:
    """`create_topic`'s schema arguments as the topic's `schema.*` configs."""
    configs = {}
    if schema is not None:
        configs["schema.type"] = schema
    if definition is not None:
        configs["schema.definition"] = definition_bytes(definition).decode()
    if compatibility is not None:
        configs["schema.compatibility"] = compatibility
    return configs
