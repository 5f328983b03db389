"""`headwater consume`: print a subscription's messages, acknowledging each one after printing it.

It stops after `--count` messages, after `--timeout` seconds without a message, or with
`--exit-at-end` once it has consumed what the topic held when it started: the end offsets come
from DESCRIBE_TOPIC's next offsets before subscribing, and the consumer is done with a partition
once it has printed that partition's last message below its end. Where the subscription started
past the end (`--from latest`, or a subscription that had consumed it all) no such message comes,
so when nothing has arrived for a moment it asks the server again: a subscription with nothing
pending (and, when acknowledging, nothing unacknowledged) is at the end too. A non-reliable topic
keeps no history, so there `--exit-at-end` stops as soon as nothing is waiting.

`--partition P` attaches the consumer to partition P only (SUBSCRIBE's `partitions`): the
server sends it nothing of the others, which a reliable subscription keeps for other consumers
or later.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from headwater.cli.client_commands import position
from headwater.cli.output import format_message, parse_fields
from headwater.cli.schema_commands import readable
from headwater.client.client import Client
from headwater.client.consumer import Consumer
from headwater.wire.errors import ConnectionClosed, ConnectionLost, InvalidPartition

# how long the consumer waits for a message before asking the server whether it is at the end
END_CHECK_INTERVAL = 0.3


async def consume(client: Client, args: argparse.Namespace) -> int:
    if args.count is not None and args.count < 1:
        raise ValueError("--count must be at least 1")
    if args.prefetch < 1:
        raise ValueError("--prefetch must be at least 1")
    if args.timeout is not None and args.timeout <= 0:
        raise ValueError("--timeout must be more than 0 seconds")
    fields = parse_fields(args.fields)
    ends: dict[int, int] | None = None
    if args.exit_at_end or args.partition is not None:
        description = await client.describe_topic(args.topic)
        partitions = len(description.next_offsets)
        if args.partition is not None and not 0 <= args.partition < partitions:
            raise InvalidPartition(
                f"topic {args.topic!r} has partitions 0..{partitions - 1}, not {args.partition}"
            )
        if args.exit_at_end:
            ends = {
                p: end
                for p, end in enumerate(description.next_offsets)
                if end > description.start_offsets[p]
                and (args.partition is None or p == args.partition)
            }
    consumer = await client.subscribe(
        args.topic,
        args.subscription,
        type=args.type.replace("-", "_"),
        name=args.name,
        priority=args.priority,
        prefetch=args.prefetch,
        limit=args.count,
        start=position(args.start),
        durable=args.durable,
        keys=args.key,
        key_prefix=args.key_prefix,
        on_dropped=_warn_dropped,
        partitions=() if args.partition is None else (args.partition,),
    )
    try:
        return await _print_messages(client, consumer, args, fields, ends)
    finally:
        await consumer.close()


async def _print_messages(
    client: Client,
    consumer: Consumer,
    args: argparse.Namespace,
    fields: tuple[str, ...],
    ends: dict[int, int] | None,
) -> int:
    received = 0
    last_message = time.monotonic()
    while args.count is None or received < args.count:
        if ends is not None and not ends:
            return 0  # every partition's last message below its end offset is printed
        wait = math.inf if args.timeout is None else last_message + args.timeout - time.monotonic()
        if ends is not None:
            wait = min(wait, END_CHECK_INTERVAL)
        try:
            message = await consumer.receive(timeout=None if wait == math.inf else max(wait, 0))
        except TimeoutError:
            if ends is not None and await _at_end(client, args):
                return 0
            if args.timeout is not None and time.monotonic() - last_message >= args.timeout:
                return _timed_out(args, received)
            continue
        except ConnectionClosed as exc:
            if isinstance(exc, ConnectionLost):
                raise
            return 0  # closed by us or our client
        last_message = time.monotonic()
        if args.partition is not None and message.partition != args.partition:
            continue  # not acknowledged: the subscription keeps it
        shown = message if args.raw else await readable(consumer, message)
        print(format_message(shown, args.format, fields), flush=True)
        if not args.no_ack:
            await message.ack()
        received += 1
        if ends is not None and message.offset >= ends.get(message.partition, math.inf) - 1:
            del ends[message.partition]
    return 0


async def _at_end(client: Client, args: argparse.Namespace) -> bool:
    """Whether the server holds nothing more for this subscription (asked while idle)."""
    description = await client.describe_topic(args.topic)
    for sub in description.subscriptions:
        if sub.name == args.subscription:
            # unacked: messages in flight to us, unless we leave some unacknowledged ourselves
            ignore_unacked = args.no_ack or args.partition is not None
            return sub.pending == 0 and (ignore_unacked or sub.unacked == 0)
    return True  # a live subscription without consumers is gone: nothing is kept for it


def _timed_out(args: argparse.Namespace, received: int) -> int:
    if args.count is not None:
        print(
            f"headwater: error: no message for {args.timeout:g}s: "
            f"received {received} of {args.count}",
            file=sys.stderr,
        )
        return 1
    print(f"headwater: no message for {args.timeout:g}s: stopping", file=sys.stderr)
    return 0


def _warn_dropped(count: int) -> None:
    print(
        f"headwater: warning: missed {count} messages (the consumer fell behind)", file=sys.stderr
    )
