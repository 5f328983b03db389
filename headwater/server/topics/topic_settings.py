"""Per-topic settings from CREATE_TOPIC's name/value configs, checked, with defaults filled in.

The names are the ones `headwater topic create --config NAME=VALUE` takes and docs/CONFIGURATION.md
lists. An unknown name or a bad value is an INVALID_REQUEST naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from headwater.server.config import TopicSettings
from headwater.storage.wal import FsyncPolicy, LogConfig
from headwater.wire.errors import InvalidRequest
from headwater.wire.limits import MAX_BATCH_SIZE
from headwater.wire.messages import ConfigEntry

_NAMES = {
    "fsync": "fsync",
    "fsync.interval.ms": "fsync_interval_ms",
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "retention.bytes": "retention_bytes",
    "retention.ms": "retention_ms",
    "max.message.bytes": "max_message_bytes",
}
_FIELDS = {v: k for k, v in _NAMES.items()}
TOPIC_CONFIG_NAMES = tuple(_NAMES)
_MINIMUM = {
    "fsync_interval_ms": 1,
    "segment_bytes": 1024,
    "segment_ms": 10,
    "retention_bytes": -1,
    "retention_ms": -1,
    "max_message_bytes": 1,
}
# a batch larger than a frame can carry never reaches the topic: a larger limit would mean nothing
_MAXIMUM = {"max_message_bytes": MAX_BATCH_SIZE}


def parse_settings(configs: Iterable[ConfigEntry], defaults: TopicSettings) -> TopicSettings:
    values: dict[str, Any] = {}
    for entry in configs:
        field = _NAMES.get(entry.name)
        if field is None:
            raise InvalidRequest(
                f"unknown topic config {entry.name!r} (known: {', '.join(sorted(_NAMES))})"
            )
        if field == "fsync":
            try:
                values[field] = FsyncPolicy(entry.value)
            except ValueError:
                raise InvalidRequest(
                    f"fsync must be always, interval or never, not {entry.value!r}"
                ) from None
            continue
        try:
            number = int(entry.value)
        except ValueError:
            raise InvalidRequest(f"{entry.name} must be an integer, not {entry.value!r}") from None
        if number < _MINIMUM[field]:
            raise InvalidRequest(f"{entry.name} must be at least {_MINIMUM[field]}, not {number}")
        if number > _MAXIMUM.get(field, number):
            raise InvalidRequest(f"{entry.name} must be at most {_MAXIMUM[field]}, not {number}")
        values[field] = number
    return dataclasses.replace(defaults, **values)


def settings_to_configs(settings: TopicSettings) -> tuple[ConfigEntry, ...]:
    return tuple(
        ConfigEntry(_FIELDS[f.name], str(getattr(settings, f.name)))
        for f in dataclasses.fields(settings)
    )


def settings_to_json(settings: TopicSettings) -> dict[str, Any]:
    return {f.name: str(getattr(settings, f.name)) for f in dataclasses.fields(settings)}


def settings_from_json(data: dict[str, Any], defaults: TopicSettings) -> TopicSettings:
    entries = [ConfigEntry(_FIELDS[k], v) for k, v in data.items() if k in _FIELDS]
    return parse_settings(entries, defaults)


def log_config(settings: TopicSettings) -> LogConfig:
    return LogConfig(
        fsync=settings.fsync,
        fsync_interval_ms=settings.fsync_interval_ms,
        segment_bytes=settings.segment_bytes,
        segment_ms=settings.segment_ms,
    )
