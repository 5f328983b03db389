"""Locust load test: producers and map users against a Headwater server.

    pip install -e '.[bench]'
    headwater serve &                                   # or any server you can reach
    locust -f loadtest/locustfile.py --headless -u 50 -r 10 -t 60s \
        --host 127.0.0.1:6650                           # HOST:PORT of the server

Each user holds one `BlockingClient` (plain sockets, which locust's gevent makes cooperative).
`ProducerUser` sends batches of 100 records of 100 bytes to a non-reliable and a reliable topic;
`MapUser` reads and writes keys of a map topic. Every request is reported to locust with its
latency, so the web UI or `--csv` output shows throughput and percentiles per request type.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from typing import Any

from locust import User, between, events, task

from headwater.blocking import BlockingClient
from wire.errors import HeadwaterError, TopicExists

FAST, STORED, MAP = "locust-fast", "locust-stored", "locust-map"
RECORDS = [(None, b"x" * 100, ())] * 100


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


class HeadwaterUser(User):
    abstract = True
    wait_time = between(0.0, 0.01)

    def on_start(self) -> None:
        self.client = BlockingClient(self.host or "127.0.0.1:6650")

    def on_stop(self) -> None:
        self.client.close()

    def timed(self, name: str, call: Callable[[], Any], size: int = 0) -> None:
        started = time.perf_counter()
        error: Exception | None = None
        try:
            call()
        except HeadwaterError as exc:
            error = exc
        self.environment.events.request.fire(
            request_type="headwater",
            name=name,
            response_time=(time.perf_counter() - started) * 1000,
            response_length=size,
            exception=error,
            context={},
        )


class ProducerUser(HeadwaterUser):
    @task(3)
    def produce_fast(self) -> None:
        self.timed("produce non-reliable x100", lambda: self.client.produce(FAST, RECORDS), 10_000)

    @task(1)
    def produce_stored(self) -> None:
        self.timed("produce reliable x100", lambda: self.client.produce(STORED, RECORDS), 10_000)


class MapUser(HeadwaterUser):
    @task(4)
    def get(self) -> None:
        key = f"key{random.randrange(1000)}".encode()
        self.timed("map get", lambda: self.client.map_get(MAP, key))

    @task(1)
    def set(self) -> None:
        key = f"key{random.randrange(1000)}".encode()
        self.timed("map set", lambda: self.client.map_set(MAP, key, b"v" * 100), 100)
