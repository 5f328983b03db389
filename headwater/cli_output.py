"""What the `headwater` command prints: topic descriptions, consumed messages, progress."""

from __future__ import annotations

import base64
import json
import sys
import time
from typing import Any

from headwater.client import DISPATCH_NAMES, SUBSCRIPTION_TYPE_NAMES, Message
from wire.messages import DescribeTopicResponse


def describe_text(description: DescribeTopicResponse) -> str:
    topic = description.topic
    lines = [
        f"topic: {topic.name}",
        f"dispatch: {DISPATCH_NAMES[topic.dispatch]}",
        f"partitions: {topic.partitions}",
        f"next offsets: {', '.join(str(o) for o in description.next_offsets)}",
        f"start offsets: {', '.join(str(o) for o in description.start_offsets)}",
        f"messages in: {description.messages_in}",
        f"bytes in: {description.bytes_in}",
        f"subscriptions: {len(description.subscriptions)}",
    ]
    if topic.configs:
        lines.insert(3, "configs: " + ", ".join(f"{c.name}={c.value}" for c in topic.configs))
    for sub in description.subscriptions:
        lines.append(
            f"  {sub.name} ({SUBSCRIPTION_TYPE_NAMES[sub.sub_type]}): pending={sub.pending} "
            f"delivered={sub.delivered} dropped={sub.dropped} unacked={sub.unacked} "
            f"dead_lettered={sub.dead_lettered}"
        )
        for consumer in sub.consumers:
            marker = " active" if consumer.active else ""
            lines.append(
                f"    consumer {consumer.name} id={consumer.consumer_id} "
                f"priority={consumer.priority} credits={consumer.credits}{marker}"
            )
    return "\n".join(lines)


def progress_bar(done: int, total: int, started: float) -> None:
    width = 30
    filled = width * done // total
    rate = done / max(time.monotonic() - started, 1e-9)
    bar = "#" * filled + "-" * (width - filled)
    print(f"\r[{bar}] {done:,}/{total:,} {rate:,.0f} msg/s", end="", file=sys.stderr, flush=True)


def format_message(message: Message, output_format: str) -> str:
    if output_format == "text":
        return "" if message.value is None else message.value.decode(errors="backslashreplace")
    record: dict[str, Any] = {
        "topic": message.topic,
        "partition": message.partition,
        "offset": message.offset,
        "timestamp": message.timestamp,
    }
    if message.delivery_count > 1:
        record["delivery_count"] = message.delivery_count
    for name, data in (("key", message.key), ("value", message.value)):
        record[name], encoding = text_or_base64(data)
        if encoding:
            record[f"{name}_encoding"] = encoding
    return json.dumps(record, ensure_ascii=False)


def text_or_base64(data: bytes | None) -> tuple[str | None, str | None]:
    """UTF-8 text as is; anything else base64-encoded, flagged by a `*_encoding` field."""
    if data is None:
        return None, None
    try:
        return data.decode(), None
    except UnicodeDecodeError:
        return base64.b64encode(data).decode(), "base64"
