"""A Kafka transactional producer spoken in raw frames: each step of a transaction on demand.

A stock client hides the steps (and forgets its broker when the server comes back on a new
port); the tests of what readers see of transactions need them one by one: a transaction left
open while other writes go on, a server killed with it open and the commit sent to the restarted
one. `RawTransaction` sends InitProducerId (with a transactional id), AddPartitionsToTxn,
Produce v3 of batches built with `BatchBuilder(transactional=True)` (the producer's sequence per
partition kept here), and EndTxn, over `RawKafka`, each answered before it returns.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from aiokafka.protocol.produce import ProduceRequest_v3, ProduceResponse_v3
from aiokafka.protocol.transaction import (
    AddPartitionsToTxnRequest_v0,
    AddPartitionsToTxnResponse_v0,
    EndTxnRequest_v0,
    EndTxnResponse_v0,
    InitProducerIdRequest_v0,
    InitProducerIdResponse_v0,
)

from headwater.wire.records import BatchBuilder
from tests.support.kafka_support import RawKafka

Records = Sequence[tuple[bytes | None, bytes | None]]  # (key, value); a None value: a tombstone


class RawTransaction:
    def __init__(self, port: int, transactional_id: str, timeout_ms: int = 60_000) -> None:
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.raw = RawKafka(port)
        self._correlation = itertools.count(1)
        self.producer_id = -1
        self.epoch = -1
        self._sequences: dict[tuple[str, int], int] = {}
        self._added: set[tuple[str, int]] = set()

    def _call(self, api: int, version: int, body: bytes) -> bytes:
        correlation = next(self._correlation)
        self.raw.request(api, version, correlation, body)
        got, answer = self.raw.response()
        assert got == correlation
        return answer

    def reconnect(self, port: int) -> None:
        """The server restarted (on a new port): go on with the same producer id and epoch."""
        self.raw.sock.close()
        self.raw = RawKafka(port)

    def init(self) -> RawTransaction:
        answer = self._call(
            22, 0, InitProducerIdRequest_v0(self.transactional_id, self.timeout_ms).encode()
        )
        decoded = InitProducerIdResponse_v0.decode(answer)
        assert decoded.error_code == 0, decoded
        self.producer_id, self.epoch = decoded.producer_id, decoded.producer_epoch
        self._sequences.clear()
        return self

    def produce(self, topic: str, partition: int, records: Records) -> int:
        """Append `records` as one transactional batch (adding the partition to the transaction
        first); the base offset it got."""
        if (topic, partition) not in self._added:
            body = AddPartitionsToTxnRequest_v0(
                self.transactional_id, self.producer_id, self.epoch, [(topic, [partition])]
            ).encode()
            answer = AddPartitionsToTxnResponse_v0.decode(self._call(24, 0, body))
            assert all(e == 0 for _, results in answer.errors for _, e in results), answer
            self._added.add((topic, partition))
        sequence = self._sequences.get((topic, partition), 0)
        builder = BatchBuilder(
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            base_sequence=sequence,
            transactional=True,
        )
        for record_key, value in records:
            builder.append(record_key, value)
        body = ProduceRequest_v3(
            self.transactional_id, -1, 30_000, [(topic, [(partition, builder.build())])]
        ).encode()
        answer = ProduceResponse_v3.decode(self._call(0, 3, body))
        ((_, ((_, error, offset, _),)),) = answer.topics
        assert error == 0, answer
        self._sequences[(topic, partition)] = sequence + len(records)
        return int(offset)

    def end(self, commit: bool) -> None:
        """EndTxn: answered once every marker is written (and the decision stored)."""
        body = EndTxnRequest_v0(self.transactional_id, self.producer_id, self.epoch, commit)
        answer = EndTxnResponse_v0.decode(self._call(26, 0, body.encode()))
        assert answer.error_code == 0, answer
        self._added.clear()

    def close(self) -> None:
        self.raw.sock.close()
