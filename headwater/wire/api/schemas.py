"""Schemas: REGISTER_SCHEMA (40), GET_SCHEMA (41), LIST_SCHEMAS (42), CHECK_SCHEMA (43).

No fast paths: schema requests are admin traffic. A definition travels as int32-length bytes (the
server caps it, docs/SCHEMAS.md), types and compatibility modes as their names, so a value the
server does not know is answered with INVALID_SCHEMA naming it rather than failing the frame.
"""

from __future__ import annotations

from typing import Final

from construct import Flag, Int32sb, Int64sb, PrefixedArray

from headwater.wire import messages as m
from headwater.wire.api.base import Api, Bytes, String, message

SCHEMA_INFO = message(
    m.SchemaInfo,
    "topic" / String,
    "version" / Int32sb,
    "schema_type" / String,
    "definition" / Bytes,
    "registered_ms" / Int64sb,
)

APIS: Final = (
    Api(
        m.ApiKey.REGISTER_SCHEMA,
        message(
            m.RegisterSchemaRequest,
            "topic" / String,
            "schema_type" / String,
            "definition" / Bytes,
            "compatibility" / String,
        ),
        message(m.RegisterSchemaResponse, "version" / Int32sb, "created" / Flag),
    ),
    Api(
        m.ApiKey.GET_SCHEMA,
        message(m.GetSchemaRequest, "topic" / String, "version" / Int32sb),
        message(m.GetSchemaResponse, "schema" / SCHEMA_INFO, "compatibility" / String),
    ),
    Api(
        m.ApiKey.LIST_SCHEMAS,
        message(m.ListSchemasRequest, "topic" / String),
        message(
            m.ListSchemasResponse,
            "compatibility" / String,
            "versions" / PrefixedArray(Int32sb, SCHEMA_INFO),
        ),
    ),
    Api(
        m.ApiKey.CHECK_SCHEMA,
        message(
            m.CheckSchemaRequest,
            "topic" / String,
            "schema_type" / String,
            "definition" / Bytes,
            "compatibility" / String,
        ),
        message(
            m.CheckSchemaResponse,
            "compatible" / Flag,
            "existing_version" / Int32sb,
            "reasons" / PrefixedArray(Int32sb, String),
        ),
    ),
)
