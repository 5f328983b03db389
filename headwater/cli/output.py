"""What the `headwater` command prints: topics, subscriptions and server info (table or JSON),
consumed messages (text or JSON), progress.

The JSON shapes are a stable interface, documented in docs/CLI.md: keys are only ever added.
Bytes that are not UTF-8 are printed base64-encoded with a `*_encoding: "base64"` key beside them.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from headwater.client.client import DISPATCH_NAMES, Message
from headwater.wire.messages import (
    DescribeTopicResponse,
    Durable,
    ServerInfoResponse,
    SubscriptionDetail,
    SubscriptionType,
    TopicInfo,
)

DURABLE_NAMES: dict[int, str] = {d: d.name.lower().replace("_", "-") for d in Durable}
# what the CLI prints, spelt as `consume --type` takes them: key-shared (the Python API's
# type="key_shared" is accepted by `--type` too)
SUBSCRIPTION_TYPE_NAMES: dict[int, str] = {
    t: t.name.lower().replace("_", "-") for t in SubscriptionType
}


def plural(count: int, noun: str) -> str:
    """ "1 partition", "3 partitions"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


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
    if description.partitions:
        lines.append("storage:")
        lines.extend("  " + row for row in _partition_rows(description).split("\n"))
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


def _partition_rows(description: DescribeTopicResponse) -> str:
    rows = [("PARTITION", "START", "NEXT", "LOCAL_START", "BYTES", "SEGMENTS", "UPLOAD_LAG")]
    for p in description.partitions:
        lag = "-" if p.uploaded_offset < 0 else f"{p.upload_lag_offsets} ({p.upload_lag_bytes} B)"
        rows.append(
            (
                str(p.partition),
                str(p.start_offset),
                str(p.next_offset),
                str(p.local_start_offset),
                str(p.size_bytes),
                str(p.segments),
                lag,
            )
        )
    return table(rows)


def table(rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; numbers (and "-") right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(width) if _numeric(cell) else cell.ljust(width)
            for cell, width in zip(row, widths, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _numeric(cell: str) -> bool:
    return cell == "-" or cell.split(" ")[0].lstrip("-").isdigit()


def topics_json(topics: Sequence[TopicInfo]) -> str:
    return json.dumps([topic_record(topic) for topic in topics], ensure_ascii=False)


def topics_table(topics: Sequence[TopicInfo]) -> str:
    rows = [("NAME", "PARTITIONS", "DISPATCH")]
    rows += [(t.name, str(t.partitions), DISPATCH_NAMES[t.dispatch]) for t in topics]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    return "\n".join(
        f"{name:<{widths[0]}}  {partitions:>{widths[1]}}  {dispatch}".rstrip()
        for name, partitions, dispatch in rows
    )


def topic_record(topic: TopicInfo) -> dict[str, Any]:
    return {
        "name": topic.name,
        "partitions": topic.partitions,
        "dispatch": DISPATCH_NAMES[topic.dispatch],
        "configs": {c.name: c.value for c in topic.configs},
    }


def describe_json(description: DescribeTopicResponse) -> str:
    record = topic_record(description.topic)
    # `partitions` is the per-partition array below (as in a subscription's record); the count,
    # which `topic list` gives as `partitions`, stays here for topics of every dispatch
    record["partition_count"] = record.pop("partitions")
    record["messages_in"] = description.messages_in
    record["bytes_in"] = description.bytes_in
    record["offsets"] = [
        {"partition": p, "start": start, "next": next_}
        for p, (start, next_) in enumerate(
            zip(description.start_offsets, description.next_offsets, strict=True)
        )
    ]
    record["partitions"] = [
        {
            "partition": p.partition,
            "start_offset": p.start_offset,
            "next_offset": p.next_offset,
            "local_start_offset": p.local_start_offset,
            "size_bytes": p.size_bytes,
            "segments": p.segments,
            "uploaded_offset": p.uploaded_offset,
            "upload_lag_offsets": p.upload_lag_offsets,
            "upload_lag_bytes": p.upload_lag_bytes,
        }
        for p in description.partitions
    ]
    record["subscriptions"] = [
        {
            "name": sub.name,
            "type": SUBSCRIPTION_TYPE_NAMES[sub.sub_type],
            "pending": sub.pending,
            "delivered": sub.delivered,
            "dropped": sub.dropped,
            "unacked": sub.unacked,
            "dead_lettered": sub.dead_lettered,
            "consumers": [
                {
                    "id": c.consumer_id,
                    "name": c.name,
                    "priority": c.priority,
                    "credits": c.credits,
                    "active": c.active,
                }
                for c in sub.consumers
            ],
        }
        for sub in description.subscriptions
    ]
    return json.dumps(record, ensure_ascii=False)


def topic_text(topic: TopicInfo) -> str:
    lines = [
        f"topic: {topic.name}",
        f"dispatch: {DISPATCH_NAMES[topic.dispatch]}",
        f"partitions: {topic.partitions}",
    ]
    lines += [f"  {c.name}={c.value}" for c in topic.configs]
    return "\n".join(lines)


def subscription_record(sub: SubscriptionDetail) -> dict[str, Any]:
    return {
        "topic": sub.topic,
        "name": sub.name,
        "type": SUBSCRIPTION_TYPE_NAMES.get(sub.sub_type, str(sub.sub_type)),
        "durable": DURABLE_NAMES.get(sub.durable, str(sub.durable)),
        "consumers": sub.consumers,
        "backlog": sub.backlog,
        "lag": sub.lag,
        "unacked": sub.unacked,
        "redelivering": sub.redelivering,
        "delivered": sub.delivered,
        "dropped": sub.dropped,
        "dead_lettered": sub.dead_lettered,
        "partitions": [
            {
                "partition": p.partition,
                "committed": p.committed,
                "dispatched": p.dispatched,
                "next_offset": p.next_offset,
                "backlog": p.backlog,
                "lag": p.lag,
                "unacked": p.unacked,
                "redelivering": p.redelivering,
                "dead_lettered": p.dead_lettered,
            }
            for p in sub.partitions
        ],
    }


def subscriptions_table(subscriptions: Sequence[SubscriptionDetail]) -> str:
    """One row per partition (one for a subscription without cursors, partition "-")."""
    rows: list[tuple[str, ...]] = [
        (
            "TOPIC", "SUBSCRIPTION", "TYPE", "DURABLE", "CONSUMERS", "PARTITION", "COMMITTED",
            "NEXT", "BACKLOG", "LAG", "UNACKED", "REDELIVERING", "DEAD_LETTERED",
        )
    ]  # fmt: skip
    for sub in subscriptions:
        head = (
            sub.topic,
            sub.name,
            SUBSCRIPTION_TYPE_NAMES.get(sub.sub_type, str(sub.sub_type)),
            DURABLE_NAMES.get(sub.durable, str(sub.durable)),
            str(sub.consumers),
        )
        if not sub.partitions:
            totals = (sub.backlog, sub.lag, sub.unacked, sub.redelivering, sub.dead_lettered)
            rows.append((*head, "-", "-", "-", *(str(c) for c in totals)))
        for p in sub.partitions:
            counts = (
                p.partition, p.committed, p.next_offset, p.backlog, p.lag, p.unacked,
                p.redelivering, p.dead_lettered,
            )  # fmt: skip
            rows.append((*head, *(str(c) for c in counts)))
    if len(rows) == 1:
        return "no subscriptions"
    return table(rows)


def server_info_record(info: ServerInfoResponse) -> dict[str, Any]:
    return {
        "version": info.version,
        "started_ms": info.started_ms,
        "uptime_ms": info.uptime_ms,
        "connections": info.connections,
        "topics": info.topic_count,
        "subscriptions": info.subscription_count,
        "data_dir": info.data_dir,
        "data_dir_bytes": info.data_dir_bytes,
        "memory_budget_bytes": info.memory_budget_bytes,
        "memory_used_bytes": info.memory_used_bytes,
        "memory_principal_share_bytes": info.memory_principal_share_bytes,
        "memory_principals": {p.principal: p.used_bytes for p in info.memory_principals},
        "open_files_limit": info.open_files_limit,
        "partitions_allowed": info.partitions_allowed,
    }


def _open_files_text(info: ServerInfoResponse) -> list[str]:
    """The open-files limit and the reliable partitions it allows (nothing from a server older
    than these fields, which answers 0)."""
    if info.open_files_limit == 0:
        return []
    if info.open_files_limit < 0:
        return ["open files: unlimited (reliable partitions: no limit from it)"]
    return [
        f"open files: {info.open_files_limit} (allows {info.partitions_allowed} reliable "
        "partitions beside max_connections connections; docs/OPERATIONS.md, Open files)"
    ]


def server_info_text(info: ServerInfoResponse) -> str:
    seconds = info.uptime_ms // 1000
    uptime = f"{seconds // 86400}d {seconds // 3600 % 24}h {seconds // 60 % 60}m {seconds % 60}s"
    return "\n".join(
        [
            f"version: {info.version}",
            f"uptime: {uptime}",
            f"connections: {info.connections}",
            f"topics: {info.topic_count}",
            f"subscriptions: {info.subscription_count}",
            f"data dir: {info.data_dir}",
            f"data dir usage: {info.data_dir_bytes} bytes ({info.data_dir_bytes / 1e6:,.1f} MB)",
            f"memory budget: {info.memory_used_bytes} of {info.memory_budget_bytes} bytes "
            f"held for consumers ({info.memory_used_bytes / 1e6:,.1f} of "
            f"{info.memory_budget_bytes / 1e6:,.1f} MB)",
            f"memory share per principal: {info.memory_principal_share_bytes} bytes "
            f"({info.memory_principal_share_bytes / 1e6:,.1f} MB)",
            *(
                f"  {p.principal or '(anonymous)'}: {p.used_bytes} bytes "
                f"({p.used_bytes / 1e6:,.1f} MB)"
                for p in info.memory_principals
            ),
            *_open_files_text(info),
        ]
    )


def map_entry_json(
    key: str | None,
    key_encoding: str | None,
    value: str | None,
    value_encoding: str | None,
    revision: int,
) -> str:
    """`map scan --format json`'s line: key and value as text, each with its `*_encoding`
    (base64 or hex) when it is not the bytes' UTF-8 text."""
    record: dict[str, Any] = {}
    for name, text, encoding in (("key", key, key_encoding), ("value", value, value_encoding)):
        record[name] = text
        if encoding:
            record[f"{name}_encoding"] = encoding
    record["revision"] = revision
    return json.dumps(record, ensure_ascii=False)


def progress_bar(done: int, total: int, started: float) -> None:
    """A bar redrawn in place with `\r`: on a terminal only, never into a file or a pipe."""
    if not sys.stderr.isatty():
        return
    width = 30
    filled = width * done // total
    rate = done / max(time.monotonic() - started, 1e-9)
    bar = "#" * filled + "-" * (width - filled)
    print(f"\r[{bar}] {done:,}/{total:,} {rate:,.0f} msg/s", end="", file=sys.stderr, flush=True)


MESSAGE_FIELDS = ("partition", "offset", "timestamp", "key", "headers")


def parse_fields(text: str) -> tuple[str, ...]:
    """`--print key,offset`: the fields to show, in the fixed MESSAGE_FIELDS order."""
    wanted = {f.strip() for f in text.split(",") if f.strip()}
    unknown = wanted - set(MESSAGE_FIELDS)
    if unknown:
        raise ValueError(
            f"--print takes fields from {','.join(MESSAGE_FIELDS)}, not {','.join(sorted(unknown))}"
        )
    return tuple(f for f in MESSAGE_FIELDS if f in wanted)


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode(errors="backslashreplace")


def format_text(message: Message, fields: Sequence[str]) -> str:
    """The value, after `name=value` for each of `fields`, tab-separated. A missing key prints as
    `key=` with nothing after it; headers as `headers=name:value,name:value`."""
    shown = []
    for name in fields:
        if name == "key":
            shown.append(f"key={_text(message.key)}")
        elif name == "headers":
            pairs = ",".join(f"{h}:{_text(v)}" for h, v in message.headers)
            shown.append(f"headers={pairs}")
        else:
            shown.append(f"{name}={getattr(message, name)}")
    return "\t".join([*shown, _text(message.value)])


def format_message(message: Message, output_format: str, fields: Sequence[str] = ()) -> str:
    if output_format == "text":
        return format_text(message, fields)
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
    if message.headers:
        record["headers"] = [_header(name, value) for name, value in message.headers]
    return json.dumps(record, ensure_ascii=False)


def _header(name: str, value: bytes | None) -> dict[str, Any]:
    text, encoding = text_or_base64(value)
    header: dict[str, Any] = {"name": name, "value": text}
    if encoding:
        header["value_encoding"] = encoding
    return header


def text_or_base64(data: bytes | None) -> tuple[str | None, str | None]:
    """UTF-8 text as is; anything else base64-encoded, flagged by a `*_encoding` field."""
    if data is None:
        return None, None
    try:
        return data.decode(), None
    except UnicodeDecodeError:
        return base64.b64encode(data).decode(), "base64"
