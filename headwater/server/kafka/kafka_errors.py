"""Headwater's error codes as Kafka's: what a Kafka client is told when the broker refuses.

Each Headwater `ErrorCode` maps to the Kafka error a Kafka client acts on the same way (retriable
where ours is, "unknown topic" where ours is); docs/KAFKA.md prints this table. A code with no
close Kafka counterpart is UNKNOWN_SERVER_ERROR, and the server logs the Headwater error.
"""

from __future__ import annotations

from typing import Final

from headwater.wire.errors import ErrorCode, HeadwaterError

NONE: Final = 0
UNKNOWN_SERVER_ERROR: Final = -1
OFFSET_OUT_OF_RANGE: Final = 1
CORRUPT_MESSAGE: Final = 2
UNKNOWN_TOPIC_OR_PARTITION: Final = 3
LEADER_NOT_AVAILABLE: Final = 5
NOT_LEADER_OR_FOLLOWER: Final = 6
REQUEST_TIMED_OUT: Final = 7
MESSAGE_TOO_LARGE: Final = 10
NETWORK_EXCEPTION: Final = 13
COORDINATOR_NOT_AVAILABLE: Final = 15
NOT_COORDINATOR: Final = 16
INVALID_TOPIC_EXCEPTION: Final = 17
RECORD_LIST_TOO_LARGE: Final = 18
NOT_ENOUGH_REPLICAS: Final = 19
INVALID_REQUIRED_ACKS: Final = 21
ILLEGAL_GENERATION: Final = 22
INCONSISTENT_GROUP_PROTOCOL: Final = 23
INVALID_GROUP_ID: Final = 24
UNKNOWN_MEMBER_ID: Final = 25
INVALID_SESSION_TIMEOUT: Final = 26
REBALANCE_IN_PROGRESS: Final = 27
TOPIC_AUTHORIZATION_FAILED: Final = 29
GROUP_AUTHORIZATION_FAILED: Final = 30
UNSUPPORTED_SASL_MECHANISM: Final = 33
ILLEGAL_SASL_STATE: Final = 34
UNSUPPORTED_VERSION: Final = 35
TOPIC_ALREADY_EXISTS: Final = 36
INVALID_PARTITIONS: Final = 37
INVALID_REPLICATION_FACTOR: Final = 38
INVALID_CONFIG: Final = 40
INVALID_REQUEST: Final = 42
POLICY_VIOLATION: Final = 44
OUT_OF_ORDER_SEQUENCE_NUMBER: Final = 45
UNKNOWN_PRODUCER_ID: Final = 59
TRANSACTIONAL_ID_AUTHORIZATION_FAILED: Final = 53
KAFKA_STORAGE_ERROR: Final = 56
SASL_AUTHENTICATION_FAILED: Final = 58
NON_EMPTY_GROUP: Final = 68
GROUP_ID_NOT_FOUND: Final = 69
MEMBER_ID_REQUIRED: Final = 79
GROUP_MAX_SIZE_REACHED: Final = 81
FENCED_INSTANCE_ID: Final = 82
INVALID_RECORD: Final = 87
THROTTLING_QUOTA_EXCEEDED: Final = 89

_BY_CODE: Final[dict[ErrorCode, int]] = {
    ErrorCode.NONE: NONE,
    ErrorCode.CORRUPT_BATCH: CORRUPT_MESSAGE,
    ErrorCode.INVALID_REQUEST: INVALID_REQUEST,
    ErrorCode.UNKNOWN_TOPIC: UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.INVALID_PARTITION: UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.INVALID_TOPIC_NAME: INVALID_TOPIC_EXCEPTION,
    ErrorCode.TOPIC_EXISTS: TOPIC_ALREADY_EXISTS,
    # a non-reliable topic keeps no history to fetch: the request is one the topic cannot serve
    ErrorCode.NOT_SUPPORTED: INVALID_REQUEST,
    # a group's name taken by a subscription that keeps no cursor (a non-reliable one)
    ErrorCode.SUBSCRIPTION_TYPE_MISMATCH: INVALID_REQUEST,
    ErrorCode.SERVER_SHUTTING_DOWN: NETWORK_EXCEPTION,
    ErrorCode.REQUEST_TIMEOUT: REQUEST_TIMED_OUT,
    ErrorCode.STORAGE_ERROR: KAFKA_STORAGE_ERROR,
    ErrorCode.OUT_OF_ORDER_SEQUENCE: OUT_OF_ORDER_SEQUENCE_NUMBER,
    ErrorCode.UNKNOWN_PRODUCER_ID: UNKNOWN_PRODUCER_ID,
    ErrorCode.RECORD_TOO_LARGE: MESSAGE_TOO_LARGE,
    ErrorCode.PARTITION_OFFLINE: LEADER_NOT_AVAILABLE,
    ErrorCode.DECOMPRESSED_TOO_LARGE: RECORD_LIST_TOO_LARGE,
    ErrorCode.NOT_AUTHORIZED: TOPIC_AUTHORIZATION_FAILED,
    ErrorCode.AUTHENTICATION_FAILED: SASL_AUTHENTICATION_FAILED,
    ErrorCode.AUTHENTICATION_REQUIRED: SASL_AUTHENTICATION_FAILED,
    ErrorCode.NOT_OWNER: NOT_LEADER_OR_FOLLOWER,
    ErrorCode.OVER_MEMORY_BUDGET: THROTTLING_QUOTA_EXCEEDED,
    ErrorCode.OFFSET_OUT_OF_RANGE: OFFSET_OUT_OF_RANGE,
    ErrorCode.SCHEMA_VIOLATION: INVALID_RECORD,
    # a keyed record of a last-value topic in another partition than its key's
    ErrorCode.WRONG_PARTITION: INVALID_RECORD,
}


def kafka_code(error: HeadwaterError) -> int:
    """The Kafka error code for `error`."""
    return _BY_CODE.get(error.code, UNKNOWN_SERVER_ERROR)


def mapping() -> dict[ErrorCode, int]:
    """Every mapped code (for docs/KAFKA.md and its test)."""
    return dict(_BY_CODE)
