"""The consumer group APIs: FindCoordinator (the group's coordinator as `kafka_nodes` has it: this
broker for every group on one broker, one broker per group in a cluster), JoinGroup, SyncGroup,
Heartbeat, LeaveGroup (`groups.Coordinator`), OffsetCommit and OffsetFetch (`group_offsets`: a
group's offsets are the cursor of the reliable subscription of its name), ListGroups and
DescribeGroups. Each takes its typed request (`kafka.messages.groups`, `.offsets`) and returns its
typed response, which the codec writes at the request's version.

In a cluster a broker answers the requests of a group it does not coordinate NOT_COORDINATOR (a
coordinator moved by a broker joining or leaving, say): the client asks FindCoordinator again and
joins the group there (membership is in memory; the offsets are in etcd)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Protocol, TypeVar

from headwater.server.kafka import kafka_errors as k
from headwater.server.kafka.groups import Coordinator
from headwater.server.kafka.kafka_nodes import Nodes
from headwater.server.kafka.messages import groups as g
from headwater.server.kafka.messages import offsets as o
from headwater.server.kafka.messages.declare import Message
from headwater.server.requests.group_offsets import GroupOffsets
from headwater.server.security.access import Session
from headwater.server.security.authz import Action, transactional_id_resource
from headwater.server.topics.subscription_contract import ConsumerSession
from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError

T = TypeVar("T")


class KafkaSession(ConsumerSession, Protocol):
    """A Kafka connection as the handlers see it: a session that names its client and, with
    authentication on, is the peer `security.access.Security` authenticates and checks."""

    client_id: str
    raw_sasl: bool  # after a SaslHandshake v0: the next frame is bare SASL bytes
    # the last produce of the connection still handing its batches to the broker (handlers)
    produce_tail: asyncio.Future[None] | None
    peercert: Any
    auth: Session | None

    def revoke(self, error: HeadwaterError) -> None: ...


# may the session's principal take this action on this topic, or this `txn:<id>` (True without
# authentication)
Permits = Callable[[KafkaSession, Action, str], bool]
TRANSACTION_KEY: Final = 1  # FindCoordinator's key type of a transactional id
CLASSIC_TYPE: Final = "classic"  # ListGroups v5's group type of JoinGroup/SyncGroup groups


def may_use(permits: Permits, session: KafkaSession, transactional_id: str) -> bool:
    """Kafka's WRITE on the TransactionalId: `produce` on `txn:<id>`."""
    return permits(session, Action.PRODUCE, transactional_id_resource(transactional_id))


def may_describe(permits: Permits, session: KafkaSession, transactional_id: str) -> bool:
    """Kafka's DESCRIBE on the TransactionalId (which WRITE implies): any grant on `txn:<id>`."""
    resource = transactional_id_resource(transactional_id)
    return any(permits(session, action, resource) for action in Action)


# (session, API version, request) -> response, None for none (a Produce with acks=0). The table of
# handlers is keyed by API key, and the codec decodes each key's body as that API's request class
# (`apis.SERVED`), so a handler's request is typed `Any` here and precisely in its signature.
Handler = Callable[[KafkaSession, int, Any], Awaitable[Message | None]]

# a native request through the broker, checked as on the native port
Native = Callable[[KafkaSession, m.Request], Awaitable[m.Response]]

# partitions a handler goes through between two yields to the event loop: about a millisecond
PACE: Final = 1024


class Pace:
    """Counts the partitions a request's handler has gone through and yields to the event loop
    after every `PACE` of them: a request of 49,000 partitions lets the other clients in."""

    def __init__(self) -> None:
        self._done = 0

    async def step(self, count: int = 1) -> None:
        self._done += count
        if self._done >= PACE:
            self._done = 0
            await asyncio.sleep(0)


def chunks(items: Sequence[T]) -> list[Sequence[T]]:
    """`items` in runs of `PACE`, for a handler to take one run at a time."""
    return [items[start : start + PACE] for start in range(0, len(items), PACE)]


class GroupHandlers:
    def __init__(
        self,
        coordinator: Coordinator,
        offsets: GroupOffsets,
        nodes: Nodes,
        permits: Permits,
        native: Native,
    ) -> None:
        """`native`: a native request through the broker, checked as on the native port (a
        group's subscriptions deleted)."""
        self._native = native
        self.coordinator = coordinator
        self._offsets = offsets
        self._nodes = nodes
        # a group's offsets on a topic are a consumer's: committing and reading them takes the
        # consume grant on the topic (membership itself names no topic)
        self._permits = permits

    async def find_coordinator(
        self, session: KafkaSession, version: int, request: g.FindCoordinatorRequest
    ) -> g.FindCoordinatorResponse:
        if (
            version >= 1
            and request.key_type == TRANSACTION_KEY
            and not may_describe(self._permits, session, request.key)
        ):
            return g.FindCoordinatorResponse(
                error_code=k.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, node_id=-1, host="", port=-1
            )
        node = self._nodes.coordinator(request.key)
        if node is None:  # no broker with a Kafka port is live (as seen here): ask again
            return g.FindCoordinatorResponse(
                error_code=k.COORDINATOR_NOT_AVAILABLE, node_id=-1, host="", port=-1
            )
        return g.FindCoordinatorResponse(
            error_code=0, node_id=node.node_id, host=node.host, port=node.port
        )

    def _elsewhere(self, group: str) -> bool:
        """Whether `group` is coordinated by another broker (in a cluster)."""
        mine, chosen = self._nodes.this(), self._nodes.coordinator(group)
        return mine is None or chosen is None or chosen.node_id != mine.node_id

    async def join_group(
        self, session: KafkaSession, version: int, request: g.JoinGroupRequest
    ) -> g.JoinGroupResponse:
        if self._elsewhere(request.group_id):
            return g.JoinGroupResponse(error_code=k.NOT_COORDINATOR, member_id=request.member_id)
        session_timeout = request.session_timeout_ms
        # v1+; v0 rebalances within the session
        rebalance_timeout = request.rebalance_timeout_ms if version >= 1 else session_timeout
        joined = await self.coordinator.join(
            request.group_id,
            request.member_id,
            session.client_id,
            session.peer.rpartition(":")[0],
            session_timeout,
            rebalance_timeout,
            request.protocol_type,
            [(p.name, p.metadata) for p in request.protocols],
            request.group_instance_id if version >= 5 else None,
        )
        return g.JoinGroupResponse(
            error_code=joined.error_code,
            generation_id=joined.generation_id,
            protocol_name=joined.protocol,
            leader=joined.leader_id,
            member_id=joined.member_id or request.member_id,
            members=[
                g.JoinGroupResponseMember(member_id=i, group_instance_id=s, metadata=m)
                for i, s, m in joined.members
            ],
        )

    async def sync_group(
        self, session: KafkaSession, version: int, request: g.SyncGroupRequest
    ) -> g.SyncGroupResponse:
        if self._elsewhere(request.group_id):
            return g.SyncGroupResponse(error_code=k.NOT_COORDINATOR, assignment=b"")
        assignments = {a.member_id: a.assignment for a in request.assignments}
        code, assignment = await self.coordinator.sync(
            request.group_id,
            request.generation_id,
            request.member_id,
            assignments,
            request.group_instance_id,
        )
        return g.SyncGroupResponse(error_code=code, assignment=assignment)

    async def heartbeat(
        self, session: KafkaSession, version: int, request: g.HeartbeatRequest
    ) -> g.HeartbeatResponse:
        if self._elsewhere(request.group_id):
            return g.HeartbeatResponse(error_code=k.NOT_COORDINATOR)
        code = self.coordinator.heartbeat(
            request.group_id, request.generation_id, request.member_id, request.group_instance_id
        )
        return g.HeartbeatResponse(error_code=code)

    async def leave_group(
        self, session: KafkaSession, version: int, request: g.LeaveGroupRequest
    ) -> g.LeaveGroupResponse:
        if self._elsewhere(request.group_id):
            return g.LeaveGroupResponse(error_code=k.NOT_COORDINATOR)
        if version < 3:
            return g.LeaveGroupResponse(
                error_code=self.coordinator.leave(request.group_id, request.member_id)
            )
        # v3+: a batch of members, each by member id or static instance id (KIP-345)
        left = [
            g.MemberResponse(
                member_id=member.member_id,
                group_instance_id=member.group_instance_id,
                error_code=self.coordinator.leave(
                    request.group_id, member.member_id, member.group_instance_id
                ),
            )
            for member in request.members
        ]
        return g.LeaveGroupResponse(error_code=0, members=left)

    async def offset_commit(
        self, session: KafkaSession, version: int, request: o.OffsetCommitRequest
    ) -> o.OffsetCommitResponse:
        group = request.group_id
        generation = request.generation_id_or_member_epoch  # -1 in v0, which has none
        member = request.member_id
        # a member of a live group commits for its generation; generation -1 is a consumer that
        # keeps its offsets in a group without joining it (assign(), kcat -o stored)
        refusal = k.NOT_COORDINATOR if self._elsewhere(group) else 0
        known = self.coordinator.groups.get(group)
        if not refusal and generation >= 0 and known is not None and known.members:
            if member not in known.members:
                refusal = k.UNKNOWN_MEMBER_ID
            elif generation != known.generation:
                refusal = k.ILLEGAL_GENERATION
            elif known.state == "CompletingRebalance":
                # between the joins and the leader's assignment: whose partitions are whose is
                # not settled. While members rejoin (PreparingRebalance) their generation still
                # holds and they commit what they consumed before giving partitions up, as
                # Kafka lets them
                refusal = k.REBALANCE_IN_PROGRESS
        topics = []
        pace = Pace()
        for entry in request.topics:
            name = entry.name
            wanted: dict[int, int] = {}
            for named in chunks(entry.partitions):
                wanted.update((p.partition_index, p.committed_offset) for p in named)
                await pace.step(len(named))
            denied = not self._permits(session, Action.CONSUME, name)
            codes: dict[int, int] = dict.fromkeys(
                wanted, k.TOPIC_AUTHORIZATION_FAILED if denied else refusal
            )
            if not refusal and not denied:
                # a topic's partitions a run at a time, each run in a turn of the topic
                for run in chunks(list(wanted.items())):
                    for partition, error in (
                        await self._offsets.commit(group, name, dict(run))
                    ).items():
                        codes[partition] = 0 if error is None else k.kafka_code(error)
                    await pace.step(len(run))
            partitions: list[o.OffsetCommitResponsePartition] = []
            for answered in chunks(list(codes.items())):
                partitions += (
                    o.OffsetCommitResponsePartition(partition_index=p, error_code=c)
                    for p, c in answered
                )
                await pace.step(len(answered))
            topics.append(o.OffsetCommitResponseTopic(name=name, partitions=partitions))
        return o.OffsetCommitResponse(throttle_time_ms=0, topics=topics)

    async def offset_fetch(
        self, session: KafkaSession, version: int, request: o.OffsetFetchRequest
    ) -> o.OffsetFetchResponse:
        group = request.group_id
        if self._elsewhere(group):
            return o.OffsetFetchResponse(error_code=k.NOT_COORDINATOR)
        wanted = request.topics
        if wanted is None:  # v2+: every topic the group has offsets on, each partition
            wanted = [
                o.OffsetFetchRequestTopic(name=t)
                for t in self._offsets.topics_of(group)
                if self._permits(session, Action.CONSUME, t)
            ]
        topics = []
        for entry in wanted:
            name = entry.name
            asked = list(entry.partition_indexes) or self._partitions(name)
            code = 0
            offsets = dict.fromkeys(asked, -1)
            if not self._permits(session, Action.CONSUME, name):
                code = k.TOPIC_AUTHORIZATION_FAILED
            else:
                try:
                    offsets = await self._offsets.committed(group, name, asked)
                except HeadwaterError as exc:
                    code = k.kafka_code(exc)
            partitions = [
                o.OffsetFetchResponsePartition(
                    partition_index=p, committed_offset=offsets[p], metadata="", error_code=code
                )
                for p in asked
            ]
            topics.append(o.OffsetFetchResponseTopic(name=name, partitions=partitions))
        return o.OffsetFetchResponse(throttle_time_ms=0, topics=topics, error_code=0)

    def _partitions(self, topic: str) -> list[int]:
        return self._offsets.partitions(topic)

    async def list_groups(
        self, session: KafkaSession, version: int, request: g.ListGroupsRequest
    ) -> g.ListGroupsResponse:
        """The groups with members or a rebalance under way, and, as Kafka lists a group with
        committed offsets and no members (protocol type ""), the reliable subscriptions on
        topics the principal may consume (state Empty); in a cluster those this broker
        coordinates. Each of type `classic` (ListGroups v5; the caller filters)."""
        listed = {
            group.name: g.ListedGroup(
                group_id=group.name,
                protocol_type=group.protocol_type,
                group_state=group.state,
                group_type=CLASSIC_TYPE,
            )
            for group in self.coordinator.groups.values()
            if not self._elsewhere(group.name)
        }
        for name, topics in self._offsets.groups().items():
            if name in listed or self._elsewhere(name):
                continue
            if any(self._permits(session, Action.CONSUME, t) for t in topics):
                listed[name] = g.ListedGroup(
                    group_id=name, protocol_type="", group_state="Empty", group_type=CLASSIC_TYPE
                )
        groups = [listed[name] for name in sorted(listed)]
        return g.ListGroupsResponse(throttle_time_ms=0, error_code=0, groups=groups)

    async def describe_groups(
        self, session: KafkaSession, version: int, request: g.DescribeGroupsRequest
    ) -> g.DescribeGroupsResponse:
        described = []
        for name in request.groups:
            if self._elsewhere(name):
                described.append(g.DescribedGroup(error_code=k.NOT_COORDINATOR, group_id=name))
                continue
            group = self.coordinator.groups.get(name)
            if group is None:  # Kafka describes an unknown group as a dead one
                described.append(g.DescribedGroup(error_code=0, group_id=name, group_state="Dead"))
                continue
            stable = group.state == "Stable"
            members = [
                g.DescribedGroupMember(
                    member_id=m.member_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    member_metadata=next(
                        (meta for p, meta in m.protocols if p == group.protocol), b""
                    ),
                    member_assignment=m.assignment if stable else b"",
                )
                for m in group.members.values()
            ]
            described.append(
                g.DescribedGroup(
                    error_code=0,
                    group_id=name,
                    group_state=group.state,
                    protocol_type=group.protocol_type,
                    protocol_data=group.protocol,
                    members=members,
                )
            )
        return g.DescribeGroupsResponse(throttle_time_ms=0, groups=described)

    async def delete_groups(
        self, session: KafkaSession, version: int, request: g.DeleteGroupsRequest
    ) -> g.DeleteGroupsResponse:
        """A group with no members loses its offsets: the subscription of its name on each topic
        is deleted (as `headwater subscription delete`, the owner-or-admin check of the native
        port). With members: NON_EMPTY_GROUP; neither members nor offsets: GROUP_ID_NOT_FOUND."""
        results = []
        for name in request.groups_names:
            results.append(
                g.DeletableGroupResult(group_id=name, error_code=await self._delete(session, name))
            )
        return g.DeleteGroupsResponse(throttle_time_ms=0, results=results)

    async def _delete(self, session: KafkaSession, name: str) -> int:
        if self._elsewhere(name):
            return k.NOT_COORDINATOR
        group = self.coordinator.groups.get(name)
        if group is not None and (group.members or group.state != "Empty"):
            return k.NON_EMPTY_GROUP
        topics = self._offsets.topics_of(name)
        if group is None and not topics:
            return k.GROUP_ID_NOT_FOUND
        for topic in topics:
            try:
                await self._native(session, m.DeleteSubscriptionRequest(topic, name))
            except HeadwaterError as exc:
                return k.kafka_code(exc)
        self.coordinator.forget(name)
        return 0
