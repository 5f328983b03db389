"""Admin: CREATE_TOPIC, DELETE_TOPIC, LIST_TOPICS, DESCRIBE_TOPIC, INIT_PRODUCER_ID, API_VERSIONS,
ALTER_TOPIC_CONFIGS, LIST_SUBSCRIPTIONS, SERVER_INFO, CREATE_PARTITIONS.

No fast paths: these are rare, and construct's declarations are their only layout description.
The one array a request here carries (`configs`) is a `BoundedArray` of `MAX_TOPIC_CONFIGS`.
"""

from __future__ import annotations

from typing import Final

from construct import Computed, Flag, Int8sb, Int16sb, Int32sb, Int64sb, PrefixedArray, Select

from headwater.wire import messages as m
from headwater.wire.api.base import EMPTY_RESPONSE, Api, BoundedArray, String, message
from headwater.wire.limits import MAX_TOPIC_CONFIGS

CONFIG_ENTRY = message(m.ConfigEntry, "name" / String, "value" / String)
CONFIG_ENTRIES = PrefixedArray(Int32sb, CONFIG_ENTRY)
TOPIC_INFO = message(
    m.TopicInfo,
    "name" / String,
    "partitions" / Int32sb,
    "dispatch" / Int8sb,
    "configs" / CONFIG_ENTRIES,
)
PRINCIPAL_MEMORY = message(m.PrincipalMemory, "principal" / String, "used_bytes" / Int64sb)
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
PARTITION_INFO = message(
    m.PartitionInfo,
    "partition" / Int32sb,
    "start_offset" / Int64sb,
    "next_offset" / Int64sb,
    "local_start_offset" / Int64sb,
    "size_bytes" / Int64sb,
    "segments" / Int32sb,
    "uploaded_offset" / Int64sb,
    "upload_lag_offsets" / Int64sb,
    "upload_lag_bytes" / Int64sb,
)
SUBSCRIPTION_PARTITION = message(
    m.SubscriptionPartition,
    "partition" / Int32sb,
    "committed" / Int64sb,
    "dispatched" / Int64sb,
    "next_offset" / Int64sb,
    "backlog" / Int64sb,
    "lag" / Int64sb,
    "unacked" / Int64sb,
    "redelivering" / Int64sb,
    "dead_lettered" / Int64sb,
)
SUBSCRIPTION_DETAIL = message(
    m.SubscriptionDetail,
    "topic" / String,
    "name" / String,
    "sub_type" / Int8sb,
    "durable" / Int8sb,
    "consumers" / Int32sb,
    "backlog" / Int64sb,
    "lag" / Int64sb,
    "unacked" / Int64sb,
    "redelivering" / Int64sb,
    "delivered" / Int64sb,
    "dropped" / Int64sb,
    "dead_lettered" / Int64sb,
    "partitions" / PrefixedArray(Int32sb, SUBSCRIPTION_PARTITION),
)

APIS: Final = (
    Api(
        m.ApiKey.CREATE_TOPIC,
        message(
            m.CreateTopicRequest,
            "name" / String,
            "partitions" / Int32sb,
            "dispatch" / Int8sb,
            "configs" / BoundedArray(MAX_TOPIC_CONFIGS, "CREATE_TOPIC configs", CONFIG_ENTRY),
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
            "partitions" / PrefixedArray(Int32sb, PARTITION_INFO),
        ),
    ),
    Api(
        m.ApiKey.ALTER_TOPIC_CONFIGS,
        message(
            m.AlterTopicConfigsRequest,
            "name" / String,
            "configs"
            / BoundedArray(MAX_TOPIC_CONFIGS, "ALTER_TOPIC_CONFIGS configs", CONFIG_ENTRY),
        ),
        message(m.AlterTopicConfigsResponse, "topic" / TOPIC_INFO),
    ),
    Api(
        m.ApiKey.LIST_SUBSCRIPTIONS,
        message(m.ListSubscriptionsRequest, "topic" / String),
        message(
            m.ListSubscriptionsResponse,
            "subscriptions" / PrefixedArray(Int32sb, SUBSCRIPTION_DETAIL),
        ),
    ),
    Api(
        m.ApiKey.SERVER_INFO,
        message(m.ServerInfoRequest),
        message(
            m.ServerInfoResponse,
            "version" / String,
            "started_ms" / Int64sb,
            "uptime_ms" / Int64sb,
            "connections" / Int32sb,
            "topic_count" / Int32sb,
            "subscription_count" / Int32sb,
            "data_dir" / String,
            "data_dir_bytes" / Int64sb,
            "memory_budget_bytes" / Int64sb,
            "memory_used_bytes" / Int64sb,
            "memory_principal_share_bytes" / Int64sb,
            "memory_principals" / PrefixedArray(Int32sb, PRINCIPAL_MEMORY),
            # added later, at the end: an older client ignores them (a response's trailing
            # bytes are never an error), and an answer from an older server, which ends
            # before them, reads as 0
            "open_files_limit" / Select(Int64sb, Computed(0)),
            "partitions_allowed" / Select(Int64sb, Computed(0)),
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
