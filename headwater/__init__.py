"""Headwater's Python client: `await headwater.connect()` returns a `Client` with topic admin,
producers and consumers. The `headwater` command line lives in `headwater.cli`."""

from headwater.client import Client, Consumer, Message, Tls, connect
from headwater.producer import (
    AtLeastOnce,
    AtMostOnce,
    Isolation,
    Producer,
    ProducerConfig,
    RecordMetadata,
    RetryPolicy,
    RetryStrategy,
    SendFuture,
)
from headwater.reconnect import ReconnectPolicy
from wire.errors import (
    AuthenticationFailed,
    ConnectionClosed,
    ConnectionLost,
    ErrorCode,
    HeadwaterError,
    NotAuthorized,
)
from wire.records import Compression

__all__ = [
    "AtLeastOnce",
    "AtMostOnce",
    "AuthenticationFailed",
    "Client",
    "Compression",
    "ConnectionClosed",
    "ConnectionLost",
    "Consumer",
    "ErrorCode",
    "HeadwaterError",
    "Isolation",
    "Message",
    "NotAuthorized",
    "Producer",
    "ProducerConfig",
    "ReconnectPolicy",
    "RecordMetadata",
    "RetryPolicy",
    "RetryStrategy",
    "SendFuture",
    "Tls",
    "connect",
]
