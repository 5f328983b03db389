"""The operator's HTTP port: /metrics (parsed with prometheus_client's own parser), /healthz,
/readyz, and hostile HTTP clients. Real servers in child processes, real traffic."""

from __future__ import annotations

import asyncio
import http.client
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import headwater
from headwater.testing import ServerProcess

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def start_with_http(
    directory: Path, extra: tuple[str, ...] = (), via_config: str | None = None
) -> tuple[ServerProcess, int]:
    """A server with its HTTP port (from the flags, or from a TOML file's `[server]` table)."""
    port_file = directory / "http.port"
    if via_config is None:
        args = ("--http-port", "0", "--http-port-file", str(port_file), *extra)
    else:
        config = directory / "headwater.toml"
        config.write_text(
            f'[server]\nhttp_port = 0\nhttp_port_file = "{port_file}"\n{via_config}\n'
        )
        args = ("--config", str(config), *extra)
    process = ServerProcess(directory / "data", extra_args=args).start()
    return process, int(port_file.read_text())


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, int]]:
    process, port = start_with_http(tmp_path_factory.mktemp("metrics"))
    yield process, port
    process.kill()


def get(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def scrape(port: int) -> Samples:
    status, headers, body = get(port, "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=")
    samples: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def wait_for_metric(
    port: int, name: str, labels: dict[str, str], check: Callable[[float], bool]
) -> float:
    """Scrape until the metric satisfies `check` (bounded: 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        samples = await asyncio.to_thread(scrape, port)
        found = samples.get((name, tuple(sorted(labels.items()))))
        if found is not None and check(found):
            return found
        assert time.monotonic() < deadline, f"{name}{labels} stayed at {found}"
        await asyncio.sleep(0.05)


async def test_counters_move_with_traffic(
    http_server: tuple[ServerProcess, int], topic_name: str
) -> None:
    server, port = http_server
    topic = {"topic": topic_name}
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic_name, partitions=2, dispatch="reliable")
        consumer = await client.subscribe(topic_name, "metered", start="earliest")
        producer = client.producer(topic_name)
        before = await asyncio.to_thread(scrape, port)
        for round_ in range(2):
            for i in range(300):
                await producer.send(f"m{round_}-{i}".encode(), partition=i % 2)
            await producer.flush()
            for _ in range(300):
                message = await consumer.receive(timeout=30)
                await message.ack()
            after = await asyncio.to_thread(scrape, port)
            assert value(after, "headwater_topic_messages_in_total", **topic) == 300 * (round_ + 1)
            for name in (
                "headwater_topic_bytes_in_total",
                "headwater_topic_messages_out_total",
                "headwater_topic_bytes_out_total",
                "headwater_topic_wal_appends_total",
                "headwater_topic_end_to_end_latency_seconds_count",
            ):
                old = before.get((name, tuple(topic.items())), 0.0)
                assert value(after, name, **topic) > old, name
            for name in (
                "headwater_wal_fsyncs_total",
                "headwater_wal_fsync_seconds_count",
                "headwater_produce_latency_seconds_count",
            ):
                assert value(after, name) > value(before, name), name
            before = after
        assert value(after, "headwater_topic_messages_out_total", **topic) >= 600
        assert value(after, "headwater_wal_fsync_seconds_count") == value(
            after, "headwater_wal_fsyncs_total"
        )
        latency = value(after, "headwater_topic_end_to_end_latency_seconds_sum", **topic)
        count = value(after, "headwater_topic_end_to_end_latency_seconds_count", **topic)
        assert 0 <= latency / count < 5  # a local round trip, not clock garbage
        inf = value(after, "headwater_topic_end_to_end_latency_seconds_bucket", le="+Inf", **topic)
        assert inf == count
        assert value(after, "headwater_connections") >= 2  # the client and its producer
        labels = {**topic, "subscription": "metered", "type": "exclusive"}
        assert value(after, "headwater_subscription_delivered_total", **labels) == 600
        assert value(after, "headwater_subscription_consumers", **labels) == 1
        assert value(after, "headwater_topic_partitions", dispatch="reliable", **topic) == 2
        await consumer.close()


async def test_redeliveries_and_dead_letters_are_counted(
    http_server: tuple[ServerProcess, int], topic_name: str
) -> None:
    server, port = http_server
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic_name, dispatch="reliable")
        retried = await client.subscribe(topic_name, "retried", start="earliest")
        doomed = await client.subscribe(
            topic_name, "doomed", start="earliest", max_deliveries=1, backoff_initial=0.01
        )
        await client.producer(topic_name).send(b"once")
        first = await retried.receive(timeout=30)
        await first.nack(delay=0)
        again = await retried.receive(timeout=30)
        assert again.delivery_count == 2
        await again.ack()
        await (await doomed.receive(timeout=30)).nack(delay=0)
        common = {"topic": topic_name, "type": "exclusive"}
        await wait_for_metric(
            port, "headwater_subscription_redelivered_total",
            {**common, "subscription": "retried"}, lambda v: v == 1,
        )  # fmt: skip
        await wait_for_metric(
            port, "headwater_subscription_dead_lettered_total",
            {**common, "subscription": "doomed"}, lambda v: v == 1,
        )  # fmt: skip


async def test_lag_rises_while_a_consumer_is_stopped_and_falls_when_it_catches_up(
    http_server: tuple[ServerProcess, int], topic_name: str
) -> None:
    server, port = http_server
    labels = {"topic": topic_name, "subscription": "lagger", "type": "exclusive"}
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic_name, partitions=3, dispatch="reliable")
        consumer = await client.subscribe(topic_name, "lagger", start="earliest")
        producer = client.producer(topic_name)
        for i in range(90):
            await producer.send(b"%d" % i, partition=i % 3)
        await producer.flush()
        for _ in range(90):
            await (await consumer.receive(timeout=30)).ack()
        await wait_for_metric(port, "headwater_subscription_lag_messages", labels, lambda v: v == 0)
        await consumer.close()  # stopped: the reliable subscription stays and falls behind

        for i in range(300):
            await producer.send(b"%d" % i, partition=i % 3)
        await producer.flush()
        await wait_for_metric(
            port, "headwater_subscription_lag_messages", labels, lambda v: v == 300
        )
        await wait_for_metric(
            port, "headwater_subscription_backlog_messages", labels, lambda v: v == 300
        )
        assert value(await asyncio.to_thread(scrape, port), "headwater_subscription_consumers",
                     **labels) == 0  # fmt: skip

        consumer = await client.subscribe(topic_name, "lagger")
        for _ in range(300):
            await (await consumer.receive(timeout=30)).ack()
        await wait_for_metric(port, "headwater_subscription_lag_messages", labels, lambda v: v == 0)
        await wait_for_metric(
            port, "headwater_subscription_unacked_messages", labels, lambda v: v == 0
        )
        await consumer.close()


async def test_dropped_messages_and_toml_http_port(tmp_path: Path, topic_name: str) -> None:
    """http_port from the TOML file; a non-reliable consumer that takes nothing costs drops."""
    server, port = start_with_http(tmp_path, via_config="subscription_backlog = 10")
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic(topic_name, dispatch="non-reliable")
            slow = await client.subscribe(topic_name, "slow", prefetch=1, on_dropped=lambda n: None)
            producer = client.producer(topic_name)
            for i in range(100):  # one batch each: a batch is kept or dropped whole
                await (await producer.send(b"%d" % i))
            labels = {"topic": topic_name, "subscription": "slow", "type": "exclusive"}
            dropped = await wait_for_metric(
                port, "headwater_subscription_dropped_total", labels, lambda v: v > 0
            )
            samples = await asyncio.to_thread(scrape, port)
            delivered = value(samples, "headwater_subscription_delivered_total", **labels)
            backlog = value(samples, "headwater_subscription_backlog_messages", **labels)
            assert (delivered, backlog, dropped) == (1, 10, 89)
            await slow.close()
    finally:
        server.kill()


async def test_uploads_are_reported(tmp_path: Path, topic_name: str) -> None:
    server, port = start_with_http(tmp_path)
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic(
                topic_name, dispatch="reliable", configs={"segment.bytes": 1024}
            )
            producer = client.producer(topic_name)
            for i in range(50):
                await (await producer.send(b"x" * 200 + b"%d" % i))
            topic = {"topic": topic_name}
            await wait_for_metric(port, "headwater_uploaded_segments", topic, lambda v: v >= 3)
            samples = await asyncio.to_thread(scrape, port)
            assert value(samples, "headwater_uploaded_bytes", **topic) > 3000
            assert value(samples, "headwater_upload_failures_total") == 0
            assert value(samples, "headwater_upload_lag_messages", **topic) < 50
            assert ("headwater_uploads_pending", ()) in samples
    finally:
        server.kill()


def test_what_start_up_built_is_frozen_out_of_the_collector(
    http_server: tuple[ServerProcess, int],
) -> None:
    """The modules and the recovered catalog are frozen once start-up is done, so a full
    collection while serving walks only what serving made: unfrozen, a generation-2 collection
    held the loop 17-30 ms and made the p99 of the 100k msgs/s latency row (BENCHMARKS.md)."""
    _, port = http_server
    assert value(scrape(port), "headwater_gc_frozen_objects") > 10_000


def test_health_and_readiness(tmp_path: Path) -> None:
    server, port = start_with_http(tmp_path)
    try:
        assert get(port, "/healthz")[:3:2] == (200, b"ok\n")
        assert get(port, "/readyz")[:3:2] == (200, b"ready\n")
        # A probe that cannot be written (a directory in its place): not ready, and says why.
        probe = server.data_dir / ".readyz-probe"
        probe.mkdir()
        deadline = time.monotonic() + 10
        while (answer := get(port, "/readyz"))[0] != 503:
            assert time.monotonic() < deadline, answer
            time.sleep(0.1)
        assert b"not ready: the data directory is not writable" in answer[2]
        assert get(port, "/healthz")[0] == 200  # up, just not ready
        probe.rmdir()
        deadline = time.monotonic() + 10
        while (answer := get(port, "/readyz"))[0] != 200:
            assert time.monotonic() < deadline, answer
            time.sleep(0.1)
        assert get(port, "/readyz", method="HEAD")[:3:2] == (200, b"")
        assert server.stop() == 0  # a graceful stop closes the HTTP port with the rest
        assert "Traceback" not in server.log()
        with pytest.raises(OSError):
            get(port, "/healthz")
    finally:
        server.kill()


def test_http_port_in_use_fails_start_up(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        server = ServerProcess(tmp_path / "data", extra_args=("--http-port", str(busy)))
        with pytest.raises(RuntimeError, match="exited with 1"):
            server.start()
        assert f"cannot listen for HTTP on 127.0.0.1:{busy}" in server.log()
        assert "Traceback" not in server.log()


def raw(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send `data`, then read until the server closes (bounded by `timeout`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except OSError:  # the server may close before taking everything in: that is allowed
            return b""
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
        return b"".join(chunks)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"\x00\xff garbage\r\n\r\n", b"400"),
        (b"GET\r\n\r\n", b"400"),
        (b"GET nothing HTTP/1.1\r\n\r\n", b"400"),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", b"405"),
        (b"GET / HTTP/2.0\r\n\r\n", b"505"),
        (b"GET /nope HTTP/1.1\r\n\r\n", b"404"),
        (b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 6000 + b"\r\n\r\n", b"200"),
    ],
)
def test_bad_http_requests_get_an_error(
    http_server: tuple[ServerProcess, int], request_bytes: bytes, status: bytes
) -> None:
    server, port = http_server
    answer = raw(port, request_bytes)
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
    assert b"Traceback" not in answer
    assert "Traceback" not in server.log()


def test_huge_request_head_is_refused(http_server: tuple[ServerProcess, int]) -> None:
    _, port = http_server
    answer = raw(port, b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
    # 431, or a reset if the server closed with our bytes still unread: never a hang
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431"), answer[:200]


async def test_slow_http_clients_are_cut_off_and_do_not_stall_anything(
    http_server: tuple[ServerProcess, int], topic_name: str
) -> None:
    server, port = http_server
    # 100 slowloris connections, each with half a request head, more than the HTTP port keeps
    slow = []
    for _ in range(100):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        slow.append(writer)
    await asyncio.gather(*(w.drain() for w in slow))
    started = time.monotonic()
    # The message port is not stalled: a round trip through a topic works at once...
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic_name, dispatch="non-reliable")
        consumer = await client.subscribe(topic_name, "s")
        await client.producer(topic_name).send(b"through")
        assert (await consumer.receive(timeout=30)).value == b"through"
    assert time.monotonic() - started < 3
    # ... nor is the HTTP port: the oldest unfinished connections make room for new ones
    status, _, body = await asyncio.to_thread(get, port, "/healthz")
    assert (status, body) == (200, b"ok\n")
    # and every slow connection is closed by the server (408 or aborted), none kept forever
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\n")
    answer = await asyncio.wait_for(reader.read(), 10)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    writer.close()
    for w in slow:
        w.close()
    assert "Traceback" not in server.log()
