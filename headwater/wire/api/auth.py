"""AUTHENTICATE (the handshake, api key 30) and the THROTTLE push (103, produce quota).

No fast paths: a connection authenticates once, and THROTTLE is rare by construction.
"""

from __future__ import annotations

from typing import Final

from construct import Int32sb, Int64sb

from headwater.wire import messages as m
from headwater.wire.api.base import Api, Bytes, PushApi, String, message

APIS: Final = (
    Api(
        m.ApiKey.AUTHENTICATE,
        message(m.AuthenticateRequest, "mechanism" / String, "credentials" / Bytes),
        message(m.AuthenticateResponse, "principal" / String, "expires_ms" / Int64sb),
    ),
)

PUSHES: Final = (PushApi(m.ApiKey.THROTTLE, message(m.Throttle, "throttle_ms" / Int32sb)),)
