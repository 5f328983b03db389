"""AlterConfigs and IncrementalAlterConfigs: a topic's configs changed by a Kafka admin client,
as `headwater topic alter` changes them (the native ALTER_TOPIC_CONFIGS, the `admin` grant).

Each resource is checked here before anything changes, so a refusal carries Kafka's precise code
rather than the native INVALID_REQUEST: the grant first (TOPIC_AUTHORIZATION_FAILED, before the
topic's existence is told), then the topic (UNKNOWN_TOPIC_OR_PARTITION), then each config:

- an unknown name, a value that does not parse or is out of range, APPEND or SUBTRACT (no
  Headwater config is a list): INVALID_CONFIG;
- a config fixed at creation (`partitions`, `dispatch`), a setting on a non-reliable topic (it
  keeps nothing), `cleanup.policy=delete` or a reset of `cleanup.policy` on a last-value topic
  (its state cannot be turned off), a broker resource (broker configs are headwater.toml's):
  POLICY_VIOLATION;
- a name given twice, a null value to SET, an unknown operation or resource type: INVALID_REQUEST.

`cleanup.policy=compact` is `last.value=true` (as CreateTopics takes it); `cleanup.policy=delete`
on a topic that is not last-value changes nothing. Kafka's semantics are kept for what is not
named: AlterConfigs replaces a topic's settings, so the settings it does not name go back to the
server's defaults (`[topic_defaults]`), and IncrementalAlterConfigs' DELETE sets one back to its
default; `last.value` and `key.field`, which cannot be unset, are left as they are unless named.
`validate_only` runs every check but the native request's own (a key field's), changing nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import structlog

from headwater.server.config import TopicSettings
from headwater.server.kafka import kafka_errors as k
from headwater.server.kafka.group_handlers import KafkaSession as Session
from headwater.server.kafka.messages import configs as c
from headwater.server.requests.admin_requests import FIXED_CONFIGS
from headwater.server.requests.broker import Broker
from headwater.server.security.access import Security
from headwater.server.subscriptions.deadletter import LAST_VALUE_CONFIGS
from headwater.server.topics.topic_settings import (
    TOPIC_CONFIG_NAMES,
    parse_settings,
    settings_to_configs,
)
from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError, InvalidRequest, UnknownTopic

log = structlog.get_logger(__name__)

TOPIC_RESOURCE: Final = 2
BROKER_RESOURCE: Final = 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
CLEANUP_POLICY: Final = "cleanup.policy"


class Refused(Exception):
    """A resource refused with a Kafka code of this module's choosing (caught in this module:
    it never reaches the wire as a Headwater error)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ConfigHandlers:
    def __init__(
        self,
        broker: Broker,
        security: Security | None,
        native: Callable[[Session, m.Request], Awaitable[m.Response]],
        defaults: TopicSettings,
    ) -> None:
        self._broker = broker
        self._security = security
        self._native = native
        self._defaults = defaults

    async def alter_configs(
        self, session: Session, version: int, request: c.AlterConfigsRequest
    ) -> c.AlterConfigsResponse:
        """Kafka's AlterConfigs: every config given is SET, the settings not given go back to
        their defaults."""
        results = []
        for resource in request.resources:
            entries = [(e.name, SET, e.value) for e in resource.configs]
            code, message = await self._resource(
                session, resource.resource_type, resource.resource_name, entries, True, request
            )
            results.append(
                c.AlterConfigsResourceResponse(
                    error_code=code,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                )
            )
        return c.AlterConfigsResponse(throttle_time_ms=0, responses=results)

    async def incremental_alter_configs(
        self, session: Session, version: int, request: c.IncrementalAlterConfigsRequest
    ) -> c.IncrementalAlterConfigsResponse:
        results = []
        for resource in request.resources:
            entries = [(e.name, e.config_operation, e.value) for e in resource.configs]
            code, message = await self._resource(
                session, resource.resource_type, resource.resource_name, entries, False, request
            )
            results.append(
                c.IncrementalAlterConfigsAlterConfigsResourceResponse(
                    error_code=code,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                )
            )
        return c.IncrementalAlterConfigsResponse(throttle_time_ms=0, responses=results)

    async def _resource(
        self,
        session: Session,
        kind: int,
        name: str,
        entries: list[tuple[str, int, str | None]],
        replace: bool,
        request: c.AlterConfigsRequest | c.IncrementalAlterConfigsRequest,
    ) -> tuple[int, str | None]:
        """(error code, message) of one resource."""
        code, message = 0, None
        try:
            configs = self._check(session, kind, name, entries, replace)
            if configs and not request.validate_only:
                await self._native(session, m.AlterTopicConfigsRequest(name, configs))
        except Refused as refused:
            code, message = refused.code, refused.message
        except HeadwaterError as exc:
            code, message = k.kafka_code(exc), exc.message
            if code == k.INVALID_REQUEST:  # what the native check found: a key field
                code = k.INVALID_CONFIG
        if code:
            log.debug("kafka.alter_configs_refused", topic=name, kafka_code=code, error=message)
        return code, message

    def _check(
        self,
        session: Session,
        kind: int,
        name: str,
        entries: list[tuple[str, int, str | None]],
        replace: bool,
    ) -> tuple[m.ConfigEntry, ...]:
        """The native configs to send for one resource, or `Refused` / a `HeadwaterError`."""
        if kind == BROKER_RESOURCE:
            raise Refused(
                k.POLICY_VIOLATION, "broker configs are set in headwater.toml, not by clients"
            )
        if kind != TOPIC_RESOURCE:
            raise Refused(k.INVALID_REQUEST, f"resource type {kind}: topics (2) only")
        if self._security is not None:  # the grant before the topic's existence is told
            self._security.check(session, m.AlterTopicConfigsRequest(name, ()))
        topic = self._broker.topics.get(name)
        if topic is None:
            raise UnknownTopic(f"topic {name!r} does not exist")
        names = [entry[0] for entry in entries]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise Refused(k.INVALID_REQUEST, f"config {repeated[0]!r} given more than once")
        last_value = topic.last_value is not None
        settings: dict[str, str] = {}
        others: list[m.ConfigEntry] = []
        for config, operation, value in entries:
            if operation in (APPEND, SUBTRACT):
                raise Refused(
                    k.INVALID_CONFIG, f"{config}: APPEND and SUBTRACT take list configs: none is"
                )
            if operation not in (SET, DELETE):
                raise Refused(k.INVALID_REQUEST, f"{config}: unknown operation {operation}")
            if operation == SET and value is None:
                raise Refused(k.INVALID_REQUEST, f"{config}: a null value to SET")
            reason = FIXED_CONFIGS.get(config)
            if reason is not None:
                raise Refused(k.POLICY_VIOLATION, f"config {config!r} cannot be changed: {reason}")
            if config == CLEANUP_POLICY:
                wanted = "delete" if operation == DELETE else value
                if wanted == "compact":
                    others.append(m.ConfigEntry("last.value", "true"))
                elif wanted != "delete":
                    raise Refused(
                        k.INVALID_CONFIG, f"cleanup.policy is compact or delete, not {wanted!r}"
                    )
                elif last_value:
                    raise Refused(
                        k.POLICY_VIOLATION,
                        f"topic {name!r} keeps last-value state (cleanup.policy=compact), "
                        "which cannot be turned off: delete and re-create the topic",
                    )
            elif config in LAST_VALUE_CONFIGS:
                if operation == DELETE:
                    raise Refused(k.POLICY_VIOLATION, f"{config} cannot be reset once set")
                others.append(m.ConfigEntry(config, value or ""))
            elif config in TOPIC_CONFIG_NAMES:
                settings[config] = (
                    _default(self._defaults, config) if operation == DELETE else value or ""
                )
            else:
                known = sorted((*TOPIC_CONFIG_NAMES, *LAST_VALUE_CONFIGS, CLEANUP_POLICY))
                raise Refused(
                    k.INVALID_CONFIG,
                    f"unknown topic config {config!r} (known: {', '.join(known)})",
                )
        if not topic.reliable:
            if settings:
                raise Refused(
                    k.POLICY_VIOLATION,
                    f"topic {name!r} is non-reliable: it keeps nothing, so it has no "
                    f"{', '.join(sorted(settings))} to change",
                )
            return tuple(others)
        if replace:  # AlterConfigs: the settings not named go back to the defaults
            settings = {e.name: e.value for e in settings_to_configs(self._defaults)} | settings
        entries_out = tuple(m.ConfigEntry(key, value) for key, value in settings.items())
        try:
            parse_settings(entries_out, topic.settings)
        except InvalidRequest as exc:
            raise Refused(k.INVALID_CONFIG, exc.message) from None
        return entries_out + tuple(others)


def _default(defaults: TopicSettings, config: str) -> str:
    return next(e.value for e in settings_to_configs(defaults) if e.name == config)
