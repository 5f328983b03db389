"""The request table (headwater/server/request_table.py): one declaration per request type, on its
handler, read by authorization, pre-authentication and the broker's turns (unit tier)."""

from __future__ import annotations

import dataclasses

import pytest

import headwater.server.requests.broker  # noqa: F401  (imports every handler: the declarations)
from headwater.server.request_table import REQUESTS, bind, handles, kind_of_api_key
from headwater.server.requests.map_requests import MapHandlers
from headwater.server.security.authz import ANY_GRANT, ANYONE, EVERY_TOPIC, OWNER_OR_ADMIN, Action
from headwater.server.security.authz import request_action as action_of
from headwater.wire import messages as m
from headwater.wire.protocol import REQUEST_API_KEYS


def test_every_request_the_wire_decodes_is_declared_once() -> None:
    assert set(REQUESTS) == set(REQUEST_API_KEYS)
    with pytest.raises(TypeError, match="ProduceRequest has two handlers"):
        handles(m.ProduceRequest, "topic", "produce")(lambda session, request: None)


def test_only_a_wire_request_can_be_declared() -> None:
    with pytest.raises(TypeError, match="MapEntry is not a request the wire decodes"):
        handles(m.MapEntry)(lambda session, request: None)


def test_bind_finds_the_declared_handlers_of_an_object() -> None:
    maps = object.__new__(MapHandlers)  # bind reads the class; no catalog needed
    bound = bind(maps)
    assert set(bound) == {m.MapGetRequest, m.MapSetRequest, m.MapScanRequest, m.MapSizeRequest}
    assert all(handler.__self__ is maps for handler in bound.values())  # type: ignore[attr-defined]


def test_every_topic_field_is_a_field_of_its_message() -> None:
    for kind in REQUESTS.values():
        names = {f.name for f in dataclasses.fields(kind.message)}
        for field in (kind.topic_field, kind.transactional_id_field):
            if field is not None:
                assert field in names, kind


def test_every_request_naming_a_transactional_id_is_declared_to_use_it() -> None:
    naming = {
        kind.message
        for kind in REQUESTS.values()
        if "transactional_id" in {f.name for f in dataclasses.fields(kind.message)}
    }
    declared = {k.message for k in REQUESTS.values() if k.transactional_id_field is not None}
    # between the brokers of a cluster: the peer token's produce grant on the topic, and it
    # applies only what the id's state decided (docs/PROTOCOL.md), as WRITE_TXN_MARKER
    assert naming - declared == {m.WriteTxnAcksRequest}
    assert declared == {
        m.InitTransactionsRequest,
        m.AddPartitionsToTxnRequest,
        m.AddAcksToTxnRequest,
        m.EndTxnRequest,
    }


def test_only_the_handshake_comes_before_authentication() -> None:
    kinds = [kind_of_api_key(key) for key in REQUEST_API_KEYS.values()]
    before = {kind.api_key for kind in kinds if kind is not None and kind.before_auth}
    assert None not in kinds
    assert before == {int(m.ApiKey.API_VERSIONS), int(m.ApiKey.AUTHENTICATE)}


def test_the_grant_each_request_needs() -> None:
    """What docs/SECURITY.md's table says, request by request."""
    assert action_of(m.ProduceRequest("t", 0, b"")) == (Action.PRODUCE, "t")
    assert action_of(m.MapSetRequest("t", ())) == (Action.PRODUCE, "t")
    assert action_of(m.MapGetRequest("t", (b"k",))) == (Action.CONSUME, "t")
    assert action_of(m.DescribeTopicRequest("t")) == (Action.CONSUME, "t")
    assert action_of(m.OffsetForTimeRequest("t", 0, 0)) == (Action.CONSUME, "t")
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
