"""Loading `ServerConfig` from a TOML file (`headwater serve --config FILE`).

Sections mirror the dataclasses: `[server]` (ServerConfig's own fields), `[topics]` (defaults for
reliable topics), `[subscriptions]` (defaults for reliable subscriptions), `[object_store]`,
`[security]` (authentication, TLS, quotas), `[cluster]`, `[kafka]` (the Kafka listener).
Unknown sections or keys, values of the wrong type and values outside their allowed set or range
(`check`) are errors that name the file, the key and what was expected: a typo must not silently
fall back to a default. Command-line flags override the file (see `with_overrides`).
"""

from __future__ import annotations

import codecs
import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from headwater.server.config import (
    ClusterConfig,
    KafkaConfig,
    ObjectStoreConfig,
    SecurityConfig,
    ServerConfig,
    SubscriptionDefaults,
    TopicSettings,
)
from headwater.server.logs import LOG_FORMATS, LOG_LEVELS
from headwater.storage.wal import FsyncPolicy
from headwater.wire.limits import MAX_PARTITIONS


class ConfigError(ValueError):
    pass


_SECTIONS: dict[str, type] = {
    "topics": TopicSettings,
    "subscriptions": SubscriptionDefaults,
    "object_store": ObjectStoreConfig,
    "security": SecurityConfig,
    "cluster": ClusterConfig,
    "kafka": KafkaConfig,
}
_NESTED = {"topics": "topic_defaults", "subscriptions": "subscription_defaults"}


def _text(path: Path) -> str:
    """The file's text: TOML is UTF-8 (a leading byte-order mark is allowed). Any other encoding
    is a ConfigError that says which, rather than a traceback."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    # UTF-16 starts with its byte-order mark, or (without one) has a zero byte beside every
    # ASCII character; UTF-8 TOML has none
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or b"\x00" in raw:
        raise ConfigError(
            f"{path}: the file is UTF-16 (as some Windows editors save 'Unicode' text); "
            "TOML files are UTF-8: save it as UTF-8"
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}: not UTF-8 (byte {raw[exc.start]:#04x} on line {line}); TOML files are "
            "UTF-8: save it as UTF-8"
        ) from None


def load_config(path: Path) -> ServerConfig:
    text = _text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    unknown = set(data) - {"server", *_SECTIONS}
    if unknown:
        raise ConfigError(
            f"{path}: unknown section(s) {sorted(unknown)}; known: server, {', '.join(_SECTIONS)}"
        )
    values = _build(path, "server", ServerConfig, data.get("server", {}), skip=_NESTED_FIELDS)
    for section, cls in _SECTIONS.items():
        values[_NESTED.get(section, section)] = cls(
            **_build(path, section, cls, data.get(section, {}))
        )
    config = ServerConfig(**values)
    check(config, str(path))
    return config


# Limits that must be positive for the server to work at all (0 would refuse everything).
_POSITIVE = (
    "max_frame_size",
    "max_connections",
    "subscription_backlog_bytes",
    "max_consumers_per_subscription",
    "max_consumers_per_connection",
    "max_decompressed_batch",
    "max_pending_response_bytes",
    "consumer_write_buffer",
    "idle_timeout",
    "frame_timeout",
)


def check(config: ServerConfig, where: str = "config") -> None:
    """Values with an allowed set or range; `ConfigError` naming the key otherwise."""
    if config.log_format not in LOG_FORMATS:
        raise ConfigError(
            f"{where}: server.log_format must be {' or '.join(LOG_FORMATS)}, "
            f"not {config.log_format!r}"
        )
    if config.log_level not in LOG_LEVELS:
        raise ConfigError(
            f"{where}: server.log_level must be one of {', '.join(LOG_LEVELS)}, "
            f"not {config.log_level!r}"
        )
    for name in _POSITIVE:
        value = getattr(config, name)
        if value <= 0:
            raise ConfigError(f"{where}: server.{name} must be positive, not {value!r}")
    if config.memory_max_bytes < 0:
        raise ConfigError(
            f"{where}: server.memory_max_bytes must be >= 0 (0: a quarter of the machine's memory)"
        )
    if config.memory_max_bytes_per_principal < 0:
        raise ConfigError(
            f"{where}: server.memory_max_bytes_per_principal must be >= 0 "
            "(0: a quarter of memory_max_bytes)"
        )
    if config.http_port is not None and not 0 <= config.http_port < 65536:
        raise ConfigError(f"{where}: server.http_port must be 0..65535, not {config.http_port}")
    if config.trace_every < 0:
        raise ConfigError(
            f"{where}: server.trace_every must be >= 0 (0: off), not {config.trace_every}"
        )
    if config.object_store.abandoned_after_s < 0:
        raise ConfigError(f"{where}: object_store.abandoned_after_s must be >= 0")
    if config.object_store.walk_limit < 1:
        raise ConfigError(f"{where}: object_store.walk_limit must be >= 1")
    kafka_port = config.kafka.port
    if kafka_port is not None and not 0 <= kafka_port < 65536:
        raise ConfigError(f"{where}: kafka.port must be 0..65535, not {kafka_port}")
    if not 1 <= config.kafka.auto_create_partitions <= MAX_PARTITIONS:
        raise ConfigError(
            f"{where}: kafka.auto_create_partitions must be 1..{MAX_PARTITIONS}, "
            f"not {config.kafka.auto_create_partitions}"
        )
    kafka = config.kafka
    if not 1 <= kafka.consumer_heartbeat_interval_ms < kafka.consumer_session_timeout_ms:
        raise ConfigError(
            f"{where}: kafka.consumer_heartbeat_interval_ms must be at least 1 and below "
            f"kafka.consumer_session_timeout_ms, not {kafka.consumer_heartbeat_interval_ms} "
            f"and {kafka.consumer_session_timeout_ms}"
        )
    _check_security(config, where)
    _check_cluster(config, where)


def _check_cluster(config: ServerConfig, where: str) -> None:
    cluster = config.cluster
    if not cluster.etcd:
        return
    if not cluster.etcd.startswith("etcd://") or not cluster.etcd[7:]:
        raise ConfigError(f"{where}: cluster.etcd must look like etcd://HOST:PORT")
    store = config.object_store
    if store.backend == "none" or (store.backend == "local" and store.path is None):
        # each broker's own <data_dir>/objects would hold its partitions' only record: a
        # take-over would find nothing there, and acknowledged messages would be lost
        raise ConfigError(
            f"{where}: a cluster needs a shared object store (object_store.backend s3, or local "
            "with object_store.path on storage every broker sees)"
        )
    host, _, port = cluster.advertise.rpartition(":")
    if cluster.advertise and (not host or not port.isdigit()):
        raise ConfigError(f"{where}: cluster.advertise must be HOST:PORT")
    for name in ("lease_ttl_ms", "commit_interval_ms", "checkpoint_interval_ms", "fold_chunks"):
        if getattr(cluster, name) <= 0:
            raise ConfigError(f"{where}: cluster.{name} must be positive")
    if cluster.handoff_after_ms < 0:
        raise ConfigError(f"{where}: cluster.handoff_after_ms must not be negative")
    if cluster.tail_layout not in ("partition", "broker"):
        raise ConfigError(f"{where}: cluster.tail_layout must be 'partition' or 'broker'")


def _check_security(config: ServerConfig, where: str) -> None:
    security = config.security
    if (security.tls_cert is None) != (security.tls_key is None):
        raise ConfigError(f"{where}: security.tls_cert and security.tls_key go together")
    if security.tls_client_ca is not None and security.tls_cert is None:
        raise ConfigError(f"{where}: security.tls_client_ca needs tls_cert and tls_key")
    if security.tls_client_ca is not None and security.auth_tokens is None:
        raise ConfigError(
            f"{where}: security.tls_client_ca needs auth_tokens (certificate principals' grants "
            "are entries of the tokens file)"
        )
    for name in (
        "max_connections_per_principal",
        "auth_failures_per_minute",
        "max_unauthenticated_per_address",
        "handshake_timeout",
    ):
        if getattr(security, name) <= 0:
            raise ConfigError(f"{where}: security.{name} must be positive")
    if security.max_unauthenticated_connections < 0:
        raise ConfigError(
            f"{where}: security.max_unauthenticated_connections must be >= 0 (0: a quarter of "
            "server.max_connections)"
        )
    for name in ("produce_bytes_per_second", "consume_bytes_per_second"):
        if getattr(security, name) < 0:
            raise ConfigError(f"{where}: security.{name} must be >= 0 (0: unlimited)")


_NESTED_FIELDS = {
    "topic_defaults",
    "subscription_defaults",
    "object_store",
    "security",
    "cluster",
    "kafka",
}


def _build(
    path: Path, section: str, cls: type, table: Any, skip: set[str] | None = None
) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{section}] must be a table")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)} - (skip or set())
    values: dict[str, Any] = {}
    for name, value in table.items():
        if name not in fields:
            raise ConfigError(
                f"{path}: unknown key {section}.{name}; known: {', '.join(sorted(fields))}"
            )
        values[name] = _convert(path, f"{section}.{name}", hints[name], value)
    return values


def _convert(path: Path, name: str, hint: Any, value: Any) -> Any:
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for option in options:
        if option is type(None):
            continue
        if option is Path and isinstance(value, str):
            return Path(value)
        if option is FsyncPolicy and isinstance(value, str):
            try:
                return FsyncPolicy(value)
            except ValueError:
                raise ConfigError(
                    f"{path}: {name} must be always, interval or never, not {value!r}"
                ) from None
        if option is bool and isinstance(value, bool):
            return value
        if option is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if option is str and isinstance(value, str):
            return value
    expected = " or ".join(getattr(o, "__name__", str(o)) for o in options if o is not type(None))
    raise ConfigError(f"{path}: {name} must be {expected}, not {value!r}")


def with_overrides(config: ServerConfig, **overrides: Any) -> ServerConfig:
    """Apply command-line flags that were given (None means not given)."""
    return dataclasses.replace(config, **{k: v for k, v in overrides.items() if v is not None})
