"""Every request type the server takes, declared once, on its handler: the topic it acts on, the
grant it needs, whether it runs in its topic's turn or waits for the topic's last-value state,
and whether it may come before authentication.

    @handles(m.ProduceRequest, "topic", "produce")
    def produce(self, session, request): ...

`handles` records a `RequestKind` per message type in `REQUESTS` when the handler's module is
imported, and marks the method, so `bind` can find the handlers of the objects the broker builds.
The layers that decide by request type read `REQUESTS` instead of keeping lists of their own:
`security.authz` (the grant), `security.pre_auth` (before AUTHENTICATE), `requests.broker` (the
topic's turn, last-value readiness). They read it while serving, once the broker has imported
every handler module (the broker refuses to start if a request the wire decodes has no handler).
A new request type is its message (`wire.messages` and its `wire.api` family entry) and its
handler with its declaration; a second protocol front end maps its requests onto these.
tests/test_request_table.py checks that every request the wire decodes is declared and that
every declaration names a field its message has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

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
    # the field naming the transactional id the request uses (it then also needs `produce` on
    # `txn:<id>`, docs/SECURITY.md)
    transactional_id_field: str | None = None

    @property
    def api_key(self) -> int:
        return REQUEST_API_KEYS[self.message]

    def topic(self, request: m.Request) -> str | None:
        """The topic `request` acts on, or None when its type names none."""
        return None if self.topic_field is None else str(getattr(request, self.topic_field))


# Every declared request type, filled by `handles` as the handler modules are imported (the
# broker imports them all; so does tests/test_request_table.py before it checks the table).
REQUESTS: Final[dict[type, RequestKind]] = {}
_BY_API_KEY: Final[dict[int, RequestKind]] = {}

F = TypeVar("F", bound=Callable[..., Any])


def handles(
    message: type,
    topic_field: str | None = None,
    needs: Need = "anyone",
    *,
    topic_optional: bool = False,
    in_turn: bool = False,
    last_value: bool = False,
    before_auth: bool = False,
    transactional_id_field: str | None = None,
) -> Callable[[F], F]:
    """Declare the method below as the handler of `message` requests, with the rules the layers
    read (`RequestKind`'s fields). One declaration per message type."""
    kind = RequestKind(
        message,
        topic_field,
        needs,
        topic_optional,
        in_turn,
        last_value,
        before_auth,
        transactional_id_field,
    )

    def declare(handler: F) -> F:
        _declare(kind)
        setattr(handler, _DECLARED, kind)
        return handler

    return declare


def _declare(kind: RequestKind) -> None:
    if kind.message not in REQUEST_API_KEYS:
        raise TypeError(f"{kind.message.__name__} is not a request the wire decodes")
    if kind.message in REQUESTS:
        raise TypeError(f"{kind.message.__name__} has two handlers")
    REQUESTS[kind.message] = kind
    _BY_API_KEY[kind.api_key] = kind


# The one request no broker handler answers: the connection hands AUTHENTICATE to
# `security.access.Security.authenticate` before anything reaches the broker.
_declare(RequestKind(m.AuthenticateRequest, before_auth=True))


_DECLARED = "request_kind"


def bind(*owners: object) -> dict[type, Callable[..., Any]]:
    """The handlers `owners` declare with `handles`, bound to them, by message type."""
    handlers: dict[type, Callable[..., Any]] = {}
    for owner in owners:
        for name in dir(type(owner)):
            kind = getattr(getattr(type(owner), name), _DECLARED, None)
            if isinstance(kind, RequestKind):
                handlers[kind.message] = getattr(owner, name)
    return handlers


def kind_of_api_key(api_key: int) -> RequestKind | None:
    """The declaration of the request type with `api_key`, or None for an unknown key."""
    return _BY_API_KEY.get(api_key)
