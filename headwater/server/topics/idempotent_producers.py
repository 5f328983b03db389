"""Idempotent producers: the ids handed out, and each one's recent batches per partition.

Ids are counted in memory (`meta/next-producer-id` in RocksDB is read once at start), so checking
that a produce's id was issued costs no read. Handing out an id writes the new counter through the
`StateWriter` (synced) and the INIT_PRODUCER_ID answer waits for it: an id is never issued twice,
even across a power loss.

After each idempotent append to a reliable topic the producer's entry for that partition
(`durables.producers.ProducerEntry`) is written to `producer/<topic>\\0<partition>\\0<id>`,
synced when the topic's fsync policy is `always` (the produce's answer then waits for it, as it
waits for the WAL's fsync). On start the entries are loaded, then completed from the batches the
WAL's recovery found (the state is written just after the append, so it can miss the newest).
"""

from __future__ import annotations

import asyncio

from headwater.durables.producers import ProducerEntry
from headwater.server.topics.topic import LogTopic, Topic
from headwater.storage.state import NEXT_PRODUCER_ID, PRODUCER, StateWriter, key
from headwater.storage.wal import FsyncPolicy
from headwater.wire.records import CONTROL_FLAG


class ProducerIds:
    def __init__(self, writer: StateWriter) -> None:
        self._writer = writer
        self._next = int(writer.store.get(NEXT_PRODUCER_ID) or b"0")

    def issue(self) -> tuple[int, asyncio.Future[None]]:
        """A new id, and the synced write of the counter to wait for before answering."""
        producer_id = self._next
        self._next += 1
        return producer_id, self._writer.synced({NEXT_PRODUCER_ID: str(self._next).encode()})

    def issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < self._next

    def save(
        self, topic: LogTopic, partition: int, producer_id: int, entry: ProducerEntry
    ) -> asyncio.Future[None] | None:
        """Persist a producer's state with the batch it just appended; the synced write to
        wait for, under fsync `always`."""
        return self._writer.write(
            {key(PRODUCER, topic.name, partition, producer_id): entry.encode()},
            sync=topic.settings.fsync == FsyncPolicy.ALWAYS,
        )

    def load(self, topics: dict[str, Topic]) -> None:
        for raw_key, value in self._writer.store.scan(PRODUCER):
            topic_name, index, producer_id = raw_key.decode().split("\0")
            owner = topics.get(topic_name)
            if owner is not None and int(index) < len(owner.partitions):
                table = owner.partitions[int(index)].producers
                table.producers[int(producer_id)] = ProducerEntry.decode(value)
        for topic in topics.values():
            if not topic.reliable:
                continue
            for partition in topic.partitions:
                partition.forget_lost_producer_batches()
                for found in partition.log.recovered_batches():
                    # (a marker is no producer's batch: it fences, `transaction_index`)
                    if found.producer_id >= 0 and not found.attributes & CONTROL_FLAG:
                        partition.producers.recover(
                            found.producer_id,
                            found.base_sequence,
                            found.next_offset - found.base_offset,
                            found.base_offset,
                            found.producer_epoch,
                        )
