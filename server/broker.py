"""The broker: topics, subscriptions and consumers, and one handler per request type.

Handlers run on the event loop. Most finish synchronously (a non-reliable produce is a validate, a
stamp and a fan-out); those that must wait return a coroutine that the connection awaits before
answering: a reliable produce under fsync `always` waits for its group commit, a reliable
subscribe may read the WAL to find a timestamp. Each raises a `HeadwaterError` subclass for a
bad request; the connection turns it into an error response. Consumer ids are unique across the
server, and a connection may only act on the consumers it created.

Reliable topics and subscriptions live in `TopicCatalog`, which owns their files and state.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from durables.lastvalue import LastValueIndex, StoredValue, check_key
from server.catalog import TopicCatalog
from server.config import ServerConfig
from server.lastvalue import LastValueSubscription
from server.reliable import ReliableSubscription
from server.subscription import Consumer, Subscription
from server.subscription import ConsumerSession as Session
from server.topics import Topic
from wire import messages as m
from wire.codec import SUPPORTED_VERSIONS
from wire.errors import (
    ConsumerBusy,
    ErrorCode,
    InvalidRequest,
    RevisionMismatch,
    SubscriptionTypeMismatch,
    UnknownConsumer,
    UnknownProducerId,
    UnknownTopic,
)
from wire.limits import MAX_ACKS_PER_REQUEST, MAX_CREDITS
from wire.names import check_name
from wire.records import BatchInfo, build_batch, validate_records

log = structlog.get_logger("headwater.broker")

Result = m.Response | Awaitable[m.Response]


class Broker:
    def __init__(self, config: ServerConfig, catalog: TopicCatalog) -> None:
        self._config = config
        self.catalog = catalog
        self._consumer_ids = itertools.count(1)
        self._handlers: dict[type, Callable[[Session, Any], Result]] = {
            m.ProduceRequest: self.produce,
            m.SubscribeRequest: self.subscribe,
            m.FlowRequest: self.flow,
            m.AckRequest: self.ack,
            m.NackRequest: self.nack,
            m.UnsubscribeRequest: self.unsubscribe,
            m.SeekRequest: self.seek,
            m.DeleteSubscriptionRequest: self.delete_subscription,
            m.InitProducerIdRequest: self.init_producer_id,
            m.MapGetRequest: self.map_get,
            m.MapSetRequest: self.map_set,
            m.MapScanRequest: self.map_scan,
            m.MapSizeRequest: self.map_size,
            m.CreateTopicRequest: self.create_topic,
            m.DeleteTopicRequest: self.delete_topic,
            m.ListTopicsRequest: self.list_topics,
            m.DescribeTopicRequest: self.describe_topic,
            m.ApiVersionsRequest: self.api_versions,
        }

    @property
    def topics(self) -> dict[str, Topic]:
        return self.catalog.topics

    def handle(self, session: Session, request: m.Request) -> Result:
        return self._handlers[type(request)](session, request)

    def _topic(self, name: str) -> Topic:
        topic = self.catalog.topics.get(name)
        if topic is None:
            raise UnknownTopic(f"topic {name!r} does not exist")
        return topic

    def _consumer(self, session: Session, consumer_id: int) -> Consumer:
        consumer = session.consumers.get(consumer_id)
        if consumer is None:
            raise UnknownConsumer(f"consumer {consumer_id} is not open on this connection")
        return consumer

    # Messages

    def produce(
        self, session: Session, request: m.ProduceRequest, info: BatchInfo | None = None
    ) -> Result:
        """`info`: the batch already validated (the connection inflates large ones off the loop)."""
        topic = self._topic(request.topic)
        partition = topic.pick_partition(request.partition)
        if request.isolation not in (m.Isolation.READ_UNCOMMITTED, m.Isolation.READ_COMMITTED):
            raise InvalidRequest(
                f"unknown isolation {request.isolation} (0 read_uncommitted, 1 read_committed)"
            )
        if info is None:
            info = validate_records(request.batch, self._config.max_decompressed_batch)
        idempotent = info.producer_id >= 0
        if idempotent:
            if request.partition == -1:
                raise InvalidRequest("an idempotent producer must name the partition")
            if not self.catalog.issued(info.producer_id):
                raise UnknownProducerId(
                    f"producer id {info.producer_id} was not issued by this server"
                )
            original = partition.producers.check(
                info.producer_id, info.base_sequence, info.record_count
            )
            if original is not None:  # a retry of a batch already appended
                return m.ProduceResponse(partition.index, original)
        if not topic.reliable:
            base_offset = topic.publish(partition, request.batch, info.record_count)
            if idempotent:
                partition.producers.record(
                    info.producer_id, info.base_sequence, info.record_count, base_offset
                )
            return m.ProduceResponse(partition.index, base_offset)
        base_offset, sequence = topic.append(partition, request.batch, info.record_count)
        if idempotent:
            entry = partition.producers.record(
                info.producer_id, info.base_sequence, info.record_count, base_offset
            )
            self.catalog.save_producer(topic, partition.index, info.producer_id, entry)
        response = m.ProduceResponse(partition.index, base_offset)
        assert partition.log is not None
        committed = request.isolation == m.Isolation.READ_COMMITTED
        if not partition.log.must_wait(sequence, committed):
            return response
        return _after(partition.log.wait_durable(sequence), response)

    def init_producer_id(
        self, session: Session, request: m.InitProducerIdRequest
    ) -> m.InitProducerIdResponse:
        return m.InitProducerIdResponse(self.catalog.new_producer_id(), 0)

    def subscribe(self, session: Session, request: m.SubscribeRequest) -> Result:
        topic = self._topic(request.topic)
        check_name("subscription", request.subscription)
        check_name("consumer", request.consumer_name)
        try:
            sub_type = m.SubscriptionType(request.sub_type)
        except ValueError:
            raise InvalidRequest(
                f"unknown subscription type {request.sub_type} (0 exclusive, 1 shared, 2 failover)"
            ) from None
        if not 0 <= request.initial_credits <= MAX_CREDITS:
            raise InvalidRequest(f"initial credits must be 0..{MAX_CREDITS}")
        durable = self._durable_kind(topic, sub_type, request.settings)
        if durable in (m.Durable.LAST_VALUE, m.Durable.MAP):
            return self._subscribe_last_value(session, request, topic, sub_type)
        if topic.reliable and durable != m.Durable.NONE:
            return self._subscribe_reliable(session, request, topic, sub_type)
        if request.settings.start != m.StartPosition.LATEST:
            raise InvalidRequest(
                f"a subscription on non-reliable topic {topic.name!r} or with durable none "
                "keeps no history: it can only start at latest"
            )
        subscription = topic.subscriptions.get(request.subscription)
        if subscription is None:
            subscription = Subscription(
                topic.name, request.subscription, sub_type, self._config.subscription_backlog
            )
        elif not isinstance(subscription, Subscription):
            raise InvalidRequest(
                f"subscription {request.subscription!r} exists and is durable; "
                "pick another name for a non-durable one"
            )
        return self._attach(session, request, topic, subscription, sub_type)

    @staticmethod
    def _durable_kind(
        topic: Topic, sub_type: m.SubscriptionType, settings: m.SubscriptionSettings
    ) -> m.Durable:
        try:
            durable = m.Durable(settings.durable)
        except ValueError:
            raise InvalidRequest(
                f"unknown durable kind {settings.durable} "
                "(0 default, 1 none, 2 standard, 3 shared, 4 last-value, 5 map)"
            ) from None
        keeps_state = (m.Durable.STANDARD, m.Durable.SHARED, m.Durable.LAST_VALUE, m.Durable.MAP)
        if durable in keeps_state and not topic.reliable:
            raise InvalidRequest(
                f"topic {topic.name!r} is non-reliable: a {durable.name.lower()} durable "
                "needs a reliable topic"
            )
        if durable == m.Durable.STANDARD and sub_type == m.SubscriptionType.SHARED:
            raise InvalidRequest("a standard durable takes an exclusive or failover subscription")
        if durable == m.Durable.SHARED and sub_type != m.SubscriptionType.SHARED:
            raise InvalidRequest("a shared durable takes a shared subscription")
        if durable in (m.Durable.LAST_VALUE, m.Durable.MAP):
            if not settings.keys and settings.key_prefix is None:
                raise InvalidRequest("a last-value subscription names keys, a key prefix, or both")
            for wanted in settings.keys:
                check_key(wanted)
        return durable

    async def _subscribe_reliable(
        self,
        session: Session,
        request: m.SubscribeRequest,
        topic: Topic,
        sub_type: m.SubscriptionType,
    ) -> m.Response:
        subscription = await self.catalog.subscription(
            topic, request.subscription, sub_type, request.settings
        )
        return self._attach(session, request, topic, subscription, sub_type)

    async def _subscribe_last_value(
        self,
        session: Session,
        request: m.SubscribeRequest,
        topic: Topic,
        sub_type: m.SubscriptionType,
    ) -> m.Response:
        index = await self.catalog.enable_last_value(topic)
        if request.subscription in topic.subscriptions:
            existing = topic.subscriptions[request.subscription]
            if not isinstance(existing, LastValueSubscription):
                raise InvalidRequest(
                    f"subscription {request.subscription!r} exists and is not a last-value one"
                )
            raise ConsumerBusy(
                f"last-value subscription {request.subscription!r} already has its consumer"
            )
        view = LastValueSubscription(
            topic.name,
            request.subscription,
            sub_type,
            request.settings.keys,
            request.settings.key_prefix,
        )
        return self._attach(session, request, topic, view, sub_type, index)

    def _attach(
        self,
        session: Session,
        request: m.SubscribeRequest,
        topic: Topic,
        subscription: Subscription | ReliableSubscription | LastValueSubscription,
        sub_type: m.SubscriptionType,
        index: LastValueIndex | None = None,
    ) -> m.SubscribeResponse:
        if subscription.sub_type != sub_type:
            raise SubscriptionTypeMismatch(
                f"subscription {request.subscription!r} is {subscription.sub_type.name.lower()}, "
                f"not {sub_type.name.lower()}"
            )
        consumer = Consumer(
            consumer_id=next(self._consumer_ids),
            name=request.consumer_name,
            priority=request.priority,
            session=session,
            subscription=subscription,
            credits=request.initial_credits,
        )
        if isinstance(subscription, LastValueSubscription):
            subscription.attach(consumer, index)
        else:
            subscription.attach(consumer)
        topic.subscriptions[subscription.name] = subscription
        session.consumers[consumer.consumer_id] = consumer
        # Deliveries must follow the SUBSCRIBE response, which the connection writes on return.
        asyncio.get_running_loop().call_soon(subscription.drain)
        log.info(
            "consumer.attached",
            topic=topic.name,
            subscription=subscription.name,
            type=sub_type.name.lower(),
            consumer=consumer.name,
            consumer_id=consumer.consumer_id,
            peer=session.peer,
        )
        return m.SubscribeResponse(consumer.consumer_id)

    def flow(self, session: Session, request: m.FlowRequest) -> m.EmptyResponse:
        consumer = self._consumer(session, request.consumer_id)
        if not 0 < request.credits <= MAX_CREDITS:
            raise InvalidRequest(f"credits must be 1..{MAX_CREDITS}, not {request.credits}")
        consumer.subscription.grant(consumer, request.credits)
        return m.EmptyResponse()

    def ack(self, session: Session, request: m.AckRequest) -> m.EmptyResponse:
        consumer = self._consumer(session, request.consumer_id)
        if len(request.acks) > MAX_ACKS_PER_REQUEST:
            raise InvalidRequest(f"at most {MAX_ACKS_PER_REQUEST} acks per request")
        if request.kind not in (m.AckKind.INDIVIDUAL, m.AckKind.CUMULATIVE):
            raise InvalidRequest(f"unknown ack kind {request.kind} (0 individual, 1 cumulative)")
        consumer.subscription.ack(consumer, request.acks, request.kind)
        return m.EmptyResponse()

    def nack(self, session: Session, request: m.NackRequest) -> m.EmptyResponse:
        consumer = self._consumer(session, request.consumer_id)
        if len(request.acks) > MAX_ACKS_PER_REQUEST:
            raise InvalidRequest(f"at most {MAX_ACKS_PER_REQUEST} nacks per request")
        consumer.subscription.nack(consumer, request.acks, request.delay_ms)
        return m.EmptyResponse()

    def unsubscribe(self, session: Session, request: m.UnsubscribeRequest) -> m.EmptyResponse:
        self.detach(self._consumer(session, request.consumer_id))
        return m.EmptyResponse()

    def detach(self, consumer: Consumer) -> None:
        """Remove a consumer; a non-reliable subscription ends with its last consumer."""
        consumer.session.consumers.pop(consumer.consumer_id, None)
        subscription = consumer.subscription
        subscription.detach(consumer)
        topic = self.catalog.topics.get(subscription.topic)
        if (
            isinstance(subscription, Subscription | LastValueSubscription)
            and not subscription.consumers
            and topic is not None
            and topic.subscriptions.get(subscription.name) is subscription
        ):
            del topic.subscriptions[subscription.name]
        log.info(
            "consumer.detached",
            topic=subscription.topic,
            subscription=subscription.name,
            consumer_id=consumer.consumer_id,
        )

    async def seek(self, session: Session, request: m.SeekRequest) -> m.Response:
        topic = self._topic(request.topic)
        await self.catalog.seek(topic, request.subscription, request.start, request.start_value)
        return m.EmptyResponse()

    async def delete_subscription(
        self, session: Session, request: m.DeleteSubscriptionRequest
    ) -> m.Response:
        topic = self._topic(request.topic)
        subscription = topic.subscriptions.get(request.subscription)
        if subscription is not None:
            self._close_consumers(
                list(subscription.consumers.values()), f"subscription {subscription.name!r} deleted"
            )
        await self.catalog.delete_subscription(topic, request.subscription)
        return m.EmptyResponse()

    def _close_consumers(self, consumers: list[Consumer], reason: str) -> None:
        for consumer in consumers:
            consumer.session.consumers.pop(consumer.consumer_id, None)
            consumer.subscription.detach(consumer)
            consumer.session.send_consumer_closed(
                consumer.consumer_id, ErrorCode.UNKNOWN_TOPIC, reason
            )

    # Map durables

    async def _index(self, topic_name: str) -> tuple[Topic, LastValueIndex]:
        topic = self._topic(topic_name)
        return topic, await self.catalog.enable_last_value(topic)

    def map_get(self, session: Session, request: m.MapGetRequest) -> Result:
        if len(request.keys) > MAX_MAP_KEYS:
            raise InvalidRequest(f"at most {MAX_MAP_KEYS} keys per request")
        for wanted in request.keys:
            check_key(wanted)
        index = self._topic(request.topic).last_value
        if index is not None:  # the hot path: no task, no await
            return m.MapGetResponse(tuple(_entry(k, index.get(k)) for k in request.keys))
        return self._map_get_after_enabling(request)

    async def _map_get_after_enabling(self, request: m.MapGetRequest) -> m.Response:
        _, index = await self._index(request.topic)
        return m.MapGetResponse(tuple(_entry(k, index.get(k)) for k in request.keys))

    def map_set(self, session: Session, request: m.MapSetRequest) -> Result:
        if not request.writes or len(request.writes) > MAX_MAP_KEYS:
            raise InvalidRequest(f"a set holds 1..{MAX_MAP_KEYS} writes")
        for write in request.writes:
            check_key(write.key)
            if write.expected_revision < -2:
                raise InvalidRequest("expected_revision: -1 any, -2 absent, or a revision >= 0")
        topic = self._topic(request.topic)
        if topic.last_value is None:
            return self._map_set_after_enabling(request)
        return self._map_set(topic, topic.last_value, request)

    async def _map_set_after_enabling(self, request: m.MapSetRequest) -> m.Response:
        topic, index = await self._index(request.topic)
        result = self._map_set(topic, index, request)
        if inspect.isawaitable(result):
            return await result
        return result

    def _map_set(self, topic: Topic, index: LastValueIndex, request: m.MapSetRequest) -> Result:
        """Synchronous up to the fsync wait (if the topic's policy needs one): no task."""
        if index.key_field:
            raise InvalidRequest(
                f"topic {topic.name!r} takes keys from field {index.key_field!r} of its values: "
                "produce records to it instead of setting keys"
            )
        # Check every expectation, then write, with no await between: the check holds.
        for write in request.writes:
            current = index.get(write.key)
            revision = -2 if current is None else current.offset
            if write.expected_revision != -1 and write.expected_revision != revision:
                found = "absent" if current is None else f"at revision {revision}"
                wanted = (
                    "absent"
                    if write.expected_revision == -2
                    else f"at revision {write.expected_revision}"
                )
                raise RevisionMismatch(f"key {write.key!r} is {found}, expected {wanted}")
        by_partition: dict[int, list[tuple[int, m.MapWrite]]] = {}
        for position, write in enumerate(request.writes):
            index_of_partition = zlib.crc32(write.key) % len(topic.partitions)
            by_partition.setdefault(index_of_partition, []).append((position, write))
        revisions = [0] * len(request.writes)
        waits = []
        for partition_index, writes in by_partition.items():
            partition = topic.partitions[partition_index]
            batch = build_batch([(w.key, w.value, ()) for _, w in writes])
            base_offset, sequence = topic.append(partition, batch, len(writes))
            for delta, (position, _) in enumerate(writes):
                revisions[position] = base_offset + delta
            assert partition.log is not None
            if partition.log.must_wait(sequence):
                waits.append(partition.log.wait_durable(sequence))
        response = m.MapSetResponse(tuple(revisions))
        if not waits:
            return response
        return _after(asyncio.gather(*waits), response)

    async def map_scan(self, session: Session, request: m.MapScanRequest) -> m.Response:
        if not 1 <= request.limit <= MAX_MAP_KEYS:
            raise InvalidRequest(f"scan limit must be 1..{MAX_MAP_KEYS}")
        _, index = await self._index(request.topic)
        values, cursor = index.scan(request.prefix, request.after, request.limit)
        return m.MapScanResponse(tuple(_entry(v.key, v) for v in values), cursor)

    async def map_size(self, session: Session, request: m.MapSizeRequest) -> m.Response:
        _, index = await self._index(request.topic)
        return m.MapSizeResponse(index.size())

    # Admin

    async def create_topic(self, session: Session, request: m.CreateTopicRequest) -> m.Response:
        await self.catalog.create_topic(request)
        return m.EmptyResponse()

    async def delete_topic(self, session: Session, request: m.DeleteTopicRequest) -> m.Response:
        topic = self._topic(request.name)
        for subscription in list(topic.subscriptions.values()):
            self._close_consumers(
                list(subscription.consumers.values()), f"topic {topic.name!r} was deleted"
            )
        await self.catalog.delete_topic(topic)
        return m.EmptyResponse()

    def list_topics(self, session: Session, request: m.ListTopicsRequest) -> m.ListTopicsResponse:
        return m.ListTopicsResponse(tuple(t.info for _, t in sorted(self.catalog.topics.items())))

    def describe_topic(
        self, session: Session, request: m.DescribeTopicRequest
    ) -> m.DescribeTopicResponse:
        return self._topic(request.name).describe()

    def api_versions(
        self, session: Session, request: m.ApiVersionsRequest
    ) -> m.ApiVersionsResponse:
        return m.ApiVersionsResponse(
            tuple(
                m.ApiVersionRange(k, lo, hi) for k, (lo, hi) in sorted(SUPPORTED_VERSIONS.items())
            )
        )


MAX_MAP_KEYS = 1000  # keys per get/set request, entries per scan page


def _entry(record_key: bytes, stored: StoredValue | None) -> m.MapEntry:
    if stored is None:
        return m.MapEntry(record_key, False, -1, -1, -1, None)
    return m.MapEntry(
        record_key, True, stored.offset, stored.partition, stored.timestamp, stored.value
    )


async def _after(waiting: Awaitable[Any], response: m.Response) -> m.Response:
    await waiting
    return response
