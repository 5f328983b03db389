"""Failures are visible to clients: a lost connection raises, reconnection resubscribes, refused
at-most-once sends and dropped messages are reported, never a quiet success.

Server deaths use real server processes (kill -9, SIGTERM, SIGSTOP). The MESSAGES_DROPPED tests
use a small fake peer that sends the raw push, standing in for the server side written elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

import pytest

import headwater
from headwater.client.blocking import BlockingClient
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.api.produce import delivery_prefix
from headwater.wire.errors import (
    ConnectionClosed,
    ConnectionLost,
    InvalidRequest,
    RequestTimeout,
    ServerShuttingDown,
    UnknownTopic,
    error_for_code,
)
from headwater.wire.frames import Flags, Frame, FrameDecoder
from headwater.wire.names import check_name, check_topic_name
from headwater.wire.protocol import decode_request, encode_push, encode_response
from headwater.wire.records import build_batch
from tests.support.cli_process import hw, start_consumer, wait_for_consumers

FAST = headwater.ReconnectPolicy(initial_delay=0.05, max_delay=0.5, timeout=30)


def pin_port(server: ServerProcess) -> None:
    """Restart on the same port, as a real server does: the client reconnects to its address."""
    server.extra_args = (*server.extra_args, "--port", str(server.port))


async def until_disconnected(client: headwater.Client) -> None:
    """The client noticed the loss (the test's kill blocked the loop while it happened)."""
    for _ in range(1000):
        if not client.connected:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the client never noticed the lost connection")


def kill_stopped(server: ServerProcess) -> None:
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait(10)


# A lost connection raises


async def test_consumer_raises_connection_lost_when_server_is_killed(
    fresh_server: ServerProcess,
) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("t", dispatch="non-reliable")
        consumer = await client.subscribe("t", "s")
        fresh_server.kill()

        async def iterate() -> None:
            async for _ in consumer:
                pass

        with pytest.raises(ConnectionLost, match="lost"):
            await asyncio.wait_for(iterate(), 10)
        with pytest.raises(ConnectionLost):
            await client.list_topics()


async def test_consumer_raises_on_graceful_shutdown(fresh_server: ServerProcess) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("t", dispatch="reliable")
        consumer = await client.subscribe("t", "s")
        assert fresh_server.stop() == 0
        with pytest.raises((ConnectionLost, ServerShuttingDown)):
            await asyncio.wait_for(consumer.receive(), 10)


async def test_buffered_messages_come_before_the_error(fresh_server: ServerProcess) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        await client.create_topic("t", dispatch="non-reliable")
        consumer = await client.subscribe("t", "s")
        async with client.producer("t") as producer:
            for i in range(3):
                await producer.send(b"%d" % i)
        while consumer._buffered() < 3:  # bounded by the test timeout
            await asyncio.sleep(0.01)
        fresh_server.kill()
        received = []
        with pytest.raises(ConnectionLost):
            async for message in consumer:
                received.append(message.value)
        assert received == [b"0", b"1", b"2"]


async def test_only_a_consumer_the_application_closed_ends_iteration(
    server: ServerProcess, topic_name: str
) -> None:
    async with await headwater.connect(server.address) as client:
        await client.create_topic(topic_name, dispatch="non-reliable")
        consumer = await client.subscribe(topic_name, "s")
        closer = asyncio.get_running_loop().call_later(0.2, asyncio.ensure_future, consumer.close())
        assert [m async for m in consumer] == []  # no error
        closer.cancel()
        other = await client.subscribe(topic_name, "s2")
        await client.delete_topic(topic_name)
        with pytest.raises(UnknownTopic):
            await asyncio.wait_for(anext(other), 10)
    # the client closed by the application: its consumers end quietly too
    client = await headwater.connect(server.address)
    await client.create_topic(topic_name, dispatch="non-reliable")
    consumer = await client.subscribe(topic_name, "s")
    asyncio.get_running_loop().call_later(0.2, asyncio.ensure_future, client.close())
    assert [m async for m in consumer] == []


async def test_pending_request_fails_with_connection_lost(fresh_server: ServerProcess) -> None:
    async with await headwater.connect(fresh_server.address) as client:
        assert fresh_server.process is not None
        os.kill(fresh_server.process.pid, signal.SIGSTOP)
        pending = client.send_request(m.ListTopicsRequest())
        kill_stopped(fresh_server)
        with pytest.raises(ConnectionLost):
            await asyncio.wait_for(pending, 10)


# Reconnection


async def _collect(consumer: headwater.Consumer, wanted: set[bytes]) -> list[headwater.Message]:
    received: list[headwater.Message] = []
    seen: set[bytes] = set()
    while not wanted <= seen:
        message = await consumer.receive(timeout=30)
        received.append(message)
        assert message.value is not None
        seen.add(message.value)
        await message.ack()
    return received


async def test_reconnect_resubscribes_and_keeps_at_least_once(fresh_server: ServerProcess) -> None:
    pin_port(fresh_server)
    async with await headwater.connect(fresh_server.address, reconnect=FAST) as client:
        await client.create_topic("t", dispatch="reliable", configs={"fsync": "always"})
        consumer = await client.subscribe("t", "s", start="earliest", ack_timeout=60)
        async with client.producer("t") as producer:
            for i in range(10):
                await producer.send(b"m%d" % i)
        first = [await consumer.receive(timeout=30) for _ in range(10)]
        for message in first[:5]:
            await message.ack()
        await client.list_topics()  # the acks went out before it (requests are in order)

        fresh_server.kill()
        await until_disconnected(client)
        fresh_server.start()

        # requests made after the loss wait for the reconnection instead of failing
        assert [t.name for t in await asyncio.wait_for(client.list_topics(), 30)] == ["t"]
        async with client.producer("t") as producer:
            for i in range(10, 15):
                await producer.send(b"m%d" % i)
        # the five delivered and never acknowledged come again, then the new ones
        wanted = {b"m%d" % i for i in range(5, 15)}
        received = await asyncio.wait_for(_collect(consumer, wanted), 30)
        assert wanted <= {message.value for message in received}
        assert client.reconnections == 1


async def test_reconnect_after_graceful_shutdown(fresh_server: ServerProcess) -> None:
    pin_port(fresh_server)
    async with await headwater.connect(fresh_server.address, reconnect=FAST) as client:
        await client.create_topic("t", dispatch="reliable")
        consumer = await client.subscribe("t", "s")
        assert fresh_server.stop() == 0
        await until_disconnected(client)
        fresh_server.start()
        async with client.producer("t") as producer:
            await producer.send(b"after")
        message = await asyncio.wait_for(consumer.receive(), 30)
        assert message.value == b"after"


async def test_reconnect_gives_up_with_connection_lost(fresh_server: ServerProcess) -> None:
    policy = headwater.ReconnectPolicy(initial_delay=0.05, max_delay=0.1, max_attempts=3)
    async with await headwater.connect(fresh_server.address, reconnect=policy) as client:
        await client.create_topic("t", dispatch="non-reliable")
        consumer = await client.subscribe("t", "s")
        fresh_server.kill()
        with pytest.raises(ConnectionLost, match="gave up reconnecting after 3 attempts"):
            await asyncio.wait_for(consumer.receive(), 10)
        with pytest.raises(ConnectionLost, match="gave up"):
            await client.list_topics()


def test_reconnect_policy_delays() -> None:
    policy = headwater.ReconnectPolicy(
        initial_delay=0.1, max_delay=0.5, max_attempts=5, jitter=False
    )
    assert list(policy.delays()) == [0.1, 0.2, 0.4, 0.5, 0.5]
    jittered = list(headwater.ReconnectPolicy(0.1, 0.4, max_attempts=3).delays())
    assert all(d / 2 <= j <= d for d, j in zip([0.1, 0.2, 0.4], jittered, strict=True))
    with pytest.raises(InvalidRequest):
        headwater.ReconnectPolicy(initial_delay=0)


# The command line


def test_cli_consume_exits_non_zero_when_server_is_killed(fresh_server: ServerProcess) -> None:
    assert hw("topic", "create", "t", server=fresh_server).returncode == 0
    consumer = start_consumer(fresh_server, "t", "-s", "s")
    try:
        wait_for_consumers(fresh_server, "t", 1)
        fresh_server.kill()
        _, stderr = consumer.communicate(timeout=60)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait(10)
    assert consumer.returncode == 1
    assert stderr.startswith("headwater: error: CONNECTION_CLOSED: connection to"), stderr
    assert "lost" in stderr


def test_cli_consume_reconnect_survives_a_restart(fresh_server: ServerProcess) -> None:
    pin_port(fresh_server)
    assert hw("topic", "create", "t", "--dispatch", "reliable", server=fresh_server).returncode == 0
    consumer = start_consumer(fresh_server, "t", "-s", "s", "--count", "1", "--reconnect")
    try:
        wait_for_consumers(fresh_server, "t", 1)
        fresh_server.kill()
        fresh_server.start()
        assert hw("produce", "t", "after-restart", server=fresh_server).returncode == 0
        stdout, stderr = consumer.communicate(timeout=30)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait(10)
    assert consumer.returncode == 0, stderr
    assert stdout.splitlines() == ["after-restart"]


def test_cli_at_most_once_produce_reports_a_refusal(server: ServerProcess, topic_name: str) -> None:
    result = hw("produce", "nosuch", "--delivery", "at-most-once", "x", server=server)
    assert result.returncode == 1
    assert "UNKNOWN_TOPIC" in result.stderr
    assert "produced" not in result.stderr
    generated = hw("produce", "nosuch", "--delivery", "at-most-once", "--count", "3", server=server)
    assert generated.returncode == 1
    assert "UNKNOWN_TOPIC" in generated.stderr
    # one refusal, one line: the command's error, not the library's warning of it as well
    assert hw("topic", "create", topic_name, server=server).returncode == 0
    partition = hw(
        "produce", topic_name, "--delivery", "at-most-once", "--partition", "5", "a", server=server
    )
    assert partition.returncode == 1
    assert partition.stderr.count("INVALID_PARTITION") == 1, partition.stderr


def test_cli_at_most_once_produce_still_succeeds(server: ServerProcess, topic_name: str) -> None:
    assert hw("topic", "create", topic_name, server=server).returncode == 0
    result = hw("produce", topic_name, "--delivery", "at-most-once", "x", "y", server=server)
    assert result.returncode == 0, result.stderr
    assert f"produced 2 messages to {topic_name}" in result.stderr


async def test_at_most_once_producer_confirm_raises_refusal(client: headwater.Client) -> None:
    producer = client.producer("nosuch", delivery=headwater.AtMostOnce())
    future = await producer.send(b"x")
    with pytest.raises(UnknownTopic):
        await producer.confirm()
    assert future.result().offset is None  # written to the socket: all at-most-once promises
    await producer.close()


# MESSAGES_DROPPED, from a fake peer


class FakePeer:
    """Stands in for a server: answers SUBSCRIBE with consumer 7 and sends `pushes` after it."""

    def __init__(self, pushes: Sequence[bytes]) -> None:
        self.pushes = pushes
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> FakePeer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await asyncio.wait_for(asyncio.gather(*self._handlers, return_exceptions=True), 5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)  # type: ignore[arg-type]
        decoder = FrameDecoder()
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                for frame in decoder.feed(data):
                    assert isinstance(frame, Frame)
                    request = decode_request(frame.header, frame.body)
                    if isinstance(request, m.SubscribeRequest):
                        answer = m.SubscribeResponse(7)
                        writer.write(encode_response(1, frame.header.correlation_id, answer))
                        writer.writelines(self.pushes)
                    elif not frame.header.flags & Flags.NO_RESPONSE:
                        response = encode_response(
                            frame.header.api_key, frame.header.correlation_id, m.EmptyResponse()
                        )
                        writer.write(response)
        writer.close()


def _delivery(offset: int, value: bytes) -> bytes:
    batch = build_batch([(None, value, [])], base_offset=offset)
    return delivery_prefix(7, 0, len(batch)) + batch


DROPPED_PUSHES = [_delivery(0, b"a"), encode_push(7, m.MessagesDropped(5)), _delivery(6, b"b")]


async def test_messages_dropped_push_is_surfaced(caplog: pytest.LogCaptureFixture) -> None:
    notices: list[int] = []
    async with FakePeer(DROPPED_PUSHES) as peer:
        client = await headwater.connect(f"127.0.0.1:{peer.port}")
        consumer = await client.subscribe("t", "s", on_dropped=notices.append)
        first = await consumer.receive(timeout=30)
        second = await consumer.receive(timeout=30)
        assert (first.value, first.missed) == (b"a", 0)
        assert (second.value, second.missed, second.offset) == (b"b", 5, 6)
        assert consumer.dropped == 5
        assert notices == [5]
        await client.close()

        # without a callback: a warning in the log
        client = await headwater.connect(f"127.0.0.1:{peer.port}")
        with caplog.at_level(logging.WARNING, logger="headwater.client"):
            consumer = await client.subscribe("t", "s")
            await consumer.receive(timeout=30)
            await consumer.receive(timeout=30)
        assert "missed 5 messages (the consumer fell behind)" in caplog.text
        await client.close()


async def test_cli_consume_warns_about_dropped_messages() -> None:
    async with FakePeer(DROPPED_PUSHES) as peer:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "headwater", "consume", "t", "-s", "s", "--count", "2"),
            *("--server", f"127.0.0.1:{peer.port}"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, stderr
    assert stdout.decode().splitlines() == ["a", "b"]
    assert "headwater: warning: missed 5 messages (the consumer fell behind)" in stderr.decode()


async def test_consumer_closed_with_connection_closed_code_still_raises() -> None:
    closed = encode_push(7, m.ConsumerClosed(18, "odd"))
    async with FakePeer([closed]) as peer:
        client = await headwater.connect(f"127.0.0.1:{peer.port}")
        consumer = await client.subscribe("t", "s")
        with pytest.raises(ConnectionLost):
            await asyncio.wait_for(anext(consumer), 5)
        await client.close()


# The blocking client


def test_blocking_client_raises_connection_lost_on_dead_server(
    fresh_server: ServerProcess,
) -> None:
    with BlockingClient(fresh_server.address) as client:
        client.create_topic("t")
        fresh_server.kill()
        with pytest.raises(ConnectionLost, match="lost"):
            client.produce("t", [(None, b"x", ())])
        with pytest.raises(ConnectionLost):
            client.create_topic("u")


def test_blocking_client_times_out_then_refuses(fresh_server: ServerProcess) -> None:
    with BlockingClient(fresh_server.address, timeout=0.5) as client:
        client.create_topic("t")
        assert fresh_server.process is not None
        os.kill(fresh_server.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(RequestTimeout):
                client.create_topic("u")
            # the late answer must not be taken for the next request's
            with pytest.raises(ConnectionLost, match="unusable"):
                client.create_topic("v")
        finally:
            kill_stopped(fresh_server)


# Names are limited in bytes


def test_name_limits_are_in_bytes() -> None:
    check_name("subscription", "é" * 127)  # 254 bytes
    with pytest.raises(InvalidRequest, match="256 bytes, the limit is 255 bytes"):
        check_name("subscription", "é" * 128)
    check_topic_name("a" * 249)
    with pytest.raises(Exception, match="250 bytes"):
        check_topic_name("a" * 250)


async def test_server_refuses_a_subscription_name_over_255_bytes(
    client: headwater.Client, topic: str
) -> None:
    with pytest.raises(InvalidRequest, match="bytes"):
        await client.subscribe(topic, "€" * 100)  # 100 characters, 300 bytes


def test_connection_lost_is_a_client_side_connection_closed() -> None:
    error = ConnectionLost("x")
    assert isinstance(error, ConnectionClosed) and error.retriable
    assert error.code == ConnectionClosed.code
    assert type(error_for_code(error.code, "x")) is ConnectionClosed
