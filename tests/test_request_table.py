"""The request table (headwater/server/request_table.py): one row per request type, read by
authorization, pre-authentication and the broker's turns (unit tier)."""

from __future__ import annotations

import dataclasses

from headwater.server.request_table import REQUESTS
from headwater.server.security.authz import ANY_GRANT, ANYONE, EVERY_TOPIC, OWNER_OR_ADMIN, Action
from headwater.server.security.authz import request_action as action_of
from headwater.server.security.pre_auth import PRE_AUTH_API_KEYS
from headwater.wire import messages as m
from headwater.wire.protocol import REQUEST_API_KEYS


def test_every_request_the_wire_decodes_has_one_row() -> None:
    assert set(REQUESTS) == set(REQUEST_API_KEYS)


def test_every_topic_field_is_a_field_of_its_message() -> None:
    for kind in REQUESTS.values():
        if kind.topic_field is not None:
            names = {f.name for f in dataclasses.fields(kind.message)}
            assert kind.topic_field in names, kind


def test_only_the_handshake_comes_before_authentication() -> None:
    assert {int(m.ApiKey.API_VERSIONS), int(m.ApiKey.AUTHENTICATE)} == PRE_AUTH_API_KEYS


def test_the_grant_each_request_needs() -> None:
    """What docs/SECURITY.md's table says, request by request."""
    assert action_of(m.ProduceRequest("t", 0, b"")) == (Action.PRODUCE, "t")
    assert action_of(m.MapSetRequest("t", ())) == (Action.PRODUCE, "t")
    assert action_of(m.MapGetRequest("t", (b"k",))) == (Action.CONSUME, "t")
    assert action_of(m.DescribeTopicRequest("t")) == (Action.CONSUME, "t")
    assert action_of(m.CreateTopicRequest("t")) == (Action.ADMIN, "t")
    assert action_of(m.DeleteTopicRequest("t")) == (Action.ADMIN, "t")
    assert action_of(m.ServerInfoRequest()) == (Action.ADMIN, EVERY_TOPIC)
    assert action_of(m.SeekRequest("t", "s", 0)) == (OWNER_OR_ADMIN, "t")
    assert action_of(m.GetSchemaRequest("t")) == (ANY_GRANT, "t")
    assert action_of(m.ListSubscriptionsRequest("t")) == (Action.CONSUME, "t")
    assert action_of(m.ListSubscriptionsRequest("")) == (ANYONE, "")
    assert action_of(m.ListTopicsRequest()) == (ANYONE, "")
    assert action_of(m.LookupRequest(("t",))) == (ANYONE, "")
    assert action_of(m.FlowRequest(1, 10)) == (ANYONE, "")
