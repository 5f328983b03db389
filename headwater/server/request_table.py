"""Every request type the server takes, declared once: the topic it acts on, the grant it needs,
whether it runs in its topic's turn or waits for the topic's last-value state, and whether it may
come before authentication.

The layers that decide by request type read this table instead of keeping lists of their own:
`security.authz` (the grant), `security.pre_auth` (before AUTHENTICATE), `requests.broker` (the
topic's turn, last-value readiness). A new request type is its message (`wire.messages` and its
`wire.api` family entry), a row here and its handler (`requests.broker`); a second protocol front
end maps its requests onto these rows. tests/test_request_table.py checks that every request the
wire decodes has a row and that every row names a field its message has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from headwater.wire import messages as m
from headwater.wire.protocol import REQUEST_API_KEYS

# What a request needs of the principal's grants (docs/SECURITY.md): an action on its topic, or
# one of the rules `security.authz` spells out ("owner-or-admin": admin on the topic or the
# subscription is the principal's; "any-grant": any grant on the topic; "anyone": authenticated).
Need = Literal["produce", "consume", "admin", "owner-or-admin", "any-grant", "anyone"]


@dataclass(frozen=True, slots=True)
class RequestKind:
    message: type
    # the field naming the topic the request acts on, if it names one
    topic_field: str | None = None
    # the grant it needs on that topic ("admin" without a topic: admin on every topic, `*`)
    needs: Need = "anyone"
    # an empty topic means "every topic the principal may see" (filtered, so "anyone")
    topic_optional: bool = False
    # runs in its topic's turn: it changes what other requests on the topic see
    in_turn: bool = False
    # waits for the topic's last-value state to be built (map requests)
    last_value: bool = False
    # may come before AUTHENTICATE succeeds
    before_auth: bool = False

    @property
    def api_key(self) -> int:
        return REQUEST_API_KEYS[self.message]

    def topic(self, request: m.Request) -> str | None:
        """The topic `request` acts on, or None when its type names none."""
        return None if self.topic_field is None else str(getattr(request, self.topic_field))


_ROWS: Final = (
    RequestKind(m.ApiVersionsRequest, before_auth=True),
    RequestKind(m.AuthenticateRequest, before_auth=True),
    RequestKind(m.ProduceRequest, "topic", "produce"),
    RequestKind(m.InitProducerIdRequest),
    RequestKind(m.SubscribeRequest, "topic", "consume", in_turn=True),
    # reads the log by offset, no subscription: a consumer's right, nothing changes
    RequestKind(m.FetchRequest, "topic", "consume"),
    # on a consumer the connection holds: authorized when it subscribed
    RequestKind(m.FlowRequest),
    RequestKind(m.AckRequest),
    RequestKind(m.AckRangesRequest),
    RequestKind(m.NackRequest),
    RequestKind(m.UnsubscribeRequest),
    RequestKind(m.SeekRequest, "topic", "owner-or-admin", in_turn=True),
    RequestKind(m.DeleteSubscriptionRequest, "topic", "owner-or-admin", in_turn=True),
    RequestKind(m.MapGetRequest, "topic", "consume", last_value=True),
    RequestKind(m.MapSetRequest, "topic", "produce", last_value=True),
    RequestKind(m.MapScanRequest, "topic", "consume", last_value=True),
    RequestKind(m.MapSizeRequest, "topic", "consume", last_value=True),
    RequestKind(m.CreateTopicRequest, "name", "admin", in_turn=True),
    RequestKind(m.DeleteTopicRequest, "name", "admin", in_turn=True),
    RequestKind(m.CreatePartitionsRequest, "name", "admin", in_turn=True),
    RequestKind(m.AlterTopicConfigsRequest, "name", "admin", in_turn=True),
    # describe shows subscriptions and counters: a consumer's view
    RequestKind(m.DescribeTopicRequest, "name", "consume"),
    RequestKind(m.ListTopicsRequest),  # filtered to the topics the principal has a grant on
    RequestKind(m.ListSubscriptionsRequest, "topic", "consume", topic_optional=True),
    # server-wide counts and the data directory, as the operator's HTTP port shows them
    RequestKind(m.ServerInfoRequest, None, "admin"),
    RequestKind(m.RegisterSchemaRequest, "topic", "admin", in_turn=True),
    # producers encode by a topic's schemas and consumers decode by them
    RequestKind(m.GetSchemaRequest, "topic", "any-grant"),
    RequestKind(m.ListSchemasRequest, "topic", "any-grant"),
    RequestKind(m.CheckSchemaRequest, "topic", "any-grant"),
    RequestKind(m.LookupRequest),  # answered only for topics with a grant (security.access)
)

REQUESTS: Final[dict[type, RequestKind]] = {row.message: row for row in _ROWS}
