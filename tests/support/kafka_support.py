"""A real server with its Kafka listener on (`--kafka-port 0`), and a raw Kafka peer.

`KafkaServer.start` waits for the native port file (written after the Kafka port file), so both
ports are known once it returns; `kill` and `start` again reuse the data directory (a restart),
and with `same_port` the Kafka port the first start got, so clients ride through the restart.
`RawKafka` speaks the Kafka framing over a blocking socket, for requests no stock client sends
(unserved versions, hostile frames); `odd_requests` sends a round of well-formed requests with odd
values (nulls, empty and huge names, extreme numbers) through one.
"""

from __future__ import annotations

import random
import socket
import struct
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from headwater.server.kafka import codec
from headwater.server.kafka.topic_ids import topic_id
from headwater.testing import ServerProcess


class KafkaServer:
    def __init__(self, data_dir: Path, same_port: bool = False, config: str = "") -> None:
        """`config`: a headwater.toml's text for the server (the flags below override it)."""
        self.kafka_port_file = data_dir.parent / f"{data_dir.name}.kafka-port"
        self.http_port_file = data_dir.parent / f"{data_dir.name}.http-port"
        extra: tuple[str, ...] = ()
        if config:
            path = data_dir.parent / f"{data_dir.name}.toml"
            path.write_text(config)
            extra = ("--config", str(path))
        self.process = ServerProcess(
            data_dir,
            extra_args=(
                *extra,
                "--kafka-port", "0", "--kafka-port-file", str(self.kafka_port_file),
                "--http-port", "0", "--http-port-file", str(self.http_port_file),
            ),
        )  # fmt: skip
        self.kafka_port = 0
        self.same_port = same_port

    def start(self) -> KafkaServer:
        self.kafka_port_file.unlink(missing_ok=True)
        if self.same_port and self.kafka_port:
            args = list(self.process.extra_args)
            args[args.index("--kafka-port") + 1] = str(self.kafka_port)
            self.process.extra_args = tuple(args)
        self.process.start()
        self.kafka_port = int(self.kafka_port_file.read_text())
        return self

    def metrics(self) -> str:
        """The operator port's /metrics text."""
        port = int(self.http_port_file.read_text())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            return str(answer.read().decode())

    @property
    def address(self) -> str:
        return self.process.address

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    def alive(self) -> bool:
        return self.process.alive()

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        if self.process.alive():
            self.process.stop()


class RawKafka:
    """Blocking Kafka frames: `request` sends a header v1 and a body, `response` reads one frame
    and returns (correlation id, the rest)."""

    def __init__(self, port: int, timeout: float = 10.0, source: str | None = None) -> None:
        """`source`: the local address to connect from (127.0.0.2 and so on, for the caps per
        address)."""
        local = None if source is None else (source, 0)
        self.sock = socket.create_connection(
            ("127.0.0.1", port), timeout=timeout, source_address=local
        )

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, api_key: int, version: int, correlation: int, body: bytes = b"") -> None:
        client = b"raw"
        header = struct.pack(">hhih", api_key, version, correlation, len(client)) + client
        self.send_raw(struct.pack(">i", len(header) + len(body)) + header + body)

    def response(self) -> tuple[int, bytes]:
        size = struct.unpack(">i", self._exactly(4))[0]
        frame = self._exactly(size)
        return struct.unpack_from(">i", frame)[0], frame[4:]

    def closed(self) -> bool:
        """Whether the server closed the connection (EOF before any byte)."""
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True

    def _exactly(self, size: int) -> bytes:
        out = bytearray()
        while len(out) < size:
            chunk = self.sock.recv(size - len(out))
            if not chunk:
                raise ConnectionError(f"closed after {len(out)} of {size} bytes")
            out += chunk
        return bytes(out)

    def close(self) -> None:
        self.sock.close()


def random_value(rng: random.Random, field: Any, version: int) -> object:
    """A value of a Kafka message field (`server.kafka.messages`, a struct class for a whole
    message): what a confused but well-formed client might send, a null where any may be."""
    if isinstance(field, type):
        return field(
            *(random_value(rng, f, version) if f.within(version) else None for f in field.FIELDS)
        )
    kind = field.type
    if field.array:
        if rng.random() < 0.1:
            return None
        element = kind if isinstance(kind, type) else replace(field, array=False)
        return [random_value(rng, element, version) for _ in range(rng.randint(0, 3))]
    if isinstance(kind, type):
        return random_value(rng, kind, version)
    if kind == "string":
        return rng.choice([None, "", "t", "never-read", "x" * 300, "grp"])
    if kind in ("bytes", "records"):
        return rng.choice([None, b"", bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 80)))])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "float64":
        return rng.random()
    if kind == "uint16":
        return rng.choice([0, 1, 3, 2**16 - 1])
    if kind == "uuid":  # a topic id: none, a random one, or topic "t"'s
        return rng.choice([bytes(16), rng.randbytes(16), topic_id("t")])
    bits = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}[kind]
    return rng.choice([-1, 0, 1, 3, 2 ** (bits - 1) - 1, -(2 ** (bits - 1))])


def odd_requests(
    port: int, rng: random.Random, apis: list[Any], round_: int, count: int = 10
) -> None:
    """`count` requests of `apis` (served API descriptions, `server.kafka.apis.SERVED`) at random
    versions with random values, pipelined on one connection, then their answers read. Short
    timeouts: an acks=0 produce gets no answer, a Fetch may long-poll up to 20 s."""
    raw = RawKafka(port, timeout=1)
    try:
        sent = 0
        for i in range(count):
            api = rng.choice(apis)
            version = rng.randint(api.min_version, api.max_version)
            layout = api.requests[version]
            body = codec.encode(layout, random_value(rng, layout.message, version))
            header = struct.pack(">hhih", api.key, version, round_ * count + i, 0)
            if api.flexible(version):
                header += b"\x00"  # request header v2: no tagged fields
            try:
                raw.send_raw(struct.pack(">i", len(header) + len(body)) + header + body)
            except OSError:  # closed after an earlier request of this round
                break
            sent += 1
        for _ in range(sent):
            try:
                raw.response()
            except (ConnectionError, TimeoutError, OSError):
                break  # acks=0 produces get no answer; a refusal may close
    finally:
        raw.close()
