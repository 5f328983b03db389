"""The Kafka APIs and versions the listener serves, each version's request and response schema
taken from aiokafka's declarations (`aiokafka.protocol`), plus ApiVersions v3, the one flexible
version served, declared here in the same types (aiokafka stops at v2; librdkafka asks for v3
first). docs/KAFKA.md has this table for users; tests/test_kafka_codec.py checks each served
declaration against Kafka's published JSON schema of the same version.

IncrementalAlterConfigs v0, which aiokafka does not declare, is declared here too.

Versions are chosen where every stock client we test agrees and the records are RecordBatch v2
(Produce from v3, Fetch from v4): an older Produce or Fetch would carry message sets v0/v1, which
Headwater does not store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from aiokafka.protocol import (
    admin,
    commit,
    coordination,
    fetch,
    group,
    metadata,
    offset,
    produce,
    transaction,
)
from aiokafka.protocol.types import (
    Array,
    Boolean,
    CompactArray,
    CompactString,
    Int8,
    Int16,
    Int32,
    Schema,
    String,
    TaggedFields,
)


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    name: str
    min_version: int
    max_version: int
    requests: dict[int, Schema]
    responses: dict[int, Schema]
    flexible_from: int | None = None  # the first version with tagged fields (header v2)
    # request fields whose null means something to the handler (others read as empty)
    nullable: frozenset[str] = frozenset()

    def flexible(self, version: int) -> bool:
        return self.flexible_from is not None and version >= self.flexible_from


def _declared(
    module: Any, request: str, response: str, low: int, high: int
) -> tuple[dict[int, Schema], dict[int, Schema]]:
    return (
        {v: getattr(module, f"{request}_v{v}").SCHEMA for v in range(low, high + 1)},
        {v: getattr(module, f"{response}_v{v}").SCHEMA for v in range(low, high + 1)},
    )


def _api(
    key: int,
    name: str,
    module: Any,
    request: str,
    response: str,
    low: int,
    high: int,
    nullable: frozenset[str] = frozenset(),
) -> Api:
    requests, responses = _declared(module, request, response, low, high)
    return Api(key, name, low, high, requests, responses, nullable=nullable)


API_VERSIONS_V3_REQUEST: Final = Schema(
    ("client_software_name", CompactString("utf-8")),
    ("client_software_version", CompactString("utf-8")),
    ("tags", TaggedFields),
)
API_VERSIONS_V3_RESPONSE: Final = Schema(
    ("error_code", Int16),
    (
        "api_keys",
        CompactArray(
            ("api_key", Int16),
            ("min_version", Int16),
            ("max_version", Int16),
            ("tags", TaggedFields),
        ),
    ),
    ("throttle_time_ms", Int32),
    ("tags", TaggedFields),
)

INCREMENTAL_ALTER_CONFIGS_V0_REQUEST: Final = Schema(
    (
        "resources",
        Array(
            ("resource_type", Int8),
            ("resource_name", String("utf-8")),
            (
                "configs",
                Array(
                    ("name", String("utf-8")),
                    ("config_operation", Int8),
                    ("value", String("utf-8")),
                ),
            ),
        ),
    ),
    ("validate_only", Boolean),
)
INCREMENTAL_ALTER_CONFIGS_V0_RESPONSE: Final = Schema(
    ("throttle_time_ms", Int32),
    (
        "responses",
        Array(
            ("error_code", Int16),
            ("error_message", String("utf-8")),
            ("resource_type", Int8),
            ("resource_name", String("utf-8")),
        ),
    ),
)

PRODUCE: Final = 0
FETCH: Final = 1
LIST_OFFSETS: Final = 2
METADATA: Final = 3
OFFSET_COMMIT: Final = 8
OFFSET_FETCH: Final = 9
FIND_COORDINATOR: Final = 10
JOIN_GROUP: Final = 11
HEARTBEAT: Final = 12
LEAVE_GROUP: Final = 13
SYNC_GROUP: Final = 14
DESCRIBE_GROUPS: Final = 15
LIST_GROUPS: Final = 16
SASL_HANDSHAKE: Final = 17
API_VERSIONS: Final = 18
CREATE_TOPICS: Final = 19
DELETE_TOPICS: Final = 20
INIT_PRODUCER_ID: Final = 22
DESCRIBE_CONFIGS: Final = 32
ALTER_CONFIGS: Final = 33
SASL_AUTHENTICATE: Final = 36
CREATE_PARTITIONS: Final = 37
INCREMENTAL_ALTER_CONFIGS: Final = 44
# what a connection may send before it has authenticated (on a server with authentication)
BEFORE_AUTH: Final = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})


def _api_versions() -> Api:
    requests, responses = _declared(admin, "ApiVersionRequest", "ApiVersionResponse", 0, 2)
    requests[3] = API_VERSIONS_V3_REQUEST
    responses[3] = API_VERSIONS_V3_RESPONSE
    return Api(API_VERSIONS, "ApiVersions", 0, 3, requests, responses, flexible_from=3)


SERVED: Final[dict[int, Api]] = {  # by key, as ApiVersions lists them
    api.key: api
    for api in sorted(
        (
            _api(
                PRODUCE,
                "Produce",
                produce,
                "ProduceRequest",
                "ProduceResponse",
                3,
                8,
                frozenset({"transactional_id"}),
            ),
            _api(FETCH, "Fetch", fetch, "FetchRequest", "FetchResponse", 4, 11),
            _api(LIST_OFFSETS, "ListOffsets", offset, "OffsetRequest", "OffsetResponse", 1, 3),
            # null topics: every topic (v1+)
            _api(
                METADATA,
                "Metadata",
                metadata,
                "MetadataRequest",
                "MetadataResponse",
                0,
                5,
                frozenset({"topics"}),
            ),
            _api(
                OFFSET_COMMIT,
                "OffsetCommit",
                commit,
                "OffsetCommitRequest",
                "OffsetCommitResponse",
                0,
                3,
            ),
            _api(
                OFFSET_FETCH,
                "OffsetFetch",
                commit,
                "OffsetFetchRequest",
                "OffsetFetchResponse",
                1,
                3,
                frozenset({"topics"}),  # null: every topic the group has offsets on (v2+)
            ),
            _api(
                FIND_COORDINATOR,
                "FindCoordinator",
                coordination,
                "FindCoordinatorRequest",
                "FindCoordinatorResponse",
                0,
                1,
            ),
            _api(JOIN_GROUP, "JoinGroup", group, "JoinGroupRequest", "JoinGroupResponse", 0, 2),
            _api(HEARTBEAT, "Heartbeat", group, "HeartbeatRequest", "HeartbeatResponse", 0, 1),
            _api(LEAVE_GROUP, "LeaveGroup", group, "LeaveGroupRequest", "LeaveGroupResponse", 0, 1),
            _api(SYNC_GROUP, "SyncGroup", group, "SyncGroupRequest", "SyncGroupResponse", 0, 1),
            _api(
                DESCRIBE_GROUPS,
                "DescribeGroups",
                admin,
                "DescribeGroupsRequest",
                "DescribeGroupsResponse",
                0,
                2,
            ),
            _api(LIST_GROUPS, "ListGroups", admin, "ListGroupsRequest", "ListGroupsResponse", 0, 2),
            _api_versions(),
            _api(
                DESCRIBE_CONFIGS,
                "DescribeConfigs",
                admin,
                "DescribeConfigsRequest",
                "DescribeConfigsResponse",
                0,
                2,
                frozenset({"config_names"}),  # null: every config
            ),
            _api(
                ALTER_CONFIGS,
                "AlterConfigs",
                admin,
                "AlterConfigsRequest",
                "AlterConfigsResponse",
                0,
                1,
            ),
            Api(
                INCREMENTAL_ALTER_CONFIGS,
                "IncrementalAlterConfigs",
                0,
                0,
                {0: INCREMENTAL_ALTER_CONFIGS_V0_REQUEST},
                {0: INCREMENTAL_ALTER_CONFIGS_V0_RESPONSE},
                nullable=frozenset({"value"}),  # null: DELETE's (SET with null is refused)
            ),
            _api(
                CREATE_PARTITIONS,
                "CreatePartitions",
                admin,
                "CreatePartitionsRequest",
                "CreatePartitionsResponse",
                0,
                1,
            ),
            # after a v0 handshake the SASL bytes come as a bare size-prefixed frame, not a
            # SaslAuthenticate (librdkafka looks for v0 to know the broker takes SASL at all)
            _api(
                SASL_HANDSHAKE,
                "SaslHandshake",
                admin,
                "SaslHandShakeRequest",
                "SaslHandShakeResponse",
                0,
                1,
            ),
            _api(
                SASL_AUTHENTICATE,
                "SaslAuthenticate",
                admin,
                "SaslAuthenticateRequest",
                "SaslAuthenticateResponse",
                0,
                1,
            ),
            _api(
                INIT_PRODUCER_ID,
                "InitProducerId",
                transaction,
                "InitProducerIdRequest",
                "InitProducerIdResponse",
                0,
                0,
                frozenset({"transactional_id"}),  # null: an idempotent, not transactional, one
            ),
            _api(
                CREATE_TOPICS,
                "CreateTopics",
                admin,
                "CreateTopicsRequest",
                "CreateTopicsResponse",
                0,
                3,
            ),
            _api(
                DELETE_TOPICS,
                "DeleteTopics",
                admin,
                "DeleteTopicsRequest",
                "DeleteTopicsResponse",
                0,
                3,
            ),
        ),
        key=lambda api: api.key,
    )
}
