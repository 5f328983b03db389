"""Topic configs shown and changed.

Written by tools/kafka_messages.py from Kafka's JSON message specs: do not edit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from headwater.server.kafka.messages.declare import Field, Message, Struct

__all__ = [
    "AlterConfigsRequest",
    "AlterConfigsResource",
    "AlterConfigsResourceResponse",
    "AlterConfigsResponse",
    "AlterableConfig",
    "DescribeConfigsRequest",
    "DescribeConfigsResource",
    "DescribeConfigsResourceResult",
    "DescribeConfigsResponse",
    "DescribeConfigsResult",
    "DescribeConfigsSynonym",
    "IncrementalAlterConfigsAlterConfigsResource",
    "IncrementalAlterConfigsAlterConfigsResourceResponse",
    "IncrementalAlterConfigsAlterableConfig",
    "IncrementalAlterConfigsRequest",
    "IncrementalAlterConfigsResponse",
]


@dataclass(frozen=True, slots=True)
class DescribeConfigsResource(Struct):
    resource_type: int = 0
    resource_name: str = ""
    configuration_keys: Sequence[str] | None = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("resource_type", "int8", 0),
        Field("resource_name", "string", 0),
        Field("configuration_keys", "string", 0, array=True, nullable=0),
    )


@dataclass(frozen=True, slots=True)
class DescribeConfigsRequest(Message):
    """DescribeConfigs request, versions 0-2."""

    API_KEY: ClassVar[int] = 32
    VERSIONS: ClassVar[tuple[int, int]] = (0, 2)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    resources: Sequence[DescribeConfigsResource] = ()
    include_synonyms: bool = False
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("resources", DescribeConfigsResource, 0, array=True),
        Field("include_synonyms", "bool", 1),
    )


@dataclass(frozen=True, slots=True)
class DescribeConfigsSynonym(Struct):
    name: str = ""
    value: str | None = ""
    source: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 1),
        Field("value", "string", 1, nullable=0),
        Field("source", "int8", 1),
    )


@dataclass(frozen=True, slots=True)
class DescribeConfigsResourceResult(Struct):
    name: str = ""
    value: str | None = ""
    read_only: bool = False
    config_source: int = -1
    is_default: bool = False
    is_sensitive: bool = False
    synonyms: Sequence[DescribeConfigsSynonym] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("value", "string", 0, nullable=0),
        Field("read_only", "bool", 0),
        Field("config_source", "int8", 1),
        Field("is_default", "bool", 0, 0),
        Field("is_sensitive", "bool", 0),
        Field("synonyms", DescribeConfigsSynonym, 1, array=True),
    )


@dataclass(frozen=True, slots=True)
class DescribeConfigsResult(Struct):
    error_code: int = 0
    error_message: str | None = ""
    resource_type: int = 0
    resource_name: str = ""
    configs: Sequence[DescribeConfigsResourceResult] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("error_code", "int16", 0),
        Field("error_message", "string", 0, nullable=0),
        Field("resource_type", "int8", 0),
        Field("resource_name", "string", 0),
        Field("configs", DescribeConfigsResourceResult, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class DescribeConfigsResponse(Message):
    """DescribeConfigs response, versions 0-2."""

    API_KEY: ClassVar[int] = 32
    VERSIONS: ClassVar[tuple[int, int]] = (0, 2)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    results: Sequence[DescribeConfigsResult] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("results", DescribeConfigsResult, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class AlterableConfig(Struct):
    name: str = ""
    value: str | None = ""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("value", "string", 0, nullable=0),
    )


@dataclass(frozen=True, slots=True)
class AlterConfigsResource(Struct):
    resource_type: int = 0
    resource_name: str = ""
    configs: Sequence[AlterableConfig] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("resource_type", "int8", 0),
        Field("resource_name", "string", 0),
        Field("configs", AlterableConfig, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class AlterConfigsRequest(Message):
    """AlterConfigs request, versions 0-1."""

    API_KEY: ClassVar[int] = 33
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    resources: Sequence[AlterConfigsResource] = ()
    validate_only: bool = False
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("resources", AlterConfigsResource, 0, array=True),
        Field("validate_only", "bool", 0),
    )


@dataclass(frozen=True, slots=True)
class AlterConfigsResourceResponse(Struct):
    error_code: int = 0
    error_message: str | None = ""
    resource_type: int = 0
    resource_name: str = ""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("error_code", "int16", 0),
        Field("error_message", "string", 0, nullable=0),
        Field("resource_type", "int8", 0),
        Field("resource_name", "string", 0),
    )


@dataclass(frozen=True, slots=True)
class AlterConfigsResponse(Message):
    """AlterConfigs response, versions 0-1."""

    API_KEY: ClassVar[int] = 33
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    responses: Sequence[AlterConfigsResourceResponse] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("responses", AlterConfigsResourceResponse, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class IncrementalAlterConfigsAlterableConfig(Struct):
    name: str = ""
    config_operation: int = 0
    value: str | None = ""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("name", "string", 0),
        Field("config_operation", "int8", 0),
        Field("value", "string", 0, nullable=0),
    )


@dataclass(frozen=True, slots=True)
class IncrementalAlterConfigsAlterConfigsResource(Struct):
    resource_type: int = 0
    resource_name: str = ""
    configs: Sequence[IncrementalAlterConfigsAlterableConfig] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("resource_type", "int8", 0),
        Field("resource_name", "string", 0),
        Field("configs", IncrementalAlterConfigsAlterableConfig, 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class IncrementalAlterConfigsRequest(Message):
    """IncrementalAlterConfigs request, versions 0-0."""

    API_KEY: ClassVar[int] = 44
    VERSIONS: ClassVar[tuple[int, int]] = (0, 0)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    resources: Sequence[IncrementalAlterConfigsAlterConfigsResource] = ()
    validate_only: bool = False
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("resources", IncrementalAlterConfigsAlterConfigsResource, 0, array=True),
        Field("validate_only", "bool", 0),
    )


@dataclass(frozen=True, slots=True)
class IncrementalAlterConfigsAlterConfigsResourceResponse(Struct):
    error_code: int = 0
    error_message: str | None = ""
    resource_type: int = 0
    resource_name: str = ""
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("error_code", "int16", 0),
        Field("error_message", "string", 0, nullable=0),
        Field("resource_type", "int8", 0),
        Field("resource_name", "string", 0),
    )


@dataclass(frozen=True, slots=True)
class IncrementalAlterConfigsResponse(Message):
    """IncrementalAlterConfigs response, versions 0-0."""

    API_KEY: ClassVar[int] = 44
    VERSIONS: ClassVar[tuple[int, int]] = (0, 0)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    throttle_time_ms: int = 0
    responses: Sequence[IncrementalAlterConfigsAlterConfigsResourceResponse] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("throttle_time_ms", "int32", 0),
        Field("responses", IncrementalAlterConfigsAlterConfigsResourceResponse, 0, array=True),
    )
