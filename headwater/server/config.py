"""Server configuration: frozen dataclasses, built once by `serve` (from TOML and flags) and
passed down. Every option is documented in docs/CONFIGURATION.md."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from headwater.storage.wal import FsyncPolicy
from headwater.wire.limits import MAX_BATCH_SIZE, MAX_DECOMPRESSED_BATCH, MAX_FRAME_SIZE

DEFAULT_RETENTION_BYTES = 1024**3  # per partition
DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """Per-topic settings of reliable topics; the server's defaults apply to unset ones."""

    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_ms: int = 100
    segment_bytes: int = 64 * 1024 * 1024
    segment_ms: int = 10 * 60 * 1000  # also bounds how far object-store uploads lag behind
    # Local retention: sealed segments past these bounds are deleted, once uploaded (the object
    # store keeps them; what exists only here is never deleted). -1: keep all. The defaults bound
    # a busy server's disk without a setting; with `object_store.backend = "none"` they do not
    # apply (see ServerConfig.__post_init__).
    retention_bytes: int = DEFAULT_RETENTION_BYTES
    retention_ms: int = DEFAULT_RETENTION_MS
    # The largest record batch a produce may append (Kafka's `max.message.bytes`, whose default
    # is 1 MiB + 12 bytes); larger: RECORD_TOO_LARGE (Kafka's MESSAGE_TOO_LARGE), the connection
    # kept. By default the largest batch a frame carries, so no producer is refused by it.
    max_message_bytes: int = MAX_BATCH_SIZE


@dataclass(frozen=True, slots=True)
class SubscriptionDefaults:
    """Defaults for reliable subscriptions that do not set their own."""

    ack_timeout_ms: int = 30_000
    max_deliveries: int = 0  # 0: never dead-letter
    backoff_initial_ms: int = 1_000
    backoff_max_ms: int = 60_000


@dataclass(frozen=True, slots=True)
class ObjectStoreConfig:
    backend: str = "local"  # "local", "s3" or "none"
    path: Path | None = None  # local backend; default <data_dir>/objects
    # local backend: store a sealed segment as a hard link when `path` is on its file system (no
    # second write of the bytes; the object shares the segment's blocks); False: copy it
    link: bool = False
    # local backend: a put's temporary file unchanged for this long was left by a server killed
    # mid-put, and is deleted at start; it must exceed the longest a put can stall (shared path)
    abandoned_after_s: float = 600.0
    bucket: str = ""
    prefix: str = "headwater"
    endpoint_url: str | None = None  # any S3-compatible server; None: AWS
    region: str | None = None
    # Uploader: retry delays while the store is failing (doubling, capped).
    retry_initial_ms: int = 500
    retry_max_ms: int = 30_000
    # one read below the local WAL walks over at most this many missing (or damaged) objects
    # and gaps; the next read goes on where it stopped (`storage.log_reader.Walked`)
    walk_limit: int = 10_000


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """Authentication, TLS and quotas (docs/SECURITY.md). All off by default, which the server
    allows on a loopback address only (or with `insecure`)."""

    auth_tokens: Path | None = None  # the tokens file; set: every connection must authenticate
    insecure: bool = False  # listen on a non-loopback address without authentication anyway
    tls_cert: Path | None = None  # PEM certificate chain; with tls_key: clients must use TLS
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # verify client certificates against this CA (mTLS)
    # Defaults for principals whose tokens file entry sets none. 0: unlimited.
    max_connections_per_principal: int = 1_000  # past it: TOO_MANY_CONNECTIONS
    produce_bytes_per_second: int = 0  # past it: THROTTLE push and reads paused
    consume_bytes_per_second: int = 0  # past it: deliveries paused
    # Failed AUTHENTICATEs per (source address, token id) per minute (ten times that per address,
    # whatever the ids); past it a failure is answered after a second. A valid token never waits.
    auth_failures_per_minute: int = 10
    # Connections that have not authenticated yet, in all (0: a quarter of server.max_connections;
    # the rest is kept for authenticated ones) and per source address; past either a new
    # connection gets TOO_MANY_CONNECTIONS. Each has handshake_timeout seconds to authenticate.
    max_unauthenticated_connections: int = 0
    max_unauthenticated_per_address: int = 32
    handshake_timeout: float = 5.0


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Cluster mode (docs/CLUSTER.md); `etcd` empty: one broker, no coordination (the default)."""

    etcd: str = ""  # "etcd://127.0.0.1:2379"
    advertise: str = ""  # host:port clients reach this broker at; default: the bound address
    broker_id: str = ""  # unique in the cluster; default: the advertised address
    # a killed broker's partitions move after about this long (etcd counts whole seconds, at
    # least 2); the broker stops serving a quarter of it before etcd can expire its lease
    lease_ttl_ms: int = 2_000
    # a broker that joins or comes back is handed its share of the partitions other brokers
    # serve only once it has been live this long (free partitions it takes at once)
    handoff_after_ms: int = 300_000
    # a reliable produce is answered once its batch is in the object store; the batches of every
    # producer of a partition within this window go out as one object
    commit_interval_ms: int = 5
    checkpoint_interval_ms: int = 500  # cursors written to etcd at most this often
    # a partition's tail objects are folded into one segment once this many are stored: a
    # take-over lists at most about this many, whatever the traffic
    fold_chunks: int = 500
    # "partition": one tail object per busy partition per window; "broker": one per broker per
    # window holding every partition's batches, indexed in etcd (docs/CLUSTER.md). Every
    # broker of a cluster must use the same, chosen when the cluster is created
    tail_layout: str = "partition"
    # with authentication on: the token this broker authenticates with to the other brokers,
    # for the records it writes to partitions they own (dead letters; docs/CLUSTER.md)
    peer_token: str = ""


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    """The Kafka protocol listener (docs/KAFKA.md); `port` None: none (the default)."""

    port: int | None = None  # 0 picks a free port
    port_file: Path | None = None  # written with the bound Kafka port once listening
    # the host Metadata names this broker by; default: the listen host
    advertise_host: str = ""
    # Kafka's auto.create.topics.enable: a Metadata naming an unknown topic creates it (reliable,
    # `auto_create_partitions` partitions, the server's topic defaults) when the client allows
    # it (allow_auto_topic_creation, v4+; always before v4). Off by default (docs/DECISIONS.md)
    auto_create_topics: bool = False
    auto_create_partitions: int = 1  # Kafka's num.partitions
    # Kafka 4's consumer group protocol (KIP-848): a member silent this long is fenced and its
    # partitions move (group.consumer.session.timeout.ms); members heartbeat this often
    # (group.consumer.heartbeat.interval.ms), which is also how soon a partition released by one
    # member reaches the next
    consumer_session_timeout_ms: int = 45_000
    consumer_heartbeat_interval_ms: int = 5_000


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 6650
    data_dir: Path = Path("./data")
    # Written with the bound port once the server listens (useful with port 0).
    port_file: Path | None = None
    # The operator's HTTP port (metrics, health checks, status page; docs/OPERATIONS.md) on the
    # same host: None, the default, opens none; 0 picks a free port.
    http_port: int | None = None
    http_port_file: Path | None = None  # written with the bound HTTP port
    max_frame_size: int = MAX_FRAME_SIZE
    # Non-reliable: messages a subscription holds while its consumers have no credit. Past it,
    # new messages are dropped and counted, so a slow consumer costs bounded memory. The bytes
    # below bind first for messages over about 67 bytes; at 10,000 a consumer descheduled for
    # 5 ms lost messages at 2M msgs/s (docs/BENCHMARKS.md, 2026-11-26).
    subscription_backlog: int = 1_000_000
    # ... and bytes of batches it holds (one batch is always let into an empty backlog).
    subscription_backlog_bytes: int = 64 * 1024 * 1024
    # Bytes every such backlog together may hold (server/memory_budget.py); past it batches are
    # dropped (MESSAGES_DROPPED). 0: a quarter of the machine's memory.
    memory_max_bytes: int = 0
    # Bytes of that budget one authenticated principal may hold: its subscriptions' backlogs and
    # its connections' unsent output (server/memory_budget.py). 0: a quarter of the budget.
    memory_max_bytes_per_principal: int = 0
    # Bytes queued on a consumer's socket before the server stops sending to it (asyncio's
    # write-buffer high-water mark); resumes at a quarter of it.
    consumer_write_buffer: int = 4 * 1024 * 1024
    # Per-client bounds (a hostile or broken client must not stall the others; each refusal has
    # an error code, see docs/PROTOCOL.md).
    max_connections: int = 10_000  # past it a new connection gets TOO_MANY_CONNECTIONS and closes
    max_consumers_per_subscription: int = 10_000  # TOO_MANY_CONSUMERS
    max_consumers_per_connection: int = 1_000  # TOO_MANY_SUBSCRIPTIONS
    # A compressed batch may inflate to at most this many bytes (DECOMPRESSED_TOO_LARGE).
    max_decompressed_batch: int = MAX_DECOMPRESSED_BATCH
    # A connection stops being read while its unsent responses exceed this many bytes (the write
    # buffer's high-water mark is the smaller of this and consumer_write_buffer).
    max_pending_response_bytes: int = 4 * 1024 * 1024
    # A connection with no consumers, nothing in progress and no complete frame for this long is
    # closed (CONNECTION_TIMEOUT).
    idle_timeout: float = 600.0
    # A frame must arrive whole within this long once its first byte has.
    frame_timeout: float = 30.0
    # How long a graceful shutdown waits for uploads and connections to finish.
    shutdown_timeout: float = 10.0
    # Trace the message at every offset that is a multiple of this, in every partition: the
    # times it was read, appended, answered and dispatched, at GET /debug/stages on the HTTP
    # port (server/net/stage_trace.py; docs/OPERATIONS.md). 0, the default: off.
    trace_every: int = 0
    log_format: str = "console"  # or "json"
    log_level: str = "info"
    topic_defaults: TopicSettings = field(default_factory=TopicSettings)
    subscription_defaults: SubscriptionDefaults = field(default_factory=SubscriptionDefaults)
    object_store: ObjectStoreConfig = field(default_factory=ObjectStoreConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)

    def __post_init__(self) -> None:
        # Without an object store nothing is ever uploaded, and retention would delete the only
        # copy: the built-in defaults then keep everything. A bound set explicitly still applies.
        if self.object_store.backend == "none":
            defaults = self.topic_defaults
            keep_bytes = defaults.retention_bytes == DEFAULT_RETENTION_BYTES
            keep_ms = defaults.retention_ms == DEFAULT_RETENTION_MS
            if keep_bytes or keep_ms:
                defaults = replace(
                    defaults,
                    retention_bytes=-1 if keep_bytes else defaults.retention_bytes,
                    retention_ms=-1 if keep_ms else defaults.retention_ms,
                )
                object.__setattr__(self, "topic_defaults", defaults)
