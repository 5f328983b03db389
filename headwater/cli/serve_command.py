"""`headwater serve`: its options and the server's start, in a module that does not import the
client library.

`headwater/cli/entry.py` (behind `headwater` and `python -m headwater`) comes here straight when
the first argument is `serve`, with a parser that knows only this command: a server's start then
imports the server and not the client commands (about half a second of CPU per start, and the
test suite starts hundreds of servers). The full parser (headwater/cli/main.py) adds this same
`serve` subcommand (`headwater --server X serve`, a global option first, goes that way), so both
parse a `serve` command alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from headwater.cli.arguments import not_utf8
from headwater.cli.parser import add_global_options


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """The `serve` subcommand and its options, on a parser's subcommands."""
    serve: argparse.ArgumentParser = commands.add_parser("serve", help="run a server")
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
    return serve


def main(argv: Sequence[str] | None = None) -> int:
    """`headwater serve ...` parsed as the full parser would (the global options before the
    command included), without importing the client commands."""
    parser = argparse.ArgumentParser(prog="headwater", description="Headwater message server")
    add_global_options(parser, suppress=False)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = add_parser(commands)
    args, extra = parser.parse_known_args(argv)
    if extra:
        serve.error(f"unrecognized arguments: {' '.join(extra)}")
    refused = not_utf8(args)
    if refused is not None:
        print(f"headwater: error: {refused}", file=sys.stderr)
        return 2
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Start the server the options describe; its exit status."""
    from headwater.server.config import ServerConfig
    from headwater.server.config_file import ConfigError, check, load_config, with_overrides
    from headwater.server.serve import StartupError
    from headwater.server.serve import run as serve_until_stopped

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
        serve_until_stopped(config)
    except StartupError as exc:
        print(f"headwater: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a signal before the handlers were installed
        return 130
    return 0
