"""An exactly-once consume-transform-produce application on confluent-kafka, run as a process.

    python -m tests.support.eos_app BOOTSTRAP INPUT OUTPUT_PREFIX GROUP TRANSACTIONAL_ID ENDS

It reads INPUT (every partition, assigned, no group membership) read_committed from its group's
committed offsets, and for each input record writes one output record, the same key, to
`OUTPUT_PREFIX-0` or `-1` by the key, in the input's partition, valued
`<input partition>:<input offset>:<input value>`; every `--every` records (or fewer, when fewer
came) it sends the positions as the group's offsets in the transaction and commits. So each input
record's output is committed exactly once, with the offset past it, whatever kills the process
or the server: a new instance's `init_transactions` fences the old one and aborts its open
transaction, and it starts again from the group's committed offsets.

A transaction refused with an abortable error is aborted and the positions rewound to the
committed offsets; a retriable commit is retried; a fatal error (fenced, or the producer's state
lost) exits 3, for the test to start another instance. It exits 0 once the committed offsets
reach ENDS, each input partition's end (the input is written before).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

TIMEOUT = 30.0
FATAL = 3


def _log(*parts: object) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


class App:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.producer = Producer(
            {
                "bootstrap.servers": args.bootstrap,
                "transactional.id": args.transactional_id,
                "linger.ms": 5,
                "transaction.timeout.ms": args.transaction_timeout_ms,
                # librdkafka re-bootstraps once every broker is down (the server killed) and
                # so forgets broker 0, the cached group coordinator: send_offsets_to_transaction
                # then waits for ever, past its timeout (confluentinc/librdkafka#5511, #5456)
                "metadata.recovery.strategy": "none",
            }
        )
        self.consumer = Consumer(
            {
                "bootstrap.servers": args.bootstrap,
                "group.id": args.group,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        # where the input's records end: not its high watermark, which a kill -9 of the server
        # moves past the offset lease's gap (docs/DURABILITY.md), where no record ever comes
        self.ends = dict(enumerate(int(end) for end in args.ends.split(",")))
        self.partitions = [TopicPartition(args.input, p) for p in self.ends]
        self.positions: dict[int, int] = {}

    def rewind(self) -> None:
        """Back to the group's committed offsets (the last committed transaction's)."""
        committed = self.consumer.committed(self.partitions, TIMEOUT)
        self.positions = {tp.partition: max(tp.offset, 0) for tp in committed}
        self.consumer.assign(
            [
                TopicPartition(tp.topic, tp.partition, max(tp.offset, OFFSET_BEGINNING))
                for tp in committed
            ]
        )
        _log("rewound", self.positions)

    def done(self) -> bool:
        return all(self.positions[p] >= end for p, end in self.ends.items())

    def run(self) -> int:
        self.producer.init_transactions(TIMEOUT)
        _log("initialised")
        self.rewind()
        while not self.done():
            messages = self.consumer.consume(self.args.every, 1.0)
            for message in messages:
                if message.error():
                    raise KafkaException(message.error())
            if messages:
                self.transaction(messages)
        _log("done", self.positions)
        return 0

    def transaction(self, messages: list[Any]) -> None:
        try:
            self.producer.begin_transaction()
            positions = dict(self.positions)
            for message in messages:
                key = message.key()
                self.producer.produce(
                    f"{self.args.output}-{int(key[1:]) % 2}",
                    b"%d:%d:%s" % (message.partition(), message.offset(), message.value()),
                    key,
                    partition=message.partition(),
                )
                positions[message.partition()] = message.offset() + 1
            self.producer.poll(0)
            self.producer.send_offsets_to_transaction(
                [TopicPartition(self.args.input, p, o) for p, o in positions.items()],
                self.consumer.consumer_group_metadata(),
                TIMEOUT,
            )
            self._commit()
            self.positions = positions
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.fatal() or not error.txn_requires_abort():
                raise
            _log("aborting", error)
            self._abort()
            self.rewind()

    def _commit(self) -> None:
        for _ in range(20):
            try:
                self.producer.commit_transaction(TIMEOUT)
                return
            except KafkaException as exc:
                if not exc.args[0].retriable():
                    raise
                _log("commit retried", exc.args[0])
        raise RuntimeError("commit not done after 20 retries")

    def _abort(self) -> None:
        for _ in range(20):
            try:
                self.producer.abort_transaction(TIMEOUT)
                return
            except KafkaException as exc:
                if not exc.args[0].retriable():
                    raise
                _log("abort retried", exc.args[0])
        raise RuntimeError("abort not done after 20 retries")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bootstrap")
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("group")
    parser.add_argument("transactional_id")
    parser.add_argument("ends", help="each input partition's end, comma-separated")
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--transaction-timeout-ms", type=int, default=60_000)
    args = parser.parse_args()
    app = App(args)
    try:
        return app.run()
    except KafkaException as exc:
        _log("fatal", exc.args[0])
        return FATAL
    finally:
        app.consumer.close()


if __name__ == "__main__":
    sys.exit(main())
