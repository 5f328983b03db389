"""Consumer requests: SUBSCRIBE, FLOW, ACK, NACK, UNSUBSCRIBE, SEEK, DELETE_SUBSCRIPTION.

A subscribe picks the subscription kind from the topic and the requested durable: live (a
non-reliable topic, or durable none), reliable (standard, shared) or last-value (last-value, map),
finds or makes the subscription, and attaches a consumer; from then on every request goes to the
subscription through `SubscriptionKind`, whatever its kind. Consumer ids are unique across the
server, and a connection may only act on the consumers it created.

A consumer's connection may hold at most `max_consumers_per_connection` consumers
(TOO_MANY_SUBSCRIPTIONS) and a subscription at most `max_consumers_per_subscription`
(TOO_MANY_CONSUMERS).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import structlog

from headwater.durables.lastvalue import check_key
from headwater.server.catalog.topic_catalog import TopicCatalog
from headwater.server.config import ServerConfig
from headwater.server.memory_budget import (
    MemoryBudget,
    default_max_bytes,
    default_principal_share,
)
from headwater.server.reply import AfterWork, Reply
from headwater.server.request_table import handles
from headwater.server.requests.map_requests import no_last_value_state
from headwater.server.subscriptions.live_subscription import Subscription
from headwater.server.topics.lastvalue_index import LastValueSubscription
from headwater.server.topics.subscription_contract import Consumer, SubscriptionKind
from headwater.server.topics.subscription_contract import ConsumerSession as Session
from headwater.server.topics.topic import LogTopic, Topic
from headwater.wire import messages as m
from headwater.wire.errors import (
    ConsumerBusy,
    ErrorCode,
    InvalidPartition,
    InvalidRequest,
    OverMemoryBudget,
    SubscriptionTypeMismatch,
    TooManyConsumers,
    TooManySubscriptions,
    UnknownConsumer,
    UnknownSubscription,
    UnknownTopic,
)
from headwater.wire.limits import (
    MAX_ACK_RANGES_PER_REQUEST,
    MAX_ACKS_PER_REQUEST,
    MAX_CREDITS,
    MAX_OFFSETS_PER_ACK_RANGES,
)
from headwater.wire.names import check_name

log = structlog.get_logger(__name__)


class ConsumerHandlers:
    def __init__(
        self,
        config: ServerConfig,
        catalog: TopicCatalog,
        memory: MemoryBudget | None = None,
        on_detached: Callable[[Consumer], None] | None = None,
    ) -> None:
        self._config = config
        self._catalog = catalog
        if memory is None:
            budget = config.memory_max_bytes or default_max_bytes()
            share = config.memory_max_bytes_per_principal or default_principal_share(budget)
            memory = MemoryBudget(budget, min(share, budget))
        self.memory = memory
        self._consumer_ids = itertools.count(1)
        # told after every detach (a cluster releases an Exclusive subscription's holder)
        self._on_detached = on_detached

    def new_consumer_id(self) -> int:
        """A consumer id no other consumer of the server has (a Kafka share member's too)."""
        return next(self._consumer_ids)

    def _topic(self, name: str) -> Topic:
        topic = self._catalog.topics.get(name)
        if topic is None:
            raise UnknownTopic(f"topic {name!r} does not exist")
        return topic

    @staticmethod
    def _consumer(session: Session, consumer_id: int) -> Consumer:
        consumer = session.consumers.get(consumer_id)
        if consumer is None:
            raise UnknownConsumer(f"consumer {consumer_id} is not open on this connection")
        return consumer

    @handles(m.SubscribeRequest, "topic", "consume", in_turn=True)
    def subscribe(self, session: Session, request: m.SubscribeRequest) -> Reply:
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
                f"unknown subscription type {request.sub_type} "
                "(0 exclusive, 1 shared, 2 failover, 3 key_shared)"
            ) from None
        if not 0 <= request.initial_credits <= MAX_CREDITS:
            raise InvalidRequest(f"initial credits must be 0..{MAX_CREDITS}")
        durable = _durable_kind(topic, sub_type, request.settings)
        _check_partitions(topic, sub_type, durable, request.partitions)
        if topic.reliable and durable in (m.Durable.LAST_VALUE, m.Durable.MAP):
            return AfterWork(self._subscribe_last_value(session, request, topic, sub_type))
        if topic.reliable and durable != m.Durable.NONE:
            return AfterWork(self._subscribe_reliable(session, request, topic, sub_type))
        if request.settings.start != m.StartPosition.LATEST:
            raise InvalidRequest(
                f"a subscription on non-reliable topic {topic.name!r} or with durable none "
                "keeps no history: it can only start at latest"
            )
        subscription = topic.subscriptions.get(request.subscription)
        if subscription is None:
            self._check_room(session.principal)
            subscription = Subscription(
                topic.name,
                request.subscription,
                sub_type,
                self._config.subscription_backlog,
                self._config.subscription_backlog_bytes,
                self.memory,
                session.principal,
            )
            subscription.group.partitions = len(topic.partitions)
        elif subscription.durable != m.Durable.NONE:
            raise InvalidRequest(
                f"subscription {request.subscription!r} exists and is durable; "
                "pick another name for a non-durable one"
            )
        return self._attach(session, request, topic, subscription, sub_type)

    def _check_room(self, principal: str) -> None:
        """A new live subscription's backlog starts empty, so nothing can be dropped or slowed
        for it; if its principal's share (or the budget) could not take even one largest batch,
        it would drop everything it was made for: refuse it, retriably, instead."""
        room = self.memory.room(principal)
        if room < self._config.max_frame_size:
            who = f"principal {principal!r}" if principal else "the server"
            raise OverMemoryBudget(
                f"{who} holds {self.memory.by_principal.get(principal, 0)} of its "
                f"{self.memory.share(principal)}-byte memory share "
                f"(server: {self.memory.used} of {self.memory.max_bytes}): a new subscription "
                "could not hold one batch; retry once its consumers have taken their backlogs"
            )

    async def _subscribe_reliable(
        self,
        session: Session,
        request: m.SubscribeRequest,
        topic: LogTopic,
        sub_type: m.SubscriptionType,
    ) -> Reply:
        subscription = await self._catalog.subscriptions.get_or_create(
            topic, request.subscription, sub_type, request.settings
        )
        return self._attach(session, request, topic, subscription, sub_type)

    async def _subscribe_last_value(
        self,
        session: Session,
        request: m.SubscribeRequest,
        topic: LogTopic,
        sub_type: m.SubscriptionType,
    ) -> Reply:
        if topic.last_value is None:  # a subscription is a read: it must not switch the state on
            raise no_last_value_state(topic.name)
        index = await self._catalog.enable_last_value(topic)  # finishes a build under way
        existing = topic.subscriptions.get(request.subscription)
        if existing is not None:
            if existing.durable != m.Durable.LAST_VALUE:
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
            index,
        )
        return self._attach(session, request, topic, view, sub_type)

    def _attach(
        self,
        session: Session,
        request: m.SubscribeRequest,
        topic: Topic,
        subscription: SubscriptionKind,
        sub_type: m.SubscriptionType,
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
            consumer_id=self.new_consumer_id(),
            name=request.consumer_name,
            priority=request.priority,
            session=session,
            subscription=subscription,
            credits=request.initial_credits,
            partitions=frozenset(request.partitions) or None,
        )
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

    # on a consumer the connection holds: authorized when it subscribed (so too the next four)
    @handles(m.FlowRequest)
    def flow(self, session: Session, request: m.FlowRequest) -> m.EmptyResponse:
        consumer = self._consumer(session, request.consumer_id)
        if not 0 < request.credits <= MAX_CREDITS:
            raise InvalidRequest(f"credits must be 1..{MAX_CREDITS}, not {request.credits}")
        consumer.subscription.grant(consumer, request.credits)
        return m.EmptyResponse()

    @handles(m.AckRequest)
    def ack(self, session: Session, request: m.AckRequest) -> m.EmptyResponse:
        consumer = self._consumer(session, request.consumer_id)
        if len(request.acks) > MAX_ACKS_PER_REQUEST:
            raise InvalidRequest(f"at most {MAX_ACKS_PER_REQUEST} acks per request")
        if request.kind not in (m.AckKind.INDIVIDUAL, m.AckKind.CUMULATIVE):
            raise InvalidRequest(f"unknown ack kind {request.kind} (0 individual, 1 cumulative)")
        consumer.subscription.ack(consumer, request.acks, request.kind)
        return m.EmptyResponse()

    @handles(m.AckRangesRequest)
    def ack_ranges(self, session: Session, request: m.AckRangesRequest) -> m.EmptyResponse:
        consumer = self._consumer(session, request.consumer_id)
        ranges = request.ranges
        if len(ranges) > MAX_ACK_RANGES_PER_REQUEST:
            raise InvalidRequest(f"at most {MAX_ACK_RANGES_PER_REQUEST} ranges per request")
        covered = 0
        for entry in ranges:
            if entry.count < 1:
                raise InvalidRequest(f"an ack range counts 1 or more offsets, not {entry.count}")
            covered += entry.count
        if covered > MAX_OFFSETS_PER_ACK_RANGES:
            raise InvalidRequest(
                f"ranges cover {covered} offsets; at most {MAX_OFFSETS_PER_ACK_RANGES} a request"
            )
        consumer.subscription.ack_ranges(consumer, ranges)
        return m.EmptyResponse()

    @handles(m.NackRequest)
    def nack(self, session: Session, request: m.NackRequest) -> m.EmptyResponse:
        consumer = self._consumer(session, request.consumer_id)
        if len(request.acks) > MAX_ACKS_PER_REQUEST:
            raise InvalidRequest(f"at most {MAX_ACKS_PER_REQUEST} nacks per request")
        consumer.subscription.nack(consumer, request.acks, request.delay_ms)
        return m.EmptyResponse()

    @handles(m.UnsubscribeRequest)
    def unsubscribe(self, session: Session, request: m.UnsubscribeRequest) -> m.EmptyResponse:
        self.detach(self._consumer(session, request.consumer_id))
        return m.EmptyResponse()

    def detach(self, consumer: Consumer) -> None:
        """Remove a consumer; a subscription that is not persistent ends with its last one."""
        consumer.session.consumers.pop(consumer.consumer_id, None)
        subscription = consumer.subscription
        subscription.detach(consumer)
        topic = self._catalog.topics.get(subscription.topic)
        if (
            not subscription.persistent
            and not subscription.consumers
            and topic is not None
            and topic.subscriptions.get(subscription.name) is subscription
        ):
            del topic.subscriptions[subscription.name]
            if isinstance(subscription, Subscription):
                subscription.drop_backlog()
        log.info(
            "consumer.detached",
            topic=subscription.topic,
            subscription=subscription.name,
            consumer_id=consumer.consumer_id,
        )
        if self._on_detached is not None:
            self._on_detached(consumer)

    @handles(m.SeekRequest, "topic", "owner-or-admin", in_turn=True)
    def seek(self, session: Session, request: m.SeekRequest) -> Reply:
        return AfterWork(self._seek(request))

    async def _seek(self, request: m.SeekRequest) -> Reply:
        topic = self._topic(request.topic)
        await self._catalog.subscriptions.seek(
            topic, request.subscription, request.start, request.start_value
        )
        return m.EmptyResponse()

    @handles(m.DeleteSubscriptionRequest, "topic", "owner-or-admin", in_turn=True)
    def delete_subscription(self, session: Session, request: m.DeleteSubscriptionRequest) -> Reply:
        return AfterWork(self._delete_subscription(request))

    async def _delete_subscription(self, request: m.DeleteSubscriptionRequest) -> Reply:
        topic = self._topic(request.topic)
        subscription = topic.subscriptions.get(request.subscription)
        if subscription is None:
            raise UnknownSubscription(
                f"topic {topic.name!r} has no subscription {request.subscription!r}"
            )
        close_consumers(
            list(subscription.consumers.values()),
            ErrorCode.UNKNOWN_SUBSCRIPTION,
            f"subscription {subscription.name!r} deleted",
        )
        await self._catalog.subscriptions.delete(topic, request.subscription)
        return m.EmptyResponse()


def close_consumers(consumers: list[Consumer], code: ErrorCode, reason: str) -> None:
    for consumer in consumers:
        consumer.session.consumers.pop(consumer.consumer_id, None)
        consumer.subscription.detach(consumer)
        consumer.session.send_consumer_closed(consumer.consumer_id, code, reason)


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
    shared = (m.SubscriptionType.SHARED, m.SubscriptionType.KEY_SHARED)
    if durable == m.Durable.STANDARD and sub_type == m.SubscriptionType.KEY_SHARED:
        raise InvalidRequest("a standard durable takes an exclusive or failover subscription")
    if durable == m.Durable.SHARED and sub_type not in shared:
        raise InvalidRequest("a shared durable takes a shared or key-shared subscription")
    last_value = (m.Durable.LAST_VALUE, m.Durable.MAP)
    if durable in last_value and sub_type == m.SubscriptionType.KEY_SHARED:
        raise InvalidRequest("a last-value subscription has one consumer: not key-shared")
    if durable in (m.Durable.LAST_VALUE, m.Durable.MAP):
        if not settings.keys and settings.key_prefix is None:
            raise InvalidRequest("a last-value subscription names keys, a key prefix, or both")
        for wanted in settings.keys:
            check_key(wanted)
    return durable


def _check_partitions(
    topic: Topic, sub_type: m.SubscriptionType, durable: m.Durable, partitions: tuple[int, ...]
) -> None:
    if not partitions:
        return
    count = len(topic.partitions)
    for partition in partitions:
        if not 0 <= partition < count:
            raise InvalidPartition(
                f"topic {topic.name!r} has partitions 0..{count - 1}, not {partition}"
            )
    if sub_type == m.SubscriptionType.KEY_SHARED:
        raise InvalidRequest("a key-shared consumer takes every partition: it cannot choose")
    if durable in (m.Durable.LAST_VALUE, m.Durable.MAP):
        raise InvalidRequest("a last-value subscription takes keys, not partitions")
