"""Helpers for the security tests: a server with a tokens file, and tokens made for a test."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from headwater.testing import ServerProcess
from server.tokens import create


@dataclass
class SecureServer:
    process: ServerProcess
    tokens: Path
    admin: str  # a token with every grant

    @property
    def address(self) -> str:
        return self.process.address

    def token(
        self,
        principal: str,
        *grants: str,
        expires: int | None = None,
        quotas: dict[str, int] | None = None,
    ) -> str:
        _, token = create(self.tokens, principal, grants, expires, quotas)
        assert token is not None
        return token


@contextmanager
def secure_server(tmp_path: Path, *extra_args: str) -> Iterator[SecureServer]:
    tokens = tmp_path / "tokens.json"
    _, admin = create(tokens, "admin", ("all:*",))
    assert admin is not None
    process = ServerProcess(
        tmp_path / "data", extra_args=("--auth-tokens", str(tokens), *extra_args)
    ).start()
    try:
        yield SecureServer(process, tokens, admin)
    finally:
        process.kill()


async def wait_until(condition: object, timeout: float = 10.0, what: str = "") -> None:
    """Poll `condition()` (bounded): for effects with no event to await, like a file reload."""
    import asyncio

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout}s: {what}")
