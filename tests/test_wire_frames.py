"""Byte-exact vectors and the incremental decoder. The vectors are the ones in docs/PROTOCOL.md."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headwater.wire import messages as m
from headwater.wire.api.produce import delivery_prefix
from headwater.wire.errors import (
    MalformedFrame,
    TopicExists,
    UnsupportedApi,
    UnsupportedVersion,
)
from headwater.wire.frames import (
    Flags,
    Frame,
    FrameDecoder,
    FrameHeader,
    FrameRejected,
    encode_frame,
)
from headwater.wire.protocol import (
    decode_request,
    decode_response,
    encode_error,
    encode_push,
    encode_request,
    encode_response,
)

# (message, correlation id, exact frame bytes as hex) — quoted in docs/PROTOCOL.md
REQUEST_VECTORS = [
    (
        m.CreateTopicRequest("orders", 3, m.DispatchMode.NON_RELIABLE),
        1,
        "0000001b 000a 0000 00000001 0000 0006 6f7264657273 00000003 00 00000000",
    ),
    (
        m.CreateTopicRequest(
            "orders", 1, m.DispatchMode.RELIABLE, (m.ConfigEntry("fsync", "never"),)
        ),
        1,
        "00000029 000a 0000 00000001 0000 0006 6f7264657273 00000001 01"
        " 00000001 0005 6673796e63 0005 6e65766572",
    ),
    (
        m.SubscribeRequest("orders", "audit", m.SubscriptionType.SHARED, "c1", 0, 100),
        2,
        "0000004e 0001 0000 00000002 0000 0006 6f7264657273 0005 6175646974 01 0002 6331"
        " 00000000 00000064"
        " 00 0000000000000000 00000000 00000000 01 00000000 00000000 00"
        " 00 00000000 ffffffff 00000000",
    ),
    (
        m.CreatePartitionsRequest("orders", 4),
        7,
        "00000016 000e 0000 00000007 0000 0006 6f7264657273 00000004",
    ),
    (
        m.SubscribeRequest(
            "orders",
            "audit",
            m.SubscriptionType.EXCLUSIVE,
            "c1",
            0,
            10,
            m.SubscriptionSettings(
                m.StartPosition.OFFSET,
                42,
                5000,
                3,
                m.Backoff.FIXED,
                100,
                0,
                committed_only=True,
                durable=m.Durable.LAST_VALUE,
                keys=(b"IBM",),
                key_prefix=b"",
            ),
        ),
        2,
        "00000055 0001 0000 00000002 0000 0006 6f7264657273 0005 6175646974 00 0002 6331"
        " 00000000 0000000a"
        " 02 000000000000002a 00001388 00000003 00 00000064 00000000 01"
        " 04 00000001 00000003 49424d 00000000 00000000",
    ),
    (m.FlowRequest(7, 10), 3, "00000012 0002 0000 00000003 0000 00000007 0000000a"),
    (
        m.AckRequest(7, (m.AckEntry(0, 41),)),
        4,
        "0000001f 0003 0000 00000004 0000 00000007 00 00000001 00000000 0000000000000029",
    ),
    (
        m.AckRangesRequest(7, (m.AckRange(0, 41, 10),)),
        4,
        "00000022 002c 0000 00000004 0000 00000007 00000001 00000000 0000000000000029 0000000a",
    ),
    (
        m.NackRequest(7, (m.AckEntry(0, 41),), 250),
        4,
        "00000022 0005 0000 00000004 0000 00000007 000000fa 00000001 00000000 0000000000000029",
    ),
    (
        m.SeekRequest("orders", "audit", m.StartPosition.EARLIEST),
        5,
        "00000022 0006 0000 00000005 0000 0006 6f7264657273 0005 6175646974 01 0000000000000000",
    ),
    (m.ListTopicsRequest(), 5, "0000000a 000c 0000 00000005 0000"),
    (
        m.ProduceRequest("t", -1, b"\xab\xcd"),
        6,
        "00000014 0000 0000 00000006 0000 0001 74 ffffffff 00 abcd",
    ),
    (
        m.ProduceRequest("t", 2, b"\xab\xcd", m.Isolation.FSYNCED),
        7,
        "00000014 0000 0000 00000007 0000 0001 74 00000002 01 abcd",
    ),
    (m.InitProducerIdRequest(), 8, "0000000a 0008 0000 00000008 0000"),
    (
        m.MapGetRequest("px", (b"IBM",)),
        9,
        "00000019 0014 0000 00000009 0000 0002 7078 00000001 00000003 49424d",
    ),
    (
        m.MapSetRequest("px", (m.MapWrite(b"IBM", b"42", -2), m.MapWrite(b"HP", None))),
        10,
        "00000039 0015 0000 0000000a 0000 0002 7078 00000002"
        " 00000003 49424d 00000002 3432 fffffffffffffffe"
        " 00000002 4850 ffffffff ffffffffffffffff",
    ),
    (
        m.MapScanRequest("px", b"I", 100, b""),
        11,
        "0000001b 0016 0000 0000000b 0000 0002 7078 00000001 49 00000064 00000000",
    ),
    (m.MapSizeRequest("px"), 12, "0000000e 0017 0000 0000000c 0000 0002 7078"),
]


@pytest.mark.parametrize(("message", "correlation_id", "expected"), REQUEST_VECTORS)
def test_request_vectors(message: m.Request, correlation_id: int, expected: str) -> None:
    data = encode_request(message, correlation_id)
    assert data.hex() == expected.replace(" ", "")
    (frame,) = FrameDecoder().feed(data)
    assert isinstance(frame, Frame)
    assert frame.header == FrameHeader(int(data[4:6].hex(), 16), 0, correlation_id, 0)
    assert decode_request(frame.header, frame.body) == message


def test_response_vectors() -> None:
    produce = encode_response(m.ApiKey.PRODUCE, 6, m.ProduceResponse(2, 1000))
    assert produce.hex() == ("000000180000000000000006000100000000000200000000000003e8")
    subscribe = encode_response(m.ApiKey.SUBSCRIBE, 2, m.SubscribeResponse(7))
    assert subscribe.hex() == "0000001000010000000000020001000000000007"
    empty = encode_response(m.ApiKey.FLOW, 3, m.EmptyResponse())
    assert empty.hex() == "0000000c000200000000000300010000"
    error = encode_error(m.ApiKey.CREATE_TOPIC, 0, 1, TopicExists("exists"))
    assert error.hex() == ("00000014000a0000000000010001000b0006657869737473")
    (frame,) = FrameDecoder().feed(error)
    assert isinstance(frame, Frame)
    with pytest.raises(TopicExists, match="exists"):
        decode_response(frame.header, frame.body)


def test_push_vectors() -> None:
    assert delivery_prefix(7, 1, 3, 2).hex() == (
        "00000015 0064 0000 00000007 0002 00000001 00000002"
    ).replace(" ", "")
    closed = encode_push(7, m.ConsumerClosed(9, "gone"))
    assert closed.hex() == "000000120065000000000007000200090004676f6e65"
    (frame,) = FrameDecoder().feed(closed)
    assert isinstance(frame, Frame)
    assert frame.header.is_push and not frame.header.is_response


def test_decoder_reassembles_byte_by_byte() -> None:
    stream = b"".join(encode_request(msg, cid) for msg, cid, _ in REQUEST_VECTORS)
    decoder = FrameDecoder()
    frames = []
    for i in range(len(stream)):
        frames.extend(decoder.feed(stream[i : i + 1]))
    assert [decode_request(f.header, f.body) for f in frames if isinstance(f, Frame)] == [
        msg for msg, _, _ in REQUEST_VECTORS
    ]
    assert decoder.pending_bytes == 0


def test_oversized_frame_is_rejected_from_its_header_and_skipped() -> None:
    decoder = FrameDecoder(max_frame_size=100)
    big = encode_request(m.ProduceRequest("t", 0, b"x" * 1000), 9)
    after = encode_request(m.ListTopicsRequest(), 10)
    events = decoder.feed(big[:14])  # size prefix and header only
    assert events == [FrameRejected(FrameHeader(0, 0, 9, 0), len(big) - 4)]
    assert decoder.feed(big[14:500]) == []
    assert decoder._buffer == bytearray()  # nothing of the body is held
    (frame,) = decoder.feed(big[500:] + after)
    assert isinstance(frame, Frame)
    assert frame.header.correlation_id == 10


@given(
    bodies=st.lists(st.binary(max_size=300), min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=20),
    oversized=st.booleans(),
)
def test_large_bodies_gathered_in_pieces_decode_as_one_feed_does(
    bodies: list[bytes], cuts: list[int], oversized: bool
) -> None:
    """Bodies of 64 bytes or more are gathered piece by piece (`large_body=64`): fed in any
    pieces, every frame comes out as from one feed, with the pending bytes and the partial
    header of a large frame in between (and a rejected frame skipped among them)."""
    frames = [encode_frame(m.ApiKey.PRODUCE, 0, i, 0, body) for i, body in enumerate(bodies)]
    if oversized:
        frames.insert(len(frames) // 2, encode_frame(m.ApiKey.PRODUCE, 0, 99, 0, bytes(400)))
    stream = b"".join(frames)
    whole = FrameDecoder(max_frame_size=350).feed(stream)
    decoder = FrameDecoder(max_frame_size=350, large_body=64)
    events: list[Frame | FrameRejected] = []
    edges = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    for start, end in itertools.pairwise(edges):
        events.extend(decoder.feed(stream[start:end]))
        complete = sum(len(f) for f in frames[: len(events)])
        assert decoder.pending_bytes == end - complete or decoder._skip
        if decoder._large is not None:
            assert decoder.partial_header() == decoder._large
    assert events == whole
    assert decoder.pending_bytes == 0


def test_a_large_body_is_not_grown_in_the_buffer() -> None:
    decoder = FrameDecoder(large_body=1000)
    frame = encode_frame(m.ApiKey.PRODUCE, 0, 7, 0, bytes(range(256)) * 40)
    assert decoder.feed(frame[:500]) == []
    assert decoder.feed(frame[500:5000]) == []
    assert decoder._buffer == bytearray()  # the pieces are kept as they came
    assert decoder.pending_bytes == 5000 - 14
    (done,) = decoder.feed(frame[5000:] + encode_frame(m.ApiKey.LIST_TOPICS, 0, 8, 0, b""))[:1]
    assert isinstance(done, Frame) and done.body == bytes(range(256)) * 40


def test_a_large_body_written_a_byte_at_a_time_is_held_in_few_pieces() -> None:
    """A client dribbling a large body byte by byte: the decoder holds a few pieces of 64 KiB,
    not one object per byte (262,144 of ~40 bytes each for this 256 KiB body)."""
    body = bytes(range(256)) * 1024
    frame = encode_frame(m.ApiKey.PRODUCE, 0, 3, 0, body)
    decoder = FrameDecoder(large_body=1024)
    events: list[Frame | FrameRejected] = []
    for i in range(len(frame) - 1):
        events.extend(decoder.feed(frame[i : i + 1]))
    assert events == []
    assert len(decoder._pieces) <= len(body) // (64 * 1024)
    (done,) = decoder.feed(frame[-1:])
    assert isinstance(done, Frame) and done.body == body


def test_size_smaller_than_header_is_malformed() -> None:
    with pytest.raises(MalformedFrame):
        FrameDecoder().feed(bytes.fromhex("00000003000c0000000000050000"))


def test_partial_frame_is_pending() -> None:
    decoder = FrameDecoder()
    data = encode_request(m.DescribeTopicRequest("abc"), 4)
    assert decoder.feed(data[:-1]) == []
    assert decoder.pending_bytes == len(data) - 1
    assert decoder.partial_header() == FrameHeader(m.ApiKey.DESCRIBE_TOPIC, 0, 4, 0)


def test_unknown_api_and_version() -> None:
    with pytest.raises(UnsupportedApi):
        decode_request(FrameHeader(77, 0, 1, 0), b"")
    with pytest.raises(UnsupportedVersion):
        decode_request(FrameHeader(m.ApiKey.LIST_TOPICS, 5, 1, 0), b"")


@pytest.mark.parametrize(
    "body",
    [b"", b"\x00", b"\x00\x05ab", b"\x00\x02\xff\xfe\x00\x00\x00\x00"],
    ids=["empty", "short-length", "string-overrun", "bad-utf8"],
)
def test_malformed_bodies(body: bytes) -> None:
    for api_key in (m.ApiKey.PRODUCE, m.ApiKey.DESCRIBE_TOPIC, m.ApiKey.SUBSCRIBE):
        if api_key == m.ApiKey.DESCRIBE_TOPIC and body == b"\x00\x02\xff\xfe\x00\x00\x00\x00":
            body = b"\x00\x02\xff\xfe"
        with pytest.raises(MalformedFrame):
            decode_request(FrameHeader(api_key, 0, 1, 0), body)


def test_error_for_unknown_code_is_still_an_error() -> None:
    frame_bytes = bytes.fromhex("00000012000c00000000000100010fff0004") + b"oops"
    (frame,) = FrameDecoder().feed(frame_bytes)
    assert isinstance(frame, Frame)
    with pytest.raises(Exception, match="error code 4095: oops"):
        decode_response(frame.header, frame.body)


def test_no_response_flag_travels_in_the_header() -> None:
    data = encode_request(m.FlowRequest(1, 5), 8, Flags.NO_RESPONSE)
    assert data[12:14] == b"\x00\x04"
    (frame,) = FrameDecoder().feed(data)
    assert isinstance(frame, Frame)
    assert not frame.header.wants_response
    assert FrameHeader(0, 0, 1, 0).wants_response
