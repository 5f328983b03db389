"""Schema definitions: parsing them, checking a record's value, and the compatibility rules.

`parse_schema` turns a type name and a definition into a `ParsedSchema` or raises InvalidSchema
with the reason: `bytes`, `string` and `int64` take no definition; `json` takes a JSON Schema
(empty: any JSON value), checked against its metaschema by jsonschema, with local `$ref`s only
(nothing is ever fetched); `avro` takes a record schema, parsed by both fastavro (which reads the
values) and Apache Avro (whose reader/writer checker decides Avro compatibility). An Avro array
whose items encode in zero bytes is refused: a 10-byte value could then claim 2^62 items.

`ParsedSchema.check(value)` answers None for a good value and the reason for a bad one; it is the
only per-record code, and it runs only for topics whose schema is not `bytes`.

`compatibility_problems(mode, old, new)` says why `new` may not follow `old`: backward means the
new schema reads whatever the old one wrote, forward the reverse, full both, none anything
(even a change of type). JSON Schema's rules are in `server.schemas.json_compat`.
"""

from __future__ import annotations

import io
import json
import urllib.parse
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from headwater.server.schemas.json_compat import subset_problems
from headwater.wire import messages as m
from headwater.wire.errors import InvalidSchema

MAX_SCHEMA_SIZE: Final = 512 * 1024  # bytes of definition
MAX_NESTING: Final = 64  # levels of JSON in a definition
MAX_REASON: Final = 300  # characters of a library's message quoted in a refusal

if TYPE_CHECKING:
    import avro.schema

# jsonschema, Apache Avro and fastavro are imported by the functions that use them, when a topic
# first defines a schema of their kind: together they were a quarter of the server's start-up CPU
# (and of every CLI command's), and most servers define no schema.

Check = Callable[[bytes], str | None]


@dataclass(frozen=True, slots=True)
class ParsedSchema:
    schema_type: str
    definition: bytes
    document: Any  # the definition as JSON (True for bytes, string, int64 and bare json)
    check: Check
    avro: avro.schema.Schema | None = None

    def same_as(self, other: ParsedSchema) -> bool:
        return self.schema_type == other.schema_type and self.document == other.document


def parse_schema(schema_type: str, definition: bytes) -> ParsedSchema:
    if schema_type not in m.SCHEMA_TYPES:
        raise InvalidSchema(
            f"unknown schema type {schema_type!r} (one of {', '.join(m.SCHEMA_TYPES)})"
        )
    if len(definition) > MAX_SCHEMA_SIZE:
        raise InvalidSchema(
            f"schema definition of {len(definition)} bytes exceeds the {MAX_SCHEMA_SIZE}-byte limit"
        )
    if schema_type in ("bytes", "string", "int64"):
        if definition.strip():
            raise InvalidSchema(f"schema type {schema_type} takes no definition")
        return ParsedSchema(schema_type, b"", True, _SIMPLE_CHECKS[schema_type])
    if schema_type == "json" and not definition.strip():
        return ParsedSchema("json", b"", True, _check_json_text)
    document = _load_definition(definition)
    if schema_type == "json":
        return _parse_json_schema(definition, document)
    return _parse_avro(definition, document)


def _load_definition(definition: bytes) -> Any:
    try:
        text = definition.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidSchema(f"schema definition is not UTF-8 (byte {exc.start})") from None
    try:
        document = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise InvalidSchema(f"schema definition nests deeper than {MAX_NESTING} levels") from None
    except ValueError as exc:
        raise InvalidSchema(f"schema definition is not valid JSON: {_short(exc)}") from None
    if _depth(document) > MAX_NESTING:
        raise InvalidSchema(f"schema definition nests deeper than {MAX_NESTING} levels")
    return document


def _depth(document: Any) -> int:
    """Nesting depth, without recursion (the document may be hostile)."""
    deepest, stack = 0, [(document, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > MAX_NESTING:
            return deepest
        children = node.values() if isinstance(node, dict) else node
        if isinstance(node, dict | list):
            stack.extend((child, level + 1) for child in children)
    return deepest


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= MAX_REASON else text[:MAX_REASON] + "..."


# Values


def _check_string(value: bytes) -> str | None:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"value is not valid UTF-8 (byte {exc.start})"
    return None


def _check_int64(value: bytes) -> str | None:
    if len(value) != 8:
        return f"value has {len(value)} bytes; an int64 is 8 (big-endian)"
    return None


_SIMPLE_CHECKS: Final[dict[str, Check]] = {
    "bytes": lambda value: None,
    "string": _check_string,
    "int64": _check_int64,
}


def _json_value(value: bytes) -> tuple[Any, str | None]:
    try:
        return json.loads(value, parse_constant=_no_constant), None
    except RecursionError:
        return None, "value is not valid JSON: nested too deeply"
    except ValueError as exc:  # UnicodeDecodeError is one
        return None, f"value is not valid JSON: {_short(exc)}"


def _check_json_text(value: bytes) -> str | None:
    return _json_value(value)[1]


def _parse_json_schema(definition: bytes, document: Any) -> ParsedSchema:
    import jsonschema.exceptions
    import jsonschema.validators

    if not isinstance(document, dict | bool):
        raise InvalidSchema("a JSON Schema is an object or a boolean")
    _refuse_remote_refs(document)
    with warnings.catch_warnings():  # an unknown "$schema" warns, then takes the default draft
        warnings.simplefilter("ignore")
        cls = jsonschema.validators.validator_for(document, default=_draft())
    try:
        cls.check_schema(document)
    except jsonschema.exceptions.SchemaError as exc:
        where = "/" + "/".join(str(p) for p in exc.path)
        raise InvalidSchema(f"not a valid JSON Schema at {where}: {_short(exc.message)}") from None
    except RecursionError:
        raise InvalidSchema("JSON Schema nests too deeply") from None
    validator = cls(document)

    def check(value: bytes) -> str | None:
        parsed, problem = _json_value(value)
        if problem is not None:
            return problem
        try:
            if validator.is_valid(parsed):  # stops at the first error; the reason only on failure
                return None
            error = jsonschema.exceptions.best_match(validator.iter_errors(parsed))
        except RecursionError:
            return "value nests too deeply to validate"
        except Exception as exc:  # a $ref that does not resolve, a bad regex
            return f"value cannot be validated: {_short(exc)}"
        if error is None:
            return None
        where = "/" + "/".join(str(p) for p in error.absolute_path)
        return f"value does not match the JSON Schema at {where}: {_short(error.message)}"

    return ParsedSchema("json", definition, document, check)


def _draft() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator


def _refuse_remote_refs(document: Any) -> None:
    """Only local references, and (where no inner `$id` moves the base) only ones that resolve:
    a dangling one would refuse every produced value instead of the schema."""
    stack, local, inner_ids = [document], [], False
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            inner_ids = inner_ids or (node is not document and "$id" in node)
            for name in ("$ref", "$dynamicRef"):
                target = node.get(name)
                if isinstance(target, str) and not target.startswith("#"):
                    raise InvalidSchema(
                        f"{name} {target[:100]!r} is not local: only '#...' references are "
                        "allowed (the server fetches nothing)"
                    )
                if name == "$ref" and isinstance(target, str) and target.startswith("#/"):
                    local.append(target)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    if not inner_ids:
        for target in local:
            if not _resolves(document, target[2:]):
                raise InvalidSchema(f"$ref {target[:100]!r} does not resolve in the schema")


def _resolves(document: Any, pointer: str) -> bool:
    node = document
    for raw in pointer.split("/"):
        part = urllib.parse.unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def json_rejects(schema: Any, values: list[Any]) -> list[Any]:
    """The values not valid under the (sub)schema, or whose validity cannot be decided."""
    validator = _draft()(schema)
    rejected = []
    for value in values:
        try:
            if validator.is_valid(value):
                continue
        except Exception:
            pass
        rejected.append(value)
    return rejected


# Avro


def _parse_avro(definition: bytes, document: Any) -> ParsedSchema:
    import avro.errors
    import avro.schema
    import fastavro

    if not isinstance(document, dict) or document.get("type") != "record":
        raise InvalidSchema('an avro schema here is a record: {"type": "record", ...}')
    try:
        apache = avro.schema.parse(definition.decode("utf-8"))
    except (avro.errors.AvroException, ValueError, TypeError, KeyError) as exc:
        raise InvalidSchema(f"not a valid Avro schema: {_short(exc)}") from None
    except RecursionError:
        raise InvalidSchema("Avro schema nests too deeply") from None
    try:
        parsed = fastavro.parse_schema(document)
    except Exception as exc:
        raise InvalidSchema(f"not a valid Avro schema: {_short(exc)}") from None
    _refuse_recursion(apache)
    _refuse_empty_items(apache, set())

    def check(value: bytes) -> str | None:
        stream = io.BytesIO(value)
        try:
            fastavro.schemaless_reader(stream, parsed, None)
        except Exception as exc:  # EOFError, UnicodeDecodeError, IndexError, ...
            return f"value is not Avro binary of the schema: {_short(exc)}"
        left = len(value) - stream.tell()
        if left:
            return f"value has {left} bytes left after its Avro record"
        return None

    return ParsedSchema("avro", definition, document, check, apache)


def _children(schema: avro.schema.Schema) -> list[avro.schema.Schema]:
    import avro.schema

    if isinstance(schema, avro.schema.ArraySchema):
        return [schema.items]
    if isinstance(schema, avro.schema.MapSchema):
        return [schema.values]
    if isinstance(schema, avro.schema.UnionSchema):
        return list(schema.schemas)
    if isinstance(schema, avro.schema.RecordSchema):
        return [field.type for field in schema.fields]
    return []


def _refuse_recursion(root: avro.schema.Schema) -> None:
    """A record that contains itself lets a value nest as deep as its bytes allow (one byte a
    level), deeper than fastavro's C reader can recurse without crashing the process."""
    done: set[int] = set()
    on_path: set[int] = set()
    stack: list[tuple[avro.schema.Schema, bool]] = [(root, False)]
    while stack:
        schema, leaving = stack.pop()
        if leaving:
            on_path.discard(id(schema))
            done.add(id(schema))
            continue
        if id(schema) in on_path:
            name = getattr(schema, "fullname", schema.type)
            raise InvalidSchema(
                f"Avro type {name!r} contains itself: recursive schemas are not accepted "
                "(a value could nest without bound)"
            )
        if id(schema) in done:
            continue
        on_path.add(id(schema))
        stack.append((schema, True))
        stack.extend((child, False) for child in _children(schema))


def _refuse_empty_items(schema: avro.schema.Schema, seen: set[int]) -> None:
    import avro.schema

    if id(schema) in seen:
        return
    seen.add(id(schema))
    if isinstance(schema, avro.schema.ArraySchema):
        if _zero_size(schema.items, set()):
            raise InvalidSchema(
                "an Avro array's items must not encode in zero bytes (null, fixed of size 0, "
                "a record of such fields): a short value could claim any number of them"
            )
        _refuse_empty_items(schema.items, seen)
    elif isinstance(schema, avro.schema.MapSchema):
        _refuse_empty_items(schema.values, seen)
    elif isinstance(schema, avro.schema.UnionSchema):
        for branch in schema.schemas:
            _refuse_empty_items(branch, seen)
    elif isinstance(schema, avro.schema.RecordSchema):
        for field in schema.fields:
            _refuse_empty_items(field.type, seen)


def _zero_size(schema: avro.schema.Schema, seen: set[int]) -> bool:
    import avro.schema

    if id(schema) in seen:
        return False
    seen.add(id(schema))
    if schema.type == "null":
        return True
    if isinstance(schema, avro.schema.FixedSchema):
        return bool(schema.size == 0)
    if isinstance(schema, avro.schema.RecordSchema):
        return all(_zero_size(field.type, seen) for field in schema.fields)
    return False


# Compatibility


def compatibility_problems(mode: str, old: ParsedSchema, new: ParsedSchema) -> list[str]:
    """Why `new` may not follow `old` under `mode` (empty: it may)."""
    if mode == "none" or new.same_as(old):
        return []
    if old.schema_type != new.schema_type:
        return [
            f"the type changes from {old.schema_type} to {new.schema_type}: only compatibility "
            "none allows that"
        ]
    problems = []
    if mode in ("backward", "full"):
        problems += [f"backward (new reads old): {p}" for p in _reads(new, old)]
    if mode in ("forward", "full"):
        problems += [f"forward (old reads new): {p}" for p in _reads(old, new)]
    return problems


def _reads(reader: ParsedSchema, writer: ParsedSchema) -> list[str]:
    """Why `reader` may not read every value `writer` accepts."""
    import avro.compatibility

    if reader.schema_type == "json":
        try:
            return subset_problems(writer.document, reader.document, json_rejects)
        except RecursionError:
            return ["the schemas nest too deeply to compare"]
    if reader.avro is None or writer.avro is None:
        return []  # bytes, string, int64: one set of values each
    checker = avro.compatibility.ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]  # avro is untyped
    result = checker.get_compatibility(reader.avro, writer.avro)
    if result.compatibility is avro.compatibility.SchemaCompatibilityType.compatible:
        return []
    kinds = ", ".join(sorted(str(i.value) for i in result.incompatibilities))
    where = ", ".join(sorted(result.locations))
    detail = "; ".join(sorted(str(text) for text in result.messages))
    return [f"{kinds} at {where}: {_short(Exception(detail))}"]
