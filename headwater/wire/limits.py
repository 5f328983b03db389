"""Protocol limits, each with the reason for its value.

Every limit the server enforces on what a peer sends lives here, so a client author can read them in
one place and `docs/PROTOCOL.md` can quote them. A frame over `MAX_FRAME_SIZE` is rejected from its
size prefix alone, before any of its body is buffered.
"""

from typing import Final

# 8 MiB: large enough for a record batch of several thousand 1 KiB records, small enough that a
# connection's read buffer stays bounded no matter what a peer announces.
MAX_FRAME_SIZE: Final = 8 * 1024 * 1024

# A record batch travels inside a produce frame; leave room for the frame header and topic name.
MAX_BATCH_SIZE: Final = MAX_FRAME_SIZE - 64 * 1024

# Kafka's limit: topic names appear in file and object names, which most file systems cap at 255.
MAX_TOPIC_NAME_LENGTH: Final = 249

# Subscription and consumer names are shown by admin tools and logged; they need no more.
MAX_NAME_LENGTH: Final = 255

# Keys index the last-value store (RocksDB) and are compared on every update.
MAX_KEY_SIZE: Final = 64 * 1024

# A topic's partitions each hold an offset counter and, when reliable, a WAL directory.
MAX_PARTITIONS: Final = 1024

# Credits a consumer may hold at once: more buys nothing and could overflow int32 sums.
MAX_CREDITS: Final = 1_000_000

# ACK and NACK `acks`: entries carried by one request (a client batches one event-loop turn's acks;
# decoding 10,000 takes about 3 ms with the struct fast path).
MAX_ACKS_PER_REQUEST: Final = 10_000

# ACK_RANGES: ranges carried by one request, and the offsets they cover together. The server walks
# a range's in-flight offsets in min(its length, what is in flight) steps, but a range above the
# cursor's floor still adds each offset to the acknowledged set (in C): the second bound keeps a
# request's worst case at a full ACK's 10,000 offsets (a client splits a bigger turn).
MAX_ACK_RANGES_PER_REQUEST: Final = 10_000
MAX_OFFSETS_PER_ACK_RANGES: Final = 10_000

# Bytes a compressed record batch may inflate to (the server's `max_decompressed_batch` default,
# and the client's when it reads deliveries): a 96 KiB zstd batch can otherwise inflate to 3 GiB.
MAX_DECOMPRESSED_BATCH: Final = 64 * 1024 * 1024

# Keys one MAP_GET names (`keys`, 1..MAX_MAP_KEYS), writes one MAP_SET carries (`writes`), entries
# one MAP_SCAN page returns: a request is answered from one RocksDB snapshot in one event-loop
# turn, so it must stay short.
MAX_MAP_KEYS: Final = 1000

# FETCH `max_bytes`: what one answer may carry, so that it always fits a frame (with its 20-byte
# header and offsets) whatever the request; an answer still holds one whole batch when that batch is
# larger than `max_bytes` (at most MAX_BATCH_SIZE, which this equals).
MAX_FETCH_BYTES: Final = MAX_BATCH_SIZE

# FETCH `max_wait_ms`: how long a long poll at the end of a partition may wait for data. Under the
# client's default request timeout (30 s), so a poll answers before its request gives up.
MAX_FETCH_WAIT_MS: Final = 20_000

# Bytes of an error response's message (UTF-8, cut there): enough for any message the server
# composes, and a peer-supplied name quoted in one cannot make an error frame large.
MAX_ERROR_MESSAGE: Final = 4096

# The longest a transaction may stay open (INIT_TRANSACTIONS `timeout_ms`, and Kafka's
# InitProducerId): Kafka's default `transaction.max.timeout.ms`. A longer one would keep a
# partition's last stable offset, and every transaction-aware reader, waiting that long on a
# producer that died.
MAX_TRANSACTION_TIMEOUT_MS: Final = 900_000

# The longest transactional id, in characters (as a topic name).
MAX_TRANSACTIONAL_ID: Final = 249

# LOOKUP `topics`: a client asks for the topics it is about to use, a few at a time; the answer
# (every partition of each) must stay far below MAX_FRAME_SIZE.
MAX_LOOKUP_TOPICS: Final = 100

# LOOKUP `wait_for` (version 1): the partitions a long poll waits on for a new owner (a client
# waits on the ones it has requests for); and how long it may wait, as FETCH.
MAX_LOOKUP_WAITS: Final = 1000
MAX_LOOKUP_WAIT_MS: Final = 20_000

# Requests one connection may have waiting before they can even be answered (for their topic's
# turn while a delete or a take-over holds it, for last-value state being built), each holding its
# request and batch: past it the connection is not read until one is answered, so a producer
# pipelining into a busy topic is back-pressured through TCP instead of buffered in the server
# (10,000 pipelined 1 MiB produces would otherwise be 10 GB held). Kafka's own cap on a
# connection's requests in flight (`max.in.flight.requests.per.connection` is at most 5 for an
# idempotent producer) is far below it. Both ports share this one: the native port counts the
# requests waiting for a turn, the Kafka port every request in progress (it answers in order, so
# each one held is one waiting).
MAX_WAITING_REQUESTS: Final = 64

# Bytes of a frame before the connection has authenticated (on a server with authentication): an
# AUTHENTICATE carries a mechanism name and a token of about 60 bytes, API_VERSIONS nothing; a
# few KiB leave room for longer credentials while an anonymous peer can make the server read and
# hold no more than this per frame.
MAX_PRE_AUTH_FRAME: Final = 8 * 1024

# Every array a request carries has a maximum count, checked as soon as the count is read and
# before any element is parsed: parsing costs CPU per element, and a frame of MAX_FRAME_SIZE
# holds millions of empty elements (an 8 MiB CREATE_TOPIC of 2 million configs took 21 s).
# Each maximum below is for one array, named `API.field` in docs/PROTOCOL.md.

# CREATE_TOPIC and ALTER_TOPIC_CONFIGS `configs`: a topic has 8 settable names; the rest of the
# room is for names added later.
MAX_TOPIC_CONFIGS: Final = 32

# SUBSCRIBE `partitions` (the partitions a consumer takes): at most every partition of a topic.
MAX_SUBSCRIBE_PARTITIONS: Final = MAX_PARTITIONS

# SUBSCRIBE `settings.keys` (the keys a last-value subscription follows): as many as one MAP_GET
# names; a larger set is a `key_prefix`.
MAX_SUBSCRIPTION_KEYS: Final = MAX_MAP_KEYS
