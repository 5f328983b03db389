"""Helpers for the security tests: a server with a tokens file, and tokens made for a test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from headwater.server.security.tokens import create
from headwater.testing import ServerProcess


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
