"""One frozen dataclass per request, response and pushed frame, plus the enums they use.

These are plain values: how they become bytes is `wire.codec`'s job. Enum-valued fields hold plain
ints on the wire (`sub_type`, `dispatch`): the server checks them and answers an unknown value with
`INVALID_REQUEST`, rather than the codec failing on it as a malformed frame.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    SUBSCRIBE = 1
    FLOW = 2
    ACK = 3
    UNSUBSCRIBE = 4
    CREATE_TOPIC = 10
    DELETE_TOPIC = 11
    LIST_TOPICS = 12
    DESCRIBE_TOPIC = 13
    API_VERSIONS = 18
    # pushed by the server
    DELIVER = 100
    CONSUMER_CLOSED = 101


class SubscriptionType(enum.IntEnum):
    EXCLUSIVE = 0
    SHARED = 1
    FAILOVER = 2


class DispatchMode(enum.IntEnum):
    NON_RELIABLE = 0
    RELIABLE = 1


# Requests


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    topic: str
    partition: int
    batch: bytes  # one Kafka RecordBatch v2, base offset 0 (the server stamps it)


@dataclass(frozen=True, slots=True)
class SubscribeRequest:
    topic: str
    subscription: str
    sub_type: int
    consumer_name: str
    priority: int = 0  # Failover: the lowest value is active; ties go to the first name
    initial_credits: int = 0


@dataclass(frozen=True, slots=True)
class FlowRequest:
    consumer_id: int
    credits: int


@dataclass(frozen=True, slots=True)
class AckEntry:
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class AckRequest:
    consumer_id: int
    acks: tuple[AckEntry, ...]


@dataclass(frozen=True, slots=True)
class UnsubscribeRequest:
    consumer_id: int


@dataclass(frozen=True, slots=True)
class CreateTopicRequest:
    name: str
    partitions: int = 1
    dispatch: int = DispatchMode.NON_RELIABLE


@dataclass(frozen=True, slots=True)
class DeleteTopicRequest:
    name: str


@dataclass(frozen=True, slots=True)
class ListTopicsRequest:
    pass


@dataclass(frozen=True, slots=True)
class DescribeTopicRequest:
    name: str


@dataclass(frozen=True, slots=True)
class ApiVersionsRequest:
    pass


# Responses


@dataclass(frozen=True, slots=True)
class EmptyResponse:
    pass


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    partition: int
    base_offset: int


@dataclass(frozen=True, slots=True)
class SubscribeResponse:
    consumer_id: int


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: int
    dispatch: int


@dataclass(frozen=True, slots=True)
class ListTopicsResponse:
    topics: tuple[TopicInfo, ...]


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    consumer_id: int
    name: str
    priority: int
    credits: int
    active: bool


@dataclass(frozen=True, slots=True)
class SubscriptionInfo:
    name: str
    sub_type: int
    pending: int  # messages held for the subscription, not yet sent to a consumer
    delivered: int
    dropped: int  # messages lost because the subscription's consumers were too slow
    consumers: tuple[ConsumerInfo, ...]


@dataclass(frozen=True, slots=True)
class DescribeTopicResponse:
    topic: TopicInfo
    next_offsets: tuple[int, ...]  # per partition, the offset the next message will get
    messages_in: int
    bytes_in: int
    subscriptions: tuple[SubscriptionInfo, ...]


@dataclass(frozen=True, slots=True)
class ApiVersionRange:
    api_key: int
    min_version: int
    max_version: int


@dataclass(frozen=True, slots=True)
class ApiVersionsResponse:
    apis: tuple[ApiVersionRange, ...]


# Pushed by the server


@dataclass(frozen=True, slots=True)
class Delivery:
    """Records for a consumer. The consumer id travels in the header's correlation id field."""

    partition: int
    batch: bytes


@dataclass(frozen=True, slots=True)
class ConsumerClosed:
    """The server ended a consumer (e.g. its topic was deleted); no more deliveries will come."""

    error_code: int
    message: str


Request = (
    ProduceRequest
    | SubscribeRequest
    | FlowRequest
    | AckRequest
    | UnsubscribeRequest
    | CreateTopicRequest
    | DeleteTopicRequest
    | ListTopicsRequest
    | DescribeTopicRequest
    | ApiVersionsRequest
)
Response = (
    EmptyResponse
    | ProduceResponse
    | SubscribeResponse
    | ListTopicsResponse
    | DescribeTopicResponse
    | ApiVersionsResponse
)
