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

from headwater.cli.arguments import ENCODING_HELP, ENCODINGS
from headwater.wire.messages import COMPATIBILITY_MODES, SCHEMA_TYPES

DEFAULT_SERVER = "127.0.0.1:6650"
FORMATS_HELP = (
    "output format: table|json for the topic, subscription, server and map scan commands, "
    "text|json for consume (default: table, or text for consume)"
)
RESET_TO = "earliest|latest|snapshot|OFFSET|@EPOCH_MS|ISO-8601"
RESET_HELP = (
    "the new position on every partition: earliest, latest, snapshot (the newest compaction "
    "snapshot, then the log after it), an offset, or a time (@ and ms "
    "since the epoch, or ISO-8601 such as 2026-11-22T08:00:00Z; without a zone UTC): each "
    "partition's first message at or after it"
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


def _encodings(parser: argparse.ArgumentParser, key: bool = True, value: bool = True) -> None:
    """`--key-encoding` and `--value-encoding`: binary keys and values as base64 or hex text."""
    for name, wanted in (("key", key), ("value", value)):
        if wanted:
            parser.add_argument(
                f"--{name}-encoding",
                choices=ENCODINGS,
                default="utf8",
                help=ENCODING_HELP.format(what=f"{name}s"),
            )


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
    _server_commands(commands)


def _topic_commands(commands: Any) -> None:
    topic = _command(commands, "topic", "create, list, describe, alter and delete topics")
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
        "--exist-ok", action="store_true", help="a topic of that name existing already is no error"
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
    describe = _command(
        topic_commands, "describe", "offsets, storage per partition, configs and subscriptions"
    )
    describe.add_argument("name", help="the topic's name")
    _topic_alter_command(topic_commands)
    delete = _command(topic_commands, "delete", "delete a topic and everything it stores")
    delete.add_argument("name", help="the topic's name")


def _topic_alter_command(topic_commands: Any) -> None:
    alter = _command(
        topic_commands,
        "alter",
        "change a topic's configs or add partitions (applied at once, kept on restart)",
    )
    alter.add_argument("name", help="the topic's name")
    alter.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a config to change, e.g. retention.ms=3600000 (repeatable; the others keep "
        "their values)",
    )
    alter.add_argument(
        "--last-value",
        action="store_true",
        help="start keeping the last value per key (map and last-value durables)",
    )
    alter.add_argument("--key-field", help="with --last-value: take the keys from this JSON field")
    alter.add_argument(
        "--partitions",
        type=int,
        help="grow to this many partitions in all (never fewer; keyed routing changes)",
    )


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
    _encodings(produce)
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
        choices=["appended", "fsynced", "read-uncommitted", "read-committed"],
        default="appended",
        help="reliable topics: acknowledge after the append, or after an fsync covers it "
        "(read-uncommitted and read-committed: the old names, deprecated)",
    )
    produce.add_argument(
        "--transactional-id",
        metavar="ID",
        help="send every message in one transaction of this transactional id: committed "
        "once all are acknowledged, else aborted (reliable topics, at-least-once)",
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
        choices=["exclusive", "shared", "failover", "key-shared"],
        type=lambda name: name.replace("_", "-"),  # key_shared, as the Python API spells it
        default="exclusive",
        help="subscription type (default exclusive; key_shared is taken for key-shared)",
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
        help="attach to partition P only: the server sends this consumer nothing else, and "
        "the subscription keeps the other partitions' messages",
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
        metavar="earliest|latest|snapshot|OFFSET",
        help="where a new reliable subscription starts (default latest); snapshot: the newest "
        "compaction snapshot (one value per key), then the log after it",
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
    _encodings(get)
    set_ = _command(map_commands, "set", "write a key (the first write enables last-value state)")
    set_.add_argument("topic", help="a reliable topic")
    set_.add_argument("key", help="the key")
    set_.add_argument("value", help="the value")
    set_.add_argument("--revision", type=int, help="only if the key is at this revision")
    _encodings(set_)
    delete = _command(map_commands, "delete", "delete a key")
    delete.add_argument("topic", help="a topic with last-value state")
    delete.add_argument("key", help="the key")
    _encodings(delete, value=False)
    scan = _command(map_commands, "scan", "print keys and values in key order")
    scan.add_argument("topic", help="a topic with last-value state")
    scan.add_argument("--prefix", default="", help="only keys starting with this")
    scan.add_argument(
        "--limit", type=int, default=100, help="keys per page (default 100; at most 1000)"
    )
    scan.add_argument("--all", action="store_true", help="fetch page after page until done")
    _encodings(scan)
    size = _command(map_commands, "size", "print the number of keys")
    size.add_argument("topic", help="a topic with last-value state")


def _subscription_commands(commands: Any) -> None:
    subscription = _command(
        commands, "subscription", "list, reset and delete reliable subscriptions"
    )
    subscription_commands = subscription.add_subparsers(dest="subscription_command", required=True)
    listing = _command(
        subscription_commands,
        "list",
        "subscriptions with backlog, lag, unacked, redelivering and dead-lettered per partition",
    )
    listing.add_argument("topic", nargs="?", help="only this topic's (default: every topic's)")
    for name, help_ in (
        ("reset", "move a subscription; its unacknowledged messages are forgotten"),
        ("seek", "the same as reset"),
    ):
        reset = _command(subscription_commands, name, help_)
        reset.add_argument("topic", help="the topic")
        reset.add_argument("subscription", help="the subscription")
        reset.add_argument("--to", required=True, metavar=RESET_TO, help=RESET_HELP)
    remove = _command(subscription_commands, "delete", "delete a subscription")
    remove.add_argument("topic", help="the topic")
    remove.add_argument("subscription", help="the subscription")


def _server_commands(commands: Any) -> None:
    server = _command(commands, "server", "about the server")
    server_commands = server.add_subparsers(dest="server_command", required=True)
    _command(
        server_commands,
        "info",
        "version, uptime, connections, topics, subscriptions and data directory usage",
    )
