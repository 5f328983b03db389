"""Authorization: which action a request is, on which topic, and whether a principal's grants
allow it.

A grant is `ACTION:PATTERN`. ACTION is `produce`, `consume`, `admin` or `all` (the three);
PATTERN is an exact topic name, or a prefix ending in `*` (`orders.*`, or `*` for every topic).
Nothing is allowed unless a grant says so. The actions are independent: `admin` (create and
delete topics, seek and delete any subscription) does not imply reading or writing messages.

Transactional ids are a resource of their own (Kafka's TransactionalId): a PATTERN starting
`txn:` names ids (`produce:txn:etl-*`), never a topic (a topic name has no `:`). Using an id
(init, adding partitions, offsets or acknowledgements, ending) takes `produce` on `txn:<id>`,
Kafka's WRITE; describing or listing it takes any grant on it, as Kafka's WRITE implies
DESCRIBE. A topic pattern never matches an id, except `*` alone, which is every resource: a
principal that may produce to every topic may use every id (the migration rule,
docs/SECURITY.md).

`request_action` reads (action, topic) from the request's declaration in `server.request_table`, so
the broker needs no knowledge of principals: map get/scan/size follow consume, map set and delete
follow produce, describe follows consume (it shows subscriptions and counters), SERVER_INFO needs
admin on every topic (`admin:*`: it tells server-wide counts and the data directory, as the
operator's HTTP port does), LOOKUP needs nothing but is answered only for topics with a grant
(access filters the others to UNKNOWN_TOPIC, as for a topic that does not exist). Requests on a
consumer the connection already holds (flow, ack, nack, unsubscribe) were authorized when it
subscribed. Seek and delete-subscription need admin on the topic or ownership of the subscription;
that check is `server.security.access`'s, which knows the owners."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from headwater.server.request_table import REQUESTS
from headwater.wire import messages as m


class Action(enum.Enum):
    PRODUCE = "produce"
    CONSUME = "consume"
    ADMIN = "admin"


# Subscription management: admin on the topic, or the principal owns the subscription.
OWNER_OR_ADMIN = "owner-or-admin"
# Reading a topic's schemas: any grant on the topic (producers encode by them, consumers decode).
ANY_GRANT = "any-grant"
# Anyone authenticated (API_VERSIONS, LIST_TOPICS and LOOKUP which are filtered, consumer-scoped
# requests).
ANYONE = "anyone"
# The "topic" of a server-wide request: only a grant with the pattern `*` matches every name.
EVERY_TOPIC = "*"
# A transactional id's resource is `txn:<id>`; no topic name has a ':'.
TXN_PREFIX = "txn:"


def transactional_id_resource(transactional_id: str) -> str:
    return TXN_PREFIX + transactional_id


@dataclass(frozen=True, slots=True)
class Grant:
    action: Action
    pattern: str

    def matches(self, action: Action, topic: str) -> bool:
        if action is not self.action:
            return False
        if topic.startswith(TXN_PREFIX) and not self.pattern.startswith(TXN_PREFIX):
            return self.pattern == EVERY_TOPIC  # `t*` is topics starting with t, not ids
        if self.pattern.endswith("*"):
            return topic.startswith(self.pattern[:-1])
        return topic == self.pattern

    def __str__(self) -> str:
        return f"{self.action.value}:{self.pattern}"


def parse_grant(text: str) -> tuple[Grant, ...]:
    """`produce:orders.*` -> its grants (`all:` gives three); ValueError with the reason."""
    action, separator, pattern = text.partition(":")
    if not separator or not pattern:
        raise ValueError(f"a grant is ACTION:PATTERN (e.g. produce:orders.*), not {text!r}")
    if "*" in pattern[:-1]:
        raise ValueError(f"{text!r}: '*' may only end a pattern (a prefix)")
    if action == "all":
        return tuple(Grant(a, pattern) for a in Action)
    try:
        return (Grant(Action(action), pattern),)
    except ValueError:
        raise ValueError(
            f"{text!r}: action must be produce, consume, admin or all, not {action!r}"
        ) from None


def parse_grants(texts: Iterable[str]) -> tuple[Grant, ...]:
    return tuple(grant for text in texts for grant in parse_grant(text))


def allowed(grants: Iterable[Grant], action: Action, topic: str) -> bool:
    return any(grant.matches(action, topic) for grant in grants)


def may_see(grants: Iterable[Grant], topic: str) -> bool:
    """Whether LIST_TOPICS shows `topic` to the principal: any grant on it."""
    return any(grant.matches(grant.action, topic) for grant in grants)


def request_transactional_id(request: m.Request) -> str | None:
    """The transactional id `request` uses (produce on `txn:<id>`), from its declaration in
    `server.request_table`; None for a request that names none."""
    field = REQUESTS[type(request)].transactional_id_field
    return None if field is None else str(getattr(request, field))


def request_action(request: m.Request) -> tuple[Action | str, str]:
    """(what the request needs, the topic it concerns), from its declaration in
    `server.request_table`; the topic is "" for ANYONE and `EVERY_TOPIC` for a server-wide admin
    request."""
    kind = REQUESTS[type(request)]
    topic = kind.topic(request)
    if kind.needs == ANYONE or (kind.topic_optional and not topic):
        return ANYONE, ""
    need: Action | str = Action(kind.needs) if kind.needs in _ACTIONS else kind.needs
    return need, EVERY_TOPIC if topic is None else topic


_ACTIONS = frozenset(action.value for action in Action)
