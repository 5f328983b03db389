"""The share group APIs (KIP-932): ShareGroupHeartbeat and ShareGroupDescribe (membership,
`share_groups`, on the group's coordinator), ShareFetch and ShareAcknowledge (records, through
`share_sessions`, on each partition's leader).

A share group G on topic T is the Shared subscription G on T: the first heartbeat naming T
creates it if it does not exist (starting at the latest offset, as Kafka's
`share.auto.offset.reset` default; `group.share.record.lock.duration.ms` as its ack timeout,
`group.share.delivery.count.limit` as its `max_deliveries`), and a subscription of another type
with the name refuses the member (INCONSISTENT_GROUP_PROTOCOL, 23). Made first natively, with its
own settings (start, ack timeout, backoff, max_deliveries), it is the share group with those.

ShareFetch: session epoch 0 opens the member's share session on this broker (acknowledgements
in it are INVALID_REQUEST), a later request carries the epoch the previous one left (else
INVALID_SHARE_SESSION_EPOCH, 123; no session SHARE_SESSION_NOT_FOUND, 122), -1 applies its
acknowledgements and closes it. Each request's partitions join the session, forgotten ones
leave it; the answer holds, per partition, the records acquired (whole batches, the
AcquiredRecords ranges and their delivery counts) and the result of the request's
acknowledgements. A partition another broker leads is NOT_LEADER_OR_FOLLOWER with its leader;
an unknown topic id UNKNOWN_TOPIC_ID (100). ShareAcknowledge: the acknowledgements alone, in the
same session (epoch 0 is INVALID_SHARE_SESSION_EPOCH).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Final

import structlog

from headwater.server.kafka import kafka_errors as k
from headwater.server.kafka.group_handlers import KafkaSession, Permits
from headwater.server.kafka.kafka_nodes import Node, Nodes
from headwater.server.kafka.messages import share as sh
from headwater.server.kafka.share_groups import HEARTBEAT_INTERVAL_MS, ShareGroups, refusal
from headwater.server.kafka.share_sessions import (
    Acknowledgement,
    Delivery,
    Inbox,
    ShareSession,
    ack_error,
    apply,
    grant,
    take_back,
)
from headwater.server.kafka.topic_ids import TopicIds
from headwater.server.kafka.topic_ids import topic_id as id_of_topic
from headwater.server.requests.broker import Broker
from headwater.server.security.authz import Action
from headwater.server.subscriptions.reliable_subscription import ReliableSubscription
from headwater.server.topics.subscription_contract import Consumer
from headwater.server.topics.topic import LogTopic
from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError

log = structlog.get_logger(__name__)

# Kafka's defaults for a share group made through the Kafka port
RECORD_LOCK_MS: Final = 30_000  # group.share.record.lock.duration.ms
DELIVERY_COUNT_LIMIT: Final = 5  # group.share.delivery.count.limit
# a new share group's subscription: Kafka's defaults (from the latest offset)
NEW_SHARE_GROUP: Final = m.SubscriptionSettings(
    start=m.StartPosition.LATEST, ack_timeout_ms=RECORD_LOCK_MS, max_deliveries=DELIVERY_COUNT_LIMIT
)
MAX_WAIT: Final = 30.0  # seconds a ShareFetch waits at most, whatever it asks
# seconds a member's share session outlives its leaving the group, for its final acknowledgements
LEAVE_GRACE: Final = 5.0
_NO_LEADER: Final = sh.LeaderIdAndEpoch(leader_id=-1, leader_epoch=-1)

# (topic, partition) -> (error code, message)
Errors = dict[tuple[str, int], tuple[int, str | None]]


class ShareHandlers:
    def __init__(self, broker: Broker, nodes: Nodes, permits: Permits, ids: TopicIds) -> None:
        self._broker = broker
        self._nodes = nodes
        self._permits = permits
        self._ids = ids
        self.groups = ShareGroups(self._member_gone)
        self.sessions: dict[tuple[str, str], ShareSession] = {}
        # the sessions whose latest request came through each connection (its close closes them)
        self._by_connection: dict[object, set[tuple[str, str]]] = {}
        # records acknowledged, by type (/metrics)
        self.acknowledged: dict[str, int] = {"accept": 0, "release": 0, "reject": 0}

    # Membership (the group's coordinator)

    def _elsewhere(self, group: str) -> bool:
        mine, chosen = self._nodes.this(), self._nodes.coordinator(group)
        return mine is None or chosen is None or chosen.node_id != mine.node_id

    def _partitions(self, session: KafkaSession, topic: str) -> int:
        found = self._broker.topics.get(topic)
        if not isinstance(found, LogTopic) or not self._permits(session, Action.CONSUME, topic):
            return 0
        return len(found.partitions)

    async def share_group_heartbeat(
        self, session: KafkaSession, version: int, request: sh.ShareGroupHeartbeatRequest
    ) -> sh.ShareGroupHeartbeatResponse:
        group = request.group_id
        topics = request.subscribed_topic_names
        # checked first, as Kafka does: nothing (a share group's subscription) is made for a
        # request that is refused
        invalid = refusal(group, request.member_id, request.member_epoch, request.rack_id, topics)
        if invalid is not None:
            return sh.ShareGroupHeartbeatResponse(
                error_code=k.INVALID_REQUEST, error_message=invalid, member_epoch=-1
            )
        if self._elsewhere(group):
            return sh.ShareGroupHeartbeatResponse(error_code=k.NOT_COORDINATOR)
        if topics is not None and request.member_epoch != -1:
            for topic in topics:
                refused = await self._ensure(group, topic)
                if refused is not None:
                    return sh.ShareGroupHeartbeatResponse(
                        error_code=k.INCONSISTENT_GROUP_PROTOCOL, error_message=refused
                    )
        beat = self.groups.heartbeat(
            group,
            request.member_id,
            request.member_epoch,
            request.rack_id,
            topics,
            (session.client_id, session.peer.rpartition(":")[0]),
            lambda topic: self._partitions(session, topic),
            time.monotonic(),
        )
        member = beat.member
        if beat.error or member is None:
            return sh.ShareGroupHeartbeatResponse(
                error_code=beat.error, error_message=beat.message, member_epoch=-1
            )
        assignment = None
        if member.epoch > 0:
            assignment = sh.Assignment(
                topic_partitions=[
                    sh.TopicPartitions(topic_id=id_of_topic(t), partitions=list(range(n)))
                    for t, n in member.assignment
                ]
            )
        return sh.ShareGroupHeartbeatResponse(
            member_id=member.member_id,
            member_epoch=member.epoch,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
            assignment=assignment,
        )

    async def _ensure(self, group: str, topic_name: str) -> str | None:
        """The share group's subscription on the topic, made if missing; why not (a subscription
        of another type has the name), None when it is there."""
        topic = self._broker.topics.get(topic_name)
        if not isinstance(topic, LogTopic):
            return None  # no such reliable topic: nothing to assign (it may be made later)
        existing = topic.subscriptions.get(group)
        if existing is None:
            catalog = self._broker.catalog
            try:
                async with catalog.turn(topic_name):
                    existing = await catalog.subscriptions.get_or_create(
                        topic,
                        group,
                        m.SubscriptionType.SHARED,
                        NEW_SHARE_GROUP,
                        # defined already through another broker: its partitions with no
                        # cursor yet (their owners' checkpoints win where there are some) are
                        # read from their start, never from the latest, which skipped what was
                        # produced since it was made there
                        adopted_start=m.StartPosition.EARLIEST,
                    )
            except HeadwaterError as exc:
                return str(exc.message)
        if not isinstance(existing, ReliableSubscription) or (
            existing.sub_type != m.SubscriptionType.SHARED
        ):
            return (
                f"subscription {group!r} of topic {topic_name!r} is "
                f"{existing.sub_type.name.lower()}, not shared: it is not a share group"
            )
        return None

    async def share_group_describe(
        self, session: KafkaSession, version: int, request: sh.ShareGroupDescribeRequest
    ) -> sh.ShareGroupDescribeResponse:
        self.groups.expire(time.monotonic())
        described = []
        for group_id in request.group_ids:
            if self._elsewhere(group_id):
                described.append(sh.DescribedGroup(error_code=k.NOT_COORDINATOR, group_id=group_id))
                continue
            group = self.groups.groups.get(group_id)
            if group is None and not self.share_subscriptions(group_id):
                described.append(
                    sh.DescribedGroup(
                        error_code=k.GROUP_ID_NOT_FOUND,
                        error_message=f"share group {group_id!r} does not exist",
                        group_id=group_id,
                        group_state="Dead",
                    )
                )
                continue
            members = [] if group is None else list(group.members.values())
            described.append(
                sh.DescribedGroup(
                    group_id=group_id,
                    group_state=self.groups.state(group_id),
                    group_epoch=0 if group is None else group.epoch,
                    assignment_epoch=0 if group is None else group.epoch,
                    assignor_name="simple",
                    members=[
                        sh.Member(
                            member_id=member.member_id,
                            rack_id=member.rack,
                            member_epoch=member.epoch,
                            client_id=member.client_id,
                            client_host=member.client_host,
                            subscribed_topic_names=list(member.topics),
                            assignment=sh.ShareGroupDescribeAssignment(
                                topic_partitions=[
                                    sh.ShareGroupDescribeTopicPartitions(
                                        topic_id=id_of_topic(topic),
                                        topic_name=topic,
                                        partitions=list(range(count)),
                                    )
                                    for topic, count in member.assignment
                                ]
                            ),
                        )
                        for member in members
                    ],
                )
            )
        return sh.ShareGroupDescribeResponse(groups=described)

    def share_subscriptions(self, group: str) -> list[str]:
        """The topics with a Shared reliable subscription named `group` (a share group's)."""
        return sorted(
            name
            for name, topic in self._broker.topics.items()
            if isinstance(found := topic.subscriptions.get(group), ReliableSubscription)
            and found.sub_type == m.SubscriptionType.SHARED
        )

    def _member_gone(self, group: str, member_id: str) -> None:
        """The member left or expired. Its share session outlives it for `LEAVE_GRACE` at most,
        for its final acknowledgements: librdkafka's close sends the leave heartbeat and the
        final request (epoch -1, carrying the last poll's acknowledgements) together, and the
        leave may come first. Closing the session then refused those acknowledgements, and the
        records the member had accepted went to the others again."""
        key = (group, member_id)
        share = self.sessions.get(key)
        if share is not None and share.leaving is None:
            share.leaving = asyncio.get_running_loop().call_later(
                LEAVE_GRACE, self._left, key, share
            )

    def _left(self, key: tuple[str, str], share: ShareSession) -> None:
        """A departed member's session whose final request did not come: closed."""
        if self.sessions.get(key) is share:
            log.info("kafka.share_session_left", group=key[0], member=key[1])
        self._close(share)

    def connection_closed(self, connection: object) -> None:
        """The sessions whose latest request came through this connection are closed: what
        they acquired is delivered again at once, their slots freed."""
        for key in self._by_connection.pop(connection, set()):
            share = self.sessions.get(key)
            if share is not None:
                log.info("kafka.share_session_disconnected", group=key[0], member=key[1])
                self._close(share)

    # Records (each partition's leader)

    def _through(self, share: ShareSession, connection: object) -> None:
        """The session's latest request came through `connection`."""
        key = (share.group, share.member_id)
        if share.connection is not connection:
            self._unindex(share)
            share.connection = connection
        self._by_connection.setdefault(connection, set()).add(key)

    def _unindex(self, share: ShareSession) -> None:
        keys = self._by_connection.get(share.connection)
        if keys is not None:
            keys.discard((share.group, share.member_id))
            if not keys:
                del self._by_connection[share.connection]

    def _close(self, share: ShareSession) -> None:
        """Forget the session (if it is still the member's) and detach its consumers: what
        they hold is delivered again at once."""
        key = (share.group, share.member_id)
        if self.sessions.get(key) is share:
            del self.sessions[key]
            self._unindex(share)
        if share.leaving is not None:
            share.leaving.cancel()
            share.leaving = None
        for consumer in share.consumers.values():
            if consumer.consumer_id in share.inbox.consumers:
                self._broker.consumers.detach(consumer)
        share.consumers.clear()
        share.inbox.deliveries.clear()
        share.inbox.holes.clear()

    def _session(
        self, session: KafkaSession, group: str | None, member: str | None, epoch: int, acks: bool
    ) -> tuple[ShareSession | None, int, str | None]:
        """The share session a request names (opened by epoch 0), or its top-level error."""
        if not group or not member:
            return None, k.INVALID_REQUEST, "a share request names its group and member"
        key = (group, member)
        share = self.sessions.get(key)
        if epoch == 0:
            if acks:
                return None, k.INVALID_REQUEST, "a session's first request acknowledges nothing"
            if share is not None:
                self._close(share)
            share = self.sessions[key] = ShareSession(
                group, member, Inbox(session.peer, session.principal), session
            )
        elif share is None:
            return None, k.SHARE_SESSION_NOT_FOUND, f"member {member!r} has no share session here"
        elif epoch != -1 and epoch != share.epoch:
            self._close(share)
            return (
                None,
                k.INVALID_SHARE_SESSION_EPOCH,
                f"the share session is at epoch {share.epoch}, not {epoch}",
            )
        self._through(share, session)
        return share, 0, None

    def _leader(self, topic: LogTopic, partition: int) -> Node | None:
        """The partition's leader when another broker (None: this one)."""
        leaders = self._nodes.leaders(topic.name, len(topic.partitions))
        mine = self._nodes.this()
        leader = leaders[partition] if partition < len(leaders) else None
        if leader is not None and mine is not None and leader.node_id == mine.node_id:
            return None
        return leader or Node(-1, "", -1, "")

    def _check(
        self, session: KafkaSession, name: str | None, partition: int, errors: Errors
    ) -> LogTopic | None:
        """The topic when this broker serves the partition; otherwise its error is noted."""
        if name is None:
            return None
        topic = self._broker.topics.get(name)
        if not isinstance(topic, LogTopic) or not 0 <= partition < len(topic.partitions):
            errors[name, partition] = (k.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {partition}")
            return None
        if not self._permits(session, Action.CONSUME, name):
            errors[name, partition] = (k.TOPIC_AUTHORIZATION_FAILED, None)
            return None
        if self._leader(topic, partition) is not None:
            errors[name, partition] = (k.NOT_LEADER_OR_FOLLOWER, None)
            return None
        return topic

    async def _consumer(self, share: ShareSession, topic: LogTopic) -> Consumer | str:
        """The session's consumer of the topic's share subscription (attached on first use);
        why there is none."""
        consumer = share.consumers.get(topic.name)
        if consumer is not None and consumer.consumer_id in share.inbox.consumers:
            return consumer
        refused = await self._ensure(share.group, topic.name)
        subscription = topic.subscriptions.get(share.group)
        if refused is not None or not isinstance(subscription, ReliableSubscription):
            return refused or f"topic {topic.name!r} has no share group {share.group!r}"
        consumer = Consumer(
            consumer_id=self._broker.consumers.new_consumer_id(),
            name=f"kafka-share:{share.member_id}",
            priority=0,
            session=share.inbox,
            subscription=subscription,
            whole_batches=True,  # MaxRecords "can be exceeded for alignment of batch boundaries"
        )
        subscription.attach(consumer)
        share.inbox.consumers[consumer.consumer_id] = consumer
        share.consumers[topic.name] = consumer
        log.info(
            "kafka.share_member_attached",
            topic=topic.name,
            group=share.group,
            member=share.member_id,
            consumer_id=consumer.consumer_id,
        )
        return consumer

    async def _acknowledge(
        self,
        session: KafkaSession,
        share: ShareSession,
        topics: Iterable[tuple[bytes, int, list[Acknowledgement]]],
        errors: Errors,
        results: Errors,
    ) -> None:
        """Apply each partition's acknowledgements, all of them or none (`results`: each
        partition's outcome)."""
        for topic_id, partition, batches in topics:
            name = self._ids.name(topic_id)
            if name is None:
                results[str(topic_id.hex()), partition] = (k.UNKNOWN_TOPIC_ID, None)
                continue
            topic = self._check(session, name, partition, errors)
            if topic is None:
                results[name, partition] = errors.pop((name, partition))
                continue
            consumer = share.consumers.get(name)
            subscription = topic.subscriptions.get(share.group)
            if consumer is None or not isinstance(subscription, ReliableSubscription):
                results[name, partition] = (
                    k.INVALID_RECORD_STATE,
                    f"member {share.member_id!r} acquired nothing of topic {name!r} here",
                )
                continue
            why = ack_error(subscription, consumer, batches)
            if why is not None:
                results[name, partition] = (k.INVALID_RECORD_STATE, why)
                continue
            holes = share.inbox.holes.setdefault((name, partition), set())
            for kind, count in apply(subscription, consumer, batches, holes).items():
                self.acknowledged[kind] += count
            results[name, partition] = (0, None)

    async def share_fetch(
        self, session: KafkaSession, version: int, request: sh.ShareFetchRequest
    ) -> sh.ShareFetchResponse:
        acks = [
            (t.topic_id, p.partition_index, _batches(p.partition_index, p.acknowledgement_batches))
            for t in request.topics
            for p in t.partitions
            if p.acknowledgement_batches
        ]
        epoch = request.share_session_epoch
        share, code, message = self._session(
            session, request.group_id, request.member_id, epoch, bool(acks)
        )
        if share is None:
            return sh.ShareFetchResponse(error_code=code, error_message=message)
        errors: Errors = {}
        results: Errors = {}
        if epoch != -1:
            share.epoch += 1
            for fetched in request.topics:
                name = self._ids.name(fetched.topic_id)
                for part in fetched.partitions:
                    if name is None:
                        errors[fetched.topic_id.hex(), part.partition_index] = (
                            k.UNKNOWN_TOPIC_ID,
                            None,
                        )
                    else:
                        share.partitions.add((name, part.partition_index))
            for forgotten in request.forgotten_topics_data:
                name = self._ids.name(forgotten.topic_id)
                share.partitions.difference_update((name, p) for p in forgotten.partitions)
        await self._acknowledge(session, share, acks, errors, results)
        lock = RECORD_LOCK_MS
        if epoch == -1:
            self._close(share)
            deliveries: list[Delivery] = []
        else:
            consumers: list[Consumer] = []
            # a member that left acquires nothing more: its session waits for its final request
            names = set() if share.leaving is not None else {name for name, _ in share.partitions}
            for name in sorted(names):
                served = [
                    p
                    for t, p in share.partitions
                    if t == name and self._check(session, t, p, errors)
                ]
                if not served:
                    continue
                topic = self._broker.topics[name]
                assert isinstance(topic, LogTopic)
                found = await self._consumer(share, topic)
                if isinstance(found, str):
                    for partition in served:
                        errors[name, partition] = (k.INVALID_REQUEST, found)
                    continue
                consumers.append(found)
                subscription = found.subscription
                assert isinstance(subscription, ReliableSubscription)
                lock = subscription.settings.ack_timeout_ms
            deliveries = await self._take(share, consumers, request)
        return self._fetch_answer(share, deliveries, errors, results, lock)

    async def _take(
        self, share: ShareSession, consumers: list[Consumer], request: sh.ShareFetchRequest
    ) -> list[Delivery]:
        """What the inbox holds, after waiting up to the request's wait for a delivery when it
        is empty (the consumers have credit only meanwhile)."""
        inbox = share.inbox
        if not inbox.deliveries and consumers and request.max_wait_ms > 0 and request.max_records:
            inbox.arrived.clear()
            for consumer in consumers:
                grant(consumer, request.max_records)
            try:
                async with asyncio.timeout(min(request.max_wait_ms / 1000, MAX_WAIT)):
                    await inbox.arrived.wait()
            except TimeoutError:
                pass
            finally:
                for consumer in consumers:
                    take_back(consumer)
        taken = list(inbox.deliveries)
        inbox.deliveries.clear()
        inbox.arrived.clear()
        return taken

    def _fetch_answer(
        self,
        share: ShareSession,
        deliveries: list[Delivery],
        errors: Errors,
        results: Errors,
        lock: int,
    ) -> sh.ShareFetchResponse:
        records: dict[tuple[str, int], list[bytes]] = {}
        acquired: dict[tuple[str, int], list[sh.AcquiredRecords]] = {}
        for delivery in deliveries:
            key = (delivery.topic, delivery.partition)
            records.setdefault(key, []).append(delivery.batch)
            acquired.setdefault(key, []).append(
                sh.AcquiredRecords(
                    first_offset=delivery.first,
                    last_offset=delivery.last,
                    delivery_count=delivery.count,
                )
            )
        keys = sorted(set(records) | set(errors) | set(results))
        topics: dict[str, list[sh.PartitionData]] = {}
        endpoints: dict[int, sh.NodeEndpoint] = {}
        for name, partition in keys:
            code, message = errors.get((name, partition), (0, None))
            ack_code, ack_message = results.get((name, partition), (0, None))
            leader = _NO_LEADER
            if code == k.NOT_LEADER_OR_FOLLOWER:
                leader, endpoint = self._leader_of(name, partition)
                if endpoint is not None:
                    endpoints[endpoint.node_id] = endpoint
            topics.setdefault(name, []).append(
                sh.PartitionData(
                    partition_index=partition,
                    error_code=code,
                    error_message=message,
                    acknowledge_error_code=ack_code,
                    acknowledge_error_message=ack_message,
                    current_leader=leader,
                    records=b"".join(records.get((name, partition), ())),
                    acquired_records=acquired.get((name, partition), []),
                )
            )
        return sh.ShareFetchResponse(
            acquisition_lock_timeout_ms=lock,
            responses=[
                sh.ShareFetchableTopicResponse(topic_id=self._topic_id(name), partitions=parts)
                for name, parts in topics.items()
            ],
            node_endpoints=list(endpoints.values()),
        )

    def _topic_id(self, name: str) -> bytes:
        """A topic's id; an unknown id's own bytes (kept as its hex in the error tables)."""
        topic = self._broker.topics.get(name)
        if topic is None and len(name) == 32:
            try:
                return bytes.fromhex(name)
            except ValueError:
                pass
        return id_of_topic(name)

    def _leader_of(
        self, name: str, partition: int
    ) -> tuple[sh.LeaderIdAndEpoch, sh.NodeEndpoint | None]:
        topic = self._broker.topics.get(name)
        if not isinstance(topic, LogTopic):
            return _NO_LEADER, None
        leader = self._leader(topic, partition)
        if leader is None or leader.node_id < 0:
            return _NO_LEADER, None
        return (
            sh.LeaderIdAndEpoch(leader_id=leader.node_id, leader_epoch=0),
            sh.NodeEndpoint(node_id=leader.node_id, host=leader.host, port=leader.port),
        )

    async def share_acknowledge(
        self, session: KafkaSession, version: int, request: sh.ShareAcknowledgeRequest
    ) -> sh.ShareAcknowledgeResponse:
        epoch = request.share_session_epoch
        if epoch == 0:
            return sh.ShareAcknowledgeResponse(
                error_code=k.INVALID_SHARE_SESSION_EPOCH,
                error_message="ShareAcknowledge cannot open a share session (epoch 0)",
            )
        share, code, message = self._session(
            session, request.group_id, request.member_id, epoch, True
        )
        if share is None:
            return sh.ShareAcknowledgeResponse(error_code=code, error_message=message)
        if epoch != -1:
            share.epoch += 1
        errors: Errors = {}
        results: Errors = {}
        acks = [
            (t.topic_id, p.partition_index, _batches(p.partition_index, p.acknowledgement_batches))
            for t in request.topics
            for p in t.partitions
        ]
        await self._acknowledge(session, share, acks, errors, results)
        if epoch == -1:
            self._close(share)
        topics: dict[str, list[sh.ShareAcknowledgePartitionData]] = {}
        endpoints: dict[int, sh.NodeEndpoint] = {}
        for (name, partition), (ack_code, ack_message) in sorted(results.items()):
            leader = sh.LeaderIdAndEpoch(leader_id=-1, leader_epoch=-1)
            if ack_code == k.NOT_LEADER_OR_FOLLOWER:
                found, endpoint = self._leader_of(name, partition)
                leader = sh.LeaderIdAndEpoch(
                    leader_id=found.leader_id, leader_epoch=found.leader_epoch
                )
                if endpoint is not None:
                    endpoints[endpoint.node_id] = sh.NodeEndpoint(
                        node_id=endpoint.node_id, host=endpoint.host, port=endpoint.port
                    )
            topics.setdefault(name, []).append(
                sh.ShareAcknowledgePartitionData(
                    partition_index=partition,
                    error_code=ack_code,
                    error_message=ack_message,
                    current_leader=leader,
                )
            )
        return sh.ShareAcknowledgeResponse(
            responses=[
                sh.ShareAcknowledgeTopicResponse(topic_id=self._topic_id(name), partitions=parts)
                for name, parts in topics.items()
            ],
            node_endpoints=list(endpoints.values()),
        )


def _batches(
    partition: int,
    batches: Iterable[sh.AcknowledgementBatch | sh.AcknowledgementBatch],
) -> list[Acknowledgement]:
    return [
        Acknowledgement(partition, b.first_offset, b.last_offset, tuple(b.acknowledge_types))
        for b in batches
    ]
