"""Stock Kafka clients' transactional producers and isolation-aware readers, one shape for three.

`producer(client, bootstrap, transactional_id)` gives a blocking `TxnProducer` over
confluent-kafka (librdkafka), kafka-python or aiokafka (driven on an event loop of its own), so
one test body runs against each: `begin`, `send` (records to explicit partitions), `flush`,
`commit`, `abort`, `send_offsets` (a group's offsets in the transaction) and `close`.
`fenced(exc)` says whether an exception is the client's way of telling its producer was fenced
(librdkafka: a fatal error, `_FENCED` or PRODUCER_FENCED; the two Python clients: their
ProducerFenced or InvalidProducerEpoch errors).

`read(client, bootstrap, partitions, committed)` reads partitions from their start until each
position reaches the partition's end as ListOffsets tells it for the isolation level (the last
stable offset for read_committed, the high watermark otherwise), so "everything readable" is an
observed position, not a quiet period; each partition's records come back in offset order.
After a kill -9 a partition's end is past the offset lease's gap (docs/DURABILITY.md), which no
consumer position reaches until a record follows it: `seal` writes one (`SEAL`, which `values`
leaves out) to each partition first.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Final, TypeVar

T = TypeVar("T")

Partition = tuple[str, int]
Record = tuple[str, int, bytes]  # topic, partition, value
Seen = tuple[int, bytes | None, bytes]  # offset, key, value

CLIENTS: Final = ("confluent", "kafka-python", "aiokafka")
SEAL: Final = b"seal"
TIMEOUT: Final = 30.0  # seconds any one client call may take (a bound on a hang only)


class TxnProducer:
    """A transactional producer: the calls every client has, blocking."""

    def begin(self) -> None:
        raise NotImplementedError

    def send(self, records: Iterable[Record], key: bytes | None = None) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError

    def commit(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def send_offsets(self, group: str, offsets: dict[Partition, int]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class ConfluentProducer(TxnProducer):
    def __init__(self, bootstrap: str, transactional_id: str, **config: Any) -> None:
        from confluent_kafka import Producer

        self.bootstrap = bootstrap
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": transactional_id,
                "linger.ms": 5,
                **config,
            }
        )
        self.producer.init_transactions(TIMEOUT)

    def begin(self) -> None:
        self.producer.begin_transaction()

    def send(self, records: Iterable[Record], key: bytes | None = None) -> None:
        for topic, partition, value in records:
            self.producer.produce(topic, value, key, partition=partition)
        self.producer.poll(0)

    def flush(self) -> None:
        left = self.producer.flush(TIMEOUT)
        if left:
            raise RuntimeError(f"{left} records not delivered in {TIMEOUT} s")

    def commit(self) -> None:
        self.producer.commit_transaction(TIMEOUT)

    def abort(self) -> None:
        self.producer.abort_transaction(TIMEOUT)

    def send_offsets(self, group: str, offsets: dict[Partition, int]) -> None:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": group})
        try:
            self.producer.send_offsets_to_transaction(
                [TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                consumer.consumer_group_metadata(),
                TIMEOUT,
            )
        finally:
            consumer.close()

    def close(self) -> None:
        self.producer.flush(1)


class KafkaPythonProducer(TxnProducer):
    def __init__(self, bootstrap: str, transactional_id: str, **config: Any) -> None:
        from kafka import KafkaProducer

        self.producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            transactional_id=transactional_id,
            linger_ms=5,
            max_block_ms=int(TIMEOUT * 1000),
            **config,
        )
        self.producer.init_transactions()

    def begin(self) -> None:
        self.producer.begin_transaction()

    def send(self, records: Iterable[Record], key: bytes | None = None) -> None:
        for topic, partition, value in records:
            self.producer.send(topic, value, key=key, partition=partition)

    def flush(self) -> None:
        self.producer.flush(TIMEOUT)

    def commit(self) -> None:
        self.producer.commit_transaction()

    def abort(self) -> None:
        self.producer.abort_transaction()

    def send_offsets(self, group: str, offsets: dict[Partition, int]) -> None:
        from kafka import OffsetAndMetadata, TopicPartition

        self.producer.send_offsets_to_transaction(
            {TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()},
            group,
        )

    def close(self) -> None:
        self.producer.close(timeout=5)


class AiokafkaProducer(TxnProducer):
    """aiokafka's producer on an event loop of its own, each call run to its end."""

    def __init__(self, bootstrap: str, transactional_id: str, **config: Any) -> None:
        from aiokafka import AIOKafkaProducer

        self.loop = asyncio.new_event_loop()

        async def start() -> AIOKafkaProducer:
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap,
                transactional_id=transactional_id,
                linger_ms=5,
                request_timeout_ms=int(TIMEOUT * 1000),
                **config,
            )
            await producer.start()
            return producer

        self.producer = self._run(start())
        self.sent: list[asyncio.Future[Any]] = []  # deliveries not yet awaited

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, TIMEOUT))

    def begin(self) -> None:
        self._run(self.producer.begin_transaction())

    def send(self, records: Iterable[Record], key: bytes | None = None) -> None:
        async def send() -> None:
            for topic, partition, value in records:
                self.sent.append(
                    await self.producer.send(topic, value, key=key, partition=partition)
                )

        self._run(send())

    def flush(self) -> None:
        """Every record sent delivered; a refused one raises."""
        sent, self.sent = self.sent, []

        async def flush() -> None:
            await self.producer.flush()
            for delivery in sent:
                await delivery

        self._run(flush())

    def commit(self) -> None:
        self._run(self.producer.commit_transaction())

    def abort(self) -> None:
        self._run(self.producer.abort_transaction())

    def send_offsets(self, group: str, offsets: dict[Partition, int]) -> None:
        from aiokafka import TopicPartition

        self._run(
            self.producer.send_offsets_to_transaction(
                {TopicPartition(t, p): o for (t, p), o in offsets.items()}, group
            )
        )

    def close(self) -> None:
        sent, self.sent = self.sent, []

        async def stop() -> None:
            await asyncio.gather(*sent, return_exceptions=True)
            await self.producer.stop()

        async def end_tasks() -> None:
            # a fenced producer's stop raises with its tasks still running: end them here
            left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)

        try:
            self._run(stop())
        finally:
            self.loop.run_until_complete(end_tasks())
            self.loop.close()


_PRODUCERS: Final[dict[str, Callable[..., TxnProducer]]] = {
    "confluent": ConfluentProducer,
    "kafka-python": KafkaPythonProducer,
    "aiokafka": AiokafkaProducer,
}


def producer(client: str, bootstrap: str, transactional_id: str, **config: Any) -> TxnProducer:
    """An initialised transactional producer of `client` (`config`: in the client's own
    spelling)."""
    return _PRODUCERS[client](bootstrap, transactional_id, **config)


def timeout_config(client: str, timeout_ms: int) -> dict[str, Any]:
    """The transaction timeout, in the client's spelling."""
    if client == "confluent":
        return {"transaction.timeout.ms": timeout_ms}
    return {"transaction_timeout_ms": timeout_ms}


def fenced(exc: BaseException) -> bool:
    """Whether `exc` is the client telling its producer was fenced by a newer one (or by its
    transaction's timeout)."""
    from aiokafka.errors import InvalidProducerEpoch as AioInvalidProducerEpoch
    from aiokafka.errors import ProducerFenced as AioProducerFenced
    from confluent_kafka import KafkaError, KafkaException
    from kafka.errors import InvalidProducerEpochError, ProducerFencedError
    from kafka.errors import KafkaError as KafkaPythonError

    if isinstance(exc, KafkaException):
        error = exc.args[0]  # librdkafka: fenced is fatal, the producer is done
        return bool(
            error.fatal() and error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED)
        )
    if type(exc) is KafkaPythonError:
        # kafka-python's state after a fatal error, named in the message: it takes this broker
        # for a Kafka 2.4 (no DescribeAcls v2), so a Produce refused INVALID_PRODUCER_EPOCH (a
        # fenced epoch's batch, Kafka's answer) is fatal, not an epoch bump (KIP-360)
        return "InvalidProducerEpochError" in str(exc) or "ProducerFencedError" in str(exc)
    return isinstance(
        exc,
        ProducerFencedError
        | InvalidProducerEpochError
        | AioProducerFenced
        | AioInvalidProducerEpoch,
    )


# Readers


def read(
    client: str, bootstrap: str, partitions: Iterable[Partition], committed: bool
) -> dict[Partition, list[Seen]]:
    """Every record of `partitions` from their start to their end for the isolation level."""
    wanted = sorted(set(partitions))
    if client == "confluent":
        return _read_confluent(bootstrap, wanted, committed)
    if client == "kafka-python":
        return _read_kafka_python(bootstrap, wanted, committed)
    return asyncio.run(_read_aiokafka(bootstrap, wanted, committed))


def _read_confluent(
    bootstrap: str, wanted: list[Partition], committed: bool
) -> dict[Partition, list[Seen]]:
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

    isolation = "read_committed" if committed else "read_uncommitted"
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    try:
        # the end for this isolation level: what a consumer at "latest" starts at
        ends = {
            tp: offset.offset
            for tp, offset in zip(
                wanted,
                consumer.offsets_for_times(
                    [TopicPartition(t, p, OFFSET_END) for t, p in wanted], TIMEOUT
                ),
                strict=True,
            )
        }
        starts = {
            (t, p): consumer.get_watermark_offsets(TopicPartition(t, p), TIMEOUT)[0]
            for t, p in wanted
        }
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in wanted])
        seen: dict[Partition, list[Seen]] = {tp: [] for tp in wanted}
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            positions = {
                (pos.topic, pos.partition): pos.offset
                for pos in consumer.position([TopicPartition(t, p) for t, p in wanted])
            }
            # no position yet (nothing fetched) is the start
            if all(max(positions[tp], starts[tp]) >= ends[tp] for tp in wanted):
                return seen
            for message in consumer.consume(10_000, 0.2):
                if message.error():
                    raise RuntimeError(f"confluent-kafka consumer: {message.error()}")
                seen[(message.topic(), message.partition())].append(
                    (message.offset(), message.key(), message.value())
                )
        raise TimeoutError(f"positions short of {ends} after {TIMEOUT} s")
    finally:
        consumer.close()


def _read_kafka_python(
    bootstrap: str, wanted: list[Partition], committed: bool
) -> dict[Partition, list[Seen]]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed" if committed else "read_uncommitted",
        enable_auto_commit=False,
    )
    try:
        tps = [TopicPartition(t, p) for t, p in wanted]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(tps)
        seen: dict[Partition, list[Seen]] = {tp: [] for tp in wanted}
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            if all(consumer.position(tp) >= ends[tp] for tp in tps):
                return seen
            for tp, records in consumer.poll(200).items():
                seen[(tp.topic, tp.partition)] += [(r.offset, r.key, r.value) for r in records]
        raise TimeoutError(f"positions short of {ends} after {TIMEOUT} s")
    finally:
        consumer.close()


async def _read_aiokafka(
    bootstrap: str, wanted: list[Partition], committed: bool
) -> dict[Partition, list[Seen]]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed" if committed else "read_uncommitted",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t, p in wanted]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        seen: dict[Partition, list[Seen]] = {tp: [] for tp in wanted}
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            if all([await consumer.position(tp) >= ends[tp] for tp in tps]):
                return seen
            for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                seen[(tp.topic, tp.partition)] += [(r.offset, r.key, r.value) for r in records]
        raise TimeoutError(f"positions short of {ends} after {TIMEOUT} s")
    finally:
        await consumer.stop()


def values(seen: dict[Partition, list[Seen]]) -> dict[Partition, list[bytes]]:
    """Each partition's values, in offset order (`SEAL` left out)."""
    return {
        tp: [value for _offset, _key, value in records if value != SEAL]
        for tp, records in seen.items()
    }


def produce_plain(bootstrap: str, records: Iterable[Record]) -> None:
    """Non-transactional records, each acknowledged by all (a refusal raises)."""
    from confluent_kafka import Producer

    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    failed: list[object] = []
    for topic, index, value in records:
        plain.produce(
            topic, value, partition=index, on_delivery=lambda e, _m: e and failed.append(e)
        )
    if plain.flush(TIMEOUT) or failed:
        raise RuntimeError(f"records not all delivered in {TIMEOUT} s: {failed[:3]}")


def seal(bootstrap: str, partitions: Iterable[Partition]) -> None:
    """A plain record after whatever each partition holds, past a restart's offset gap."""
    produce_plain(bootstrap, [(topic, index, SEAL) for topic, index in partitions])
