"""What a connection may send before it has authenticated, decided from the frame header alone.

On a server with authentication, a connection that has not authenticated may send API_VERSIONS
(to learn what to speak) and AUTHENTICATE, in frames of at most `wire.limits.MAX_PRE_AUTH_FRAME`
bytes; its frame decoder is set to that limit until AUTHENTICATE succeeds, so a larger frame is
skipped, never buffered. Anything else is answered AUTHENTICATION_REQUIRED from its api key,
before its body is decoded, and the connection is closed: an anonymous peer costs the server a
header, whatever the body holds (an 8 MiB CREATE_TOPIC of 2 million configs once cost 21 s of
parsing before the authentication check).

Which api keys may come first is the `before_auth` flag of their declarations in
`server.request_table`.
"""

from __future__ import annotations

from typing import Final

from headwater.server.request_table import kind_of_api_key
from headwater.wire.errors import AuthenticationRequired, FrameTooLarge, HeadwaterError
from headwater.wire.limits import MAX_PRE_AUTH_FRAME


class _BeforeAuth:
    """The api keys declared `before_auth`, looked up as they are asked: `REQUESTS` fills as
    the handler modules are imported, after this one."""

    def __contains__(self, api_key: object) -> bool:
        kind = kind_of_api_key(api_key) if isinstance(api_key, int) else None
        return kind is not None and kind.before_auth


# the api keys a connection may send first (the connection core's `before_auth`)
BEFORE_AUTH_KEYS: Final = _BeforeAuth()


def pre_auth_required() -> HeadwaterError:
    """The error that answers a request whose api key may not come before authentication."""
    return AuthenticationRequired(
        "authenticate first: before AUTHENTICATE succeeds this server takes only "
        "API_VERSIONS and AUTHENTICATE"
    )


def pre_auth_refusal(api_key: int) -> HeadwaterError | None:
    """The error that answers a request with `api_key` before authentication, or None."""
    return None if api_key in BEFORE_AUTH_KEYS else pre_auth_required()


def pre_auth_oversized(api_key: int, size: int) -> HeadwaterError:
    """The error that answers a frame over `MAX_PRE_AUTH_FRAME` before authentication."""
    refusal = pre_auth_refusal(api_key)
    if refusal is not None:
        return refusal
    return FrameTooLarge(
        f"frame of {size} bytes exceeds the {MAX_PRE_AUTH_FRAME}-byte limit before authentication"
    )
