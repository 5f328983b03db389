"""The broker: topics, subscriptions and consumers, and one handler per request type.

Handlers run on the event loop, synchronously: a non-reliable produce is a validate, a stamp and
a fan-out, with nothing to wait for. Each raises a `HeadwaterError` subclass for a bad request; the
connection turns it into an error response. Consumer ids are unique across the server, and a
connection may only act on the consumers it created.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import structlog

from server.config import ServerConfig
from server.subscription import Consumer, Subscription
from server.subscription import ConsumerSession as Session
from server.topics import Topic
from storage.metadata import MetadataStore
from wire import messages as m
from wire.codec import SUPPORTED_VERSIONS
from wire.errors import (
    ErrorCode,
    InvalidRequest,
    NotSupported,
    SubscriptionTypeMismatch,
    TopicExists,
    UnknownConsumer,
    UnknownTopic,
)
from wire.limits import MAX_ACKS_PER_REQUEST, MAX_CREDITS, MAX_PARTITIONS
from wire.names import check_name, check_topic_name
from wire.records import validate_records

log = structlog.get_logger("headwater.broker")


class Broker:
    def __init__(self, config: ServerConfig, metadata: MetadataStore) -> None:
        self._config = config
        self._metadata = metadata
        self._consumer_ids = itertools.count(1)
        self.topics: dict[str, Topic] = {t.name: Topic(t) for t in metadata.load_topics()}
        self._handlers: dict[type, Callable[[Session, Any], m.Response]] = {
            m.ProduceRequest: self.produce,
            m.SubscribeRequest: self.subscribe,
            m.FlowRequest: self.flow,
            m.AckRequest: self.ack,
            m.UnsubscribeRequest: self.unsubscribe,
            m.CreateTopicRequest: self.create_topic,
            m.DeleteTopicRequest: self.delete_topic,
            m.ListTopicsRequest: self.list_topics,
            m.DescribeTopicRequest: self.describe_topic,
            m.ApiVersionsRequest: self.api_versions,
        }

    def handle(self, session: Session, request: m.Request) -> m.Response:
        return self._handlers[type(request)](session, request)

    def _topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            raise UnknownTopic(f"topic {name!r} does not exist")
        return topic

    def _consumer(self, session: Session, consumer_id: int) -> Consumer:
        consumer = session.consumers.get(consumer_id)
        if consumer is None:
            raise UnknownConsumer(f"consumer {consumer_id} is not open on this connection")
        return consumer

    # Messages

    def produce(self, session: Session, request: m.ProduceRequest) -> m.ProduceResponse:
        topic = self._topic(request.topic)
        partition = topic.pick_partition(request.partition)
        info = validate_records(request.batch)
        base_offset = topic.publish(partition, request.batch, info.record_count)
        return m.ProduceResponse(partition.index, base_offset)

    def subscribe(self, session: Session, request: m.SubscribeRequest) -> m.SubscribeResponse:
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
        subscription = topic.subscriptions.get(request.subscription)
        if subscription is None:
            subscription = Subscription(
                topic.name, request.subscription, sub_type, self._config.subscription_backlog
            )
        elif subscription.sub_type != sub_type:
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
        # Non-reliable topics keep nothing to acknowledge: acks are checked and ignored.
        self._consumer(session, request.consumer_id)
        if len(request.acks) > MAX_ACKS_PER_REQUEST:
            raise InvalidRequest(f"at most {MAX_ACKS_PER_REQUEST} acks per request")
        return m.EmptyResponse()

    def unsubscribe(self, session: Session, request: m.UnsubscribeRequest) -> m.EmptyResponse:
        self.detach(self._consumer(session, request.consumer_id))
        return m.EmptyResponse()

    def detach(self, consumer: Consumer) -> None:
        """Remove a consumer; a non-reliable subscription ends with its last consumer."""
        consumer.session.consumers.pop(consumer.consumer_id, None)
        subscription = consumer.subscription
        subscription.detach(consumer)
        topic = self.topics.get(subscription.topic)
        if (
            not subscription.consumers
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

    # Admin

    def create_topic(self, session: Session, request: m.CreateTopicRequest) -> m.EmptyResponse:
        check_topic_name(request.name)
        if not 1 <= request.partitions <= MAX_PARTITIONS:
            raise InvalidRequest(
                f"partitions must be 1..{MAX_PARTITIONS}, not {request.partitions}"
            )
        try:
            dispatch = m.DispatchMode(request.dispatch)
        except ValueError:
            raise InvalidRequest(
                f"unknown dispatch mode {request.dispatch} (0 non-reliable, 1 reliable)"
            ) from None
        if dispatch == m.DispatchMode.RELIABLE:
            raise NotSupported(
                "reliable dispatch is not yet supported by this server; "
                "create the topic with dispatch non-reliable"
            )
        if request.name in self.topics:
            raise TopicExists(f"topic {request.name!r} already exists")
        info = m.TopicInfo(request.name, request.partitions, dispatch)
        self._metadata.save_topic(info)
        self.topics[info.name] = Topic(info)
        log.info(
            "topic.created", topic=info.name, partitions=info.partitions, dispatch=dispatch.name
        )
        return m.EmptyResponse()

    def delete_topic(self, session: Session, request: m.DeleteTopicRequest) -> m.EmptyResponse:
        topic = self._topic(request.name)
        self._metadata.delete_topic(topic.name)
        del self.topics[topic.name]
        for subscription in topic.subscriptions.values():
            for consumer in list(subscription.consumers.values()):
                consumer.session.consumers.pop(consumer.consumer_id, None)
                consumer.session.send_consumer_closed(
                    consumer.consumer_id,
                    ErrorCode.UNKNOWN_TOPIC,
                    f"topic {topic.name!r} was deleted",
                )
        log.info("topic.deleted", topic=topic.name)
        return m.EmptyResponse()

    def list_topics(self, session: Session, request: m.ListTopicsRequest) -> m.ListTopicsResponse:
        return m.ListTopicsResponse(tuple(t.info for _, t in sorted(self.topics.items())))

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

    def close(self) -> None:
        self._metadata.close()
