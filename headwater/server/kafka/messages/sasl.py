"""SASL authentication (PLAIN).

Written by tools/kafka_messages.py from Kafka's JSON message specs: do not edit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from headwater.server.kafka.messages.declare import Field, Message

__all__ = [
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "SaslHandshakeRequest",
    "SaslHandshakeResponse",
]


@dataclass(frozen=True, slots=True)
class SaslHandshakeRequest(Message):
    """SaslHandshake request, versions 0-1."""

    API_KEY: ClassVar[int] = 17
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    mechanism: str = ""
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("mechanism", "string", 0),)


@dataclass(frozen=True, slots=True)
class SaslHandshakeResponse(Message):
    """SaslHandshake response, versions 0-1."""

    API_KEY: ClassVar[int] = 17
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    error_code: int = 0
    mechanisms: Sequence[str] = ()
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("error_code", "int16", 0),
        Field("mechanisms", "string", 0, array=True),
    )


@dataclass(frozen=True, slots=True)
class SaslAuthenticateRequest(Message):
    """SaslAuthenticate request, versions 0-1."""

    API_KEY: ClassVar[int] = 36
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    auth_bytes: bytes = b""
    FIELDS: ClassVar[tuple[Field, ...]] = (Field("auth_bytes", "bytes", 0),)


@dataclass(frozen=True, slots=True)
class SaslAuthenticateResponse(Message):
    """SaslAuthenticate response, versions 0-1."""

    API_KEY: ClassVar[int] = 36
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    FLEXIBLE_FROM: ClassVar[int | None] = None
    error_code: int = 0
    error_message: str | None = ""
    auth_bytes: bytes = b""
    session_lifetime_ms: int = 0
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("error_code", "int16", 0),
        Field("error_message", "string", 0, nullable=0),
        Field("auth_bytes", "bytes", 0),
        Field("session_lifetime_ms", "int64", 1),
    )
