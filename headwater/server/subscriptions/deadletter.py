"""Dead-letter topics: where a reliable subscription puts a message delivered too many times.

`wire.names.dead_letter_topic` names it (`<topic>-<subscription>-<hash>-DLQ`: no two
subscriptions share one, and CREATE_TOPIC cannot take the name first). It is a reliable topic
with one partition, created by the server on first use whatever the grants of the
subscription's principal (reading it takes a consume grant on it), with the source topic's
storage settings, never its last-value settings: a dead letter may have no key, and a DLQ
keeping last values would refuse it (the message would then never be delivered, acked or
dead-lettered). The DLQ is created through the placement's `define_topic` and written through
its `write` (`server.topics.placement`), the steps a client's CREATE_TOPIC and PRODUCE take: in a
cluster it is defined in etcd, its partition is written by the broker that owns it (this one, or
another over a peer connection), and a dead letter counts once it is in the object store. Only
then is the source message taken off the subscription; a dead letter that could not be written
stays due and is tried again. Finding or creating the DLQ and starting the write happen under
the DLQ name's admin lock, so a dead letter racing a DELETE_TOPIC of the DLQ lands in the old
topic before the delete or in a new one after it, never in a closed log. The source topic is
handed over as an object, not looked up by name, so a source deleted meanwhile is no KeyError.
Every dead letter
keeps its record's key, value, timestamp and headers, and gets headers naming the subscription
and the original topic, partition and offset, and how many times it was delivered.
"""

from __future__ import annotations

import structlog

from headwater.server.subscriptions.append_signal import DeadLetter
from headwater.server.topic_turns import NameLocks
from headwater.server.topics.placement import CreateLocal, TopicPlacement
from headwater.server.topics.topic import LogTopic, Topic
from headwater.wire import messages as m
from headwater.wire.errors import InvalidRequest, UnknownTopic
from headwater.wire.names import dead_letter_topic
from headwater.wire.records import Record, build_batch

log = structlog.get_logger(__name__)

LAST_VALUE_CONFIGS = ("last.value", "key.field")


class DeadLetters:
    def __init__(
        self,
        topics: dict[str, Topic],
        locks: NameLocks,
        placement: TopicPlacement,
        create_local: CreateLocal,
    ) -> None:
        self._topics = topics
        self._locks = locks
        self._placement = placement
        self._create_local = create_local

    def sender(self, source: LogTopic, subscription: str) -> DeadLetter:
        async def send(partition: int, record: Record, deliveries: int) -> None:
            await self.send(source, subscription, partition, record, deliveries)

        return send

    async def send(
        self, source: LogTopic, subscription: str, partition: int, record: Record, deliveries: int
    ) -> None:
        dlq_name = dead_letter_topic(source.name, subscription)
        headers = [
            *record.headers,
            ("headwater.dlq.subscription", subscription.encode("utf-8", "surrogatepass")),
            ("headwater.dlq.topic", source.name.encode()),
            ("headwater.dlq.partition", str(partition).encode()),
            ("headwater.dlq.offset", str(record.offset).encode()),
            ("headwater.dlq.deliveries", str(deliveries).encode()),
        ]
        batch = build_batch([(record.key, record.value, headers)], timestamp=record.timestamp)
        async with self._locks.hold(dlq_name):
            dlq = self._topics.get(dlq_name)
            if dlq is None:
                configs = tuple(c for c in source.info.configs if c.name not in LAST_VALUE_CONFIGS)
                await self._placement.define_topic(
                    m.CreateTopicRequest(dlq_name, 1, m.DispatchMode.RELIABLE, configs),
                    self._create_local,
                )
                dlq = self._topics.get(dlq_name)
                if dlq is None:  # (deleted through another broker at once)
                    raise UnknownTopic(f"dead-letter topic {dlq_name!r} was deleted")
            if not isinstance(dlq, LogTopic):  # made before these names were reserved
                raise InvalidRequest(f"dead-letter topic {dlq_name!r} exists and is non-reliable")
            waiting = self._placement.write(dlq, 0, batch, 1)
        await waiting  # outside the lock: a close of the DLQ's log resolves it too
        log.info(
            "subscription.dead_lettered",
            topic=source.name,
            subscription=subscription,
            partition=partition,
            offset=record.offset,
            deliveries=deliveries,
            dlq=dlq_name,
        )
