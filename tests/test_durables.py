"""Durable types (standard, shared, none, last-value, map) and the map key/value API, end to end."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import headwater
from headwater.storage.lastvalue_store import LV, LVCOUNT, LVPOS
from headwater.storage.state import StateStore, key
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import ConsumerBusy, InvalidRequest, RevisionMismatch
from headwater.wire.records import build_batch
from tests.support.helpers import HANG, drain, drain_until, nothing_at_hand
from tests.support.rawwire import RawPeer


async def produce(
    client: headwater.Client, topic: str, items: list[tuple[bytes, bytes | None]]
) -> None:
    producer = client.producer(topic)
    for record_key, value in items:
        await producer.send(value, key=record_key)
    await producer.flush()


async def test_durable_kinds_check_their_subscription_types(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, dispatch="reliable")
    with pytest.raises(InvalidRequest, match="standard durable takes an exclusive"):
        await client.subscribe(topic_name, "s", type="shared", durable="standard")
    with pytest.raises(InvalidRequest, match="shared durable takes a shared"):
        await client.subscribe(topic_name, "s", type="exclusive", durable="shared")
    with pytest.raises(InvalidRequest, match="durable must be one of"):
        await client.subscribe(topic_name, "s", durable="forever")  # type: ignore[arg-type]
    standard = await client.subscribe(topic_name, "std", durable="standard")
    with pytest.raises(ConsumerBusy):
        await client.subscribe(topic_name, "std", durable="standard")
    await standard.close()


async def test_unknown_durable_kind_on_the_wire(server: ServerProcess, topic_name: str) -> None:
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic_name, dispatch="reliable")
    peer = await RawPeer.open(server.address)
    error = await peer.call(
        m.SubscribeRequest(topic_name, "s", 0, "c", 0, 10, m.SubscriptionSettings(durable=9))
    )
    assert isinstance(error, InvalidRequest) and "unknown durable kind 9" in error.message
    await peer.close()


async def test_durable_none_on_a_reliable_topic_keeps_nothing(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, dispatch="reliable")
    await produce(client, topic_name, [(None, b"before")])
    live = await client.subscribe(topic_name, "live", durable="none")
    await produce(client, topic_name, [(None, b"during")])
    assert [m.value for m in await drain(live, 1)] == [b"during"]
    await live.close()
    await produce(client, topic_name, [(None, b"while away")])
    again = await client.subscribe(topic_name, "live", durable="none")
    await produce(client, topic_name, [(None, b"after")])
    assert [m.value for m in await drain(again, 1)] == [b"after"]
    with pytest.raises(InvalidRequest, match="can only start at latest"):
        await client.subscribe(topic_name, "x", durable="none", start="earliest")


async def test_last_value_late_joiner_gets_one_current_value_per_key_then_updates(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(
        topic_name, partitions=2, dispatch="reliable", configs={"last.value": "true"}
    )
    await produce(
        client,
        topic_name,
        [
            (b"IBM", b"1"),
            (b"HP", b"5"),
            (b"IBM", b"2"),
            (b"INTC", b"9"),
            (b"IBM", b"3"),
            (b"HP", None),
        ],
    )
    watcher = await client.subscribe(
        topic_name, "w", durable="last-value", keys=[b"IBM", b"HP", b"ORCL"], key_prefix=b"IN"
    )
    snapshot = await drain(watcher, 2)
    assert sorted((m.key, m.value) for m in snapshot) == [(b"IBM", b"3"), (b"INTC", b"9")]
    await produce(
        client, topic_name, [(b"IBM", b"4"), (b"ORCL", b"7"), (b"AAPL", b"1"), (b"INTC", None)]
    )
    updates = await drain(watcher, 3)
    assert sorted((m.key, m.value) for m in updates) == [
        (b"IBM", b"4"),
        (b"INTC", None),
        (b"ORCL", b"7"),
    ]


async def test_slow_last_value_consumer_never_gets_a_stale_value(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, dispatch="reliable", configs={"last.value": "true"})
    await produce(client, topic_name, [(b"k", b"0")])
    watcher = await client.subscribe(
        topic_name, "slow", durable="last-value", keys=[b"k"], prefetch=1
    )
    first = await watcher.receive(timeout=HANG)
    await produce(client, topic_name, [(b"k", str(i).encode()) for i in range(1, 200)])
    # up to the last value (conflated or not, it comes last); nothing comes after it
    seen = [first] + await drain_until(watcher, lambda got: bool(got) and got[-1].value == b"199")
    await nothing_at_hand(watcher)
    offsets = [m.offset for m in seen]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert seen[-1].value == b"199"
    assert len(seen) < 200  # updates that waited were conflated


async def test_key_field_topics(client: headwater.Client, topic_name: str) -> None:
    await client.create_topic(topic_name, dispatch="reliable", configs={"key.field": "sym.id"})
    producer = client.producer(topic_name)
    await producer.send(json.dumps({"sym": {"id": "IBM"}, "px": 1}).encode())
    await producer.send(json.dumps({"sym": {"id": 7}, "px": 2}).encode())
    await producer.flush()
    table = client.map(topic_name)
    entry = await table.get("IBM")
    assert entry is not None and json.loads(entry.value)["px"] == 1
    assert await table.get("7") is not None  # a number becomes its JSON text
    with pytest.raises(InvalidRequest, match=r"no key field 'sym\.id'"):
        await (await producer.send(json.dumps({"px": 3}).encode()))
    with pytest.raises(InvalidRequest, match="is not JSON"):
        await (await producer.send(b"not json"))
    with pytest.raises(InvalidRequest, match="produce records to it"):
        await table.set("X", b"{}")


async def test_oversized_and_empty_keys(client: headwater.Client, topic_name: str) -> None:
    await client.create_topic(topic_name, dispatch="reliable", configs={"last.value": "true"})
    table = client.map(topic_name)
    with pytest.raises(InvalidRequest, match="exceeds the 65536-byte limit"):
        await table.set(b"k" * 70_000, b"v")
    with pytest.raises(InvalidRequest, match="must not be empty"):
        await table.get(b"")
    producer = client.producer(topic_name)
    with pytest.raises(InvalidRequest, match="exceeds"):
        await (await producer.send(b"v", key=b"k" * 70_000))


async def test_a_set_checks_every_write_before_it_writes_any(
    client: headwater.Client, topic_name: str
) -> None:
    """The checks of a set read its writes as columns (min and max in C, a lookup only for a
    write that compares): a bad key, a bad expectation or a failed comparison anywhere in the
    set refuses all of it, on one partition or several."""
    await client.create_topic(topic_name, partitions=3, dispatch="reliable")
    table = client.map(topic_name)
    first = await table.set_many({"a": "1", "b": "2"})
    connection = client._connection  # raw requests: the client checks nothing the server does

    async def raw_set(*writes: m.MapWrite) -> None:
        await connection.request(m.MapSetRequest(topic_name, writes))

    good = m.MapWrite(b"c", b"3", -1)
    with pytest.raises(InvalidRequest, match="must not be empty"):
        await raw_set(good, m.MapWrite(b"", b"x", -1))
    with pytest.raises(InvalidRequest, match="exceeds the 65536-byte limit"):
        await raw_set(good, m.MapWrite(b"k" * 70_000, b"x", -1))
    with pytest.raises(InvalidRequest, match="expected_revision"):
        await raw_set(good, m.MapWrite(b"d", b"x", -3))
    with pytest.raises(RevisionMismatch, match="key b'b' is at revision"):
        await raw_set(good, m.MapWrite(b"a", b"x", first[0]), m.MapWrite(b"b", b"x", -2))
    assert await table.size() == 2 and await table.get("c") is None
    revisions = await raw_set_revisions(
        connection, topic_name, good, m.MapWrite(b"a", b"4", first[0])
    )
    assert len(revisions) == 2 and await table.size() == 3
    assert [v.value if v else None for v in await table.get_many(["a", "c"])] == [b"4", b"3"]


async def raw_set_revisions(
    connection: Any, topic_name: str, *writes: m.MapWrite
) -> tuple[int, ...]:
    response = await connection.request(m.MapSetRequest(topic_name, writes))
    assert isinstance(response, m.MapSetResponse)
    return response.revisions


async def test_last_value_and_map_need_a_reliable_topic(
    client: headwater.Client, topic: str
) -> None:
    with pytest.raises(InvalidRequest, match="needs a reliable topic"):
        await client.subscribe(topic, "lv", durable="last-value", keys=["a"])
    with pytest.raises(InvalidRequest, match="need a reliable topic"):
        await client.map(topic).get("a")
    await client.create_topic(f"{topic}-r", dispatch="reliable")
    with pytest.raises(InvalidRequest, match="names keys, a key prefix"):
        await client.subscribe(f"{topic}-r", "lv", durable="last-value")


async def test_map_api(client: headwater.Client, topic_name: str) -> None:
    await client.create_topic(topic_name, partitions=3, dispatch="reliable")
    table = client.map(topic_name)
    revision = await table.create("a", "1")  # the first write switches last-value state on
    with pytest.raises(RevisionMismatch, match="is at revision 0, expected absent"):
        await table.create("a", "again")
    with pytest.raises(RevisionMismatch):
        await table.set("a", "2", revision=revision + 5)
    second = await table.set("a", "2", revision=revision)
    assert second > revision
    await table.set_many({f"user:{i:03d}": str(i) for i in range(250)})
    assert await table.size() == 251
    values = await table.get_many(["a", "user:007", "missing"])
    assert [v.value if v else None for v in values] == [b"2", b"7", None]
    first_page = await table.scan(prefix="user:", limit=100)
    assert len(first_page.entries) == 100 and first_page.cursor == b"user:099"
    keys = [e.key async for e in table.items(prefix="user:", page_size=64)]
    assert keys == [f"user:{i:03d}".encode() for i in range(250)]
    await table.delete("user:000")
    assert await table.get("user:000") is None and await table.size() == 250
    with pytest.raises(RevisionMismatch):
        await table.delete("a", revision=revision)
    # a set is a record on the topic: subscribers see it
    watcher = await client.subscribe(topic_name, "w", durable="map", keys=["a"])
    (current,) = await drain(watcher, 1)
    assert current.value == b"2" and current.offset == second


async def test_state_is_built_from_history_on_first_use(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, dispatch="reliable")  # no last-value state yet
    await produce(client, topic_name, [(b"x", b"1"), (b"y", b"2"), (b"x", b"3"), (None, b"nokey")])
    table = client.map(topic_name)
    await table.set("z", "0")  # the first map write builds the state from the history
    assert (await table.get("x")).value == b"3"  # type: ignore[union-attr]
    assert await table.size() == 3
    await produce(client, topic_name, [(b"y", None)])  # maintained from now on
    assert await table.get("y") is None
    info = await client.describe_topic(topic_name)
    assert ("last.value", "true") in [(c.name, c.value) for c in info.topic.configs]


async def test_a_read_never_switches_last_value_state_on(
    client: headwater.Client, topic_name: str
) -> None:
    """Issue 13: MAP_GET/SCAN/SIZE and last-value subscriptions on a topic without last-value
    state are refused (INVALID_REQUEST) and leave the topic's configuration as it was."""
    await client.create_topic(topic_name, dispatch="reliable")
    await produce(client, topic_name, [(b"x", b"1")])
    table = client.map(topic_name)
    refused = "has no last-value state: create it with --last-value"
    for read in (lambda: table.get("x"), table.size, lambda: table.scan("")):
        with pytest.raises(InvalidRequest, match=refused):
            await read()
    for durable in ("last-value", "map"):
        with pytest.raises(InvalidRequest, match=refused):
            await client.subscribe(topic_name, "lv", durable=durable, keys=["x"])  # type: ignore[arg-type]
    info = await client.describe_topic(topic_name)
    assert "last.value" not in [c.name for c in info.topic.configs]
    await table.set("y", "2")  # a write does switch it on
    assert [e.key for e in (await table.scan("")).entries] == [b"x", b"y"]


async def test_last_values_survive_kill_9_and_rebuild_when_state_is_lost(
    fresh_server: ServerProcess,
) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("lv", dispatch="reliable", configs={"last.value": "true"})
        table = client.map("lv")
        await table.set_many({"a": "1", "b": "2"})
        await table.set("a", "3")
        await table.delete("b")
    fresh_server.kill()
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        table = client.map("lv")
        assert (await table.get("a")).value == b"3"  # type: ignore[union-attr]
        assert await table.get("b") is None and await table.size() == 1
    fresh_server.stop()
    # lose the last-value state (not the topic): the server rebuilds it from the WAL
    state = StateStore(fresh_server.data_dir / "state")
    for prefix in (LV, LVPOS):
        state.delete_prefix(key(prefix, "lv") + b"\0")
    state.write(deletes=[key(LVCOUNT, "lv")])
    state.close()
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        table = client.map("lv")
        assert (await table.get("a")).value == b"3"  # type: ignore[union-attr]
        assert await table.get("b") is None and await table.size() == 1


async def test_raw_tombstone_removes_the_key(server: ServerProcess, topic_name: str) -> None:
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic_name, dispatch="reliable", configs={"last.value": "true"})
        peer = await RawPeer.open(server.address)
        await peer.call(m.ProduceRequest(topic_name, 0, build_batch([(b"k", b"v", [])])))
        assert await client.map(topic_name).get("k") is not None
        await peer.call(m.ProduceRequest(topic_name, 0, build_batch([(b"k", None, [])])))
        assert await client.map(topic_name).get("k") is None
        await peer.close()


# A property test: any sequence of sets, deletes and restarts leaves `map get` agreeing with a
# plain dict that saw the same sequence.

_examples = itertools.count()
operations = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.sampled_from("abcde"), st.binary(min_size=1, max_size=8)),
        st.tuples(st.just("delete"), st.sampled_from("abcde"), st.just(b"")),
        st.tuples(st.just("restart"), st.just(""), st.just(b"")),
    ),
    max_size=25,
).filter(lambda ops: sum(op[0] == "restart" for op in ops) <= 2)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=operations)
def test_map_agrees_with_a_dict_across_restarts(
    fresh_server: ServerProcess, ops: list[tuple[str, str, bytes]]
) -> None:
    topic = f"prop-{next(_examples)}"
    expected: dict[str, bytes] = {}

    async def run() -> None:
        client = await headwater.connect(fresh_server.address)
        await client.create_topic(
            topic,
            partitions=2,
            dispatch="reliable",
            configs={"fsync": "always", "last.value": "true"},  # reads alone never enable it
        )
        for op, name, value in ops:
            if op == "set":
                await client.map(topic).set(name, value)
                expected[name] = value
            elif op == "delete":
                await client.map(topic).delete(name)
                expected.pop(name, None)
            else:
                await client.close()
                fresh_server.kill()
                fresh_server.start()
                client = await headwater.connect(fresh_server.address)
            table = client.map(topic)
            for name_ in "abcde":
                got = await table.get(name_)
                assert (got.value if got else None) == expected.get(name_), (op, name_)
        assert await client.map(topic).size() == len(expected)
        await client.close()

    asyncio.run(run())


async def test_cli_map_commands(server: ServerProcess, topic_name: str) -> None:
    from tests.support.cli_process import hw

    assert (
        hw(
            "topic", "create", topic_name, "--dispatch", "reliable", "--last-value", server=server
        ).returncode
        == 0
    )
    assert hw("map", "set", topic_name, "color", "blue", server=server).stdout.startswith(
        "revision "
    )
    assert hw("map", "set", topic_name, "size", "L", server=server).returncode == 0
    got = hw("map", "get", topic_name, "color", server=server)
    assert got.returncode == 0 and got.stdout == "blue\n"
    assert hw("map", "size", topic_name, server=server).stdout == "2\n"
    scanned = hw("map", "scan", topic_name, "--prefix", "s", server=server)
    assert scanned.stdout == "size\tL\n"
    assert hw("map", "delete", topic_name, "color", server=server).returncode == 0
    missing = hw("map", "get", topic_name, "color", server=server)
    assert missing.returncode == 1 and "not found" in missing.stderr
    gone = hw("map", "delete", topic_name, "color", server=server)
    assert gone.returncode == 1 and "not found" in gone.stderr
    stale = hw("map", "set", topic_name, "size", "M", "--revision", "99", server=server)
    assert stale.returncode == 1 and "REVISION_MISMATCH" in stale.stderr
    watch = hw(
        "consume",
        topic_name,
        "-s",
        "w",
        "--durable",
        "last-value",
        "--key",
        "size",
        "--count",
        "1",
        "--format",
        "json",
        server=server,
    )
    assert json.loads(watch.stdout)["value"] == "L"


async def test_bad_map_and_ack_requests(server: ServerProcess, topic_name: str) -> None:
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic_name, dispatch="reliable", configs={"last.value": "true"})
    peer = await RawPeer.open(server.address)

    async def refused(request: m.Request, text: str) -> None:
        error = await peer.call(request)
        assert isinstance(error, InvalidRequest), error
        assert text in error.message

    await refused(m.MapScanRequest(topic_name, b"", 0, b""), "scan limit must be 1..1000")
    await refused(m.MapScanRequest(topic_name, b"", 5000, b""), "scan limit must be 1..1000")
    await refused(m.MapSetRequest(topic_name, ()), "a set holds 1..1000 writes")
    await refused(m.MapSetRequest(topic_name, (m.MapWrite(b"k", b"v", -7),)), "expected_revision")
    await refused(
        m.MapGetRequest(topic_name, (b"k",) * 1001), "keys holds 1001 entries; at most 1000"
    )
    subscribed = await peer.call(m.SubscribeRequest(topic_name, "s", 0, "c", 0, 10))
    assert isinstance(subscribed, m.SubscribeResponse)
    consumer = subscribed.consumer_id
    await refused(m.AckRequest(consumer, (m.AckEntry(0, 0),), kind=5), "unknown ack kind 5")
    await refused(m.AckRequest(consumer, (m.AckEntry(9, 0),)), "has no partition 9")
    await refused(m.NackRequest(consumer, (m.AckEntry(0, 0),), -1), "nack delay must be >= 0")
    await refused(m.AckRangesRequest(consumer, (m.AckRange(9, 0, 1),)), "has no partition 9")
    await refused(
        m.AckRangesRequest(consumer, (m.AckRange(0, 5, 0),)), "counts 1 or more offsets, not 0"
    )
    await refused(
        m.AckRangesRequest(consumer, (m.AckRange(0, 0, 6_000),) * 2),
        "ranges cover 12000 offsets; at most 10000 a request",
    )
    # a range reaching far past anything delivered is clamped to what was, not walked
    clamped = await peer.call(m.AckRangesRequest(consumer, (m.AckRange(0, -(2**62), 10_000),)))
    assert isinstance(clamped, m.EmptyResponse), clamped
    await peer.close()
