"""Headwater's Python client: `await headwater.connect()` returns a `Client` with topic admin,
producers and consumers. The `headwater` command line lives in `headwater.cli`."""

from headwater.client import (
    Client,
    Consumer,
    Message,
    Producer,
    RecordMetadata,
    SendFuture,
    connect,
)
from wire.errors import ErrorCode, HeadwaterError

__all__ = [
    "Client",
    "Consumer",
    "ErrorCode",
    "HeadwaterError",
    "Message",
    "Producer",
    "RecordMetadata",
    "SendFuture",
    "connect",
]
