"""The client commands of `headwater` other than consume: topic, produce, map, subscription,
server.

Each takes a connected `Client` and the parsed arguments, prints its result on standard output
(notes and progress on standard error) and returns the exit status; errors are raised
(`HeadwaterError` from the server, `ValueError` for bad input) and printed by `cli.main`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import sys
import time
from collections import deque
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Any

from headwater.cli import schema_commands
from headwater.cli.arguments import decode, encode
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
from headwater.client.accumulator import SendFuture
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
from headwater.client.schema_codec import SchemaCodec
from headwater.client.transaction import COMMIT_UNKNOWN
from headwater.wire.errors import HeadwaterError, InvalidRequest, SchemaViolation, TopicExists
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
    last_value, key_field = args.last_value, args.key_field
    try:
        await client.create_topic(args.name, partitions, dispatch, configs)
    except TopicExists:
        if not args.exist_ok:
            raise
        created = False  # say what exists, which may differ from what was asked
        existing = (await client.describe_topic(args.name)).topic
        partitions, dispatch = existing.partitions, DISPATCH_NAMES[existing.dispatch]
        existing_configs = {c.name: c.value for c in existing.configs}
        last_value = existing_configs.get("last.value") == "true"
        key_field = existing_configs.get("key.field") or None
    record = {
        "name": args.name,
        "partitions": partitions,
        "dispatch": dispatch,
        "last_value": last_value,
        "created": created,
    }
    # a last-value topic says so: it keeps state per key that a plain one does not (issue 41)
    kind = f"{dispatch}, last-value" if last_value else dispatch
    if key_field:
        kind += f", keys from JSON field {key_field}"
    text = (
        f"created topic {args.name} ({kind})"
        if created
        else f"topic {args.name} exists already ({kind}, {plural(partitions, 'partition')})"
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
    if args.transactional_id is not None and args.delivery == "at-most-once":
        raise ValueError("--transactional-id sends at-least-once: drop --delivery at-most-once")
    return ProducerConfig(
        delivery=delivery,
        batch_size=args.batch_size,
        linger=args.linger_ms / 1000,
        compression=Compression[args.compression.upper()],
        idempotent=args.idempotent,
        isolation=_ISOLATIONS[args.isolation],
        transactional_id=args.transactional_id,
    )


# `--isolation`, with the names it had before transactions (deprecated: they read as Kafka's
# transaction isolation levels, which these are not)
_ISOLATIONS = {
    "appended": Isolation.APPENDED,
    "fsynced": Isolation.FSYNCED,
    "read-uncommitted": Isolation.APPENDED,
    "read-committed": Isolation.FSYNCED,
}


# Standard input read whole, and checked whole, before anything is sent: up to this many lines
# or bytes. Past either, the input streams: each line is checked before it is sent, and a failure
# says how much was acknowledged before it (docs/CLI.md, "produce").
WHOLE_INPUT_LINES = 100_000
WHOLE_INPUT_BYTES = 16 * 1024 * 1024

Record = tuple[bytes | None, bytes | None]  # (key, value) as sent


class _Input:
    """`produce`'s values as bytes, each with its place for an error message (`value 3`, or
    `line 3` of standard input): the arguments, else standard input's lines (without their
    line ends, a `\r` included)."""

    def __init__(self, values: list[str]) -> None:
        self._arguments = values
        self._lines = iter(sys.stdin.buffer) if not values else iter(())
        self.number = 0

    def take(self, lines: int, size: int) -> tuple[list[tuple[str, bytes]], bool]:
        """The next items, at most `lines` of them or about `size` bytes; and whether the
        input ended with them."""
        if self._arguments:
            items = [(f"value {i}", v.encode()) for i, v in enumerate(self._arguments, 1)]
            self._arguments = []
            return items, True
        taken: list[tuple[str, bytes]] = []
        total = 0
        for line in self._lines:
            self.number += 1
            taken.append((f"line {self.number}", line.rstrip(b"\n").removesuffix(b"\r")))
            total += len(line)
            if len(taken) >= lines or total >= size:
                return taken, False
        return taken, True


class _Prepared:
    """Turns `produce`'s input into (key, value) records: the key split off at
    `--key-separator`, both decoded from their `--*-encoding`, the value read as the topic's
    schema says and encoded by it. Every refusal names the value or line it comes from."""

    def __init__(self, args: argparse.Namespace, codec: SchemaCodec) -> None:
        self.codec = codec
        self.key_encoding: str = args.key_encoding
        self.value_encoding: str = args.value_encoding
        self.separator = None if args.key_separator is None else args.key_separator.encode()
        self.key = (
            None
            if args.key is None
            else decode(args.key.encode(), args.key_encoding, "--key", "--key-encoding")
        )

    def record(self, where: str, data: bytes) -> Record:
        try:
            return self._record(data)
        except HeadwaterError as exc:
            raise _placed(exc, f"{where}: {exc.message}") from None

    def _record(self, data: bytes) -> Record:
        key = self.key
        if self.separator is not None:
            raw_key, separator, data = data.partition(self.separator)
            if not separator:
                raise InvalidRequest(
                    f"no key separator {self.separator.decode()!r} in {raw_key[:80]!r}"
                )
            key = decode(raw_key, self.key_encoding, "key", "--key-encoding")
        value = decode(data, self.value_encoding, "value")
        codec = self.codec
        if codec.schema_type == "bytes":
            return key, value
        try:
            text = value.decode()
        except UnicodeDecodeError:
            raise SchemaViolation(
                f"a {codec.schema_type} value must be UTF-8 text, not {value[:80]!r}"
            ) from None
        try:
            typed = schema_commands.text_value(codec, text)
        except ValueError as exc:
            raise SchemaViolation(str(exc)) from None
        return key, codec.encode(typed)


def _placed(error: HeadwaterError, message: str) -> HeadwaterError:
    """`error` with another message, of the same type (so the same code)."""
    placed = copy.copy(error)
    placed.message = message
    placed.args = (message,)
    return placed


class _Tally:
    """What the server has acknowledged of the records sent: a count and the last offset per
    partition, folded in as their futures resolve (so none is kept longer than its batch)."""

    def __init__(self) -> None:
        self.pending: deque[SendFuture] = deque()
        self.sent = 0
        self.acknowledged = 0
        self.last: dict[int, int] = {}

    def add(self, future: SendFuture) -> None:
        self.sent += 1
        self.pending.append(future)
        if len(self.pending) > 4096:
            self.fold()

    def fold(self) -> None:
        while self.pending and self.pending[0].done():
            future = self.pending.popleft()
            if future.exception() is not None:
                continue
            metadata = future.result()
            self.acknowledged += 1
            if metadata.offset is not None:
                previous = self.last.get(metadata.partition, -1)
                self.last[metadata.partition] = max(previous, metadata.offset)

    def report_transaction(self, error: HeadwaterError) -> str:
        """What a failure of a transactional `produce` says about the records sent."""
        sent = plural(self.sent, "message")
        if COMMIT_UNKNOWN in error.message:
            return f" ({sent} sent in it)"
        return f"; the transaction was aborted: none of the {sent} sent is committed"

    def report(self, delivery: str) -> str:
        """What a failure after the first send says about the records before it."""
        for future in self.pending:
            if future.done():
                future.exception()  # retrieved: a failed batch is reported once, by the caller
        self.fold()
        sent = plural(self.sent, "message")
        if delivery == "at-most-once":
            return (
                f"; {sent} sent at-most-once, unacknowledged: any of them may be stored, and "
                "sending the same input again may store them twice"
            )
        if not self.acknowledged:
            return f"; none of the {sent} sent was acknowledged"
        offsets = ", ".join(f"{p}:{o}" for p, o in sorted(self.last.items()))
        return (
            f"; {self.acknowledged} of the {sent} sent "
            f"{'was' if self.acknowledged == 1 else 'were'} acknowledged (last offset per "
            f"partition {offsets}): sending the same input again sends "
            f"{'it' if self.acknowledged == 1 else 'them'} again"
        )


async def produce(client: Client, args: argparse.Namespace) -> int:
    """All or nothing for input seen whole (the arguments, standard input up to
    WHOLE_INPUT_LINES or WHOLE_INPUT_BYTES): every value is checked (encoding, separator,
    schema) before the first is sent. Longer input streams, each line checked before it is sent;
    a failure then says what the server acknowledged before it."""
    # the command reports the producer's first error itself (`_settle`, exit status 1): the
    # library's warning of the same refusal would print it twice
    sender_log = logging.getLogger("headwater.client.sender")
    sender_log.addHandler(logging.NullHandler())
    sender_log.propagate = False  # nor through the CLI's notices (headwater/cli/main.py)
    if args.key is not None and args.key_separator is not None:
        raise ValueError("use either --key or --key-separator, not both")
    if args.partition is not None and args.partition < 0:
        raise ValueError(f"--partition must be at least 0, not {args.partition}")
    headers = {k: v.encode() for k, v in name_values(args.header, "--header").items()}
    if args.count is not None:
        return await _generate(client.producer(args.topic, _producer_config(args)), args, headers)
    codec = await client.schema_codec(args.topic)  # values are read as the topic's schema says
    if codec.header is not None:
        headers[codec.header[0]] = codec.header[1]
    prepared = _Prepared(args, codec)
    source = _Input(args.values)
    items, ended = source.take(WHOLE_INPUT_LINES, WHOLE_INPUT_BYTES)
    try:
        records = [prepared.record(where, data) for where, data in items]
    except HeadwaterError as exc:
        raise _placed(exc, f"{exc.message}; nothing was sent") from None
    producer = client.producer(args.topic, _producer_config(args))
    tally = _Tally()
    try:
        async with _transaction(producer, args):
            for key, value in records:
                tally.add(
                    await producer.send(value, key=key, headers=headers, partition=args.partition)
                )
            while not ended:
                items, ended = source.take(1024, WHOLE_INPUT_BYTES)
                for where, data in items:
                    key, value = prepared.record(where, data)
                    tally.add(
                        await producer.send(
                            value, key=key, headers=headers, partition=args.partition
                        )
                    )
            await _settle(producer, args)
    except HeadwaterError as exc:
        if args.transactional_id is not None:
            raise _placed(exc, exc.message + tally.report_transaction(exc)) from None
        with contextlib.suppress(HeadwaterError):
            await _settle(producer, args)  # what was sent before it is answered, to count it
        raise _placed(exc, exc.message + tally.report(args.delivery)) from None
    done = " in one transaction, committed" if args.transactional_id is not None else ""
    print(f"produced {plural(tally.sent, 'message')} to {args.topic}{done}", file=sys.stderr)
    return 0


def _transaction(producer: Producer, args: argparse.Namespace) -> AbstractAsyncContextManager[Any]:
    """`--transactional-id`: one transaction around everything the command sends."""
    if args.transactional_id is None:
        return contextlib.nullcontext()
    return producer.transaction()


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
    async with _transaction(producer, args):
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
    key = b""
    if args.map_command in ("get", "set", "delete"):
        key = decode(args.key.encode(), args.key_encoding, "the key", "--key-encoding")
    if args.map_command == "get":
        entry = await table.get(key)
        if entry is None:
            return _key_not_found(args)
        print(encode(entry.value, args.value_encoding))
    elif args.map_command == "set":
        value = decode(args.value.encode(), args.value_encoding, "VALUE")
        revision = await table.set(key, value, revision=args.revision)
        print(f"revision {revision}")
    elif args.map_command == "delete":
        if await table.get(key) is None:
            return _key_not_found(args)
        await table.delete(key)
        print(f"deleted {args.key}")
    elif args.map_command == "scan":
        await _scan(client, args)
    else:
        print(await table.size())
    return 0


def _shown(data: bytes, encoding: str) -> tuple[str | None, str | None]:
    """`map scan`'s key or value: as --*-encoding says, or (utf8) text, else base64 flagged."""
    if encoding == "utf8":
        return text_or_base64(data)
    return encode(data, encoding), encoding


# pages a `map scan --all` fetches at most: 10 million keys at the largest page size
MAX_SCAN_PAGES = 10_000


async def _scan(client: Client, args: argparse.Namespace) -> None:
    """One page, or with --all every page; without --all a note on stderr says more exist."""
    if not 1 <= args.limit <= 1000:
        raise ValueError("--limit must be 1..1000")
    table = client.map(args.topic)
    prefix = decode(args.prefix.encode(), args.key_encoding, "--prefix", "--key-encoding")
    cursor = b""
    for _ in range(MAX_SCAN_PAGES):
        page = await table.scan(prefix, args.limit, cursor)
        for entry in page.entries:
            key, key_encoding = _shown(entry.key, args.key_encoding)
            value, value_encoding = _shown(entry.value, args.value_encoding)
            if args.format == "json":
                print(map_entry_json(key, key_encoding, value, value_encoding, entry.revision))
            else:
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
