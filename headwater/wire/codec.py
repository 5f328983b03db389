"""The former home of every API's schema, kept as a facade so existing imports still work.

New code imports from `wire.protocol` (encode/decode through the tables keyed by api key) or
from the family modules in `wire.api` (schemas and hot paths). Everything this module exported
before the split is re-exported here unchanged.
"""

from __future__ import annotations

from headwater.wire.api.admin import CONFIG_ENTRIES, CONSUMER_INFO, SUBSCRIPTION_INFO, TOPIC_INFO
from headwater.wire.api.base import (
    EMPTY_RESPONSE,
    ERROR_HEADER,
    Bytes,
    DataclassAdapter,
    NullableBytes,
    String,
    message,
)
from headwater.wire.api.consume import ACK_ENTRIES, SUBSCRIPTION_SETTINGS
from headwater.wire.api.maps import (
    MAP_ENTRIES,
    MAP_ENTRY,
    decode_map_get_request,
    decode_map_get_response,
    decode_map_set_request,
    encode_map_get_request,
    encode_map_get_response,
    encode_map_set_request,
    encode_map_set_response,
)
from headwater.wire.api.produce import (
    decode_produce_request,
    delivery_prefix,
    encode_produce_response,
    produce_request_parts,
)
from headwater.wire.protocol import (
    PUSH_API_KEYS,
    PUSH_SCHEMAS,
    REQUEST_API_KEYS,
    SCHEMAS,
    SUPPORTED_VERSIONS,
    check_version,
    decode_push,
    decode_request,
    decode_response,
    encode_error,
    encode_push,
    encode_request,
    encode_response,
)

__all__ = [
    "ACK_ENTRIES",
    "CONFIG_ENTRIES",
    "CONSUMER_INFO",
    "EMPTY_RESPONSE",
    "ERROR_HEADER",
    "MAP_ENTRIES",
    "MAP_ENTRY",
    "PUSH_API_KEYS",
    "PUSH_SCHEMAS",
    "REQUEST_API_KEYS",
    "SCHEMAS",
    "SUBSCRIPTION_INFO",
    "SUBSCRIPTION_SETTINGS",
    "SUPPORTED_VERSIONS",
    "TOPIC_INFO",
    "Bytes",
    "DataclassAdapter",
    "NullableBytes",
    "String",
    "check_version",
    "decode_map_get_request",
    "decode_map_get_response",
    "decode_map_set_request",
    "decode_produce_request",
    "decode_push",
    "decode_request",
    "decode_response",
    "delivery_prefix",
    "encode_error",
    "encode_map_get_request",
    "encode_map_get_response",
    "encode_map_set_request",
    "encode_map_set_response",
    "encode_produce_response",
    "encode_push",
    "encode_request",
    "encode_response",
    "message",
    "produce_request_parts",
]
