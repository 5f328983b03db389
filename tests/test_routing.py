"""The client's routing table and lookup backoff, sans I/O: LOOKUP answers applied, NOT_OWNER
with and without an owner address, a broker vanishing, partitions moving, stale routes."""

from __future__ import annotations

import random

from headwater.routing import BrokerAddress, LookupBackoff, RoutingTable
from headwater.wire import messages as m
from headwater.wire.errors import ErrorCode, NotOwner, UnknownTopic

BOOT = BrokerAddress("", "127.0.0.1", 7000)
A = m.LookupBroker("a", "127.0.0.1", 7001)
B = m.LookupBroker("b", "127.0.0.1", 7002)
C = m.LookupBroker("c", "127.0.0.1", 7003)


def answer(
    brokers: tuple[m.LookupBroker, ...], owners: list[str], epochs: list[int] | None = None
) -> m.LookupResponse:
    epochs = epochs or [1] * len(owners)
    partitions = tuple(
        m.LookupPartition(p, o, e) for p, (o, e) in enumerate(zip(owners, epochs, strict=True))
    )
    return m.LookupResponse(brokers, (m.LookupTopic("t", 0, "", partitions),))


def address(broker: m.LookupBroker) -> BrokerAddress:
    return BrokerAddress(broker.broker_id, broker.host, broker.port)


def test_single_broker_routes_everything_to_the_bootstrap_address() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((m.LookupBroker("local", "0.0.0.0", 0),), ["local", "local"]), 0.0)
    assert not table.multi_broker
    assert table.owner("t", 0) == table.owner("t", 1) == BOOT
    assert table.owner("t", -1) == BOOT
    assert table.partitions("t") == 2


def test_routes_follow_the_owners_lookup_names() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((A, B, C), ["a", "b", "c", "a"]), 0.0)
    assert table.multi_broker
    assert [table.owner("t", p) for p in range(4)] == [address(x) for x in (A, B, C, A)]
    assert table.owned_by("t") == {address(A): [0, 3], address(B): [1], address(C): [2]}
    assert table.owner("t", 9) is None  # beyond the partitions known
    assert table.owner("t", -1) == BOOT  # "any partition": the server picks


def test_a_partition_without_owner_has_no_route() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((A, B), ["a", ""]), 0.0)
    assert table.owner("t", 1) is None
    assert table.owned_by("t") == {address(A): [0]}


def test_not_owner_naming_a_known_broker_moves_the_partition_at_once() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((A, B), ["a", "a"]), 0.0)
    error = NotOwner("partition 1 of topic 't' is not served here: owner=b@127.0.0.1:7002")
    assert table.not_owner("t", 1, error) == address(B)
    assert table.owner("t", 1) == address(B)
    assert table.owner("t", 0) == address(A)
    assert table.needs_lookup("t", 0.0)  # stale: confirmed by the next lookup


def test_not_owner_without_owner_leaves_the_partition_unrouted() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((A, B), ["a", "b"]), 0.0)
    error = NotOwner("partition 1 of topic 't' is not served here: owner=none")
    assert error.owner_address is None
    assert table.not_owner("t", 1, error) is None
    assert table.owner("t", 1) is None
    assert table.needs_lookup("t", 0.0)


def test_not_owner_naming_an_unknown_broker_waits_for_the_lookup() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((A, B), ["a", "b"]), 0.0)
    error = NotOwner("partition 0 of topic 't' is not served here: owner=z@10.0.0.9:7999")
    assert table.not_owner("t", 0, error) is None
    assert table.owner("t", 0) is None
    table.apply(answer((A, B, m.LookupBroker("z", "10.0.0.9", 7999)), ["z", "b"]), 1.0)
    assert table.owner("t", 0) == BrokerAddress("z", "10.0.0.9", 7999)
    assert not table.needs_lookup("t", 1.0)


def test_a_lost_broker_unroutes_its_partitions_and_stales_the_topic() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((A, B, C), ["a", "b", "c", "b"]), 0.0)
    assert table.broker_lost((B.host, B.port)) == ["t"]
    assert table.owner("t", 1) is None and table.owner("t", 3) is None
    assert table.owner("t", 0) == address(A)
    assert table.needs_lookup("t", 0.0)
    assert table.broker_lost(("127.0.0.1", 1)) == []  # a broker nobody routes to


def test_a_broker_vanishing_from_lookup_leaves_its_partitions_ownerless() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((A, B, C), ["a", "b", "c"], [1, 1, 1]), 0.0)
    # c's lease lapsed: the live brokers no longer include it, its partition not yet re-owned
    table.apply(answer((A, B), ["a", "b", "c"], [1, 1, 1]), 1.0)
    assert table.owner("t", 2) is None
    assert "c" not in table.brokers
    # then b takes it over, with a newer epoch
    table.apply(answer((A, B), ["a", "b", "b"], [1, 1, 2]), 2.0)
    assert table.owner("t", 2) == address(B)


def test_partitions_moving_between_brokers() -> None:
    table = RoutingTable(BOOT)
    table.apply(answer((A, B), ["a", "a", "b", "b"], [1, 1, 1, 1]), 0.0)
    table.apply(answer((A, B), ["b", "a", "a", "b"], [2, 1, 2, 1]), 1.0)
    assert [table.owner("t", p) for p in range(4)] == [address(x) for x in (B, A, A, B)]
    assert table.owned_by("t") == {address(B): [0, 3], address(A): [1, 2]}


def test_an_older_epoch_does_not_undo_a_move() -> None:
    """A broker that has not seen the move yet answers with the old owner and epoch."""
    table = RoutingTable(BOOT)
    table.apply(answer((A, B), ["b", "a"], [5, 1]), 0.0)
    table.apply(answer((A, B), ["a", "a"], [4, 1]), 1.0)
    assert table.owner("t", 0) == address(B)


def test_an_unknown_topic_keeps_its_error_and_is_asked_again_later() -> None:
    table = RoutingTable(BOOT, refresh_interval=2.0, single_refresh=30.0)
    response = m.LookupResponse(
        (A, B), (m.LookupTopic("gone", ErrorCode.UNKNOWN_TOPIC, "topic 'gone' does not exist", ()),)
    )
    table.apply(response, 0.0)
    assert isinstance(table.error("gone"), UnknownTopic)
    assert table.owner("gone", 0) is None and table.partitions("gone") is None
    assert not table.needs_lookup("gone", 1.0)
    assert table.needs_lookup("gone", 2.0)


def test_refresh_intervals_single_and_multi_broker() -> None:
    table = RoutingTable(BOOT, refresh_interval=2.0, single_refresh=30.0)
    assert table.needs_lookup("t", 0.0)  # never looked up
    table.apply(answer((A,), ["a"]), 0.0)
    assert not table.needs_lookup("t", 29.0) and table.needs_lookup("t", 30.0)
    table.apply(answer((A, B), ["a"]), 0.0)
    assert not table.needs_lookup("t", 1.9) and table.needs_lookup("t", 2.0)
    table.invalidate("t")
    assert table.needs_lookup("t", 0.0)


def test_a_server_without_lookup_is_one_broker_for_good() -> None:
    table = RoutingTable(BOOT)
    table.unsupported(["t"], 0.0)
    assert not table.lookup_supported and not table.multi_broker
    assert table.owner("t", 3) == BOOT
    assert not table.needs_lookup("t", 1e9)


def test_lookup_backoff_grows_jittered_and_ends_within_its_timeout() -> None:
    backoff = LookupBackoff(initial=0.05, maximum=1.0, timeout=5.0)
    delays = list(backoff.delays(random.Random(7)))
    assert 0.025 <= delays[0] <= 0.05
    assert all(delay <= 1.0 for delay in delays)
    assert max(delays) > 0.5  # it grows toward the maximum
    assert sum(delays) <= 5.0
    assert sum(delays) > 5.0 - 1.0  # and uses the time it has
    assert len(delays) < 200  # bounded in count too
