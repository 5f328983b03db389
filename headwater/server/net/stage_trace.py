"""Where a message's time goes inside the server: sampled timestamps of each stage it passes.

With `trace_every` N > 0 (a server setting, off by default, or GET /debug/stages?every=N on a live
server), the message at each offset that is a multiple of N, in every partition, is traced: when the
read that completed its produce frame happened (`read`), when the produce handler returned with its
offset known (`appended`; missing when the handler first had to wait, for a turn of the topic say),
when its acknowledgement was handed to the connection (`answered`: after the fsync under fsync
`always`), and each time a batch holding it was handed to a consumer's connection (`dispatched`,
with the subscription's name). Handed, not sent: within a slice of frames the connection gathers its
output into one write at the slice's end (client_connection.SLICE_SECONDS, 2 ms at most). Choosing
by offset lets every stage decide on its own with nothing passed between them, and lets a client
that knows a message's offset (a consumer does) join its own timestamps to the server's: the
benchmarks (loadtest/stages.py) put enqueue, read, appended, dispatched, received and taken side by
side. A batch holding several traced offsets gives an event for each (the client may have merged
many sends into one batch).

Times are `time.monotonic_ns()`: Linux's CLOCK_MONOTONIC, one clock for every process on the
machine, so a client's time and the server's subtract. One event is a tuple; they go into a
bounded deque (`MAX_EVENTS`, the oldest dropped) that GET /debug/stages on the operator port
returns and empties. Only the Headwater protocol's produce and deliveries are traced, not the
Kafka listener's.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from typing import TYPE_CHECKING, Final

from headwater.wire.messages import ProduceResponse

if TYPE_CHECKING:
    from headwater.server.reply import Reply
    from headwater.server.topics.subscription_contract import Consumer

MAX_EVENTS: Final = 200_000
PER_BATCH: Final = 1000  # traced offsets of one batch at most

# RecordBatch v2 header: baseOffset at byte 0, recordCount at byte 57 (of 61).
_BASE_OFFSET = struct.Struct(">q")
_RECORD_COUNT = struct.Struct(">i")
_HEADER_SIZE = 61

# (stage, topic, partition, offset, monotonic ns, subscription or "")
Event = tuple[str, str, int, int, int, str]


class StageTrace:
    __slots__ = ("dropped", "events", "every")

    def __init__(self, every: int, limit: int = MAX_EVENTS) -> None:
        if every <= 0:
            raise ValueError(f"trace_every must be positive, not {every}")
        self.every = every
        self.events: deque[Event] = deque(maxlen=limit)
        self.dropped = 0  # events pushed out of the full deque before anyone took them

    def sampled(self, base: int, count: int) -> range:
        """The traced offsets in [base, base + count), the first `PER_BATCH` of them: a batch's
        declared count is the client's word (a non-reliable batch is not decoded), and a loop
        over it must stay short."""
        first = -(-base // self.every) * self.every
        return range(first, min(base + count, first + PER_BATCH * self.every), self.every)

    def _add(self, event: Event) -> None:
        if len(self.events) == self.events.maxlen:
            self.dropped += 1
        self.events.append(event)

    def produced(self, topic: str, batch: bytes, reply: Reply, read_ns: int) -> ProduceTrace | None:
        """A produce handled: a `ProduceTrace` to finish when it is answered, if its batch holds a
        traced offset (or if the offset is not known yet: the handler waits first)."""
        response = getattr(reply, "response", reply)  # AfterDurable knows it already
        count = _RECORD_COUNT.unpack_from(batch, 57)[0] if len(batch) >= _HEADER_SIZE else 0
        if type(response) is not ProduceResponse:
            return ProduceTrace(self, topic, count, read_ns, 0)
        if not self.sampled(response.base_offset, count):
            return None
        return ProduceTrace(self, topic, count, read_ns, time.monotonic_ns())

    def dispatched(self, consumer: Consumer | None, partition: int, batch: bytes) -> None:
        """A batch written to a consumer's connection."""
        if consumer is None or len(batch) < _HEADER_SIZE:
            return
        base = _BASE_OFFSET.unpack_from(batch, 0)[0]
        offsets = self.sampled(base, _RECORD_COUNT.unpack_from(batch, 57)[0])
        if offsets:
            subscription = consumer.subscription
            topic, name, now = subscription.topic, subscription.name, time.monotonic_ns()
            for offset in offsets:
                self._add(("dispatched", topic, partition, offset, now, name))

    def take(self) -> tuple[list[Event], int]:
        """Every event so far, oldest first, and how many were lost to the bound; then empty.
        A copy of the deque's references: cheap enough for the loop (the caller encodes them
        elsewhere)."""
        events, self.events = list(self.events), deque(maxlen=self.events.maxlen)
        dropped, self.dropped = self.dropped, 0
        return events, dropped


class ProduceTrace:
    """A sampled produce between its handling and its answer."""

    __slots__ = ("appended_ns", "count", "read_ns", "topic", "trace")

    def __init__(
        self, trace: StageTrace, topic: str, count: int, read_ns: int, appended_ns: int
    ) -> None:
        self.trace = trace
        self.topic = topic
        self.count = count
        self.read_ns = read_ns
        self.appended_ns = appended_ns  # 0: not known (the handler waited first)

    def answered(self, response: object) -> None:
        """Its answer was written: `response` says the partition and the offset."""
        if type(response) is not ProduceResponse:
            return  # refused: nothing was appended
        now = time.monotonic_ns()
        add = self.trace._add
        for offset in self.trace.sampled(response.base_offset, self.count):
            where = (self.topic, response.partition, offset)
            if self.read_ns:  # 0: read before tracing was turned on
                add(("read", *where, self.read_ns, ""))
            if self.appended_ns:
                add(("appended", *where, self.appended_ns, ""))
            add(("answered", *where, now, ""))
