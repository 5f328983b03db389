"""The client commands of `headwater` other than consume: topic, produce, map, subscription,
server.

Each takes a connected `Client` and the parsed arguments, prints its result on standard output
(notes and progress on standard error) and returns the exit status; errors are raised
(`HeadwaterError` from the server, `ValueError` for bad input) and printed by `cli.main`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from datetime import UTC, datetime

from headwater.cli import schema_commands
from headwater.cli.output import (
    describe_json,
    describe_text,
    map_entry_json,
    plural,
    progress_bar,
    server_info_record,
    server_info_text,
    subscription_record,
    subscriptions_table,
    text_or_base64,
    topic_record,
    topic_text,
    topics_json,
    topics_table,
)
from headwater.client.admin_calls import StartName
from headwater.client.client import DISPATCH_NAMES, Client
from headwater.client.producer import (
    AtLeastOnce,
    AtMostOnce,
    Isolation,
    Producer,
    ProducerConfig,
    RetryPolicy,
)
from headwater.wire.errors import TopicExists
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


def _emit(args: argparse.Namespace, record: object, text: str) -> None:
    print(json.dumps(record, ensure_ascii=False) if args.format == "json" else text)


async def topic(client: Client, args: argparse.Namespace) -> int:
    if args.topic_command == "create":
        return await topic_create(client, args)
    if args.topic_command == "alter":
        return await topic_alter(client, args)
    if args.topic_command == "delete":
        await client.delete_topic(args.name)
        _emit(args, {"name": args.name, "deleted": True}, f"deleted topic {args.name}")
    elif args.topic_command == "list":
        topics = await client.list_topics()
        print(topics_json(topics) if args.format == "json" else topics_table(topics))
    else:
        description = await client.describe_topic(args.name)
        print(describe_json(description) if args.format == "json" else describe_text(description))
    return 0


async def topic_create(client: Client, args: argparse.Namespace) -> int:
    configs = name_values(args.config, "--config")
    if args.last_value:
        configs["last.value"] = "true"
    if args.key_field:
        configs["key.field"] = args.key_field
    configs.update(schema_commands.topic_configs(args))
    created = True
    partitions, dispatch = args.partitions, args.dispatch
    try:
        await client.create_topic(args.name, partitions, dispatch, configs)
    except TopicExists:
        if not args.exist_ok:
            raise
        created = False  # say what exists, which may differ from what was asked
        existing = (await client.describe_topic(args.name)).topic
        partitions, dispatch = existing.partitions, DISPATCH_NAMES[existing.dispatch]
    record = {"name": args.name, "partitions": partitions, "dispatch": dispatch, "created": created}
    text = (
        f"created topic {args.name} ({dispatch})"
        if created
        else f"topic {args.name} exists already ({dispatch}, {plural(partitions, 'partition')})"
    )
    _emit(args, record, text)
    return 0


async def topic_alter(client: Client, args: argparse.Namespace) -> int:
    """`topic alter NAME --config K=V ... [--last-value [--key-field F]]`."""
    configs = name_values(args.config, "--config")
    if args.key_field is not None:
        if not args.last_value:
            raise ValueError("--key-field goes with --last-value")
        configs["key.field"] = args.key_field
    if not configs and not args.last_value and args.partitions is None:
        raise ValueError(
            "nothing to change: give --config NAME=VALUE, --last-value or --partitions M"
        )
    if args.partitions is not None:
        # added first: a refused count (fewer, or a last-value topic) leaves the configs as
        # they were too
        await client.create_partitions(args.name, args.partitions)
    if configs or args.last_value:
        await client.alter_topic(args.name, configs, last_value=args.last_value)
    info = (await client.describe_topic(args.name)).topic
    _emit(args, topic_record(info), f"altered topic {args.name}\n{topic_text(info)}")
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
    # the command reports the producer's first error itself (`_settle`, exit status 1): the
    # library's warning of the same refusal would print it twice
    logging.getLogger("headwater.client.producer").addHandler(logging.NullHandler())
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
            schema_commands.text_value(codec, text),
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


_NAMED: dict[str, StartName] = {"earliest": "earliest", "latest": "latest", "snapshot": "snapshot"}


def position(text: str) -> StartName | int:
    if text in _NAMED:
        return _NAMED[text]
    if text.isdigit():
        return int(text)
    raise ValueError(f"position must be earliest, latest or an offset (or snapshot), not {text!r}")


def reset_target(text: str, now_ms: int | None = None) -> tuple[StartName | int | None, int | None]:
    """`--to`: (earliest|latest|snapshot|offset, None) or (None, a time in ms since the epoch).
    A time in the future is refused: nothing is stored there yet (`--to latest` says that)."""
    if text in _NAMED:
        return _NAMED[text], None
    if text.isdigit():
        return int(text), None
    if text.startswith("@") and text[1:].isdigit():
        timestamp = int(text[1:])
    else:
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(
                "--to must be earliest, latest, snapshot, an offset, @ and ms since the epoch, "
                f"or an ISO-8601 time such as 2026-11-22T08:00:00Z; not {text!r}"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        timestamp = int(when.timestamp() * 1000)
        if timestamp < 0:
            raise ValueError(f"--to {text}: a time before 1970 holds no message")
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if timestamp > now_ms:
        raise ValueError(
            f"--to {text}: that time ({timestamp} ms) is in the future (now {now_ms} ms); "
            "to skip to the newest messages use --to latest"
        )
    return None, timestamp


async def subscription(client: Client, args: argparse.Namespace) -> int:
    command = args.subscription_command
    if command == "list":
        subscriptions = await client.list_subscriptions(args.topic)
        if args.format == "json":
            print(json.dumps([subscription_record(s) for s in subscriptions], ensure_ascii=False))
        else:
            print(subscriptions_table(subscriptions))
    elif command in ("reset", "seek"):
        to, timestamp = reset_target(args.to)
        detail = await client.reset_subscription(
            args.topic,
            args.subscription,
            to,
            timestamp=timestamp,
        )
        positions = ", ".join(f"{p.partition}:{p.committed}" for p in detail.partitions)
        _emit(
            args,
            subscription_record(detail),
            f"moved {args.subscription} on {args.topic} to {args.to} "
            f"(partition:offset {positions})",
        )
    else:
        await client.delete_subscription(args.topic, args.subscription)
        _emit(
            args,
            {"topic": args.topic, "name": args.subscription, "deleted": True},
            f"deleted subscription {args.subscription} on {args.topic}",
        )
    return 0


async def server(client: Client, args: argparse.Namespace) -> int:
    info = await client.server_info()
    _emit(args, server_info_record(info), server_info_text(info))
    return 0


def _key_not_found(args: argparse.Namespace) -> int:
    """A missing key is a failure of `map get` and `map delete`, said in the usual error form."""
    message = f"key {args.key!r} not found in map {args.topic!r}"
    print(f"headwater: error: KEY_NOT_FOUND: {message}", file=sys.stderr)
    return 1


async def map_command(client: Client, args: argparse.Namespace) -> int:
    table = client.map(args.topic)
    if args.map_command == "get":
        entry = await table.get(args.key)
        if entry is None:
            return _key_not_found(args)
        print(entry.value.decode(errors="backslashreplace"))
    elif args.map_command == "set":
        revision = await table.set(args.key, args.value, revision=args.revision)
        print(f"revision {revision}")
    elif args.map_command == "delete":
        if await table.get(args.key) is None:
            return _key_not_found(args)
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
