"""Live subscriptions (non-reliable topics, or durable none): who gets each batch, and when.

A subscription holds a bounded backlog of batches not yet sent and the consumers attached to it.
`drain` sends from the backlog's head while some consumer may take it: it has credit (messages it
granted with FLOW and has not yet received) and its socket is not backed up. The subscription type
picks that consumer (`durables.group.ConsumerGroup`): Exclusive the single one, Failover the
active one of the batch's partition (when it leaves, the next takes over with the backlog still in
place), Shared the one with the most credit, so batches spread by available permits. Key_Shared
cuts a batch by key: each record goes to its key's owner on the hash ring, runs of records for one
consumer as one batch; the backlog's head waits while the owner of its first record cannot take it.

A batch holding more records than the chosen consumer's credit is split (re-encoded) at the credit,
so no consumer ever receives more than it granted. A batch of a partition that none of the
consumers chose (SUBSCRIBE's `partitions`) is discarded: nobody wants it. When the backlog is
full, in messages (`subscription_backlog`) or in bytes (`subscription_backlog_bytes`, and the
server's `memory_budget.MemoryBudget`, where the batches count against the share of the principal
that made the subscription), new batches are dropped and counted: a slow consumer costs bounded
memory and never stalls a producer. The drop is not silent: the consumer that
receives the subscription's next delivery first gets a MESSAGES_DROPPED push with the number of
messages dropped since the previous notice (one notice, however many batches were dropped).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import structlog

from headwater.durables.group import ConsumerGroup
from headwater.durables.lastvalue import StoredValue
from headwater.server.memory_budget import MemoryBudget
from headwater.server.subscriptions.key_shared_round import record_hash
from headwater.server.topics.subscription_contract import Consumer, ConsumerSession, Feed
from headwater.wire.errors import InvalidRequest
from headwater.wire.messages import AckEntry, AckRange, Durable, SubscriptionInfo, SubscriptionType
from headwater.wire.records import Record, read_records, rebuild_batch, split_batch

__all__ = ["Consumer", "ConsumerSession", "Subscription", "failover_logger"]

# What holding a batch costs beyond its bytes (the bytes object's header, the entry's tuple and
# its deque slot), charged with them: a backlog of tiny batches is bounded by what it really
# holds, not by its payload alone.
ENTRY_OVERHEAD = 128

log = structlog.get_logger(__name__)


def failover_logger(topic: str, name: str) -> Callable[[Consumer | None], None]:
    def elected(active: Consumer | None) -> None:
        log.info(
            "subscription.failover",
            topic=topic,
            subscription=name,
            active=active.name if active else None,
        )

    return elected


class Subscription:
    durable = Durable.NONE
    persistent = False
    feed = Feed.BATCHES

    def __init__(
        self,
        topic: str,
        name: str,
        sub_type: SubscriptionType,
        backlog_limit: int,
        backlog_bytes: int = 1 << 62,
        memory: MemoryBudget | None = None,
        principal: str = "",
    ) -> None:
        """`principal`: whose memory share the backlog is charged to (the one that made it)."""
        self.topic = topic
        self.principal = principal
        self.name = name
        self.sub_type = sub_type
        self.group: ConsumerGroup[Consumer] = ConsumerGroup(
            topic, name, sub_type, failover_logger(topic, name)
        )
        self.consumers = self.group.consumers
        self._backlog: deque[tuple[int, bytes, int]] = deque()
        self._backlog_count = 0
        self._backlog_limit = backlog_limit
        self._bytes = 0  # of the batches in the backlog, charged to `_memory`
        self._bytes_limit = backlog_bytes
        self._memory = memory or MemoryBudget(1 << 62)
        self.delivered = 0
        self.dropped = 0
        self._unreported = 0  # dropped since the last MESSAGES_DROPPED notice

    def attach(self, consumer: Consumer) -> None:
        self.group.add(consumer, consumer.partitions)

    def detach(self, consumer: Consumer) -> None:
        if self.group.remove(consumer):
            self.drain()

    def grant(self, consumer: Consumer, credits: int) -> None:
        self.group.grant(consumer, credits)
        self.drain()

    def offer(self, partition: int, batch: bytes, count: int) -> None:
        size = len(batch) + ENTRY_OVERHEAD
        if (
            self._backlog_count + count > self._backlog_limit
            # one batch is always let into an empty backlog: a cap below the largest batch
            # would otherwise starve the subscription
            or (self._bytes + size > self._bytes_limit and self._backlog)
            or not self._memory.take(size, self.principal)
        ):
            self.dropped += count
            self._unreported += count
            return
        self._backlog.append((partition, batch, count))
        self._backlog_count += count
        self._bytes += size
        self.drain()

    def _pop_head(self) -> None:
        _, batch, count = self._backlog.popleft()
        self._backlog_count -= count
        self._release(len(batch) + ENTRY_OVERHEAD)

    def _replace_head(self, partition: int, rest: bytes, count: int) -> None:
        _, batch, before = self._backlog[0]
        self._backlog[0] = (partition, rest, count)
        self._backlog_count -= before - count
        self._release(len(batch) - len(rest))

    def _release(self, size: int) -> None:
        self._bytes -= size
        self._memory.give_back(size, self.principal)

    def drop_backlog(self) -> None:
        """The subscription ends: its batches are let go, their bytes given back."""
        self._backlog.clear()
        self._backlog_count = 0
        self._release(self._bytes)

    def drain(self) -> None:
        backlog = self._backlog
        while backlog:
            partition, batch, count = backlog[0]
            if self.sub_type == SubscriptionType.KEY_SHARED:
                if not self._drain_keyed(partition, batch, count):
                    return
                continue
            target = self._target(partition)
            if target is None:
                if self.group.chosen and not self.group.takes(partition):
                    self._pop_head()  # its consumers chose other partitions: nobody wants it
                    continue
                return
            if count <= target.credits:
                self._pop_head()
                sent = count
            else:
                sent = target.credits
                batch, rest = split_batch(batch, sent)
                self._replace_head(partition, rest, count - sent)
            self.group.charge(target, sent)
            self.delivered += sent
            if self._unreported:  # coalesced: one notice for every drop since the last one
                target.session.send_messages_dropped(target.consumer_id, self._unreported)
                self._unreported = 0
            target.session.send_delivery(target.consumer_id, partition, batch)

    def _target(self, partition: int) -> Consumer | None:
        return self.group.pick_for(partition)

    def _drain_keyed(self, partition: int, batch: bytes, count: int) -> bool:
        """Key_Shared: send the head batch's records to their keys' owners, in runs, as far as
        they can take them; False when the head's first record cannot go now."""
        records = read_records(batch)
        taken: dict[int, int] = {}
        plan: list[tuple[Consumer, Record]] = []
        for record in records:
            owner = self.group.key_owner(record_hash(partition, record))
            if (
                owner is None
                or not owner.session.writable
                or owner.credits - taken.get(owner.consumer_id, 0) <= 0
            ):
                break
            taken[owner.consumer_id] = taken.get(owner.consumer_id, 0) + 1
            plan.append((owner, record))
        if not plan:
            return False
        if len(plan) < len(records):
            self._replace_head(partition, rebuild_batch(records[len(plan) :]), count - len(plan))
        else:
            self._pop_head()
        self.delivered += len(plan)
        at = 0
        while at < len(plan):
            owner = plan[at][0]
            end = at + 1
            while end < len(plan) and plan[end][0] is owner:
                end += 1
            self.group.charge(owner, end - at)
            if self._unreported:
                owner.session.send_messages_dropped(owner.consumer_id, self._unreported)
                self._unreported = 0
            if at == 0 and end == len(records):  # one owner for the whole batch: as it came
                owner.session.send_delivery(owner.consumer_id, partition, batch)
            else:
                run = [record for _, record in plan[at:end]]
                owner.session.send_delivery(owner.consumer_id, partition, rebuild_batch(run))
            at = end
        return True

    def ack(self, consumer: Consumer, entries: Sequence[AckEntry], kind: int) -> None:
        """Non-reliable topics keep nothing to acknowledge: acks are accepted and ignored."""

    def ack_ranges(self, consumer: Consumer, ranges: Sequence[AckRange]) -> None:
        """As `ack`: accepted and ignored."""

    def nack(self, consumer: Consumer, entries: Sequence[AckEntry], delay_ms: int) -> None:
        """Nothing is kept to deliver again: nacks are accepted and ignored."""

    def changed(self, changes: Sequence[StoredValue]) -> None:
        """Fed batches, not last values."""

    def seek(self, offsets: list[int]) -> None:
        raise InvalidRequest(
            f"subscription {self.name!r} of topic {self.topic!r} is not a reliable one: "
            "only those can seek"
        )

    async def close(self) -> None:
        self.drop_backlog()

    def info(self) -> SubscriptionInfo:
        return SubscriptionInfo(
            name=self.name,
            sub_type=self.sub_type,
            pending=self._backlog_count,
            delivered=self.delivered,
            dropped=self.dropped,
            consumers=self.group.infos(),
        )
