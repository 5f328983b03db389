"""Headwater's Python client: `await headwater.connect()` returns a `Client` with topic admin,
producers and consumers (the package `client`); the `headwater` command is the package `cli`
(`__main__` runs it as `python -m headwater`). The server is `server`, over `durables` (delivery
semantics without I/O), `storage` (bytes at rest) and `wire` (the protocol without I/O);
`spark_compaction` is the PySpark job. `testing` runs a real server in a child process, for tests
of applications and of Headwater itself. docs/ARCHITECTURE.md draws the packages and their
imports.

Every exception the client raises is a `HeadwaterError` subclass carrying the wire error code,
and every one is importable from here (`except headwater.TopicExists:`)."""

import importlib
from typing import TYPE_CHECKING, Any

from headwater.wire.errors import (
    AuthenticationFailed,
    AuthenticationRequired,
    CannotConnect,
    ConcurrentTransactions,
    ConnectionClosed,
    ConnectionLost,
    ConnectionTimeout,
    ConsumerBusy,
    CorruptBatch,
    DecompressedTooLarge,
    ErrorCode,
    FrameTooLarge,
    HeadwaterError,
    IncompatibleSchema,
    InvalidPartition,
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    InvalidRequest,
    InvalidSchema,
    InvalidTopicName,
    InvalidTransactionTimeout,
    InvalidTxnState,
    MalformedFrame,
    NotAuthorized,
    NotOwner,
    NotSupported,
    ObjectNotFound,
    OffsetOutOfRange,
    OutOfOrderSequence,
    OverMemoryBudget,
    PartitionOffline,
    ProducerFenced,
    ProtocolError,
    RecordTooLarge,
    RequestTimeout,
    RevisionMismatch,
    SchemaViolation,
    ServerShuttingDown,
    StorageError,
    SubscriptionTypeMismatch,
    TooManyConnections,
    TooManyConsumers,
    TooManySubscriptions,
    TopicExists,
    TransactionalIdNotAuthorized,
    TransactionalIdNotFound,
    TruncatedFrame,
    UnknownConsumer,
    UnknownProducerId,
    UnknownSchema,
    UnknownServerError,
    UnknownSubscription,
    UnknownTopic,
    UnsupportedApi,
    UnsupportedVersion,
    WrongPartition,
)

if TYPE_CHECKING:  # for type checkers; at run time `__getattr__` imports them on first use
    from headwater.client.client import Client, Consumer, Message, Tls, connect
    from headwater.client.message_batch import MessageBatch
    from headwater.client.producer import (
        AtLeastOnce,
        AtMostOnce,
        BatchSendFuture,
        Isolation,
        Producer,
        ProducerConfig,
        RecordMetadata,
        RetryPolicy,
        RetryStrategy,
        SendFuture,
        SentBatch,
    )
    from headwater.client.reconnect import ReconnectPolicy
    from headwater.client.schema_codec import SchemaCodec
    from headwater.wire.records import Compression

# The client's names, imported when first used: `import headwater.server...` (a server's start,
# the `headwater serve` command) then does not import the client library, about half of the
# import time a server start costs. `headwater.connect` and `from headwater import Client` work as
# before; the exceptions above are imported at once (they are cheap, and `except headwater.X`
# must not import anything).
_LAZY = {
    **dict.fromkeys(["Client", "Consumer", "Message", "Tls", "connect"], "headwater.client.client"),
    "MessageBatch": "headwater.client.message_batch",
    **dict.fromkeys(
        [
            "AtLeastOnce",
            "AtMostOnce",
            "BatchSendFuture",
            "Isolation",
            "Producer",
            "ProducerConfig",
            "RecordMetadata",
            "RetryPolicy",
            "RetryStrategy",
            "SendFuture",
            "SentBatch",
        ],
        "headwater.client.producer",
    ),
    "ReconnectPolicy": "headwater.client.reconnect",
    "SchemaCodec": "headwater.client.schema_codec",
    "Compression": "headwater.wire.records",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'headwater' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups find it without coming here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "AtLeastOnce",
    "AtMostOnce",
    "AuthenticationFailed",
    "AuthenticationRequired",
    "BatchSendFuture",
    "CannotConnect",
    "Client",
    "Compression",
    "ConcurrentTransactions",
    "ConnectionClosed",
    "ConnectionLost",
    "ConnectionTimeout",
    "Consumer",
    "ConsumerBusy",
    "CorruptBatch",
    "DecompressedTooLarge",
    "ErrorCode",
    "FrameTooLarge",
    "HeadwaterError",
    "IncompatibleSchema",
    "InvalidPartition",
    "InvalidProducerEpoch",
    "InvalidProducerIdMapping",
    "InvalidRequest",
    "InvalidSchema",
    "InvalidTopicName",
    "InvalidTransactionTimeout",
    "InvalidTxnState",
    "Isolation",
    "MalformedFrame",
    "Message",
    "MessageBatch",
    "NotAuthorized",
    "NotOwner",
    "NotSupported",
    "ObjectNotFound",
    "OffsetOutOfRange",
    "OutOfOrderSequence",
    "OverMemoryBudget",
    "PartitionOffline",
    "Producer",
    "ProducerConfig",
    "ProducerFenced",
    "ProtocolError",
    "ReconnectPolicy",
    "RecordMetadata",
    "RecordTooLarge",
    "RequestTimeout",
    "RetryPolicy",
    "RetryStrategy",
    "RevisionMismatch",
    "SchemaCodec",
    "SchemaViolation",
    "SendFuture",
    "SentBatch",
    "ServerShuttingDown",
    "StorageError",
    "SubscriptionTypeMismatch",
    "Tls",
    "TooManyConnections",
    "TooManyConsumers",
    "TooManySubscriptions",
    "TopicExists",
    "TransactionalIdNotAuthorized",
    "TransactionalIdNotFound",
    "TruncatedFrame",
    "UnknownConsumer",
    "UnknownProducerId",
    "UnknownSchema",
    "UnknownServerError",
    "UnknownSubscription",
    "UnknownTopic",
    "UnsupportedApi",
    "UnsupportedVersion",
    "WrongPartition",
    "connect",
]
