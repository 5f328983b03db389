"""`headwater token create|list|revoke`: manage a server's tokens file (server/security/tokens.py).

These edit the file the server reads (`serve --auth-tokens FILE`); the server notices the change
within a second, so a revoked token stops working on live connections too, without a restart.
`create` prints the new token once, on standard output alone (capture it: only its hash is
stored); everything else goes to standard error.

    headwater token create billing --file tokens.json --allow produce:billing.* --expires 30d
    headwater token list --file tokens.json
    headwater token revoke 3f2a9c01b7de --file tokens.json     # an id, or a principal: all its
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def add_parser(commands: Any) -> None:
    token = commands.add_parser("token", help="create, list and revoke authentication tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    file_option = argparse.ArgumentParser(add_help=False)
    file_option.add_argument(
        "--file",
        type=Path,
        default=os.environ.get("HEADWATER_TOKENS_FILE"),
        help="the tokens file (env HEADWATER_TOKENS_FILE)",
    )
    create = token_commands.add_parser("create", parents=[file_option])
    create.add_argument("principal", help="who the token (or certificate) stands for")
    create.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="ACTION:PATTERN",
        help="produce, consume, admin or all, on a topic or a prefix* (repeatable)",
    )
    create.add_argument("--expires", metavar="DURATION", help="e.g. 3600s, 12h, 30d, 2w")
    create.add_argument(
        "--certificate",
        action="store_true",
        help="no token: grants for TLS client certificates with this common name",
    )
    create.add_argument(
        "--produce-bytes-per-second", type=int, metavar="N", help="produce quota (0: unlimited)"
    )
    create.add_argument(
        "--consume-bytes-per-second", type=int, metavar="N", help="consume quota (0: unlimited)"
    )
    create.add_argument("--max-connections", type=int, metavar="N", help="connections at once")
    token_commands.add_parser("list", parents=[file_option])
    revoke = token_commands.add_parser("revoke", parents=[file_option])
    revoke.add_argument(
        "selector", metavar="ID|PRINCIPAL", help="a token's id, or a principal: all its tokens"
    )


def parse_duration(text: str) -> int:
    match = re.fullmatch(r"(\d+)([smhdw]?)", text.strip())
    if match is None or int(match.group(1)) <= 0:
        raise ValueError(f"--expires takes a positive duration such as 12h or 30d, not {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2) or "s"]


def run(args: argparse.Namespace) -> int:
    from headwater.server.security.tokens import TokenFileError

    if args.file is None:
        print("headwater: error: give --file (or set HEADWATER_TOKENS_FILE)", file=sys.stderr)
        return 2
    try:
        if args.token_command == "create":
            return _create(args)
        if args.token_command == "list":
            return _list(args.file)
        return _revoke(args.file, args.selector)
    except (TokenFileError, ValueError, OSError) as exc:
        print(f"headwater: error: {exc}", file=sys.stderr)
        return 1


def _create(args: argparse.Namespace) -> int:
    from headwater.server.security.tokens import create

    quotas = {
        name: value
        for name, value in (
            ("produce_bytes_per_second", args.produce_bytes_per_second),
            ("consume_bytes_per_second", args.consume_bytes_per_second),
            ("max_connections", args.max_connections),
        )
        if value is not None
    }
    if any(v < 0 for v in quotas.values()):
        raise ValueError("quotas must not be negative")
    expires = int(time.time()) + parse_duration(args.expires) if args.expires else None
    entry, token = create(
        args.file, args.principal, tuple(args.allow), expires, quotas, args.certificate
    )
    if not entry.grants:
        print(
            "headwater: warning: no --allow given; this principal may do nothing", file=sys.stderr
        )
    print(f"created {entry.kind} {entry.id} for {entry.principal}", file=sys.stderr)
    if token is not None:
        print(token, flush=True)
    return 0


def _list(path: Path) -> int:
    from headwater.server.security.tokens import load

    now = time.time()
    for entry in load(path).values():
        state = entry.valid(now) or "valid"
        expires = (
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry.expires))
            if entry.expires
            else "never"
        )
        quotas = ",".join(f"{k}={v}" for k, v in entry.quotas.items()) or "-"
        print(
            f"{entry.id}\t{entry.principal}\t{entry.kind}\t{state}\texpires={expires}\t"
            f"grants={','.join(entry.grants) or '-'}\tquotas={quotas}"
        )
    return 0


def _revoke(path: Path, selector: str) -> int:
    from headwater.server.security.tokens import revoke

    revoked = revoke(path, selector)
    if not revoked:
        print(f"headwater: error: no token id or principal {selector!r} in {path}", file=sys.stderr)
        return 1
    for entry in revoked:
        print(f"revoked {entry.kind} {entry.id} of {entry.principal}")
    return 0
