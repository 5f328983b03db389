"""Whether every document one JSON Schema accepts, another accepts too: `subset_problems(a, b)`.

Schema compatibility is a statement about sets of documents: backward means every document valid
under the old schema is valid under the new one (old ⊆ new), forward the reverse, full both.
Deciding inclusion for all of JSON Schema is intractable, so this proves it for a documented
subset (docs/SCHEMAS.md) and answers "cannot prove" for anything else: a problem is returned
whenever inclusion is not shown, never the other way round. The rules walk both schemas keyword
by keyword:

- `true`/`{}` accept everything, `false` nothing; annotations (title, description, ...) are
  ignored;
- `type`: a's types within b's (integer is within number); keywords that constrain one type
  (minimum, minLength, items, properties, ...) of b matter only if a admits that type;
- `enum`/`const` in a: each of its values is checked against b by a real validator;
- bounds: b's may be looser or equal, never tighter; `pattern`/`format` in b must be in a too;
- objects: b requires no property a does not; each property is compared with its counterpart,
  or with the other side's `additionalProperties` where one side does not name it (so adding a
  constrained property to an open old schema is not backward compatible: old documents may hold
  it with any value);
- any other keyword (`$ref`, `allOf`, `anyOf`, `oneOf`, `not`, `if`, `patternProperties`, ...)
  is accepted only where both sides are identical there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

ANNOTATIONS: Final = frozenset(
    {
        "title",
        "description",
        "$schema",
        "$id",
        "$comment",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
_TYPES: Final = ("null", "boolean", "object", "array", "number", "string")
_HANDLED: Final = frozenset(
    {
        "type",
        "enum",
        "const",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "items",
        "minItems",
        "maxItems",
        "uniqueItems",
        "properties",
        "required",
        "additionalProperties",
        "minProperties",
        "maxProperties",
    }
)
_NUMERIC: Final = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_STRING: Final = ("minLength", "maxLength", "pattern", "format")
_ARRAY: Final = ("items", "minItems", "maxItems", "uniqueItems")
_OBJECT: Final = ("properties", "required", "additionalProperties", "minProperties")

# the values `schema` does not accept (a real validator, given by the caller)
Rejects = Callable[[Any, list[Any]], list[Any]]
MAX_ENUM_COMPARED: Final = 1000  # values of an enum checked one by one against the other side


def subset_problems(a: Any, b: Any, rejects: Rejects, path: str = "") -> list[str]:
    """Why documents valid under `a` (the writer's schema) may not all be valid under `b` (the
    reader's); empty when they all are."""
    if b is True or (isinstance(b, dict) and not _constraints(b)):
        return []
    if a is False:
        return []
    where = path or "/"
    if b is False:
        return [f"{where}: the reader accepts nothing here, the writer does"]
    if a is True or (isinstance(a, dict) and not _constraints(a)):
        return [f"{where}: the writer accepts any value here, the reader constrains it"]
    if not isinstance(a, dict) or not isinstance(b, dict):
        return [f"{where}: not a schema"]
    if "enum" in a or "const" in a:
        values = a["enum"] if "enum" in a else [a["const"]]
        if isinstance(values, list):
            other = b.get("enum")
            if len(values) > MAX_ENUM_COMPARED or (
                isinstance(other, list) and len(other) > MAX_ENUM_COMPARED
            ):
                return [f"{where}: an enum of more than {MAX_ENUM_COMPARED} values is not compared"]
            rejected = rejects(b, values)
            return [f"{where}: value {v!r} is accepted by the writer only" for v in rejected[:5]]
    problems = [
        f"{where}: keyword {k!r} differs (only identical use of it can be compared)"
        for k in sorted(set(_constraints(a)) | set(_constraints(b)))
        if k not in _HANDLED and a.get(k) != b.get(k)
    ]
    types_a, types_b = _types(a), _types(b)
    extra = sorted(t for t in types_a if not _type_within(t, types_b))
    if extra:
        problems.append(f"{where}: type {'/'.join(extra)} is accepted by the writer only")
    if "enum" in b or "const" in b:
        problems.append(f"{where}: the reader restricts values to an enum or const")
    if types_a & {"number", "integer"}:
        problems += _numeric(a, b, where)
    if "string" in types_a:
        problems += _string(a, b, where)
    if "array" in types_a:
        problems += _array(a, b, rejects, path)
    if "object" in types_a:
        problems += _object(a, b, rejects, path)
    return problems


def _constraints(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k not in ANNOTATIONS}


def _types(schema: dict[str, Any]) -> set[str]:
    declared = schema.get("type")
    if declared is None:
        return {*_TYPES, "integer"}
    return {declared} if isinstance(declared, str) else set(declared)


def _type_within(kind: str, types: set[str]) -> bool:
    return kind in types or (kind == "integer" and "number" in types)


def _lower(schema: dict[str, Any]) -> tuple[float, bool]:
    """The lower bound on numbers (value, exclusive)."""
    bound, exclusive = -math.inf, False
    if isinstance(schema.get("minimum"), int | float):
        bound = schema["minimum"]
    low = schema.get("exclusiveMinimum")
    if isinstance(low, int | float) and not isinstance(low, bool) and low >= bound:
        bound, exclusive = low, True
    return bound, exclusive


def _upper(schema: dict[str, Any]) -> tuple[float, bool]:
    bound, exclusive = math.inf, False
    if isinstance(schema.get("maximum"), int | float):
        bound = schema["maximum"]
    high = schema.get("exclusiveMaximum")
    if isinstance(high, int | float) and not isinstance(high, bool) and high <= bound:
        bound, exclusive = high, True
    return bound, exclusive


def _numeric(a: dict[str, Any], b: dict[str, Any], where: str) -> list[str]:
    problems = []
    (low_a, ex_a), (low_b, ex_b) = _lower(a), _lower(b)
    if low_a < low_b or (low_a == low_b and ex_b and not ex_a):
        problems.append(f"{where}: the lower bound is tighter for the reader ({low_b})")
    (high_a, ex_a), (high_b, ex_b) = _upper(a), _upper(b)
    if high_a > high_b or (high_a == high_b and ex_b and not ex_a):
        problems.append(f"{where}: the upper bound is tighter for the reader ({high_b})")
    step_a, step_b = a.get("multipleOf"), b.get("multipleOf")
    if step_b is not None and (
        not isinstance(step_a, int | float)
        or not isinstance(step_b, int | float)
        or step_b <= 0
        or not float(step_a / step_b).is_integer()
    ):
        problems.append(f"{where}: multipleOf {step_b} of the reader is not implied by the writer")
    return problems


def _string(a: dict[str, Any], b: dict[str, Any], where: str) -> list[str]:
    problems = []
    if a.get("minLength", 0) < b.get("minLength", 0):
        problems.append(f"{where}: minLength is larger for the reader")
    if a.get("maxLength", math.inf) > b.get("maxLength", math.inf):
        problems.append(f"{where}: maxLength is smaller for the reader")
    for keyword in ("pattern", "format"):
        if keyword in b and a.get(keyword) != b[keyword]:
            problems.append(f"{where}: {keyword} {b[keyword]!r} is required by the reader only")
    return problems


def _array(a: dict[str, Any], b: dict[str, Any], rejects: Rejects, path: str) -> list[str]:
    where = path or "/"
    problems = subset_problems(a.get("items", True), b.get("items", True), rejects, path + "/items")
    if a.get("minItems", 0) < b.get("minItems", 0):
        problems.append(f"{where}: minItems is larger for the reader")
    if a.get("maxItems", math.inf) > b.get("maxItems", math.inf):
        problems.append(f"{where}: maxItems is smaller for the reader")
    if b.get("uniqueItems") is True and a.get("uniqueItems") is not True:
        problems.append(f"{where}: uniqueItems is required by the reader only")
    return problems


def _object(a: dict[str, Any], b: dict[str, Any], rejects: Rejects, path: str) -> list[str]:
    where = path or "/"
    problems = []
    missing = sorted(set(b.get("required", [])) - set(a.get("required", [])))
    if missing:
        problems.append(
            f"{where}: property {', '.join(map(repr, missing))} required by the reader only"
        )
    props_a, props_b = a.get("properties", {}), b.get("properties", {})
    rest_a, rest_b = a.get("additionalProperties", True), b.get("additionalProperties", True)
    if not isinstance(props_a, dict) or not isinstance(props_b, dict):
        return [*problems, f"{where}: properties is not an object"]
    for name in sorted(set(props_a) | set(props_b)):
        inner = f"{path}/properties/{name}"
        problems += subset_problems(
            props_a.get(name, rest_a), props_b.get(name, rest_b), rejects, inner
        )
    problems += subset_problems(rest_a, rest_b, rejects, path + "/additionalProperties")
    if a.get("minProperties", 0) < b.get("minProperties", 0):
        problems.append(f"{where}: minProperties is larger for the reader")
    if a.get("maxProperties", math.inf) > b.get("maxProperties", math.inf):
        problems.append(f"{where}: maxProperties is smaller for the reader")
    return problems
