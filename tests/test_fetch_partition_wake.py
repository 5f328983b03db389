"""A FETCH long poll waits for its own partition: appends to the topic's other partitions do not
wake it.

The poll (`server.requests.fetch.FetchHandler._wait`) waits on the topic's `AppendSignal`, which
every partition log of the topic fires on each append and each advance of its durable offset. It
used to join the signal for the whole topic: a poll at the end of a quiet partition of a busy
topic went round its loop (a wake-up, the checks, a new join) once per append to any other
partition, up to `_MAX_WAKEUPS`. Now each log tells the signal its partition
(`SubscriptionStore.signal`) and the poll joins for its partition only.

Real parts: two `PartitionLog`s on `fsync=always`, a `LogTopic`, the `SubscriptionStore` that makes
and registers the signal, and the `FetchHandler`, whose poll is counted at each look at the
partition's end. No server, no sockets: the poll is the `AfterData` work the connection awaits.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from headwater.server.config import ServerConfig, TopicSettings
from headwater.server.reply import AfterData
from headwater.server.requests.fetch import FetchHandler
from headwater.server.requests.partition_ownership import BrokerAddress, SingleBroker
from headwater.server.subscriptions.reliable_store import SubscriptionStore
from headwater.server.topics.placement import LocalPlacement
from headwater.server.topics.subscription_contract import ConsumerSession
from headwater.server.topics.topic import LogTopic
from headwater.server.topics.topic_settings import log_config
from headwater.storage.state import StateStore, StateWriter
from headwater.storage.wal import PartitionLog
from headwater.wire import messages as m
from headwater.wire.limits import MAX_FETCH_WAIT_MS
from headwater.wire.records import build_batch, read_records

_OTHER_APPENDS = 20
_WAIT = 5.0  # seconds: bounds a hang; the answer comes as soon as partition 0 has data


class CountingFetch(FetchHandler):
    """Counts the poll's looks at the partition's end (`_check`), one per wake-up."""

    looks = 0

    def _check(self, topic: LogTopic, request: m.FetchRequest) -> int:
        self.looks += 1
        return super()._check(topic, request)


async def _append(partition_log: PartitionLog, value: bytes) -> None:
    _, sequence = partition_log.append(build_batch([(None, value, [])]), 1)
    await partition_log.wait_durable(sequence)


async def test_a_long_poll_is_not_woken_by_the_other_partitions(tmp_path: Path) -> None:
    settings = TopicSettings()  # fsync always: each append fires, and its fsync fires again
    logs = [PartitionLog.open(tmp_path / "polled" / str(p), log_config(settings)) for p in range(2)]
    for partition_log in logs:
        partition_log.start()
    topic = LogTopic(m.TopicInfo("polled", 2, m.DispatchMode.RELIABLE), settings, logs)
    state = StateStore(tmp_path / "state")
    writer = StateWriter(state)
    subscriptions = SubscriptionStore(ServerConfig(), writer, cast(Any, None), LocalPlacement())
    handler = CountingFetch(
        cast(Any, SimpleNamespace(topics={"polled": topic}, subscriptions=subscriptions)),
        SingleBroker(BrokerAddress("local", "127.0.0.1", 0)),
    )
    try:
        reply = handler.fetch(
            cast(ConsumerSession, None),
            m.FetchRequest("polled", 0, 0, max_wait_ms=MAX_FETCH_WAIT_MS),
        )
        assert isinstance(reply, AfterData)
        poll = asyncio.ensure_future(reply.work)
        await asyncio.sleep(0)  # the poll runs to its wait
        looks_waiting = handler.looks
        for i in range(_OTHER_APPENDS):
            await _append(logs[1], b"other-%d" % i)
            await asyncio.sleep(0)  # a woken poll would look again here
        assert not poll.done()
        assert handler.looks == looks_waiting, (
            f"{handler.looks - looks_waiting} wake-ups for appends to partition 1"
        )
        await _append(logs[0], b"mine")
        answer = await asyncio.wait_for(poll, _WAIT)
        assert isinstance(answer, m.FetchResponse) and answer.end_offset == 1
        assert [r.value for r in read_records(answer.records)] == [b"mine"]
    finally:
        for partition_log in logs:
            await partition_log.close()
        state.close()
