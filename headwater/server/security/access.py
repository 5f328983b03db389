"""Authentication, authorization checks, revocation and quotas, for the connections of a server
whose `security.auth_tokens` is set (docs/SECURITY.md).

A connection starts unauthenticated: it may send AUTHENTICATE and API_VERSIONS, and anything else is
refused with AUTHENTICATION_REQUIRED and the connection closed. AUTHENTICATE with mechanism "token"
checks the token against the tokens file (`server.security.tokens`); mechanism "certificate" takes
the verified TLS client certificate's common name and the file's certificate entries for it. A
failure answers AUTHENTICATION_FAILED (with the token's public id, never its secret, in the log) and
closes the connection. Failures are counted per (source address, token id) and per source address;
past `auth_failures_per_minute` for the pair (or ten times that for the address, whatever the
ids), a failed attempt is answered only after `FAILURE_DELAY`, its connection read no further
meanwhile (the per-address cap on unauthenticated connections then bounds the guessing rate). A
valid credential is always checked and accepted: one client behind a NAT or proxy guessing, or
mistyping, cannot lock out the others at the same address.

Once authenticated, each request is checked against the principal's grants (`server.security.authz`)
before it reaches the broker, with the answers cached per connection. Every second `tick` reloads
the tokens file if it changed (and the TLS certificate, `server.security.tls`) and closes, with a
connection-level AUTHENTICATION_FAILED, every connection whose token was revoked, removed or has
expired; grant changes apply to live connections at the same time.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import structlog

from headwater.server.config import SecurityConfig
from headwater.server.reply import AfterData, AfterWork, Reply, Waiting
from headwater.server.security.authz import (
    ANY_GRANT,
    ANYONE,
    EVERY_TOPIC,
    OWNER_OR_ADMIN,
    Action,
    Grant,
    allowed,
    may_see,
    request_action,
    request_transactional_id,
    transactional_id_resource,
)
from headwater.server.security.quotas import Quotas
from headwater.server.security.subscription_owners import Owners
from headwater.server.security.tls import peer_common_name
from headwater.server.security.tokens import Entry, TokenFileError, check_secret, load, split_token
from headwater.wire import messages as m
from headwater.wire.errors import (
    AuthenticationFailed,
    AuthenticationRequired,
    HeadwaterError,
    InvalidRequest,
    NotAuthorized,
    TooManyConnections,
    TransactionalIdNotAuthorized,
)

log = structlog.get_logger(__name__)

TICK_SECONDS = 1.0
FAILURE_WINDOW = 60.0
# Past the failure limit, a failed attempt's answer waits this long (a valid one never waits).
FAILURE_DELAY = 1.0
# Failures from one address, whatever the token ids, may reach this many times the limit per
# (address, token id) before they are delayed too: a guesser cycling ids is slowed as well.
ADDRESS_FAILURE_FACTOR = 10
MAX_TRACKED_KEYS = 100_000


@dataclass(eq=False, slots=True)
class Session:
    """What one authenticated connection is allowed, refreshed when the tokens file changes."""

    principal: str
    mechanism: str
    entry_ids: tuple[str, ...]
    grants: tuple[Grant, ...]
    produce_rate: int
    consume_rate: int
    max_connections: int
    expires: int | None
    cache: dict[tuple[Action, str], bool] = field(default_factory=dict)

    def allows(self, action: Action, topic: str) -> bool:
        key = (action, topic)
        answer = self.cache.get(key)
        if answer is None:
            if len(self.cache) > 10_000:  # a client cycling topic names must not grow memory
                self.cache.clear()
            answer = self.cache[key] = allowed(self.grants, action, topic)
        return answer


class AuthPeer(Protocol):
    """The connection, as authentication sees it."""

    peer: str
    peercert: Any
    auth: Session | None

    def revoke(self, error: HeadwaterError) -> None: ...


class Security:
    def __init__(self, config: SecurityConfig, data_dir: Path) -> None:
        assert config.auth_tokens is not None
        self._config = config
        self._path = config.auth_tokens
        self._stamp = self._file_stamp()
        self._entries = load(self._path)  # TokenFileError at start-up: the server does not start
        self._owners = Owners(data_dir / "subscription-owners.json")
        self._quotas = Quotas()
        # (address, token id) and (address, None): monotonic times of recent failures
        self._failures: dict[tuple[str, str | None], deque[float]] = {}
        self._counts: dict[str, int] = {}  # live authenticated connections per principal
        self._peers: Callable[[], Iterable[AuthPeer]] = tuple
        self._is_reliable: Callable[[str], bool] = lambda topic: False
        self._timer: asyncio.TimerHandle | None = None
        self._waiting: weakref.WeakKeyDictionary[AuthPeer, float] = weakref.WeakKeyDictionary()

    def start(
        self, peers: Callable[[], Iterable[AuthPeer]], is_reliable: Callable[[str], bool]
    ) -> None:
        self._peers = peers
        self._is_reliable = is_reliable
        self._timer = asyncio.get_running_loop().call_later(TICK_SECONDS, self._tick)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # Authentication

    def authenticate(self, peer: AuthPeer, request: m.AuthenticateRequest) -> Reply:
        """The AUTHENTICATE answer; a failure past the limit is answered after FAILURE_DELAY."""
        if peer.auth is not None:
            raise InvalidRequest("the connection is already authenticated")
        address = peer.peer.rpartition(":")[0]
        now = time.time()
        try:
            session = self._session(peer, request, now)
        except AuthenticationFailed as exc:
            token_id = _token_id(request)
            clock = time.monotonic()
            throttled = self._throttled(address, token_id, clock)
            self._failed(address, token_id, clock)
            log.warning(
                "auth.failed",
                peer=peer.peer,
                mechanism=request.mechanism,
                entry=token_id,
                error=exc.message,
                throttled=throttled,
            )
            if throttled:
                return AfterWork(_delayed_failure(exc, address))
            raise
        count = self._counts.get(session.principal, 0)
        if count >= session.max_connections:
            raise TooManyConnections(
                f"principal {session.principal!r} is at its {session.max_connections}-connection "
                "limit"
            )
        self._counts[session.principal] = count + 1
        peer.auth = session
        log.info(
            "auth.ok",
            peer=peer.peer,
            principal=session.principal,
            mechanism=session.mechanism,
            entry=",".join(session.entry_ids),
        )
        return m.AuthenticateResponse(session.principal, (session.expires or 0) * 1000)

    def _session(self, peer: AuthPeer, request: m.AuthenticateRequest, now: float) -> Session:
        if request.mechanism == "token":
            try:
                parts = split_token(request.credentials.decode())
            except UnicodeDecodeError:
                parts = None
            if parts is None:
                raise AuthenticationFailed("not a Headwater token (hw1.<id>.<secret>)")
            entry = self._entries.get(parts[0])
            if entry is None:  # created a moment ago? (a stat; failures are rate-limited)
                self.reload()
                entry = self._entries.get(parts[0])
            if entry is None or not check_secret(entry, parts[1]):
                raise AuthenticationFailed(f"unknown token or wrong secret (token id {parts[0]})")
            reason = entry.valid(now)
            if reason is not None:
                raise AuthenticationFailed(f"token {entry.id} is {reason}")
            return self._build(entry.principal, "token", [entry])
        if request.mechanism == "certificate":
            name = peer_common_name(peer.peercert)
            if name is None:
                raise AuthenticationFailed("no verified TLS client certificate on this connection")
            entries = self._certificate_entries(name, now)
            if not entries:
                self.reload()
                entries = self._certificate_entries(name, now)
            if not entries:
                raise AuthenticationFailed(f"no valid certificate entry for {name!r}")
            return self._build(name, "certificate", entries)
        raise AuthenticationFailed(
            f"unknown mechanism {request.mechanism!r} (token or certificate)"
        )

    def bearer(self, address: str, token: str | None) -> Session | int:
        """The session of an HTTP request's bearer token (the operator port), or the status that
        refuses it: 401 for no token or a malformed, unknown, wrong, expired or revoked one, 429
        instead for a failed one while (`address`, token id) is over its failure limit (shared with
        AUTHENTICATE). One answer for all failures, so nothing tells whether an id exists; only the
        log says which (never the secret). A valid token is never refused for others' failures."""
        if token is None:
            return 401
        self.reload()  # a stat: a revocation applies to the very next request
        parts = split_token(token)
        entry = None if parts is None else self._entries.get(parts[0])
        reason: str | None
        if parts is None:
            reason = "not a Headwater token"
        elif entry is None or not check_secret(entry, parts[1]):
            reason = "unknown token or wrong secret"
        else:
            reason = entry.valid(time.time())
        if entry is None or reason is not None:
            token_id = "" if parts is None else parts[0]
            clock = time.monotonic()
            throttled = self._throttled(address, token_id, clock)
            self._failed(address, token_id, clock)
            log.warning(
                "auth.http_failed", peer=address, entry=token_id, error=reason, throttled=throttled
            )
            return 429 if throttled else 401
        return self._build(entry.principal, "token", [entry])

    def _certificate_entries(self, name: str, now: float) -> list[Entry]:
        return [
            e
            for e in self._entries.values()
            if e.kind == "certificate" and e.principal == name and e.valid(now) is None
        ]

    def _build(self, principal: str, mechanism: str, entries: list[Entry]) -> Session:
        def quota(name: str, default: int) -> int:
            values = [e.quotas[name] for e in entries if name in e.quotas]
            return max(values) if values else default

        expiries = [e.expires for e in entries if e.expires is not None]
        return Session(
            principal=principal,
            mechanism=mechanism,
            entry_ids=tuple(e.id for e in entries),
            grants=tuple(g for e in entries for g in e.parsed_grants),
            produce_rate=quota("produce_bytes_per_second", self._config.produce_bytes_per_second),
            consume_rate=quota("consume_bytes_per_second", self._config.consume_bytes_per_second),
            max_connections=quota("max_connections", self._config.max_connections_per_principal),
            expires=max(expiries) if len(expiries) == len(entries) else None,
        )

    def _recent(self, key: tuple[str, str | None], now: float) -> int:
        failures = self._failures.get(key)
        if failures is None:
            return 0
        while failures and now - failures[0] > FAILURE_WINDOW:
            failures.popleft()
        return len(failures)

    def _throttled(self, address: str, token_id: str, now: float) -> bool:
        """Whether a failure from `address` with `token_id` now is past the limit."""
        limit = self._config.auth_failures_per_minute
        return (
            self._recent((address, token_id), now) >= limit
            or self._recent((address, None), now) >= limit * ADDRESS_FAILURE_FACTOR
        )

    def _failed(self, address: str, token_id: str, now: float) -> None:
        limit = self._config.auth_failures_per_minute
        pair, whole = (address, token_id), (address, None)
        for key, keep in ((pair, limit), (whole, limit * ADDRESS_FAILURE_FACTOR)):
            failures = self._failures.get(key)
            if failures is None:
                if len(self._failures) >= MAX_TRACKED_KEYS:
                    self._prune(now)
                failures = self._failures[key] = deque(maxlen=keep)
            failures.append(now)

    def _prune(self, now: float) -> None:
        self._failures = {
            a: f for a, f in self._failures.items() if f and now - f[-1] <= FAILURE_WINDOW
        }

    def release(self, peer: AuthPeer) -> None:
        """The connection closed: it no longer counts against its principal's limit."""
        session, peer.auth = peer.auth, None
        if session is not None:
            left = self._counts.get(session.principal, 1) - 1
            if left > 0:
                self._counts[session.principal] = left
            else:
                self._counts.pop(session.principal, None)

    # Authorization

    def check(self, peer: AuthPeer, request: m.Request) -> None:
        """Raise unless the connection may make `request` (AUTHENTICATE is handled before)."""
        session = peer.auth
        if session is None:
            if type(request) is m.ApiVersionsRequest:
                return
            raise AuthenticationRequired(
                "authenticate first: this server takes only AUTHENTICATE before it"
            )
        transactional_id = request_transactional_id(request)
        if transactional_id is not None:
            check_transactional_id(session, transactional_id)
        if type(request) is m.LookupRequest:
            # a long poll on a topic it may not see would tell by its timing whether the topic
            # exists (one that does not is answered at once)
            for wait in request.wait_for:
                if not may_see(session.grants, wait.topic):
                    raise NotAuthorized(
                        f"principal {session.principal!r} has no grant on topic {wait.topic!r}"
                    )
        need, topic = request_action(request)
        if need is ANYONE:
            return
        if isinstance(need, Action):
            if topic == EVERY_TOPIC and not _everywhere(session.grants, need):
                raise NotAuthorized(
                    f"principal {session.principal!r} may not ask for server-wide information: "
                    f"it takes {need.value} on every topic ({need.value}:*)"
                )
            if not session.allows(need, topic):
                raise NotAuthorized(
                    f"principal {session.principal!r} may not {need.value} on topic {topic!r}"
                )
            if type(request) is m.SubscribeRequest:
                self._check_owner(session, topic, request.subscription, "attach to")
            elif type(request) is m.AddAcksToTxnRequest:
                self._check_owner(session, topic, request.subscription, "acknowledge messages of")
            return
        if need == ANY_GRANT:
            if may_see(session.grants, topic):
                return
            raise NotAuthorized(f"principal {session.principal!r} has no grant on topic {topic!r}")
        # the two requests declared owner-or-admin (server.request_table)
        assert need == OWNER_OR_ADMIN
        assert isinstance(request, m.SeekRequest | m.DeleteSubscriptionRequest)
        subscription = request.subscription
        owner = self._owners.owner(topic, subscription)
        if session.allows(Action.ADMIN, topic) or (
            owner == session.principal and session.allows(Action.CONSUME, topic)
        ):
            return
        raise NotAuthorized(
            f"principal {session.principal!r} may not manage subscription {subscription!r} on "
            f"topic {topic!r}: it takes admin on the topic, or owning the subscription"
        )

    def _check_owner(self, session: Session, topic: str, subscription: str, what: str) -> None:
        owner = self._owners.owner(topic, subscription)
        if owner is None or owner == session.principal or session.allows(Action.ADMIN, topic):
            return
        raise NotAuthorized(
            f"principal {session.principal!r} may not {what} subscription {subscription!r} on "
            f"topic {topic!r}: another principal owns it"
        )

    def after(self, peer: AuthPeer, request: m.Request, result: Reply) -> Reply:
        """Ownership bookkeeping once a request succeeded; LIST_TOPICS filtered to the grants."""
        session = peer.auth
        if session is None:
            return result
        kind = type(request)
        if kind is m.ListTopicsRequest and isinstance(result, m.ListTopicsResponse):
            return m.ListTopicsResponse(
                tuple(t for t in result.topics if may_see(session.grants, t.name))
            )
        if kind is m.LookupRequest:
            # a topic without a grant is answered as one that does not exist: nothing tells
            # whether it does, nor how many partitions it has
            grants = session.grants
            return _mapped(
                result,
                lambda found: replace(
                    found,
                    topics=tuple(
                        t if may_see(grants, t.name) else m.LookupTopic.unknown(t.name)
                        for t in found.topics
                    ),
                ),
            )
        if kind is m.ListSubscriptionsRequest and isinstance(result, m.ListSubscriptionsResponse):
            return m.ListSubscriptionsResponse(
                tuple(s for s in result.subscriptions if may_see(session.grants, s.topic))
            )
        if kind is m.SubscribeRequest:
            assert isinstance(request, m.SubscribeRequest)
            if self._is_reliable(request.topic):
                claim = (request.topic, request.subscription, session.principal)
                return _then(result, lambda: self._owners.claim(*claim))
        elif kind is m.DeleteSubscriptionRequest:
            assert isinstance(request, m.DeleteSubscriptionRequest)
            key = (request.topic, request.subscription)
            return _then(result, lambda: self._owners.forget(*key))
        elif kind is m.DeleteTopicRequest:
            assert isinstance(request, m.DeleteTopicRequest)
            name = request.name
            return _then(result, lambda: self._owners.forget_topic(name))
        return result

    # Quotas

    def charge_produce(self, peer: AuthPeer, size: int) -> float:
        session = peer.auth
        if session is None or session.produce_rate <= 0:
            return 0.0
        return self._quotas.charge(session.principal, "produce", session.produce_rate, size)

    def produce_debt(self, peer: AuthPeer) -> float:
        """Seconds the connection's principal is muted for (its produce debt; 0: none)."""
        session = peer.auth
        if session is None or session.produce_rate <= 0:
            return 0.0
        return self._quotas.debt(session.principal, "produce", session.produce_rate)

    def charge_consume(self, peer: AuthPeer, size: int) -> float:
        session = peer.auth
        if session is None or session.consume_rate <= 0:
            return 0.0
        return self._quotas.charge(session.principal, "consume", session.consume_rate, size)

    # Reloading and revocation

    def _file_stamp(self) -> tuple[int, int, int]:
        try:
            info = self._path.stat()
        except OSError:
            return (0, 0, 0)
        return (info.st_mtime_ns, info.st_ino, info.st_size)

    def reload(self, force: bool = False) -> None:
        """Re-read the tokens file if it changed (or `force`, on SIGHUP)."""
        stamp = self._file_stamp()
        if stamp == self._stamp and not force:
            return
        try:
            entries = load(self._path)
        except TokenFileError as exc:
            # Keep the last good state rather than lock everyone out over a bad edit.
            log.error("auth.tokens_reload_failed", error=str(exc), hint="the previous file stays")
            self._stamp = stamp
            return
        self._stamp = stamp
        self._entries = entries
        log.info("auth.tokens_reloaded", entries=len(entries))

    def _tick(self) -> None:
        try:
            self.reload()
            self.sweep(time.time())
        finally:
            self._timer = asyncio.get_running_loop().call_later(TICK_SECONDS, self._tick)

    def sweep(self, now: float) -> None:
        """Close connections whose credentials are no longer valid, and those that have not
        authenticated within `handshake_timeout`; refresh the others."""
        deadline = self._config.handshake_timeout
        for peer in list(self._peers()):
            session = peer.auth
            if session is None:
                since = self._waiting.setdefault(peer, now)
                if now - since > deadline:
                    peer.revoke(AuthenticationRequired(f"no AUTHENTICATE within {deadline:g} s"))
                continue
            if session.mechanism == "certificate":
                entries = self._certificate_entries(session.principal, now)
                reason = None if entries else "no longer has a valid certificate entry"
            else:
                entry = self._entries.get(session.entry_ids[0])
                reason = "was removed" if entry is None else entry.valid(now)
                entries = [entry] if entry is not None else []
            if reason is not None:
                log.info("auth.revoked", peer=peer.peer, principal=session.principal, reason=reason)
                peer.revoke(AuthenticationFailed(f"credential of {session.principal!r} {reason}"))
                continue
            fresh = self._build(session.principal, session.mechanism, entries)
            if fresh.grants != session.grants:
                session.grants = fresh.grants
                session.cache.clear()
            session.produce_rate = fresh.produce_rate
            session.consume_rate = fresh.consume_rate
        if len(self._failures) > 1000:
            self._prune(time.monotonic())


def check_transactional_id(session: Session, transactional_id: str) -> None:
    """Raise unless the session may use the transactional id: `produce` on `txn:<id>`."""
    resource = transactional_id_resource(transactional_id)
    if not session.allows(Action.PRODUCE, resource):
        raise TransactionalIdNotAuthorized(
            f"principal {session.principal!r} may not use transactional id "
            f"{transactional_id!r}: it takes produce on {resource!r}"
        )


def _everywhere(grants: Iterable[Grant], action: Action) -> bool:
    return any(grant.action is action and grant.pattern == EVERY_TOPIC for grant in grants)


def _token_id(request: m.AuthenticateRequest) -> str:
    """The public id a failed AUTHENTICATE is counted under: the token's id, "certificate", or
    "" for credentials that are not a token at all."""
    if request.mechanism == "certificate":
        return "certificate"
    try:
        parts = split_token(request.credentials.decode())
    except UnicodeDecodeError:
        parts = None
    return "" if parts is None else parts[0]


async def _delayed_failure(error: AuthenticationFailed, address: str) -> m.Response:
    await asyncio.sleep(FAILURE_DELAY)
    raise AuthenticationFailed(
        f"{error.message} (too many failed authentications from {address} with this token id: "
        f"answered after {FAILURE_DELAY:g} s)"
    )


def _mapped(result: Reply, change: Callable[[Any], m.Response]) -> Reply:
    """`change(response)` of the request's response, after its wait (a long poll's) if any."""
    if not isinstance(result, Waiting):
        return change(result)
    return AfterData(_changed(result, change))


async def _changed(pending: Waiting, change: Callable[[Any], m.Response]) -> m.Response:
    return change(await pending.resolve())


def _then(result: Reply, action: Callable[[], None]) -> Reply:
    """Run `action` once the request has succeeded (after its wait, if it has one)."""
    if not isinstance(result, Waiting):
        action()
        return result
    return AfterWork(_after_success(result.resolve(), action))


async def _after_success(pending: Awaitable[m.Response], action: Callable[[], None]) -> m.Response:
    response = await pending
    action()
    return response
