"""The `headwater` command: run a server, manage topics, produce and consume.

Every client command takes the global options `--server HOST:PORT` (default `$HEADWATER_SERVER`,
else 127.0.0.1:6650), `--token` (default `$HEADWATER_TOKEN`), `--tls` with `--ca`, `--cert`,
`--cert-key`, and `--format`, before or after the command (headwater/cli/parser.py); docs/CLI.md
describes every command and the JSON it prints. `headwater token` manages a tokens file
(headwater/cli/token_commands.py). A failure prints one line, `headwater: error: CODE: message`, to
stderr and exits with status 1; bad usage exits with status 2 (argparse's convention). Nothing that
failed reports success: `consume` exits 1 when its connection is lost (unless `--reconnect` brings
it back), and an at-most-once `produce` waits a round trip for refusals before it says it produced.
The commands themselves live in headwater/cli/client_commands.py and
headwater/cli/consume_command.py.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from headwater.cli import (
    client_commands,
    cluster_commands,
    compact_command,
    schema_commands,
    token_commands,
)
from headwater.cli.consume_command import consume
from headwater.cli.parser import add_client_commands, add_global_options
from headwater.client.client import connect
from headwater.client.credentials import Tls
from headwater.server.build_info import version
from headwater.wire.errors import HeadwaterError

# the formats each command prints (`--format`); the first is the default
FORMATS = {
    "topic create": ("table", "json"),
    "topic list": ("table", "json"),
    "topic describe": ("table", "json"),
    "topic alter": ("table", "json"),
    "topic delete": ("table", "json"),
    "subscription list": ("table", "json"),
    "subscription reset": ("table", "json"),
    "subscription seek": ("table", "json"),
    "subscription delete": ("table", "json"),
    "server info": ("table", "json"),
    "map scan": ("table", "json"),
    "consume": ("text", "json"),
    "compact": ("text", "json"),
    **schema_commands.FORMATS,
    **cluster_commands.FORMATS,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headwater", description="Headwater message server")
    parser.add_argument(
        "--version", action="version", version=f"headwater {version()}", help="print the version"
    )
    add_global_options(parser, suppress=False)
    commands = parser.add_subparsers(dest="command", required=True)

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
    serve.add_argument(
        "--kafka-port",
        type=int,
        help="serve the Kafka protocol on this port too (default: none; 0 picks a free one; "
        "docs/KAFKA.md)",
    )
    serve.add_argument("--kafka-port-file", type=Path, help="write the bound Kafka port here")
    serve.add_argument(
        "--trace-every",
        type=int,
        metavar="N",
        help="trace every N-th offset's stages, served at /debug/stages (default 0: off)",
    )
    serve.add_argument("--log-format", choices=["console", "json"], help="log lines on stderr")
    serve.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="the least severe log level written (default info)",
    )
    serve.add_argument("--auth-tokens", type=Path, help="tokens file: clients must authenticate")
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --host without authentication",
    )
    serve.add_argument("--tls-cert", type=Path, help="TLS certificate chain (PEM)")
    serve.add_argument("--tls-key", type=Path, help="TLS private key (PEM)")
    serve.add_argument("--tls-client-ca", type=Path, help="verify client certificates (mTLS)")
    serve.add_argument(
        "--cluster", metavar="etcd://HOST:PORT", help="join a cluster coordinated by this etcd"
    )
    serve.add_argument("--advertise", metavar="HOST:PORT", help="where clients reach this broker")
    serve.add_argument("--broker-id", help="this broker's id in the cluster (default: --advertise)")

    add_client_commands(commands)
    schema_commands.add_parser(commands)
    token_commands.add_parser(commands)
    compact_command.add_parser(commands)
    cluster_commands.add_parser(commands)
    return parser


def _command_parser(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The parser of the command that was given (`topic list`'s, not `headwater`'s), so that its
    errors show its own usage."""
    names = [args.command, getattr(args, f"{args.command}_command", None)]
    for name in names:
        choices = next(
            (a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None
        )
        if name is None or not choices or name not in choices:
            break
        parser = choices[name]
    return parser


def _command_name(args: argparse.Namespace) -> str:
    sub = getattr(args, f"{args.command}_command", None)
    return f"{args.command} {sub}" if sub else args.command


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    # argparse cannot take positionals on both sides of an option ("produce T --key k v1 v2"):
    # collect the leftovers and give them to produce, the one command that has free values.
    args, extra = parser.parse_known_args(argv)
    if extra and (args.command != "produce" or any(e.startswith("-") for e in extra)):
        _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.values = [*args.values, *extra]
    if args.command == "serve":
        return _serve(args)
    if args.command == "token":
        return token_commands.run(args)
    formats = FORMATS.get(_command_name(args))
    if args.format is None:
        args.format = formats[0] if formats else None
    elif formats is None or args.format not in formats:
        parser.error(
            f"headwater {_command_name(args)} has no --format"
            if formats is None
            else f"--format for {_command_name(args)} must be {' or '.join(formats)}, "
            f"not {args.format!r}"
        )
    if args.command == "compact":
        return compact_command.run_compact(args)
    if args.command == "cluster":
        return cluster_commands.run(args)
    if args.command == "produce" and args.size is not None and args.count is None:
        parser.error("--size only applies to generated messages: give --count too")
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
    from headwater.server.config import ServerConfig
    from headwater.server.config_file import ConfigError, check, load_config, with_overrides
    from headwater.server.serve import StartupError, run

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
        trace_every=args.trace_every,
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
    cluster = {"etcd": args.cluster, "advertise": args.advertise, "broker_id": args.broker_id}
    kafka = {"port": args.kafka_port, "port_file": args.kafka_port_file}
    config = dataclasses.replace(
        config,
        security=security,
        kafka=dataclasses.replace(
            config.kafka, **{k: v for k, v in kafka.items() if v is not None}
        ),
        cluster=dataclasses.replace(
            config.cluster, **{k: v for k, v in cluster.items() if v is not None}
        ),
    )
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
            return await client_commands.topic(client, args)
        if args.command == "produce":
            return await client_commands.produce(client, args)
        if args.command == "subscription":
            return await client_commands.subscription(client, args)
        if args.command == "map":
            return await client_commands.map_command(client, args)
        if args.command == "server":
            return await client_commands.server(client, args)
        if args.command == "schema":
            return await schema_commands.run(client, args)
        return await consume(client, args)
    finally:
        await client.close()


if __name__ == "__main__":
    sys.exit(main())
