"""The Kafka APIs and versions the listener serves: each API's request and response classes
(`kafka.messages`, written from Kafka's JSON specs by tools/kafka_messages.py, which holds the
versions served) and each version's `codec.Layout`. docs/KAFKA.md has this table for users;
tests/test_kafka_messages.py checks each version against the bytes a stock client writes and reads.

Versions are chosen where every stock client we test agrees and the records are RecordBatch v2
(Produce from v3, Fetch from v4): an older Produce or Fetch would carry message sets v0/v1, which
Headwater does not store. ApiVersions v3 is the one flexible version served (librdkafka asks for
it first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from headwater.server.kafka.codec import Layout, layout
from headwater.server.kafka.messages import (
    admin,
    configs,
    consumer_protocol,
    fetch,
    groups,
    metadata,
    offsets,
    sasl,
    share,
    transactions,
)
from headwater.server.kafka.messages import produce as produce_
from headwater.server.kafka.messages.declare import Message


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    name: str
    min_version: int
    max_version: int
    requests: dict[int, Layout[Any]]
    responses: dict[int, Layout[Any]]
    flexible_from: int | None = None  # the first version with tagged fields (header v2)

    def flexible(self, version: int) -> bool:
        return self.flexible_from is not None and version >= self.flexible_from


def _api(request: type[Message], response: type[Message]) -> Api:
    low, high = request.VERSIONS
    assert (low, high) == response.VERSIONS and response.API_KEY == request.API_KEY
    return Api(
        request.API_KEY,
        request.__name__.removesuffix("Request"),
        low,
        high,
        {v: layout(request, v) for v in range(low, high + 1)},
        {v: layout(response, v) for v in range(low, high + 1)},
        request.FLEXIBLE_FROM,
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
DELETE_RECORDS: Final = 21
INIT_PRODUCER_ID: Final = 22
ADD_PARTITIONS_TO_TXN: Final = 24
ADD_OFFSETS_TO_TXN: Final = 25
END_TXN: Final = 26
TXN_OFFSET_COMMIT: Final = 28
DESCRIBE_CONFIGS: Final = 32
ALTER_CONFIGS: Final = 33
SASL_AUTHENTICATE: Final = 36
CREATE_PARTITIONS: Final = 37
DELETE_GROUPS: Final = 42
INCREMENTAL_ALTER_CONFIGS: Final = 44
DESCRIBE_TRANSACTIONS: Final = 65
LIST_TRANSACTIONS: Final = 66
# Kafka 4's consumer group protocol (KIP-848)
CONSUMER_GROUP_HEARTBEAT: Final = 68
CONSUMER_GROUP_DESCRIBE: Final = 69
# share groups (KIP-932)
SHARE_GROUP_HEARTBEAT: Final = 76
SHARE_GROUP_DESCRIBE: Final = 77
SHARE_FETCH: Final = 78
SHARE_ACKNOWLEDGE: Final = 79
# what a connection may send before it has authenticated (on a server with authentication)
BEFORE_AUTH: Final = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})


SERVED: Final[dict[int, Api]] = {  # by key, as ApiVersions lists them
    api.key: api
    for api in sorted(
        (
            _api(produce_.ProduceRequest, produce_.ProduceResponse),
            _api(fetch.FetchRequest, fetch.FetchResponse),
            _api(offsets.ListOffsetsRequest, offsets.ListOffsetsResponse),
            _api(metadata.MetadataRequest, metadata.MetadataResponse),
            _api(offsets.OffsetCommitRequest, offsets.OffsetCommitResponse),
            _api(offsets.OffsetFetchRequest, offsets.OffsetFetchResponse),
            _api(groups.FindCoordinatorRequest, groups.FindCoordinatorResponse),
            _api(groups.JoinGroupRequest, groups.JoinGroupResponse),
            _api(groups.HeartbeatRequest, groups.HeartbeatResponse),
            _api(groups.LeaveGroupRequest, groups.LeaveGroupResponse),
            _api(groups.SyncGroupRequest, groups.SyncGroupResponse),
            _api(groups.DescribeGroupsRequest, groups.DescribeGroupsResponse),
            _api(groups.ListGroupsRequest, groups.ListGroupsResponse),
            _api(metadata.ApiVersionsRequest, metadata.ApiVersionsResponse),
            _api(configs.DescribeConfigsRequest, configs.DescribeConfigsResponse),
            _api(configs.AlterConfigsRequest, configs.AlterConfigsResponse),
            _api(configs.IncrementalAlterConfigsRequest, configs.IncrementalAlterConfigsResponse),
            _api(admin.CreatePartitionsRequest, admin.CreatePartitionsResponse),
            # after a v0 handshake the SASL bytes come as a bare size-prefixed frame, not a
            # SaslAuthenticate (librdkafka looks for v0 to know the broker takes SASL at all)
            _api(sasl.SaslHandshakeRequest, sasl.SaslHandshakeResponse),
            _api(sasl.SaslAuthenticateRequest, sasl.SaslAuthenticateResponse),
            _api(produce_.InitProducerIdRequest, produce_.InitProducerIdResponse),
            _api(admin.CreateTopicsRequest, admin.CreateTopicsResponse),
            _api(admin.DeleteTopicsRequest, admin.DeleteTopicsResponse),
            _api(admin.DeleteRecordsRequest, admin.DeleteRecordsResponse),
            _api(groups.DeleteGroupsRequest, groups.DeleteGroupsResponse),
            _api(transactions.AddPartitionsToTxnRequest, transactions.AddPartitionsToTxnResponse),
            _api(transactions.AddOffsetsToTxnRequest, transactions.AddOffsetsToTxnResponse),
            _api(transactions.EndTxnRequest, transactions.EndTxnResponse),
            _api(transactions.TxnOffsetCommitRequest, transactions.TxnOffsetCommitResponse),
            _api(
                transactions.DescribeTransactionsRequest,
                transactions.DescribeTransactionsResponse,
            ),
            _api(transactions.ListTransactionsRequest, transactions.ListTransactionsResponse),
            # Kafka 4's consumer group protocol (KIP-848)
            _api(
                consumer_protocol.ConsumerGroupHeartbeatRequest,
                consumer_protocol.ConsumerGroupHeartbeatResponse,
            ),
            _api(
                consumer_protocol.ConsumerGroupDescribeRequest,
                consumer_protocol.ConsumerGroupDescribeResponse,
            ),
            # share groups (KIP-932)
            _api(share.ShareGroupHeartbeatRequest, share.ShareGroupHeartbeatResponse),
            _api(share.ShareGroupDescribeRequest, share.ShareGroupDescribeResponse),
            _api(share.ShareFetchRequest, share.ShareFetchResponse),
            _api(share.ShareAcknowledgeRequest, share.ShareAcknowledgeResponse),
        ),
        key=lambda api: api.key,
    )
}
