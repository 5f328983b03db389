"""The client commands of `headwater` other than consume: topic, produce, map, subscription.

Each takes a connected `Client` and the parsed arguments, prints its result on standard output
(notes and progress on standard error) and returns the exit status; errors are raised
(`HeadwaterError` from the server, `ValueError` for bad input) and printed by `cli.main`.
"""

from __future__ import annotations

import argparse
import sys
import time

from headwater import cli_schema
from headwater.cli_output import (
    describe_json,
    describe_text,
    map_entry_json,
    progress_bar,
    text_or_base64,
    topics_json,
    topics_table,
)
from headwater.client import Client
from headwater.producer import (
    AtLeastOnce,
    AtMostOnce,
    Isolation,
    Producer,
    ProducerConfig,
    RetryPolicy,
)
from headwater.wire.records import Compression

# how long an at-most-once `produce` waits for the server to refuse what it sent
AT_MOST_ONCE_CONFIRM_TIMEOUT = 5.0
DEFAULT_GENERATED_SIZE = 100


def name_values(items: list[str], option: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        name, separator, value = item.partition("=")
        if not separator or not name:
            raise ValueError(f"{option} takes NAME=VALUE, not {item!r}")
        pairs[name] = value
    return pairs


async def topic(client: Client, args: argparse.Namespace) -> int:
    if args.topic_command == "create":
        configs = name_values(args.config, "--config")
        if args.last_value:
            configs["last.value"] = "true"
        if args.key_field:
            configs["key.field"] = args.key_field
        configs.update(cli_schema.topic_configs(args))
        await client.create_topic(args.name, args.partitions, args.dispatch, configs)
        print(f"created topic {args.name} ({args.dispatch})")
    elif args.topic_command == "delete":
        await client.delete_topic(args.name)
        print(f"deleted topic {args.name}")
    elif args.topic_command == "list":
        topics = await client.list_topics()
        print(topics_json(topics) if args.format == "json" else topics_table(topics))
    else:
        description = await client.describe_topic(args.name)
        print(describe_json(description) if args.format == "json" else describe_text(description))
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


async def produce(client: Client, args: argparse.Namespace) -> int:
    if args.key is not None and args.key_separator is not None:
        raise ValueError("use either --key or --key-separator, not both")
    if args.partition is not None and args.partition < 0:
        raise ValueError(f"--partition must be at least 0, not {args.partition}")
    headers = {k: v.encode() for k, v in name_values(args.header, "--header").items()}
    if args.count is not None:
        return await _generate(client.producer(args.topic, _producer_config(args)), args, headers)
    codec = await client.schema_codec(args.topic)  # values are read as the topic's schema says
    producer = client.producer(args.topic, _producer_config(args), schema=codec)
    values = args.values or (line.rstrip("\n") for line in sys.stdin)
    sent = 0
    for text in values:
        key = args.key
        if args.key_separator is not None:
            key, separator, text = text.partition(args.key_separator)
            if not separator:
                raise ValueError(f"line has no key separator {args.key_separator!r}: {key!r}")
        await producer.send(
            cli_schema.text_value(codec, text),
            key=key.encode() if key is not None else None,
            headers=headers,
            partition=args.partition,
        )
        sent += 1
    await _settle(producer, args)
    print(f"produced {sent} messages to {args.topic}", file=sys.stderr)
    return 0


async def _generate(producer: Producer, args: argparse.Namespace, headers: dict[str, bytes]) -> int:
    """Load generation: --count messages of --size bytes, with a progress bar on a terminal."""
    size = DEFAULT_GENERATED_SIZE if args.size is None else args.size
    if args.count < 1 or size < 0:
        raise ValueError("--count must be at least 1 and --size at least 0")
    if args.values:
        raise ValueError("--count generates the values: give no VALUE")
    value = b"x" * size
    key = args.key.encode() if args.key is not None else None
    started = time.monotonic()
    next_update = started
    for sent in range(1, args.count + 1):
        await producer.send(value, key=key, headers=headers, partition=args.partition)
        if time.monotonic() >= next_update or sent == args.count:
            progress_bar(sent, args.count, started)
            next_update = time.monotonic() + 0.25
    await _settle(producer, args)
    elapsed = time.monotonic() - started
    newline = "\n" if sys.stderr.isatty() else ""  # ends the bar's line
    print(
        f"{newline}produced {args.count} messages of {size} bytes to {args.topic} in "
        f"{elapsed:.2f}s ({args.count / elapsed:,.0f} msg/s, "
        f"{args.count * size / elapsed / 1e6:,.1f} MB/s)",
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


def position(text: str) -> str | int:
    if text in ("earliest", "latest"):
        return text
    if text.isdigit():
        return int(text)
    raise ValueError(f"position must be earliest, latest or an offset, not {text!r}")


async def subscription(client: Client, args: argparse.Namespace) -> int:
    if args.subscription_command == "seek":
        await client.seek(args.topic, args.subscription, position(args.to))  # type: ignore[arg-type]
        print(f"moved {args.subscription} on {args.topic} to {args.to}")
    else:
        await client.delete_subscription(args.topic, args.subscription)
        print(f"deleted subscription {args.subscription} on {args.topic}")
    return 0


async def map_command(client: Client, args: argparse.Namespace) -> int:
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
        await _scan(client, args)
    else:
        print(await table.size())
    return 0


# pages a `map scan --all` fetches at most: 10 million keys at the largest page size
MAX_SCAN_PAGES = 10_000


async def _scan(client: Client, args: argparse.Namespace) -> None:
    """One page, or with --all every page; without --all a note on stderr says more exist."""
    if not 1 <= args.limit <= 1000:
        raise ValueError("--limit must be 1..1000")
    table = client.map(args.topic)
    cursor = b""
    for _ in range(MAX_SCAN_PAGES):
        page = await table.scan(args.prefix, args.limit, cursor)
        for entry in page.entries:
            if args.format == "json":
                print(map_entry_json(entry.key, entry.value, entry.revision))
            else:
                key, _ = text_or_base64(entry.key)
                value, _ = text_or_base64(entry.value)
                print(f"{key}\t{value}")
        cursor = page.cursor
        if not cursor:
            return
        if not args.all:
            print(
                f"headwater: more keys after {text_or_base64(cursor)[0]!r}: "
                "use --all to fetch every page (or a larger --limit)",
                file=sys.stderr,
            )
            return
    raise ValueError(f"map scan stopped after {MAX_SCAN_PAGES} pages: use a larger --limit")
