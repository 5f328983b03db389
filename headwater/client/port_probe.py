"""What kind of port a server closed on us without a word: a TLS port (the client did not use
TLS) or a Kafka listener. Both close a plaintext Headwater connection before answering anything,
so the connection's first bytes cannot tell them apart; `silent_port` asks the port itself, with
a TLS handshake (verifying nothing: only whether the other side speaks TLS) and then a Kafka
ApiVersions request. `headwater` uses it to say which flag or port to use (issue 41).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct

from headwater.client.broker_connection import parse_server

# a Kafka ApiVersions v0 request: size, api key 18, version 0, correlation id, null client id
_KAFKA_CORRELATION = 0x68770041
_KAFKA_BODY = struct.pack(">hhih", 18, 0, _KAFKA_CORRELATION, -1)
_KAFKA_PROBE = struct.pack(">i", len(_KAFKA_BODY)) + _KAFKA_BODY


async def _speaks_tls(host: str, port: int, timeout: float) -> bool:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(host, port, ssl=context)
    except ssl.SSLError as exc:
        # an alert is TLS answering (a client certificate required, say); a record that is not
        # TLS is "wrong version number" or the like
        return "ALERT" in str(exc).upper()
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError):
        await writer.wait_closed()
    return True


async def _speaks_kafka(host: str, port: int, timeout: float) -> bool:
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(_KAFKA_PROBE)
                head = await reader.readexactly(8)
            finally:
                writer.close()
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return False
    correlation: int = struct.unpack(">ii", head)[1]
    return correlation == _KAFKA_CORRELATION


async def silent_port(server: str, timeout: float = 3.0) -> str | None:
    """What to tell a user whose plaintext Headwater connection to `server` was closed before
    any answer: "tls", "kafka", or None when the port is neither."""
    try:
        host, port = parse_server(server)
    except ValueError:
        return None
    if await _speaks_tls(host, port, timeout):
        return "tls"
    if await _speaks_kafka(host, port, timeout):
        return "kafka"
    return None
