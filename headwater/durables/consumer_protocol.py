"""One consumer group of Kafka 4's consumer group protocol (KIP-848) at its coordinator: members,
epochs, the target assignment the coordinator computes, and each member's way to it, driven by
heartbeats with `now` as an argument (no clock, no I/O).

- The group epoch is bumped by every change the assignment depends on: a member joining or
  leaving (or fenced), a subscription or assignor changed, a subscribed topic's partition count.
  The target assignment is computed again when the group epoch is past the assignment epoch, by
  the assignor most members ask for (`uniform`, the default, or `range`).
- A member reaches its target without stopping the others (Kafka's CurrentAssignmentBuilder):
  partitions it holds and must give up are first taken out of its assignment and held as
  revoking; the member's epoch stays until a heartbeat reports them gone (its owned partitions),
  then it moves to the assignment epoch and gets the partitions of its target nobody holds. A
  partition held (assigned or revoking) by another member is given only once that member has
  let it go: no partition ever has two holders, and the partitions that need not move stay
  where they are, consumed all along.
- A member that does not heartbeat for the session timeout is fenced (removed: its partitions
  are free at once); one that keeps partitions to revoke past its rebalance timeout too. A
  heartbeat whose epoch is ahead of the member's, or behind it (other than the previous epoch
  with owned partitions it still has), is FENCED_EPOCH: the client rejoins with epoch 0.
- Static members (an instance id): leaving with epoch -2 keeps the member's partitions for the
  session timeout, and a member joining with the instance id takes its place, assignment and
  epoch, with no rebalance; an instance id in use by a live member is UNRELEASED_INSTANCE.
- Kafka keeps this state in a log and rebuilds it when a coordinator moves; Headwater keeps it in
  memory, and a group's new coordinator rebuilds it from the members' heartbeats (`adopting`):
  for a session timeout after the group appears with a heartbeat from a member it does not know
  (epoch > 0), such members are taken back with their epoch and the partitions they report, so
  a coordinator's move or kill -9 moves no partition (partitions none of them reports are handed
  out once that time is up). A heartbeat without the member's whole
  state (subscription, rebalance timeout, owned partitions) is refused REBUILDING meanwhile: the
  client looks for its coordinator again and sends it all.

The uniform assignor keeps every member's target partitions that are still valid and balanced
(counts differ by one at most), and moves only partitions from members over their share to
members under it; the range assignor gives each member of a topic a contiguous range, the first
members one more when the count does not divide (co-partitioned topics line up).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

UNIFORM: Final = "uniform"
RANGE: Final = "range"
ASSIGNORS: Final = (UNIFORM, RANGE)  # the first is the default
JOIN: Final = 0
LEAVE: Final = -1
LEAVE_STATIC: Final = -2
MAX_MEMBERS: Final = 1000

# topic name -> partitions
Assignment = dict[str, frozenset[int]]


class Refusal(enum.Enum):
    """Why a heartbeat or a commit is refused (the server maps each to Kafka's code)."""

    INVALID_REQUEST = "invalid_request"
    UNKNOWN_MEMBER = "unknown_member"
    FENCED_EPOCH = "fenced_epoch"
    STALE_EPOCH = "stale_epoch"
    UNSUPPORTED_ASSIGNOR = "unsupported_assignor"
    UNRELEASED_INSTANCE = "unreleased_instance"
    GROUP_FULL = "group_full"
    REBUILDING = "rebuilding"  # a new coordinator needs the member's whole state


class Refused(Exception):
    def __init__(self, reason: Refusal, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class Beat:
    """A heartbeat, its topics already names (None: the field did not change)."""

    member_id: str
    epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout: float | None = None  # seconds; None: unchanged
    topics: frozenset[str] | None = None
    regex: str | None = None
    assignor: str | None = None
    owned: Mapping[str, frozenset[int]] | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True)
class Answer:
    member_id: str
    epoch: int
    assignment: Assignment | None  # None: not sent (unchanged since the member was told)


@dataclass(eq=False)
class Member:
    member_id: str
    last_seen: float
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    epoch: int = 0
    previous_epoch: int = -1
    rebalance_timeout: float = 300.0
    topics: frozenset[str] = frozenset()
    regex: str | None = None
    assignor: str | None = None
    assigned: Assignment = field(default_factory=dict)  # may consume now
    revoking: Assignment = field(default_factory=dict)  # to give up; held until reported gone
    revoke_by: float | None = None
    told: Assignment | None = None  # the assignment last sent to it
    left: bool = False  # a static member that left with epoch -2, its partitions kept


def _count(assignment: Mapping[str, frozenset[int]]) -> int:
    return sum(len(p) for p in assignment.values())


def _minus(a: Mapping[str, frozenset[int]], b: Mapping[str, frozenset[int]]) -> Assignment:
    out = {t: ps - b.get(t, frozenset()) for t, ps in a.items()}
    return {t: ps for t, ps in out.items() if ps}


def _and(a: Mapping[str, frozenset[int]], b: Mapping[str, frozenset[int]]) -> Assignment:
    out = {t: ps & b.get(t, frozenset()) for t, ps in a.items()}
    return {t: ps for t, ps in out.items() if ps}


def _union(a: Mapping[str, frozenset[int]], b: Mapping[str, frozenset[int]]) -> Assignment:
    out = dict(a)
    for t, ps in b.items():
        out[t] = out.get(t, frozenset()) | ps
    return {t: ps for t, ps in out.items() if ps}


def _subset(a: Mapping[str, frozenset[int]], b: Mapping[str, frozenset[int]]) -> bool:
    return all(ps <= b.get(t, frozenset()) for t, ps in a.items())


class ConsumerGroupState:
    def __init__(
        self, name: str, session_timeout: float, adopting_until: float | None = None
    ) -> None:
        """`session_timeout`: seconds without a heartbeat before a member is fenced.
        `adopting_until`: the group was found on a new coordinator: until then members it does not
        know are taken back as they report themselves, and no partition is handed out anew."""
        self.name = name
        self.session_timeout = session_timeout
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, Member] = {}
        self.instances: dict[str, str] = {}  # static instance id -> member id
        self.target: dict[str, Assignment] = {}
        self.metadata: dict[str, int] = {}  # subscribed topic -> partitions, as last assigned
        self.assignor = UNIFORM
        self.adopting_until = adopting_until

    # heartbeats

    def heartbeat(self, beat: Beat, partitions: Callable[[str], int | None], now: float) -> Answer:
        """`partitions`: a topic's partition count, None for a topic that does not exist.
        `Refused` for a heartbeat the group does not take."""
        if beat.epoch in (LEAVE, LEAVE_STATIC):
            return self._leave(beat)
        if beat.epoch < LEAVE_STATIC:
            raise Refused(Refusal.INVALID_REQUEST, f"member epoch {beat.epoch} is not valid")
        if not beat.member_id:
            raise Refused(Refusal.INVALID_REQUEST, "the member id must not be empty")
        if beat.assignor is not None and beat.assignor not in ASSIGNORS:
            raise Refused(
                Refusal.UNSUPPORTED_ASSIGNOR,
                f"assignor {beat.assignor!r} is not one of {', '.join(ASSIGNORS)}",
            )
        changed = False
        member = self.members.get(beat.member_id)
        if beat.epoch == JOIN:
            if beat.rebalance_timeout is None or (beat.topics is None and beat.regex is None):
                raise Refused(
                    Refusal.INVALID_REQUEST,
                    "a member joins with its rebalance timeout and its subscription",
                )
            if beat.owned:
                raise Refused(Refusal.INVALID_REQUEST, "a member joins owning no partitions")
            if member is None:
                member, changed = self._join(beat, now)
            else:  # back with epoch 0: it lost its partitions (fenced, or restarted)
                self._release(member)
                member.epoch, member.previous_epoch, member.told = 0, -1, None
        elif member is None:
            member = self._adopt(beat, now)
            changed = True
        else:
            self._check_epoch(member, beat)
        member.last_seen = now
        member.left = False
        changed = self._update(member, beat) or changed
        changed = self._refresh_metadata(partitions) or changed
        if changed:
            self.group_epoch += 1
        if self.group_epoch > self.assignment_epoch:
            self._assign()
        self._reconcile(member, beat.owned, now)
        assignment = None
        if member.told != member.assigned or beat.owned is not None or beat.epoch == JOIN:
            assignment = member.told = dict(member.assigned)
        return Answer(member.member_id, member.epoch, assignment)

    def _join(self, beat: Beat, now: float) -> tuple[Member, bool]:
        """A new member; a static one in the place of the member that had its instance id."""
        instance = beat.instance_id
        if instance is not None and instance in self.instances:
            old_id = self.instances[instance]
            old = self.members[old_id]
            if not old.left:
                raise Refused(
                    Refusal.UNRELEASED_INSTANCE,
                    f"instance id {instance!r} is in use by member {old_id}",
                )
            del self.members[old_id]
            self.target[beat.member_id] = self.target.pop(old_id, {})
            old.member_id, old.told = beat.member_id, None
            self.members[beat.member_id] = old
            self.instances[instance] = beat.member_id
            return old, False
        if len(self.members) >= MAX_MEMBERS:
            raise Refused(Refusal.GROUP_FULL, f"group {self.name!r} has {MAX_MEMBERS} members")
        member = Member(beat.member_id, now, instance)
        self.members[beat.member_id] = member
        if instance is not None:
            self.instances[instance] = beat.member_id
        return member, True

    def _adopt(self, beat: Beat, now: float) -> Member:
        """A member this coordinator does not know, with an epoch: taken back while the group is
        being rebuilt (with the partitions it reports that nobody else holds), else unknown."""
        if self.adopting_until is None or now >= self.adopting_until:
            raise Refused(Refusal.UNKNOWN_MEMBER, f"member {beat.member_id} is not in the group")
        if (
            (beat.topics is None and beat.regex is None)
            or beat.owned is None
            or beat.rebalance_timeout is None
        ):
            # a client sends its whole state to a coordinator it has just found (librdkafka
            # after COORDINATOR_NOT_AVAILABLE): ask for it
            raise Refused(
                Refusal.REBUILDING,
                f"group {self.name!r} is being rebuilt: send the subscription and partitions",
            )
        member, _ = self._join(beat, now)
        held = self._held()
        member.assigned = _minus(dict(beat.owned), held)
        member.epoch = beat.epoch
        member.previous_epoch = beat.epoch
        # the assignment it has is its target until the group's is computed again
        self.target[member.member_id] = dict(member.assigned)
        self.group_epoch = max(self.group_epoch, beat.epoch)
        self.assignment_epoch = max(self.assignment_epoch, beat.epoch)
        return member

    def _check_epoch(self, member: Member, beat: Beat) -> None:
        if beat.epoch == member.epoch:
            return
        # behind by one: the answer that moved it on may have been lost; fine if it holds nothing
        # it should not
        if (
            beat.epoch < member.epoch
            and beat.epoch == member.previous_epoch
            and beat.owned is not None
            and _subset(beat.owned, member.assigned)
        ):
            return
        raise Refused(
            Refusal.FENCED_EPOCH,
            f"member {member.member_id} is at epoch {member.epoch}, not {beat.epoch}",
        )

    def _update(self, member: Member, beat: Beat) -> bool:
        """The member's fields from the beat; whether its subscription or assignor changed."""
        if beat.rebalance_timeout is not None:
            member.rebalance_timeout = beat.rebalance_timeout
        if beat.rack_id is not None:
            member.rack_id = beat.rack_id
        if beat.client_id:
            member.client_id, member.client_host = beat.client_id, beat.client_host
        changed = False
        if beat.topics is not None and beat.topics != member.topics:
            member.topics = beat.topics
            changed = True
        if beat.regex is not None and (beat.regex or None) != member.regex:
            member.regex = beat.regex or None
            changed = True
        if beat.assignor is not None and beat.assignor != member.assignor:
            member.assignor = beat.assignor
            changed = True
        return changed

    def _refresh_metadata(self, partitions: Callable[[str], int | None]) -> bool:
        subscribed = set().union(*(m.topics for m in self.members.values()))
        metadata = {}
        for topic in sorted(subscribed):
            count = partitions(topic)
            if count is not None:
                metadata[topic] = count
        if metadata == self.metadata:
            return False
        self.metadata = metadata
        return True

    def _leave(self, beat: Beat) -> Answer:
        member = self.members.get(beat.member_id)
        if member is None:
            raise Refused(Refusal.UNKNOWN_MEMBER, f"member {beat.member_id} is not in the group")
        if beat.epoch == LEAVE_STATIC and member.instance_id is not None:
            member.left = True  # its partitions wait for the instance's next start
        else:
            self.remove(member.member_id)
        return Answer(beat.member_id, beat.epoch, None)

    def remove(self, member_id: str) -> None:
        """The member out of the group (left, or fenced): its partitions are free at once."""
        member = self.members.pop(member_id, None)
        if member is None:
            return
        if member.instance_id is not None and self.instances.get(member.instance_id) == member_id:
            del self.instances[member.instance_id]
        self.target.pop(member_id, None)
        self.group_epoch += 1
        if self.members:
            self._assign()
        else:
            self.target.clear()
            self.assignment_epoch = self.group_epoch

    def expire(self, now: float) -> list[str]:
        """Fence the members silent for the session timeout, or revoking past their rebalance
        timeout; their ids."""
        gone = [
            m.member_id
            for m in self.members.values()
            if now - m.last_seen > self.session_timeout
            or (m.revoke_by is not None and now > m.revoke_by)
        ]
        for member_id in gone:
            self.remove(member_id)
        if self.adopting_until is not None and now >= self.adopting_until:
            self.adopting_until = None
        return gone

    # reconciliation

    def _held(self, but: Member | None = None) -> Assignment:
        """Every partition some member (other than `but`) holds: assigned or revoking."""
        held: Assignment = {}
        for other in self.members.values():
            if other is not but:
                held = _union(held, _union(other.assigned, other.revoking))
        return held

    def _release(self, member: Member) -> None:
        member.assigned, member.revoking, member.revoke_by = {}, {}, None

    def _reconcile(
        self, member: Member, owned: Mapping[str, frozenset[int]] | None, now: float
    ) -> None:
        """Move `member` toward its target as far as the others' holdings let it."""
        if member.revoking:
            if owned is None or _and(owned, member.revoking):
                return  # it still has them: their next holders wait
            member.revoking, member.revoke_by = {}, None
        target = self.target.get(member.member_id, {})
        keep = _and(member.assigned, target)
        drop = _minus(member.assigned, target)
        if drop:
            member.assigned, member.revoking = keep, drop
            member.revoke_by = now + member.rebalance_timeout
            return
        if member.epoch != self.assignment_epoch:
            member.previous_epoch, member.epoch = member.epoch, self.assignment_epoch
        wanted = _minus(target, keep)
        # while members come back to a new coordinator, a partition nobody has reported yet may
        # still be held by a member not back yet: nothing new is handed out until then
        if wanted and not (self.adopting_until is not None and now < self.adopting_until):
            member.assigned = _union(keep, _minus(wanted, self._held(member)))

    # assignment

    def _assign(self) -> None:
        subscriptions = {
            m.member_id: frozenset(t for t in m.topics if t in self.metadata)
            for m in self.members.values()
        }
        self.assignor = preferred(m.assignor for m in self.members.values())
        if self.assignor == RANGE:
            self.target = range_assign(subscriptions, self.metadata)
        else:
            held = {m.member_id: _union(m.assigned, m.revoking) for m in self.members.values()}
            self.target = uniform_assign(subscriptions, self.metadata, self.target, held)
        self.assignment_epoch = self.group_epoch

    def state(self) -> str:
        """Kafka's consumer group states: Empty, Assigning, Reconciling, Stable."""
        if not self.members:
            return "Empty"
        if self.group_epoch > self.assignment_epoch:
            return "Assigning"
        for member in self.members.values():
            if (
                member.epoch != self.assignment_epoch
                or member.revoking
                or member.assigned != self.target.get(member.member_id, {})
            ):
                return "Reconciling"
        return "Stable"

    def check_commit(self, member_id: str, epoch: int) -> None:
        """An OffsetCommit's member and epoch (Kafka's rules for a consumer group): a commit
        without membership (epoch < 0) only while the group has no members."""
        if epoch < 0 and not self.members:
            return
        member = self.members.get(member_id)
        if member is None:
            raise Refused(Refusal.UNKNOWN_MEMBER, f"member {member_id!r} is not in the group")
        if epoch > member.epoch:
            raise Refused(
                Refusal.FENCED_EPOCH, f"member {member_id} is at epoch {member.epoch}, not {epoch}"
            )
        if epoch < member.epoch:
            raise Refused(
                Refusal.STALE_EPOCH, f"member {member_id} is at epoch {member.epoch}, not {epoch}"
            )


def preferred(asked: Iterable[str | None]) -> str:
    """The assignor most members ask for; the default when none does (ties: ASSIGNORS' order)."""
    counts = dict.fromkeys(ASSIGNORS, 0)
    for name in asked:
        if name in counts:
            counts[name] += 1
    best = max(ASSIGNORS, key=lambda name: (counts[name], -ASSIGNORS.index(name)))
    return best if counts[best] else ASSIGNORS[0]


def range_assign(
    subscriptions: Mapping[str, frozenset[str]], metadata: Mapping[str, int]
) -> dict[str, Assignment]:
    """Each topic's partitions in contiguous ranges over its subscribers by member id."""
    target: dict[str, Assignment] = {member: {} for member in subscriptions}
    for topic, count in sorted(metadata.items()):
        members = sorted(m for m, topics in subscriptions.items() if topic in topics)
        if not members:
            continue
        share, extra = divmod(count, len(members))
        start = 0
        for index, member in enumerate(members):
            size = share + (1 if index < extra else 0)
            if size:
                target[member][topic] = frozenset(range(start, start + size))
            start += size
    return target


def uniform_assign(
    subscriptions: Mapping[str, frozenset[str]],
    metadata: Mapping[str, int],
    previous: Mapping[str, Mapping[str, frozenset[int]]],
    held: Mapping[str, Mapping[str, frozenset[int]]] | None = None,
) -> dict[str, Assignment]:
    """Balanced (member counts within one of each other where subscriptions allow) and sticky:
    each member keeps what it holds (`held`) and then what its `previous` target had, that is
    still valid and nobody else holds, within its share; only the rest moves."""
    owner: dict[tuple[str, int], str] = {}
    owned: dict[str, set[tuple[str, int]]] = {member: set() for member in subscriptions}
    members = sorted(subscriptions)
    held = held or {}
    holder = {(t, p): m for m, a in held.items() for t, ps in a.items() for p in ps}

    def valid(m: str, source: Mapping[str, frozenset[int]]) -> list[tuple[str, int]]:
        return sorted(
            (t, p)
            for t, ps in source.items()
            if t in subscriptions[m] and t in metadata
            for p in ps
            if p < metadata[t] and holder.get((t, p), m) == m
        )

    kept: dict[str, list[tuple[str, int]]] = {}
    for m in members:
        mine = valid(m, held.get(m, {}))
        known = set(mine)
        kept[m] = mine + [tp for tp in valid(m, previous.get(m, {})) if tp not in known]
    if len({subscriptions[m] for m in members}) <= 1 and members:
        total = sum(
            count for topic, count in metadata.items() if topic in subscriptions[members[0]]
        )
        share, extra = divmod(total, len(members))
        # the members that had most keep the one-more shares: fewest moves
        by_had = sorted(members, key=lambda m: (-len(kept[m]), m))
        quota = {m: share + (1 if i < extra else 0) for i, m in enumerate(by_had)}
    else:
        quota = dict.fromkeys(members, sum(metadata.values()))  # the balancing comes after
        by_had = members
    for m in by_had:
        for tp in kept[m]:
            if len(owned[m]) < quota[m] and tp not in owner:
                owner[tp] = m
                owned[m].add(tp)
    # what nobody has goes to the subscriber with the fewest
    for topic, count in sorted(metadata.items()):
        candidates = [m for m in members if topic in subscriptions[m]]
        if not candidates:
            continue
        for p in range(count):
            if (topic, p) not in owner:
                chosen = min(candidates, key=lambda m: (len(owned[m]), m))
                owner[topic, p] = chosen
                owned[chosen].add((topic, p))
    if len({subscriptions[m] for m in members}) > 1:
        _balance(subscriptions, owner, owned)
    target: dict[str, Assignment] = {}
    for m in members:
        grouped: dict[str, set[int]] = {}
        for t, p in owned[m]:
            grouped.setdefault(t, set()).add(p)
        target[m] = {t: frozenset(ps) for t, ps in grouped.items()}
    return target


def _balance(
    subscriptions: Mapping[str, frozenset[str]],
    owner: dict[tuple[str, int], str],
    owned: dict[str, set[tuple[str, int]]],
) -> None:
    """Move partitions from a member to a subscriber with two fewer or more, one at a time, until
    none can move (each move lowers the sum of squared counts: it ends)."""
    for _ in range(len(owner) * max(1, len(owned))):
        moved = False
        for high in sorted(owned, key=lambda m: (-len(owned[m]), m)):
            for tp in sorted(owned[high], reverse=True):
                takers = [
                    m
                    for m in owned
                    if tp[0] in subscriptions[m] and len(owned[m]) < len(owned[high]) - 1
                ]
                if takers:
                    low = min(takers, key=lambda m: (len(owned[m]), m))
                    owned[high].discard(tp)
                    owned[low].add(tp)
                    owner[tp] = low
                    moved = True
                    break
            if moved:
                break
        if not moved:
            return
