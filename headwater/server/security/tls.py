"""TLS for client connections, and the check that refuses an exposed server without auth.

`ServerTls` builds an `ssl.SSLContext` from the certificate and key files (TLS 1.2 at least) and
rebuilds it when either file changes (checked by `maybe_reload`, called every second, and
forced on SIGHUP): new connections get the new certificate, established ones keep theirs, and
nothing restarts. A reload that fails (a half-written file, a key that does not match) is logged
and the previous context stays in use, so a botched rotation never takes the server down.

With `tls_client_ca`, client certificates are requested and verified against that CA
(`CERT_OPTIONAL`: a client may still authenticate with a token instead, but a certificate it
presents must verify, else the TLS handshake fails). The certificate's common name is the
principal of the "certificate" mechanism.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)


class TlsError(Exception):
    pass


class ServerTls:
    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None) -> None:
        self._paths = tuple(p for p in (cert, key, client_ca) if p is not None)
        self._cert, self._key, self._client_ca = cert, key, client_ca
        self._stamps = self._read_stamps()
        self.context = self._build()  # raises TlsError: a bad start-up configuration is fatal

    def _read_stamps(self) -> tuple[tuple[int, int, int], ...]:
        stamps = []
        for path in self._paths:
            try:
                info = path.stat()
            except OSError:
                stamps.append((0, 0, 0))
            else:
                stamps.append((info.st_mtime_ns, info.st_ino, info.st_size))
        return tuple(stamps)

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self._cert, self._key)
            if self._client_ca is not None:
                context.load_verify_locations(cafile=self._client_ca)
                context.verify_mode = ssl.CERT_OPTIONAL
        except (OSError, ssl.SSLError) as exc:
            raise TlsError(
                f"cannot load the TLS certificate {self._cert} and key {self._key}"
                f"{f' or client CA {self._client_ca}' if self._client_ca else ''}: {exc}"
            ) from None
        return context

    def maybe_reload(self, force: bool = False) -> bool:
        """Rebuild the context if a file changed (or `force`); True if it did."""
        stamps = self._read_stamps()
        if stamps == self._stamps and not force:
            return False
        try:
            context = self._build()
        except TlsError as exc:
            log.error("tls.reload_failed", error=str(exc), hint="the previous certificate stays")
            return False
        self._stamps = stamps
        self.context = context
        log.info("tls.reloaded", cert=str(self._cert))
        return True


def peer_common_name(peercert: object) -> str | None:
    """The subject's commonName of a verified peer certificate (`SSLSocket.getpeercert()`)."""
    if not isinstance(peercert, dict):
        return None
    for rdn in peercert.get("subject", ()):
        for name, value in rdn:
            if name == "commonName":
                return str(value)
    return None


def is_loopback(host: str) -> bool:
    """Whether every address `host` resolves to is a loopback one ("" is every interface)."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)
