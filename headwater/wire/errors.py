"""Error codes and the one exception hierarchy shared by the server and the clients.

Each error code is a stable int16 on the wire. Every exception raised for a protocol-level problem
is
a subclass of `HeadwaterError`, carries its `code`, and says whether retrying the same request can
succeed (`retriable`). `error_for_code` maps a code received in a response back to its exception
class, so a client raises the same type the server raised.
"""

from __future__ import annotations

import enum
from typing import ClassVar


class ErrorCode(enum.IntEnum):
    NONE = 0
    UNKNOWN_SERVER_ERROR = 1
    MALFORMED_FRAME = 2
    UNSUPPORTED_API = 3
    UNSUPPORTED_VERSION = 4
    FRAME_TOO_LARGE = 5
    TRUNCATED_FRAME = 6
    CORRUPT_BATCH = 7
    INVALID_REQUEST = 8
    UNKNOWN_TOPIC = 9
    INVALID_TOPIC_NAME = 10
    TOPIC_EXISTS = 11
    INVALID_PARTITION = 12
    CONSUMER_BUSY = 13
    UNKNOWN_CONSUMER = 14
    SUBSCRIPTION_TYPE_MISMATCH = 15
    NOT_SUPPORTED = 16
    SERVER_SHUTTING_DOWN = 17
    CONNECTION_CLOSED = 18
    REQUEST_TIMEOUT = 19
    STORAGE_ERROR = 20
    OUT_OF_ORDER_SEQUENCE = 21
    UNKNOWN_PRODUCER_ID = 22
    RECORD_TOO_LARGE = 23
    REVISION_MISMATCH = 24
    PARTITION_OFFLINE = 25
    DECOMPRESSED_TOO_LARGE = 26
    TOO_MANY_CONSUMERS = 27
    TOO_MANY_SUBSCRIPTIONS = 28
    TOO_MANY_CONNECTIONS = 29
    CONNECTION_TIMEOUT = 30
    UNKNOWN_SUBSCRIPTION = 31
    WRONG_PARTITION = 32
    AUTHENTICATION_FAILED = 33
    NOT_AUTHORIZED = 34
    AUTHENTICATION_REQUIRED = 35
    SCHEMA_VIOLATION = 36
    INVALID_SCHEMA = 37
    INCOMPATIBLE_SCHEMA = 38
    UNKNOWN_SCHEMA = 39
    NOT_OWNER = 40
    OVER_MEMORY_BUDGET = 41
    OFFSET_OUT_OF_RANGE = 42
    PRODUCER_FENCED = 43
    INVALID_PRODUCER_EPOCH = 44
    INVALID_TXN_STATE = 45
    CONCURRENT_TRANSACTIONS = 46
    INVALID_PRODUCER_ID_MAPPING = 47
    INVALID_TRANSACTION_TIMEOUT = 48
    TRANSACTIONAL_ID_NOT_FOUND = 49
    TRANSACTIONAL_ID_NOT_AUTHORIZED = 50


class HeadwaterError(Exception):
    """Root of every Headwater error. `code` is what travels on the wire."""

    code: ClassVar[ErrorCode] = ErrorCode.UNKNOWN_SERVER_ERROR
    retriable: ClassVar[bool] = False
    # how the error names itself to people (`headwater: error: LABEL: message`): the wire code's
    # name, unless a client-side error that shares a code says more
    label: ClassVar[str | None] = None

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.code.name.lower().replace("_", " "))
        self.message = str(self.args[0])

    def __str__(self) -> str:
        return f"{self.label or self.code.name}: {self.message}"


class UnknownServerError(HeadwaterError):
    code = ErrorCode.UNKNOWN_SERVER_ERROR


class ProtocolError(HeadwaterError):
    """The bytes do not form a valid frame or request."""

    code = ErrorCode.MALFORMED_FRAME


class MalformedFrame(ProtocolError):
    code = ErrorCode.MALFORMED_FRAME


class UnsupportedApi(ProtocolError):
    code = ErrorCode.UNSUPPORTED_API


class UnsupportedVersion(ProtocolError):
    code = ErrorCode.UNSUPPORTED_VERSION


class FrameTooLarge(ProtocolError):
    code = ErrorCode.FRAME_TOO_LARGE


class TruncatedFrame(ProtocolError):
    code = ErrorCode.TRUNCATED_FRAME


class CorruptBatch(ProtocolError):
    code = ErrorCode.CORRUPT_BATCH


class InvalidRequest(HeadwaterError):
    code = ErrorCode.INVALID_REQUEST


class UnknownTopic(HeadwaterError):
    code = ErrorCode.UNKNOWN_TOPIC


class InvalidTopicName(HeadwaterError):
    code = ErrorCode.INVALID_TOPIC_NAME


class TopicExists(HeadwaterError):
    code = ErrorCode.TOPIC_EXISTS


class InvalidPartition(HeadwaterError):
    code = ErrorCode.INVALID_PARTITION


class ConsumerBusy(HeadwaterError):
    """An Exclusive subscription already has its consumer."""

    code = ErrorCode.CONSUMER_BUSY


class UnknownConsumer(HeadwaterError):
    code = ErrorCode.UNKNOWN_CONSUMER


class SubscriptionTypeMismatch(HeadwaterError):
    """A consumer asked for a type other than the one the subscription already has."""

    code = ErrorCode.SUBSCRIPTION_TYPE_MISMATCH


class NotSupported(HeadwaterError):
    code = ErrorCode.NOT_SUPPORTED


class ServerShuttingDown(HeadwaterError):
    code = ErrorCode.SERVER_SHUTTING_DOWN
    retriable = True


class ConnectionClosed(HeadwaterError):
    """Raised client-side when the connection ends before a response arrives."""

    code = ErrorCode.CONNECTION_CLOSED
    retriable = True


class RequestTimeout(HeadwaterError):
    code = ErrorCode.REQUEST_TIMEOUT
    retriable = True


class StorageError(HeadwaterError):
    """Local disk or object store failure; the operation may succeed later."""

    code = ErrorCode.STORAGE_ERROR
    retriable = True


class ObjectNotFound(StorageError):
    pass


class OutOfOrderSequence(HeadwaterError):
    """An idempotent producer's batch does not follow its previous one (a gap)."""

    code = ErrorCode.OUT_OF_ORDER_SEQUENCE


class UnknownProducerId(HeadwaterError):
    code = ErrorCode.UNKNOWN_PRODUCER_ID


class RecordTooLarge(HeadwaterError):
    """Raised client-side: one record is larger than the producer's max request size."""

    code = ErrorCode.RECORD_TOO_LARGE


class RevisionMismatch(HeadwaterError):
    """A map compare-and-set found the key at another revision than expected."""

    code = ErrorCode.REVISION_MISMATCH


class PartitionOffline(HeadwaterError):
    """The partition refuses reads or writes until the server restarts: an fsync failed (the
    kernel may have dropped the unsynced pages, so nothing after the last good fsync can be
    trusted) or its storage is damaged beyond what recovery could keep online."""

    code = ErrorCode.PARTITION_OFFLINE


class DecompressedTooLarge(HeadwaterError):
    """A compressed batch inflates past the server's cap (a compression bomb, or simply too big)."""

    code = ErrorCode.DECOMPRESSED_TOO_LARGE


class TooManyConsumers(HeadwaterError):
    code = ErrorCode.TOO_MANY_CONSUMERS


class TooManySubscriptions(HeadwaterError):
    """The connection already holds as many consumers as the server allows one connection."""

    code = ErrorCode.TOO_MANY_SUBSCRIPTIONS


class TooManyConnections(HeadwaterError):
    code = ErrorCode.TOO_MANY_CONNECTIONS
    retriable = True


class ConnectionTimeout(HeadwaterError):
    """The server closed a connection that stayed idle, or sent an incomplete frame, too long."""

    code = ErrorCode.CONNECTION_TIMEOUT
    retriable = True


class UnknownSubscription(HeadwaterError):
    """The subscription does not exist (never created, or deleted)."""

    code = ErrorCode.UNKNOWN_SUBSCRIPTION


class WrongPartition(HeadwaterError):
    """On a last-value or map topic a keyed record must go to its key's partition."""

    code = ErrorCode.WRONG_PARTITION


class AuthenticationFailed(HeadwaterError):
    """The credential was refused (unknown, wrong, expired or revoked token; a certificate
    without grants; too many failures from this address). The server closes the connection."""

    code = ErrorCode.AUTHENTICATION_FAILED


class AuthenticationRequired(AuthenticationFailed):
    """A request other than AUTHENTICATE (or API_VERSIONS) before the handshake. The server
    closes the connection."""

    code = ErrorCode.AUTHENTICATION_REQUIRED


class NotAuthorized(HeadwaterError):
    """The principal has no grant for this action on this topic (or subscription)."""

    code = ErrorCode.NOT_AUTHORIZED


class SchemaViolation(HeadwaterError):
    """A produced record does not match its topic's schema: the whole batch is refused. The
    message starts with `record N:`, N the record's position in the batch (`record_index`)."""

    code = ErrorCode.SCHEMA_VIOLATION

    @property
    def record_index(self) -> int | None:
        head, _, _ = self.message.partition(":")
        number = head.removeprefix("record ")
        return int(number) if head.startswith("record ") and number.isdigit() else None


class InvalidSchema(HeadwaterError):
    """A schema definition that does not parse, is of an unknown type, or breaks a limit."""

    code = ErrorCode.INVALID_SCHEMA


class IncompatibleSchema(HeadwaterError):
    """The topic's compatibility mode refuses the new schema version."""

    code = ErrorCode.INCOMPATIBLE_SCHEMA


class UnknownSchema(HeadwaterError):
    """The topic has no schema version of that number (or no schema at all)."""

    code = ErrorCode.UNKNOWN_SCHEMA


class NotOwner(HeadwaterError):
    """In a cluster, this broker does not own the partition (now): the message is
    `owner=<broker id>@<host>:<port>` (or `owner=none` while nobody owns it), so a client can go
    there at once; it looks up again (LOOKUP) and retries."""

    code = ErrorCode.NOT_OWNER
    retriable = True

    @property
    def owner_address(self) -> tuple[str, int] | None:
        """(host, port) of the owner named in the message, None when there is none."""
        _, _, rest = self.message.partition("owner=")
        _, at, address = rest.split()[0].partition("@") if rest.split() else ("", "", "")
        host, colon, port = address.rpartition(":")
        if not at or not colon or not port.isdigit():
            return None
        return host, int(port)


class OverMemoryBudget(HeadwaterError):
    """The request would make the server hold bytes it can neither drop nor slow down, and the
    principal's memory share (or the server's budget) is spent: retry once the principal's
    consumers have taken what it holds (server/memory_budget.py)."""

    code = ErrorCode.OVER_MEMORY_BUDGET
    retriable = True


class OffsetOutOfRange(HeadwaterError):
    """A FETCH offset below the partition's start (retention or a snapshot took it) or above its
    next offset. The message ends `start=<start offset> next=<next offset>`, so a reader can
    pick where to go on."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE


class ProducerFenced(HeadwaterError):
    """A newer producer with the same transactional id has started (a higher epoch): this one
    can do nothing more with it; close it (its open transaction was aborted)."""

    code = ErrorCode.PRODUCER_FENCED


class InvalidProducerEpoch(HeadwaterError):
    """The batch's producer epoch is older than the one the partition knows: written by a
    producer a newer one (or a transaction timeout) fenced."""

    code = ErrorCode.INVALID_PRODUCER_EPOCH


class InvalidTxnState(HeadwaterError):
    """The request does not fit the transaction's state: a transactional batch to a partition
    not added to the transaction, an end of a transaction never begun, a commit after an
    abort began."""

    code = ErrorCode.INVALID_TXN_STATE


class ConcurrentTransactions(HeadwaterError):
    """The previous transaction of this transactional id is still being completed (its markers
    being written): retry in a moment."""

    code = ErrorCode.CONCURRENT_TRANSACTIONS
    retriable = True


class InvalidProducerIdMapping(HeadwaterError):
    """The producer id does not belong to the transactional id named."""

    code = ErrorCode.INVALID_PRODUCER_ID_MAPPING


class InvalidTransactionTimeout(HeadwaterError):
    """The transaction timeout asked for is out of the server's bounds."""

    code = ErrorCode.INVALID_TRANSACTION_TIMEOUT


class TransactionalIdNotFound(HeadwaterError):
    """No transactional id of that name is known to the coordinator."""

    code = ErrorCode.TRANSACTIONAL_ID_NOT_FOUND


class TransactionalIdNotAuthorized(NotAuthorized):
    """The principal may not use (or describe) this transactional id: it takes a grant on
    `txn:<id>` (Kafka's TransactionalId resource)."""

    code = ErrorCode.TRANSACTIONAL_ID_NOT_AUTHORIZED


_BY_CODE: dict[int, type[HeadwaterError]] = {}
for _cls in (
    UnknownServerError,
    MalformedFrame,
    UnsupportedApi,
    UnsupportedVersion,
    FrameTooLarge,
    TruncatedFrame,
    CorruptBatch,
    InvalidRequest,
    UnknownTopic,
    InvalidTopicName,
    TopicExists,
    InvalidPartition,
    ConsumerBusy,
    UnknownConsumer,
    SubscriptionTypeMismatch,
    NotSupported,
    ServerShuttingDown,
    ConnectionClosed,
    RequestTimeout,
    StorageError,
    OutOfOrderSequence,
    UnknownProducerId,
    RecordTooLarge,
    RevisionMismatch,
    PartitionOffline,
    DecompressedTooLarge,
    TooManyConsumers,
    TooManySubscriptions,
    TooManyConnections,
    ConnectionTimeout,
    UnknownSubscription,
    WrongPartition,
    AuthenticationFailed,
    NotAuthorized,
    AuthenticationRequired,
    SchemaViolation,
    InvalidSchema,
    IncompatibleSchema,
    UnknownSchema,
    NotOwner,
    OverMemoryBudget,
    OffsetOutOfRange,
    ProducerFenced,
    InvalidProducerEpoch,
    InvalidTxnState,
    ConcurrentTransactions,
    InvalidProducerIdMapping,
    InvalidTransactionTimeout,
    TransactionalIdNotFound,
    TransactionalIdNotAuthorized,
):
    _BY_CODE[_cls.code] = _cls


def error_for_code(code: int, message: str) -> HeadwaterError:
    """The exception a client raises for an error response with `code`."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return UnknownServerError(f"error code {code}: {message}")
    return cls(message)


class ConnectionLost(ConnectionClosed):
    """Raised client-side when the server or the network ended the connection: the server died,
    shut down, or the socket failed. Not sent on the wire (it shares CONNECTION_CLOSED); unlike
    a plain ConnectionClosed it never means the application closed the connection itself."""


class CannotConnect(ConnectionClosed):
    """Raised client-side when no connection could be opened at all (refused, unreachable, timed
    out): nothing was ever sent, unlike CONNECTION_CLOSED's lost connections. Not sent on the
    wire; it shares CONNECTION_CLOSED's code, and names itself CANNOT_CONNECT."""

    label = "CANNOT_CONNECT"
