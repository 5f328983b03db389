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
from wire.errors import ErrorCode, HeadwaterError
from wire.records import Compression

__all__ = [
    "AtLeastOnce",
    "AtMostOnce",
    "Client",
    "Compression",
    "Consumer",
    "ErrorCode",
    "HeadwaterError",
    "Isolation",
    "Message",
    "Producer",
    "ProducerConfig",
    "RecordMetadata",
    "RetryPolicy",
    "RetryStrategy",
    "SendFuture",
    "connect",
]
