"""The `headwater` command: run a server, manage topics, produce and consume.

Every client command takes `--server HOST:PORT` (default `$HEADWATER_SERVER`, else
127.0.0.1:6650), `--token` (default `$HEADWATER_TOKEN`) and `--tls` with `--ca`, `--cert`,
`--cert-key`; `headwater token` manages a tokens file (headwater/token_cli.py). A failure prints one
line, `headwater: error: CODE: message`, to stderr and exits with status 1; bad usage exits with
status 2 (argparse's convention). Nothing that failed reports success: `consume` exits 1 when its
connection is lost (unless `--reconnect` brings it back), and an at-most-once `produce` waits a
round trip for refusals before it says it produced.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from headwater import compact_cli, token_cli
from headwater.auth import Tls
from headwater.cli_output import describe_text, format_message, progress_bar, text_or_base64
from headwater.client import DISPATCH_NAMES, Client, connect
from headwater.producer import (
    AtLeastOnce,
    AtMostOnce,
    Isolation,
    Producer,
    ProducerConfig,
    RetryPolicy,
)
from wire.errors import HeadwaterError
from wire.records import Compression

DEFAULT_SERVER = "127.0.0.1:6650"
# how long an at-most-once `produce` waits for the server to refuse what it sent
AT_MOST_ONCE_CONFIRM_TIMEOUT = 5.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headwater", description="Headwater message server")
    commands = parser.add_subparsers(dest="command", required=True)

    client_options = argparse.ArgumentParser(add_help=False)
    client_options.add_argument(
        "--server",
        default=os.environ.get("HEADWATER_SERVER", DEFAULT_SERVER),
        help="HOST:PORT of the server (env HEADWATER_SERVER, default %(default)s)",
    )
    client_options.add_argument(
        "--token",
        default=os.environ.get("HEADWATER_TOKEN"),
        help="authenticate with this token (env HEADWATER_TOKEN)",
    )
    client_options.add_argument("--tls", action="store_true", help="connect with TLS")
    client_options.add_argument("--ca", type=Path, help="verify the server with this CA (PEM)")
    client_options.add_argument("--cert", type=Path, help="TLS client certificate (PEM)")
    # (--key is the message key of produce and consume)
    client_options.add_argument(
        "--cert-key", type=Path, help="the client certificate's private key (PEM)"
    )

    serve = commands.add_parser("serve", help="run a server")
    serve.add_argument("--config", type=Path, help="TOML configuration file (flags override it)")
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 6650; 0 picks a free one)")
    serve.add_argument("--data-dir", type=Path, help="data directory (default ./data)")
    serve.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    serve.add_argument(
        "--http-port",
        type=int,
        help="HTTP port for /metrics, /healthz, /readyz and the status page (default: none; "
        "0 picks a free one)",
    )
    serve.add_argument("--http-port-file", type=Path, help="write the bound HTTP port here")
    serve.add_argument("--log-format", choices=["console", "json"])
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--auth-tokens", type=Path, help="tokens file: clients must authenticate")
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --host without authentication",
    )
    serve.add_argument("--tls-cert", type=Path, help="TLS certificate chain (PEM)")
    serve.add_argument("--tls-key", type=Path, help="TLS private key (PEM)")
    serve.add_argument("--tls-client-ca", type=Path, help="verify client certificates (mTLS)")

    topic = commands.add_parser("topic", help="create, list, describe and delete topics")
    topic_commands = topic.add_subparsers(dest="topic_command", required=True)
    create = topic_commands.add_parser("create", parents=[client_options])
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--dispatch", choices=["non-reliable", "reliable"], default="non-reliable")
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
    topic_commands.add_parser("list", parents=[client_options])
    describe = topic_commands.add_parser("describe", parents=[client_options])
    describe.add_argument("name")
    delete = topic_commands.add_parser("delete", parents=[client_options])
    delete.add_argument("name")

    produce = commands.add_parser(
        "produce",
        parents=[client_options],
        help="send the VALUEs, or else one message per line of standard input",
    )
    produce.add_argument("topic")
    produce.add_argument("values", nargs="*", metavar="VALUE")
    produce.add_argument("--key", help="the key of every message")
    produce.add_argument(
        "--key-separator",
        metavar="SEP",
        help="split each value at the first SEP into key and value",
    )
    produce.add_argument(
        "--delivery", choices=["at-least-once", "at-most-once"], default="at-least-once"
    )
    produce.add_argument("--retries", type=int, default=5, help="at-least-once retries")
    produce.add_argument("--batch-size", type=int, default=64 * 1024, metavar="BYTES")
    produce.add_argument("--linger-ms", type=float, default=0.0)
    produce.add_argument(
        "--compression", choices=["none", "gzip", "snappy", "lz4", "zstd"], default="none"
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
    produce.add_argument("--size", type=int, default=100, help="bytes per generated message")

    consume = commands.add_parser("consume", parents=[client_options], help="print messages")
    consume.add_argument("topic")
    consume.add_argument("--subscription", "-s", required=True)
    consume.add_argument("--type", choices=["exclusive", "shared", "failover"], default="exclusive")
    consume.add_argument("--name", help="consumer name (Failover orders by priority, then name)")
    consume.add_argument("--priority", type=int, default=0)
    consume.add_argument("--count", "-n", type=int, help="exit after N messages")
    consume.add_argument("--format", choices=["text", "json"], default="text")
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
        "--durable",
        choices=["default", "none", "standard", "shared", "last-value", "map"],
        default="default",
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

    map_parser = commands.add_parser("map", help="read and write a map durable")
    map_commands = map_parser.add_subparsers(dest="map_command", required=True)
    get = map_commands.add_parser("get", parents=[client_options])
    get.add_argument("topic")
    get.add_argument("key")
    set_ = map_commands.add_parser("set", parents=[client_options])
    set_.add_argument("topic")
    set_.add_argument("key")
    set_.add_argument("value")
    set_.add_argument("--revision", type=int, help="only if the key is at this revision")
    delete_ = map_commands.add_parser("delete", parents=[client_options])
    delete_.add_argument("topic")
    delete_.add_argument("key")
    scan = map_commands.add_parser("scan", parents=[client_options])
    scan.add_argument("topic")
    scan.add_argument("--prefix", default="")
    scan.add_argument("--limit", type=int, default=100)
    size = map_commands.add_parser("size", parents=[client_options])
    size.add_argument("topic")

    subscription = commands.add_parser("subscription", help="manage reliable subscriptions")
    token_cli.add_parser(commands)
    subscription_commands = subscription.add_subparsers(dest="subscription_command", required=True)
    seek = subscription_commands.add_parser(
        "seek", parents=[client_options], help="move a subscription; unacked messages are dropped"
    )
    seek.add_argument("topic")
    seek.add_argument("subscription")
    seek.add_argument("--to", required=True, metavar="earliest|latest|OFFSET")
    remove = subscription_commands.add_parser("delete", parents=[client_options])
    remove.add_argument("topic")
    remove.add_argument("subscription")

    compact_cli.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    # argparse cannot take positionals on both sides of an option ("produce T --key k v1 v2"):
    # collect the leftovers and give them to produce, the one command that has free values.
    args, extra = parser.parse_known_args(argv)
    if extra and (args.command != "produce" or any(e.startswith("-") for e in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.values = [*args.values, *extra]
    if args.command == "serve":
        return _serve(args)
    if args.command == "token":
        return token_cli.run(args)
    if args.command == "compact":
        return compact_cli.run_compact(args)
    try:
        return asyncio.run(_run_client_command(args))
    except HeadwaterError as exc:
        print(f"headwater: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"headwater: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _serve(args: argparse.Namespace) -> int:
    from server.config import ServerConfig
    from server.config_file import ConfigError, check, load_config, with_overrides
    from server.serve import StartupError, run

    try:
        config = load_config(args.config) if args.config else ServerConfig()
    except ConfigError as exc:
        print(f"headwater: error: {exc}", file=sys.stderr)
        return 2
    config = with_overrides(
        config,
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        port_file=args.port_file,
        http_port=args.http_port,
        http_port_file=args.http_port_file,
        log_format=args.log_format,
        log_level=args.log_level,
    )
    flags = {
        "auth_tokens": args.auth_tokens,
        "insecure": args.insecure or None,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "tls_client_ca": args.tls_client_ca,
    }
    security = dataclasses.replace(
        config.security, **{k: v for k, v in flags.items() if v is not None}
    )
    config = dataclasses.replace(config, security=security)
    try:
        check(config, "command line")
    except ConfigError as exc:
        print(f"headwater: error: {exc}", file=sys.stderr)
        return 2
    if not 0 <= config.port < 65536:
        print(f"headwater: error: port {config.port} is out of range", file=sys.stderr)
        return 2
    if config.http_port is not None and not 0 <= config.http_port < 65536:
        print(f"headwater: error: http port {config.http_port} is out of range", file=sys.stderr)
        return 2
    if config.object_store.backend not in ("local", "s3", "none"):
        print(
            f"headwater: error: object_store.backend must be local, s3 or none, "
            f"not {config.object_store.backend!r}",
            file=sys.stderr,
        )
        return 2
    if config.object_store.backend == "s3" and not config.object_store.bucket:
        print("headwater: error: object_store.bucket is required for s3", file=sys.stderr)
        return 2
    try:
        run(config)
    except StartupError as exc:
        print(f"headwater: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a signal before the handlers were installed
        return 130
    return 0


async def _run_client_command(args: argparse.Namespace) -> int:
    tls = Tls(args.ca, args.cert, args.cert_key) if args.tls or args.ca or args.cert else None
    client = await connect(
        args.server, reconnect=getattr(args, "reconnect", False), token=args.token, tls=tls
    )
    try:
        if args.command == "topic":
            return await _topic(client, args)
        if args.command == "produce":
            return await _produce(client, args)
        if args.command == "subscription":
            return await _subscription(client, args)
        if args.command == "map":
            return await _map(client, args)
        return await _consume(client, args)
    finally:
        await client.close()


async def _topic(client: Client, args: argparse.Namespace) -> int:
    if args.topic_command == "create":
        configs = {}
        for item in args.config:
            name, separator, value = item.partition("=")
            if not separator or not name:
                raise ValueError(f"--config takes NAME=VALUE, not {item!r}")
            configs[name] = value
        if args.last_value:
            configs["last.value"] = "true"
        if args.key_field:
            configs["key.field"] = args.key_field
        await client.create_topic(args.name, args.partitions, args.dispatch, configs)
        print(f"created topic {args.name}")
    elif args.topic_command == "delete":
        await client.delete_topic(args.name)
        print(f"deleted topic {args.name}")
    elif args.topic_command == "list":
        for topic in await client.list_topics():
            print(
                f"{topic.name}\tpartitions={topic.partitions}\tdispatch={DISPATCH_NAMES[topic.dispatch]}"
            )
    else:
        print(describe_text(await client.describe_topic(args.name)))
    return 0


def _producer_config(args: argparse.Namespace) -> ProducerConfig:
    if args.retries < 0 or args.batch_size < 1 or args.linger_ms < 0:
        raise ValueError("--retries, --batch-size and --linger-ms must not be negative")
    delivery: AtMostOnce | AtLeastOnce = (
        AtMostOnce()
        if args.delivery == "at-most-once"
        else AtLeastOnce(RetryPolicy(max_retries=args.retries))
    )
    return ProducerConfig(
        delivery=delivery,
        batch_size=args.batch_size,
        linger=args.linger_ms / 1000,
        compression=Compression[args.compression.upper()],
        idempotent=args.idempotent,
        isolation=Isolation.READ_COMMITTED
        if args.isolation == "read-committed"
        else Isolation.READ_UNCOMMITTED,
    )


async def _produce(client: Client, args: argparse.Namespace) -> int:
    if args.key is not None and args.key_separator is not None:
        raise ValueError("use either --key or --key-separator, not both")
    producer = client.producer(args.topic, _producer_config(args))
    if args.count is not None:
        return await _generate(producer, args)
    values = args.values or (line.rstrip("\n") for line in sys.stdin)
    sent = 0
    for text in values:
        key = args.key
        if args.key_separator is not None:
            key, separator, text = text.partition(args.key_separator)
            if not separator:
                raise ValueError(f"line has no key separator {args.key_separator!r}: {key!r}")
        await producer.send(text.encode(), key=key.encode() if key is not None else None)
        sent += 1
    await _settle(producer, args)
    print(f"produced {sent} messages to {args.topic}", file=sys.stderr)
    return 0


async def _generate(producer: Producer, args: argparse.Namespace) -> int:
    """Load generation: --count messages of --size bytes, with a progress bar on stderr."""
    if args.count < 1 or args.size < 0:
        raise ValueError("--count must be at least 1 and --size at least 0")
    value = b"x" * args.size
    key = args.key.encode() if args.key is not None else None
    started = time.monotonic()
    next_update = started
    for sent in range(1, args.count + 1):
        await producer.send(value, key=key)
        if time.monotonic() >= next_update or sent == args.count:
            progress_bar(sent, args.count, started)
            next_update = time.monotonic() + 0.25
    await _settle(producer, args)
    elapsed = time.monotonic() - started
    print(
        f"\nproduced {args.count} messages of {args.size} bytes to {args.topic} in "
        f"{elapsed:.2f}s ({args.count / elapsed:,.0f} msg/s, "
        f"{args.count * args.size / elapsed / 1e6:,.1f} MB/s)",
        file=sys.stderr,
    )
    return 0


async def _settle(producer: Producer, args: argparse.Namespace) -> None:
    """Raise the first error of the sends. At-most-once frames are answered only when refused,
    so wait a round trip for refusals: otherwise `produce nosuch` would report success."""
    if args.delivery == "at-most-once":
        await producer.confirm(timeout=AT_MOST_ONCE_CONFIRM_TIMEOUT)
    else:
        await producer.flush()


def _position(text: str) -> str | int:
    if text in ("earliest", "latest"):
        return text
    if text.isdigit():
        return int(text)
    raise ValueError(f"position must be earliest, latest or an offset, not {text!r}")


async def _subscription(client: Client, args: argparse.Namespace) -> int:
    if args.subscription_command == "seek":
        await client.seek(args.topic, args.subscription, _position(args.to))  # type: ignore[arg-type]
        print(f"moved {args.subscription} on {args.topic} to {args.to}")
    else:
        await client.delete_subscription(args.topic, args.subscription)
        print(f"deleted subscription {args.subscription} on {args.topic}")
    return 0


async def _consume(client: Client, args: argparse.Namespace) -> int:
    if args.count is not None and args.count < 1:
        raise ValueError("--count must be at least 1")
    consumer = await client.subscribe(
        args.topic,
        args.subscription,
        type=args.type,
        name=args.name,
        priority=args.priority,
        limit=args.count,
        start=_position(args.start),  # type: ignore[arg-type]
        durable=args.durable,
        keys=args.key,
        key_prefix=args.key_prefix,
        on_dropped=_warn_dropped,
    )
    received = 0
    async for message in consumer:
        print(format_message(message, args.format), flush=True)
        if not args.no_ack:
            await message.ack()
        received += 1
        if args.count is not None and received >= args.count:
            break
    await consumer.close()
    return 0


def _warn_dropped(count: int) -> None:
    print(
        f"headwater: warning: missed {count} messages (the consumer fell behind)", file=sys.stderr
    )


async def _map(client: Client, args: argparse.Namespace) -> int:
    table = client.map(args.topic)
    if args.map_command == "get":
        entry = await table.get(args.key)
        if entry is None:
            print(f"headwater: key {args.key!r} not found in {args.topic}", file=sys.stderr)
            return 1
        print(entry.value.decode(errors="backslashreplace"))
    elif args.map_command == "set":
        revision = await table.set(args.key, args.value, revision=args.revision)
        print(f"revision {revision}")
    elif args.map_command == "delete":
        if await table.get(args.key) is None:
            print(f"headwater: key {args.key!r} not found in {args.topic}", file=sys.stderr)
            return 1
        await table.delete(args.key)
        print(f"deleted {args.key}")
    elif args.map_command == "scan":
        if args.limit < 1:
            raise ValueError("--limit must be at least 1")
        page = await table.scan(args.prefix, args.limit)
        for entry in page.entries:
            key, _ = text_or_base64(entry.key)
            value, _ = text_or_base64(entry.value)
            print(f"{key}\t{value}")
    else:
        print(await table.size())
    return 0


if __name__ == "__main__":
    sys.exit(main())
