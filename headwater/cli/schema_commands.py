"""`headwater schema register|get|list|check`, the `--schema` options of `topic create`, and
reading `produce`'s text values by a topic's schema.

Definitions come from `--schema-file FILE` (`-` for standard input). `get`, `list`, `register`
and `check` print a table (default) or JSON (`--format json`, shapes in docs/CLI.md); `check`
exits 1 when the topic's compatibility mode would refuse the schema, so scripts can gate on it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from headwater.cli.parser import add_global_options
from headwater.client.client import Client, Consumer, Message
from headwater.client.schema_codec import SchemaCodec
from headwater.wire import messages as m

FORMATS = {f"schema {name}": ("table", "json") for name in ("register", "get", "list", "check")}


def _command(commands: Any, name: str, help: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help, description=help)
    add_global_options(parser, suppress=True)
    return parser


def _definition_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topic", help="the topic")
    parser.add_argument("--type", required=True, choices=m.SCHEMA_TYPES, help="the schema type")
    parser.add_argument(
        "--schema-file", type=Path, metavar="FILE", help="JSON Schema or Avro schema ('-': stdin)"
    )
    parser.add_argument(
        "--compatibility",
        choices=m.COMPATIBILITY_MODES,
        help="set the topic's mode first, and decide by it",
    )


def add_parser(commands: Any) -> None:
    schema = _command(commands, "schema", "register, show and check topic schemas")
    schema_commands = schema.add_subparsers(dest="schema_command", required=True)
    register = _command(schema_commands, "register", "add a schema version to a topic")
    _definition_options(register)
    get = _command(schema_commands, "get", "print a schema version (default: the latest)")
    get.add_argument("topic", help="the topic")
    get.add_argument("--version", type=int, help="the version (default: the latest)")
    listing = _command(schema_commands, "list", "list a topic's schema versions")
    listing.add_argument("topic", help="the topic")
    check = _command(
        schema_commands, "check", "would the topic accept this schema? (exit 1 if not)"
    )
    _definition_options(check)


def read_definition(path: Path | None) -> bytes:
    if path is None:
        return b""
    if str(path) == "-":
        return sys.stdin.buffer.read()
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read schema file {path}: {exc.strerror or exc}") from None


def topic_configs(args: argparse.Namespace) -> dict[str, str]:
    """`topic create`'s schema options as the topic's `schema.*` configs."""
    configs = {}
    if args.schema_file is not None and args.schema is None:
        raise ValueError("--schema-file needs --schema json or --schema avro")
    if args.schema is not None:
        configs["schema.type"] = args.schema
        definition = read_definition(args.schema_file)
        if definition:
            try:
                configs["schema.definition"] = definition.decode()
            except UnicodeDecodeError:
                raise ValueError(f"schema file {args.schema_file} is not UTF-8") from None
    if args.compatibility is not None:
        configs["schema.compatibility"] = args.compatibility
    return configs


def text_value(codec: SchemaCodec, text: str) -> Any:
    """A line of `produce` input as a value of the topic's schema: the text itself for string
    (and as bytes for bytes), a number for int64, JSON for json and avro (a record as an object)."""
    kind = codec.schema_type
    if kind == "bytes":
        return text.encode()
    if kind == "string":
        return text
    if kind == "int64":
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"not an integer for an int64 topic: {text[:80]!r}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        article = "an" if kind[0] in "aeiou" else "a"
        raise ValueError(f"not JSON for {article} {kind} topic: {exc}: {text[:80]!r}") from None


async def readable(consumer: Consumer, message: Message) -> Message:
    """The message with an int64 value as its decimal digits and an Avro one as JSON; others
    (bytes, string, json) as they are: printed as stored, they already read."""
    version = message.schema_version
    if version is None or message.value is None:
        return message
    codec = await consumer.codec(version)
    if codec.schema_type not in ("int64", "avro"):
        return message
    value = codec.decode(message.value)
    text = (
        str(value)
        if codec.schema_type == "int64"
        else json.dumps(value, default=str, ensure_ascii=False)
    )
    return dataclasses.replace(message, value=text.encode())


def _info_record(info: m.SchemaInfo, compatibility: str | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {
        "topic": info.topic,
        "version": info.version,
        "type": info.schema_type,
        "registered_ms": info.registered_ms,
    }
    if info.definition:
        record["definition"] = info.definition.decode(errors="replace")
    if compatibility is not None:
        record["compatibility"] = compatibility
    return record


async def run(client: Client, args: argparse.Namespace) -> int:
    as_json = args.format == "json"
    command = args.schema_command
    if command == "get":
        response = await client.get_schema(args.topic, args.version)
        info = response.schema
        if as_json:
            print(json.dumps(_info_record(info, response.compatibility), ensure_ascii=False))
        else:
            print(f"topic: {info.topic}")
            print(f"version: {info.version}" + (" (none registered)" if info.version == 0 else ""))
            print(f"type: {info.schema_type}")
            print(f"compatibility: {response.compatibility}")
            if info.definition:
                print(f"definition: {info.definition.decode(errors='replace')}")
        return 0
    if command == "list":
        listing = await client.list_schemas(args.topic)
        if as_json:
            versions = [_info_record(v) for v in listing.versions]
            out = {
                "topic": args.topic,
                "compatibility": listing.compatibility,
                "versions": versions,
            }
            print(json.dumps(out, ensure_ascii=False))
        else:
            print(f"compatibility: {listing.compatibility}")
            print("VERSION  TYPE    REGISTERED_MS")
            for v in listing.versions:
                print(f"{v.version:>7}  {v.schema_type:<6}  {v.registered_ms}")
        return 0
    definition = read_definition(args.schema_file)
    if command == "register":
        request = m.RegisterSchemaRequest(
            args.topic, args.type, definition, args.compatibility or ""
        )
        registered = await client.request(request)
        assert isinstance(registered, m.RegisterSchemaResponse)
        if as_json:
            out = {"version": registered.version, "created": registered.created}
            print(json.dumps(out))
        else:
            verb = "registered" if registered.created else "already registered as"
            print(f"{verb} version {registered.version} of {args.topic}")
        return 0
    checked = await client.check_schema(
        args.topic, args.type, definition, compatibility=args.compatibility
    )
    if as_json:
        out = {
            "compatible": checked.compatible,
            "existing_version": checked.existing_version,
            "reasons": list(checked.reasons),
        }
        print(json.dumps(out, ensure_ascii=False))
    elif checked.compatible:
        same = f" (identical to version {checked.existing_version})"
        print("compatible" + (same if checked.existing_version else ""))
    else:
        print("not compatible:")
        for reason in checked.reasons:
            print(f"  {reason}")
    return 0 if checked.compatible else 1
