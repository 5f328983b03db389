"""Cluster: LOOKUP (which broker owns each partition of the topics named).

Rare (a client asks once per topic, then on NOT_OWNER or a lost connection): no fast path.
"""

from __future__ import annotations

from typing import Final

from construct import Int16sb, Int32sb, Int64sb, PrefixedArray

from headwater.wire import messages as m
from headwater.wire.api.base import Api, String, message

LOOKUP_PARTITION = message(
    m.LookupPartition, "partition" / Int32sb, "broker_id" / String, "epoch" / Int64sb
)
LOOKUP_TOPIC = message(
    m.LookupTopic,
    "name" / String,
    "error_code" / Int16sb,
    "error_message" / String,
    "partitions" / PrefixedArray(Int32sb, LOOKUP_PARTITION),
)
LOOKUP_BROKER = message(m.LookupBroker, "broker_id" / String, "host" / String, "port" / Int32sb)

APIS: Final = (
    Api(
        m.ApiKey.LOOKUP,
        message(m.LookupRequest, "topics" / PrefixedArray(Int32sb, String)),
        message(
            m.LookupResponse,
            "brokers" / PrefixedArray(Int32sb, LOOKUP_BROKER),
            "topics" / PrefixedArray(Int32sb, LOOKUP_TOPIC),
        ),
    ),
)
