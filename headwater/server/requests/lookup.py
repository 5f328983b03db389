"""LOOKUP: which broker owns each partition of the topics a client names.

Any broker answers for every topic, from its `server.requests.partition_ownership.Ownership` (the
live brokers and each partition's owner as last seen) and the catalog (how many partitions a topic
has). An unknown topic is reported in that topic's entry (UNKNOWN_TOPIC), not as a failed request,
so one stale name does not hide the others. A partition nobody owns now (a failover under way) has
broker id "". The partition's epoch comes from the ownership's optional
`owner_epoch(topic, partition)` (the coordinator's; 0 on a single broker), and the answer's
`lease_ms` from its optional `lease_ms` (the lease etcd granted this broker), which clients tie
their check of a silent owner to (docs/CLUSTER.md, "Failover as a producer sees it").

Version 1 is also a long poll: with `max_wait_ms` and `wait_for` (partitions with the owner epoch
the client knows), the answer waits until one of them is owned under a newer epoch, as this broker
sees it, or can never be (its topic gone, the partition past the count), or the time is up. It
looks again at every change the ownership reports (`Ownership.changed`: an owner key made or
gone, a take-over done), so a client waiting out a failover hears of the new owner the moment its
ownership key exists instead of asking every 125-250 ms. The wait holds no turn, and counts
among the connection's waiting requests (`AfterOwner`: at MAX_WAITING_REQUESTS the connection is
not read until one is answered): 50,000 long polls pipelined on one connection held 72 MiB.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from headwater.server.reply import AfterOwner, Reply
from headwater.server.request_table import handles
from headwater.server.requests.partition_ownership import Ownership
from headwater.server.topics.topic import Topic
from headwater.wire import messages as m
from headwater.wire.errors import InvalidRequest
from headwater.wire.limits import MAX_LOOKUP_TOPICS, MAX_LOOKUP_WAIT_MS, MAX_LOOKUP_WAITS

# bounds a long poll's looks (each follows a change the ownership reported)
_MAX_LOOKS = 100_000


class LookupHandler:
    def __init__(self, ownership: Ownership, topics: Mapping[str, Topic]) -> None:
        self._ownership = ownership
        self._topics = topics
        # the owner's epoch as this broker last saw it (the coordinator's; 0 on a single broker)
        self._epoch: Callable[[str, int], int] = getattr(ownership, "owner_epoch", _no_epoch)

    @handles(m.LookupRequest)  # answered only for topics with a grant (security.access)
    def lookup(self, session: object, request: m.LookupRequest) -> Reply:
        if len(request.topics) > MAX_LOOKUP_TOPICS:
            raise InvalidRequest(
                f"LOOKUP names {len(request.topics)} topics; at most {MAX_LOOKUP_TOPICS} at once"
            )
        if len(request.wait_for) > MAX_LOOKUP_WAITS:
            raise InvalidRequest(
                f"LOOKUP waits for {len(request.wait_for)} partitions; at most {MAX_LOOKUP_WAITS}"
            )
        if not 0 <= request.max_wait_ms <= MAX_LOOKUP_WAIT_MS:
            raise InvalidRequest(f"LOOKUP max_wait_ms must be 0..{MAX_LOOKUP_WAIT_MS}")
        negative = next((w for w in request.wait_for if w.partition < 0), None)
        if negative is not None:
            raise InvalidRequest(
                f"LOOKUP waits for partition {negative.partition} of topic {negative.topic!r}"
            )
        if request.max_wait_ms == 0 or not request.wait_for or self._moved(request.wait_for):
            return self._answer(request)
        return AfterOwner(self._long_poll(request))

    def _moved(self, waits: tuple[m.LookupWait, ...]) -> bool:
        """Whether a partition waited for is owned under a newer epoch than the client knew,
        or will never be (its topic gone, or the partition past the topic's count)."""
        for wait in waits:
            topic = self._topics.get(wait.topic)
            if topic is None or wait.partition >= topic.info.partitions:
                return True
            if (
                self._ownership.owner(wait.topic, wait.partition) is not None
                and self._epoch(wait.topic, wait.partition) > wait.epoch
            ):
                return True
        return False

    async def _long_poll(self, request: m.LookupRequest) -> m.LookupResponse:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.max_wait_ms / 1000
        for _ in range(_MAX_LOOKS):
            left = deadline - loop.time()
            if left <= 0 or self._moved(request.wait_for):
                break
            # (never cancels the shared future: `asyncio.wait` only stops waiting on it)
            await asyncio.wait([self._ownership.changed()], timeout=left)
        return self._answer(request)

    def _answer(self, request: m.LookupRequest) -> m.LookupResponse:
        ownership = self._ownership
        brokers = tuple(
            m.LookupBroker(b.broker_id, b.host, b.port)
            for b in sorted(ownership.brokers(), key=lambda b: b.broker_id)
        )
        answers = []
        for name in request.topics:
            topic = self._topics.get(name)
            if topic is None:
                answers.append(m.LookupTopic.unknown(name))
                continue
            partitions = []
            for index in range(topic.info.partitions):
                owner = ownership.owner(name, index)
                broker_id = owner.broker_id if owner is not None else ""
                partitions.append(m.LookupPartition(index, broker_id, self._epoch(name, index)))
            answers.append(m.LookupTopic(name, 0, "", tuple(partitions)))
        return m.LookupResponse(brokers, tuple(answers), getattr(ownership, "lease_ms", 0))


def _no_epoch(topic: str, partition: int) -> int:
    return 0
