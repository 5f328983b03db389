"""The client's side of security: TLS settings and the AUTHENTICATE handshake.

`Tls` names the files: `ca` (verify the server against this CA instead of the system's), `cert`
and `key` (a client certificate, for servers that take certificates as identity). The server's
certificate is always verified, and its name checked against the host connected to (or
`server_hostname`). `connect(..., tls=True)` uses the system's CAs.

The handshake is the first request on every connection the client opens (the first one, its
producers' own, and reconnections): AUTHENTICATE with the token, or with mechanism "certificate"
when there is a client certificate and no token. A refusal raises `AuthenticationFailed` and the
connection is closed. A TLS handshake the server rejects for the client's certificate surfaces
as `AuthenticationFailed` too, not as a lost connection: with TLS 1.3 the server's verdict on
the client certificate only arrives after the client's side of the handshake completed, and a
server may close without sending its alert (uvloop does), so a connection that presented a
certificate and was closed or reset before the handshake's answer counts as refused.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from headwater.wire import messages as m
from headwater.wire.errors import AuthenticationFailed, HeadwaterError


@dataclass(frozen=True, slots=True)
class Tls:
    ca: Path | str | None = None
    cert: Path | str | None = None
    key: Path | str | None = None
    server_hostname: str | None = None

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca) if self.ca else None)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert is not None:
            context.load_cert_chain(str(self.cert), str(self.key) if self.key else None)
        return context


TlsOption = bool | Tls | ssl.SSLContext | None


def ssl_context(tls: TlsOption) -> ssl.SSLContext | None:
    """The context `connect(tls=...)` means: None (plaintext), True (system CAs), `Tls`, or an
    `ssl.SSLContext` of the caller's own."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return Tls().context()
    if isinstance(tls, Tls):
        try:
            return tls.context()
        except (OSError, ssl.SSLError) as exc:
            raise HeadwaterError(f"cannot load the TLS files: {exc}") from None
    assert isinstance(tls, ssl.SSLContext)
    return tls


def handshake_request(token: str | None, tls: TlsOption) -> m.AuthenticateRequest | None:
    """The AUTHENTICATE to send first, or None when there is nothing to authenticate with."""
    if token:
        return m.AuthenticateRequest("token", token.strip().encode())
    if isinstance(tls, Tls) and tls.cert is not None:
        return m.AuthenticateRequest("certificate", b"")
    return None  # (a caller's own SSLContext authenticates with a token, if any)


def tls_refusal(exc: BaseException | None) -> AuthenticationFailed | None:
    """The server rejected our certificate in the TLS handshake (a TLS alert)."""
    if not isinstance(exc, ssl.SSLError) or isinstance(exc, ssl.SSLCertVerificationError):
        return None  # (we could not verify the server: not a refusal of our credential)
    text = str(exc).lower()
    if "alert" in text and ("certificate" in text or "unknown ca" in text):
        return AuthenticationFailed(f"the server refused our TLS client certificate: {exc}")
    return None


def certificate_refused(exc: BaseException, presented: bool) -> AuthenticationFailed | None:
    """A close or reset before the handshake's answer, after presenting a client certificate."""
    if not presented:
        return None
    if isinstance(exc, ssl.SSLCertVerificationError | ConnectionRefusedError | TimeoutError):
        return None
    if isinstance(exc, HeadwaterError | ConnectionResetError | ssl.SSLError | EOFError):
        return AuthenticationFailed(
            f"the server closed the connection before answering the handshake: it refused the "
            f"TLS client certificate ({exc})"
        )
    return None
