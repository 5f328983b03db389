"""Every bad input gets a precise error to that client, and the server keeps serving everyone."""

from __future__ import annotations

import asyncio
import random
import struct

import pytest

import headwater
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.errors import (
    CorruptBatch,
    ErrorCode,
    HeadwaterError,
    InvalidPartition,
    InvalidRequest,
    InvalidTopicName,
    UnknownConsumer,
    UnknownTopic,
)
from headwater.wire.frames import Flags, Frame
from headwater.wire.limits import MAX_FRAME_SIZE
from headwater.wire.protocol import encode_request
from headwater.wire.records import build_batch
from tests.support.rawwire import RawPeer


async def _still_serves(server: ServerProcess) -> None:
    async with await headwater.connect(server.address) as client:
        await client.list_topics()


def _error(response: object) -> HeadwaterError:
    assert isinstance(response, HeadwaterError), response
    return response


async def test_unknown_api_key_keeps_the_connection(server: ServerProcess) -> None:
    peer = await RawPeer.open(server.address)
    await peer.send(struct.pack(">ihhiH", 10, 77, 0, 5, 0))
    frame = await peer.frame()
    assert frame.header.correlation_id == 5 and frame.header.is_response
    error = _error(await _response_of(frame))
    assert error.code == ErrorCode.UNSUPPORTED_API and "77" in error.message
    assert isinstance(await peer.call(m.ListTopicsRequest()), m.ListTopicsResponse)
    await peer.close()


async def _response_of(frame: Frame) -> object:
    from headwater.wire.protocol import decode_response

    try:
        return decode_response(frame.header, frame.body)
    except HeadwaterError as exc:
        return exc


async def test_unknown_api_version(server: ServerProcess) -> None:
    peer = await RawPeer.open(server.address)
    await peer.send(struct.pack(">ihhiH", 10, m.ApiKey.LIST_TOPICS, 9, 6, 0))
    error = _error(await peer.response())
    assert error.code == ErrorCode.UNSUPPORTED_VERSION
    assert "version 9" in error.message
    await peer.close()


async def test_oversized_frame_rejected_before_its_body_then_connection_continues(
    server: ServerProcess,
) -> None:
    peer = await RawPeer.open(server.address)
    size = MAX_FRAME_SIZE + 1
    # Announce the frame and send only its header: the answer must come before any body is sent.
    await peer.send(struct.pack(">ihhiH", size, m.ApiKey.PRODUCE, 0, 11, 0))
    error = _error(await peer.response(timeout=5))
    assert error.code == ErrorCode.FRAME_TOO_LARGE
    # The body is skipped as it arrives; the next frame is served normally.
    remaining = size - 10
    chunk = b"\x00" * (1 << 20)
    while remaining:
        part = chunk[: min(remaining, len(chunk))]
        await peer.send(part)
        remaining -= len(part)
    assert isinstance(await peer.call(m.ListTopicsRequest()), m.ListTopicsResponse)
    await peer.close()


async def test_truncated_frame_is_answered_at_eof(server: ServerProcess) -> None:
    peer = await RawPeer.open(server.address)
    frame = encode_request(m.DescribeTopicRequest("some-topic"), 21)
    await peer.send(frame[:-3])
    peer.writer.write_eof()
    error = _error(await peer.response())
    assert error.code == ErrorCode.TRUNCATED_FRAME
    assert await peer.closed_by_server()
    await _still_serves(server)


async def test_frame_size_below_header_closes_only_that_connection(server: ServerProcess) -> None:
    other = await RawPeer.open(server.address)
    peer = await RawPeer.open(server.address)
    await peer.send(struct.pack(">i", 3) + b"\x00" * 10)
    error = _error(await peer.response())
    assert error.code == ErrorCode.MALFORMED_FRAME
    assert await peer.closed_by_server()
    assert isinstance(await other.call(m.ListTopicsRequest()), m.ListTopicsResponse)
    await other.close()


async def test_malformed_body_is_answered_and_connection_continues(server: ServerProcess) -> None:
    peer = await RawPeer.open(server.address)
    await peer.send(struct.pack(">ihhiH", 14, m.ApiKey.DESCRIBE_TOPIC, 0, 3, 0) + b"\x00\x09ab")
    error = _error(await peer.response())
    assert error.code == ErrorCode.MALFORMED_FRAME and "DESCRIBE_TOPIC" in error.message
    assert isinstance(await peer.call(m.ListTopicsRequest()), m.ListTopicsResponse)
    await peer.close()


async def test_request_flags_must_not_claim_response_or_push(server: ServerProcess) -> None:
    peer = await RawPeer.open(server.address)
    await peer.request(m.ListTopicsRequest(), flags=Flags.RESPONSE)
    assert _error(await peer.response()).code == ErrorCode.MALFORMED_FRAME
    await peer.close()


async def test_bad_crc_is_refused_and_nothing_is_delivered(
    server: ServerProcess, client: headwater.Client, topic: str
) -> None:
    consumer = await client.subscribe(topic, "watch")
    batch = bytearray(build_batch([(None, b"hello", [])]))
    batch[-1] ^= 0x01
    peer = await RawPeer.open(server.address)
    error = _error(await peer.call(m.ProduceRequest(topic, 0, bytes(batch))))
    assert isinstance(error, CorruptBatch) and "CRC" in error.message
    good = build_batch([(None, b"good", [])])
    assert await peer.call(m.ProduceRequest(topic, 0, good)) == m.ProduceResponse(0, 0)
    message = await consumer.receive(timeout=30)
    assert message.value == b"good" and message.offset == 0
    await peer.close()


async def test_unknown_topic(client: headwater.Client) -> None:
    producer = client.producer("no-such-topic")
    future = await producer.send(b"x")
    with pytest.raises(UnknownTopic, match="no-such-topic"):
        await future
    with pytest.raises(UnknownTopic):
        await client.subscribe("no-such-topic", "s")
    with pytest.raises(UnknownTopic):
        await client.describe_topic("no-such-topic")
    with pytest.raises(UnknownTopic):
        await client.delete_topic("no-such-topic")


@pytest.mark.parametrize(
    "name", ["", "has space", "slash/y", "..", "x" * 250, "ünïcode"], ids=lambda n: repr(n)[:12]
)
async def test_bad_topic_names(client: headwater.Client, name: str) -> None:
    with pytest.raises(InvalidTopicName):
        await client.create_topic(name, dispatch="non-reliable")


async def test_bad_create_arguments(client: headwater.Client, topic_name: str) -> None:
    with pytest.raises(InvalidRequest, match="partitions"):
        await client.create_topic(topic_name, partitions=0, dispatch="non-reliable")
    with pytest.raises(InvalidRequest, match="partitions"):
        await client.create_topic(topic_name, partitions=100_000, dispatch="non-reliable")
    with pytest.raises(InvalidRequest, match="unknown topic config 'colour'"):
        await client.create_topic(topic_name, dispatch="reliable", configs={"colour": "red"})
    with pytest.raises(InvalidRequest, match="fsync must be always, interval or never"):
        await client.create_topic(topic_name, dispatch="reliable", configs={"fsync": "sometimes"})
    with pytest.raises(InvalidRequest, match=r"segment\.bytes must be an integer"):
        await client.create_topic(topic_name, dispatch="reliable", configs={"segment.bytes": "x"})
    with pytest.raises(InvalidRequest, match="non-reliable topics take no configs"):
        await client.create_topic(topic_name, configs={"fsync": "never"}, dispatch="non-reliable")
    with pytest.raises(InvalidRequest, match="dispatch"):
        await client.create_topic(topic_name, dispatch="sometimes")  # type: ignore[arg-type]


async def test_bad_subscribe_and_flow_requests(server: ServerProcess, topic: str) -> None:
    peer = await RawPeer.open(server.address)
    assert _error(await peer.call(m.SubscribeRequest(topic, "s", 9, "c"))).code == (
        ErrorCode.INVALID_REQUEST
    )
    assert _error(await peer.call(m.SubscribeRequest(topic, "", 0, "c"))).code == (
        ErrorCode.INVALID_REQUEST
    )
    assert _error(await peer.call(m.SubscribeRequest(topic, "s", 0, "c", 0, -5))).code == (
        ErrorCode.INVALID_REQUEST
    )
    assert isinstance(_error(await peer.call(m.FlowRequest(424242, 1))), UnknownConsumer)
    response = await peer.call(m.SubscribeRequest(topic, "s", 0, "c"))
    assert isinstance(response, m.SubscribeResponse)
    assert _error(await peer.call(m.FlowRequest(response.consumer_id, 0))).code == (
        ErrorCode.INVALID_REQUEST
    )
    await peer.close()


async def test_consumers_of_another_connection_are_not_reachable(
    server: ServerProcess, topic: str
) -> None:
    owner = await RawPeer.open(server.address)
    response = await owner.call(m.SubscribeRequest(topic, "mine", 0, "c"))
    assert isinstance(response, m.SubscribeResponse)
    intruder = await RawPeer.open(server.address)
    error = _error(await intruder.call(m.UnsubscribeRequest(response.consumer_id)))
    assert isinstance(error, UnknownConsumer)
    await owner.close()
    await intruder.close()


async def test_invalid_partition(server: ServerProcess, topic: str) -> None:
    peer = await RawPeer.open(server.address)
    batch = build_batch([(None, b"x", [])])
    assert isinstance(_error(await peer.call(m.ProduceRequest(topic, 3, batch))), InvalidPartition)
    await peer.close()


async def test_failed_no_response_request_still_reports_its_error(server: ServerProcess) -> None:
    peer = await RawPeer.open(server.address)
    await peer.request(m.FlowRequest(999_999, 1), flags=Flags.NO_RESPONSE)
    assert isinstance(_error(await peer.response()), UnknownConsumer)
    await peer.request(m.ListTopicsRequest(), flags=Flags.NO_RESPONSE)
    with pytest.raises(asyncio.TimeoutError):
        await peer.response(timeout=0.5)
    await peer.close()


async def test_fuzz_random_and_mutated_frames(
    server: ServerProcess, client: headwater.Client, topic: str
) -> None:
    """Thousands of random and mutated frames; afterwards a normal client is served as before."""
    rng = random.Random(20261122)
    valid = [
        encode_request(m.ProduceRequest(topic, 0, build_batch([(b"k", b"v" * 20, [])] * 3)), 1),
        encode_request(m.SubscribeRequest(topic, "fz", 1, "c", 0, 10), 2),
        encode_request(m.FlowRequest(1, 10), 3),
        encode_request(m.AckRequest(1, (m.AckEntry(0, 0),)), 4),
        encode_request(m.CreateTopicRequest("fuzz-topic", 2, 0), 5),
        encode_request(m.DescribeTopicRequest(topic), 6),
        encode_request(m.ListTopicsRequest(), 7),
        encode_request(m.UnsubscribeRequest(1), 8),
    ]
    sent = 0
    for _round in range(40):
        peer = await RawPeer.open(server.address)
        chunks = []
        for _ in range(60):
            choice = rng.random()
            if choice < 0.3:
                size = rng.randrange(0, 200)
                chunks.append(rng.randbytes(size))
            elif choice < 0.8:
                frame = bytearray(rng.choice(valid))
                for _ in range(rng.randrange(1, 6)):
                    position = rng.randrange(4, len(frame))
                    frame[position] = rng.randrange(256)
                chunks.append(bytes(frame))
            else:
                # a plausible header with a random body
                body = rng.randbytes(rng.randrange(0, 100))
                header = struct.pack(
                    ">ihhiH",
                    10 + len(body),
                    rng.choice(list(m.ApiKey)),
                    0,
                    rng.randrange(1 << 31),
                    0,
                )
                chunks.append(header + body)
            sent += 1
        try:
            await peer.send(b"".join(chunks))
            await asyncio.sleep(0.01)
        except (ConnectionResetError, BrokenPipeError):
            pass
        await peer.close()
    assert sent == 2400
    # The server still works for a normal client.
    await client.list_topics()
    consumer = await client.subscribe(topic, "after-fuzz")
    producer = client.producer(topic)
    metadata = await (await producer.send(b"still alive"))
    message = await consumer.receive(timeout=30)
    assert message.value == b"still alive" and message.offset == metadata.offset
    assert server.alive()
    assert "Traceback" not in server.log()


async def test_every_request_array_is_refused_past_its_maximum_before_parsing(
    server: ServerProcess,
) -> None:
    """Each array at its documented maximum passes the decoder; one more is INVALID_REQUEST
    naming the field and the maximum (before the fix: parsed, then accepted or refused later)."""
    from headwater.wire import limits

    topic = struct.pack(">H", 1) + b"t"
    settings = struct.pack(">bqiibiiBb", 0, 0, 0, 0, 0, 0, 0, 0, 0)
    subscribe_head = topic + topic + b"\x00" + topic + struct.pack(">ii", 0, 0) + settings
    cases = [
        (
            "CREATE_TOPIC configs",
            m.ApiKey.CREATE_TOPIC,
            topic + struct.pack(">ib", 1, 0),
            limits.MAX_TOPIC_CONFIGS,
            b"\x00\x00\x00\x00",
            b"",
        ),
        (
            "ALTER_TOPIC_CONFIGS configs",
            m.ApiKey.ALTER_TOPIC_CONFIGS,
            topic,
            limits.MAX_TOPIC_CONFIGS,
            b"\x00\x00\x00\x00",
            b"",
        ),
        (
            "ACK acks",
            m.ApiKey.ACK,
            struct.pack(">ib", 1, 0),
            limits.MAX_ACKS_PER_REQUEST,
            bytes(12),
            b"",
        ),
        (
            "NACK acks",
            m.ApiKey.NACK,
            struct.pack(">ii", 1, 0),
            limits.MAX_ACKS_PER_REQUEST,
            bytes(12),
            b"",
        ),
        ("MAP_GET keys", m.ApiKey.MAP_GET, topic, limits.MAX_MAP_KEYS, bytes(4), b""),
        (
            "MAP_SET writes",
            m.ApiKey.MAP_SET,
            topic,
            limits.MAX_MAP_KEYS,
            bytes(4) + struct.pack(">iq", -1, -1),
            b"",
        ),
        (
            "SUBSCRIBE settings.keys",
            m.ApiKey.SUBSCRIBE,
            subscribe_head,
            limits.MAX_SUBSCRIPTION_KEYS,
            bytes(4),
            struct.pack(">ii", -1, 0),
        ),
        (
            "SUBSCRIBE partitions",
            m.ApiKey.SUBSCRIBE,
            subscribe_head + struct.pack(">ii", 0, -1),
            limits.MAX_SUBSCRIBE_PARTITIONS,
            bytes(4),
            b"",
        ),
        ("LOOKUP", m.ApiKey.LOOKUP, b"", limits.MAX_LOOKUP_TOPICS, b"\x00\x01t", b""),
    ]
    peer = await RawPeer.open(server.address)
    for what, api_key, head, limit, element, tail in cases:
        for count in (limit, limit + 1, 2**31 - 1):
            carried = min(count, limit + 1)
            body = head + struct.pack(">i", count) + element * carried + tail
            await peer.send(struct.pack(">ihhiH", 10 + len(body), api_key, 0, 9, 0) + body)
            answer = await peer.response(timeout=30)
            if count == limit:  # decoded: whatever the broker says, it is not the array's size
                assert not (isinstance(answer, HeadwaterError) and "at most" in answer.message), (
                    what,
                    answer,
                )
                continue
            error = _error(answer)
            assert error.code == ErrorCode.INVALID_REQUEST, (what, count, error)
            assert what.split()[0] in error.message and str(limit) in error.message, error
    await peer.close()
    await _still_serves(server)


async def test_map_get_of_no_keys_is_refused(server: ServerProcess) -> None:
    """docs/PROTOCOL.md says 1..1000 keys; a get of none was answered with no entries."""
    async with await headwater.connect(server.address) as client:
        await client.create_topic("lv-empty", dispatch="reliable", configs={"last.value": "true"})
        assert await client.map("lv-empty").get_many([]) == []  # the client asks nothing
    peer = await RawPeer.open(server.address)
    error = _error(await peer.call(m.MapGetRequest("lv-empty", ())))
    assert error.code == ErrorCode.INVALID_REQUEST and "1..1000 keys" in error.message
    await peer.close()
