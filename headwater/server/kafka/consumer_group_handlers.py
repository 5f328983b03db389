"""The APIs of Kafka 4's consumer group protocol (KIP-848): ConsumerGroupHeartbeat (membership,
subscription and assignment in one request, `consumer_groups`) and ConsumerGroupDescribe, and how
the classic group APIs see such groups (DescribeGroups, ListGroups, JoinGroup, OffsetCommit and
DeleteGroups pass through here to `group_handlers`, TxnOffsetCommit to `txn_handlers`).

- Topics travel by id (`topic_ids`): a heartbeat's owned partitions of a topic id no topic has
  are dropped (the topic was deleted). A subscription to topics the principal may not consume is
  TOPIC_AUTHORIZATION_FAILED. A regular-expression subscription is INVALID_REGULAR_EXPRESSION
  (not served: Python's regular expressions can take exponential time, Kafka's RE2J cannot).
- A group is of one protocol at a time, as in Kafka with `group.consumer.migration.policy`
  disabled: a heartbeat to a classic group with members is GROUP_ID_NOT_FOUND ("not a consumer
  group"), a JoinGroup to a consumer group with members INCONSISTENT_GROUP_PROTOCOL; a group with
  no members changes protocol with its next member (its committed offsets, the subscriptions of
  its name, stay).
- OffsetCommit and TxnOffsetCommit (a transactional producer's `send_offsets_to_transaction`)
  of a consumer group check the member and its epoch (sent in the generation field):
  UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH (ahead), STALE_MEMBER_EPOCH (behind); a commit without
  membership is taken only while the group has no members. The offsets themselves are the
  classic groups' (`requests.group_offsets`: the cursor of the subscription of the name).
- ListGroups (v0-5) lists them with protocol type `consumer`, type `consumer` and their state
  beside the classic groups (type `classic`), filtered by state (v4) and type (v5) as Kafka does:
  a stock admin client's `list_consumer_groups(types=...)` asks v5.
- DescribeGroups describes a consumer group as Kafka 4 does: protocol type `consumer`, the
  assignor as protocol, each member's subscription and assignment in the classic consumer
  protocol's encoding.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Final

from headwater.durables.consumer_protocol import (
    Assignment,
    Beat,
    ConsumerGroupState,
    Refusal,
    Refused,
)
from headwater.server.kafka import kafka_errors as k
from headwater.server.kafka.consumer_groups import ConsumerGroups
from headwater.server.kafka.group_handlers import GroupHandlers, KafkaSession, Permits
from headwater.server.kafka.kafka_nodes import Nodes
from headwater.server.kafka.messages import consumer_protocol as cp
from headwater.server.kafka.messages import groups as g
from headwater.server.kafka.messages import offsets as o
from headwater.server.kafka.messages import transactions as tx
from headwater.server.kafka.share_groups import ShareGroup
from headwater.server.kafka.topic_ids import TopicIds, topic_id
from headwater.server.security.authz import Action

PROTOCOL_TYPE: Final = "consumer"
GROUP_TYPE: Final = "consumer"  # ListGroups v5's type of these groups
SHARE_TYPE: Final = "share"  # a share group's protocol type and ListGroups type (KIP-932)
CODES: Final = {
    Refusal.INVALID_REQUEST: k.INVALID_REQUEST,
    Refusal.UNKNOWN_MEMBER: k.UNKNOWN_MEMBER_ID,
    Refusal.FENCED_EPOCH: k.FENCED_MEMBER_EPOCH,
    Refusal.STALE_EPOCH: k.STALE_MEMBER_EPOCH,
    Refusal.UNSUPPORTED_ASSIGNOR: k.UNSUPPORTED_ASSIGNOR,
    Refusal.UNRELEASED_INSTANCE: k.UNRELEASED_INSTANCE_ID,
    Refusal.GROUP_FULL: k.GROUP_MAX_SIZE_REACHED,
    # librdkafka looks for the coordinator again and sends its whole state (a full heartbeat)
    Refusal.REBUILDING: k.COORDINATOR_NOT_AVAILABLE,
}
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def _string(text: str) -> bytes:
    data = text.encode()
    return _I16.pack(len(data)) + data


def subscription_bytes(topics: Sequence[str]) -> bytes:
    """ConsumerProtocolSubscription v0: the topics, no user data."""
    return (
        _I16.pack(0) + _I32.pack(len(topics)) + b"".join(_string(t) for t in topics) + _I32.pack(-1)
    )


def assignment_bytes(assignment: Mapping[str, frozenset[int]]) -> bytes:
    """ConsumerProtocolAssignment v0: each topic's partitions, no user data."""
    parts = [_I16.pack(0), _I32.pack(len(assignment))]
    for topic, partitions in sorted(assignment.items()):
        parts += [_string(topic), _I32.pack(len(partitions))]
        parts += [_I32.pack(p) for p in sorted(partitions)]
    parts.append(_I32.pack(-1))
    return b"".join(parts)


class ConsumerGroupHandlers:
    def __init__(
        self,
        groups: ConsumerGroups,
        classic: GroupHandlers,
        nodes: Nodes,
        topic_ids: TopicIds,
        partitions: Callable[[str], int | None],
        permits: Permits,
        txn_offset_commit: Callable[
            [KafkaSession, int, tx.TxnOffsetCommitRequest], Awaitable[tx.TxnOffsetCommitResponse]
        ],
        share_groups: Mapping[str, ShareGroup] | None = None,
    ) -> None:
        """`partitions`: a topic's partition count, None when it does not exist.
        `txn_offset_commit`: the transactions' handler, for the commits this one takes.
        `share_groups`: the share groups coordinated here (`ShareGroups.groups`), which
        ListGroups lists with their type."""
        self.groups = groups
        self._classic = classic
        self._nodes = nodes
        self._ids = topic_ids
        self._partitions = partitions
        self._permits = permits
        self._txn_offset_commit = txn_offset_commit
        self._share_groups: Mapping[str, ShareGroup] = {} if share_groups is None else share_groups

    def _elsewhere(self, group: str) -> bool:
        mine, chosen = self._nodes.this(), self._nodes.coordinator(group)
        return mine is None or chosen is None or chosen.node_id != mine.node_id

    def _classic_members(self, name: str) -> bool:
        group = self._classic.coordinator.groups.get(name)
        return group is not None and bool(group.members)

    def _consumer_group(self, name: str) -> ConsumerGroupState | None:
        return self.groups.groups.get(name)

    # ConsumerGroupHeartbeat

    async def consumer_group_heartbeat(
        self, session: KafkaSession, version: int, request: cp.ConsumerGroupHeartbeatRequest
    ) -> cp.ConsumerGroupHeartbeatResponse:
        def refused(code: int, message: str) -> cp.ConsumerGroupHeartbeatResponse:
            return cp.ConsumerGroupHeartbeatResponse(error_code=code, error_message=message)

        name = request.group_id
        if not name:
            return refused(k.INVALID_REQUEST, "the group id must not be empty")
        if self._elsewhere(name):
            return refused(k.NOT_COORDINATOR, f"this broker does not coordinate group {name!r}")
        if self._classic_members(name):
            return refused(k.GROUP_ID_NOT_FOUND, f"Group {name} is not a consumer group.")
        if request.subscribed_topic_regex:
            return refused(
                k.INVALID_REGULAR_EXPRESSION,
                "Headwater does not serve regular-expression subscriptions: subscribe to names",
            )
        topics = None
        if request.subscribed_topic_names is not None:
            topics = frozenset(request.subscribed_topic_names)
            denied = sorted(t for t in topics if not self._permits(session, Action.CONSUME, t))
            if denied:
                return refused(
                    k.TOPIC_AUTHORIZATION_FAILED, f"not allowed to consume {', '.join(denied)}"
                )
        owned: dict[str, frozenset[int]] | None = None
        if request.topic_partitions is not None:
            owned = {}
            for entry in request.topic_partitions:
                topic = self._ids.name(entry.topic_id)
                if topic is not None:  # a topic deleted since: nothing to own
                    owned[topic] = owned.get(topic, frozenset()) | frozenset(entry.partitions)
        timeout = request.rebalance_timeout_ms
        beat = Beat(
            member_id=request.member_id,
            epoch=request.member_epoch,
            instance_id=request.instance_id,
            rack_id=request.rack_id,
            rebalance_timeout=None if timeout < 0 else timeout / 1000,
            topics=topics,
            assignor=request.server_assignor,
            owned=owned,
            client_id=session.client_id,
            client_host=session.peer.rpartition(":")[0],
        )
        try:
            answer = self.groups.heartbeat(name, beat, self._partitions)
        except Refused as exc:
            return refused(CODES[exc.reason], exc.message)
        assignment = None
        if answer.assignment is not None:
            assignment = cp.HeartbeatAssignment(
                topic_partitions=[
                    cp.AssignedTopicPartitions(topic_id=topic_id(t), partitions=sorted(ps))
                    for t, ps in sorted(answer.assignment.items())
                ]
            )
        return cp.ConsumerGroupHeartbeatResponse(
            error_code=0,
            member_id=answer.member_id,
            member_epoch=answer.epoch,
            heartbeat_interval_ms=int(self.groups.heartbeat_interval * 1000),
            assignment=assignment,
        )

    # ConsumerGroupDescribe

    async def consumer_group_describe(
        self, session: KafkaSession, version: int, request: cp.ConsumerGroupDescribeRequest
    ) -> cp.ConsumerGroupDescribeResponse:
        described = [self._describe(name) for name in request.group_ids]
        return cp.ConsumerGroupDescribeResponse(throttle_time_ms=0, groups=described)

    def _describe(self, name: str) -> cp.ConsumerGroup:
        if self._elsewhere(name):
            return cp.ConsumerGroup(
                error_code=k.NOT_COORDINATOR,
                error_message=f"this broker does not coordinate group {name!r}",
                group_id=name,
            )
        group = self._consumer_group(name)
        if group is None:
            classic = self._classic.coordinator.groups.get(name)
            return cp.ConsumerGroup(
                error_code=k.GROUP_ID_NOT_FOUND,
                error_message=f"Group {name} is not a consumer group."
                if classic is not None
                else f"Group {name} not found.",
                group_id=name,
            )

        def described(assignment: Assignment) -> cp.MemberAssignment:
            return cp.MemberAssignment(
                topic_partitions=[
                    cp.DescribedTopicPartitions(
                        topic_id=topic_id(t), topic_name=t, partitions=sorted(ps)
                    )
                    for t, ps in sorted(assignment.items())
                ]
            )

        members = [
            cp.ConsumerGroupMember(
                member_id=m.member_id,
                instance_id=m.instance_id,
                rack_id=m.rack_id,
                member_epoch=m.epoch,
                client_id=m.client_id,
                client_host=m.client_host,
                subscribed_topic_names=sorted(m.topics),
                subscribed_topic_regex=m.regex,
                assignment=described(m.assigned),
                target_assignment=described(group.target.get(m.member_id, {})),
            )
            for m in group.members.values()
        ]
        return cp.ConsumerGroup(
            error_code=0,
            group_id=name,
            group_state=group.state(),
            group_epoch=group.group_epoch,
            assignment_epoch=group.assignment_epoch,
            assignor_name=group.assignor,
            members=members,
        )

    # the classic APIs, as they see consumer groups

    async def join_group(
        self, session: KafkaSession, version: int, request: g.JoinGroupRequest
    ) -> g.JoinGroupResponse:
        group = self._consumer_group(request.group_id)
        if group is not None and group.members and not self._elsewhere(request.group_id):
            return g.JoinGroupResponse(
                error_code=k.INCONSISTENT_GROUP_PROTOCOL, member_id=request.member_id
            )
        return await self._classic.join_group(session, version, request)

    def _commit_refused(self, name: str, member_id: str, epoch: int) -> int | None:
        """The error code of a commit to consumer group `name` by `member_id` at `epoch`, 0 when
        taken; None when `name` is no consumer group of this coordinator (a classic one's
        commits are the classic handlers' to check)."""
        group = self._consumer_group(name)
        if group is None or self._elsewhere(name):
            return None
        try:
            group.check_commit(member_id, epoch)
        except Refused as exc:
            return CODES[exc.reason]
        return 0

    async def offset_commit(
        self, session: KafkaSession, version: int, request: o.OffsetCommitRequest
    ) -> o.OffsetCommitResponse:
        code = self._commit_refused(
            request.group_id, request.member_id, request.generation_id_or_member_epoch
        )
        if code:
            return o.OffsetCommitResponse(
                throttle_time_ms=0,
                topics=[
                    o.OffsetCommitResponseTopic(
                        name=t.name,
                        partitions=[
                            o.OffsetCommitResponsePartition(
                                partition_index=p.partition_index, error_code=code
                            )
                            for p in t.partitions
                        ],
                    )
                    for t in request.topics
                ],
            )
        if code == 0:
            # the classic handler checks classic membership: this group has none
            request = replace(request, generation_id_or_member_epoch=-1, member_id="")
        return await self._classic.offset_commit(session, version, request)

    async def txn_offset_commit(
        self, session: KafkaSession, version: int, request: tx.TxnOffsetCommitRequest
    ) -> tx.TxnOffsetCommitResponse:
        """A transactional producer's commit for a consumer (`send_offsets_to_transaction`):
        the member and its epoch (v3's generation id) checked as OffsetCommit's."""
        code = self._commit_refused(request.group_id, request.member_id, request.generation_id)
        if not code:
            return await self._txn_offset_commit(session, version, request)
        return tx.TxnOffsetCommitResponse(
            throttle_time_ms=0,
            topics=[
                tx.TxnOffsetCommitResponseTopic(
                    name=t.name,
                    partitions=[
                        tx.TxnOffsetCommitResponsePartition(
                            partition_index=p.partition_index, error_code=code
                        )
                        for p in t.partitions
                    ],
                )
                for t in request.topics
            ],
        )

    async def list_groups(
        self, session: KafkaSession, version: int, request: g.ListGroupsRequest
    ) -> g.ListGroupsResponse:
        """The classic groups and ours, each with its state (v4) and type (v5), filtered as
        Kafka filters: by state and by type, each case-insensitive, an empty filter passing
        all (a type no group has, as Kafka's unknown type, matches none)."""
        listed = await self._classic.list_groups(session, version, request)
        groups = {group.group_id: group for group in listed.groups}
        for name, group in self.groups.groups.items():
            if not self._elsewhere(name):
                groups[name] = g.ListedGroup(
                    group_id=name,
                    protocol_type=PROTOCOL_TYPE,
                    group_state=group.state(),
                    group_type=GROUP_TYPE,
                )
        for name, share in self._share_groups.items():
            if not self._elsewhere(name):  # (listed by the classic handler as a subscription)
                groups[name] = g.ListedGroup(
                    group_id=name,
                    protocol_type=SHARE_TYPE,
                    group_state="Stable" if share.members else "Empty",
                    group_type=SHARE_TYPE,
                )
        states = {s.strip().lower() for s in request.states_filter}
        types = {t.strip().lower() for t in request.types_filter}
        chosen = [
            group
            for _, group in sorted(groups.items())
            if (not states or group.group_state.lower() in states)
            and (not types or group.group_type in types)
        ]
        return g.ListGroupsResponse(throttle_time_ms=0, error_code=0, groups=chosen)

    async def describe_groups(
        self, session: KafkaSession, version: int, request: g.DescribeGroupsRequest
    ) -> g.DescribeGroupsResponse:
        described = await self._classic.describe_groups(session, version, request)
        groups = []
        for entry in described.groups:
            group = self._consumer_group(entry.group_id)
            if group is not None and not entry.error_code and not self._elsewhere(entry.group_id):
                entry = g.DescribedGroup(
                    error_code=0,
                    group_id=entry.group_id,
                    group_state=group.state(),
                    protocol_type=PROTOCOL_TYPE,
                    protocol_data=group.assignor,
                    members=[
                        g.DescribedGroupMember(
                            member_id=m.member_id,
                            client_id=m.client_id,
                            client_host=m.client_host,
                            member_metadata=subscription_bytes(sorted(m.topics)),
                            member_assignment=assignment_bytes(m.assigned),
                        )
                        for m in group.members.values()
                    ],
                )
            groups.append(entry)
        return g.DescribeGroupsResponse(throttle_time_ms=0, groups=groups)

    async def delete_groups(
        self, session: KafkaSession, version: int, request: g.DeleteGroupsRequest
    ) -> g.DeleteGroupsResponse:
        """A consumer group with members is NON_EMPTY_GROUP; the others as classic groups."""
        busy = {
            name
            for name in request.groups_names
            if (group := self._consumer_group(name)) is not None and group.members
        }
        rest = [name for name in request.groups_names if name not in busy]
        deleted = await self._classic.delete_groups(
            session, version, g.DeleteGroupsRequest(groups_names=rest)
        )
        results = {r.group_id: r for r in deleted.results}
        return g.DeleteGroupsResponse(
            throttle_time_ms=0,
            results=[
                results.get(name)
                or g.DeletableGroupResult(group_id=name, error_code=k.NON_EMPTY_GROUP)
                for name in request.groups_names
            ],
        )
