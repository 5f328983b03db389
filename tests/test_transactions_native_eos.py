"""Exactly-once on the native protocol under failure (issue 38): a consume-transform-produce
application (tests/support/native_eos_app.py: an Exclusive subscription in, a transactional
producer out, each message's acknowledgement sent in the transaction that writes its output) is
killed with SIGKILL three times and its server once over 3,000 input messages, and (issue 38's
size) five times and its server twice over 100,000, at moments its committed output reaches; the
output a transaction-aware reader reads holds exactly one record per input message, in input
order per key, and the subscription ends with nothing delivered and unacknowledged."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from pathlib import Path

import headwater
from headwater.testing import ServerProcess
from tests.support.native_eos_app import committed_outputs

PARTITIONS = 3
KEYS = 40


async def _done(address: str, topic: str) -> int | None:
    """How many outputs are committed (None while the server restarts)."""
    try:
        async with await headwater.connect(address, timeout=5.0) as client:
            return await committed_outputs(client, topic)
    except (headwater.HeadwaterError, OSError, TimeoutError):
        return None


async def _committed_output(address: str, topic: str) -> list[list[bytes]]:
    async with await headwater.connect(address) as client:
        partitions: list[list[bytes]] = []
        for partition in range(PARTITIONS):
            values: list[bytes] = []
            offset = 0
            for _ in range(10_000):  # each FETCH moves on, or the partition is read
                fetched = await client.fetch(topic, partition, offset)
                values += [r.value or b"" for r in fetched.records()]
                if fetched.next_offset >= fetched.end_offset:
                    break
                assert fetched.next_offset > offset
                offset = fetched.next_offset
            partitions.append(values)
        return partitions


async def test_a_native_consume_transform_produce_loop_killed_and_its_server_killed_is_exactly_once(
    tmp_path: Path, topic_name: str
) -> None:
    await _exactly_once(tmp_path, topic_name, 3_000, ["app"] * 3 + ["server"], 38, 50, 240)


async def test_exactly_once_over_100000_records_with_the_app_killed_5_times_and_the_server_twice(
    tmp_path: Path, topic_name: str
) -> None:
    """Issue 38's size: 100,000 input messages, five SIGKILLs of the application and two of the
    server, at moments spread over the run."""
    kinds = ["app"] * 5 + ["server"] * 2
    await _exactly_once(tmp_path, topic_name, 100_000, kinds, 100_000, 500, 900)


async def _exactly_once(
    tmp_path: Path,
    topic_name: str,
    records: int,
    kinds: list[str],
    seed: int,
    every: int,
    limit_s: float,
) -> None:
    """The application over `records` input messages, killed as `kinds` says (each kill at a
    committed output count drawn with `seed`), committing every `every` messages; bounded by
    `limit_s`."""
    rng = random.Random(seed)
    server = ServerProcess(tmp_path / "data").start()
    source, output, subscription = f"{topic_name}-in", f"{topic_name}-out", "eos"
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic(source, partitions=PARTITIONS)
            await client.create_topic(output, partitions=PARTITIONS)
            producer = client.producer(source)
            sent = [
                await producer.send(f"v{i}".encode(), key=f"k{i % KEYS}".encode())
                for i in range(records)
            ]
            await producer.flush()
            inputs = {(s.result().partition, s.result().offset) for s in sent}
        kinds = list(kinds)
        rng.shuffle(kinds)
        # kill points: committed output counts, spread over the run
        plan = sorted((int(rng.uniform(0.1, 0.85) * records), kind) for kind in kinds)
        app: subprocess.Popen[bytes] | None = None
        instances = 0
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if app is None:
                instances += 1
                assert instances < 30, "too many application instances"
                command = [
                    sys.executable, "-m", "tests.support.native_eos_app", server.address,
                    source, output, subscription, f"{topic_name}-txn", str(records),
                    "--every", str(every),
                ]  # fmt: skip
                with (tmp_path / f"app-{instances}.log").open("wb") as log:
                    app = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            code = app.poll()
            if code is not None:
                app = None
                if code == 0 and not plan:
                    break
                continue
            done = await _done(server.address, output) if plan else None
            if plan and done is not None and done >= plan[0][0]:
                _, kind = plan.pop(0)
                if kind == "app":
                    app.kill()
                    app.wait()
                    app = None
                else:
                    server.kill()
                    server.start()
            await asyncio.sleep(0.05)  # a bounded poll of the application's progress
        else:
            raise AssertionError(f"the application did not finish in {limit_s} s")
        assert not plan, f"kills not done: {plan}"
        outputs = await _committed_output(server.address, output)
        seen: list[tuple[int, int]] = []
        for partition, values in enumerate(outputs):
            last_by_key: dict[bytes, int] = {}
            for value in values:
                from_partition, offset, original = value.split(b":", 2)
                assert int(from_partition) == partition
                seen.append((partition, int(offset)))
                key = f"k{int(original[1:]) % KEYS}".encode()
                assert last_by_key.get(key, -1) < int(offset), "out of order for its key"
                last_by_key[key] = int(offset)
        assert len(seen) == len(set(seen)), "an input message's output committed twice"
        assert set(seen) == inputs, "an input message's output missing"
        async with await headwater.connect(server.address) as client:
            described = await client.describe_topic(source)
        (info,) = [s for s in described.subscriptions if s.name == subscription]
        assert info.unacked == 0, "an input message left unacknowledged"
    finally:
        server.stop()
