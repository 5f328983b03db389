"""Locust load test: producers per delivery semantic, consumers measuring end-to-end latency, and
map users, against a Headwater server.

    make loadtest                                       # starts a server, writes the HTML report
    locust -f loadtest/locustfile.py --headless -u 14 -r 14 -t 60s --host 127.0.0.1:6650

Each user holds one blocking connection (plain sockets, made cooperative by locust's gevent):
`loadtest/locust_wire.py`, or `headwater.client.blocking.BlockingClient` for the request/answer
users.

- `AtMostOnceProducer`: batches of 100 records to the non-reliable topic, sent with NO_RESPONSE
  (fire and forget); every 20th batch one round trip confirms the server refused none.
- `AtLeastOnceProducer`: batches of 100 to the reliable topic, each waiting for its ack.
- `IdempotentProducer`: the same with a producer id and sequence numbers (duplicates refused).
- `NonReliableConsumer` / `ReliableConsumer`: each subscribes (a subscription of its own), reads
  deliveries for a while, grants credit and acknowledges cumulatively; every record's value starts
  with its send time (wall clock, ns), so each record is reported as one "e2e latency" sample.
  Drops on the non-reliable topic (MESSAGES_DROPPED) are counted and logged, not failures.
- `MapUser`: gets and sets keys of a map topic.

Every request and every latency sample is reported to locust, so the HTML report, the web UI or
`--csv` show rates and percentiles per kind. A refusal, a lost connection or a closed consumer is
a failure.

With `HEADWATER_LOCUST_ENOUGH=N` in the environment the run ends as soon as every kind in `KINDS`
(loadtest/locust_run.py) has been reported N times (`-t` then only bounds it): a check that every
user kind works, which a fixed run time decided on a loaded machine (setting up took the whole
4 s: 0 requests).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import random
import struct
import time
from collections.abc import Callable
from typing import Any

import gevent
from locust import User, between, events, task
from locust.exception import StopUser

from headwater.client.blocking import BlockingClient
from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError, TopicExists
from headwater.wire.records import BatchBuilder, decode_records
from loadtest.locust_run import ENOUGH, KINDS
from loadtest.locust_wire import WireConnection

FAST, STORED, MAP = "locust-fast", "locust-stored", "locust-map"
STAMP = struct.Struct(">q")
BATCH = 100
PADDING = b"x" * (100 - STAMP.size)
_names = itertools.count()
dropped = [0]


@events.init.add_listener
def stop_when_every_kind_was_seen(environment: Any, **_: Any) -> None:
    enough = int(os.environ.get(ENOUGH) or 0)
    if enough <= 0:
        return
    seen = dict.fromkeys(KINDS, 0)

    def counted(name: str, **_: Any) -> None:
        if name not in seen or seen[name] >= enough:
            return
        seen[name] += 1
        if all(count >= enough for count in seen.values()) and environment.runner is not None:
            gevent.spawn(environment.runner.quit)  # not from this user's greenlet, which it kills

    environment.events.request.add_listener(counted)


@events.test_start.add_listener
def create_topics(environment: Any, **_: Any) -> None:
    with BlockingClient(environment.host or "127.0.0.1:6650") as client:
        for name, reliable, configs in (
            (FAST, False, None),
            (STORED, True, {"fsync": "interval"}),
            (MAP, True, {"fsync": "interval", "last.value": "true"}),
        ):
            with contextlib.suppress(TopicExists):
                client.create_topic(name, reliable=reliable, configs=configs)


@events.test_stop.add_listener
def report_drops(**_: Any) -> None:
    if dropped[0]:
        logging.info("non-reliable consumers were told of %d dropped messages", dropped[0])


def stamped_batch(builder: BatchBuilder) -> bytes:
    now = time.time_ns()
    for _ in range(BATCH):
        builder.append(None, STAMP.pack(now) + PADDING)
    return builder.build()


class HeadwaterUser(User):
    abstract = True
    wait_time = between(0.0, 0.01)

    def on_start(self) -> None:
        self.wire = WireConnection(self.host or "127.0.0.1:6650")

    def on_stop(self) -> None:
        self.wire.close()

    def report(
        self, name: str, started: float, size: int = 0, error: Exception | None = None
    ) -> None:
        self.environment.events.request.fire(
            request_type="headwater",
            name=name,
            response_time=(time.perf_counter() - started) * 1000,
            response_length=size,
            exception=error,
            context={},
        )

    def timed(self, name: str, call: Callable[[], Any], size: int = 0) -> None:
        started = time.perf_counter()
        error: Exception | None = None
        try:
            call()
        except HeadwaterError as exc:
            error = exc
        self.report(name, started, size, error)


class AtMostOnceProducer(HeadwaterUser):
    sent = 0

    @task
    def produce(self) -> None:
        request = m.ProduceRequest(FAST, -1, stamped_batch(BatchBuilder()))
        self.timed("produce at-most-once x100", lambda: self.wire.send(request), BATCH * 100)
        self.sent += 1
        if self.sent % 20 == 0:  # one round trip: the server has handled every frame before it
            self.timed("at-most-once confirm", self.confirm)

    def confirm(self) -> None:
        self.wire.call(m.ApiVersionsRequest())
        if self.wire.refusals:
            refusal, self.wire.refusals = self.wire.refusals[0], []
            raise refusal


class AtLeastOnceProducer(HeadwaterUser):
    @task
    def produce(self) -> None:
        request = m.ProduceRequest(STORED, -1, stamped_batch(BatchBuilder()))
        self.timed("produce at-least-once x100", lambda: self.wire.call(request), BATCH * 100)


class IdempotentProducer(HeadwaterUser):
    def on_start(self) -> None:
        super().on_start()
        answer = self.wire.call(m.InitProducerIdRequest())
        assert isinstance(answer, m.InitProducerIdResponse)
        self.producer_id, self.epoch, self.sequence = answer.producer_id, answer.producer_epoch, 0

    @task
    def produce(self) -> None:
        builder = BatchBuilder(
            producer_id=self.producer_id, producer_epoch=self.epoch, base_sequence=self.sequence
        )
        request = m.ProduceRequest(STORED, 0, stamped_batch(builder))
        self.timed("produce idempotent x100", lambda: self.wire.call(request), BATCH * 100)
        self.sequence += BATCH


class ConsumerUser(HeadwaterUser):
    abstract = True
    topic = ""
    acks = False  # cumulative acks, on reliable topics
    credits = 2000

    def on_start(self) -> None:
        super().on_start()
        request = m.SubscribeRequest(
            self.topic, f"locust-{next(_names)}-{id(self):x}", m.SubscriptionType.EXCLUSIVE,
            "locust", initial_credits=self.credits,
        )  # fmt: skip
        answer = self.wire.call(request)
        assert isinstance(answer, m.SubscribeResponse)
        self.consumer_id = answer.consumer_id
        self.taken = 0

    @task
    def receive(self) -> None:
        for push in self.wire.poll(0.2):
            if isinstance(push, m.Delivery):
                self.deliver(push)
            elif isinstance(push, m.MessagesDropped):
                dropped[0] += push.count
            elif isinstance(push, m.ConsumerClosed):
                self.fail(HeadwaterError(push.message))
                raise StopUser()
        if self.wire.refusals:  # a FLOW or ACK the server refused
            self.fail(self.wire.refusals.pop(0))

    def fail(self, error: Exception) -> None:
        self.report(f"e2e latency {self.topic}", time.perf_counter(), 0, error)

    def deliver(self, delivery: m.Delivery) -> None:
        now = time.time_ns()
        records = decode_records(delivery.batch, lambda offset, _t, _k, value, _h: (offset, value))
        fire = self.environment.events.request.fire
        for _, value in records:
            fire(
                request_type="headwater",
                name=f"e2e latency {self.topic}",
                response_time=(now - STAMP.unpack_from(value or bytes(8))[0]) / 1e6,
                response_length=len(value or b""),
                exception=None,
                context={},
            )
        if records and self.acks:
            entry = (m.AckEntry(delivery.partition, records[-1][0]),)
            self.wire.send(m.AckRequest(self.consumer_id, entry, m.AckKind.CUMULATIVE))
        self.taken += len(records)
        if self.taken * 2 >= self.credits:  # top credit up in halves, as the asyncio client does
            self.wire.send(m.FlowRequest(self.consumer_id, self.taken))
            self.taken = 0


class NonReliableConsumer(ConsumerUser):
    topic = FAST


class ReliableConsumer(ConsumerUser):
    topic = STORED
    acks = True


class MapUser(HeadwaterUser):
    @task(4)
    def get(self) -> None:
        key = f"key{random.randrange(1000)}".encode()
        self.timed("map get", lambda: self.wire.call(m.MapGetRequest(MAP, (key,))))

    @task(1)
    def set(self) -> None:
        key = f"key{random.randrange(1000)}".encode()
        write = m.MapSetRequest(MAP, (m.MapWrite(key, b"v" * 100),))
        self.timed("map set", lambda: self.wire.call(write), 100)
