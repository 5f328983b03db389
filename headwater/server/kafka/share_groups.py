"""Share groups' membership (KIP-932), in memory: who is in each group, their epochs and what
they are assigned.

A share group is a set of members, each with the topics it subscribes to; a member joins with
epoch 0 and a member id it made itself, heartbeats with the epoch it was given, and leaves with
-1. Assignment is KIP-932's for share groups: records, not partitions, are what members share, so
every member is assigned every partition of every topic it subscribes to (on each broker the
group's Shared subscription hands each record to one member at a time). A member's epoch goes up
when its assignment changes (a topic made, grown or deleted, its subscription changed); the group
epoch counts changes of the group.

A member that sends no heartbeat for the session timeout (`SESSION_TIMEOUT`,
`group.share.session.timeout.ms`) is removed, as one that leaves: `on_removed` is told, which
closes its share sessions once their final acknowledgements are in (or a few seconds passed),
and the records it still had acquired are delivered again at once.

Errors, as Kafka answers them: a heartbeat of an unknown member UNKNOWN_MEMBER_ID (25), of a
member with another epoch FENCED_MEMBER_EPOCH (110), a join without a member id or topics
INVALID_REQUEST (42), an empty group id INVALID_GROUP_ID (24), a group already at
`MAX_GROUP_SIZE` members GROUP_MAX_SIZE_REACHED (81).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from headwater.server.kafka import kafka_errors as k

SESSION_TIMEOUT: Final = 45.0  # seconds: group.share.session.timeout.ms, Kafka's default
HEARTBEAT_INTERVAL_MS: Final = 5_000  # group.share.heartbeat.interval.ms, Kafka's default
MAX_GROUP_SIZE: Final = 200  # group.share.max.size, Kafka's default
MAX_SUBSCRIBED_TOPICS: Final = 1_000  # topics one member may subscribe to


@dataclass(slots=True)
class ShareMember:
    member_id: str
    client_id: str
    client_host: str
    rack: str | None
    topics: tuple[str, ...]
    epoch: int = 0
    assignment: tuple[tuple[str, int], ...] = ()  # (topic, partition count), sorted
    deadline: float = 0.0


@dataclass(slots=True)
class ShareGroup:
    group_id: str
    members: dict[str, ShareMember] = field(default_factory=dict)
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A heartbeat's answer: an error code, or the member (its epoch and assignment)."""

    error: int = 0
    message: str | None = None
    member: ShareMember | None = None


class ShareGroups:
    def __init__(
        self,
        on_removed: Callable[[str, str], None],
        session_timeout: float = SESSION_TIMEOUT,
    ) -> None:
        """`on_removed(group, member)`: a member left or expired."""
        self.groups: dict[str, ShareGroup] = {}
        self._on_removed = on_removed
        self._timeout = session_timeout

    def heartbeat(
        self,
        group_id: str,
        member_id: str,
        epoch: int,
        rack: str | None,
        topics: Sequence[str] | None,
        client: tuple[str, str],
        partitions: Callable[[str], int],
        now: float,
    ) -> Heartbeat:
        """`topics`: None when unchanged; `client`: (client id, host); `partitions(topic)`: its
        partition count, 0 for a topic that does not exist (or that a share group cannot read)."""
        invalid = refusal(group_id, member_id, epoch, rack, topics)
        if invalid is not None:
            return Heartbeat(k.INVALID_REQUEST, invalid)
        self.expire(now)
        group = self.groups.get(group_id)
        if epoch == -1:
            if group is not None and group.members.pop(member_id, None) is not None:
                self._removed(group, member_id)
            return Heartbeat(member=ShareMember(member_id, *client, rack, (), epoch=-1))
        if epoch == 0:
            if group is None:
                group = self.groups[group_id] = ShareGroup(group_id)
            member = group.members.get(member_id)
            if member is None:
                if len(group.members) >= MAX_GROUP_SIZE:
                    return Heartbeat(
                        k.GROUP_MAX_SIZE_REACHED,
                        f"share group {group_id!r} has {MAX_GROUP_SIZE} members already",
                    )
                member = group.members[member_id] = ShareMember(member_id, *client, rack, ())
                group.epoch += 1
        else:
            member = None if group is None else group.members.get(member_id)
            if group is None or member is None:
                return Heartbeat(
                    k.UNKNOWN_MEMBER_ID, f"member {member_id!r} is not in group {group_id!r}"
                )
            if epoch != member.epoch:
                return Heartbeat(
                    k.FENCED_MEMBER_EPOCH,
                    f"member {member_id!r} is at epoch {member.epoch}, not {epoch}",
                )
        if topics is not None:
            member.topics = tuple(sorted(set(topics)))
        if rack is not None:
            member.rack = rack
        member.deadline = now + self._timeout
        assignment = tuple(
            (topic, count) for topic in member.topics if (count := partitions(topic)) > 0
        )
        if assignment != member.assignment or member.epoch == 0:
            member.assignment = assignment
            member.epoch += 1
            group.epoch += 1
        return Heartbeat(member=member)

    def expire(self, now: float) -> None:
        """Remove the members whose session timed out (and groups left empty)."""
        for group in list(self.groups.values()):
            for member in list(group.members.values()):
                if member.deadline <= now:
                    del group.members[member.member_id]
                    self._removed(group, member.member_id)
            if not group.members:
                del self.groups[group.group_id]

    def _removed(self, group: ShareGroup, member_id: str) -> None:
        group.epoch += 1
        self._on_removed(group.group_id, member_id)

    def state(self, group_id: str) -> str:
        """Kafka's share group state: Stable with members, Empty without, Dead if unknown."""
        group = self.groups.get(group_id)
        if group is None:
            return "Dead"
        return "Stable" if group.members else "Empty"


def refusal(
    group_id: str, member_id: str, epoch: int, rack: str | None, topics: Sequence[str] | None
) -> str | None:
    """Why a ShareGroupHeartbeat is INVALID_REQUEST, as Kafka's coordinator checks it before
    anything else: an empty group, member or rack id, an epoch below -1, a join naming no topic
    (and here, more than `MAX_SUBSCRIBED_TOPICS` topics); None when it is not."""
    if not member_id:
        return "MemberId can't be empty."
    if not group_id:
        return "GroupId can't be empty."
    if rack == "":
        return "RackId can't be empty."
    if epoch == 0 and not topics:
        return "SubscribedTopicNames must be set in first request."
    if epoch < -1:
        return "MemberEpoch is invalid."
    if topics is not None and len(topics) > MAX_SUBSCRIBED_TOPICS:
        return f"more than {MAX_SUBSCRIBED_TOPICS} topics"
    return None
