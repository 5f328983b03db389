"""moto's standalone S3 server on 127.0.0.1, in a thread of the test process, for the suite."""

from __future__ import annotations

import socket
from collections.abc import Iterator

from moto.server import ThreadedMotoServer

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class MotoS3:
    """Start, stop and start again on the same port; buckets survive (same process)."""

    def __init__(self) -> None:
        self.port = free_port()
        self._server: ThreadedMotoServer | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


def moto_s3() -> Iterator[MotoS3]:
    server = MotoS3()
    server.start()
    yield server
    server.stop()
