"""The operator's HTTP port: its routes and its start-up.

`start_operator_port` binds the HTTP listener (server/http.py) when `http_port` is set, before
recovery, so /healthz answers at once and /readyz says 503 while topics are opened. The routes
serve /metrics (server/metrics.py's collectors), /healthz, /readyz, the status page and the JSON it
draws from (server/status.py). This module sits above both metrics and status so neither imports
the other's user.
"""

from __future__ import annotations

import contextlib
import json
import os

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from server.config import ServerConfig
from server.http import Handler, HttpListener, HttpStartupError, Response
from server.listener import Listener, StartupError
from server.metrics import make_registry
from server.status import ServerState
from server.status_page import PAGE

log = structlog.get_logger("headwater.server")


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
        return Response(200, PAGE.encode(), "text/html; charset=utf-8")

    async def status_json(query: str) -> Response:
        body = json.dumps(state.status(await state.readiness()), separators=(",", ":"))
        return Response(200, body.encode(), "application/json")

    return {
        "/metrics": metrics,
        "/healthz": healthz,
        "/readyz": readyz,
        "/": page,
        "/status.json": status_json,
    }


async def start_operator_port(
    config: ServerConfig, listener: Listener, stack: contextlib.AsyncExitStack
) -> ServerState | None:
    """Open the HTTP port if `config.http_port` is set (before recovery, so /healthz answers and
    /readyz says 503 while topics are opened); `stack` closes it. None when there is none."""
    if config.http_port is None:
        return None
    state = ServerState(config.data_dir, listener)
    http = HttpListener(config.host, config.http_port, routes(state, make_registry(state)))
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
    log.info("server.http_listening", host=config.host, port=port)
    return state
