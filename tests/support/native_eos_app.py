"""An exactly-once consume-transform-produce application on the native client, run as a process.

    python -m tests.support.native_eos_app ADDRESS INPUT OUTPUT SUBSCRIPTION TRANSACTIONAL_ID \
        TOTAL [--every N]

It consumes INPUT through an Exclusive subscription (from the earliest offset on its first
start), and for each message writes one record to OUTPUT, in the input's partition, with the
input's key, valued `<input partition>:<input offset>:<input value>`; every N messages (or fewer,
when no more come within a moment) it includes their acknowledgements in the transaction
(`producer.send_acks`) and commits. So each input message's output is committed exactly once
with its acknowledgement, whatever kills the process or the server: a new instance's producer
fences the old one and aborts its open transaction, whose messages are then delivered again.

In a cluster a partition's owner killed moves the consumer's leg to the new owner, which
delivers again what it finds unacknowledged, the messages of the transaction still open among
them: a message this process already took (in the open transaction, or in one that committed:
every transaction of a process commits, or the process exits) is skipped, as a Kafka consumer
keeps its position across a leader change. Its acknowledgement is in the transaction that took it.

It prints `committed <count>` after each commit and exits 0 once TOTAL outputs are committed (by
it and its predecessors: counted by reading OUTPUT as a transaction-aware reader, when no input
came for a moment); any error exits 3, for the test to start another.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import headwater
from headwater.client.message_batch import Message

FAILED = 3
QUIET = 0.5  # seconds without a message after which a partial transaction is committed


def _log(*parts: object) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


async def run(args: argparse.Namespace) -> int:
    async with await headwater.connect(args.address) as client:
        producer = client.producer(args.output, transactional_id=args.transactional_id)
        # the predecessor's last transaction settled before anything is delivered here
        await producer.init_transactions()
        consumer = await client.subscribe(
            args.input, args.subscription, type="exclusive", start="earliest", prefetch=500
        )
        seen: set[tuple[int, int]] = set()  # (partition, offset) taken by this process
        while True:
            taken: list[Message] = []
            async with producer.transaction():
                for _ in range(args.every):
                    try:
                        message = await consumer.receive(timeout=QUIET)
                    except TimeoutError:
                        break
                    if (message.partition, message.offset) in seen:
                        continue  # delivered again by a partition's new owner (module doc)
                    seen.add((message.partition, message.offset))
                    value = f"{message.partition}:{message.offset}:".encode() + (
                        message.value or b""
                    )
                    await producer.send(value, key=message.key, partition=message.partition)
                    taken.append(message)
                if taken:
                    await producer.send_acks(consumer, taken)
            if taken:
                _log("committed", len(taken))
                continue
            if await committed_outputs(client, args.output) >= args.total:
                _log("done")
                return 0


async def committed_outputs(client: headwater.Client, topic: str) -> int:
    """The records a transaction-aware reader reads of `topic`, every partition to its end."""
    count = 0
    described = await client.describe_topic(topic)
    for partition in range(len(described.next_offsets)):
        offset = 0
        for _ in range(100_000):  # each FETCH moves on, or the partition is read
            fetched = await client.fetch(topic, partition, offset)
            count += len(fetched.records())
            if fetched.next_offset >= fetched.end_offset or fetched.next_offset <= offset:
                break
            offset = fetched.next_offset
    return count


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("subscription")
    parser.add_argument("transactional_id")
    parser.add_argument("total", type=int)
    parser.add_argument("--every", type=int, default=100)
    args = parser.parse_args(argv)
    try:
        return asyncio.run(run(args))
    except Exception as exc:  # the test starts another instance
        _log("failed", type(exc).__name__, exc)
        return FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
