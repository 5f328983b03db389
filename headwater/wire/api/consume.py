"""Consuming: SUBSCRIBE, FLOW, ACK, NACK, SEEK, UNSUBSCRIBE, DELETE_SUBSCRIPTION, and the
CONSUMER_CLOSED and MESSAGES_DROPPED pushes. DELIVER is in `wire.api.produce`, beside PRODUCE,
because both carry a record batch through unchanged.

No fast paths: FLOW and ACK are batched per event-loop turn by the client, so construct's cost
is paid once per turn, not per message.
"""

from __future__ import annotations

from typing import Final

from construct import Flag, Int8sb, Int16sb, Int32sb, Int64sb, PrefixedArray

from headwater.wire import messages as m
from headwater.wire.api.base import (
    EMPTY_RESPONSE,
    Api,
    Bytes,
    BytesTuple,
    NullableBytes,
    PushApi,
    String,
    message,
)

ACK_ENTRIES = PrefixedArray(Int32sb, message(m.AckEntry, "partition" / Int32sb, "offset" / Int64sb))
SUBSCRIPTION_SETTINGS = message(
    m.SubscriptionSettings,
    "start" / Int8sb,
    "start_value" / Int64sb,
    "ack_timeout_ms" / Int32sb,
    "max_deliveries" / Int32sb,
    "backoff" / Int8sb,
    "backoff_initial_ms" / Int32sb,
    "backoff_max_ms" / Int32sb,
    "committed_only" / Flag,
    "durable" / Int8sb,
    "keys" / BytesTuple(PrefixedArray(Int32sb, Bytes)),
    "key_prefix" / NullableBytes,
)

APIS: Final = (
    Api(
        m.ApiKey.SUBSCRIBE,
        message(
            m.SubscribeRequest,
            "topic" / String,
            "subscription" / String,
            "sub_type" / Int8sb,
            "consumer_name" / String,
            "priority" / Int32sb,
            "initial_credits" / Int32sb,
            "settings" / SUBSCRIPTION_SETTINGS,
            "partitions" / PrefixedArray(Int32sb, Int32sb),
        ),
        message(m.SubscribeResponse, "consumer_id" / Int32sb),
    ),
    Api(
        m.ApiKey.FLOW,
        message(m.FlowRequest, "consumer_id" / Int32sb, "credits" / Int32sb),
        EMPTY_RESPONSE,
    ),
    Api(
        m.ApiKey.ACK,
        message(m.AckRequest, "consumer_id" / Int32sb, "kind" / Int8sb, "acks" / ACK_ENTRIES),
        EMPTY_RESPONSE,
    ),
    Api(
        m.ApiKey.NACK,
        message(m.NackRequest, "consumer_id" / Int32sb, "delay_ms" / Int32sb, "acks" / ACK_ENTRIES),
        EMPTY_RESPONSE,
    ),
    Api(
        m.ApiKey.SEEK,
        message(
            m.SeekRequest,
            "topic" / String,
            "subscription" / String,
            "start" / Int8sb,
            "start_value" / Int64sb,
        ),
        EMPTY_RESPONSE,
    ),
    Api(
        m.ApiKey.DELETE_SUBSCRIPTION,
        message(m.DeleteSubscriptionRequest, "topic" / String, "subscription" / String),
        EMPTY_RESPONSE,
    ),
    Api(
        m.ApiKey.UNSUBSCRIBE,
        message(m.UnsubscribeRequest, "consumer_id" / Int32sb),
        EMPTY_RESPONSE,
    ),
)

PUSHES: Final = (
    PushApi(
        m.ApiKey.CONSUMER_CLOSED,
        message(m.ConsumerClosed, "error_code" / Int16sb, "message" / String),
    ),
    PushApi(m.ApiKey.MESSAGES_DROPPED, message(m.MessagesDropped, "count" / Int64sb)),
)
