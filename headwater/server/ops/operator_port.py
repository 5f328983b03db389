"""The operator's HTTP port: its routes and its start-up.

`start_operator_port` binds the HTTP listener (server/ops/http.py) when `http_port` is set, before
recovery, so /healthz answers at once and /readyz says 503 while topics are opened. The routes serve
/metrics (server/ops/metrics.py's collectors), /healthz, /readyz, the status page and the JSON it
draws from (server/ops/status.py). This module sits above both metrics and status so neither imports
the other's user.

It follows the message port's security (docs/SECURITY.md): HTTPS with the message port's TLS
context when it has one; with a tokens file, every path but /healthz takes
`Authorization: Bearer <token>` (`Security.bearer`: the same file, hashing, expiry, revocation and
per-address failure limit) whose principal holds `admin:*`, because the status page and metrics
describe every topic and subscription; without one, it binds to loopback only unless `insecure`,
checked here on the host it binds, whatever the message port's check did.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import urllib.parse

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from headwater.server.config import ServerConfig
from headwater.server.net.listener import Listener, StartupError
from headwater.server.ops.http import (
    Guard,
    Handler,
    HttpListener,
    HttpStartupError,
    Request,
    Response,
)
from headwater.server.ops.metrics import make_registry
from headwater.server.ops.status import ServerState
from headwater.server.ops.status_page import page as status_page
from headwater.server.security.access import Security
from headwater.server.security.authz import Action
from headwater.server.security.tls import is_loopback

log = structlog.get_logger(__name__)


def routes(state: ServerState, registry: CollectorRegistry) -> dict[str, Handler]:
    async def metrics(query: str) -> Response:
        return Response(200, generate_latest(registry), CONTENT_TYPE_LATEST)

    async def healthz(query: str) -> Response:
        return Response(200, b"ok\n")

    async def readyz(query: str) -> Response:
        reason = await state.readiness()
        if reason is None:
            return Response(200, b"ready\n")
        return Response(503, f"not ready: {reason}\n".encode())

    async def page(query: str) -> Response:
        body = status_page(state.status(await state.readiness()))  # drawn before "load"
        return Response(200, body.encode(), "text/html; charset=utf-8")

    async def status_json(query: str) -> Response:
        body = json.dumps(state.status(await state.readiness()), separators=(",", ":"))
        return Response(200, body.encode(), "application/json")

    async def stages(query: str) -> Response:
        every = None
        if query:
            asked = urllib.parse.parse_qs(query, keep_blank_values=True)
            values = asked.pop("every", [])
            if asked or len(values) != 1 or not _WHOLE.fullmatch(values[0]):
                return Response(400, b"the only parameter is every=N, N a whole number >= 0\n")
            every = int(values[0])
        report = state.stages(every)
        # encoded on a thread: 200,000 events take a few hundred milliseconds to turn into JSON
        # (a debugging request: asyncio's default executor; docs/OPERATIONS.md, Threads)
        body = await asyncio.to_thread(json.dumps, report, separators=(",", ":"))
        return Response(200, body.encode(), "application/json")

    return {
        "/metrics": metrics,
        "/debug/stages": stages,
        "/healthz": healthz,
        "/readyz": readyz,
        "/": page,
        "/status.json": status_json,
    }


_WHOLE = re.compile(r"[0-9]{1,18}")  # ASCII digits only ("²".isdigit() is True)

OPEN_PATHS = frozenset({"/healthz"})  # liveness says nothing about the data: no token needed
_CHALLENGE = 'Bearer realm="headwater"'


def guard(security: Security) -> Guard:
    """Refuse a request without a valid bearer token (401), from an address over its failure
    limit (429), or whose principal lacks `admin:*` (403)."""

    def check(request: Request) -> Response | None:
        if request.path in OPEN_PATHS:
            return None
        scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
        presented = token.strip() if scheme.lower() == "bearer" and token.strip() else None
        verdict = security.bearer(request.peer, presented)
        if verdict == 429:
            return Response(
                429,
                b"too many failed authentications from this address; try again in a minute\n",
                headers=(("Retry-After", "60"),),
            )
        if isinstance(verdict, int):
            challenge = _CHALLENGE if presented is None else f'{_CHALLENGE}, error="invalid_token"'
            body = b"a bearer token is required\n" if presented is None else b"invalid token\n"
            return Response(401, body, headers=(("WWW-Authenticate", challenge),))
        if not any(g.action is Action.ADMIN and g.pattern == "*" for g in verdict.grants):
            log.warning(
                "auth.http_forbidden",
                peer=request.peer,
                principal=verdict.principal,
                path=request.path,
            )
            return Response(403, b"this port needs a token with the admin:* grant\n")
        return None

    return check


async def start_operator_port(
    config: ServerConfig, listener: Listener, stack: contextlib.AsyncExitStack
) -> ServerState | None:
    """Open the HTTP port if `config.http_port` is set (before recovery, so /healthz answers and
    /readyz says 503 while topics are opened); `stack` closes it. None when there is none."""
    if config.http_port is None:
        return None
    host = config.host  # a separate HTTP host, if one comes, must go through the same check
    security, tls = listener.shared.security, listener.shared.tls
    if security is None and not config.security.insecure and not is_loopback(host):
        raise StartupError(
            f"refusing to serve HTTP on {host or '*'} without authentication: give "
            "--auth-tokens FILE, or --insecure to let anyone who can reach it read it"
        )
    state = ServerState(config.data_dir, listener)
    state.registry = make_registry(state)
    http = HttpListener(
        host,
        config.http_port,
        routes(state, state.registry),
        tls,
        None if security is None else guard(security),
    )
    try:
        port = http.bind()
    except HttpStartupError as exc:
        raise StartupError(str(exc)) from None
    stack.callback(http.close)
    stack.push_async_callback(state.close)
    http.start()
    if config.http_port_file is not None:
        temporary = config.http_port_file.with_suffix(".tmp")
        temporary.write_text(f"{port}\n")
        os.replace(temporary, config.http_port_file)
    log.info(
        "server.http_listening",
        host=host,
        port=port,
        tls=tls is not None,
        auth="bearer" if security is not None else "off",
    )
    return state
