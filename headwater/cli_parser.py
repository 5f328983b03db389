"""The argument parsers of the client commands (topic, produce, consume, map, subscription).

Global options (`--server`, `--token`, `--tls`, `--ca`, `--cert`, `--cert-key`, `--format`) are
accepted anywhere on the command line: the top-level parser holds them with their real defaults,
and every command parser holds a copy whose default is `argparse.SUPPRESS`, so a copy sets the
value only when the option is given after the subcommand and otherwise leaves the top-level one.
`--format` is global too; each command checks the value against the formats it has.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from headwater.wire.messages import COMPATIBILITY_MODES, SCHEMA_TYPES

DEFAULT_SERVER = "127.0.0.1:6650"
FORMATS_HELP = (
    "output format: table|json for topic list/describe and map scan, text|json for consume "
    "(default: table, or text for consume)"
)


def add_global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The connection and output options; with `suppress`, the copy a subcommand holds."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    group = parser.add_argument_group("global options (before or after the command)")
    group.add_argument(
        "--server",
        default=default(os.environ.get("HEADWATER_SERVER", DEFAULT_SERVER)),
        help=f"HOST:PORT of the server (env HEADWATER_SERVER, default {DEFAULT_SERVER})",
    )
    group.add_argument(
        "--token",
        default=default(os.environ.get("HEADWATER_TOKEN")),
        help="authenticate with this token (env HEADWATER_TOKEN)",
    )
    group.add_argument(
        "--tls", action="store_true", default=default(False), help="connect with TLS"
    )
    group.add_argument(
        "--ca", type=Path, default=default(None), help="verify the server with this CA (PEM)"
    )
    group.add_argument(
        "--cert", type=Path, default=default(None), help="TLS client certificate (PEM)"
    )
    # (--key is the message key of produce and consume)
    group.add_argument(
        "--cert-key",
        type=Path,
        default=default(None),
        help="the client certificate's private key (PEM)",
    )
    group.add_argument("--format", default=default(None), metavar="FORMAT", help=FORMATS_HELP)


def _command(commands: Any, name: str, help: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help, description=help)
    add_global_options(parser, suppress=True)
    return parser


def add_client_commands(commands: Any) -> None:
    _topic_commands(commands)
    _produce_command(commands)
    _consume_command(commands)
    _map_commands(commands)
    _subscription_commands(commands)


def _topic_commands(commands: Any) -> None:
    topic = _command(commands, "topic", "create, list, describe and delete topics")
    topic_commands = topic.add_subparsers(dest="topic_command", required=True)
    create = _command(topic_commands, "create", "create a topic (reliable unless asked)")
    create.add_argument("name", help="the topic's name")
    create.add_argument("--partitions", type=int, default=1, help="partitions (default 1)")
    create.add_argument(
        "--dispatch",
        choices=["non-reliable", "reliable"],
        default="reliable",
        help="reliable (default): on disk, acks and redelivery; non-reliable: in memory, "
        "fire and forget, a slow consumer misses messages",
    )
    create.add_argument(
        "--last-value", action="store_true", help="keep the last value per key (map, last-value)"
    )
    create.add_argument("--key-field", help="take last-value keys from this JSON field")
    create.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="reliable-topic setting, e.g. fsync=interval (repeatable)",
    )
    create.add_argument(
        "--schema", choices=SCHEMA_TYPES, help="schema type (default bytes); docs/SCHEMAS.md"
    )
    create.add_argument(
        "--schema-file", type=Path, metavar="FILE", help="JSON Schema or Avro schema ('-': stdin)"
    )
    create.add_argument(
        "--compatibility", choices=COMPATIBILITY_MODES, help="for new versions (default backward)"
    )
    _command(topic_commands, "list", "list the topics")
    describe = _command(topic_commands, "describe", "offsets, configs and subscriptions")
    describe.add_argument("name", help="the topic's name")
    delete = _command(topic_commands, "delete", "delete a topic and everything it stores")
    delete.add_argument("name", help="the topic's name")


def _produce_command(commands: Any) -> None:
    produce = _command(
        commands, "produce", "send the VALUEs, or else one message per line of standard input"
    )
    produce.add_argument("topic", help="the topic to send to")
    produce.add_argument("values", nargs="*", metavar="VALUE", help="message values")
    produce.add_argument("--key", help="the key of every message")
    produce.add_argument(
        "--key-separator",
        metavar="SEP",
        help="split each value at the first SEP into key and value",
    )
    produce.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a header on every message (repeatable)",
    )
    produce.add_argument(
        "--partition",
        type=int,
        metavar="P",
        help="send every message to partition P (default: by key, else round robin)",
    )
    produce.add_argument(
        "--delivery",
        choices=["at-least-once", "at-most-once"],
        default="at-least-once",
        help="at-least-once (default) retries until acknowledged; at-most-once never retries",
    )
    produce.add_argument("--retries", type=int, default=5, help="at-least-once retries")
    produce.add_argument(
        "--batch-size",
        type=int,
        default=64 * 1024,
        metavar="BYTES",
        help="largest batch sent at once (default 65536)",
    )
    produce.add_argument(
        "--linger-ms",
        type=float,
        default=0.0,
        help="wait this long for more messages to fill a batch (default 0)",
    )
    produce.add_argument(
        "--compression",
        choices=["none", "gzip", "snappy", "lz4", "zstd"],
        default="none",
        help="batch compression (default none)",
    )
    produce.add_argument("--idempotent", action="store_true", help="no duplicates on retry")
    produce.add_argument(
        "--isolation",
        choices=["read-uncommitted", "read-committed"],
        default="read-uncommitted",
        help="reliable topics: acknowledge after the append, or after an fsync covers it",
    )
    produce.add_argument(
        "--count", type=int, help="generate N messages of --size bytes instead of reading values"
    )
    produce.add_argument(
        "--size", type=int, help="with --count: bytes per generated message (default 100)"
    )


def _consume_command(commands: Any) -> None:
    consume = _command(commands, "consume", "print messages")
    consume.add_argument("topic", help="the topic to consume")
    consume.add_argument("--subscription", "-s", required=True, help="the subscription's name")
    consume.add_argument(
        "--type",
        choices=["exclusive", "shared", "failover"],
        default="exclusive",
        help="subscription type (default exclusive)",
    )
    consume.add_argument("--name", help="consumer name (Failover orders by priority, then name)")
    consume.add_argument(
        "--priority", type=int, default=0, help="Failover: the lowest value is active (default 0)"
    )
    consume.add_argument("--count", "-n", type=int, help="exit after N messages")
    consume.add_argument(
        "--print",
        dest="fields",
        default="",
        metavar="FIELDS",
        help="text format: show these before each value, comma-separated, from "
        "partition,offset,timestamp,key,headers (e.g. --print key,headers,partition,offset)",
    )
    consume.add_argument(
        "--prefetch",
        type=int,
        default=1000,
        metavar="N",
        help="messages the server may send ahead of the ones printed (default 1000)",
    )
    consume.add_argument(
        "--partition",
        type=int,
        metavar="P",
        help="print only partition P's messages; the others are not acknowledged, so the "
        "subscription keeps them (a filter in the client: the server still sends them)",
    )
    consume.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="stop when no message arrives for SECONDS (exit 1 if --count was not reached)",
    )
    consume.add_argument(
        "--exit-at-end",
        action="store_true",
        help="stop once the messages up to the end offsets seen at start are consumed",
    )
    consume.add_argument(
        "--from",
        dest="start",
        default="latest",
        metavar="earliest|latest|OFFSET",
        help="where a new reliable subscription starts (default latest)",
    )
    consume.add_argument(
        "--no-ack", action="store_true", help="do not acknowledge (messages come back later)"
    )
    consume.add_argument(
        "--raw",
        action="store_true",
        help="print values as stored (default: int64 as a number, avro as JSON)",
    )
    consume.add_argument(
        "--durable",
        choices=["default", "none", "standard", "shared", "last-value", "map"],
        default="default",
        help="what the subscription keeps (docs/DURABLES.md; default: by topic and type)",
    )
    consume.add_argument(
        "--key", action="append", default=[], help="last-value: a key to follow (repeatable)"
    )
    consume.add_argument("--key-prefix", help="last-value: follow every key with this prefix")
    consume.add_argument(
        "--reconnect",
        action="store_true",
        help="when the connection is lost, reconnect and resubscribe (gives up after 60 s)",
    )


def _map_commands(commands: Any) -> None:
    map_parser = _command(commands, "map", "read and write a map durable")
    map_commands = map_parser.add_subparsers(dest="map_command", required=True)
    get = _command(map_commands, "get", "print a key's value")
    get.add_argument("topic", help="a topic with last-value state")
    get.add_argument("key", help="the key")
    set_ = _command(map_commands, "set", "write a key (the first write enables last-value state)")
    set_.add_argument("topic", help="a reliable topic")
    set_.add_argument("key", help="the key")
    set_.add_argument("value", help="the value")
    set_.add_argument("--revision", type=int, help="only if the key is at this revision")
    delete = _command(map_commands, "delete", "delete a key")
    delete.add_argument("topic", help="a topic with last-value state")
    delete.add_argument("key", help="the key")
    scan = _command(map_commands, "scan", "print keys and values in key order")
    scan.add_argument("topic", help="a topic with last-value state")
    scan.add_argument("--prefix", default="", help="only keys starting with this")
    scan.add_argument(
        "--limit", type=int, default=100, help="keys per page (default 100; at most 1000)"
    )
    scan.add_argument("--all", action="store_true", help="fetch page after page until done")
    size = _command(map_commands, "size", "print the number of keys")
    size.add_argument("topic", help="a topic with last-value state")


def _subscription_commands(commands: Any) -> None:
    subscription = _command(commands, "subscription", "manage reliable subscriptions")
    subscription_commands = subscription.add_subparsers(dest="subscription_command", required=True)
    seek = _command(
        subscription_commands, "seek", "move a subscription; unacked messages are dropped"
    )
    seek.add_argument("topic", help="the topic")
    seek.add_argument("subscription", help="the subscription")
    seek.add_argument(
        "--to",
        required=True,
        metavar="earliest|latest|OFFSET",
        help="the new position, on every partition",
    )
    remove = _command(subscription_commands, "delete", "delete a subscription")
    remove.add_argument("topic", help="the topic")
    remove.add_argument("subscription", help="the subscription")
