"""The Kafka port's bounds (issue 37), through real TCP to a real server: a Fetch reads no further
than its `max_bytes` (the first partition with data whole, KIP-74) and each partition it names
once; a connection's buffered answers are charged to its principal's memory share and it is not
read past it; a Produce checked against a topic's schema, and an OffsetCommit of 49,000
partitions, do not hold the event loop (the server's own `loop.stalled`, past 50 ms); a principal
over its produce quota is not read for its throttle time.

The machine is shared: another process can deschedule the server for tens of milliseconds at any
time, so a request that shows a stall is sent twice more, and fails only if each shows one (a
request that really holds the loop does so every time), as tests/test_request_cost.py does.
"""

from __future__ import annotations

import contextlib
import json
import re
import struct
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka.protocol.commit import OffsetCommitRequest_v2, OffsetCommitResponse_v2
from aiokafka.protocol.fetch import FetchRequest_v4, FetchResponse_v4
from aiokafka.protocol.produce import ProduceRequest_v3, ProduceResponse_v3

from headwater.client.blocking import BlockingClient
from headwater.server.security.tokens import create
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.records import build_batch
from tests.support.kafka_support import KafkaServer, RawKafka

PRODUCE, FETCH, OFFSET_COMMIT = 0, 1, 8
KIB = 1024


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    server = KafkaServer(tmp_path_factory.mktemp("kafka-bounds") / "data").start()
    yield server
    server.stop()


def _produce(raw: RawKafka, topic: str, partition: int, batch: bytes, correlation: int) -> int:
    """One batch with acks=1; its Kafka error code."""
    raw.request(PRODUCE, 3, correlation, _produce_body(topic, partition, batch))
    got, body = raw.response()
    assert got == correlation
    ((_, ((_, error, _offset, _),)),) = ProduceResponse_v3.decode(body).topics
    return int(error)


def _produce_body(topic: str, partition: int, batch: bytes, acks: int = 1) -> bytes:
    return bytes(ProduceRequest_v3(None, acks, 10_000, [(topic, [(partition, batch)])]).encode())


def _fetch(
    raw: RawKafka, named: list[tuple[str, int, int, int]], max_bytes: int
) -> list[tuple[str, int, int, int, bytes]]:
    """(topic, partition, error, high watermark, records) of each partition answered, in order."""
    order: list[tuple[str, list[tuple[int, int, int]]]] = []
    for topic, partition, offset, limit in named:  # a topic named twice in a row: one entry
        if not order or order[-1][0] != topic:
            order.append((topic, []))
        order[-1][1].append((partition, offset, limit))
    raw.request(FETCH, 4, 41, FetchRequest_v4(-1, 0, 0, max_bytes, 0, order).encode())
    got, body = raw.response()
    assert got == 41
    return [
        (topic, partition, error, high, records or b"")
        for topic, partitions in FetchResponse_v4.decode(body).topics
        for partition, error, high, _stable, _aborted, records in partitions
    ]


def _batch(size: int, count: int = 1) -> bytes:
    return build_batch([(None, bytes(size), ())] * count)


def test_a_fetch_stops_reading_at_max_bytes_and_the_first_partition_is_whole(
    kafka: KafkaServer,
) -> None:
    """Three partitions of 100 KiB, 100 KiB and 1 KiB batches, a response max_bytes of 150 KiB:
    partition 0's batch, then partition 1's does not fit and the answer is full, so partition 2
    is not read (its 1 KiB would have fitted: before, every partition was read and the ones that
    fitted kept) though its high watermark is told. With a max_bytes of 1 KiB the first
    partition's batch comes whole all the same, so a consumer always moves on."""
    with BlockingClient(kafka.address) as client:
        client.create_topic("capped", partitions=3)
    raw = RawKafka(kafka.kafka_port)
    try:
        for partition, size in enumerate((100 * KIB, 100 * KIB, KIB)):
            assert _produce(raw, "capped", partition, _batch(size), partition + 1) == 0
        named = [("capped", p, 0, 1 << 20) for p in range(3)]
        answered = _fetch(raw, named, 150 * KIB)
        assert [(t, p, e, h) for t, p, e, h, _ in answered] == [
            ("capped", p, 0, 1) for p in (0, 1, 2)
        ]
        sizes = [len(records) for *_, records in answered]
        assert sizes[0] > 100 * KIB and sizes[1:] == [0, 0], sizes
        first = _fetch(raw, [("capped", 1, 0, 1 << 20), ("capped", 2, 0, 1 << 20)], KIB)
        assert len(first[0][4]) > 100 * KIB and first[1][4] == b"", [len(a[4]) for a in first]
    finally:
        raw.close()


def test_a_partition_named_twice_in_a_fetch_is_read_and_answered_once(kafka: KafkaServer) -> None:
    """As Kafka's broker keys a Fetch's partitions by topic-partition: one answer per partition,
    in the place it was first named, read from the offset it was named with last. Before, each
    naming was read (up to 50,000 of one 8 MiB partition) and answered."""
    with BlockingClient(kafka.address) as client:
        client.create_topic("twice", partitions=2)
    raw = RawKafka(kafka.kafka_port)
    try:
        for correlation in (1, 2, 3):
            assert _produce(raw, "twice", 0, _batch(KIB), correlation) == 0
        assert _produce(raw, "twice", 1, _batch(KIB), 4) == 0
        named = [("twice", 0, 0, 1 << 20)] * 500 + [
            ("twice", 1, 0, 1 << 20),
            ("twice", 0, 2, 1 << 20),
        ]
        answered = _fetch(raw, named, 1 << 20)
        assert [(t, p, e, h) for t, p, e, h, _ in answered] == [
            ("twice", 0, 0, 3),
            ("twice", 1, 0, 1),
        ]
        (base,) = struct.unpack_from(">q", answered[0][4])
        assert base == 2 and len(answered[0][4]) < 2 * KIB  # from the last naming's offset
    finally:
        raw.close()


def _stalls(process: ServerProcess) -> int:
    return process.log().count("loop.stalled")


def _settle(raw: RawKafka) -> None:
    """Let the loop-lag timer fire (every 10 ms) and its log line land: an ApiVersions answered
    after a pause."""
    time.sleep(0.05)
    raw.request(18, 0, 99)
    assert raw.response()[0] == 99


def _no_stall(process: ServerProcess, raw: RawKafka, send: Callable[[], None]) -> None:
    """Run `send` (which asserts its answer) until it causes no stall, at most three times."""
    for _ in range(3):
        _settle(raw)
        before = _stalls(process)
        send()
        _settle(raw)
        if _stalls(process) == before:
            return
    raise AssertionError("the request held the event loop past 50 ms three times out of three")


def test_an_offset_commit_of_49000_partitions_does_not_stall_the_loop(kafka: KafkaServer) -> None:
    """49 topics of 1,000 partitions (the topic exists: partitions past its one are refused one
    by one): decoded on the thread (about 110 ms of the loop before), handled a thousand
    partitions between yields, the answer of 49,000 encoded on the thread (about 80 ms)."""
    with BlockingClient(kafka.address) as client:
        client.create_topic("committed")
    topics = [
        ("committed", [(p, 0, "") for p in range(t * 1000, t * 1000 + 1000)]) for t in range(49)
    ]
    body = OffsetCommitRequest_v2("big-group", -1, "", -1, topics).encode()
    raw = RawKafka(kafka.kafka_port, timeout=60)
    correlations = iter(range(100, 200))

    def send() -> None:
        correlation = next(correlations)
        raw.request(OFFSET_COMMIT, 2, correlation, body)
        got, answer = raw.response()
        assert got == correlation
        answered = OffsetCommitResponse_v2.decode(answer).topics
        codes = [error for _, partitions in answered for _, error in partitions]
        assert len(codes) == 49_000 and codes.count(0) == 1  # partition 0; the rest do not exist

    try:
        _no_stall(kafka.process, raw, send)
    finally:
        raw.close()


def test_a_produce_checked_against_a_schema_does_not_stall_the_loop(kafka: KafkaServer) -> None:
    """2,000 records to a topic with a JSON schema of 50 properties, through the Kafka port:
    checked on the inflater thread, as on the native port (on the loop: about 380 ms)."""
    schema = json.dumps(
        {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(50)}}
    )
    with BlockingClient(kafka.address) as client:
        client.create_topic(
            "schema-checked", configs={"schema.type": "json", "schema.definition": schema}
        )
    value = json.dumps({f"p{i}": i for i in range(10)}).encode()
    batch = build_batch([(None, value, (("hw-schema-version", b"1"),))] * 2000)
    raw = RawKafka(kafka.kafka_port, timeout=60)
    correlations = iter(range(100, 200))
    try:
        _no_stall(
            kafka.process,
            raw,
            lambda: _assert_produced(raw, "schema-checked", batch, next(correlations)),
        )
    finally:
        raw.close()


def _assert_produced(raw: RawKafka, topic: str, batch: bytes, correlation: int) -> None:
    assert _produce(raw, topic, 0, batch, correlation) == 0


# With authentication: the memory share and the produce quota are a principal's


def _secure(root: Path, config: str = "") -> tuple[ServerProcess, Path, str, int]:
    """A server with authentication, its Kafka port and its operator port (`http.port`)."""
    tokens = root / "tokens.json"
    _, admin = create(tokens, "admin", ("all:*",), None, None)
    assert admin is not None
    port_file = root / "kafka.port"
    extra = ("--auth-tokens", str(tokens), "--kafka-port", "0", "--kafka-port-file", str(port_file))
    extra += ("--http-port", "0", "--http-port-file", str(root / "http.port"))
    if config:
        (root / "headwater.toml").write_text(config)
        extra += ("--config", str(root / "headwater.toml"))
    process = ServerProcess(root / "data", extra_args=extra).start()
    return process, tokens, admin, int(port_file.read_text())


def _admin(process: ServerProcess, admin: str) -> BlockingClient:
    client = BlockingClient(process.address)
    assert isinstance(
        client.request(m.AuthenticateRequest("token", admin.encode())), m.AuthenticateResponse
    )
    return client


def _sasl(port: int, token: str) -> RawKafka:
    raw = RawKafka(port, timeout=30)
    raw.request(17, 1, 1, struct.pack(">h", 5) + b"PLAIN")
    assert struct.unpack_from(">h", raw.response()[1])[0] == 0
    credentials = b"\0user\0" + token.encode()
    raw.request(36, 0, 2, struct.pack(">i", len(credentials)) + credentials)
    assert struct.unpack_from(">h", raw.response()[1])[0] == 0
    return raw


def _held(client: BlockingClient, principal: str) -> int:
    info = client.request(m.ServerInfoRequest())
    assert isinstance(info, m.ServerInfoResponse)
    return next((p.used_bytes for p in info.memory_principals if p.principal == principal), 0)


def _until(check: Callable[[], bool], what: str) -> None:
    """Poll `check` (a server-side state reached by the requests already sent), up to 20 s."""
    deadline = time.monotonic() + 20
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_kafka_connection_charges_its_unread_answers_to_its_principal_and_is_held(
    tmp_path: Path,
) -> None:
    """A client that pipelines Fetches of 1 MiB answers and reads none: what the connection holds
    for it is charged to its principal (SERVER_INFO shows it; before, a Kafka connection charged
    nothing), past the principal's 2 MiB share it is not read (a Fetch sent then is not
    handled, while another principal is served), and the charge goes back when it closes."""
    process, tokens, admin_token, port = _secure(
        tmp_path, f"[server]\nmemory_max_bytes_per_principal = {2 << 20}\n"
    )
    try:
        _, token = create(tokens, "reader", ("consume:big",), None, None)
        assert token is not None
        with _admin(process, admin_token) as admin:
            admin.create_topic("big")
            admin.produce("big", [(None, bytes((1 << 20) - 4 * KIB), ())], partition=0)
            reader = _sasl(port, token)
            fetch = FetchRequest_v4(-1, 0, 0, 1 << 20, 0, [("big", [(0, 0, 1 << 20)])]).encode()
            for correlation in range(10, 18):
                reader.request(FETCH, 4, correlation, fetch)
            _until(lambda: _held(admin, "reader") > 2 << 20, "the reader's answers are not charged")
            handled = _fetches(tmp_path, admin_token)
            reader.request(FETCH, 4, 99, fetch)  # sent while the principal is over its share
            other = _sasl(port, admin_token)  # another principal's connection is served meanwhile
            other.request(FETCH, 4, 5, fetch)
            assert other.response()[0] == 5
            other.close()
            assert _fetches(tmp_path, admin_token) == handled + 1  # the other's, not the reader's
            reader.close()
            _until(lambda: _held(admin, "reader") == 0, "the charge stayed after the close")
    finally:
        process.kill()


def _fetches(root: Path, token: str) -> int:
    """Kafka Fetch requests the server has begun to handle (its /metrics counter)."""
    port = int((root / "http.port").read_text())
    scrape = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(scrape, timeout=10) as answer:
        text = answer.read().decode()
    found = re.search(r'^headwater_kafka_requests_total\{api="Fetch"\} ([0-9.e+]+)$', text, re.M)
    return 0 if found is None else int(float(found.group(1)))


def test_a_principal_over_its_produce_quota_is_not_read_for_its_throttle_time(
    tmp_path: Path,
) -> None:
    """A principal limited to 100 kB/s that ignores throttling pipelines 40 Produces of 100 kB:
    the server reads one past the burst, then nothing until the debt is paid (the connection is
    muted, as Kafka mutes a throttled channel), so when the second answer comes (after its 1 s
    throttle) at most a few batches are in the topic, where a fixed server would need 38 s to
    take all 40. Before, every request was read and appended at once and only the answers
    waited (34.6 MB read in 10 s)."""
    process, tokens, admin_token, port = _secure(tmp_path)
    try:
        _, token = create(
            tokens, "greedy", ("produce:quota",), None, {"produce_bytes_per_second": 100_000}
        )
        assert token is not None
        with _admin(process, admin_token) as admin:
            admin.create_topic("quota")
            producer = _sasl(port, token)
            body = _produce_body("quota", 0, _batch(100_000))
            frames = b"".join(
                struct.pack(">i", len(h) + len(body)) + h + body
                for h in (struct.pack(">hhih", PRODUCE, 3, c, 3) + b"raw" for c in range(40))
            )
            sender = threading.Thread(target=_send_ignoring_close, args=(producer, frames))
            sender.start()
            for correlation in (0, 1):
                got, answer = producer.response()
                assert got == correlation
                ((_, ((_, error, _, _),)),) = ProduceResponse_v3.decode(answer).topics
                assert error == 0
            end = admin.request(m.OffsetForTimeRequest("quota", 0, -1))
            assert isinstance(end, m.OffsetForTimeResponse)
            assert 2 <= end.offset <= 5, end
            producer.close()
            sender.join()
    finally:
        process.kill()


def _send_ignoring_close(raw: RawKafka, data: bytes) -> None:
    """Send all of `data`; the test closes the socket while this still blocks in sendall."""
    with contextlib.suppress(OSError):
        raw.send_raw(data)


def test_fetches_too_big_for_the_loop_are_handled_one_at_a_time_per_connection(
    tmp_path: Path,
) -> None:
    """A body of more than INLINE_ELEMENTS array elements is decoded off the loop and handled
    alone: the connection's later frames wait until it is answered, as Kafka handles one request
    of a connection at a time. Before, a client pipelining Fetches of 10,000 partitions had 64
    of them in progress per connection (each some 20,000 objects for the cyclic collector: a
    second's stall of every client, docs/BENCHMARKS.md)."""
    process, _, admin_token, port = _secure(tmp_path)
    try:
        with _admin(process, admin_token) as admin:
            admin.create_topic("wide", partitions=4)
            # 2,000 namings of the four partitions, at their ends: each Fetch long-polls 20 s
            named = [(p, 0, KIB) for p in range(4)] * 500
            wide = FetchRequest_v4(-1, 20_000, 1, 1 << 20, 0, [("wide", named)]).encode()
            raw = _sasl(port, admin_token)
            before = _fetches(tmp_path, admin_token)
            for correlation in range(10, 13):
                raw.request(FETCH, 4, correlation, wide)
            _until(lambda: _fetches(tmp_path, admin_token) > before, "the first was not handled")
            other = _sasl(port, admin_token)  # answered after every frame read before it
            other.request(FETCH, 4, 5, FetchRequest_v4(-1, 0, 0, KIB, 0, []).encode())
            assert other.response()[0] == 5
            other.close()
            assert _fetches(tmp_path, admin_token) == before + 2  # the first and the other's
            admin.produce("wide", [(None, b"wake", ())], partition=0)  # answers the first
            assert raw.response()[0] == 10
            _until(lambda: _fetches(tmp_path, admin_token) >= before + 3, "the next never came")
            raw.close()
    finally:
        process.kill()
