"""The operator half of `Client`: alter topic configs, list and reset subscriptions, server info.

    topic = await client.alter_topic("events", {"retention.ms": 3_600_000})
    for sub in await client.list_subscriptions("events"):
        print(sub.name, sub.lag, [p.backlog for p in sub.partitions])
    await client.reset_subscription("events", "audit", timestamp=1_700_000_000_000)
    info = await client.server_info()

A mixin, so `headwater.client.client` stays small; every method is one request (docs/PROTOCOL.md,
"Admin") and raises the server's `HeadwaterError` subclass on refusal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from headwater.wire import messages as m
from headwater.wire.errors import InvalidRequest, UnknownSubscription

StartName = Literal["latest", "earliest", "snapshot"]


class AdminMixin:
    async def request(self, request: m.Request, timeout: float | None = 30.0) -> m.Response:
        raise NotImplementedError  # `Client` has it

    async def seek(
        self,
        topic: str,
        subscription: str,
        start: StartName | int = "earliest",
        start_timestamp: int | None = None,
    ) -> None:
        """Move a reliable subscription; its unacknowledged messages are forgotten."""
        position, value = start_position(start, start_timestamp)
        await self.request(m.SeekRequest(topic, subscription, position, value))

    async def delete_subscription(self, topic: str, subscription: str) -> None:
        await self.request(m.DeleteSubscriptionRequest(topic, subscription))

    async def alter_topic(
        self, name: str, configs: Mapping[str, str | int] | None = None, *, last_value: bool = False
    ) -> m.TopicInfo:
        """Change some of a topic's configs (the others keep their values), and with
        `last_value` start keeping its last value per key. Applied at once, kept across
        restarts. Returns the topic with every config as it is now."""
        entries = [m.ConfigEntry(k, str(v)) for k, v in (configs or {}).items()]
        if last_value and "last.value" not in (configs or {}):
            entries.append(m.ConfigEntry("last.value", "true"))
        response = await self.request(m.AlterTopicConfigsRequest(name, tuple(entries)))
        assert isinstance(response, m.AlterTopicConfigsResponse)
        return response.topic

    async def list_subscriptions(self, topic: str | None = None) -> list[m.SubscriptionDetail]:
        """Every subscription of `topic` (of every topic if None), with its counts per
        partition: backlog, lag, unacked, redelivering, dead-lettered."""
        response = await self.request(m.ListSubscriptionsRequest(topic or ""))
        assert isinstance(response, m.ListSubscriptionsResponse)
        return list(response.subscriptions)

    async def reset_subscription(
        self,
        topic: str,
        subscription: str,
        to: Literal["earliest", "latest", "snapshot"] | int | None = None,
        *,
        timestamp: int | None = None,
    ) -> m.SubscriptionDetail:
        """Move a reliable subscription to "earliest", "latest", "snapshot" (the newest compaction
        snapshot's rows, then the log after it), an offset (every partition),
        or with `timestamp` (ms since the epoch) to each partition's first message at or after
        that time. Its unacknowledged messages are forgotten. Returns its new positions."""
        if (to is None) == (timestamp is None):
            raise InvalidRequest("reset to a position or to a timestamp (one of them)")
        if timestamp is not None:
            if timestamp < 0:
                raise InvalidRequest(f"timestamp must be ms since the epoch, not {timestamp}")
            request = m.SeekRequest(topic, subscription, m.StartPosition.TIMESTAMP, timestamp)
        elif to == "earliest":
            request = m.SeekRequest(topic, subscription, m.StartPosition.EARLIEST)
        elif to == "latest":
            request = m.SeekRequest(topic, subscription, m.StartPosition.LATEST)
        elif to == "snapshot":
            request = m.SeekRequest(topic, subscription, m.StartPosition.SNAPSHOT)
        elif isinstance(to, int) and not isinstance(to, bool) and to >= 0:
            request = m.SeekRequest(topic, subscription, m.StartPosition.OFFSET, to)
        else:
            raise InvalidRequest(
                f"reset to 'earliest', 'latest', 'snapshot' or an offset >= 0, not {to!r}"
            )
        await self.request(request)
        for detail in await self.list_subscriptions(topic):
            if detail.name == subscription:
                return detail
        raise UnknownSubscription(f"subscription {subscription!r} of {topic!r} went away")

    async def server_info(self) -> m.ServerInfoResponse:
        """Version, uptime, connections, topic and subscription counts, data directory usage."""
        response = await self.request(m.ServerInfoRequest())
        assert isinstance(response, m.ServerInfoResponse)
        return response


def start_position(start: StartName | int, timestamp: int | None) -> tuple[int, int]:
    if timestamp is not None:
        return m.StartPosition.TIMESTAMP, timestamp
    if start == "latest":
        return m.StartPosition.LATEST, 0
    if start == "earliest":
        return m.StartPosition.EARLIEST, 0
    if start == "snapshot":
        return m.StartPosition.SNAPSHOT, 0
    if isinstance(start, int) and start >= 0:
        return m.StartPosition.OFFSET, start
    raise InvalidRequest(
        f"start must be 'latest', 'earliest', 'snapshot' or an offset >= 0, not {start!r}"
    )
