"""The compatibility rules and schema parsing of server/schemas/schema_rules.py, as tables of cases:
for each evolution (old -> new), whether each mode accepts it (docs/SCHEMAS.md states the rules)."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pytest

from headwater.server.schemas.schema_rules import (
    MAX_NESTING,
    MAX_SCHEMA_SIZE,
    compatibility_problems,
    parse_schema,
)
from headwater.wire.errors import InvalidSchema

MODES = ("none", "backward", "forward", "full")


def obj(properties: dict[str, Any], required: tuple[str, ...] = (), closed: bool = False) -> Any:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


INT = {"type": "integer"}
STR = {"type": "string"}

# (case, old, new, backward, forward): full is both, none always accepts
JSON_CASES = [
    ("identical", obj({"a": INT}, ("a",)), obj({"a": INT}, ("a",)), True, True),
    (
        "add optional property, old closed",
        obj({"a": INT}, closed=True),
        obj({"a": INT, "b": STR}, closed=True),
        True,
        False,
    ),
    (
        "add optional property, old open",
        obj({"a": INT}),
        obj({"a": INT, "b": STR}),
        False,
        True,
    ),
    ("add required property", obj({"a": INT}), obj({"a": INT, "b": STR}, ("b",)), False, True),
    ("remove required", obj({"a": INT}, ("a",)), obj({"a": INT}), True, False),
    (
        "remove property, new open",
        obj({"a": INT, "b": STR}, closed=True),
        obj({"a": INT}),
        True,
        False,
    ),
    ("widen integer to number", {"type": "integer"}, {"type": "number"}, True, False),
    ("add a type", {"type": "string"}, {"type": ["string", "null"]}, True, False),
    ("tighter maximum", {"type": "integer"}, {"type": "integer", "maximum": 10}, False, True),
    (
        "looser minLength",
        {"type": "string", "minLength": 3},
        {"type": "string", "minLength": 1},
        True,
        False,
    ),
    ("enum gains a value", {"enum": ["a", "b"]}, {"enum": ["a", "b", "c"]}, True, False),
    (
        "large enums are not compared",
        {"enum": list(range(1001))},
        {"enum": list(range(1002))},
        False,
        False,
    ),
    (
        "nested property type widens",
        obj({"o": obj({"x": INT})}),
        obj({"o": obj({"x": {"type": "number"}})}),
        True,
        False,
    ),
    ("array items widen", {"type": "array", "items": INT}, {"type": "array"}, True, False),
    (
        "unsupported keyword differs",
        {"anyOf": [STR]},
        {"anyOf": [STR, INT]},
        False,
        False,
    ),
    ("unsupported keyword identical", {"anyOf": [STR, INT]}, {"anyOf": [STR, INT]}, True, True),
    ("any JSON to an object schema", None, {"type": "object"}, False, True),
    (
        "title only changes",
        {"type": "string", "title": "x"},
        {"type": "string", "title": "y"},
        True,
        True,
    ),
]


def json_schema(document: Any) -> Any:
    return parse_schema("json", b"" if document is None else json.dumps(document).encode())


@pytest.mark.parametrize(
    ("case", "old", "new", "backward", "forward"), JSON_CASES, ids=[c[0] for c in JSON_CASES]
)
def test_json_schema_compatibility(
    case: str, old: Any, new: Any, backward: bool, forward: bool
) -> None:
    expected = {
        "none": True,
        "backward": backward,
        "forward": forward,
        "full": backward and forward,
    }
    before, after = json_schema(old), json_schema(new)
    got = {mode: not compatibility_problems(mode, before, after) for mode in MODES}
    assert got == expected, {m: compatibility_problems(m, before, after) for m in MODES}


def record(*fields: dict[str, Any], name: str = "Order") -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields)}


ID = {"name": "id", "type": "int"}
AVRO_CASES = [
    ("identical", record(ID), record(ID), True, True),
    (
        "add field with default",
        record(ID),
        record(ID, {"name": "note", "type": "string", "default": ""}),
        True,
        True,
    ),
    (
        "add field without default",
        record(ID),
        record(ID, {"name": "note", "type": "string"}),
        False,
        True,
    ),
    (
        "remove field without default",
        record(ID, {"name": "note", "type": "string"}),
        record(ID),
        True,
        False,
    ),
    ("promote int to long", record(ID), record({"name": "id", "type": "long"}), True, False),
    ("rename the record", record(ID), record(ID, name="Other"), False, False),
    (
        "enum gains a symbol",
        record({"name": "s", "type": {"type": "enum", "name": "S", "symbols": ["A"]}}),
        record({"name": "s", "type": {"type": "enum", "name": "S", "symbols": ["A", "B"]}}),
        True,
        False,
    ),
    (
        "field becomes nullable",
        record(ID),
        record({"name": "id", "type": ["null", "int"], "default": None}),
        True,
        False,
    ),
]


@pytest.mark.parametrize(
    ("case", "old", "new", "backward", "forward"), AVRO_CASES, ids=[c[0] for c in AVRO_CASES]
)
def test_avro_compatibility(case: str, old: Any, new: Any, backward: bool, forward: bool) -> None:
    expected = {
        "none": True,
        "backward": backward,
        "forward": forward,
        "full": backward and forward,
    }
    before = parse_schema("avro", json.dumps(old).encode())
    after = parse_schema("avro", json.dumps(new).encode())
    got = {mode: not compatibility_problems(mode, before, after) for mode in MODES}
    assert got == expected, {m: compatibility_problems(m, before, after) for m in MODES}


@pytest.mark.parametrize("mode", MODES)
def test_a_type_change_is_only_allowed_by_mode_none(mode: str) -> None:
    problems = compatibility_problems(mode, parse_schema("string", b""), parse_schema("json", b""))
    assert (not problems) == (mode == "none")
    if problems:
        assert "type changes from string to json" in problems[0]


def test_a_refusal_says_which_direction_and_where() -> None:
    problems = compatibility_problems(
        "full", json_schema(obj({"a": INT})), json_schema(obj({"a": INT, "b": STR}, ("b",)))
    )
    assert any(p.startswith("backward (new reads old): /: property 'b'") for p in problems)


AVRO_ORDER = record(ID, {"name": "items", "type": {"type": "array", "items": "string"}})


def avro_bytes(schema: dict[str, Any], value: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


VALUE_CASES = [
    ("string", b"", "h\xc3\xa9llo".encode("latin-1"), b"\xff\xfe", "not valid UTF-8"),
    ("int64", b"", (5).to_bytes(8, "big"), b"\x00" * 7, "an int64 is 8"),
    ("json", b"", b'{"a": [1, 2]}', b'{"a": ', "not valid JSON"),
    ("json", b"", b"[1]", b"[NaN]", "NaN is not JSON"),
    ("json", json.dumps(obj({"a": INT}, ("a",))).encode(), b'{"a": 1}', b'{"a": "x"}', "at /a"),
    ("json", b"", b"1", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (
        "avro",
        json.dumps(AVRO_ORDER).encode(),
        avro_bytes(AVRO_ORDER, {"id": 1, "items": ["pen"]}),
        avro_bytes(AVRO_ORDER, {"id": 1, "items": ["pen"]}) + b"\x00",
        "1 bytes left",
    ),
    (
        "avro",
        json.dumps(AVRO_ORDER).encode(),
        avro_bytes(AVRO_ORDER, {"id": 1, "items": []}),
        b"\x02\xfe\xff\xff\xff\xff\xff\xff\xff\x7f",  # a string of 2^62 bytes in 10 bytes
        "not Avro binary",
    ),
]


@pytest.mark.parametrize(("kind", "definition", "good", "bad", "why"), VALUE_CASES)
def test_value_checks(kind: str, definition: bytes, good: bytes, bad: bytes, why: str) -> None:
    schema = parse_schema(kind, definition)
    assert schema.check(good) is None
    problem = schema.check(bad)
    assert problem is not None and why in problem


RECURSIVE = record({"name": "next", "type": ["null", "Order"]})

INVALID = [
    # a value could nest one level per byte: fastavro's C reader crashed the process at 100,000
    ("avro", json.dumps(RECURSIVE).encode(), "contains itself"),
    ("xml", b"", "unknown schema type 'xml'"),
    ("string", b"{}", "takes no definition"),
    ("json", b"{not json", "not valid JSON"),
    ("json", b'{"type": 5}', "not a valid JSON Schema at /type"),
    ("json", b"[1]", "an object or a boolean"),
    ("json", b'{"$ref": "https://example.com/s.json"}', "is not local"),
    ("json", b"\xff\xfe{}", "not UTF-8"),
    ("json", b'{"$ref": "#/$defs/missing"}', "does not resolve"),
    ("json", b'{"a":' * (MAX_NESTING + 1) + b"1" + b"}" * (MAX_NESTING + 1), "nests deeper"),
    ("json", b"[" * 100_000 + b"]" * 100_000, "nests deeper"),
    ("json", b" " * (MAX_SCHEMA_SIZE + 1), "exceeds the 524288-byte limit"),
    ("avro", b'{"type": "int"}', "is a record"),
    (
        "avro",
        b'{"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]}',
        "not a valid Avro schema",
    ),
    (
        "avro",
        json.dumps(record({"name": "a", "type": {"type": "array", "items": "null"}})).encode(),
        "zero bytes",
    ),
    (
        "avro",
        json.dumps(
            record({"name": "a", "type": {"type": "array", "items": record(name="Empty")}})
        ).encode(),
        "zero bytes",
    ),
]


@pytest.mark.parametrize(("kind", "definition", "why"), INVALID, ids=[w for _, _, w in INVALID])
def test_invalid_definitions_are_refused_with_the_reason(
    kind: str, definition: bytes, why: str
) -> None:
    with pytest.raises(InvalidSchema) as raised:
        parse_schema(kind, definition)
    assert why in raised.value.message
