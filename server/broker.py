"""The broker: topics, subscriptions and consumers, and one handler per request type.

Handlers run on the event loop. Most finish synchronously (a non-reliable produce is a validate, a
stamp and a fan-out); those that must wait return a coroutine that the connection awaits before
answering: a reliable produce under fsync `always` waits for its group commit, a reliable
subscribe may read the WAL to find a timestamp. Each raises a `HeadwaterError` subclass for a
bad request; the connection turns it into an error response. Consumer ids are unique across the
server, and a connection may only act on the consumers it created.

Reliable topics and subscriptions live in `TopicCatalog`, which owns their files and state.
Requests that change a topic or may await while acting on it (create, delete, subscribe, seek,
DELETE_SUBSCRIPTION, a map request whose state is not built yet) run in a turn of the topic's
name (`server.locks`), taken when the request is read; so does any other request naming a topic
whose line is not empty, so pipelined requests keep their order. A handler in a turn looks the
topic up once the turn is its own: a request that lost a race with a delete gets UNKNOWN_TOPIC,
never a half-made subscription on a deleted topic.

A consumer's connection may hold at most `max_consumers_per_connection` consumers
(TOO_MANY_SUBSCRIPTIONS) and a subscription at most `max_consumers_per_subscription`
(TOO_MANY_CONSUMERS).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from durables.lastvalue import LastValueIndex, check_key
from server.catalog import TopicCatalog
from server.config import ServerConfig
from server.lastvalue import LastValueSubscription
from server.locks import Turn
from server.maps import MapHandlers
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
    SubscriptionTypeMismatch,
    TooManyConsumers,
    TooManySubscriptions,
    UnknownConsumer,
    UnknownProducerId,
    UnknownSubscription,
    UnknownTopic,
)
from wire.limits import MAX_ACKS_PER_REQUEST, MAX_CREDITS
from wire.names import check_name
from wire.records import BatchInfo, read_records, validate_records

log = structlog.get_logger("headwater.broker")

Result = m.Response | Awaitable[m.Response]


class Broker:
    def __init__(self, config: ServerConfig, catalog: TopicCatalog) -> None:
        self._config = config
        self.catalog = catalog
        self._consumer_ids = itertools.count(1)
        self.maps = MapHandlers(catalog)
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
            m.MapGetRequest: self.maps.map_get,
            m.MapSetRequest: self.maps.map_set,
            m.MapScanRequest: self.maps.map_scan,
            m.MapSizeRequest: self.maps.map_size,
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
        handler = self._handlers[type(request)]
        kind = type(request)
        name = _topic_named(request)
        if name is not None and (
            kind in _IN_TURN
            or self.catalog.busy(name)
            or (kind in _MAP_REQUESTS and not self.maps.ready(name))
        ):
            return self._in_turn(self.catalog.turn(name), handler, session, request)
        return handler(session, request)

    async def _in_turn(
        self,
        turn: Turn,
        handler: Callable[[Session, Any], Result],
        session: Session,
        request: m.Request,
    ) -> m.Response:
        async with turn:
            result = handler(session, request)
            if not inspect.isawaitable(result):
                return result
            if type(request) in _IN_TURN or type(request) in _MAP_REQUESTS:
                return await result
        # A produce's append is done: its fsync wait needs no turn, and holding one through it
        # would serialise the produces queued behind it, one fsync each.
        return await result

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
        if request.isolation not in (m.Isolation.READ_UNCOMMITTED, m.Isolation.READ_COMMITTED):
            raise InvalidRequest(
                f"unknown isolation {request.isolation} (0 read_uncommitted, 1 read_committed)"
            )
        if info is None:
            info = validate_records(request.batch, self._config.max_decompressed_batch)
        if request.partition == -1 and topic.last_value is not None:
            partition = topic.partitions[
                topic.last_value.partition_for(
                    read_records(request.batch, self._config.max_decompressed_batch)
                )
            ]
        else:
            partition = topic.pick_partition(request.partition)
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
        limit = self._config.max_consumers_per_connection
        if len(session.consumers) >= limit:
            raise TooManySubscriptions(
                f"this connection already has {limit} consumers (max_consumers_per_connection)"
            )
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
        subscription = await self.catalog.subscriptions.get_or_create(
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
        limit = self._config.max_consumers_per_connection
        if len(session.consumers) >= limit:  # checked again: a subscribe may have waited
            raise TooManySubscriptions(
                f"this connection already has {limit} consumers (max_consumers_per_connection)"
            )
        if len(subscription.consumers) >= self._config.max_consumers_per_subscription:
            raise TooManyConsumers(
                f"subscription {request.subscription!r} already has "
                f"{self._config.max_consumers_per_subscription} consumers "
                "(max_consumers_per_subscription)"
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
        await self.catalog.subscriptions.seek(
            topic, request.subscription, request.start, request.start_value
        )
        return m.EmptyResponse()

    async def delete_subscription(
        self, session: Session, request: m.DeleteSubscriptionRequest
    ) -> m.Response:
        topic = self._topic(request.topic)
        subscription = topic.subscriptions.get(request.subscription)
        if subscription is None:
            raise UnknownSubscription(
                f"topic {topic.name!r} has no subscription {request.subscription!r}"
            )
        self._close_consumers(
            list(subscription.consumers.values()),
            ErrorCode.UNKNOWN_SUBSCRIPTION,
            f"subscription {subscription.name!r} deleted",
        )
        await self.catalog.subscriptions.delete(topic, request.subscription)
        return m.EmptyResponse()

    def _close_consumers(self, consumers: list[Consumer], code: ErrorCode, reason: str) -> None:
        for consumer in consumers:
            consumer.session.consumers.pop(consumer.consumer_id, None)
            consumer.subscription.detach(consumer)
            consumer.session.send_consumer_closed(consumer.consumer_id, code, reason)

    def _close_topic_consumers(self, topic: Topic) -> None:
        for subscription in list(topic.subscriptions.values()):
            self._close_consumers(
                list(subscription.consumers.values()),
                ErrorCode.UNKNOWN_TOPIC,
                f"topic {topic.name!r} was deleted",
            )

    # Admin

    async def create_topic(self, session: Session, request: m.CreateTopicRequest) -> m.Response:
        await self.catalog.create_locked(request)
        return m.EmptyResponse()

    async def delete_topic(self, session: Session, request: m.DeleteTopicRequest) -> m.Response:
        self._topic(request.name)
        await self.catalog.delete_topic(request.name, self._close_topic_consumers)
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


_IN_TURN = frozenset(
    {
        m.SubscribeRequest,
        m.SeekRequest,
        m.DeleteSubscriptionRequest,
        m.CreateTopicRequest,
        m.DeleteTopicRequest,
    }
)
_MAP_REQUESTS = frozenset({m.MapGetRequest, m.MapSetRequest, m.MapScanRequest, m.MapSizeRequest})
_TOPIC_FIELD = {
    m.ProduceRequest: "topic",
    m.SubscribeRequest: "topic",
    m.SeekRequest: "topic",
    m.DeleteSubscriptionRequest: "topic",
    m.MapGetRequest: "topic",
    m.MapSetRequest: "topic",
    m.MapScanRequest: "topic",
    m.MapSizeRequest: "topic",
    m.CreateTopicRequest: "name",
    m.DeleteTopicRequest: "name",
    m.DescribeTopicRequest: "name",
}


def _topic_named(request: m.Request) -> str | None:
    """The topic a request acts on, if it names one."""
    field = _TOPIC_FIELD.get(type(request))
    return None if field is None else str(getattr(request, field))


async def _after(waiting: Awaitable[Any], response: m.Response) -> m.Response:
    await waiting
    return response
