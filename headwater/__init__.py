"""Headwater's Python client: `await headwater.connect()` returns a `Client` with topic admin,
producers and consumers. The `headwater` command line lives in `headwater.cli`."""

from headwater.client import Client, Consumer, Message, connect
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
from wire.errors import ConnectionClosed, ConnectionLost, ErrorCode, HeadwaterError
from wire.records import Compression

__all__ = [
    "AtLeastOnce",
    "AtMostOnce",
    "Client",
    "Compression",
    "ConnectionClosed",
    "ConnectionLost",
    "Consumer",
    "ErrorCode",
    "HeadwaterError",
    "Isolation",
    "Message",
    "Producer",
    "ProducerConfig",
    "ReconnectPolicy",
    "RecordMetadata",
    "RetryPolicy",
    "RetryStrategy",
    "SendFuture",
    "connect",
]
