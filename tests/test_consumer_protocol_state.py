"""The KIP-848 consumer group state machine without a server (`durables.consumer_protocol`):
members that follow the protocol as librdkafka does (consume what an answer assigns, give up
at once what it no longer holds, report what they own) join, leave and are fenced in any order;
no partition is ever held by two members, nor consumed by two clients at once; once everyone has
heartbeated the group settles with each partition owned once and counts within one; a member
joining takes partitions only from the others (who keep the rest), a member leaving moves only
its own; and bad heartbeats are refused with their reason."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.durables.consumer_protocol import (
    LEAVE,
    LEAVE_STATIC,
    Assignment,
    Beat,
    ConsumerGroupState,
    Refusal,
    Refused,
    range_assign,
    uniform_assign,
)

TOPICS = {"a": 12, "b": 5}
SESSION = 10.0


def partitions(topic: str) -> int | None:
    return TOPICS.get(topic)


class Client:
    """A member as librdkafka plays it."""

    def __init__(self, member_id: str, topics: frozenset[str], instance: str | None = None):
        self.member_id = member_id
        self.topics = topics
        self.instance = instance
        self.epoch = 0
        self.owned: Assignment = {}

    def beat(self, group: ConsumerGroupState, now: float) -> None:
        if self.epoch == 0:
            beat = Beat(
                self.member_id, 0, self.instance, rebalance_timeout=30.0, topics=self.topics
            )
        else:
            beat = Beat(self.member_id, self.epoch, owned=dict(self.owned))
        answer = group.heartbeat(beat, partitions, now)
        self.epoch = answer.epoch
        if answer.assignment is not None:
            self.owned = dict(answer.assignment)  # revoked at once, the new ones consumed


def _pairs(assignment: Mapping[str, frozenset[int]]) -> set[tuple[str, int]]:
    return {(t, p) for t, ps in assignment.items() for p in ps}


def _check_holders(group: ConsumerGroupState, clients: dict[str, Client]) -> None:
    seen: set[tuple[str, int]] = set()
    for member in group.members.values():
        held = _pairs(member.assigned) | _pairs(member.revoking)
        assert not held & seen, "a partition with two holders"
        seen |= held
    consumed: set[tuple[str, int]] = set()
    for client in clients.values():
        mine = _pairs(client.owned)
        assert not mine & consumed, "a partition consumed by two clients"
        consumed |= mine


def _settle(group: ConsumerGroupState, clients: dict[str, Client], now: float) -> None:
    for _ in range(6):  # revoke, then assign: a few rounds of everyone's heartbeat
        for client in list(clients.values()):
            client.beat(group, now)
            _check_holders(group, clients)


def _owners(clients: dict[str, Client]) -> dict[tuple[str, int], str]:
    return {tp: c.member_id for c in clients.values() for tp in _pairs(c.owned)}


def _check_settled(group: ConsumerGroupState, clients: dict[str, Client]) -> None:
    owners = _owners(clients)
    subscribed = {t for c in clients.values() for t in c.topics}
    wanted = {(t, p) for t in subscribed for p in range(TOPICS[t])}
    assert set(owners) == wanted
    assert group.state() == "Stable"
    if len({c.topics for c in clients.values()}) == 1:
        counts = [len(_pairs(c.owned)) for c in clients.values()]
        assert max(counts) - min(counts) <= 1


steps = st.lists(
    st.one_of(
        st.tuples(st.just("join"), st.sampled_from([frozenset("a"), frozenset("ab")])),
        st.tuples(st.just("leave"), st.integers(0, 50)),
        st.tuples(st.just("beat"), st.integers(0, 50)),
        st.tuples(st.just("crash"), st.integers(0, 50)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(steps)
def test_no_partition_ever_has_two_holders_and_the_group_settles(
    plan: list[tuple[str, object]],
) -> None:
    group = ConsumerGroupState("g", SESSION)
    clients: dict[str, Client] = {}
    now = 0.0
    made = 0
    for kind, arg in plan:
        now += 0.1
        if kind == "join":
            assert isinstance(arg, frozenset)
            made += 1
            client = Client(f"m{made}", arg)
            clients[client.member_id] = client
            client.beat(group, now)
        elif clients:
            assert isinstance(arg, int)
            client = sorted(clients.values(), key=lambda c: c.member_id)[arg % len(clients)]
            if kind == "leave":
                group.heartbeat(Beat(client.member_id, LEAVE), partitions, now)
                del clients[client.member_id]
            elif kind == "beat":
                client.beat(group, now)
            else:  # crashed: silent until the session timeout fences it
                del clients[client.member_id]
                now += SESSION + 1
                for other in clients.values():
                    other.beat(group, now)
                assert client.member_id in group.expire(now)
                for other in clients.values():
                    other.beat(group, now)
        _check_holders(group, clients)
    _settle(group, clients, now)
    if clients:
        _check_settled(group, clients)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(0, 5))
def test_a_join_takes_only_from_the_others_and_a_leave_moves_only_its_own(
    members: int, leaving: int
) -> None:
    group = ConsumerGroupState("g", SESSION)
    clients = {f"m{i}": Client(f"m{i}", frozenset("ab")) for i in range(members)}
    _settle(group, clients, 0.0)
    before = {c.member_id: _pairs(c.owned) for c in clients.values()}
    clients["new"] = Client("new", frozenset("ab"))
    _settle(group, clients, 1.0)
    _check_settled(group, clients)
    for member_id, had in before.items():
        assert _pairs(clients[member_id].owned) <= had  # kept the rest, gained nothing
    gone = sorted(clients)[leaving % len(clients)]
    before = {c.member_id: _pairs(c.owned) for c in clients.values()}
    group.heartbeat(Beat(gone, LEAVE), partitions, 2.0)
    del clients[gone]
    _settle(group, clients, 2.0)
    _check_settled(group, clients)
    for member_id, client in clients.items():
        assert before[member_id] <= _pairs(client.owned)  # nothing of its own moved


def test_a_partition_moves_only_once_its_holder_reports_it_revoked() -> None:
    group = ConsumerGroupState("g", SESSION)
    first = Client("first", frozenset("a"))
    first.beat(group, 0.0)
    assert len(_pairs(first.owned)) == 12
    second = Client("second", frozenset("a"))
    second.beat(group, 0.1)
    assert second.owned == {}  # first still holds everything
    held = group.members["first"]
    # first's next heartbeat says what it must give up, but it has not yet reported it gone
    told = group.heartbeat(Beat("first", first.epoch), partitions, 0.2).assignment
    assert told is not None and len(_pairs(told)) == 6
    assert _pairs(held.revoking) and len(_pairs(held.assigned)) == 6
    second.beat(group, 0.3)
    assert second.owned == {}
    first.owned = told  # it gives up the others and reports the six it kept: the rest are free
    first.beat(group, 0.4)
    second.beat(group, 0.5)
    assert len(_pairs(second.owned)) == 6 and not _pairs(second.owned) & _pairs(first.owned)


def test_refusals() -> None:
    group = ConsumerGroupState("g", SESSION)
    client = Client("m", frozenset("a"))
    client.beat(group, 0.0)

    def refusal(beat: Beat) -> Refusal:
        with pytest.raises(Refused) as caught:
            group.heartbeat(beat, partitions, 0.1)
        return caught.value.reason

    assert refusal(Beat("m", client.epoch + 1, owned={})) == Refusal.FENCED_EPOCH
    assert refusal(Beat("nobody", 3, owned={})) == Refusal.UNKNOWN_MEMBER
    assert refusal(Beat("m", client.epoch, assignor="sticky")) == Refusal.UNSUPPORTED_ASSIGNOR
    assert refusal(Beat("m", -3)) == Refusal.INVALID_REQUEST
    assert refusal(Beat("", 0, rebalance_timeout=1.0, topics=frozenset())) == (
        Refusal.INVALID_REQUEST
    )
    assert refusal(Beat("x", 0, topics=frozenset("a"))) == Refusal.INVALID_REQUEST  # no timeout
    with pytest.raises(Refused) as caught:
        group.check_commit("m", client.epoch + 1)
    assert caught.value.reason == Refusal.FENCED_EPOCH
    with pytest.raises(Refused) as caught:
        group.check_commit("m", client.epoch - 1)
    assert caught.value.reason == Refusal.STALE_EPOCH
    with pytest.raises(Refused) as caught:
        group.check_commit("", -1)  # no membership, while the group has members
    assert caught.value.reason == Refusal.UNKNOWN_MEMBER
    group.check_commit("m", client.epoch)


def test_a_static_member_back_takes_its_place_without_a_rebalance() -> None:
    group = ConsumerGroupState("g", SESSION)
    one = Client("one", frozenset("a"), instance="i1")
    two = Client("two", frozenset("a"), instance="i2")
    clients = {"one": one, "two": two}
    _settle(group, clients, 0.0)
    epoch = group.group_epoch
    group.heartbeat(Beat("one", LEAVE_STATIC, "i1"), partitions, 1.0)
    with pytest.raises(Refused) as caught:  # i2 is live
        Client("other", frozenset("a"), instance="i2").beat(group, 1.1)
    assert caught.value.reason == Refusal.UNRELEASED_INSTANCE
    back = Client("one-again", frozenset("a"), instance="i1")
    back.beat(group, 1.2)
    assert back.owned == one.owned and group.group_epoch == epoch


def test_a_new_coordinator_takes_members_back_with_what_they_own() -> None:
    old = ConsumerGroupState("g", SESSION)
    clients = {f"m{i}": Client(f"m{i}", frozenset("a")) for i in range(3)}
    _settle(old, clients, 0.0)
    before = _owners(clients)
    new = ConsumerGroupState("g", SESSION, adopting_until=SESSION)
    for client in clients.values():
        answer = new.heartbeat(
            Beat(
                client.member_id,
                client.epoch,
                rebalance_timeout=30.0,
                topics=client.topics,
                owned=dict(client.owned),
            ),
            partitions,
            1.0,
        )
        client.epoch = answer.epoch
        if answer.assignment is not None:
            client.owned = dict(answer.assignment)
    _settle(new, clients, 1.0)
    assert _owners(clients) == before  # nothing moved


def test_range_gives_contiguous_ranges_and_uniform_balances_mixed_subscriptions() -> None:
    subs = {"x": frozenset("ab"), "y": frozenset("ab"), "z": frozenset("a")}
    ranged = range_assign(subs, TOPICS)
    assert ranged["x"]["a"] == frozenset(range(4)) and ranged["x"]["b"] == frozenset(range(3))
    assert ranged["z"]["a"] == frozenset(range(8, 12))
    uniform = uniform_assign(subs, TOPICS, {})
    counts = sorted(len(_pairs(a)) for a in uniform.values())
    assert sum(counts) == 17 and counts[-1] - counts[0] <= 1
