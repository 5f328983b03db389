"""`headwater cluster status`: the brokers, their leases and partitions, as etcd records them.

It reads etcd directly (`--cluster etcd://HOST:PORT`, default `$HEADWATER_CLUSTER`), not a broker,
so it answers while brokers are down. Prints a table (default) or JSON (`--format json`, the
shape in docs/CLI.md); exits 1 with one line when etcd does not answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from headwater.cli.output import table
from headwater.cli.parser import add_global_options

FORMATS = {"cluster status": ("table", "json")}
DEFAULT_CLUSTER = "etcd://127.0.0.1:2379"


def add_parser(commands: Any) -> None:
    cluster = commands.add_parser(
        "cluster", help="inspect a cluster in etcd", description="inspect a cluster in etcd"
    )
    add_global_options(cluster, suppress=True)
    cluster_commands = cluster.add_subparsers(dest="cluster_command", required=True)
    status = cluster_commands.add_parser(
        "status",
        help="brokers, lease remaining, partitions per broker, unowned partitions",
        description="brokers, lease remaining, partitions per broker, unowned partitions",
    )
    add_global_options(status, suppress=True)
    status.add_argument(
        "--cluster",
        default=os.environ.get("HEADWATER_CLUSTER", DEFAULT_CLUSTER),
        metavar="etcd://HOST:PORT",
        help=f"etcd endpoint(s) (env HEADWATER_CLUSTER, default {DEFAULT_CLUSTER})",
    )
    status.add_argument("--prefix", default="/headwater", help="key prefix (default /headwater)")
    status.add_argument(
        "--timeout", type=float, default=3.0, help="seconds to wait for etcd (default 3)"
    )


def run(args: argparse.Namespace) -> int:
    from headwater.server.cluster.cluster_status import read_status
    from headwater.server.cluster.etcd import EtcdUnavailable

    try:
        found = asyncio.run(read_status(args.cluster, args.prefix, args.timeout))
    except ValueError as exc:
        print(f"headwater: error: {exc}", file=sys.stderr)
        return 2
    except EtcdUnavailable as exc:
        print(f"headwater: error: cannot reach etcd at {args.cluster}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(found, indent=2) if args.format == "json" else status_text(found))
    return 0


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}s"


def status_text(found: dict[str, Any]) -> str:
    rows = [["BROKER", "ADDRESS", "LEASE LEFT", "AGE", "PARTITIONS"]]
    for broker in found["brokers"]:
        rows.append(
            [
                broker["id"],
                f"{broker['host']}:{broker['port']}",
                _seconds(broker["lease_remaining"]),
                _seconds(broker["age"]),
                str(len(broker["partitions"])),
            ]
        )
    lines = [f"cluster {found['endpoint']} ({found['prefix']})"]
    lines.append(table(rows) if found["brokers"] else "no brokers registered")
    if found["partitions"]:
        lines.append("")
        partition_rows = [["TOPIC", "PARTITION", "OWNER", "EPOCH"]]
        for p in found["partitions"]:
            epoch = "-" if p["epoch"] is None else str(p["epoch"])
            partition_rows.append([p["topic"], str(p["partition"]), p["owner"] or "-", epoch])
        lines.append(table(partition_rows))
    unowned = ", ".join(f"{u['topic']}/{u['partition']}" for u in found["unowned"])
    lines.append(f"unowned partitions: {unowned or 'none'}")
    return "\n".join(lines)
