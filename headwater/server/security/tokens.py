"""The tokens file: who may connect, with which grants and quotas. Only hashes of secrets.

A token reads `hw1.<id>.<secret>`: `id` (12 hex digits) names the entry, `secret` (32 random
bytes, base64url) is checked against the entry's SHA-256. A secret of 256 random bits needs no
slow hash: nothing shorter than the hash itself can be guessed, and the file never holds a
secret, so a leaked file grants nothing. The server compares digests in constant time.

The file is JSON, written whole to a temporary file and renamed over the old one (atomic), by
`headwater token create/revoke` or by hand:

    {"version": 1, "entries": [
      {"id": "3f2a...", "principal": "billing", "kind": "token", "sha256": "<hex>",
       "grants": ["produce:billing.*", "consume:billing.*"], "created": 1735000000,
       "expires": 1737592000, "revoked": null,
       "quotas": {"produce_bytes_per_second": 1048576}}]}

`kind` "certificate" entries hold no secret: they give grants (and quotas) to the principal named
by a TLS client certificate's common name. `expires` and `revoked` are Unix seconds or null.
A revoked entry stays in the file (so `token list` shows it) and authenticates nothing.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from headwater.server.security.authz import Grant, parse_grants

PREFIX = "hw1"
QUOTA_NAMES = ("produce_bytes_per_second", "consume_bytes_per_second", "max_connections")


@dataclass(frozen=True, slots=True)
class Entry:
    id: str
    principal: str
    kind: str  # "token" or "certificate"
    sha256: str  # hex digest of the secret; "" for certificate entries
    grants: tuple[str, ...]
    created: int
    expires: int | None = None
    revoked: int | None = None
    quotas: dict[str, int] = field(default_factory=dict)

    @property
    def parsed_grants(self) -> tuple[Grant, ...]:
        return parse_grants(self.grants)

    def valid(self, now: float) -> str | None:
        """None if it authenticates at `now`, else why not."""
        if self.revoked is not None:
            return "revoked"
        if self.expires is not None and now >= self.expires:
            return "expired"
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "principal": self.principal,
            "kind": self.kind,
            "sha256": self.sha256,
            "grants": list(self.grants),
            "created": self.created,
            "expires": self.expires,
            "revoked": self.revoked,
            "quotas": dict(self.quotas),
        }


class TokenFileError(ValueError):
    pass


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def split_token(token: str) -> tuple[str, str] | None:
    """(id, secret), or None if `token` is not shaped like one of ours."""
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != PREFIX or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


def check_secret(entry: Entry, secret: str) -> bool:
    return entry.kind == "token" and hmac.compare_digest(entry.sha256, hash_secret(secret))


def load(path: Path) -> dict[str, Entry]:
    """Entries by id; `TokenFileError` naming the file and the problem."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise TokenFileError(f"tokens file {path} does not exist") from None
    except OSError as exc:
        raise TokenFileError(f"cannot read tokens file {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise TokenFileError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != 1:
        raise TokenFileError(f'{path}: expected an object with "version": 1')
    entries: dict[str, Entry] = {}
    for number, raw in enumerate(data.get("entries", [])):
        try:
            entry = _entry(raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise TokenFileError(f"{path}: entry {number}: {exc}") from None
        entries[entry.id] = entry
    return entries


def _entry(raw: Any) -> Entry:
    if not isinstance(raw, dict):
        raise TypeError("must be an object")
    kind = raw.get("kind", "token")
    if kind not in ("token", "certificate"):
        raise ValueError(f"kind must be token or certificate, not {kind!r}")
    grants = tuple(str(g) for g in raw.get("grants", []))
    parse_grants(grants)  # a typo in a grant must not load as "no grant" silently
    quotas = {str(k): int(v) for k, v in (raw.get("quotas") or {}).items()}
    unknown = set(quotas) - set(QUOTA_NAMES)
    if unknown:
        raise ValueError(f"unknown quota(s) {sorted(unknown)}; known: {', '.join(QUOTA_NAMES)}")
    entry = Entry(
        id=str(raw["id"]),
        principal=str(raw["principal"]),
        kind=kind,
        sha256=str(raw.get("sha256", "")),
        grants=grants,
        created=int(raw.get("created", 0)),
        expires=None if raw.get("expires") is None else int(raw["expires"]),
        revoked=None if raw.get("revoked") is None else int(raw["revoked"]),
        quotas=quotas,
    )
    if kind == "token" and len(entry.sha256) != 64:
        raise ValueError("a token entry needs its sha256 (64 hex digits)")
    if not entry.principal:
        raise ValueError("principal must not be empty")
    return entry


def save(path: Path, entries: dict[str, Entry]) -> None:
    """Atomically replace the file; readable by its owner only (it lists principals)."""
    data = {"version": 1, "entries": [e.to_json() for e in entries.values()]}
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=1)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def load_or_empty(path: Path) -> dict[str, Entry]:
    return load(path) if path.exists() else {}


def create(
    path: Path,
    principal: str,
    grants: tuple[str, ...],
    expires: int | None = None,
    quotas: dict[str, int] | None = None,
    certificate: bool = False,
) -> tuple[Entry, str | None]:
    """Add an entry; returns it and the token (None for a certificate entry), shown only once."""
    if not principal:
        raise ValueError("the principal must not be empty")
    parse_grants(grants)
    entries = load_or_empty(path)
    entry_id = secrets.token_hex(6)
    secret = None if certificate else _secret()
    entry = Entry(
        id=entry_id,
        principal=principal,
        kind="certificate" if certificate else "token",
        sha256="" if secret is None else hash_secret(secret),
        grants=grants,
        created=int(time.time()),
        expires=expires,
        quotas=dict(quotas or {}),
    )
    entries[entry_id] = entry
    save(path, entries)
    return entry, None if secret is None else f"{PREFIX}.{entry_id}.{secret}"


def revoke(path: Path, selector: str) -> list[Entry]:
    """Revoke the entry with id `selector`, or every entry of the principal `selector`."""
    entries = load(path)
    now = int(time.time())
    chosen = [e for e in entries.values() if e.id == selector] or [
        e for e in entries.values() if e.principal == selector
    ]
    for entry in chosen:
        if entry.revoked is None:
            entries[entry.id] = replace(entry, revoked=now)
    if chosen:
        save(path, entries)
    return [entries[e.id] for e in chosen]


def _secret() -> str:
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
