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
import logging
import os
import sys
from collections.abc import Sequence

from headwater.cli import (
    client_commands,
    cluster_commands,
    compact_command,
    schema_commands,
    serve_command,
    token_commands,
)
from headwater.cli.arguments import not_utf8
from headwater.cli.consume_command import consume
from headwater.cli.parser import add_client_commands, add_global_options
from headwater.client.broker_connection import SILENT_CLOSE
from headwater.client.client import connect
from headwater.client.credentials import Tls
from headwater.client.port_probe import silent_port
from headwater.server.build_info import version
from headwater.wire.errors import ConnectionLost, HeadwaterError

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


class _NoticeFormat(logging.Formatter):
    """The library's warnings as the CLI's own lines: `headwater: warning: ...` (issue 41:
    `--reconnect`'s "...; reconnecting" came bare, through logging's last-resort handler)."""

    def format(self, record: logging.LogRecord) -> str:
        return f"headwater: {record.levelname.lower()}: {record.getMessage()}"


_NOTICES = logging.StreamHandler()  # writes to sys.stderr as it is when a notice comes
_NOTICES.setFormatter(_NoticeFormat())
_NOTICES.setLevel(logging.WARNING)


def _show_library_notices() -> None:
    """The client library's warnings (a lost connection being reconnected, a dropped message)
    printed with the CLI's prefix; `serve` configures its own logging instead."""
    library = logging.getLogger("headwater")  # the client library's loggers, all below it
    if _NOTICES not in library.handlers:
        library.addHandler(_NOTICES)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headwater", description="Headwater message server")
    parser.add_argument(
        "--version", action="version", version=f"headwater {version()}", help="print the version"
    )
    add_global_options(parser, suppress=False)
    # not required here: main() says so itself, naming an unknown option given instead
    # (`headwater --bogus-flag` would otherwise say only that a command is required)
    commands = parser.add_subparsers(dest="command", required=False)

    serve_command.add_parser(commands)

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
    if args.command is None:  # the usage above the error lists the commands
        unknown = [e for e in extra if e.startswith("-")]
        parser.error(
            f"unrecognized arguments: {' '.join(unknown)}, and no command"
            if unknown
            else "the following arguments are required: command"
        )
    if extra and (args.command != "produce" or any(e.startswith("-") for e in extra)):
        _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.values = [*args.values, *extra]
    refused = not_utf8(args)
    if refused is not None:  # before anything connects (headwater/cli/arguments.py)
        print(f"headwater: error: {refused}", file=sys.stderr)
        return 2 if args.command == "serve" else 1
    if args.command == "serve":
        return serve_command.run(args)
    if args.command == "token":
        return token_commands.run(args)
    _show_library_notices()
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
    except ConnectionLost as exc:
        if SILENT_CLOSE in exc.message:  # a TLS port or a Kafka listener? ask the port
            exc.message = exc.message.replace(SILENT_CLOSE, asyncio.run(_silent(args)))
        print(f"headwater: error: {exc}", file=sys.stderr)
        return 1
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


async def _silent(args: argparse.Namespace) -> str:
    """Why the server closed the connection before any answer, said with the option to use."""
    kind = await silent_port(args.server)
    if kind == "tls" and not (args.tls or args.ca or args.cert):
        return (
            f"{args.server} speaks TLS and closed the connection, which was not TLS: give --tls "
            "(and --ca FILE when the server's certificate is from a private CA)"
        )
    if kind == "kafka":
        return (
            f"{args.server} is a Kafka listener (serve --kafka-port), which Kafka clients use: "
            "headwater commands go to the server's message port, --port (default 6650)"
        )
    return SILENT_CLOSE


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
