"""Frames <-> messages for every API, through tables keyed by api key (and by message type).

The API families in `wire.api` declare each API once (`Api`: request and response schemas, and
struct fast paths where a hot path needs them); this module collects them into dispatch tables
and fills each slot a family left empty with the construct schema, so encoding or decoding a
frame is one dictionary lookup and one call, whatever the API.

Versions: a client sends each request at its API's current version (`Api.version`); the server
also decodes every older version it lists in SUPPORTED_VERSIONS (`Api.older`: the fields that
version had, the others at their defaults). A response has one layout for every version: fields
are added at its end, which older clients leave unread (docs/PROTOCOL.md).

A response body starts with `error_code int16`. When it is not 0 the rest is the error message
(uint16 length + UTF-8, at most `wire.limits.MAX_ERROR_MESSAGE` bytes) instead of the response.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from headwater.wire import messages as m
from headwater.wire.api import (
    admin,
    auth,
    cluster,
    consume,
    maps,
    produce,
    schemas,
    transactions,
)
from headwater.wire.api.base import (
    ERROR_HEADER,
    OK,
    U16,
    Api,
    DataclassAdapter,
    PushApi,
    String,
    build,
    parse,
    parse_request,
)
from headwater.wire.errors import (
    HeadwaterError,
    MalformedFrame,
    UnsupportedApi,
    UnsupportedVersion,
    error_for_code,
)
from headwater.wire.frames import Flags, FrameHeader, encode_frame
from headwater.wire.limits import MAX_ERROR_MESSAGE

APIS: Final[dict[int, Api]] = {
    api.key: api
    for api in sorted(
        (
            *produce.APIS,
            *consume.APIS,
            *maps.APIS,
            *admin.APIS,
            *auth.APIS,
            *schemas.APIS,
            *cluster.APIS,
            *transactions.APIS,
        ),
        key=lambda a: a.key,
    )
}
PUSHES: Final[dict[int, PushApi]] = {
    push.key: push
    for push in sorted((*produce.PUSHES, *consume.PUSHES, *auth.PUSHES), key=lambda p: p.key)
}

# api key -> (request schema, response schema); api key -> push schema
SCHEMAS: Final[dict[int, tuple[DataclassAdapter, DataclassAdapter]]] = {
    key: (api.request, api.response) for key, api in APIS.items()
}
PUSH_SCHEMAS: Final[dict[int, DataclassAdapter]] = {
    key: push.schema for key, push in PUSHES.items()
}
REQUEST_API_KEYS: Final[dict[type, int]] = {api.request.cls: key for key, api in APIS.items()}
PUSH_API_KEYS: Final[dict[type, int]] = {push.schema.cls: key for key, push in PUSHES.items()}

# Versions 0 to each API's current one; the table lets a client ask (API_VERSIONS) before
# relying on one.
SUPPORTED_VERSIONS: Final[dict[int, tuple[int, int]]] = {
    key: (0, api.version) for key, api in APIS.items()
}


def _schema_request_encoder(api: Api) -> Callable[[Any, int, int], bytes]:
    def encode(request: Any, correlation_id: int, flags: int) -> bytes:
        return encode_frame(
            api.key, api.version, correlation_id, flags, build(api.request, request)
        )

    return encode


def _schema_request_decoder(api: Api, schema: DataclassAdapter) -> Callable[[bytes], m.Request]:
    what = api.key.name

    def decode(body: bytes) -> m.Request:
        request: m.Request = parse_request(schema, body, what)
        return request

    return decode


def _schema_response_encoder(api: Api) -> Callable[[int, Any], bytes]:
    def encode(correlation_id: int, response: Any) -> bytes:
        body = OK + build(api.response, response)
        return encode_frame(api.key, 0, correlation_id, Flags.RESPONSE, body)

    return encode


def _schema_response_decoder(api: Api) -> Callable[[bytes], m.Response]:
    fast = api.decode_response

    def decode(body: bytes) -> m.Response:
        if fast is not None:
            response = fast(body)
            if response is not None:
                return response
        parsed: m.Response = parse(api.response, body, "response")
        return parsed

    return decode


def _push_decoder(push: PushApi) -> Callable[[bytes], m.Push]:
    if push.decode is not None:
        return push.decode

    def decode(body: bytes) -> m.Push:
        parsed: m.Push = parse(push.schema, body, "pushed frame")
        return parsed

    return decode


_ENCODE_REQUEST: Final = {
    api.request.cls: api.encode_request or _schema_request_encoder(api) for api in APIS.values()
}
# api key -> a decoder per version, 0 to the current one
_DECODE_REQUEST: Final = {
    key: (
        *(_schema_request_decoder(api, older) for older in api.older),
        api.decode_request or _schema_request_decoder(api, api.request),
    )
    for key, api in APIS.items()
}
_ENCODE_RESPONSE: Final = {
    key: api.encode_response or _schema_response_encoder(api) for key, api in APIS.items()
}
_DECODE_RESPONSE: Final = {key: _schema_response_decoder(api) for key, api in APIS.items()}
_DECODE_PUSH: Final = {key: _push_decoder(push) for key, push in PUSHES.items()}


def check_version(header: FrameHeader) -> None:
    versions = SUPPORTED_VERSIONS.get(header.api_key)
    if versions is None:
        raise UnsupportedApi(f"unknown api key {header.api_key}")
    low, high = versions
    if not low <= header.api_version <= high:
        raise UnsupportedVersion(
            f"api key {header.api_key} version {header.api_version} not supported "
            f"(supported: {low}..{high})"
        )


def encode_request(request: m.Request, correlation_id: int, flags: int = 0) -> bytes:
    return _ENCODE_REQUEST[type(request)](request, correlation_id, flags)


def decode_request(header: FrameHeader, body: bytes) -> m.Request:
    """Decode a request body; raises a `ProtocolError` subclass on anything invalid."""
    check_version(header)
    return _DECODE_REQUEST[header.api_key][header.api_version](body)


def encode_response(api_key: int, correlation_id: int, response: m.Response) -> bytes:
    return _ENCODE_RESPONSE[api_key](correlation_id, response)


def encode_error(
    api_key: int, api_version: int, correlation_id: int, error: HeadwaterError
) -> bytes:
    text = error.message.encode()[:MAX_ERROR_MESSAGE]
    body = ERROR_HEADER.pack(error.code) + U16.pack(len(text)) + text
    return encode_frame(api_key, api_version, correlation_id, Flags.RESPONSE, body)


def decode_response(header: FrameHeader, body: bytes) -> m.Response:
    """Decode a response body, raising the matching `HeadwaterError` for an error response."""
    if len(body) < ERROR_HEADER.size:
        raise MalformedFrame("response shorter than its error code")
    (code,) = ERROR_HEADER.unpack_from(body, 0)
    if code != 0:
        text = parse(String, body[ERROR_HEADER.size :], "error message")
        raise error_for_code(code, text)
    decode = _DECODE_RESPONSE.get(header.api_key)
    if decode is None:
        raise UnsupportedApi(f"response for unknown api key {header.api_key}")
    return decode(body[ERROR_HEADER.size :])


def encode_push(consumer_id: int, push: m.Push) -> bytes:
    api_key = PUSH_API_KEYS[type(push)]
    return encode_frame(api_key, 0, consumer_id, Flags.PUSH, build(PUSH_SCHEMAS[api_key], push))


def decode_push(header: FrameHeader, body: bytes) -> m.Push:
    decode = _DECODE_PUSH.get(header.api_key)
    if decode is None:
        raise UnsupportedApi(f"unknown pushed api key {header.api_key}")
    return decode(body)
