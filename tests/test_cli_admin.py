"""The admin commands end to end through the CLI (`python -m headwater ...` against a live server):
topic create/alter/describe/delete, subscription list/reset/delete, server info, each with
`--format json` parsed and checked, and hostile input refused with a precise error and exit 1.
"""

from __future__ import annotations

import asyncio
import json
import re
import resource
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import headwater
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.records import build_batch
from tests.support.cli_process import hw
from tests.support.secure import secure_server
from tests.test_metrics import scrape, start_with_http, value


def ok(*args: str, server: ServerProcess) -> str:
    result = hw(*args, server=server)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def as_json(*args: str, server: ServerProcess) -> Any:
    return json.loads(ok(*args, "--format", "json", server=server))


def refused(*args: str, server: ServerProcess, says: str) -> str:
    """The command fails with exit 1, one error line naming the problem, and no traceback."""
    result = hw(*args, server=server)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert says in result.stderr, result.stderr
    assert result.stderr.startswith("headwater: error: "), result.stderr
    return result.stderr


def subscription(server: ServerProcess, topic: str, name: str) -> dict[str, Any]:
    found = [s for s in as_json("subscription", "list", topic, server=server) if s["name"] == name]
    assert len(found) == 1, found
    return found[0]  # type: ignore[no-any-return]


def test_topic_create_describe_alter_delete_json(server: ServerProcess, topic_name: str) -> None:
    created = as_json("topic", "create", topic_name, "--partitions", "2", server=server)
    plain = {"name": topic_name, "partitions": 2, "dispatch": "reliable", "last_value": False}
    assert created == {**plain, "created": True}
    again = as_json("topic", "create", topic_name, "--exist-ok", server=server)
    assert again == {**plain, "created": False}
    refused("topic", "create", topic_name, server=server, says="TOPIC_EXISTS")
    ok("produce", topic_name, "--partition", "0", "a", "b", "c", server=server)
    ok("produce", topic_name, "--partition", "1", "d", "e", server=server)

    described = as_json("topic", "describe", topic_name, server=server)
    assert described["partition_count"] == 2
    assert [p["partition"] for p in described["partitions"]] == [0, 1]
    first, second = described["partitions"]
    assert (first["start_offset"], first["next_offset"], second["next_offset"]) == (0, 3, 2)
    for partition in described["partitions"]:
        assert partition["size_bytes"] > 0 and partition["segments"] == 1
        assert partition["local_start_offset"] == 0
        # nothing sealed yet, so nothing uploaded: every offset is upload lag
        assert partition["uploaded_offset"] == 0
        assert partition["upload_lag_offsets"] == partition["next_offset"]
        assert partition["upload_lag_bytes"] == partition["size_bytes"]
    assert described["configs"]["retention.ms"] != "60000"
    table = ok("topic", "describe", topic_name, server=server)
    assert "UPLOAD_LAG" in table and "SEGMENTS" in table

    altered = as_json(
        "topic", "alter", topic_name, "--config", "retention.ms=60000", "--config",
        "fsync=interval", server=server,
    )  # fmt: skip
    assert altered["name"] == topic_name
    assert altered["configs"]["retention.ms"] == "60000"
    assert altered["configs"]["fsync"] == "interval"
    assert altered["configs"]["segment.bytes"] == described["configs"]["segment.bytes"]  # kept
    assert as_json("topic", "describe", topic_name, server=server)["configs"] == altered["configs"]

    assert as_json("topic", "delete", topic_name, server=server) == {
        "name": topic_name,
        "deleted": True,
    }
    refused("topic", "describe", topic_name, server=server, says="UNKNOWN_TOPIC")


def test_server_raises_its_open_files_limit_and_says_how_many_partitions_it_allows(
    tmp_path: Path,
) -> None:
    """issue 41: a 1,024-partition reliable topic failed on the default soft limit of 1,024. The
    server raises the soft limit to the hard one at start and says what that allows, in
    `server info` and in its log (docs/OPERATIONS.md, "Open files")."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(1024, soft)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))  # the child inherits it
    try:
        server = ServerProcess(tmp_path / "data").start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        limits = Path(f"/proc/{server.process.pid}/limits").read_text()  # type: ignore[union-attr]
        found = re.search(r"^Max open files\s+(\d+|unlimited)\s+(\d+|unlimited)", limits, re.M)
        assert found is not None and found[1] == found[2], limits  # raised to the hard limit
        limit = -1 if found[1] == "unlimited" else int(found[1])
        info = as_json("server", "info", server=server)
        # two descriptors per reliable partition beside 256 of the server's own and 10,000
        # connections (server.max_connections' default)
        allowed = -1 if limit == -1 else max(0, (limit - 256 - 10_000) // 2)
        assert (info["open_files_limit"], info["partitions_allowed"]) == (limit, allowed)
        text = ok("server", "info", server=server)
        if limit != -1:
            assert f"open files: {limit} (allows {allowed} reliable partitions" in text
        logged = re.findall(
            r"server\.open_files .*open_files=(-?\d+) partitions=(-?\d+)", server.log()
        )
        assert logged == [(str(limit), str(allowed))], server.log()
        if limit == -1 or limit >= 1024 + 512:  # the repro, where the hard limit allows
            ok("topic", "create", "wide", "--partitions", "1024", server=server)
    finally:
        server.kill()


def test_topic_create_says_it_made_a_last_value_topic(
    server: ServerProcess, topic_name: str
) -> None:
    """issue 41: `topic create --last-value` said only "created topic T (reliable)"."""
    text = ok("topic", "create", topic_name, "--last-value", server=server)
    assert text.strip() == f"created topic {topic_name} (reliable, last-value)"
    again = ok("topic", "create", topic_name, "--exist-ok", server=server)
    assert again.strip() == (
        f"topic {topic_name} exists already (reliable, last-value, 1 partition)"
    )
    keyed = as_json(
        "topic", "create", f"{topic_name}.k", "--last-value", "--key-field", "id", server=server
    )
    assert keyed["last_value"] is True and keyed["created"] is True
    keyed_text = ok("topic", "create", f"{topic_name}.k", "--exist-ok", server=server)
    assert "(reliable, last-value, keys from JSON field id, 1 partition)" in keyed_text


def test_alter_applies_at_once_and_survives_a_restart(fresh_server: ServerProcess) -> None:
    server = fresh_server
    ok("topic", "create", "rolled", server=server)
    ok("topic", "alter", "rolled", "--config", "segment.bytes=1024", server=server)
    # one record per batch, ~300 bytes each: the new segment size must roll the WAL
    ok(
        "produce", "rolled", "--count", "20", "--size", "200", "--batch-size", "300",
        server=server,
    )  # fmt: skip
    (partition,) = as_json("topic", "describe", "rolled", server=server)["partitions"]
    assert partition["segments"] >= 4, partition
    ok("topic", "alter", "rolled", "--config", "fsync=never", "--last-value", server=server)

    assert server.stop() == 0
    server.start()
    configs = as_json("topic", "describe", "rolled", server=server)["configs"]
    assert configs["segment.bytes"] == "1024"
    assert configs["fsync"] == "never"
    assert configs["last.value"] == "true"
    ok("map", "set", "rolled", "k", "v", server=server)
    assert ok("map", "get", "rolled", "k", server=server).strip() == "v"


def test_alter_refuses_bad_configs(server: ServerProcess, topic_name: str) -> None:
    ok("topic", "create", topic_name, "--last-value", "--key-field", "id", server=server)
    alter = ("topic", "alter", topic_name)
    refused(*alter, "--config", "colour=blue", server=server, says="unknown topic config 'colour'")
    refused(*alter, "--config", "retention.ms=soon", server=server, says="must be an integer")
    refused(*alter, "--config", "segment.bytes=1", server=server, says="at least 1024")
    refused(*alter, "--config", "fsync=sometimes", server=server, says="always, interval or never")
    refused(
        *alter, "--config", "partitions=4", server=server, says="'partitions' cannot be changed"
    )
    refused(*alter, "--config", "dispatch=non-reliable", server=server, says="cannot be changed")
    refused(*alter, "--config", "last.value=false", server=server, says="cannot be turned off")
    refused(*alter, "--last-value", "--key-field", "name", server=server, says="'key.field'")
    refused(*alter, "--config", "fsync", server=server, says="NAME=VALUE")
    refused(*alter, server=server, says="nothing to change")
    refused("topic", "alter", "no-such-topic", "--config", "fsync=never", server=server,
            says="UNKNOWN_TOPIC")  # fmt: skip
    fast = f"{topic_name}-fast"
    ok("topic", "create", fast, "--dispatch", "non-reliable", "--partitions", "3", server=server)
    # a non-reliable topic has no per-partition details, yet its count is there
    fast_described = as_json("topic", "describe", fast, server=server)
    assert (fast_described["partition_count"], fast_described["partitions"]) == (3, [])
    refused("topic", "alter", fast, "--config", "retention.ms=1", server=server,
            says="non-reliable")  # fmt: skip
    refused("topic", "alter", fast, "--last-value", server=server, says="non-reliable")
    # nothing was changed by the refusals
    configs = as_json("topic", "describe", topic_name, server=server)["configs"]
    assert (configs["key.field"], configs["last.value"]) == ("id", "true")


def test_a_read_never_changes_configuration(server: ServerProcess, topic_name: str) -> None:
    ok("topic", "create", topic_name, server=server)
    ok("produce", topic_name, "--key", "k", "v1", server=server)
    before = as_json("topic", "describe", topic_name, server=server)["configs"]
    refused("map", "get", topic_name, "k", server=server, says="no last-value state")
    refused("map", "scan", topic_name, server=server, says="no last-value state")
    refused("map", "size", topic_name, server=server, says="no last-value state")
    refused(
        "consume", topic_name, "-s", "view", "--durable", "last-value", "--key", "k",
        "--count", "1", server=server, says="no last-value state",
    )  # fmt: skip
    ok("subscription", "list", topic_name, server=server)
    after = as_json("topic", "describe", topic_name, server=server)["configs"]
    assert after == before and "last.value" not in after
    # the explicit switch builds the state from the history already stored
    altered = as_json("topic", "alter", topic_name, "--last-value", server=server)
    assert altered["configs"]["last.value"] == "true"
    assert ok("map", "get", topic_name, "k", server=server).strip() == "v1"
    # a missing key is an error in the one documented form, for get and delete alike
    for command in ("get", "delete"):
        refused("map", command, topic_name, "nope", server=server, says="KEY_NOT_FOUND: key 'nope'")


def test_subscription_list_reset_delete(server: ServerProcess, topic_name: str) -> None:
    ok("topic", "create", topic_name, "--partitions", "2", server=server)
    ok("produce", topic_name, "--partition", "0", "a", "b", "c", server=server)
    ok("produce", topic_name, "--partition", "1", "d", "e", server=server)
    ok("consume", topic_name, "-s", "s1", "--from", "earliest", "--count", "2", server=server)
    sub = subscription(server, topic_name, "s1")
    assert (sub["topic"], sub["type"], sub["durable"]) == (topic_name, "exclusive", "standard")
    assert (sub["lag"], sub["backlog"], sub["unacked"], sub["redelivering"]) == (3, 3, 0, 0)
    assert sum(p["committed"] for p in sub["partitions"]) == 2
    assert [p["next_offset"] for p in sub["partitions"]] == [3, 2]
    # taken without an ack: after the consumer leaves they wait for redelivery
    ok("consume", topic_name, "-s", "s1", "--count", "2", "--no-ack", server=server)
    sub = subscription(server, topic_name, "s1")
    assert (sub["lag"], sub["backlog"], sub["redelivering"]) == (3, 1, 2), sub
    for p in sub["partitions"]:
        assert p["lag"] == p["backlog"] + p["unacked"] + p["redelivering"]
        assert p["backlog"] == p["next_offset"] - p["dispatched"]
    table = ok("subscription", "list", server=server)  # every topic's
    assert "REDELIVERING" in table and topic_name in table

    reset = ("subscription", "reset", topic_name, "s1", "--to")
    moved = as_json(*reset, "earliest", server=server)
    assert [p["committed"] for p in moved["partitions"]] == [0, 0] and moved["lag"] == 5
    moved = as_json(*reset, "latest", server=server)
    assert [p["committed"] for p in moved["partitions"]] == [3, 2] and moved["lag"] == 0
    moved = as_json(*reset, "1", server=server)
    assert [p["committed"] for p in moved["partitions"]] == [1, 1]
    text = ok(*reset, "earliest", server=server)
    assert text.strip() == f"moved s1 on {topic_name} to earliest (partition:offset 0:0, 1:0)"

    ok("subscription", "delete", topic_name, "s1", server=server)
    assert not [s for s in as_json("subscription", "list", topic_name, server=server)]
    refused(*reset, "earliest", server=server, says="UNKNOWN_SUBSCRIPTION")
    refused("subscription", "delete", topic_name, "s1", server=server,
            says="UNKNOWN_SUBSCRIPTION")  # fmt: skip
    refused("subscription", "list", "no-such-topic", server=server, says="UNKNOWN_TOPIC")
    deleted = hw("subscription", "delete", topic_name, "s2", server=server)
    assert deleted.returncode == 1


def test_subscription_reset_to_a_timestamp(server: ServerProcess, topic_name: str) -> None:
    ok("topic", "create", topic_name, server=server)
    ok("produce", topic_name, "old-1", "old-2", "old-3", server=server)
    ok("produce", topic_name, "new-1", "new-2", server=server)  # another process: a later time
    records = [
        json.loads(line)
        for line in ok(
            "consume", topic_name, "-s", "peek", "--from", "earliest", "--count", "5",
            "--format", "json", server=server,
        ).splitlines()
    ]  # fmt: skip
    assert [r["value"] for r in records] == ["old-1", "old-2", "old-3", "new-1", "new-2"]
    cut = records[3]["timestamp"]
    assert cut > records[2]["timestamp"]
    ok("consume", topic_name, "-s", "s", "--from", "earliest", "--count", "1", server=server)

    reset = ("subscription", "reset", topic_name, "s", "--to")
    moved = as_json(*reset, f"@{cut}", server=server)
    assert moved["partitions"][0]["committed"] == 3
    ok(*reset, "earliest", server=server)
    iso = datetime.fromtimestamp(cut / 1000, UTC).isoformat(timespec="milliseconds")
    assert as_json(*reset, iso, server=server)["partitions"][0]["committed"] == 3
    naive = iso.removesuffix("+00:00")  # no zone: UTC
    assert as_json(*reset, naive, server=server)["partitions"][0]["committed"] == 3
    replay = ok("consume", topic_name, "-s", "s", "--count", "2", server=server)
    assert replay.splitlines() == ["new-1", "new-2"]
    # a time before everything: the oldest message
    assert as_json(*reset, "@0", server=server)["partitions"][0]["committed"] == 0
    assert as_json(*reset, "1970-01-02", server=server)["partitions"][0]["committed"] == 0
    # a time after the last message, but not in the future: the end
    latest = int(time.time() * 1000)
    assert as_json(*reset, f"@{latest}", server=server)["partitions"][0]["committed"] == 5

    refused(*reset, "2999-01-01T00:00:00Z", server=server, says="is in the future")
    refused(*reset, f"@{int(time.time() * 1000) + 3_600_000}", server=server, says="future")
    refused(*reset, "yesterday", server=server, says="ISO-8601")
    refused(*reset, "-5", server=server, says="ISO-8601")
    refused(*reset, "1960-01-01", server=server, says="before 1970")


async def test_dead_lettered_counts_per_partition(server: ServerProcess, topic_name: str) -> None:
    ok("topic", "create", topic_name, "--partitions", "2", server=server)
    ok("produce", topic_name, "--partition", "1", "poison", server=server)
    async with await headwater.connect(server.address) as client:
        consumer = await client.subscribe(
            topic_name, "dl", start="earliest", max_deliveries=1, backoff="fixed",
            backoff_initial=0.01,
        )  # fmt: skip
        message = await consumer.receive(timeout=30)
        await message.nack()  # its one delivery is used up: the next round dead-letters it
        deadline = time.monotonic() + 15
        sub = subscription(server, topic_name, "dl")
        while not sub["dead_lettered"] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            sub = subscription(server, topic_name, "dl")
        await consumer.close()
    assert [p["dead_lettered"] for p in sub["partitions"]] == [0, 1]
    assert sub["dead_lettered"] == 1 and sub["lag"] == 0


def test_server_info(fresh_server: ServerProcess) -> None:
    server = fresh_server
    info = as_json("server", "info", server=server)
    assert set(info) == {
        "version", "started_ms", "uptime_ms", "connections", "topics", "subscriptions",
        "data_dir", "data_dir_bytes", "memory_budget_bytes", "memory_used_bytes",
        "memory_principal_share_bytes", "memory_principals", "open_files_limit",
        "partitions_allowed",
    }  # fmt: skip
    assert info["memory_budget_bytes"] > 0 and info["memory_used_bytes"] == 0
    assert info["memory_principal_share_bytes"] == info["memory_budget_bytes"] // 4
    assert info["memory_principals"] == {}
    assert info["version"] == ok("--version", server=server).split()[1]
    assert info["connections"] >= 1  # this command's own
    assert (info["topics"], info["subscriptions"]) == (0, 0)
    assert Path(info["data_dir"]) == server.data_dir.resolve()
    assert 0 < info["started_ms"] <= time.time() * 1000
    ok("topic", "create", "one", server=server)
    ok("topic", "create", "two", "--dispatch", "non-reliable", server=server)
    ok("produce", "one", "--count", "200", "--size", "1000", server=server)
    ok("consume", "one", "-s", "s", "--from", "earliest", "--count", "1", server=server)
    later = as_json("server", "info", server=server)
    assert (later["topics"], later["subscriptions"]) == (2, 1)
    # the directory's size is counted at most once a second (docs/PROTOCOL.md): a figure counted
    # before the produce may be served for up to a second more
    deadline = time.monotonic() + 30  # bounds a hang only
    while later["data_dir_bytes"] < info["data_dir_bytes"] + 200_000:
        assert time.monotonic() < deadline, (info, later)
        time.sleep(0.2)
        later = as_json("server", "info", server=server)
    assert later["uptime_ms"] >= info["uptime_ms"]
    table = ok("server", "info", server=server)
    assert "version: " in table and "data dir usage: " in table and "memory budget: " in table
    wrong = hw("server", "info", "--format", "yaml", server=server)
    assert wrong.returncode == 2 and "--format for server info must be" in wrong.stderr


async def produce_at(client: headwater.Client, topic: str, timestamps: list[int]) -> None:
    """One batch per record, each with its own timestamp (the producer stamps 'now')."""
    for number, timestamp in enumerate(timestamps):
        batch = build_batch([(None, f"m{number}".encode(), ())], timestamp=timestamp)
        await client.request(m.ProduceRequest(topic, 0, batch))


async def test_reset_to_a_timestamp_uses_each_segments_index(fresh_server: ServerProcess) -> None:
    """Across many segments, local and archived (uploaded, then deleted locally by retention),
    with timestamps out of order: the answer is the first batch at or after the time."""
    base = 1_700_000_000_000
    stamps = [base + i * 1000 for i in range(120)]
    stamps[10] = base + 45_000  # a late clock: every time up to it is first reached at offset 10
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("timed", configs={"segment.bytes": 1024, "retention.bytes": 2048})
        await produce_at(client, "timed", stamps)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # sealed segments uploaded, then deleted locally
            (storage,) = (await client.describe_topic("timed")).partitions
            if storage.local_start_offset >= 60:
                break
            await asyncio.sleep(0.2)
        assert storage.local_start_offset >= 60 and storage.start_offset == 0, storage
        await client.subscribe("timed", "s", start="earliest", prefetch=1)
        expected = {
            base - 1: 0,
            base + 5_000: 5,
            base + 30_500: 10,  # record 10's time is later than this
            base + 45_000: 10,
            base + 45_001: 46,
            base + 80_500: 81,
            base + 110_500: 111,
            base + 119_000: 119,
            base + 119_001: 120,  # after everything: the end
        }
        for when, offset in expected.items():
            moved = await client.reset_subscription("timed", "s", timestamp=when)
            assert moved.partitions[0].committed == offset, (when, offset)


def test_admin_commands_follow_the_grants(tmp_path: Path) -> None:
    """With tokens: alter needs `admin` on the topic; listing a topic's subscriptions `consume`;
    the listing of every topic's shows only the topics the principal has a grant on."""
    with secure_server(tmp_path) as secure:
        server = secure.process
        admin = ("--token", secure.admin)
        for name in ("mine", "theirs"):
            ok("topic", "create", name, *admin, server=server)
            ok("consume", name, "-s", f"{name}-sub", "--from", "earliest", "--timeout", "0.5",
               *admin, server=server)  # fmt: skip
        reader = ("--token", secure.token("reader", "consume:mine"))
        refused("topic", "alter", "mine", "--config", "retention.ms=1", *reader, server=server,
                says="NOT_AUTHORIZED")  # fmt: skip
        refused("subscription", "list", "theirs", *reader, server=server, says="NOT_AUTHORIZED")
        listed = as_json("subscription", "list", *reader, server=server)
        assert [(s["topic"], s["name"]) for s in listed] == [("mine", "mine-sub")]
        assert len(as_json("subscription", "list", *admin, server=server)) == 2
        # server-wide counts and the data directory: admin on every topic (`admin:*`) only
        refused("server", "info", *reader, server=server, says="NOT_AUTHORIZED")
        assert as_json("server", "info", *admin, server=server)["topics"] == 2
        altered = as_json("topic", "alter", "mine", "--config", "retention.ms=1000", *admin,
                          server=server)  # fmt: skip
        assert altered["configs"]["retention.ms"] == "1000"


async def test_altered_fsync_policy_applies_at_once(tmp_path: Path) -> None:
    """`fsync` changed on a live topic moves its WAL at once: never -> interval starts the
    interval fsyncs (the syncer reads its policy each round), -> always fsyncs every append."""
    process, http_port = start_with_http(tmp_path)
    try:
        async with await headwater.connect(process.address) as client:
            await client.create_topic("policy", configs={"fsync": "never"})
            producer = client.producer("policy")

            async def produce(count: int) -> float:
                before = value(scrape(http_port), "headwater_wal_fsyncs_total")
                for number in range(count):
                    await (await producer.send(f"m{number}".encode()))
                return value(scrape(http_port), "headwater_wal_fsyncs_total") - before

            assert await produce(20) < 10  # never: no fsync per append
            await client.alter_topic("policy", {"fsync": "interval", "fsync.interval.ms": 20})
            # twice: the first fsync may be the one the alter itself starts
            for text in (b"one", b"two"):
                before = value(scrape(http_port), "headwater_wal_fsyncs_total")
                await (await producer.send(text))
                deadline = time.monotonic() + 10
                while value(scrape(http_port), "headwater_wal_fsyncs_total") == before:
                    assert time.monotonic() < deadline, f"no interval fsync after {text!r}"
                    await asyncio.sleep(0.05)
            await client.alter_topic("policy", {"fsync": "always"})
            assert await produce(20) >= 20  # always: each awaited append waits for its fsync
    finally:
        process.kill()


async def test_a_flood_of_server_info_does_not_stall_other_clients_fsyncs(
    fresh_server: ServerProcess,
) -> None:
    """Thousands of SERVER_INFO pipelined on one connection: the data-dir walk is shared, so the
    worker threads stay free for everyone's fsyncs (before: each request walked in a worker
    thread of its own, and another client's fsync=always produce waited over 30 s)."""
    from tests.support.rawwire import RawPeer

    async with await headwater.connect(fresh_server.address) as client:
        slots = asyncio.Semaphore(64)

        async def create(index: int) -> None:
            async with slots:
                await client.create_topic(f"many-{index}", partitions=4)

        await asyncio.gather(*(create(i) for i in range(400)))  # a data dir worth walking
        await client.create_topic("synced", configs={"fsync": "always"})
        producer = client.producer("synced", linger=0.0)

        async def acked() -> float:
            began = time.monotonic()
            await asyncio.wait_for(await producer.send(b"x"), 120)
            return time.monotonic() - began

        # the same sends without the flood, just before it: this machine's fsync right now
        alone = max([await acked() for _ in range(10)])
        peer = await RawPeer.open(fresh_server.address)
        flood = 3000
        for _ in range(flood):
            await peer.request(m.ServerInfoRequest())
        # before the fix one waited over 30 s behind the flood's walks (the producer gave up and
        # the connection closed), against tens of milliseconds alone; on a machine loaded by
        # other suites the flood's own handling takes seconds too, hence a floor of 25 s and a
        # bound relative to this machine's fsync now
        bound = max(25.0, 10 * alone)
        during = [await acked() for _ in range(10)]
        assert max(during) < bound, f"acks took {during} s during the flood, {alone} s before"
        answers = [await peer.response(timeout=60) for _ in range(flood)]
        assert all(isinstance(a, m.ServerInfoResponse) for a in answers)
        assert answers[-1].topic_count == 401  # type: ignore[union-attr]
        await peer.close()
        await producer.close()
