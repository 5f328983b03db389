"""Admin: CREATE_TOPIC, DELETE_TOPIC, LIST_TOPICS, DESCRIBE_TOPIC, INIT_PRODUCER_ID, API_VERSIONS,
CREATE_PARTITIONS.

No fast paths: these are rare, and construct's declarations are their only layout description.
"""

from __future__ import annotations

from typing import Final

from construct import Flag, Int8sb, Int16sb, Int32sb, Int64sb, PrefixedArray

from headwater.wire import messages as m
from headwater.wire.api.base import EMPTY_RESPONSE, Api, String, message

CONFIG_ENTRIES = PrefixedArray(Int32sb, message(m.ConfigEntry, "name" / String, "value" / String))
TOPIC_INFO = message(
    m.TopicInfo,
    "name" / String,
    "partitions" / Int32sb,
    "dispatch" / Int8sb,
    "configs" / CONFIG_ENTRIES,
)
CONSUMER_INFO = message(
    m.ConsumerInfo,
    "consumer_id" / Int32sb,
    "name" / String,
    "priority" / Int32sb,
    "credits" / Int32sb,
    "active" / Flag,
)
SUBSCRIPTION_INFO = message(
    m.SubscriptionInfo,
    "name" / String,
    "sub_type" / Int8sb,
    "pending" / Int64sb,
    "delivered" / Int64sb,
    "dropped" / Int64sb,
    "consumers" / PrefixedArray(Int32sb, CONSUMER_INFO),
    "unacked" / Int64sb,
    "dead_lettered" / Int64sb,
)

APIS: Final = (
    Api(
        m.ApiKey.CREATE_TOPIC,
        message(
            m.CreateTopicRequest,
            "name" / String,
            "partitions" / Int32sb,
            "dispatch" / Int8sb,
            "configs" / CONFIG_ENTRIES,
        ),
        EMPTY_RESPONSE,
    ),
    Api(m.ApiKey.DELETE_TOPIC, message(m.DeleteTopicRequest, "name" / String), EMPTY_RESPONSE),
    Api(
        m.ApiKey.LIST_TOPICS,
        message(m.ListTopicsRequest),
        message(m.ListTopicsResponse, "topics" / PrefixedArray(Int32sb, TOPIC_INFO)),
    ),
    Api(
        m.ApiKey.DESCRIBE_TOPIC,
        message(m.DescribeTopicRequest, "name" / String),
        message(
            m.DescribeTopicResponse,
            "topic" / TOPIC_INFO,
            "next_offsets" / PrefixedArray(Int32sb, Int64sb),
            "start_offsets" / PrefixedArray(Int32sb, Int64sb),
            "messages_in" / Int64sb,
            "bytes_in" / Int64sb,
            "subscriptions" / PrefixedArray(Int32sb, SUBSCRIPTION_INFO),
        ),
    ),
    Api(
        m.ApiKey.INIT_PRODUCER_ID,
        message(m.InitProducerIdRequest),
        message(m.InitProducerIdResponse, "producer_id" / Int64sb, "producer_epoch" / Int16sb),
    ),
    Api(
        m.ApiKey.API_VERSIONS,
        message(m.ApiVersionsRequest),
        message(
            m.ApiVersionsResponse,
            "apis"
            / PrefixedArray(
                Int32sb,
                message(
                    m.ApiVersionRange,
                    "api_key" / Int16sb,
                    "min_version" / Int16sb,
                    "max_version" / Int16sb,
                ),
            ),
        ),
    ),
    Api(
        m.ApiKey.CREATE_PARTITIONS,
        message(m.CreatePartitionsRequest, "name" / String, "partitions" / Int32sb),
        EMPTY_RESPONSE,
    ),
)
