"""Topic schemas end to end: over the wire against a real server (docs/SCHEMAS.md)."""

from __future__ import annotations

import asyncio
import io
import json
import struct
from pathlib import Path
from typing import Any

import fastavro
import pytest

import headwater
from headwater.testing import ServerProcess
from headwater.wire import frames
from headwater.wire import messages as m
from headwater.wire.errors import ErrorCode
from headwater.wire.protocol import (
    REQUEST_API_KEYS,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from headwater.wire.records import Compression, build_batch
from tests.support.cli_process import hw
from tests.support.secure import secure_server

HEADER = m.SCHEMA_VERSION_HEADER
ORDER = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "int"}, {"name": "item", "type": "string"}],
}
ORDER_V2 = {
    "type": "record",
    "name": "Order",
    "fields": [*ORDER["fields"], {"name": "quantity", "type": "int", "default": 1}],
}
POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
    "required": ["x"],
    "additionalProperties": False,
}


def avro(schema: dict[str, Any], value: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


def v(version: int) -> list[tuple[str, bytes]]:
    return [(HEADER, str(version).encode())]


async def produce_raw(
    client: headwater.Client,
    topic: str,
    records: list[tuple[bytes | None, list[tuple[str, bytes]]]],
    compression: Compression = Compression.NONE,
) -> m.Response:
    batch = build_batch([(None, value, h) for value, h in records], compression=compression)
    return await client.request(m.ProduceRequest(topic, 0, batch))


async def next_offset(client: headwater.Client, topic: str) -> int:
    return (await client.describe_topic(topic)).next_offsets[0]


# (type, definition, good values, a bad value)
WIRE_CASES = [
    ("string", None, [b"hello", "h\u00e9llo \u6f22".encode()], b"caf\xe9"),
    ("int64", None, [struct.pack(">q", -5), struct.pack(">q", 2**62)], b"\x00\x01"),
    ("json", None, [b'{"a": 1}', b"[1, 2]", b'"text"', b"null"], b'{"a": 1'),
    ("json", POINT, [b'{"x": 1}', b'{"x": 1, "y": 2}'], b'{"x": 1, "z": 3}'),
    ("avro", ORDER, [avro(ORDER, {"id": 1, "item": "pen"})], b"\x02\x08pe"),
]


@pytest.mark.parametrize(
    ("kind", "definition", "good", "bad"),
    WIRE_CASES,
    ids=[f"{c[0]}-{i}" for i, c in enumerate(WIRE_CASES)],
)
@pytest.mark.parametrize("dispatch", ["non-reliable", "reliable"])
async def test_each_schema_accepts_good_values_and_refuses_a_batch_with_a_bad_one(
    client: headwater.Client,
    topic_name: str,
    kind: str,
    definition: Any,
    good: list[bytes],
    bad: bytes,
    dispatch: str,
) -> None:
    await client.create_topic(
        topic_name, dispatch=dispatch, schema=kind, schema_definition=definition
    )  # type: ignore[arg-type]
    records = [(value, v(1)) for value in good]
    await produce_raw(client, topic_name, records)
    assert await next_offset(client, topic_name) == len(good)
    bad_batch = [*records, (bad, v(1)), *records]
    with pytest.raises(headwater.SchemaViolation) as refused:
        await produce_raw(client, topic_name, bad_batch)
    assert refused.value.code == ErrorCode.SCHEMA_VIOLATION
    assert refused.value.record_index == len(good)
    assert refused.value.message.startswith(f"record {len(good)}: ")
    assert f"schema version 1, {kind}" in refused.value.message
    assert await next_offset(client, topic_name) == len(good)  # nothing of it was appended


async def test_a_record_must_name_a_registered_version(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, schema="string")
    with pytest.raises(headwater.SchemaViolation, match=f"record 1: no {HEADER} header"):
        await produce_raw(client, topic_name, [(b"a", v(1)), (b"b", [])])
    for version in (b"2", b"0", b"x", b"99999999999"):
        with pytest.raises(headwater.SchemaViolation, match=r"record 0: .* is not a registered"):
            await produce_raw(client, topic_name, [(b"a", [(HEADER, version)])])
    # a tombstone has no value to check
    await produce_raw(client, topic_name, [(None, []), (b"ok", v(1))])
    assert await next_offset(client, topic_name) == 2


async def test_compressed_batches_are_checked(client: headwater.Client, topic_name: str) -> None:
    await client.create_topic(topic_name, schema="json")
    with pytest.raises(headwater.SchemaViolation, match="record 2: "):
        await produce_raw(client, topic_name, [(b"1", v(1))] * 2 + [(b"{", v(1))], Compression.GZIP)
    await produce_raw(client, topic_name, [(b"1", v(1))] * 3, Compression.ZSTD)
    assert await next_offset(client, topic_name) == 3


async def test_topics_without_a_schema_or_with_bytes_take_anything(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name)
    await client.create_topic(topic_name + "-bytes", schema="bytes")
    for name in (topic_name, topic_name + "-bytes"):
        await produce_raw(client, name, [(b"\xff\x00", []), (b"x", v(7))])
        assert await next_offset(client, name) == 2
    bare = (await client.get_schema(topic_name)).schema
    assert (bare.version, bare.schema_type) == (0, "bytes")
    assert (await client.get_schema(topic_name + "-bytes")).schema.version == 1


async def test_the_schema_version_reaches_consumers_and_values_decode_by_it(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(
        topic_name, dispatch="reliable", schema="avro", schema_definition=ORDER
    )
    consumer = await client.subscribe(topic_name, "audit", start="earliest")
    old = client.producer(topic_name, schema="auto")
    await (await old.send({"id": 1, "item": "pen"}))
    assert await client.register_schema(topic_name, "avro", ORDER_V2) == 2
    pinned = client.producer(topic_name, schema=1)
    latest = client.producer(topic_name, schema="auto")
    await (await pinned.send({"id": 2, "item": "ink"}))
    await (await latest.send({"id": 3, "item": "pad", "quantity": 4}))
    await (await old.send({"id": 4, "item": "pen"}))  # "auto" was resolved at its first send
    received = [await consumer.receive(timeout=30) for _ in range(4)]
    assert [message.schema_version for message in received] == [1, 1, 2, 1]
    assert [await message.decoded() for message in received] == [
        {"id": 1, "item": "pen"},
        {"id": 2, "item": "ink"},
        {"id": 3, "item": "pad", "quantity": 4},
        {"id": 4, "item": "pen"},
    ]
    with pytest.raises(headwater.SchemaViolation, match="cannot encode"):
        await latest.send({"id": "not a number", "item": "x"})
    for producer in (old, pinned, latest):
        await producer.close()
    await consumer.close()


@pytest.mark.parametrize(
    ("kind", "value"), [("string", "h\u00e9llo"), ("int64", -(2**63)), ("json", {"a": [1, None]})]
)
async def test_the_client_encodes_and_decodes_each_type(
    client: headwater.Client, topic_name: str, kind: str, value: Any
) -> None:
    await client.create_topic(topic_name, dispatch="reliable", schema=kind)
    consumer = await client.subscribe(topic_name, "s", start="earliest")
    async with client.producer(topic_name, schema="auto") as producer:
        await (await producer.send(value))
    message = await consumer.receive(timeout=30)
    assert message.schema_version == 1
    assert await message.decoded() == value
    await consumer.close()


async def test_send_batch_encodes_by_the_schema_and_versions_every_record(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, dispatch="reliable", schema="json")
    consumer = await client.subscribe(topic_name, "s", start="earliest")
    values = [{"n": i} for i in range(5)]
    async with client.producer(topic_name, schema="auto") as producer:
        await (await producer.send_batch(values, headers=[{"trace": b"t"}] * 5))
        with pytest.raises(headwater.SchemaViolation, match="cannot encode"):
            await producer.send_batch([{"n": 1}, {1, 2}])  # a set is no JSON value
    received = [await consumer.receive(timeout=30) for _ in range(5)]
    assert [message.schema_version for message in received] == [1] * 5
    assert [await message.decoded() for message in received] == values
    assert all(message.headers[0] == ("trace", b"t") for message in received)
    await consumer.close()


async def test_compatibility_modes_over_the_wire(client: headwater.Client, topic_name: str) -> None:
    await client.create_topic(topic_name, schema="avro", schema_definition=ORDER)
    assert (await client.get_schema(topic_name)).compatibility == "backward"
    needs_quantity = {**ORDER, "fields": [*ORDER["fields"], {"name": "quantity", "type": "int"}]}
    checked = await client.check_schema(topic_name, "avro", needs_quantity)
    assert not checked.compatible and "reader_field_missing_default_value" in checked.reasons[0]
    with pytest.raises(headwater.IncompatibleSchema, match="not backward-compatible"):
        await client.register_schema(topic_name, "avro", needs_quantity)
    assert (
        await client.check_schema(topic_name, "avro", needs_quantity, compatibility="forward")
    ).compatible
    assert await client.register_schema(topic_name, "avro", ORDER_V2) == 2
    # an identical schema answers its version; nothing new is registered
    assert await client.register_schema(topic_name, "avro", json.dumps(ORDER, indent=4)) == 1
    assert (await client.check_schema(topic_name, "avro", ORDER)).existing_version == 1
    with pytest.raises(headwater.IncompatibleSchema, match="type changes from avro to json"):
        await client.register_schema(topic_name, "json", None, compatibility="full")
    assert (await client.list_schemas(topic_name)).compatibility == "backward"  # not changed
    assert await client.register_schema(topic_name, "json", None, compatibility="none") == 3
    listing = await client.list_schemas(topic_name)
    assert listing.compatibility == "none"
    assert [(s.version, s.schema_type) for s in listing.versions] == [
        (1, "avro"),
        (2, "avro"),
        (3, "json"),
    ]
    assert (await client.get_schema(topic_name, 2)).schema.definition == json.dumps(
        ORDER_V2
    ).encode()


async def test_the_registry_survives_kill_9_and_goes_with_its_topic(
    fresh_server: ServerProcess,
) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic(
            "orders",
            dispatch="reliable",
            schema="json",
            schema_definition=POINT,
            compatibility="full",
        )
        widened = {
            **POINT,
            "properties": {**POINT["properties"], "x": {"type": "integer", "title": "x"}},
        }
        assert await client.register_schema("orders", "json", widened) == 2
        await client.create_topic("plain", schema="string")
    fresh_server.kill()
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        listing = await client.list_schemas("orders")
        assert (listing.compatibility, len(listing.versions)) == ("full", 2)
        assert json.loads((await client.get_schema("orders")).schema.definition) == widened
        with pytest.raises(headwater.SchemaViolation, match=r"record 0: .* at /x"):
            await produce_raw(client, "orders", [(b'{"x": "1"}', v(2))])
        await produce_raw(client, "orders", [(b'{"x": 1}', v(2))])
        await client.delete_topic("orders")
        with pytest.raises(headwater.UnknownTopic):
            await client.get_schema("orders")
        with pytest.raises(headwater.UnknownTopic):
            await client.register_schema("orders", "string")
        await client.create_topic("orders", dispatch="reliable")
        assert (await client.get_schema("orders")).schema.version == 0
    fresh_server.stop()
    fresh_server.start()
    async with await headwater.connect(fresh_server.address) as client:
        assert (await client.list_schemas("orders")).versions == ()
        await produce_raw(client, "orders", [(b"anything", [])])
        assert (await client.get_schema("plain")).schema.schema_type == "string"


async def test_hostile_schema_requests_get_precise_errors(
    client: headwater.Client, topic_name: str
) -> None:
    with pytest.raises(headwater.UnknownTopic):
        await client.register_schema(topic_name, "string")
    with pytest.raises(headwater.InvalidSchema, match="not valid JSON"):
        await client.create_topic(topic_name, schema="json", schema_definition="{oops")
    assert topic_name not in {t.name for t in await client.list_topics()}  # nothing half-made
    with pytest.raises(headwater.InvalidRequest, match=r"unknown config 'schema\.colour'"):
        await client.create_topic(topic_name, configs={"schema.colour": "red"})
    await client.create_topic(topic_name, schema="json")
    with pytest.raises(headwater.InvalidSchema, match="unknown schema type"):
        await client.register_schema(topic_name, "protobuf", "message M {}")
    with pytest.raises(headwater.InvalidRequest, match="unknown compatibility mode"):
        await client.register_schema(topic_name, "json", None, compatibility="sideways")
    huge = {"type": "object", "description": "x" * (1024 * 1024)}
    with pytest.raises(headwater.InvalidSchema, match="exceeds the 524288-byte limit"):
        await client.register_schema(topic_name, "json", huge)
    with pytest.raises(headwater.InvalidSchema, match="not a valid Avro schema"):
        await client.check_schema(topic_name, "avro", '{"type": "record", "name": "R"}')
    linked_list = {**ORDER, "fields": [{"name": "next", "type": ["null", "Order"]}]}
    with pytest.raises(headwater.InvalidSchema, match="contains itself"):
        await client.register_schema(topic_name, "avro", linked_list, compatibility="none")
    nested = b"[" * 200_000 + b"]" * 200_000
    with pytest.raises(headwater.SchemaViolation, match="record 0: value is not valid JSON"):
        await produce_raw(client, topic_name, [(nested, v(1))])
    with pytest.raises(headwater.UnknownSchema, match="no schema version 5"):
        await client.get_schema(topic_name, 5)
    assert (await client.get_schema(topic_name)).schema.version == 1  # still answering


async def test_racing_registrations_on_two_connections(
    server: ServerProcess, topic_name: str
) -> None:
    first = await headwater.connect(server.address)
    second = await headwater.connect(server.address)
    try:
        await first.create_topic(topic_name, schema="json", compatibility="none")
        same = {"type": "object", "title": "same"}
        versions = await asyncio.gather(
            *(
                c.register_schema(topic_name, "json", same)
                for c in (first, second)
                for _ in range(5)
            )
        )
        assert set(versions) == {2}  # one registration, the others found it
        titles = [{"type": "object", "title": f"t{i}"} for i in range(20)]
        versions = await asyncio.gather(
            *(
                c.register_schema(topic_name, "json", t)
                for t, c in zip(titles, [first, second] * 10, strict=True)
            )
        )
        assert sorted(versions) == list(range(3, 23))  # no version given twice
        listing = await first.list_schemas(topic_name)
        assert [s.version for s in listing.versions] == list(range(1, 23))
    finally:
        await first.close()
        await second.close()


@pytest.mark.timeout(300)
async def test_ten_thousand_versions_stop_at_the_limit(
    client: headwater.Client, topic_name: str
) -> None:
    await client.create_topic(topic_name, schema="json", compatibility="none")
    limit = 1000

    async def register(i: int) -> int | str:
        try:
            return await client.register_schema(
                topic_name, "json", {"title": f"v{i}"}, compatibility="none"
            )
        except headwater.InvalidSchema as exc:
            return exc.message

    results: list[int | str] = []
    for start in range(0, 10_000, 1000):
        results += await asyncio.gather(*(register(i) for i in range(start, start + 1000)))
    assert sorted(r for r in results if isinstance(r, int)) == list(range(2, limit + 1))
    refusals = [r for r in results if isinstance(r, str)]
    assert len(refusals) == 10_000 - (limit - 1)
    assert all(f"has {limit} schema versions" in r for r in refusals)
    assert len((await client.list_schemas(topic_name)).versions) == limit
    index, version = next((i, r) for i, r in enumerate(results) if isinstance(r, int))
    assert await register(index) == version  # an identical schema is still answered


def test_the_command_line(server: ServerProcess, topic_name: str, tmp_path: Path) -> None:
    order, order_v2, needs_quantity = (tmp_path / f"{n}.avsc" for n in ("v1", "v2", "bad"))
    order.write_text(json.dumps(ORDER))
    order_v2.write_text(json.dumps(ORDER_V2))
    required = {"name": "quantity", "type": "int"}
    needs_quantity.write_text(json.dumps({**ORDER, "fields": [*ORDER["fields"], required]}))
    created = hw(
        "topic", "create", topic_name, "--schema", "avro", "--schema-file", str(order),
        "--compatibility", "full", server=server,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    got = json.loads(hw("schema", "get", topic_name, "--format", "json", server=server).stdout)
    assert (got["version"], got["type"], got["compatibility"]) == (1, "avro", "full")
    assert json.loads(got["definition"]) == ORDER
    check = ["schema", "check", topic_name, "--type", "avro", "--schema-file"]
    refused = hw(*check, str(needs_quantity), server=server)
    assert refused.returncode == 1 and "not compatible:" in refused.stdout
    assert "reader_field_missing_default_value" in refused.stdout
    assert hw(*check, str(order_v2), server=server).stdout.strip() == "compatible"
    register = ["schema", "register", topic_name, "--type", "avro", "--schema-file"]
    failed = hw(*register, str(needs_quantity), server=server)
    assert failed.returncode == 1 and "INCOMPATIBLE_SCHEMA" in failed.stderr
    registered = hw(*register, str(order_v2), server=server)
    assert registered.stdout.strip() == f"registered version 2 of {topic_name}"
    again = hw(*register, "-", "--format", "json", server=server, stdin=json.dumps(ORDER))
    assert json.loads(again.stdout) == {"version": 1, "created": False}
    listed = json.loads(hw("schema", "list", topic_name, "--format", "json", server=server).stdout)
    assert [(s["version"], s["type"]) for s in listed["versions"]] == [(1, "avro"), (2, "avro")]
    table = hw("schema", "list", topic_name, server=server).stdout.splitlines()
    assert table[0] == "compatibility: full" and table[1].split() == [
        "VERSION",
        "TYPE",
        "REGISTERED_MS",
    ]
    # produce reads each line as the schema says; consume prints the value decoded
    produced = hw("produce", topic_name, '{"id": 7, "item": "pen"}', server=server)
    assert produced.returncode == 0, produced.stderr
    bad = hw("produce", topic_name, '{"id": "seven"}', server=server)
    assert bad.returncode == 1 and "SCHEMA_VIOLATION" in bad.stderr
    consumed = hw(
        "consume", topic_name, "-s", "cli", "--from", "earliest", "-n", "1", "--print", "headers",
        server=server,
    )  # fmt: skip
    assert consumed.stdout.strip() == (
        f'headers={HEADER}:2\t{{"id": 7, "item": "pen", "quantity": 1}}'
    ), consumed.stderr
    numbers = f"{topic_name}-n"
    assert hw("topic", "create", numbers, "--schema", "int64", server=server).returncode == 0
    assert hw("produce", numbers, "42", "-7", server=server).returncode == 0
    not_a_number = hw("produce", numbers, "4.5", server=server)
    assert not_a_number.returncode == 1 and "not an integer" in not_a_number.stderr
    values = hw("consume", numbers, "-s", "c", "--from", "earliest", "-n", "2", server=server)
    assert values.stdout.split() == ["42", "-7"]
    raw = hw(
        "consume", numbers, "-s", "r", "--from", "earliest", "-n", "1", "--raw", "--format",
        "json", server=server,
    )  # fmt: skip
    assert json.loads(raw.stdout)["value"] == "\u0000" * 7 + "*"  # 42 as 8 bytes big-endian
    missing = hw("topic", "create", f"{topic_name}-x", "--schema-file", str(order), server=server)
    assert missing.returncode == 1 and "--schema-file needs --schema" in missing.stderr


SCHEMA_MESSAGES: list[tuple[m.Request, m.Response]] = [
    (
        m.RegisterSchemaRequest("t", "avro", b'{"type": "record"}', "full"),
        m.RegisterSchemaResponse(3, True),
    ),
    (
        m.GetSchemaRequest("t", m.LATEST_SCHEMA),
        m.GetSchemaResponse(m.SchemaInfo("t", 2, "json", b"{}", 17), "backward"),
    ),
    (
        m.ListSchemasRequest("t\u00e9"),
        m.ListSchemasResponse("none", (m.SchemaInfo("t", 1, "string", b"", 1),) * 3),
    ),
    (
        m.CheckSchemaRequest("t", "json", b"", ""),
        m.CheckSchemaResponse(False, 0, ("backward (new reads old): /: why", "\u00e9")),
    ),
]


@pytest.mark.parametrize(("request_", "response"), SCHEMA_MESSAGES)
def test_schema_messages_round_trip(request_: m.Request, response: m.Response) -> None:
    frame = encode_request(request_, 9)
    header = frames.FrameHeader(*frames.HEADER.unpack_from(frame, frames.SIZE.size))
    assert header.api_key == REQUEST_API_KEYS[type(request_)]
    assert decode_request(header, frame[frames.SIZE.size + frames.HEADER_SIZE :]) == request_
    encoded = encode_response(header.api_key, 9, response)
    assert decode_response(header, encoded[frames.SIZE.size + frames.HEADER_SIZE :]) == response


async def test_reading_schemas_takes_any_grant_and_registering_admin(tmp_path: Path) -> None:
    with secure_server(tmp_path) as secure:
        async with await headwater.connect(secure.address, token=secure.admin) as admin:
            await admin.create_topic("orders", schema="string")
        producer_only = secure.token("app", "produce:orders")
        stranger = secure.token("other", "all:elsewhere")
        async with await headwater.connect(secure.address, token=producer_only) as app:
            assert (await app.get_schema("orders")).schema.schema_type == "string"
            async with app.producer("orders", schema="auto") as producer:
                assert (await (await producer.send("hello"))).offset == 0
            with pytest.raises(headwater.NotAuthorized, match="may not admin"):
                await app.register_schema("orders", "string")
        async with await headwater.connect(secure.address, token=stranger) as other:
            with pytest.raises(headwater.NotAuthorized, match="no grant on topic 'orders'"):
                await other.list_schemas("orders")
