"""The sans-I/O client session (wire/session.py), driven with bytes and a fake clock."""

from __future__ import annotations

from headwater.wire import messages as m
from headwater.wire.api.produce import delivery_prefix
from headwater.wire.errors import (
    AuthenticationFailed,
    ConnectionClosed,
    ConnectionLost,
    HeadwaterError,
    TopicExists,
    UnknownTopic,
)
from headwater.wire.frames import Flags, FrameDecoder
from headwater.wire.protocol import decode_request, encode_error, encode_push, encode_response
from headwater.wire.session import Answer, ClientSession


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Handler:
    def __init__(self) -> None:
        self.deliveries: list[m.Delivery] = []
        self.closed: list[HeadwaterError] = []
        self.dropped: list[int] = []

    def on_delivery(self, delivery: m.Delivery) -> None:
        self.deliveries.append(delivery)

    def on_closed(self, error: HeadwaterError) -> None:
        self.closed.append(error)

    def on_dropped(self, count: int) -> None:
        self.dropped.append(count)


def test_requests_get_increasing_ids_and_their_own_answers() -> None:
    session = ClientSession(Clock())
    first, second = Answer(), Answer()
    id1, frame1 = session.request(m.DeleteTopicRequest("a"), first)
    id2, _ = session.request(m.DescribeTopicRequest("b"), second)
    assert id2 == id1 + 1
    (decoded,) = FrameDecoder().feed(frame1)
    assert decode_request(decoded.header, decoded.body) == m.DeleteTopicRequest("a")  # type: ignore[union-attr]
    # answered out of order: each goes to its own waiter
    error = encode_error(m.ApiKey.DESCRIBE_TOPIC, 0, id2, UnknownTopic("no b"))
    assert (
        session.receive(error + encode_response(m.ApiKey.DELETE_TOPIC, id1, m.EmptyResponse()))
        is None
    )
    assert first.result() == m.EmptyResponse()
    assert isinstance(second.error, UnknownTopic)
    assert session.pending == {}


def test_a_refusal_of_a_no_response_frame_goes_to_on_unsolicited_error() -> None:
    session = ClientSession(Clock())
    refusals: list[HeadwaterError] = []
    session.on_unsolicited_error = refusals.append
    correlation_id, frame = session.request(m.CreateTopicRequest("t", 1, 0), None)
    (decoded,) = FrameDecoder().feed(frame)
    assert decoded.header.flags & Flags.NO_RESPONSE  # type: ignore[union-attr]
    session.receive(encode_error(m.ApiKey.CREATE_TOPIC, 0, correlation_id, TopicExists("t")))
    assert [type(e) for e in refusals] == [TopicExists]


def test_on_response_runs_before_the_frames_that_follow() -> None:
    session = ClientSession(Clock())
    handler = Handler()
    answer = Answer()
    cid, _ = session.request(
        m.UnsubscribeRequest(1), answer, lambda r: session.consumers.__setitem__(7, handler)
    )
    data = encode_response(m.ApiKey.SUBSCRIBE, cid, m.SubscribeResponse(7))
    data += delivery_prefix(7, 0, 3) + b"abc"
    session.receive(data)
    assert answer.result() == m.SubscribeResponse(7)
    assert handler.deliveries == [m.Delivery(0, 1, b"abc")]


def test_pushes_are_routed_by_consumer_id_and_consumer_closed_unregisters() -> None:
    session = ClientSession(Clock())
    one, two = Handler(), Handler()
    session.consumers.update({1: one, 2: two})
    session.receive(
        delivery_prefix(2, 3, 1, 2)
        + b"x"
        + encode_push(1, m.MessagesDropped(5))
        + encode_push(1, m.ConsumerClosed(int(UnknownTopic.code), "deleted"))
        + encode_push(2, m.ConsumerClosed(int(ConnectionClosed.code), "shutting"))
        + delivery_prefix(9, 0, 1)  # nobody: a delivery racing an unsubscribe, dropped
        + b"y"
    )
    assert two.deliveries == [m.Delivery(3, 2, b"x")]
    assert one.dropped == [5]
    assert [type(e) for e in one.closed] == [UnknownTopic]
    assert [type(e) for e in two.closed] == [ConnectionLost]  # the server never means "quietly"
    assert session.consumers == {}


def test_unrouted_pushes_go_to_on_push_when_set() -> None:
    session = ClientSession(Clock())
    seen: list[tuple[int, m.Push]] = []
    session.on_push = lambda consumer, push: seen.append((consumer, push))
    session.receive(encode_push(4, m.MessagesDropped(2)))
    assert seen == [(4, m.MessagesDropped(2))]


def test_throttle_holds_produce_on_the_session_clock() -> None:
    clock = Clock()
    session = ClientSession(clock)
    assert session.throttle_delay() == 0.0
    session.receive(encode_push(0, m.Throttle(250)) + encode_push(0, m.Throttle(100)))
    assert session.throttled_until == 100.25  # the longer hold wins
    assert session.throttles == 2
    clock.now = 100.2
    assert abs(session.throttle_delay() - 0.05) < 1e-9
    clock.now = 101.0
    assert session.throttle_delay() == 0.0


def test_a_revoked_credential_is_fatal_and_garbage_is_reported_not_raised() -> None:
    session = ClientSession(Clock())
    revoked = encode_error(m.ApiKey.AUTHENTICATE, 0, 0, AuthenticationFailed("expired"))
    assert isinstance(session.receive(revoked), AuthenticationFailed)
    other = ClientSession(Clock())
    assert isinstance(other.receive(b"\xff\xff\xff\xff" + bytes(20)), HeadwaterError)


def test_fail_fails_every_pending_request_and_close_consumers_tells_each() -> None:
    session = ClientSession(Clock())
    waiting = [Answer(), Answer()]
    for answer in waiting:
        session.request(m.ListTopicsRequest(), answer)
    session.produce(m.ProduceRequest("t", 0, b""), waiting[0])
    handler = Handler()
    session.consumers[3] = handler
    lost = ConnectionLost("gone")
    session.fail(lost)
    session.close_consumers(lost)
    assert all(a.error is lost for a in waiting)
    assert handler.closed == [lost]
    assert session.pending == {} and session.consumers == {}


def test_a_forgotten_request_ignores_its_late_answer() -> None:
    session = ClientSession(Clock())
    answer = Answer()
    cid, _ = session.request(m.ListTopicsRequest(), answer)
    assert session.forget(cid) is answer
    session.receive(encode_response(m.ApiKey.LIST_TOPICS, cid, m.ListTopicsResponse(())))
    assert not answer.done()
