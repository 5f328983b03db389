"""docs/PROTOCOL.md's request and response layouts, parsed from the document, against the codec's
construct declarations (headwater/wire/api/): a field added to (or renamed in) a message fails
here until the document has it (issue 41: SERVER_INFO's layout ended 28 bytes short). No server:
the unit tier."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from headwater.wire.api import admin, auth, cluster, consume, maps, produce, schemas
from headwater.wire.messages import ApiKey

DOC = (Path(__file__).resolve().parent.parent / "docs" / "PROTOCOL.md").read_text()
APIS = {
    api.key: api
    for module in (admin, auth, cluster, consume, maps, produce, schemas)
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
    names = [entry.split()[-1] for entry in entries if entry.strip()]
    return names if all(re.fullmatch(r"[a-z_]+", name) for name in names) else None


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
            if found:
                label = (found[1] or "") + found[2]
                labels[label] = found[3]
            elif label is not None and line.startswith(" "):
                labels[label] += " " + line.strip()
            else:
                label = None
        for label, text in labels.items():
            prefix, _, kind = label.rpartition(" ")
            targets = [k for k in keys if not prefix or k.name.lower().startswith(prefix)]
            for key in targets:
                layouts[(key, kind)] = _fields(text)
    return layouts


def _declared(adapter: Any) -> list[str]:
    return [subcon.name for subcon in adapter.subcon.subcons]


def test_protocol_layouts_name_the_codec_fields_in_order() -> None:
    documented = _documented()
    checked = 0
    for (key, kind), names in documented.items():
        api = APIS.get(key)
        if api is None or names is None:
            continue
        declared = _declared(api.request if kind == "request" else api.response)
        names = [RENAMED.get(key, {}).get(name, name) for name in names]
        assert names == declared, f"PROTOCOL.md's {key.name} {kind}: {names} != {declared}"
        checked += 1
    assert checked >= 30, checked  # the parse still finds the layouts
    # the layouts issue 41 found short, and the largest ones, are among those compared
    for key in (ApiKey.SERVER_INFO, ApiKey.DESCRIBE_TOPIC, ApiKey.SUBSCRIBE):
        assert documented.get((key, "response")) is not None, key
