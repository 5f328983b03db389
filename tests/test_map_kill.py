"""kill -9 under pipelined map writes on several connections: MAP_SIZE stays exact and no
acknowledged write is lost (issue 27 item 5).

Five connections write to two map topics (three partitions with fsync `interval`, one with
`always`), four requests in flight each: sets of 1, 5 or 50 keys, deletes, and creates (only if
absent), over 2,000 keys, so most writes overwrite a key the server knows exists (the key count's
`KnownKeys`) and some remove one. After a random number of acknowledged writes (an event, not a
time, so an idle machine and a loaded one kill at the same point of the load) the server is
killed with SIGKILL and started again on the same directory. Then, for each topic, MAP_SIZE must
equal the keys a full scan finds, and every acknowledged write's key must hold that revision or a
later one (a delete: absent, or a later revision); a key may be absent after an acknowledged set
only if a delete of it was sent and never acknowledged. `HEADWATER_ATTACK_CYCLES` sets the count
of kills (3).
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
from headwater.wire.errors import RevisionMismatch

CYCLES = int(os.environ.get("HEADWATER_ATTACK_CYCLES", "3"))
KEYS = 2000
TOPICS = {"m": (3, "interval"), "n": (1, "always")}


class Ledger:
    def __init__(self) -> None:
        # (topic, key) -> (revision, present) of its newest acknowledged write
        self.acked: dict[tuple[str, str], tuple[int, bool]] = {}
        # (topic, key) -> deletes of it sent and not acknowledged in this cycle
        self.pending_deletes: dict[tuple[str, str], int] = {}
        self.acks_to_kill = 0  # set when the cycle's acknowledged writes reach the count
        self.kill_now = asyncio.Event()

    def arm(self, acks: int) -> None:
        self.acks_to_kill = acks
        self.kill_now = asyncio.Event()

    def ack(self, topic: str, key: str, revision: int, present: bool) -> None:
        self.acked[(topic, key)] = max(
            self.acked.get((topic, key), (-1, False)), (revision, present)
        )
        self.acks_to_kill -= 1
        if self.acks_to_kill <= 0:
            self.kill_now.set()


async def _writer(
    address: str, topic: str, tag: str, ledger: Ledger, stop: asyncio.Event, rng: random.Random
) -> None:
    async with await headwater.connect(address) as client:
        table = client.map(topic)

        async def one(number: int) -> None:
            keys = [f"k{rng.randrange(KEYS)}" for _ in range(rng.choice((1, 5, 50)))]
            try:
                if number % 7 == 6:
                    doomed = list(dict.fromkeys(keys[:10]))
                    for k in doomed:
                        ledger.pending_deletes[(topic, k)] = (
                            ledger.pending_deletes.get((topic, k), 0) + 1
                        )
                    revisions = await table.write_many([(k, None) for k in doomed])
                    for k, revision in zip(doomed, revisions, strict=True):
                        ledger.pending_deletes[(topic, k)] -= 1
                        ledger.ack(topic, k, revision, False)
                elif number % 7 == 5:
                    with contextlib.suppress(RevisionMismatch):
                        ledger.ack(topic, keys[0], await table.create(keys[0], tag), True)
                else:
                    values = {k: f"{tag}-{number}".encode() for k in keys}
                    revisions = await table.set_many(values)
                    for k, revision in zip(values, revisions, strict=True):
                        ledger.ack(topic, k, revision, True)
            except (TimeoutError, OSError, headwater.HeadwaterError):
                stop.set()  # the server is gone

        number = 0
        while not stop.is_set():
            await asyncio.gather(*(one(number + i) for i in range(4)))  # four in flight
            number += 4


async def _check(address: str, ledger: Ledger, cycle: int) -> None:
    async with await headwater.connect(address) as client:
        for topic in TOPICS:
            table = client.map(topic)
            size = await table.size()
            found = {entry.key.decode(): entry async for entry in table.items(page_size=1000)}
            assert size == len(found), f"cycle {cycle}, {topic}: MAP_SIZE {size}, scan {len(found)}"
            for (name, k), (revision, present) in list(ledger.acked.items()):
                if name != topic:
                    continue
                entry = found.get(k)
                if present and entry is None and ledger.pending_deletes.get((name, k)):
                    ledger.acked[(name, k)] = (revision, False)  # a later delete, unacknowledged
                    continue
                if present:
                    assert entry is not None and entry.revision >= revision, (
                        f"cycle {cycle}: {topic}/{k} acked at {revision}, holds {entry}"
                    )
                else:
                    assert entry is None or entry.revision > revision, (
                        f"cycle {cycle}: {topic}/{k} deleted at {revision}, holds {entry}"
                    )
    ledger.pending_deletes.clear()  # applied before the kill, or lost with it


@pytest.mark.timeout(300)
def test_map_size_and_acked_writes_survive_kill_9_under_pipelined_writes(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("HEADWATER_ATTACK_SEED", random.randrange(2**32))))
    ledger = Ledger()

    async def cycle(number: int) -> None:
        server = ServerProcess(tmp_path / "data").start()
        try:
            if number == 0:
                async with await headwater.connect(server.address) as client:
                    for topic, (partitions, fsync) in TOPICS.items():
                        await client.create_topic(
                            topic, partitions, "reliable", {"fsync": fsync, "last.value": "true"}
                        )
            else:
                await _check(server.address, ledger, number)
            if number == CYCLES:
                return
            stop = asyncio.Event()
            ledger.arm(rng.randrange(500, 5000))  # acknowledged key writes before the kill
            writers = [
                _writer(
                    server.address,
                    topic,
                    f"{number}.{i}",
                    ledger,
                    stop,
                    random.Random(rng.random()),
                )
                for i, topic in enumerate(["m", "m", "m", "n", "n"])
            ]
            tasks = [asyncio.ensure_future(w) for w in writers]
            killing = asyncio.ensure_future(ledger.kill_now.wait())
            await asyncio.wait([killing, *tasks], return_when=asyncio.FIRST_COMPLETED)
            killing.cancel()
            assert ledger.kill_now.is_set(), "the writers stopped before the kill"
            server.kill()
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            if server.process is not None and server.process.poll() is None:
                server.stop()

    for number in range(CYCLES + 1):
        asyncio.run(cycle(number))
    assert sum(1 for _, present in ledger.acked.values() if present) > 100  # it did write
