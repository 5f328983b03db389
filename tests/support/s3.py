"""moto's standalone S3 server (`python -m moto.server`) on 127.0.0.1, as a child process.

One instance serves every S3 test. A real process, so `stop` really drops every connection (a
server thread inside the test process kept keep-alive connections open after stopping). moto
keeps its state in memory: after `stop` and `start`, buckets must be created again.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

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
    def __init__(self) -> None:
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **CREDENTIALS},
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if self._process.poll() is not None:
                    raise RuntimeError("moto server exited at start") from None
                time.sleep(0.05)
        raise RuntimeError(f"moto server did not listen in {timeout}s")

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(10)
            self._process = None


async def create_bucket(s3: MotoS3, name: str) -> None:
    from aiobotocore.session import get_session

    async with get_session().create_client(
        "s3", endpoint_url=s3.endpoint_url, region_name="us-east-1"
    ) as client:
        await client.create_bucket(Bucket=name)


def moto_s3() -> Iterator[MotoS3]:
    server = MotoS3()
    server.start()
    yield server
    server.stop()
