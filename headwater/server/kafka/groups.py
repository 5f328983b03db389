"""Kafka consumer group membership: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, kept in memory.

Kafka's classic group protocol, on this one broker (the coordinator of every group): members join
(JoinGroup), one of them, the leader, gets everyone's subscription metadata and computes the
assignment, which SyncGroup hands each member; Heartbeat keeps a member in and tells it to join
again when a rebalance starts. A group moves Empty → PreparingRebalance → CompletingRebalance →
Stable, and back to PreparingRebalance when a member joins, leaves or is expired.

- A rebalance completes when every known member has sent its JoinGroup, or after the largest
  rebalance timeout of them (members that did not rejoin are dropped). A group's first rebalance
  waits `INITIAL_DELAY` first so that members starting together land in one generation.
- A member that sends nothing for its session timeout is removed by the coordinator's sweep.
- Static membership (KIP-345, JoinGroup v5+ with a `group.instance.id`): a member that joins
  again with its instance id and no member id (a restarted consumer) takes the place of the
  member that had the id, with a new member id and the old one's assignment: in a Stable group
  with the same protocols, no rebalance (the others keep going), and the old member id is fenced
  (FENCED_INSTANCE_ID when it comes back with the instance id). A static member leaves only by
  an explicit LeaveGroup (v3's members) or its session timeout.
- Every wait is bounded (the rebalance timeout, the session timeout) and each group's members by
  `MAX_MEMBERS`.

Membership lives in memory, as Kafka keeps it in its coordinator: after a restart members join
again (their clients do so on the UNKNOWN_MEMBER_ID they get). What a group commits is durable:
`group_offsets`.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from dataclasses import dataclass, field
from typing import Final

import structlog

from headwater.server.kafka import kafka_errors as k

log = structlog.get_logger(__name__)

INITIAL_DELAY: Final = 0.3
MAX_MEMBERS: Final = 1000
MAX_GROUPS: Final = 10_000
_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Joined:
    """What a JoinGroup is answered."""

    error_code: int
    generation_id: int = -1
    protocol: str = ""
    leader_id: str = ""
    member_id: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()  # member id, instance id, metadata


@dataclass(eq=False)
class Member:
    member_id: str
    client_id: str
    client_host: str
    session_timeout: float
    rebalance_timeout: float
    protocols: list[tuple[str, bytes]]
    last_seen: float
    assignment: bytes = b""
    instance_id: str | None = None  # a static member's group.instance.id
    joining: asyncio.Future[Joined] | None = None
    syncing: asyncio.Future[tuple[int, bytes]] | None = None


@dataclass(eq=False)
class Group:
    name: str
    state: str = "Empty"
    generation: int = 0
    protocol_type: str = ""
    protocol: str = ""
    leader: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    timer: asyncio.TimerHandle | None = None
    first_join_at: float | None = None
    instances: dict[str, str] = field(default_factory=dict)  # static instance id -> member id


class Coordinator:
    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self._loop = asyncio.get_running_loop()

    # JoinGroup

    async def join(
        self,
        group_id: str,
        member_id: str,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        instance_id: str | None = None,
    ) -> Joined:
        if not group_id:
            return Joined(k.INVALID_GROUP_ID)
        group = self.groups.get(group_id)
        if group is None:
            if len(self.groups) >= MAX_GROUPS:
                return Joined(k.COORDINATOR_NOT_AVAILABLE)
            group = self.groups[group_id] = Group(group_id)
        if not protocols or (group.members and protocol_type != group.protocol_type):
            return Joined(k.INCONSISTENT_GROUP_PROTOCOL)
        if not 1 <= session_timeout_ms <= 3_600_000:
            return Joined(k.INVALID_SESSION_TIMEOUT)
        now = self._loop.time()
        if instance_id is not None:
            known = group.instances.get(instance_id)
            if member_id and known is not None and known != member_id:
                return Joined(k.FENCED_INSTANCE_ID)
            if not member_id and known is not None and known in group.members:
                return await self._static_rejoin(
                    group, group.members[known], client_id, client_host, protocols, now
                )
        member = group.members.get(member_id) if member_id else None
        if member_id and member is None:
            return Joined(k.UNKNOWN_MEMBER_ID)
        if member is None:
            if len(group.members) >= MAX_MEMBERS:
                return Joined(k.GROUP_MAX_SIZE_REACHED)
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            member = Member(member_id, client_id, client_host, 0, 0, [], now)
            group.members[member_id] = member
            if instance_id is not None:
                member.instance_id = instance_id
                group.instances[instance_id] = member_id
        member.session_timeout = session_timeout_ms / 1000
        member.rebalance_timeout = max(rebalance_timeout_ms, session_timeout_ms) / 1000
        member.protocols = protocols
        member.last_seen = now
        group.protocol_type = protocol_type
        return await self._join(group, member)

    async def _join(self, group: Group, member: Member) -> Joined:
        """`member` (re)joins: the rebalance starts, or goes on; its answer when it completes."""
        if member.joining is not None and not member.joining.done():
            member.joining.set_result(Joined(k.REBALANCE_IN_PROGRESS))  # the old one is stale
        joining: asyncio.Future[Joined] = self._loop.create_future()
        member.joining = joining
        self._prepare(group)
        self._maybe_complete(group)
        try:
            async with asyncio.timeout(member.rebalance_timeout + 5):
                return await asyncio.shield(joining)
        except TimeoutError:
            return Joined(k.REBALANCE_IN_PROGRESS)

    async def _static_rejoin(
        self,
        group: Group,
        old: Member,
        client_id: str,
        client_host: str,
        protocols: list[tuple[str, bytes]],
        now: float,
    ) -> Joined:
        """A static member back with no member id (restarted): a new member id in the old one's
        place, its assignment kept. A Stable group whose protocols it still speaks does not
        rebalance: the member gets the current generation and syncs its assignment; otherwise
        it joins the rebalance as the old member would have."""
        assert old.instance_id is not None
        member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
        member = Member(
            member_id,
            client_id,
            client_host,
            old.session_timeout,
            old.rebalance_timeout,
            protocols,
            now,
            old.assignment,
            old.instance_id,
        )
        del group.members[old.member_id]
        group.members[member_id] = member
        group.instances[old.instance_id] = member_id
        if group.leader == old.member_id:
            group.leader = member_id
        if old.joining is not None and not old.joining.done():
            old.joining.set_result(Joined(k.FENCED_INSTANCE_ID))
        if old.syncing is not None and not old.syncing.done():
            old.syncing.set_result((k.FENCED_INSTANCE_ID, b""))
        log.info(
            "kafka.group_static_rejoin",
            group=group.name,
            instance=old.instance_id,
            member=member_id,
            replaced=old.member_id,
        )
        same = group.protocol in {name for name, _ in protocols}
        if group.state != "Stable" or not same:
            return await self._join(group, member)
        metadata: tuple[tuple[str, str | None, bytes], ...] = ()
        if member_id == group.leader:  # the leader assigns again; Stable: SyncGroup keeps it
            metadata = self._metadata(group)
        return Joined(0, group.generation, group.protocol, group.leader, member_id, metadata)

    @staticmethod
    def _metadata(group: Group) -> tuple[tuple[str, str | None, bytes], ...]:
        return tuple(
            (
                m.member_id,
                m.instance_id,
                next((meta for name, meta in m.protocols if name == group.protocol), b""),
            )
            for m in group.members.values()
        )

    def _prepare(self, group: Group) -> None:
        """Start a rebalance (or go on with the one started): syncs waiting are told to join."""
        if group.state != "PreparingRebalance":
            if group.state == "Empty" and group.first_join_at is None:
                group.first_join_at = self._loop.time()
            group.state = "PreparingRebalance"
            for member in group.members.values():
                if member.syncing is not None and not member.syncing.done():
                    member.syncing.set_result((k.REBALANCE_IN_PROGRESS, b""))
            timeout = max((m.rebalance_timeout for m in group.members.values()), default=1.0)
            if group.timer is not None:
                group.timer.cancel()
            group.timer = self._loop.call_later(timeout, self._timed_out, group)
            log.info("kafka.group_rebalancing", group=group.name, members=len(group.members))

    def _maybe_complete(self, group: Group) -> None:
        if group.state != "PreparingRebalance":
            return
        if not all(m.joining is not None and not m.joining.done() for m in group.members.values()):
            return
        if group.first_join_at is not None:
            wait = group.first_join_at + INITIAL_DELAY - self._loop.time()
            if wait > 0:  # a new group: let the members starting with this one join too
                self._loop.call_later(wait, self._maybe_complete, group)
                return
        self._complete(group)

    def _timed_out(self, group: Group) -> None:
        group.timer = None
        if group.state != "PreparingRebalance":
            return
        for member_id, member in list(group.members.items()):
            if member.joining is None or member.joining.done():
                del group.members[member_id]  # did not rejoin in time
                self._forget_instance(group, member)
        if group.members:
            group.first_join_at = None
            self._complete(group)
        else:
            self._empty(group)

    def _complete(self, group: Group) -> None:
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None
        group.first_join_at = None
        members = list(group.members.values())
        supported = [
            name
            for name, _ in members[0].protocols
            if all(any(name == n for n, _ in m.protocols) for m in members)
        ]
        if not supported:
            for member in members:
                if member.joining is not None and not member.joining.done():
                    member.joining.set_result(Joined(k.INCONSISTENT_GROUP_PROTOCOL))
                member.joining = None
            group.members.clear()
            group.instances.clear()
            self._empty(group)
            return
        group.generation += 1
        group.protocol = supported[0]
        if group.leader not in group.members:
            group.leader = members[0].member_id
        group.state = "CompletingRebalance"
        metadata = self._metadata(group)
        for member in members:
            joined = Joined(
                0,
                group.generation,
                group.protocol,
                group.leader,
                member.member_id,
                metadata if member.member_id == group.leader else (),
            )
            if member.joining is not None and not member.joining.done():
                member.joining.set_result(joined)
            member.joining = None
            member.last_seen = self._loop.time()
        log.info(
            "kafka.group_joined",
            group=group.name,
            generation=group.generation,
            members=len(members),
            protocol=group.protocol,
        )

    def _empty(self, group: Group) -> None:
        group.state = "Empty"
        group.leader = ""
        group.first_join_at = None
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None

    # SyncGroup, Heartbeat, LeaveGroup

    def _member(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None = None
    ) -> tuple[Group, Member] | int:
        group = self.groups.get(group_id)
        if group is not None and instance_id is not None:
            known = group.instances.get(instance_id)
            if known is not None and known != member_id:
                return k.FENCED_INSTANCE_ID  # replaced by a later start of the instance
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return k.UNKNOWN_MEMBER_ID
        member.last_seen = self._loop.time()
        if generation != group.generation:
            return k.ILLEGAL_GENERATION
        return group, member

    async def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        assignments: dict[str, bytes],
        instance_id: str | None = None,
    ) -> tuple[int, bytes]:
        found = self._member(group_id, generation, member_id, instance_id)
        if isinstance(found, int):
            return found, b""
        group, member = found
        if group.state == "PreparingRebalance":
            return k.REBALANCE_IN_PROGRESS, b""
        if group.state == "Stable":
            return 0, member.assignment
        if member_id == group.leader:
            for other in group.members.values():
                other.assignment = assignments.get(other.member_id, b"")
            group.state = "Stable"
            for other in group.members.values():
                if other.syncing is not None and not other.syncing.done():
                    other.syncing.set_result((0, other.assignment))
                other.syncing = None
            log.info("kafka.group_stable", group=group.name, generation=group.generation)
            return 0, member.assignment
        syncing: asyncio.Future[tuple[int, bytes]] = self._loop.create_future()
        member.syncing = syncing
        try:
            async with asyncio.timeout(member.session_timeout + 5):
                return await asyncio.shield(syncing)
        except TimeoutError:
            return k.REBALANCE_IN_PROGRESS, b""

    def heartbeat(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None = None
    ) -> int:
        found = self._member(group_id, generation, member_id, instance_id)
        if isinstance(found, int):
            return found
        group, _member = found
        return k.REBALANCE_IN_PROGRESS if group.state == "PreparingRebalance" else 0

    def leave(self, group_id: str, member_id: str, instance_id: str | None = None) -> int:
        group = self.groups.get(group_id)
        if group is not None and instance_id is not None:
            known = group.instances.get(instance_id)
            if known is None:
                return k.UNKNOWN_MEMBER_ID
            if member_id and known != member_id:
                return k.FENCED_INSTANCE_ID
            member_id = known
        member = group.members.pop(member_id, None) if group is not None else None
        if group is None or member is None:
            return k.UNKNOWN_MEMBER_ID
        self._forget_instance(group, member)
        self._gone(group, [member])
        log.info("kafka.group_left", group=group.name, member=member_id)
        return 0

    @staticmethod
    def _forget_instance(group: Group, member: Member) -> None:
        if member.instance_id is not None and group.instances.get(member.instance_id) == (
            member.member_id
        ):
            del group.instances[member.instance_id]

    def _gone(self, group: Group, members: list[Member]) -> None:
        for member in members:
            self._forget_instance(group, member)
            if member.joining is not None and not member.joining.done():
                member.joining.set_result(Joined(k.UNKNOWN_MEMBER_ID))
            if member.syncing is not None and not member.syncing.done():
                member.syncing.set_result((k.UNKNOWN_MEMBER_ID, b""))
        if not group.members:
            self._empty(group)
            return
        self._prepare(group)
        self._maybe_complete(group)

    def sweep(self) -> None:
        """Remove members silent for their session timeout (the listener calls this)."""
        now = self._loop.time()
        for group in list(self.groups.values()):
            expired = [
                m
                for m in group.members.values()
                if (m.joining is None or m.joining.done()) and now - m.last_seen > m.session_timeout
            ]
            for member in expired:
                del group.members[member.member_id]
                log.info("kafka.group_member_expired", group=group.name, member=member.member_id)
            if expired:
                self._gone(group, expired)
            if group.state == "Empty" and not group.members and group.timer is None:
                del self.groups[group.name]  # nothing left of it but its offsets (durable)

    def forget(self, group_id: str) -> None:
        """An empty group deleted (DeleteGroups): nothing of it is kept."""
        group = self.groups.get(group_id)
        if group is not None and not group.members:
            self._empty(group)
            del self.groups[group_id]
