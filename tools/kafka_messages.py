"""Writes headwater/server/kafka/messages/{family}.py from Kafka's published JSON message specs
(the copy kafka-python ships: a dev dependency, never the server's), for the APIs and versions
the Kafka listener serves (`FAMILIES`): one frozen dataclass per request, response and nested
struct, fields named as Kafka names them (snake_case), each with Kafka's default, and each
field's versions, so the codec reads and writes every version from the one class.

    python -m tools.kafka_messages          # rewrite the modules
    python -m tools.kafka_messages --check  # exit 1 if they differ (tests/test_kafka_messages.py)

Left out: fields of no served version, and tagged fields (they travel in a flexible version's
tags, which the codec skips on reading and writes empty).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

# family module: (API name, first and last version served), in the order the module lists them
FAMILIES: dict[str, tuple[str, list[tuple[str, int, int]]]] = {
    "produce": (
        "Produce and InitProducerId: records in, producer ids out.",
        [
            ("Produce", 3, 8),
            ("InitProducerId", 0, 4),
        ],
    ),
    "fetch": ("Fetch: records out, by offset.", [("Fetch", 4, 11)]),
    "offsets": (
        "ListOffsets (a partition's offsets), OffsetCommit and OffsetFetch (a group's).",
        [
            ("ListOffsets", 1, 3),
            ("OffsetCommit", 0, 3),
            ("OffsetFetch", 1, 3),
        ],
    ),
    "metadata": (
        "ApiVersions and Metadata: what the broker serves and where partitions are.",
        [
            ("ApiVersions", 0, 3),
            ("Metadata", 0, 12),
        ],
    ),
    "groups": (
        "The consumer group protocol: coordinator, membership, listing, deletion.",
        [
            ("FindCoordinator", 0, 1),
            ("JoinGroup", 0, 5),
            ("Heartbeat", 0, 3),
            ("LeaveGroup", 0, 3),
            ("SyncGroup", 0, 3),
            ("DescribeGroups", 0, 2),
            ("ListGroups", 0, 5),
            ("DeleteGroups", 0, 1),
        ],
    ),
    "admin": (
        "Topics made, deleted and grown, and records deleted, by an admin client.",
        [
            ("CreateTopics", 0, 3),
            ("DeleteTopics", 0, 3),
            ("CreatePartitions", 0, 1),
            ("DeleteRecords", 0, 1),
        ],
    ),
    "configs": (
        "Topic configs shown and changed.",
        [
            ("DescribeConfigs", 0, 2),
            ("AlterConfigs", 0, 1),
            ("IncrementalAlterConfigs", 0, 0),
        ],
    ),
    "transactions": (
        "Transactions: a transactional producer's partitions, offsets and end, and listing.",
        [
            ("AddPartitionsToTxn", 0, 3),
            ("AddOffsetsToTxn", 0, 3),
            ("EndTxn", 0, 3),
            ("TxnOffsetCommit", 0, 3),
            ("DescribeTransactions", 0, 0),
            ("ListTransactions", 0, 1),
        ],
    ),
    "sasl": ("SASL authentication (PLAIN).", [("SaslHandshake", 0, 1), ("SaslAuthenticate", 0, 1)]),
    # KIP-848: specs written here (kafka-python ships none), tools/kafka_specs/
    "consumer_protocol": (
        "Kafka 4's consumer group protocol (KIP-848): heartbeats that carry the assignment,\n"
        "and describing such groups.",
        [
            ("ConsumerGroupHeartbeat", 0, 1),
            ("ConsumerGroupDescribe", 0, 0),
        ],
    ),
    # share groups (KIP-932): their specs are in tools/kafka_specs (`load`)
    "share": (
        "Share groups (KIP-932): membership, description, fetching and acknowledging records.",
        [
            ("ShareGroupHeartbeat", 1, 1),
            ("ShareGroupDescribe", 1, 1),
            ("ShareFetch", 1, 1),
            ("ShareAcknowledge", 1, 1),
        ],
    ),
}
OUT = Path(__file__).resolve().parent.parent / "headwater" / "server" / "kafka" / "messages"
# specs of APIs kafka-python does not ship, written from Kafka's protocol documentation
OURS = Path(__file__).resolve().parent / "kafka_specs"
_INTS = {"int8", "int16", "uint16", "int32", "int64"}
_MAX = 0x7FFF


def resources() -> Path:
    import kafka.protocol.schemas as schemas

    return Path(schemas.__file__).parent / "resources"


def load(name: str) -> dict[str, Any]:
    path = OURS / f"{name}.json"
    text = (path if path.exists() else resources() / f"{name}.json").read_text()
    return dict(json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M)))


def versions(spec: str | None) -> tuple[int, int] | None:
    if spec is None or spec == "none":
        return None
    if spec.endswith("+"):
        return int(spec[:-1]), _MAX
    low, _, high = spec.partition("-")
    return int(low), int(high or low)


def snake(name: str) -> str:
    name = re.sub(r"(?<=[A-Z])(?=[A-Z][a-z])", "_", name)
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _meets(span: tuple[int, int] | None, low: int, high: int) -> bool:
    return span is not None and span[0] <= high and span[1] >= low


class Module:
    def __init__(self) -> None:
        self.classes: list[str] = []
        self.names: set[str] = set()
        self.api = ""
        self.common: dict[str, list[dict[str, Any]]] = {}  # the spec's commonStructs
        self.declared: dict[tuple[str, int, int], str] = {}  # a struct used twice: declared once

    def struct(
        self,
        name: str,
        fields: list[dict[str, Any]],
        low: int,
        high: int,
        head: list[str],
        base: str = "Struct",
    ) -> str:
        """Declare the struct (its nested ones first); its class name."""
        seen = (json.dumps([name, fields]), low, high)
        if seen in self.declared:
            return self.declared[seen]
        lines: list[str] = []
        declared: list[str] = []
        for field in fields:
            span = versions(field["versions"])
            if "tag" in field or not _meets(span, low, high):
                continue
            assert span is not None
            attr = snake(field["name"])
            kind: str = field["type"]
            array = kind.startswith("[]")
            inner = kind[2:] if array else kind
            nullable = _meets(versions(field.get("nullableVersions")), low, high)
            nested = field.get("fields", self.common.get(inner))
            if nested is not None:
                inner = self.struct(inner, nested, max(low, span[0]), min(high, span[1]), [])
                py = inner
                wire = inner
            else:
                assert inner in _INTS | {"bool", "string", "bytes", "records", "float64", "uuid"}
                py = {
                    "uuid": "bytes",  # 16 bytes
                    "bool": "bool",
                    "string": "str",
                    "bytes": "bytes",
                    "records": "bytes",
                    "float64": "float",
                }.get(inner, "int")
                wire = repr(inner)
            default = field.get("default")
            if array:
                annotation = f"Sequence[{py}]"
                value = "None" if default == "null" else "()"
            elif py == "int":
                value = str(int(default, 0)) if isinstance(default, str) else "0"
            elif py == "bool":
                value = "True" if default == "true" else "False"
            elif py == "float":
                value = str(float(default or 0))
            elif py == "str":
                value = "None" if default == "null" else repr(default or "")
            elif inner == "uuid":
                value = "bytes(16)"
            elif py == "bytes":
                value = "None" if inner == "records" or default == "null" else 'b""'
            elif default == "null":  # a nullable struct, not in an array
                value = "None"
                annotation = py
            else:  # a struct, not in an array
                value = "None" if default == "null" else f"{py}()"
                annotation = py
            if not array and py in ("int", "bool", "float", "str", "bytes"):
                annotation = py
            if nullable or value == "None":
                annotation += " | None"
            lines.append(f"    {attr}: {annotation} = {value}")
            span_high = "" if span[1] == _MAX else f", {span[1]}"
            null = ""
            if nullable:
                null_span = versions(field["nullableVersions"])
                assert null_span is not None
                null = f", nullable={null_span[0]}"
            array_arg = ", array=True" if array else ""
            declared.append(
                f"        Field({attr!r}, {wire}, {span[0]}{span_high}{array_arg}{null}),"
            )
        if name in self.names:  # a struct of another API of the module has the name
            name = f"{self.api}{name}"
        assert name not in self.names, f"two structs named {name}"
        self.names.add(name)
        self.declared[seen] = name
        out = ["@dataclass(frozen=True, slots=True)", f"class {name}({base}):", *head, *lines]
        out.append("    FIELDS: ClassVar[tuple[Field, ...]] = (")
        out += declared
        out.append("    )")
        self.classes.append("\n".join(out))
        return name


def render(family: str) -> str:
    about, apis = FAMILIES[family]
    module = Module()
    for api, low, high in apis:
        module.api = api
        for kind in ("Request", "Response"):
            spec = load(f"{api}{kind}")
            flexible = versions(spec["flexibleVersions"])
            flexible_from = flexible[0] if flexible and flexible[0] <= high else None
            head = [
                f'    """{api} {kind.lower()}, versions {low}-{high}'
                + (f" (flexible from {flexible_from})" if flexible_from is not None else "")
                + '."""',
                "",
                f"    API_KEY: ClassVar[int] = {spec['apiKey']}",
                f"    VERSIONS: ClassVar[tuple[int, int]] = ({low}, {high})",
                f"    FLEXIBLE_FROM: ClassVar[int | None] = {flexible_from}",
            ]
            module.common = {c["name"]: c["fields"] for c in spec.get("commonStructs", [])}
            module.struct(f"{api}{kind}", spec["fields"], low, high, head, "Message")
    names = sorted(module.names)
    imported = (
        "Field, Message, Struct" if "(Struct):" in "".join(module.classes) else ("Field, Message")
    )
    body = "\n\n\n".join(module.classes)
    return (
        f'"""{about}\n\nWritten by tools/kafka_messages.py from Kafka\'s JSON message specs: '
        'do not edit."""\n\n'
        "from __future__ import annotations\n\n"
        "from collections.abc import Sequence\n"
        "from dataclasses import dataclass\n"
        "from typing import ClassVar\n\n"
        f"from headwater.server.kafka.messages.declare import {imported}\n\n"
        f"__all__ = [{', '.join(repr(n) for n in names)}]\n\n\n"
        f"{body}\n"
    )


def formatted(text: str) -> str:
    """As `ruff format` lays it out (the project's style)."""
    ruff = Path(sys.executable).parent / "ruff"
    done = subprocess.run(
        [str(ruff), "format", "--stdin-filename", "messages.py", "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for family in FAMILIES:
        path = OUT / f"{family}.py"
        text = formatted(render(family))
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
    for name in stale:
        print(f"{name} is not what tools/kafka_messages.py writes", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
