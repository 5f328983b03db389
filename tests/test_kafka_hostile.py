"""The Kafka listener against requests no stock client sends: an API or version it does not serve
is answered UNSUPPORTED_VERSION on a connection that stays usable; random, mutated, truncated,
oversized frames and huge array counts get an answer or a close, and the server goes on
answering other clients on both ports."""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Iterator

import pytest
from aiokafka.protocol.fetch import FetchRequest_v4

from headwater.client.blocking import BlockingClient
from headwater.server.kafka.apis import SERVED
from headwater.wire import messages as m
from tests.support.kafka_support import KafkaServer, RawKafka, odd_requests

UNSUPPORTED_VERSION = 35


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    server = KafkaServer(tmp_path_factory.mktemp("kafka-hostile") / "data").start()
    yield server
    server.stop()


def _framed(request: bytes) -> bytes:
    return struct.pack(">i", len(request)) + request


def _api_versions(raw: RawKafka, correlation: int) -> list[tuple[int, int, int]]:
    raw.request(18, 0, correlation)
    got, body = raw.response()
    assert got == correlation
    error, count = struct.unpack_from(">hi", body)
    assert error == 0
    return [struct.unpack_from(">hhh", body, 6 + 6 * i) for i in range(count)]


def _still_serving(kafka: KafkaServer) -> None:
    """Another client is answered on the Kafka port at once, and on the native port."""
    raw = RawKafka(kafka.kafka_port)
    try:
        started = time.monotonic()
        assert (18, 0, 3) in _api_versions(raw, 77)
        assert time.monotonic() - started < 1.0
    finally:
        raw.close()
    with BlockingClient(kafka.address) as client:
        assert isinstance(client.request(m.ListTopicsRequest()), m.ListTopicsResponse)
    assert kafka.alive()


def test_an_api_not_served_is_unsupported_version_and_the_connection_stays(
    kafka: KafkaServer,
) -> None:
    raw = RawKafka(kafka.kafka_port)
    try:
        raw.request(60, 0, 5, b"\x00\x00")  # DescribeCluster: not served
        assert raw.response() == (5, struct.pack(">h", UNSUPPORTED_VERSION))
        raw.request(0, 2, 6, bytes(20))  # Produce v2: message sets, below the versions served
        assert raw.response() == (6, struct.pack(">h", UNSUPPORTED_VERSION))
        versions = _api_versions(raw, 7)  # same connection, still in step
        assert versions == [(a.key, a.min_version, a.max_version) for a in SERVED.values()]
    finally:
        raw.close()


def test_api_versions_past_those_served_answers_in_v0_layout_with_the_versions(
    kafka: KafkaServer,
) -> None:
    raw = RawKafka(kafka.kafka_port)
    try:
        raw.request(18, 9, 11, b"\x00\x00\x00")  # a future ApiVersions: body unknown
        correlation, body = raw.response()
        assert correlation == 11
        error, count = struct.unpack_from(">hi", body)
        assert error == UNSUPPORTED_VERSION
        listed = [struct.unpack_from(">hhh", body, 6 + 6 * i) for i in range(count)]
        assert (18, 0, 3) in listed
    finally:
        raw.close()


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">i", 200 * 1024 * 1024),  # oversized: refused from the prefix alone
        struct.pack(">i", -5),
        struct.pack(">i", 3) + b"abc",  # shorter than a header
        # Metadata v1 announcing 2^31-1 topics
        _framed(struct.pack(">hhih", 3, 1, 1, 3) + b"raw" + struct.pack(">i", 2**31 - 1)),
        # Produce v3, one topic, 2^31-1 partitions
        _framed(
            struct.pack(">hhih", 0, 3, 1, 0)
            + struct.pack(">hhii", -1, -1, 1000, 1)
            + b"\x00\x01t"
            + struct.pack(">i", 2**31 - 1)
        ),
        # a body with bytes after its last field
        _framed(struct.pack(">hhih", 3, 1, 1, 0) + struct.pack(">i", -1) + b"!"),
    ],
)
def test_a_hostile_frame_closes_its_connection_only(kafka: KafkaServer, frame: bytes) -> None:
    raw = RawKafka(kafka.kafka_port)
    try:
        raw.send_raw(frame)
        assert raw.closed()
    finally:
        raw.close()
    _still_serving(kafka)


def test_a_truncated_frame_and_a_vanishing_client_cost_nothing(kafka: KafkaServer) -> None:
    raw = RawKafka(kafka.kafka_port)
    raw.send_raw(struct.pack(">i", 100) + bytes(50))
    raw.close()
    _still_serving(kafka)


def test_random_and_mutated_frames(kafka: KafkaServer) -> None:
    """300 frames of served API keys and versions with random or mutated bodies, each on one of
    a few connections: every one answered or its connection closed, the server up after."""
    rng = random.Random(23)
    valid = struct.pack(">hhih", 3, 1, 0, 3) + b"raw" + struct.pack(">i", 1) + b"\x00\x01t"
    for round_ in range(30):
        raw = RawKafka(kafka.kafka_port, timeout=5)
        try:
            for i in range(10):
                api = rng.choice(list(SERVED.values()))
                version = rng.randint(api.min_version, api.max_version)
                if rng.random() < 0.5:
                    body = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 200)))
                else:
                    mutated = bytearray(valid)
                    for _ in range(rng.randint(1, 4)):
                        mutated[rng.randrange(8, len(mutated))] = rng.getrandbits(8)
                    body = bytes(mutated[8:])
                header = struct.pack(">hhi", api.key, version, round_ * 10 + i)
                try:
                    raw.send_raw(struct.pack(">i", len(header) + len(body)) + header + body)
                except OSError:  # closed for an earlier frame of this round
                    break
            raw.sock.settimeout(5)
            try:
                while True:  # answers until the server closes (or has answered everything)
                    raw.response()
            except (ConnectionError, TimeoutError, OSError):
                pass
        finally:
            raw.close()
    _still_serving(kafka)


def test_a_client_that_never_reads_costs_another_client_nothing(kafka: KafkaServer) -> None:
    """One connection pipelines 2,000 Fetches of 1 MiB answers and reads none: the server stops
    reading it (64 in flight, the write buffer's bound) and another client's requests are
    answered at once meanwhile (p99 under 50 ms)."""
    with BlockingClient(kafka.address) as client:
        client.create_topic("never-read", partitions=1)
        for _ in range(8):  # 8 batches of 512 KiB
            client.produce("never-read", [(None, bytes(1024), ())] * 512, partition=0)
    hog = RawKafka(kafka.kafka_port)
    try:
        fetch = FetchRequest_v4(-1, 0, 0, 8 << 20, 0, [("never-read", [(0, 0, 1 << 20)])]).encode()
        hog.sock.setblocking(False)
        sent = 0
        for correlation in range(2000):
            header = struct.pack(">hhih", 1, 4, correlation, 0)
            frame = struct.pack(">i", len(header) + len(fetch)) + header + fetch
            try:
                hog.sock.send(frame)
                sent += 1
            except BlockingIOError:
                break  # the server stopped reading it: its socket buffers are full
        latencies = []
        other = RawKafka(kafka.kafka_port)
        try:
            for i in range(200):
                started = time.perf_counter()
                other.request(18, 0, i)
                assert other.response()[0] == i
                latencies.append(time.perf_counter() - started)
        finally:
            other.close()
        latencies.sort()
        assert latencies[int(len(latencies) * 0.99)] < 0.05, latencies[-5:]
        assert sent > 64  # it did pipeline past the in-flight bound
    finally:
        hog.close()
    _still_serving(kafka)


def test_the_kafka_listener_counts_in_metrics(kafka: KafkaServer) -> None:
    bad = RawKafka(kafka.kafka_port)
    bad.send_raw(struct.pack(">i", -5))
    assert bad.closed()
    bad.close()
    raw = RawKafka(kafka.kafka_port)
    try:
        _api_versions(raw, 1)
        raw.request(60, 0, 2, b"\x00\x00")  # not served
        raw.response()
        metrics = kafka.metrics()
    finally:
        raw.close()
    counted = {
        line.split()[0]: float(line.split()[1])
        for line in metrics.splitlines()
        if line.startswith("headwater_kafka_")
    }
    assert counted['headwater_kafka_requests_total{api="ApiVersions"}'] >= 1
    assert counted["headwater_kafka_unsupported_requests_total"] >= 1
    assert counted["headwater_kafka_connections"] >= 1
    assert counted["headwater_kafka_protocol_errors_total"] >= 1
    assert counted["headwater_kafka_refused_connections_total"] == 0  # no auth: none capped


@pytest.mark.parametrize("seed", [2323, 7, 1979])
def test_well_formed_requests_with_odd_values_never_break_a_handler(
    kafka: KafkaServer, seed: int
) -> None:
    """400 requests that decode (every served API and version, random values: nulls, empty and
    huge names, negative and extreme numbers): each is answered or refused by Kafka's rules,
    and the server never logs a handler failure (an exception the handlers did not expect)."""
    rng = random.Random(seed)
    apis = [a for a in SERVED.values() if a.key not in (17, 36)]
    for round_ in range(40):
        odd_requests(kafka.kafka_port, rng, apis, round_)
    _still_serving(kafka)
    assert "kafka.handler_failed" not in kafka.process.log()
