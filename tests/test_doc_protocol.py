"""docs/PROTOCOL.md's request and response layouts, parsed from the document, against the codec's
construct declarations (headwater/wire/api/): a field added to (or renamed in) a message fails
here until the document has it (issue 41: SERVER_INFO's layout ended 28 bytes short). No server:
the unit tier. The map APIs' section and the arrays of structures (`array<Entry>`, defined in place
or by name) are compared too, their elements field by field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from headwater.wire.api import admin, auth, cluster, consume, maps, produce, schemas, transactions
from headwater.wire.messages import ApiKey

DOC = (Path(__file__).resolve().parent.parent / "docs" / "PROTOCOL.md").read_text()
APIS = {
    api.key: api
    for module in (admin, auth, cluster, consume, maps, produce, schemas, transactions)
    for api in module.APIS
}


# where the document's name for a field is not the dataclass's (the bytes are the same)
RENAMED: dict[ApiKey, dict[str, str]] = {
    ApiKey.PRODUCE: {"record_batch": "batch"},
    ApiKey.SUBSCRIBE: {"type": "sub_type"},
    ApiKey.NACK: {"messages": "acks"},
    ApiKey.REGISTER_SCHEMA: {"type": "schema_type"},
    ApiKey.CHECK_SCHEMA: {"type": "schema_type"},
}


STRUCTURE_RENAMED: dict[str, dict[str, str]] = {"SubscriptionDetail": {"type": "sub_type"}}


def _fields(text: str) -> list[str] | None:
    """`string topic, int32 partition  (a note)` -> ["topic", "partition"]; None when an entry
    has no plain name (`array<Entry>`): the document names that one in prose."""
    text = re.sub(r"\s{2,}\(.*?\)", "", text).strip()
    if text == "empty":
        return []
    entries, depth, current = [], 0, ""
    for char in text:
        depth += {"<": 1, ">": -1}.get(char, 0)
        if char == "," and depth == 0:
            entries.append(current)
            current = ""
        else:
            current += char
    entries.append(current)
    names = [_entry_name(entry.strip()) for entry in entries if entry.strip()]
    return (
        names
        if all(re.fullmatch(r"[a-z_]+|array<\w+>|array\{[a-z_,]+\}|\[\]", name) for name in names)
        else None
    )


def _entry_name(entry: str) -> str:
    """`int32 partition` -> "partition"; an array the document does not name (`array<Entry>`,
    `array<bytes key>`) -> `array<Entry>` (its element's structure, compared below) or "[]"."""
    entry = re.sub(r"\s*\([^)]*\)$", "", entry)  # `int32 limit (1..1000)`
    found = re.fullmatch(r"array<(.*)>", entry)
    if found is None:
        return entry.split()[-1]
    inner = found[1].split()
    if len(inner) == 1 and inner[0][:1].isupper():
        return f"array<{inner[0]}>"
    if "," in found[1]:  # `array<int16 api_key, int16 min_version>`: defined in place
        return "array{" + ",".join(part.split()[-1] for part in found[1].split(",")) + "}"
    return "[]"


def _documented() -> dict[tuple[ApiKey, str], list[str] | None]:
    """(api, "request"|"response") -> the field names the document gives."""
    layouts: dict[tuple[ApiKey, str], list[str] | None] = {}
    for section in re.split(r"^### ", DOC, flags=re.M)[1:]:
        head = section.split("\n", 1)[0]
        keys = [ApiKey[name] for name, _ in re.findall(r"([A-Z_]+) \((\d+)\)", head)]
        block = re.search(r"```\n(.*?)```", section, re.S)
        if not keys or block is None:
            continue
        labels: dict[str, str] = {}
        label = None
        for line in block[1].splitlines():
            found = re.match(r"^([a-z]+ )?(request|response):\s*(.*)$", line)
            structure = re.match(r"^([A-Z][A-Za-z]+):\s*(.*)$", line)
            if found:
                label = (found[1] or "") + found[2]
                labels[label] = found[3]
            elif structure:  # `Entry: bytes key, ...`, an array's element
                label = structure[1]
                labels[label] = structure[2]
            elif label is not None and line.startswith(" "):
                labels[label] += " " + line.strip()
            else:
                label = None
        for label, text in labels.items():
            if label[:1].isupper():
                STRUCTURES.setdefault(label, _fields(text))
                continue
            prefix, _, kind = label.rpartition(" ")
            # "get request" in the MAP_GET (20), MAP_SET (21), ... section: MAP_GET's
            targets = [
                k
                for k in keys
                if not prefix or k.name.lower().removeprefix("map_").startswith(prefix)
            ]
            for key in targets:
                layouts[(key, kind)] = _fields(text)
    return layouts


# the structures the document defines by name (`Entry: ...`), its arrays' elements
STRUCTURES: dict[str, list[str] | None] = {}


def _element(subcon: Any) -> Any:
    """The DataclassAdapter an array field holds, or None (an array of plain values)."""
    seen = 0
    stack = [subcon]
    while stack and seen < 20:
        node = stack.pop(0)
        seen += 1
        if type(node).__name__ == "DataclassAdapter" and node is not subcon:
            return node
        stack.extend(getattr(node, "subcons", []) or [])
        if getattr(node, "subcon", None) is not None:
            stack.append(node.subcon)
    return None


def _declared(adapter: Any) -> list[str]:
    return [subcon.name for subcon in adapter.subcon.subcons]


def _same(key: ApiKey, kind: str, names: list[str], adapter: Any) -> None:
    """The document's names against the declaration's, arrays' elements too."""
    fields = adapter.subcon.subcons
    declared = [f.name for f in fields]
    assert len(names) == len(declared), f"PROTOCOL.md's {key.name} {kind}: {names} != {declared}"
    for name, field in zip(names, fields, strict=True):
        if name == "[]":  # `array<bytes key>`: an array, of plain values
            assert _element(field) is None, f"{key.name} {kind}: {field.name} holds structures"
        elif name.startswith("array{"):
            element = _element(field)
            assert element is not None, f"{key.name} {kind}: {field.name} is no array of them"
            inline = name[len("array{") : -1].split(",")
            assert inline == _declared(element), f"{key.name} {kind}: {inline}"
        elif name.startswith("array<"):
            structure = name[len("array<") : -1]
            element = _element(field)
            assert element is not None, f"{key.name} {kind}: {field.name} is no array of them"
            documented = STRUCTURES.get(structure)
            assert documented is not None, f"PROTOCOL.md does not define {structure}"
            renamed = STRUCTURE_RENAMED.get(structure, {})
            documented = [renamed.get(n, n) for n in documented]
            assert documented == _declared(element), (
                f"PROTOCOL.md's {structure}: {documented} != {_declared(element)}"
            )
        else:
            assert name == field.name, f"PROTOCOL.md's {key.name} {kind}: {names} != {declared}"


def test_protocol_layouts_name_the_codec_fields_in_order() -> None:
    documented = _documented()
    checked = 0
    for (key, kind), names in documented.items():
        api = APIS.get(key)
        if api is None or names is None:
            continue
        names = [RENAMED.get(key, {}).get(name, name) for name in names]
        _same(key, kind, names, api.request if kind == "request" else api.response)
        checked += 1
    assert checked >= 30, checked  # the parse still finds the layouts
    skipped = sorted(f"{k.name} {kind}" for (k, kind), names in documented.items() if names is None)
    assert skipped == [], f"layouts the parse cannot read: {skipped}"
    # the map APIs' section, and the responses that are one array (issue 41: skipped before)
    for key in (ApiKey.MAP_GET, ApiKey.MAP_SET, ApiKey.MAP_SCAN, ApiKey.MAP_SIZE):
        assert documented.get((key, "request")) and documented.get((key, "response")), key
    for key in (ApiKey.LIST_TOPICS, ApiKey.LIST_SUBSCRIPTIONS, ApiKey.API_VERSIONS):
        assert documented.get((key, "response")), key
    # the layouts issue 41 found short, and the largest ones, are among those compared
    for key in (ApiKey.SERVER_INFO, ApiKey.DESCRIBE_TOPIC, ApiKey.SUBSCRIBE):
        assert documented.get((key, "response")) is not None, key
