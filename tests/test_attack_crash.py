"""kill -9 at random moments under mixed load, repeated: nothing acknowledged is lost, no offset
is given to two records.

Each cycle starts the server on the same data directory and runs, until a random moment: an
idempotent at-least-once producer on a 2-partition `fsync=always` topic, a map writer (set one
key at a time on a last-value topic), and a consumer that acks what it receives. Then `kill -9`.
After the restart the cycle first reads the topic back from earliest with a fresh subscription
and checks the map: every acknowledged record is at the offset its ack named, every offset ever
seen keeps its record across cycles (no reuse), and each map key holds its last acknowledged
value or one written after it. `HEADWATER_ATTACK_CYCLES` sets the count (CI: 5).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from pathlib import Path

import pytest

import headwater
from headwater.testing import ServerProcess

CYCLES = int(os.environ.get("HEADWATER_ATTACK_CYCLES", "5"))
READ_S = 60.0  # bounds the read-back of a cycle: it ends once every acked record came


class Ledger:
    def __init__(self) -> None:
        self.acked: dict[tuple[int, int], bytes] = {}  # (partition, offset) -> value, acked
        self.stored: dict[tuple[int, int], bytes] = {}  # every record ever read back
        self.keys: dict[bytes, list[bytes]] = {}  # key -> values in the order sent
        self.key_acked: dict[bytes, bytes] = {}  # key -> last acknowledged value


async def _load(address: str, ledger: Ledger, cycle: int, stop: asyncio.Event) -> None:
    client = await headwater.connect(address)
    try:
        producer = client.producer("r", idempotent=True)
        mapping = client.map("m")
        consumer = await client.subscribe("r", "work", start="earliest", ack_timeout=2.0)

        async def produce() -> None:
            for i in range(1_000_000):
                if stop.is_set():
                    return
                value = f"c{cycle}-p{i}".encode()
                future = await producer.send(value)
                future_task = asyncio.ensure_future(_record(future, value))
                if i % 20 == 19:
                    await future_task
                await asyncio.sleep(0)

        async def _record(future: headwater.SendFuture, value: bytes) -> None:  # type: ignore[name-defined]
            with contextlib.suppress(Exception):
                meta = await future
                assert meta.offset is not None
                ledger.acked[(meta.partition, meta.offset)] = value

        async def set_keys() -> None:
            for i in range(1_000_000):
                if stop.is_set():
                    return
                key = f"k{i % 7}".encode()
                value = f"c{cycle}-m{i}".encode()
                ledger.keys.setdefault(key, []).append(value)
                await mapping.set(key, value)
                ledger.key_acked[key] = value

        async def consume() -> None:
            async for message in consumer:
                await consumer.ack(message)

        tasks = [asyncio.ensure_future(t()) for t in (produce, set_keys, consume)]
        await asyncio.wait(tasks, timeout=60, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(), 2)


async def _verify(address: str, ledger: Ledger, cycle: int) -> None:
    client = await headwater.connect(address)
    try:
        consumer = await client.subscribe("r", f"verify{cycle}", start="earliest")
        seen: dict[tuple[int, int], bytes] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READ_S
        # offsets may have gaps after a crash (never reuse), so read until every acknowledged
        # record came, then until the stream is quiet
        quiet = 0
        while quiet < 3 and loop.time() < deadline:
            try:
                message = await consumer.receive(timeout=0.3)
            except TimeoutError:
                quiet += 1 if set(ledger.acked) <= set(seen) else 0
                continue
            assert message.value is not None
            seen[(message.partition, message.offset)] = message.value
        lost = {pos: v for pos, v in ledger.acked.items() if seen.get(pos) != v}
        assert not lost, (
            f"cycle {cycle}: {len(lost)} of {len(ledger.acked)} acknowledged records missing or "
            f"changed: {sorted(lost.items())[:5]} (found {[seen.get(p) for p in sorted(lost)[:5]]}"
            f"; read {len(seen)})"
        )
        reused = {p: (ledger.stored[p], v) for p, v in seen.items() if ledger.stored.get(p, v) != v}
        assert not reused, f"cycle {cycle}: offsets given to two records: {sorted(reused)[:5]}"
        ledger.stored.update(seen)
        values = list(seen.values())
        assert len(values) == len(set(values)), f"cycle {cycle}: a record stored twice"
        await consumer.close()
        mapping = client.map("m")
        for key, acked in ledger.key_acked.items():
            got = await mapping.get(key)
            sent = ledger.keys[key]
            assert got is not None, f"cycle {cycle}: map key {key!r} lost (acked {acked!r})"
            assert got.value in sent[sent.index(acked) :], (
                f"cycle {cycle}: map key {key!r} holds {got.value!r}, acked {acked!r} last"
            )
    finally:
        await client.close()


@pytest.mark.timeout(600)
def test_kill_9_under_mixed_load(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("HEADWATER_ATTACK_SEED", random.randrange(2**32))))
    server = ServerProcess(tmp_path / "data").start()
    ledger = Ledger()

    async def setup() -> None:
        client = await headwater.connect(server.address)
        await client.create_topic("r", 2, "reliable", {"fsync": "always"})
        await client.create_topic("m", 2, "reliable", {"fsync": "always", "last.value": "true"})
        await client.close()

    async def cycle(number: int) -> None:
        stop = asyncio.Event()
        load = asyncio.ensure_future(_load(server.address, ledger, number, stop))
        # the random moment of the kill: after a random number of acknowledgements (a duration
        # would find nothing acked yet on a loaded machine)
        target = len(ledger.acked) + rng.randint(1, 300)
        deadline = asyncio.get_running_loop().time() + 60  # bounds a hang only
        while len(ledger.acked) < target:
            assert asyncio.get_running_loop().time() < deadline, "the load stopped being acked"
            await asyncio.sleep(0.005)
        server.kill()
        stop.set()
        await asyncio.gather(load, return_exceptions=True)
        server.start()
        await _verify(server.address, ledger, number)

    try:
        asyncio.run(setup())
        for number in range(CYCLES):
            asyncio.run(cycle(number))
        assert ledger.acked and ledger.key_acked, "the load acknowledged nothing"
        print(f"{CYCLES} kills: {len(ledger.acked)} records and {len(ledger.key_acked)} keys acked")
    finally:
        server.kill()
        if os.environ.get("HEADWATER_ATTACK_KEEP"):
            print(f"data kept: {tmp_path}")
