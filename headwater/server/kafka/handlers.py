"""Each served Kafka API as requests to the one `Broker` the native listener uses.

A Kafka request names many partitions; each becomes the native request for one
(`wire.messages.ProduceRequest`, `FetchRequest`, `CreateTopicRequest`, ...) handled by
`Broker.handle`, so topic turns, validation, the idempotent-producer tables and the durability
waits are the native ones, and each partition's refusal becomes its Kafka error code
(`kafka_errors`). A handler takes its API's typed request (`kafka.messages`: decoded by the codec
at the version the client sent, the fields that version lacks at Kafka's defaults) and returns its
typed response, which the codec writes at the same version, or None for a Produce with acks=0,
which Kafka answers with nothing.

- Produce: acks=1 is answered as a native produce is (per the topic's fsync policy); acks=all
  (-1) as a read_committed one, once an fsync covers the batch whatever the policy. Several
  batches in one partition's records are appended in order. A compressed batch, or one declaring
  many records (`INLINE_RECORDS`, the native port's), is checked on the listener's inflater
  thread, as on the native port; so is a batch for a topic with a schema unless its check is
  cheap (`TopicSchemas.checks_cheaply`): on the loop, 2,000 records checked against a JSON schema
  held it 380 ms.
- Fetch: one native FETCH per partition named (once: a partition named again takes the later
  offset and max_bytes in its first place, as Kafka's broker keys them by topic-partition), each
  with what is left of the response's max_bytes, until it is reached (KIP-74: the first partition
  with data gets a whole batch); the partitions after are checked and their offsets told, not
  read. Reliable topics (a non-reliable one keeps no history: INVALID_REQUEST); read_committed
  keeps only the batches an fsync covers. At the end of every
  partition with `max_wait_ms` and `min_bytes` > 0, each partition waits with the native long
  poll (`AfterData`, outside the topic's turn) and the first to bring data answers for all; the
  others are cancelled.
- ListOffsets: earliest (-2) is the partition's start, latest (-1) its readable end (the high
  watermark a Fetch reports), a timestamp the first record at or after it and that record's own
  timestamp (offset -1 when none).
- Metadata: the brokers and each partition's leader as `kafka_nodes` has them (on one broker,
  node 0 leads every partition; in a cluster, each partition's owner); topics are never created
  by a Metadata request; v10+ names each topic's id (`topic_ids`) and takes topics by id (an id
  no topic has: UNKNOWN_TOPIC_ID). In a cluster, a Produce, Fetch or ListOffsets for a partition
  this broker does not serve is answered NOT_LEADER_OR_FOLLOWER for that partition (the native
  NOT_OWNER), and the client asks for Metadata again.
- CreateTopics makes reliable topics (`cleanup.policy=compact`: last-value ones), DeleteTopics
  deletes, CreatePartitions grows, DescribeConfigs shows a topic's configs; AlterConfigs and
  IncrementalAlterConfigs change them (`config_handlers`). In a cluster, through any broker (the
  native requests define topics in etcd).
- InitProducerId issues a native producer id: Kafka's idempotent batches are checked by the
  native (durable) producer tables.
- SaslHandshake and SaslAuthenticate: PLAIN, the password a Headwater token, through
  `Security.authenticate`. With authentication on, every native request passes `Security.check`
  (and `Security.after`) as on the native port, and quotas delay the answer
  (`throttle_time_ms`); the connection charges a Produce to the produce quota as it reads it
  (and stops reading for the delay), handing the delay on with the request (`Throttled`).

The consumer group APIs are in `group_handlers`, Kafka 4's (KIP-848) in `consumer_group_handlers`.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Final

import structlog

from headwater.server.config import TopicSettings
from headwater.server.kafka import kafka_errors as k
from headwater.server.kafka.apis import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    ALTER_CONFIGS,
    API_VERSIONS,
    CONSUMER_GROUP_DESCRIBE,
    CONSUMER_GROUP_HEARTBEAT,
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_GROUPS,
    DELETE_RECORDS,
    DELETE_TOPICS,
    DESCRIBE_CONFIGS,
    DESCRIBE_GROUPS,
    DESCRIBE_TRANSACTIONS,
    END_TXN,
    FETCH,
    FIND_COORDINATOR,
    HEARTBEAT,
    INCREMENTAL_ALTER_CONFIGS,
    INIT_PRODUCER_ID,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    LIST_OFFSETS,
    LIST_TRANSACTIONS,
    METADATA,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    PRODUCE,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    SERVED,
    SHARE_ACKNOWLEDGE,
    SHARE_FETCH,
    SHARE_GROUP_DESCRIBE,
    SHARE_GROUP_HEARTBEAT,
    SYNC_GROUP,
    TXN_OFFSET_COMMIT,
)
from headwater.server.kafka.config_handlers import ConfigHandlers
from headwater.server.kafka.consumer_group_handlers import ConsumerGroupHandlers
from headwater.server.kafka.consumer_groups import ConsumerGroups
from headwater.server.kafka.group_handlers import (
    GroupHandlers,
    Handler,
    KafkaSession,
    Pace,
    may_use,
)
from headwater.server.kafka.groups import Coordinator
from headwater.server.kafka.kafka_nodes import Node, Nodes, SingleNode
from headwater.server.kafka.messages import admin as ad
from headwater.server.kafka.messages import configs as co
from headwater.server.kafka.messages import fetch as fe
from headwater.server.kafka.messages import metadata as md
from headwater.server.kafka.messages import offsets as of
from headwater.server.kafka.messages import produce as pr
from headwater.server.kafka.messages import sasl
from headwater.server.kafka.messages.declare import Message
from headwater.server.kafka.share_handlers import ShareHandlers
from headwater.server.kafka.topic_ids import TopicIds, topic_id
from headwater.server.kafka.txn_handlers import TransactionHandlers
from headwater.server.memory_budget import MemoryBudget
from headwater.server.net.client_connection import INLINE_RECORDS
from headwater.server.reply import Reply, resolve
from headwater.server.requests.broker import Broker
from headwater.server.requests.group_offsets import GroupOffsets
from headwater.server.requests.partition_ownership import not_owner
from headwater.server.schemas.schema_registry import TopicSchemas
from headwater.server.security.access import Security
from headwater.server.security.authz import Action, may_see
from headwater.server.topics.topic import LogTopic
from headwater.server.topics.topic_settings import settings_to_configs
from headwater.wire import messages as m
from headwater.wire.compression import declared_records, is_compressed
from headwater.wire.errors import (
    AuthenticationFailed,
    CorruptBatch,
    HeadwaterError,
    InvalidPartition,
    InvalidRequest,
    NotAuthorized,
    NotSupported,
    OffsetOutOfRange,
    UnknownTopic,
)
from headwater.wire.limits import MAX_FETCH_BYTES, MAX_FETCH_WAIT_MS
from headwater.wire.records import BatchInfo, gap_batch, read_records, validate_records

log = structlog.get_logger(__name__)

Session = KafkaSession

CLUSTER_ID: Final = "headwater"
# a throttled answer waits at most this long (the rest of the debt is paid by the next ones)
MAX_THROTTLE: Final = 5.0
# partitions handled between two yields to the event loop in one request's loop
_YIELD_EVERY: Final = 64
_TOPIC_RESOURCE: Final = 2
_BROKER_RESOURCE: Final = 4
# DescribeConfigs config_source: set on the topic; the server's default as configured
# (headwater.toml's [topics]); the built-in default
_TOPIC_CONFIG: Final = 1
_STATIC_BROKER_CONFIG: Final = 4
_DEFAULT_CONFIG: Final = 5
_BATCH_LENGTH = struct.Struct(">i")
_BASE = struct.Struct(">q")
_LAST_DELTA = struct.Struct(">i")  # at byte 23 of a RecordBatch v2
_BATCH_OVERHEAD: Final = 12  # base offset (8) and batch length (4) precede what the length counts
_MIN_BATCH: Final = 61  # a RecordBatch v2 header
# reads of a partition's batches a ListOffsets by time makes past the batch its index names
_TIME_SCAN_READS: Final = 16


def split_batches(records: bytes) -> list[bytes]:
    """The record batches laid back to back in a partition's records (most clients send one);
    `CorruptBatch` when a length runs past the end. Bounded: each batch is at least a header."""
    batches: list[bytes] = []
    pos = 0
    for _ in range(len(records) // _MIN_BATCH + 1):
        if pos >= len(records):
            break
        if len(records) - pos < _MIN_BATCH:
            raise CorruptBatch(f"{len(records) - pos} bytes after the last batch are no batch")
        size = _BATCH_OVERHEAD + _BATCH_LENGTH.unpack_from(records, pos + 8)[0]
        if size < _MIN_BATCH or pos + size > len(records):
            raise CorruptBatch(f"a batch of {size} bytes at byte {pos} does not fit the records")
        batches.append(records[pos : pos + size])
        pos += size
    return batches


class KafkaHandlers:
    def __init__(
        self,
        broker: Broker,
        host: str,
        port: int,
        inflater: Executor | None,
        max_decompressed: int,
        security: Security | None = None,
        topic_defaults: TopicSettings | None = None,
        nodes: Nodes | None = None,
        offsets: GroupOffsets | None = None,
        auto_create: bool = False,
        auto_partitions: int = 1,
        consumer_timeouts: tuple[int, int] = (45_000, 5_000),
    ) -> None:
        """`topic_defaults`: the server's (`[topic_defaults]`), what AlterConfigs resets the
        settings it does not name to. `nodes`: a cluster's (`kafka_nodes.ClusterNodes`);
        default: this one broker at `host`:`port`. `offsets`: the groups' offsets (a
        cluster's keep them where every broker reads them); default: this broker's cursors.
        `consumer_timeouts`: the KIP-848 groups' session timeout and heartbeat interval (ms)."""
        self._broker = broker
        self._security = security
        self._inflater = inflater
        self._cap = max_decompressed
        self._topic_defaults = topic_defaults or TopicSettings()
        self._auto_create = auto_create
        self._auto_partitions = auto_partitions
        self.nodes: Nodes = nodes or SingleNode(host, port)
        self.topic_ids = TopicIds(lambda: broker.topics)
        self.groups = GroupHandlers(
            Coordinator(),
            offsets or GroupOffsets(broker.catalog),
            self.nodes,
            self.permits,
            self._native,
        )
        groups = self.groups
        self.transactions = TransactionHandlers(broker.transactions, self.permits)
        transactions = self.transactions
        # share groups (KIP-932): `share_handlers`
        self.share = ShareHandlers(broker, self.nodes, self.permits, self.topic_ids)
        session_ms, heartbeat_ms = consumer_timeouts
        self.consumer_groups = ConsumerGroupHandlers(
            ConsumerGroups(session_ms / 1000, heartbeat_ms / 1000),
            groups,
            self.nodes,
            self.topic_ids,
            self._partition_count,
            self.permits,
            transactions.txn_offset_commit,
            self.share.groups.groups,
        )
        consumer = self.consumer_groups
        configs = ConfigHandlers(broker, security, self._native, topic_defaults or TopicSettings())
        self.handlers: dict[int, Handler] = {
            FIND_COORDINATOR: groups.find_coordinator,
            JOIN_GROUP: consumer.join_group,
            SYNC_GROUP: groups.sync_group,
            HEARTBEAT: groups.heartbeat,
            LEAVE_GROUP: groups.leave_group,
            OFFSET_COMMIT: consumer.offset_commit,
            OFFSET_FETCH: groups.offset_fetch,
            LIST_GROUPS: consumer.list_groups,
            DESCRIBE_GROUPS: consumer.describe_groups,
            API_VERSIONS: self.api_versions,
            SASL_HANDSHAKE: self.sasl_handshake,
            SASL_AUTHENTICATE: self.sasl_authenticate,
            INIT_PRODUCER_ID: self.init_producer_id,
            CREATE_PARTITIONS: self.create_partitions,
            DESCRIBE_CONFIGS: self.describe_configs,
            ALTER_CONFIGS: configs.alter_configs,
            INCREMENTAL_ALTER_CONFIGS: configs.incremental_alter_configs,
            METADATA: self.metadata,
            PRODUCE: self.produce,
            FETCH: self.fetch,
            LIST_OFFSETS: self.list_offsets,
            CREATE_TOPICS: self.create_topics,
            DELETE_TOPICS: self.delete_topics,
            DELETE_RECORDS: self.delete_records,
            DELETE_GROUPS: consumer.delete_groups,
            ADD_PARTITIONS_TO_TXN: transactions.add_partitions_to_txn,
            ADD_OFFSETS_TO_TXN: transactions.add_offsets_to_txn,
            END_TXN: transactions.end_txn,
            TXN_OFFSET_COMMIT: consumer.txn_offset_commit,
            DESCRIBE_TRANSACTIONS: transactions.describe_transactions,
            LIST_TRANSACTIONS: transactions.list_transactions,
            CONSUMER_GROUP_HEARTBEAT: consumer.consumer_group_heartbeat,
            CONSUMER_GROUP_DESCRIBE: consumer.consumer_group_describe,
        }
        self.handlers |= {
            SHARE_GROUP_HEARTBEAT: self.share.share_group_heartbeat,
            SHARE_GROUP_DESCRIBE: self.share.share_group_describe,
            SHARE_FETCH: self.share.share_fetch,
            SHARE_ACKNOWLEDGE: self.share.share_acknowledge,
        }

    def _partition_count(self, topic: str) -> int | None:
        found = self._broker.topics.get(topic)
        return None if found is None else len(found.partitions)

    @property
    def worker(self) -> Executor | None:
        """The listener's inflater thread: the connections decode and encode large requests
        there too (one thread, so the loop gets the GIL back every switch interval)."""
        return self._inflater

    @property
    def memory(self) -> MemoryBudget:
        """The server's memory budget, which connections charge their buffered bytes to."""
        return self._broker.memory

    async def _native(self, session: Session, request: m.Request) -> m.Response:
        """`request` through the broker, checked as on the native port (grant, then the
        ownership bookkeeping and filtering `Security.after` does)."""
        security = self._security
        if security is None:
            return await resolve(self._broker.handle(session, request))
        security.check(session, request)
        return await resolve(
            security.after(session, request, self._broker.handle(session, request))
        )

    def permits(self, session: Session, action: Action, topic: str) -> bool:
        if self._security is None:
            return True
        return session.auth is not None and session.auth.allows(action, topic)

    async def _throttle(self, delay: float) -> int:
        """A quota's debt: the answer waits (Kafka before 2.0 did the same) and says how long."""
        if delay <= 0:
            return 0
        delay = min(delay, MAX_THROTTLE)
        await asyncio.sleep(delay)
        return int(delay * 1000)

    # SaslHandshake, SaslAuthenticate

    async def sasl_handshake(
        self, session: Session, version: int, request: sasl.SaslHandshakeRequest
    ) -> sasl.SaslHandshakeResponse:
        ok = request.mechanism == "PLAIN"
        if ok and version == 0:
            session.raw_sasl = True  # the next frame is the PLAIN bytes themselves
        return sasl.SaslHandshakeResponse(
            error_code=0 if ok else k.UNSUPPORTED_SASL_MECHANISM, mechanisms=["PLAIN"]
        )

    async def sasl_authenticate(
        self, session: Session, version: int, request: sasl.SaslAuthenticateRequest
    ) -> sasl.SaslAuthenticateResponse:
        """PLAIN: authzid NUL username NUL password, the password a Headwater token (the user
        name is not checked: the token names its principal). A failure closes the connection
        once answered (`closes_after`)."""
        parts = request.auth_bytes.split(b"\0")
        if self._security is None:  # authentication is off, as AUTHENTICATE on the native port
            return sasl.SaslAuthenticateResponse(error_code=0, auth_bytes=b"")
        try:
            if len(parts) != 3:
                raise AuthenticationFailed("SASL PLAIN takes authzid, user name and password")
            reply = self._security.authenticate(session, m.AuthenticateRequest("token", parts[2]))
            await resolve(reply)  # a failure past the rate limit is answered after a delay
        except HeadwaterError as exc:
            return sasl.SaslAuthenticateResponse(
                error_code=k.SASL_AUTHENTICATION_FAILED, error_message=exc.message, auth_bytes=b""
            )
        auth = session.auth
        lifetime = 0 if auth is None or auth.expires is None else auth.expires * 1000
        return sasl.SaslAuthenticateResponse(
            error_code=0, auth_bytes=b"", session_lifetime_ms=lifetime
        )

    # ApiVersions, Metadata

    @staticmethod
    def versions() -> list[md.ApiVersion]:
        return [
            md.ApiVersion(api_key=a.key, min_version=a.min_version, max_version=a.max_version)
            for a in sorted(SERVED.values(), key=lambda a: a.key)
        ]

    async def api_versions(
        self, session: Session, version: int, request: md.ApiVersionsRequest
    ) -> md.ApiVersionsResponse:
        return md.ApiVersionsResponse(error_code=0, api_keys=self.versions())

    async def metadata(
        self, session: Session, version: int, request: md.MetadataRequest
    ) -> md.MetadataResponse:
        topics = self._broker.topics
        unknown_ids: list[bytes] = []  # v10+: topics asked by an id no topic has
        names: list[str] | None = None
        if request.topics is not None:
            names = []
            for asked in request.topics:
                name = asked.name
                if name is None:  # v10+: by topic id
                    name = self.topic_ids.name(asked.topic_id)
                    if name is None:
                        unknown_ids.append(asked.topic_id)
                        continue
                names.append(name)
        if version == 0 and not names:
            names = None  # v0: an empty list means every topic
        entries: list[md.MetadataResponseTopic] = []
        auth = session.auth if self._security is not None else None
        chosen = sorted(topics) if names is None else names
        if names is None and auth is not None:  # every topic the principal has a grant on
            chosen = [n for n in chosen if may_see(auth.grants, n)]
        for name in chosen:
            if self._security is not None and (auth is None or not may_see(auth.grants, name)):
                entries.append(
                    md.MetadataResponseTopic(error_code=k.TOPIC_AUTHORIZATION_FAILED, name=name)
                )
                continue
            topic = topics.get(name)
            if (
                topic is None
                and self._auto_create
                and (version < 4 or request.allow_auto_topic_creation)
            ):
                code = await self._auto_created(session, name)
                if code:
                    entries.append(md.MetadataResponseTopic(error_code=code, name=name))
                    continue
                topic = topics.get(name)
            if topic is None:
                entries.append(
                    md.MetadataResponseTopic(error_code=k.UNKNOWN_TOPIC_OR_PARTITION, name=name)
                )
                continue
            leaders = self.nodes.leaders(name, len(topic.partitions))
            partitions = [_partition_metadata(i, leader) for i, leader in enumerate(leaders)]
            entries.append(
                md.MetadataResponseTopic(
                    error_code=0, name=name, topic_id=topic_id(name), partitions=partitions
                )
            )
        entries += (
            md.MetadataResponseTopic(error_code=k.UNKNOWN_TOPIC_ID, name=None, topic_id=unknown)
            for unknown in unknown_ids
        )
        nodes = self.nodes
        return md.MetadataResponse(
            brokers=[
                md.MetadataResponseBroker(node_id=n.node_id, host=n.host, port=n.port)
                for n in nodes.nodes()
            ],
            cluster_id=CLUSTER_ID,
            controller_id=nodes.controller(),
            topics=entries,
        )

    async def _auto_created(self, session: Session, name: str) -> int:
        """`name` created as CreateTopics would (a reliable topic, the admin grant with
        authentication on): 0, or the Kafka code of the refusal."""
        request = m.CreateTopicRequest(name, self._auto_partitions, m.DispatchMode.RELIABLE, ())
        try:
            await self._native(session, request)
        except HeadwaterError as exc:
            if name in self._broker.topics:  # created meanwhile (another client's Metadata)
                return 0
            return _refused("kafka.auto_create_refused", exc, name, -1)
        log.info("kafka.topic_auto_created", topic=name, partitions=self._auto_partitions)
        return 0

    # Produce

    async def produce(
        self, session: Session, version: int, request: pr.ProduceRequest | Throttled
    ) -> pr.ProduceResponse | None:
        delay = 0.0
        if isinstance(request, Throttled):
            delay = request.delay
            request = request.request
        acks = request.acks
        isolation = m.Isolation.FSYNCED if acks == -1 else m.Isolation.APPENDED
        started: list[tuple[str, int, Awaitable[tuple[int, int]]]] = []
        pace = Pace()
        # a transactional producer's Produce names its id, which it must be allowed to use
        # (Kafka's WRITE on the TransactionalId)
        refused = request.transactional_id is not None and not may_use(
            self.permits, session, request.transactional_id
        )
        for entry in request.topic_data:
            # no yield here: the partitions' work starts in request order, before the next
            # request's (a yield would let the next Produce's batches overtake these)
            for part in entry.partition_data:
                name, index = entry.name, part.index
                if refused or acks not in (0, 1, -1):
                    code = (
                        k.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                        if refused
                        else k.INVALID_REQUIRED_ACKS
                    )
                    started.append((name, index, _failed(code)))
                    continue
                # started now, in request order: a partition's batches keep their order
                work = asyncio.ensure_future(
                    self._produce_partition(session, name, index, part.records, isolation)
                )
                started.append((name, index, work))
        results: dict[str, list[pr.PartitionProduceResponse]] = {}
        for name, index, pending in started:
            await pace.step()
            code, offset = await pending
            results.setdefault(name, []).append(
                pr.PartitionProduceResponse(
                    index=index,
                    error_code=code,
                    base_offset=offset,
                    log_append_time_ms=-1,
                    log_start_offset=-1,
                )
            )
        # charged by the connection as it read the request, which it then stopped reading for
        # the delay (muted, as Kafka mutes a throttled channel)
        throttle = await self._throttle(delay)
        if acks == 0:
            return None
        return pr.ProduceResponse(
            responses=[
                pr.TopicProduceResponse(name=n, partition_responses=p) for n, p in results.items()
            ],
            throttle_time_ms=throttle,
        )

    async def _produce_partition(
        self, session: Session, topic: str, partition: int, records: bytes | None, isolation: int
    ) -> tuple[int, int]:
        """(error code, base offset of the first batch) for one partition's records.

        The batches are handed to the broker in the order the connection read them: a batch
        checked on the inflater thread holds back the connection's later batches until it is
        appended (as on the native port), so a producer's batches never overtake each other.
        Only the durability wait runs alongside the next ones."""
        loop = asyncio.get_running_loop()
        previous = session.produce_tail
        mine: asyncio.Future[None] = loop.create_future()
        session.produce_tail = mine
        replies: list[Reply] = []
        try:
            if previous is not None and not previous.done():
                await asyncio.wait([previous])
            if not records:
                raise CorruptBatch("a produce with no records")
            for batch in split_batches(records):
                request = m.ProduceRequest(topic, partition, batch, isolation)
                if self._security is not None:
                    self._security.check(session, request)
                schemas = self._broker.catalog.schemas.validating.get(topic)
                if schemas is not None and not schemas.checks_cheaply(batch):
                    info = await loop.run_in_executor(
                        self._inflater, _check_with_schema, batch, self._cap, schemas
                    )
                    replies.append(self._broker.produce_validated(session, request, info, True))
                elif is_compressed(batch) or declared_records(batch) > INLINE_RECORDS:
                    info = await loop.run_in_executor(
                        self._inflater, validate_records, batch, self._cap
                    )
                    replies.append(self._broker.produce_validated(session, request, info))
                else:
                    replies.append(self._broker.handle(session, request))
        except HeadwaterError as exc:
            return _refused("kafka.produce_refused", exc, topic, partition), -1
        finally:
            mine.set_result(None)
            if session.produce_tail is mine:
                session.produce_tail = None
        try:
            first = -1
            for reply in replies:
                response = await resolve(reply)
                assert isinstance(response, m.ProduceResponse)
                if first < 0:
                    first = response.base_offset
            return 0, first
        except HeadwaterError as exc:
            return _refused("kafka.produce_refused", exc, topic, partition), -1

    # Fetch

    async def fetch(
        self, session: Session, version: int, request: fe.FetchRequest
    ) -> fe.FetchResponse:
        wanted = _fetch_partitions(request.topics)
        max_bytes = max(1, min(request.max_bytes, MAX_FETCH_BYTES))
        committed = request.isolation_level == 1
        answers: list[fe.PartitionData] = []
        size = 0
        full = False
        for position, (topic, index, offset, limit) in enumerate(wanted):
            if position and not position % _YIELD_EVERY:
                await asyncio.sleep(0)  # a Fetch of many partitions lets the others in
            if full:  # the answer is full: the rest are checked and their offsets told, unread
                answers.append(self._unread(session, topic, index, offset, committed))
                continue
            # what is left of max_bytes; the first partition with data gets one whole batch
            # whatever its size (KIP-74), the native FETCH's rule too
            answer = await self._fetch_one(
                session, topic, index, offset, min(limit, max_bytes - size), 0, committed
            )
            records = answer.records or b""
            if size and size + len(records) > max_bytes:
                answer = replace(answer, records=b"")  # its batch does not fit: the next Fetch's
                full = True
            else:
                size += len(records)
                full = size >= max_bytes
            answers.append(answer)
        wait_ms = min(max(0, request.max_wait_ms), MAX_FETCH_WAIT_MS)
        if wait_ms > 0 and request.min_bytes > 0 and size == 0:
            await self._long_poll(session, wanted, answers, wait_ms, committed, max_bytes)
        topics, size = self._fetch_response(wanted, answers, max_bytes)
        throttle = 0
        if self._security is not None:
            delay = self._security.charge_consume(session, size)
            throttle = await self._throttle(delay)
        # no fetch sessions: every request is a full one (session id 0)
        return fe.FetchResponse(throttle_time_ms=throttle, error_code=0, responses=topics)

    def _unread(
        self, session: Session, topic: str, index: int, offset: int, committed: bool
    ) -> fe.PartitionData:
        """A partition named after the answer is full: refused as its read would be (grant,
        topic, partition, owner, offset), else its offsets and no records, without reading."""
        try:
            if self._security is not None:
                self._security.check(session, m.FetchRequest(topic, index, offset, 1, 0))
            found = self._served_log(topic, index, "history")
            partition = found.partitions[index]
            start = found.start_offset(index)
            if not start <= offset <= partition.next_offset:
                raise OffsetOutOfRange(
                    f"offset {offset} is out of range for partition {index} of topic "
                    f"{topic!r}: start={start} next={partition.next_offset}"
                )
        except HeadwaterError as exc:
            return _fetch_refusal(index, _refused("kafka.fetch_refused", exc, topic, index))
        end = found.readable_end(partition, False)
        return fe.PartitionData(
            partition_index=index,
            error_code=0,
            high_watermark=end,
            last_stable_offset=found.stable_end(partition, True) if committed else end,
            log_start_offset=start,
            records=b"",
        )

    async def _long_poll(
        self,
        session: Session,
        wanted: list[tuple[str, int, int, int]],
        answers: list[fe.PartitionData],
        wait_ms: int,
        committed: bool,
        max_bytes: int,
    ) -> None:
        """Each partition at its end waits (the native long poll); the first with data answers
        for all. Bounded by `wait_ms` and by the partitions named."""
        polls = {
            asyncio.ensure_future(
                self._fetch_one(session, t, i, o, min(n, max_bytes), wait_ms, committed)
            ): position
            for position, (t, i, o, n) in enumerate(wanted)
            if answers[position].error_code == 0
        }
        try:
            pending = set(polls)
            deadline = asyncio.get_running_loop().time() + wait_ms / 1000 + 1.0
            while pending:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                done, pending = await asyncio.wait(
                    pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    break
                for task in done:
                    answers[polls[task]] = task.result()
                if any(answers[polls[task]].records for task in done):
                    break
        finally:
            for task in polls:
                task.cancel()

    async def _fetch_one(
        self,
        session: Session,
        topic: str,
        index: int,
        offset: int,
        limit: int,
        wait_ms: int,
        committed: bool,
    ) -> fe.PartitionData:
        try:
            # raw: Kafka clients skip the markers and aborted batches themselves (read_committed
            # with the aborted list `_committed` adds), as they do reading Kafka
            request = m.FetchRequest(topic, index, offset, limit, wait_ms, m.FetchIsolation.RAW)
            response = await self._native(session, request)
        except HeadwaterError as exc:
            return _fetch_refusal(index, _refused("kafka.fetch_refused", exc, topic, index))
        assert isinstance(response, m.FetchResponse)
        records, stable = response.records, response.end_offset
        if not records and response.next_offset > offset:
            # offsets no batch holds up to the readable end (a restart's lease gap): a Kafka
            # client moves only by the batches it gets, so it gets an empty one spanning them,
            # as a Kafka broker leaves where compaction emptied a batch
            records = gap_batch(offset, response.next_offset)
        aborted: list[fe.AbortedTransaction] | None = None
        if committed:
            stable, records, aborted = self._committed(topic, index, records, stable)
        return fe.PartitionData(
            partition_index=index,
            error_code=0,
            high_watermark=response.end_offset,
            last_stable_offset=stable,
            log_start_offset=response.start_offset,
            aborted_transactions=aborted,
            records=records,
        )

    def _committed(
        self, topic: str, index: int, records: bytes, end: int
    ) -> tuple[int, bytes, list[fe.AbortedTransaction]]:
        """read_committed: (the last stable offset, the batches wholly below it, the aborted
        transactions among them). The stable offset is below the fsynced end whatever the
        topic's policy, and below the first offset of the oldest transaction still open."""
        found = self._broker.topics.get(topic)
        if found is None or not found.reliable or index >= len(found.partitions):
            return end, records, []
        partition = found.partitions[index]
        stable = min(end, found.stable_end(partition, True))
        size = 0
        first = last = -1
        for batch in split_batches(records):
            base, count = _BASE.unpack_from(batch)[0], _LAST_DELTA.unpack_from(batch, 23)[0] + 1
            if base + count > stable:
                break
            size += len(batch)
            first = base if first < 0 else first
            last = base + count
        aborted = [
            fe.AbortedTransaction(producer_id=r.producer_id, first_offset=r.first_offset)
            for r in (partition.transactions.aborted_overlapping(first, last) if size else ())
        ]
        return stable, records[:size], aborted

    @staticmethod
    def _fetch_response(
        wanted: list[tuple[str, int, int, int]], answers: list[fe.PartitionData], max_bytes: int
    ) -> tuple[list[fe.FetchableTopicResponse], int]:
        """The answers by topic, in the request's order, with at most `max_bytes` of records in
        all (the first partition's records whatever their size, so a consumer moves on), and the
        bytes of records they hold."""
        topics: dict[str, list[fe.PartitionData]] = {}
        size = 0
        for (topic, _index, _offset, _limit), answer in zip(wanted, answers, strict=True):
            records = answer.records or b""
            if size and size + len(records) > max_bytes:
                answer = replace(answer, records=b"")
            else:
                size += len(records)
            topics.setdefault(topic, []).append(answer)
        return [fe.FetchableTopicResponse(topic=t, partitions=p) for t, p in topics.items()], size

    # ListOffsets

    async def list_offsets(
        self, session: Session, version: int, request: of.ListOffsetsRequest
    ) -> of.ListOffsetsResponse:
        topics = []
        for entry in request.topics:
            name = entry.name
            partitions = []
            for part in entry.partitions:
                index, timestamp = part.partition_index, part.timestamp
                try:
                    if not self.permits(session, Action.CONSUME, name):
                        raise NotAuthorized(f"no consume grant on topic {name!r}")
                    offset, found = await self._offset(
                        name, index, timestamp, request.isolation_level == 1
                    )
                    code = 0
                except HeadwaterError as exc:
                    code = _refused("kafka.list_offsets_refused", exc, name, index)
                    offset, found = -1, -1
                partitions.append(
                    of.ListOffsetsPartitionResponse(
                        partition_index=index, error_code=code, timestamp=found, offset=offset
                    )
                )
            topics.append(of.ListOffsetsTopicResponse(name=name, partitions=partitions))
        return of.ListOffsetsResponse(throttle_time_ms=0, topics=topics)

    async def _offset(
        self, name: str, index: int, timestamp: int, committed: bool = False
    ) -> tuple[int, int]:
        """(offset, timestamp): earliest and latest with timestamp -1 (read_committed: the last
        stable offset); for a time, the first record at or after it and that record's own
        timestamp ((-1, -1) when none is)."""
        topic = self._broker.topics.get(name)
        if topic is None:
            raise UnknownTopic(f"topic {name!r} does not exist")
        if not 0 <= index < len(topic.partitions):
            raise InvalidPartition(f"topic {name!r} has no partition {index}")
        ownership = self._broker.ownership  # the offsets of a partition served elsewhere
        if not ownership.serves(name, index):  # are its owner's to tell
            raise not_owner(ownership, name, index)
        if timestamp == -2:
            return topic.start_offset(index), -1
        if not topic.reliable:
            if timestamp == -1:
                return topic.partitions[index].next_offset, -1
            raise InvalidRequest(f"topic {name!r} is non-reliable: no offsets by timestamp")
        partition = topic.partitions[index]
        end = topic.readable_end(partition, False)
        if committed:
            end = topic.stable_end(partition, True)
        if timestamp == -1:
            return end, -1
        if timestamp < 0:
            raise InvalidRequest(f"timestamp {timestamp}: -1 latest, -2 earliest, or ms")
        # the first batch whose records reach the time; then its first record that does (a
        # batch's records need not be in time order: the first at or after it by offset)
        offset = await topic.offset_for_timestamp(index, timestamp)
        for _ in range(_TIME_SCAN_READS):
            if offset >= end:
                break
            batches = await topic.read(index, offset)
            if not batches:
                break
            loop = asyncio.get_running_loop()
            found = await loop.run_in_executor(
                self._inflater, _record_at_or_after, batches, offset, end, timestamp, self._cap
            )
            if isinstance(found, tuple):
                return found
            offset = found  # none in these batches: read on from the next
        return -1, -1

    # InitProducerId

    async def init_producer_id(
        self, session: Session, version: int, request: pr.InitProducerIdRequest
    ) -> pr.InitProducerIdResponse:
        """A Headwater producer id (epoch 0): the batches the client stamps with it are checked
        by the native idempotent-producer tables, which are durable, so a retry after a restart
        is still answered with its first offset, not appended again."""
        if request.transactional_id is not None:
            return await self.transactions.init_producer_id(session, version, request)
        try:
            response = await self._native(session, m.InitProducerIdRequest())
        except HeadwaterError as exc:
            code = _refused("kafka.init_producer_id_refused", exc, "", -1)
            return pr.InitProducerIdResponse(error_code=code, producer_id=-1, producer_epoch=-1)
        assert isinstance(response, m.InitProducerIdResponse)
        return pr.InitProducerIdResponse(
            error_code=0, producer_id=response.producer_id, producer_epoch=response.producer_epoch
        )

    # CreatePartitions, DescribeConfigs

    async def create_partitions(
        self, session: Session, version: int, request: ad.CreatePartitionsRequest
    ) -> ad.CreatePartitionsResponse:
        results = []
        for entry in request.topics:
            name, count, message = entry.name, entry.count, None
            code = 0
            try:
                if entry.assignments:
                    raise InvalidRequest("replica assignments are not taken: one copy, storage's")
                topic = self._broker.topics.get(name)
                if topic is None:
                    raise UnknownTopic(f"topic {name!r} does not exist")
                if count <= len(topic.partitions):
                    code = k.INVALID_PARTITIONS
                    message = f"topic {name!r} has {len(topic.partitions)} partitions already"
                elif not request.validate_only:
                    await self._native(session, m.CreatePartitionsRequest(name, count))
            except HeadwaterError as exc:
                code = _refused("kafka.create_partitions_refused", exc, name, -1)
                message = exc.message
                if code == k.INVALID_REQUEST:
                    code = k.INVALID_PARTITIONS
            results.append(
                ad.CreatePartitionsTopicResult(name=name, error_code=code, error_message=message)
            )
        return ad.CreatePartitionsResponse(throttle_time_ms=0, results=results)

    async def describe_configs(
        self, session: Session, version: int, request: co.DescribeConfigsRequest
    ) -> co.DescribeConfigsResponse:
        """A topic's configs are its Headwater configs, plus Kafka's `cleanup.policy`: compact
        for a last-value topic, delete otherwise. A broker has none to show."""
        resources = []
        for resource in request.resources:
            kind, name = resource.resource_type, resource.resource_name
            names = resource.configuration_keys  # None: every config
            entries: list[co.DescribeConfigsResourceResult] = []
            code, message = 0, None
            try:
                if kind == _TOPIC_RESOURCE:
                    response = await self._native(session, m.DescribeTopicRequest(name))
                    assert isinstance(response, m.DescribeTopicResponse)
                    configs = {c.name: c.value for c in response.topic.configs}
                    compact = configs.get("last.value") == "true"
                    configs["cleanup.policy"] = "compact" if compact else "delete"
                    entries = []
                    for key, value in sorted(configs.items()):
                        if names is not None and key not in names:
                            continue
                        source = self._config_source(key, value)
                        entries.append(
                            co.DescribeConfigsResourceResult(
                                name=key,
                                value=value,
                                read_only=key == "cleanup.policy",
                                is_default=source == _DEFAULT_CONFIG,
                                config_source=source,
                                is_sensitive=False,
                            )
                        )
                elif kind != _BROKER_RESOURCE:
                    raise InvalidRequest(f"resource type {kind}: topics (2) and brokers (4)")
            except HeadwaterError as exc:
                code = _refused("kafka.describe_configs_refused", exc, name, -1)
                message = exc.message
            resources.append(
                co.DescribeConfigsResult(
                    error_code=code,
                    error_message=message,
                    resource_type=kind,
                    resource_name=name,
                    configs=entries,
                )
            )
        return co.DescribeConfigsResponse(throttle_time_ms=0, results=resources)

    def _config_source(self, name: str, value: str) -> int:
        """As Kafka tells a config's source: a value the topic holds as the server's default is
        the default (DEFAULT_CONFIG when it is the built-in one, STATIC_BROKER_CONFIG when
        headwater.toml's `[topics]` set it), any other a topic config (DYNAMIC_TOPIC_CONFIG).
        A topic keeps its values, not whether they were named: one set to the default's value is
        told as the default, as Kafka tells a topic config deleted back to it."""
        if name == "cleanup.policy":
            return _DEFAULT_CONFIG if value == "delete" else _TOPIC_CONFIG
        server = dict((c.name, c.value) for c in settings_to_configs(self._topic_defaults))
        if name not in server or server[name] != value:
            return _TOPIC_CONFIG
        built_in = dict((c.name, c.value) for c in settings_to_configs(TopicSettings()))
        return _DEFAULT_CONFIG if built_in.get(name) == value else _STATIC_BROKER_CONFIG

    # CreateTopics, DeleteTopics

    async def create_topics(
        self, session: Session, version: int, request: ad.CreateTopicsRequest
    ) -> ad.CreateTopicsResponse:
        results = []
        for entry in request.topics:
            name = entry.name
            configs = tuple(
                _topic_config(c.name, c.value or "")
                for c in entry.configs
                # Kafka's default policy is what every Headwater topic does
                if not (c.name == "cleanup.policy" and c.value == "delete")
            )
            count = entry.num_partitions
            native = m.CreateTopicRequest(
                name, 1 if count == -1 else count, m.DispatchMode.RELIABLE, configs
            )
            code, message = 0, None
            try:
                if entry.assignments:
                    raise InvalidRequest("replica assignments are not taken: one copy, storage's")
                if request.validate_only:  # v1+; false in v0
                    if name in self._broker.topics:
                        code, message = k.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
                else:
                    await self._native(session, native)
            except HeadwaterError as exc:
                code, message = _refused("kafka.create_topic_refused", exc, name, -1), exc.message
                if code == k.UNKNOWN_TOPIC_OR_PARTITION:  # a partition count out of range
                    code = k.INVALID_PARTITIONS
                elif code == k.INVALID_REQUEST and configs:
                    code = k.INVALID_CONFIG
            results.append(
                ad.CreatableTopicResult(name=name, error_code=code, error_message=message)
            )
        return ad.CreateTopicsResponse(throttle_time_ms=0, topics=results)

    async def delete_topics(
        self, session: Session, version: int, request: ad.DeleteTopicsRequest
    ) -> ad.DeleteTopicsResponse:
        results = []
        for name in request.topic_names:
            code = 0
            try:
                await self._native(session, m.DeleteTopicRequest(name))
            except HeadwaterError as exc:
                code = _refused("kafka.delete_topic_refused", exc, name, -1)
            results.append(ad.DeletableTopicResult(name=name, error_code=code))
        return ad.DeleteTopicsResponse(throttle_time_ms=0, responses=results)

    # DeleteRecords

    async def delete_records(
        self, session: Session, version: int, request: ad.DeleteRecordsRequest
    ) -> ad.DeleteRecordsResponse:
        """Each partition's start moved to its offset (-1: the high watermark), as Kafka's
        DeleteRecords moves the log start offset: nothing below it is read any more. The admin
        grant on the topic; a reliable topic's partition this broker serves."""
        topics = []
        for entry in request.topics:
            name = entry.name
            results = []
            for part in entry.partitions:
                index, low, code = part.partition_index, -1, 0
                try:
                    low = await self._delete_records(session, name, index, part.offset)
                except HeadwaterError as exc:
                    code = _refused("kafka.delete_records_refused", exc, name, index)
                results.append(
                    ad.DeleteRecordsPartitionResult(
                        partition_index=index, low_watermark=low, error_code=code
                    )
                )
            topics.append(ad.DeleteRecordsTopicResult(name=name, partitions=results))
        return ad.DeleteRecordsResponse(throttle_time_ms=0, topics=topics)

    def _served_log(self, name: str, index: int, keeps: str) -> LogTopic:
        """The reliable topic `name`, whose partition `index` this broker serves; else the
        error a read of it gets (unknown topic, non-reliable, no such partition, not owner)."""
        topic = self._broker.topics.get(name)
        if topic is None:
            raise UnknownTopic(f"topic {name!r} does not exist")
        if not isinstance(topic, LogTopic):
            raise NotSupported(f"topic {name!r} is non-reliable: it keeps no {keeps}")
        if not 0 <= index < len(topic.partitions):
            raise InvalidPartition(f"topic {name!r} has no partition {index}")
        ownership = self._broker.ownership
        if not ownership.serves(name, index):
            raise not_owner(ownership, name, index)
        return topic

    async def _delete_records(self, session: Session, name: str, index: int, offset: int) -> int:
        if not self.permits(session, Action.ADMIN, name):
            raise NotAuthorized(f"no admin grant on topic {name!r}")
        catalog = self._broker.catalog
        async with catalog.turn(name):
            topic = self._served_log(name, index, "records")
            end = topic.readable_end(topic.partitions[index], False)
            if offset == -1:
                offset = end
            if not 0 <= offset <= end:
                raise OffsetOutOfRange(
                    f"offset {offset} is past the end {end} of partition {index} of {name!r}"
                )
            return await catalog.delete_records(topic, index, offset)


def _partition_metadata(index: int, leader: Node | None) -> md.MetadataResponsePartition:
    if leader is None:  # nobody owns it now (a take-over under way): clients ask again
        return md.MetadataResponsePartition(
            error_code=k.LEADER_NOT_AVAILABLE, partition_index=index, leader_id=-1
        )
    return md.MetadataResponsePartition(
        error_code=0,
        partition_index=index,
        leader_id=leader.node_id,
        replica_nodes=[leader.node_id],
        isr_nodes=[leader.node_id],
    )


def _topic_config(name: str, value: str) -> m.ConfigEntry:
    """A Kafka topic config as Headwater's: a compacted topic is a last-value one."""
    if name == "cleanup.policy" and value == "compact":
        return m.ConfigEntry("last.value", "true")
    return m.ConfigEntry(name, value)


def _record_at_or_after(
    batches: list[bytes], offset: int, end: int, timestamp: int, cap: int
) -> tuple[int, int] | int:
    """(offset, timestamp) of the first record of `batches` at or past `offset` and below `end`
    whose timestamp is at or after `timestamp`; else the offset to read on from."""
    for batch in batches:
        for record in read_records(batch, cap):
            if record.offset >= end:
                return end
            if record.offset >= offset and record.timestamp >= timestamp:
                return record.offset, record.timestamp
            offset = max(offset, record.offset + 1)
    return offset


def _fetch_partitions(topics: Sequence[fe.FetchTopic]) -> list[tuple[str, int, int, int]]:
    """(topic, partition, offset, max_bytes) of each partition a Fetch names, once: as Kafka's
    broker keys a request's partitions by topic-partition (a map), a partition named again takes
    the later offset and max_bytes and keeps its first place, and is read and answered once."""
    named: dict[tuple[str, int], tuple[int, int]] = {}
    for entry in topics:
        for part in entry.partitions:
            named[entry.topic, part.partition] = (
                part.fetch_offset,
                max(1, min(part.partition_max_bytes, MAX_FETCH_BYTES)),
            )
    return [(topic, index, offset, limit) for (topic, index), (offset, limit) in named.items()]


def _fetch_refusal(index: int, code: int) -> fe.PartitionData:
    return fe.PartitionData(
        partition_index=index,
        error_code=code,
        high_watermark=-1,
        last_stable_offset=-1,
        log_start_offset=-1,
        records=b"",
    )


def _check_with_schema(batch: bytes, cap: int, schemas: TopicSchemas) -> BatchInfo:
    """On the inflater thread: the batch's records decode, then pass the topic's schema (as
    the native port checks them)."""
    info = validate_records(batch, cap)
    schemas.check_batch(batch, cap)
    return info


async def _failed(code: int) -> tuple[int, int]:
    return code, -1


def _refused(event: str, error: HeadwaterError, topic: str, partition: int) -> int:
    code = k.kafka_code(error)
    log.debug(event, topic=topic, partition=partition, error=str(error), kafka_code=code)
    return code


def produce_bytes(request: pr.ProduceRequest) -> int:
    """The record bytes a Produce carries: what its principal's produce quota is charged."""
    return sum(len(p.records or b"") for e in request.topic_data for p in e.partition_data)


@dataclass(frozen=True, slots=True)
class Throttled:
    """A Produce whose reading put its principal in debt on the produce quota: the connection
    stopped reading for `delay` seconds, and the answer waits as long and says so."""

    request: pr.ProduceRequest
    delay: float


def throttled(request: Message, delay: float) -> Throttled:
    """A Produce, read by the connection, that its quota delays by `delay` seconds."""
    assert isinstance(request, pr.ProduceRequest)
    return Throttled(request, delay)


def closes_after(response: Message | None) -> bool:
    """Whether the connection closes once `response` is written (a failed SASL
    authentication, as Kafka does)."""
    return isinstance(response, sasl.SaslAuthenticateResponse) and response.error_code != 0
