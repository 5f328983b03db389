"""One frozen dataclass per request, response and pushed frame (`AckEntry`, one per acknowledged
message, is slots-only for speed), plus the enums they use.

These are plain values: how they become bytes is `wire.protocol`'s job (with the API families in
`wire.api`). Enum-valued fields hold plain ints on the wire (`sub_type`, `dispatch`): the server
checks them and answers an unknown value with `INVALID_REQUEST`, rather than the codec failing on
it as a malformed frame.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from headwater.wire.errors import ErrorCode
from headwater.wire.limits import MAX_TOPIC_NAME_LENGTH

# LookupTopic.unknown quotes a name in its message: at most one byte past any topic name's
_MAX_QUOTED = MAX_TOPIC_NAME_LENGTH + 1


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    SUBSCRIBE = 1
    FLOW = 2
    ACK = 3
    UNSUBSCRIBE = 4
    NACK = 5
    SEEK = 6
    DELETE_SUBSCRIPTION = 7
    INIT_PRODUCER_ID = 8
    FETCH = 9  # read a partition's log by offset, no subscription (docs/PROTOCOL.md)
    MAP_GET = 20
    MAP_SET = 21
    MAP_SCAN = 22
    MAP_SIZE = 23
    CREATE_TOPIC = 10
    DELETE_TOPIC = 11
    LIST_TOPICS = 12
    DESCRIBE_TOPIC = 13
    CREATE_PARTITIONS = 14
    ALTER_TOPIC_CONFIGS = 15
    LIST_SUBSCRIPTIONS = 16
    SERVER_INFO = 17
    API_VERSIONS = 18
    LOOKUP = 19  # which broker owns each partition of a topic (a cluster; docs/CLUSTER.md)
    AUTHENTICATE = 30
    REGISTER_SCHEMA = 40
    GET_SCHEMA = 41
    LIST_SCHEMAS = 42
    CHECK_SCHEMA = 43
    ACK_RANGES = 44  # ACK for runs of consecutive offsets: one entry per run, not per message
    OFFSET_FOR_TIME = 45  # where a FETCH reader starts to read from a time (docs/PROTOCOL.md)
    # transactions (docs/PROTOCOL.md, "Transactions"; docs/PRODUCING.md)
    INIT_TRANSACTIONS = 46
    ADD_PARTITIONS_TO_TXN = 47
    ADD_ACKS_TO_TXN = 48
    END_TXN = 49
    WRITE_TXN_MARKER = 50  # between brokers of a cluster: a marker at the partition's owner
    WRITE_TXN_ACKS = 51  # between brokers of a cluster: committed acks at the partition's owner
    # pushed by the server
    DELIVER = 100
    CONSUMER_CLOSED = 101
    MESSAGES_DROPPED = 102
    THROTTLE = 103


class SubscriptionType(enum.IntEnum):
    EXCLUSIVE = 0
    SHARED = 1
    FAILOVER = 2
    KEY_SHARED = 3  # a key's records go to one consumer at a time (a hash ring of consumers)


class DispatchMode(enum.IntEnum):
    NON_RELIABLE = 0
    RELIABLE = 1


class StartPosition(enum.IntEnum):
    """Where a new (or reset) reliable subscription starts reading."""

    LATEST = 0  # only messages produced from now on
    EARLIEST = 1  # the oldest message still stored (locally or in the object store)
    OFFSET = 2  # `start_value` is an offset, applied to every partition
    TIMESTAMP = 3  # `start_value` is a time in ms: the first message at or after it
    SNAPSHOT = 4  # the newest snapshot's rows (one per live key), then the log after its horizon


class AckKind(enum.IntEnum):
    INDIVIDUAL = 0
    CUMULATIVE = 1  # the offset and everything below it on that partition (not for Shared)


class Durable(enum.IntEnum):
    """What a subscription keeps (TIBCO FTL's durable types)."""

    DEFAULT = 0  # reliable topics: standard for Exclusive/Failover, shared for Shared
    NONE = 1  # nothing kept: live messages from now on
    STANDARD = 2  # one subscriber's stream (Exclusive or Failover), kept until acked
    SHARED = 3  # apportioned among subscribers (Shared), each message kept until one acks
    LAST_VALUE = 4  # the latest message per key: current values of the keys asked for, then updates
    MAP = 5  # a last-value durable that is also read and written with the MAP_* requests


class Isolation(enum.IntEnum):
    """When a reliable topic acknowledges a produce (see docs/PRODUCING.md): durability, not
    transactions. Until transactions came these were named READ_UNCOMMITTED and READ_COMMITTED,
    which read as Kafka's transaction isolation levels; those names stay as deprecated aliases
    of the same values (the wire carries the value only)."""

    APPENDED = 0  # once appended to the WAL (the OS has it)
    FSYNCED = 1  # once an fsync covers it, whatever the topic's fsync policy
    READ_UNCOMMITTED = 0  # deprecated: APPENDED
    READ_COMMITTED = 1  # deprecated: FSYNCED


class FetchIsolation(enum.IntEnum):
    """What a FETCH reads of a partition's transactions (docs/PROTOCOL.md, FETCH)."""

    # up to the last stable offset, without the transaction markers and the batches of aborted
    # transactions: what a transaction-aware reader (Kafka's read_committed) sees
    COMMITTED = 0
    # everything up to the readable end, markers and aborted batches included (the Kafka front
    # end's Fetch, which leaves the filtering to Kafka clients)
    RAW = 1


class Backoff(enum.IntEnum):
    FIXED = 0
    EXPONENTIAL = 1


@dataclass(frozen=True, slots=True)
class SubscriptionSettings:
    """Reliable subscriptions only; fixed when the subscription is created. 0 = server default."""

    start: int = StartPosition.LATEST
    start_value: int = 0
    ack_timeout_ms: int = 0
    max_deliveries: int = 0  # after this many deliveries a message goes to the dead-letter topic
    backoff: int = Backoff.EXPONENTIAL
    backoff_initial_ms: int = 0
    backoff_max_ms: int = 0
    committed_only: bool = False  # deliver only records an fsync already covers
    durable: int = Durable.DEFAULT
    keys: tuple[bytes, ...] = ()  # last-value: the keys wanted ...
    key_prefix: bytes | None = None  # ... and/or every key starting with this


# Requests


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    topic: str
    partition: int
    batch: bytes  # one Kafka RecordBatch v2, base offset 0 (the server stamps it)
    isolation: int = Isolation.APPENDED


@dataclass(frozen=True, slots=True)
class MapGetRequest:
    topic: str
    keys: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class MapWrite:
    key: bytes
    value: bytes | None  # None deletes the key (a tombstone record)
    expected_revision: int = -1  # wire.keys: ANY_REVISION (-1), ABSENT_REVISION (-2), or a revision


@dataclass(frozen=True, slots=True)
class MapSetRequest:
    topic: str
    writes: tuple[MapWrite, ...]


@dataclass(frozen=True, slots=True)
class MapScanRequest:
    topic: str
    prefix: bytes
    limit: int
    after: bytes  # resume after this key (the previous page's cursor); empty: from the start


@dataclass(frozen=True, slots=True)
class MapSizeRequest:
    topic: str


@dataclass(frozen=True, slots=True)
class InitProducerIdRequest:
    """Ask for a producer id, for idempotent produce (sequence numbers per partition)."""


@dataclass(frozen=True, slots=True)
class SubscribeRequest:
    topic: str
    subscription: str
    sub_type: int
    consumer_name: str
    priority: int = 0  # Failover: the lowest value is active; ties go to the first name
    initial_credits: int = 0
    settings: SubscriptionSettings = SubscriptionSettings()
    partitions: tuple[int, ...] = ()  # this consumer takes only these partitions; (): every one


@dataclass(frozen=True, slots=True)
class FlowRequest:
    consumer_id: int
    credits: int


@dataclass(slots=True, unsafe_hash=True)
class AckEntry:
    """One acknowledged (or nacked) message. The one message type that is not frozen: a consumer
    acking message by message makes one per message at each end, and a frozen dataclass sets its
    fields through object.__setattr__, which made building it 2.5x dearer (docs/DECISIONS.md).
    Nothing changes one after it is built; it hashes by value as a frozen one did."""

    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class AckRequest:
    consumer_id: int
    acks: tuple[AckEntry, ...]
    kind: int = AckKind.INDIVIDUAL


@dataclass(slots=True, unsafe_hash=True)
class AckRange:
    """`count` consecutive offsets of a partition from `first_offset`, acknowledged together.
    Not frozen, for AckEntry's reason: a consumer acking out of order makes one per message."""

    partition: int
    first_offset: int
    count: int


@dataclass(frozen=True, slots=True)
class AckRangesRequest:
    """Acknowledge each offset of each range (ACK kind 0 of every offset, in one entry a run)."""

    consumer_id: int
    ranges: tuple[AckRange, ...]


@dataclass(frozen=True, slots=True)
class NackRequest:
    """Give messages back for redelivery after `delay_ms` (0: the subscription's backoff)."""

    consumer_id: int
    acks: tuple[AckEntry, ...]
    delay_ms: int = 0


@dataclass(frozen=True, slots=True)
class SeekRequest:
    """Reset a reliable subscription's position; its unacknowledged messages are forgotten."""

    topic: str
    subscription: str
    start: int
    start_value: int = 0


@dataclass(frozen=True, slots=True)
class DeleteSubscriptionRequest:
    topic: str
    subscription: str


@dataclass(frozen=True, slots=True)
class UnsubscribeRequest:
    consumer_id: int


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """Read a reliable topic's partition from `offset`, with no subscription: the reader keeps
    its own offsets (a Spark query keeps them in its checkpoint). Up to `max_bytes` of batches
    (at least one batch when any is readable, however large), only below the readable end; at the
    end, waits up to `max_wait_ms` for data (a long poll)."""

    topic: str
    partition: int
    offset: int
    max_bytes: int = 1024 * 1024
    max_wait_ms: int = 0
    isolation: int = FetchIsolation.COMMITTED  # version 1; a version 0 request reads COMMITTED


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str


@dataclass(frozen=True, slots=True)
class CreateTopicRequest:
    name: str
    partitions: int = 1
    dispatch: int = DispatchMode.NON_RELIABLE
    configs: tuple[ConfigEntry, ...] = ()  # per-topic settings, see docs/CONFIGURATION.md


@dataclass(frozen=True, slots=True)
class DeleteTopicRequest:
    name: str


@dataclass(frozen=True, slots=True)
class ListTopicsRequest:
    pass


@dataclass(frozen=True, slots=True)
class DescribeTopicRequest:
    name: str


@dataclass(frozen=True, slots=True)
class ApiVersionsRequest:
    pass


@dataclass(frozen=True, slots=True)
class AuthenticateRequest:
    """The handshake (docs/SECURITY.md): `mechanism` "token" with the token's bytes, or
    "certificate" (empty credentials) to be known by the TLS client certificate."""

    mechanism: str
    credentials: bytes


# Responses


@dataclass(frozen=True, slots=True)
class EmptyResponse:
    pass


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    partition: int
    base_offset: int


@dataclass(frozen=True, slots=True)
class MapEntry:
    key: bytes
    found: bool
    revision: int  # the offset of the record holding the value
    partition: int
    timestamp: int
    value: bytes | None


@dataclass(frozen=True, slots=True)
class MapGetResponse:
    entries: tuple[MapEntry, ...]


@dataclass(frozen=True, slots=True)
class MapSetResponse:
    revisions: tuple[int, ...]  # per write: the new revision (the record's offset)


@dataclass(frozen=True, slots=True)
class MapScanResponse:
    entries: tuple[MapEntry, ...]
    cursor: bytes  # pass as `after` for the next page; empty when the scan is complete


@dataclass(frozen=True, slots=True)
class MapSizeResponse:
    size: int


@dataclass(frozen=True, slots=True)
class InitProducerIdResponse:
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class SubscribeResponse:
    consumer_id: int


@dataclass(frozen=True, slots=True)
class OffsetForTimeRequest:
    """Where to FETCH from to read `topic`'s `partition` from a time: `timestamp` in ms since the
    epoch, or -2 for the partition's start and -1 for its readable end."""

    topic: str
    partition: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class OffsetForTimeResponse:
    # the first offset of the first batch whose newest record is at or after the time (so records
    # just before it may come first), or the readable end when no readable record is that recent
    offset: int


@dataclass(frozen=True, slots=True)
class FetchResponse:
    start_offset: int  # the oldest offset still stored (object store or local)
    end_offset: int  # the readable end: every offset below it may be fetched; a FETCH there waits
    # whole record batches as stored, back to back, base offsets stamped: the first may start
    # below the offset asked for (the batch holding it) or above it (past damage or a gap)
    records: bytes
    # where the next FETCH goes on: after the last batch read, sent or left out (a marker, an
    # aborted transaction's batch), or the offset asked for when none was
    next_offset: int


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: int
    dispatch: int
    configs: tuple[ConfigEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class ListTopicsResponse:
    topics: tuple[TopicInfo, ...]


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    consumer_id: int
    name: str
    priority: int
    credits: int
    active: bool


@dataclass(frozen=True, slots=True)
class SubscriptionInfo:
    name: str
    sub_type: int
    pending: int  # messages held for the subscription, not yet sent to a consumer
    delivered: int
    dropped: int  # messages lost because the subscription's consumers were too slow
    consumers: tuple[ConsumerInfo, ...]
    unacked: int = 0  # reliable: delivered and not yet acknowledged
    dead_lettered: int = 0  # reliable: moved to the dead-letter topic


@dataclass(frozen=True, slots=True)
class DescribeTopicResponse:
    topic: TopicInfo
    next_offsets: tuple[int, ...]  # per partition, the offset the next message will get
    start_offsets: tuple[int, ...]  # per partition, the oldest offset still stored
    messages_in: int
    bytes_in: int
    subscriptions: tuple[SubscriptionInfo, ...]
    partitions: tuple[PartitionInfo, ...] = ()  # storage per partition (reliable topics)


@dataclass(frozen=True, slots=True)
class ApiVersionRange:
    api_key: int
    min_version: int
    max_version: int


@dataclass(frozen=True, slots=True)
class ApiVersionsResponse:
    apis: tuple[ApiVersionRange, ...]


@dataclass(frozen=True, slots=True)
class AuthenticateResponse:
    principal: str  # empty: the server does not authenticate (anyone may do anything)
    expires_ms: int  # when the credential expires (ms since the epoch); 0: never


# Pushed by the server


@dataclass(frozen=True, slots=True)
class Delivery:
    """Records for a consumer. The consumer id travels in the header's correlation id field."""

    partition: int
    delivery_count: int  # 1 on first delivery; more when redelivered (reliable topics)
    batch: bytes


@dataclass(frozen=True, slots=True)
class ConsumerClosed:
    """The server ended a consumer (e.g. its topic was deleted); no more deliveries will come."""

    error_code: int
    message: str


@dataclass(frozen=True, slots=True)
class MessagesDropped:
    """Non-reliable topics: the subscription dropped `count` messages since the last notice
    because its consumers had no credit and its backlog was full. The consumer missed them."""

    count: int


@dataclass(frozen=True, slots=True)
class Throttle:
    """The principal is over its produce quota: the server reads nothing more from this
    connection for `throttle_ms`, and the client should hold its produce requests that long.
    Sent with correlation id 0."""

    throttle_ms: int


# ------------------------------------------------------------------------------------------------
# The admin requests for operators: ALTER_TOPIC_CONFIGS, LIST_SUBSCRIPTIONS, SERVER_INFO,
# CREATE_PARTITIONS, and the per-partition storage DESCRIBE_TOPIC reports.


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition of a reliable topic, as DESCRIBE_TOPIC reports it."""

    partition: int
    start_offset: int  # the oldest offset still stored (object store or local)
    next_offset: int
    local_start_offset: int  # the oldest offset in the local WAL
    size_bytes: int  # local WAL bytes
    segments: int  # local WAL segments (the open one included)
    uploaded_offset: int  # offsets below this are in the object store; -1: no object store
    upload_lag_offsets: int  # offsets held only locally (not yet uploaded)
    upload_lag_bytes: int  # bytes of the local segments not yet uploaded


@dataclass(frozen=True, slots=True)
class AlterTopicConfigsRequest:
    """Change some of a topic's configs; the ones not named keep their values."""

    name: str
    configs: tuple[ConfigEntry, ...]


@dataclass(frozen=True, slots=True)
class AlterTopicConfigsResponse:
    topic: TopicInfo  # with every config as it is now


@dataclass(frozen=True, slots=True)
class ListSubscriptionsRequest:
    topic: str  # empty: the subscriptions of every topic


@dataclass(frozen=True, slots=True)
class SubscriptionPartition:
    partition: int
    committed: int  # every offset below this is acknowledged
    dispatched: int  # the first offset never delivered
    next_offset: int  # the partition's
    backlog: int  # never delivered yet
    lag: int  # not acknowledged yet: backlog + unacked + redelivering
    unacked: int  # delivered to a consumer, awaiting its ack
    redelivering: int  # delivered, not acknowledged, waiting to be delivered again
    dead_lettered: int  # moved to the dead-letter topic since the server started


@dataclass(frozen=True, slots=True)
class SubscriptionDetail:
    topic: str
    name: str
    sub_type: int
    durable: int
    consumers: int
    backlog: int
    lag: int
    unacked: int
    redelivering: int
    delivered: int
    dropped: int
    dead_lettered: int
    partitions: tuple[SubscriptionPartition, ...]  # reliable standard/shared subscriptions only


@dataclass(frozen=True, slots=True)
class ListSubscriptionsResponse:
    subscriptions: tuple[SubscriptionDetail, ...]


@dataclass(frozen=True, slots=True)
class ServerInfoRequest:
    pass


@dataclass(frozen=True, slots=True)
class PrincipalMemory:
    """Bytes of the memory budget a principal holds: backlogs and unsent output."""

    principal: str
    used_bytes: int


@dataclass(frozen=True, slots=True)
class ServerInfoResponse:
    version: str
    started_ms: int  # ms since the epoch
    uptime_ms: int
    connections: int
    topic_count: int
    subscription_count: int
    data_dir: str
    data_dir_bytes: int  # bytes of the files under the data directory
    memory_budget_bytes: int = 0  # memory_max_bytes: what client backlogs may hold in all
    memory_used_bytes: int = 0  # what they hold now
    # memory_max_bytes_per_principal: what one authenticated principal may hold of it
    memory_principal_share_bytes: int = 0
    # the principals holding the most, most first (at most MAX_MEMORY_PRINCIPALS_SHOWN)
    memory_principals: tuple[PrincipalMemory, ...] = ()
    # the soft open-files limit (start-up raised it to the hard one; -1: unlimited) and the
    # reliable partitions it allows beside max_connections connections (server.open_files; -1:
    # unlimited). 0 from a server older than these fields
    open_files_limit: int = 0
    partitions_allowed: int = 0


@dataclass(frozen=True, slots=True)
class CreatePartitionsRequest:
    """Grow topic `name` to `partitions` partitions in all (never fewer than it has)."""

    name: str
    partitions: int


# ------------------------------------------------------------------------------------------------
# LOOKUP: which broker owns each partition of some topics (a cluster). Any broker answers it
# for every topic; an unknown topic is reported in its `LookupTopic`, not as a failed request.


@dataclass(frozen=True, slots=True)
class LookupWait:
    """A partition whose new owner a LOOKUP long poll waits for (version 1): answered once the
    answering broker sees it owned under an epoch above `epoch` (the owner the client knew)."""

    topic: str
    partition: int
    epoch: int


@dataclass(frozen=True, slots=True)
class LookupRequest:
    topics: tuple[str, ...]  # at most wire.limits.MAX_LOOKUP_TOPICS; none: the brokers only
    # version 1: how long to wait (a long poll) for a new owner of one of `wait_for`'s partitions
    max_wait_ms: int = 0
    wait_for: tuple[LookupWait, ...] = ()  # at most wire.limits.MAX_LOOKUP_WAITS


@dataclass(frozen=True, slots=True)
class LookupBroker:
    broker_id: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class LookupPartition:
    partition: int
    broker_id: str  # "" while nobody owns it (a hand-off or a failover under way)
    epoch: int  # grows each time the partition changes owner (0 on a single broker)


@dataclass(frozen=True, slots=True)
class LookupTopic:
    name: str
    error_code: int  # 0, or the error for this topic alone (UNKNOWN_TOPIC, ...)
    error_message: str
    partitions: tuple[LookupPartition, ...]

    @classmethod
    def unknown(cls, name: str) -> LookupTopic:
        """The answer for a topic that does not exist, or that the principal has no grant on:
        the same bytes, so the answer does not tell which."""
        # a name longer than any topic's is cut in the message: it must fit its uint16 length
        shown = name if len(name) <= _MAX_QUOTED else name[:_MAX_QUOTED] + "..."
        return cls(name, ErrorCode.UNKNOWN_TOPIC, f"topic {shown!r} does not exist", ())


@dataclass(frozen=True, slots=True)
class LookupResponse:
    brokers: tuple[LookupBroker, ...]  # the live brokers
    topics: tuple[LookupTopic, ...]  # in the order asked
    # the answering broker's lease in the cluster (ms; 0: a single broker, or a server that
    # predates the field): how long a frozen or dead owner keeps its partitions at most, which
    # the client's `owner_check` follows
    lease_ms: int = 0


# ------------------------------------------------------------------------------------------------
# Transactions (docs/PROTOCOL.md, "Transactions"): a transactional producer's id and epoch, the
# partitions and the acknowledgements each transaction takes in, and its end. Each names the
# producer id and epoch it holds: an older epoch is PRODUCER_FENCED.


@dataclass(frozen=True, slots=True)
class InitTransactionsRequest:
    """Start (or restart) the transactional producer `transactional_id`: answered with its
    producer id and a new epoch (`InitProducerIdResponse`), which fences every older instance.
    `producer_id` and `producer_epoch` are the ones held by a producer bumping its own epoch
    after an abort; -1 for a new instance."""

    transactional_id: str
    timeout_ms: int = 0  # a transaction open longer is aborted; 0: the server's default (60 s)
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnRequest:
    """Partitions of `topic` the transaction writes (a transaction begins with its first)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    topic: str
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AddAcksToTxnRequest:
    """Acknowledgements of messages of reliable subscription `subscription` on `topic`, applied
    when the transaction commits and dropped when it aborts: `ranges` as ACK_RANGES, and
    `positions` (each partition's offset below which everything is acknowledged, as a Kafka
    group's committed offset)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    topic: str
    subscription: str
    ranges: tuple[AckRange, ...]
    positions: tuple[AckEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class EndTxnRequest:
    """Commit (or abort) the transaction in progress; answered once it is complete."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool


@dataclass(frozen=True, slots=True)
class WriteTxnMarkerRequest:
    """A cluster's transaction coordinator asks the owner of a partition to end a producer's
    transaction there: write the COMMIT (`commit`) or ABORT marker, answered once it is in the
    object store. The owner writes only what the transactional id's state decided."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    commit: bool


@dataclass(frozen=True, slots=True)
class WriteTxnAcksRequest:
    """A cluster's transaction coordinator asks the owner of a partition to apply what a
    committed transaction acknowledges there (ADD_ACKS_TO_TXN `ranges`), answered once the
    subscriptions' cursors holding them are in etcd. The owner applies only what the
    transactional id's state decided to commit."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    topic: str
    partition: int


# ------------------------------------------------------------------------------------------------
# Schemas (docs/SCHEMAS.md): REGISTER_SCHEMA, GET_SCHEMA, LIST_SCHEMAS, CHECK_SCHEMA; types
# and compatibility modes travel as their names.


SCHEMA_TYPES = ("bytes", "string", "int64", "json", "avro")


COMPATIBILITY_MODES = ("none", "backward", "forward", "full")


SCHEMA_VERSION_HEADER = "hw-schema-version"  # on each record: the version its value was encoded by


LATEST_SCHEMA = -1  # GET_SCHEMA's version for the newest one


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    topic: str
    version: int  # 1, 2, ...
    schema_type: str  # one of SCHEMA_TYPES
    definition: bytes  # JSON Schema or Avro schema text; empty for bytes, string, int64, any JSON
    registered_ms: int


@dataclass(frozen=True, slots=True)
class RegisterSchemaRequest:
    """Add a version (or find an identical one). `compatibility`, if not empty, first sets the
    topic's mode, which then decides this registration."""

    topic: str
    schema_type: str
    definition: bytes = b""
    compatibility: str = ""


@dataclass(frozen=True, slots=True)
class RegisterSchemaResponse:
    version: int
    created: bool  # False: an identical version existed and is answered instead


@dataclass(frozen=True, slots=True)
class GetSchemaRequest:
    topic: str
    version: int = LATEST_SCHEMA


@dataclass(frozen=True, slots=True)
class GetSchemaResponse:
    schema: SchemaInfo
    compatibility: str


@dataclass(frozen=True, slots=True)
class ListSchemasRequest:
    topic: str


@dataclass(frozen=True, slots=True)
class ListSchemasResponse:
    """Every version without its definition (GET_SCHEMA gives that)."""

    compatibility: str
    versions: tuple[SchemaInfo, ...]


@dataclass(frozen=True, slots=True)
class CheckSchemaRequest:
    """Would REGISTER_SCHEMA accept this? Changes nothing."""

    topic: str
    schema_type: str
    definition: bytes = b""
    compatibility: str = ""


@dataclass(frozen=True, slots=True)
class CheckSchemaResponse:
    compatible: bool
    existing_version: int  # an identical version already registered, else 0
    reasons: tuple[str, ...]  # why not, when not compatible


Push = Delivery | ConsumerClosed | MessagesDropped | Throttle

Request = (
    ProduceRequest
    | SubscribeRequest
    | FlowRequest
    | AckRequest
    | AckRangesRequest
    | UnsubscribeRequest
    | FetchRequest
    | OffsetForTimeRequest
    | NackRequest
    | SeekRequest
    | DeleteSubscriptionRequest
    | InitProducerIdRequest
    | MapGetRequest
    | MapSetRequest
    | MapScanRequest
    | MapSizeRequest
    | CreateTopicRequest
    | DeleteTopicRequest
    | ListTopicsRequest
    | DescribeTopicRequest
    | ApiVersionsRequest
    | AuthenticateRequest
    | AlterTopicConfigsRequest
    | ListSubscriptionsRequest
    | ServerInfoRequest
    | CreatePartitionsRequest
    | RegisterSchemaRequest
    | GetSchemaRequest
    | ListSchemasRequest
    | CheckSchemaRequest
    | LookupRequest
    | InitTransactionsRequest
    | AddPartitionsToTxnRequest
    | AddAcksToTxnRequest
    | EndTxnRequest
    | WriteTxnMarkerRequest
    | WriteTxnAcksRequest
)
Response = (
    EmptyResponse
    | ProduceResponse
    | InitProducerIdResponse
    | MapGetResponse
    | MapSetResponse
    | MapScanResponse
    | MapSizeResponse
    | SubscribeResponse
    | FetchResponse
    | OffsetForTimeResponse
    | ListTopicsResponse
    | DescribeTopicResponse
    | ApiVersionsResponse
    | AuthenticateResponse
    | AlterTopicConfigsResponse
    | ListSubscriptionsResponse
    | ServerInfoResponse
    | RegisterSchemaResponse
    | GetSchemaResponse
    | ListSchemasResponse
    | CheckSchemaResponse
    | LookupResponse
)
