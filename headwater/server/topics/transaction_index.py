"""Each reliable partition's transactions (`durables.partition_transactions`), kept across restarts.

What changes is written to the state store as the appends make it: a transaction opening in a
partition (`txnopen/<topic>\\0<partition>\\0<producer id>` = its first offset, deleted by its
marker) and an abort (`txnaborted/<topic>\\0<partition>\\0<marker offset>` = producer id, first
offset). A marker's write, and the producer entry its epoch fenced, are synced (a transaction's
end waits for them: its coordinator stores COMPLETE only after), the opening as the topic's
fsync policy says, like the producer entries.

On start the stored state is loaded, what a crash took from the WAL's end is forgotten
(`forget_from` the end the recovery found), and the batches recovery found in the last segment
are followed again: the state is written just after the append, so it can miss the newest
(a marker among them is read back for its type). Aborted ranges below a partition's start are
dropped as retention moves it (`forget_below`).
"""

from __future__ import annotations

import asyncio
import struct

import structlog

from headwater.durables.partition_transactions import AbortedRange, Closed, Opened
from headwater.server.topics.topic import LogPartition, LogTopic, Topic
from headwater.storage.state import (
    PRODUCER,
    TXN_ABORTED,
    TXN_OPEN,
    StateStore,
    StateWriter,
    key,
)
from headwater.storage.wal import FsyncPolicy
from headwater.wire.markers import BatchHeader, marker_type
from headwater.wire.records import CONTROL_FLAG, TRANSACTIONAL_FLAG

log = structlog.get_logger(__name__)

_OFFSET = struct.Struct(">q")
_ABORTED = struct.Struct(">qq")  # producer id, first offset


class TransactionIndexes:
    def __init__(self, writer: StateWriter) -> None:
        self._writer = writer

    def attach(self, topic: LogTopic) -> None:
        topic.on_transaction = self.changed

    def changed(
        self, topic: LogTopic, partition: LogPartition, change: Opened | Closed, header: BatchHeader
    ) -> asyncio.Future[None] | None:
        index = partition.index
        producer = change.producer_id
        opened = key(TXN_OPEN, topic.name, index, producer)
        if isinstance(change, Opened):
            return self._writer.write(
                {opened: _OFFSET.pack(change.first_offset)},
                sync=topic.settings.fsync == FsyncPolicy.ALWAYS,
            )
        puts: dict[bytes, bytes] = {}
        if change.aborted is not None:
            aborted = change.aborted
            puts[key(TXN_ABORTED, topic.name, index, aborted.last_offset)] = _ABORTED.pack(
                aborted.producer_id, aborted.first_offset
            )
        entry = partition.producers.producers.get(producer)
        if entry is not None:
            puts[key(PRODUCER, topic.name, index, producer)] = entry.encode()
        return self._writer.synced(puts, [opened])

    async def load(self, topics: dict[str, Topic]) -> None:
        """The stored state of every reliable partition, then the WAL's recovered batches."""
        opened: dict[tuple[str, int], dict[int, int]] = {}
        for raw_key, value in self._writer.store.scan(TXN_OPEN):
            parsed = _parse(raw_key, TXN_OPEN, value, _OFFSET)
            if parsed is not None:
                (name, index, producer), (first,) = parsed
                opened.setdefault((name, index), {})[producer] = first
        aborted: dict[tuple[str, int], list[AbortedRange]] = {}
        for raw_key, value in self._writer.store.scan(TXN_ABORTED):
            parsed = _parse(raw_key, TXN_ABORTED, value, _ABORTED)
            if parsed is not None:
                (name, index, last), (producer, first) = parsed
                aborted.setdefault((name, index), []).append(AbortedRange(producer, first, last))
        for topic in topics.values():
            if not topic.reliable:
                continue
            self.attach(topic)
            for partition in topic.partitions:
                where = (topic.name, partition.index)
                state = partition.transactions
                state.restore(opened.get(where, {}), aborted.get(where, []))
                state.forget_from(partition.log.data_end)
                await self._follow_recovered(topic, partition)

    async def _follow_recovered(self, topic: LogTopic, partition: LogPartition) -> None:
        for found in partition.log.recovered_batches():
            if not found.attributes & TRANSACTIONAL_FLAG:
                continue
            control = bool(found.attributes & CONTROL_FLAG)
            header = BatchHeader(
                found.base_offset,
                found.next_offset,
                found.producer_id,
                found.producer_epoch,
                True,
                control,
            )
            marker = None
            if control:
                batches = await topic.read(partition.index, found.base_offset)
                if not batches:
                    log.error(
                        "transactions.marker_unreadable",
                        topic=topic.name,
                        partition=partition.index,
                        offset=found.base_offset,
                    )
                    continue
                marker = marker_type(batches[0])
                partition.producers.fence(found.producer_id, found.producer_epoch)
            change = partition.transactions.appended(header, marker)
            if change is not None:
                self.changed(topic, partition, change, header)

    def forget_below(self, topic: LogTopic, partition: LogPartition, start: int) -> None:
        """Retention moved the partition's start: aborted ranges wholly below it go."""
        gone = partition.transactions.forget_below(start)
        if gone:
            self._writer.write(
                deletes=[key(TXN_ABORTED, topic.name, partition.index, r.last_offset) for r in gone]
            )


def stored_abort_starts(
    store: StateStore, topic: str, partition: int, producer_id: int
) -> set[int]:
    """The first offsets of the producer's aborted ranges the state store holds for the
    partition: also those whose marker the WAL lost at its end (`forget_from` dropped them from
    the partition's state, not from the store)."""
    found = set()
    for _, value in store.scan(key(TXN_ABORTED, topic, partition) + b"\0"):
        if len(value) == _ABORTED.size:  # (a damaged one was told at load)
            producer, first = _ABORTED.unpack(value)
            if producer == producer_id:
                found.add(first)
    return found


def _parse(
    raw_key: bytes, prefix: bytes, value: bytes, layout: struct.Struct
) -> tuple[tuple[str, int, int], tuple[int, ...]] | None:
    """A stored key `<topic>\\0<partition>\\0<number>` (scanned under `prefix`) and its value;
    None, logged, when either cannot be read (damaged bytes: the WAL's recovered batches,
    followed next, bring back what the last segment holds; docs/TRANSACTIONS.md, "Damaged
    state")."""
    try:
        name, index, number = raw_key.decode().split("\0")
        return (name, int(index), int(number)), layout.unpack(value)
    except (ValueError, struct.error) as exc:
        log.error(
            "transactions.state_unreadable",
            key=(prefix + raw_key).decode(errors="backslashreplace"),
            error=str(exc),
        )
        return None
