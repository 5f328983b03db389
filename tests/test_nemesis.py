"""A nemesis run (Jepsen-style, on loopback): three brokers, etcd and moto's S3, with every link a
test controls going through a fault proxy (tests/support/proxy.py): client to each broker (the
brokers advertise their proxy, so routed traffic goes through it too), brokers to etcd, brokers
to the object store. While producers, a consumer and two clients contending for one Exclusive
subscription run, a seeded nemesis applies one fault at a time: kill -9 and restart of a broker
(on its address), SIGSTOP of a broker (past its lease sometimes), a client link blackholed,
blackholed one way, cut at random or slowed, the etcd link blackholed, etcd paused or killed and
restarted, the object-store link blackholed or cut, moto paused. (moto keeps objects in memory: a
restart would be a data loss no object store has, so the object store is paused, not restarted.)

Then everything heals and an independent checker reads the history the clients saw:

- every acknowledged message is read back from earliest, at the offset it was acknowledged with;
- no (partition, offset) was ever seen with two payloads (acks, deliveries, the final read);
- the Exclusive subscription never had two clients receiving at once: the spans between the
  first and the last message each holding received do not overlap across clients;
- idempotent producers without duplicates: a message of the idempotent producer (one of the
  two) was never seen at two offsets (its resends after a failover are recognised by the new
  owner).

`make test` runs a short nemesis (15 s of faults). `make nemesis` runs it for
HEADWATER_NEMESIS_SECONDS (300 by default there); HEADWATER_NEMESIS_SEED replays a run's faults
(the seed is printed, and named in every failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import headwater
from headwater.client.producer_config import ProducerConfig
from tests.support.cluster_support import Cluster, running_cluster
from tests.support.helpers import eventually
from tests.support.proxy import FaultyProxy
from tests.support.s3 import MotoS3, free_port

SECONDS = float(os.environ.get("HEADWATER_NEMESIS_SECONDS") or 15)
SEED = int(os.environ.get("HEADWATER_NEMESIS_SEED") or random.randrange(1, 1_000_000))
LEASE_TTL_MS = 2000
BROKERS = ("b1", "b2", "b3")
TOPIC, PARTITIONS = "history", 6


@dataclass
class History:
    """What the clients saw; judged by `check` alone."""

    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    seen_at: dict[tuple[int, int], set[bytes]] = field(default_factory=dict)
    final: dict[tuple[int, int], bytes] = field(default_factory=dict)
    # Exclusive holdings: (client, first receive, last receive), times on this process's clock
    holdings: list[tuple[str, float, float]] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    unacked: int = 0
    idempotent: str = "i-"  # the prefix of the idempotent producer's values

    def saw(self, partition: int, offset: int, value: bytes | None) -> None:
        self.seen_at.setdefault((partition, offset), set()).add(value or b"")


def check(history: History) -> list[str]:
    """Every violation of the promises in the history, in words."""
    problems = []
    lost = [v for v, place in history.acked.items() if history.final.get(place) != v]
    if lost:
        sample = [(v, history.acked[v], history.final.get(history.acked[v])) for v in lost[:5]]
        problems.append(
            f"{len(lost)} acknowledged messages not read back at their offset: {sample}"
        )
    for place, value in history.final.items():
        history.saw(*place, value)
    for value, place in history.acked.items():
        history.saw(*place, value)
    clashes = {place: values for place, values in history.seen_at.items() if len(values) > 1}
    if clashes:
        problems.append(f"offsets with two payloads: {sorted(clashes.items())[:5]}")
    places: dict[bytes, set[tuple[int, int]]] = {}
    for place, values in history.seen_at.items():
        for value in values:
            if value.startswith(history.idempotent.encode()):
                places.setdefault(value, set()).add(place)
    twice = {value: sorted(found) for value, found in places.items() if len(found) > 1}
    if twice:
        problems.append(f"idempotent messages stored twice: {sorted(twice.items())[:5]}")
    spans = sorted(history.holdings, key=lambda h: h[1])
    for i, (client, start, end) in enumerate(spans):
        for other, other_start, other_end in spans[i + 1 :]:
            if other != client and other_start < end and start < other_end:
                problems.append(
                    f"exclusive subscription received by {client} and {other} at once: "
                    f"[{start:.3f}, {end:.3f}] and [{other_start:.3f}, {other_end:.3f}]"
                )
    return problems


class Rig:
    """The processes and the proxies in front of them."""

    def __init__(self, cluster: Cluster, s3: MotoS3, s3_proxy: FaultyProxy) -> None:
        self.cluster = cluster
        self.s3 = s3
        self.s3_proxy = s3_proxy
        self.etcd_proxy: FaultyProxy | None = None
        self.broker_proxies: dict[str, FaultyProxy] = {}
        self.broker_ports: dict[str, int] = {}

    async def start(self) -> None:
        self.etcd_proxy = await FaultyProxy(self.cluster.etcd.client_port, seed=SEED).start()
        self.cluster.etcd_endpoint = f"etcd://{self.etcd_proxy.address}"
        for broker in BROKERS:
            self.broker_ports[broker] = free_port()
            proxy = await FaultyProxy(self.broker_ports[broker], seed=SEED).start()
            self.broker_proxies[broker] = proxy
        await asyncio.gather(*(self.start_broker(b) for b in BROKERS))

    async def start_broker(self, broker: str) -> None:
        await asyncio.to_thread(
            self.cluster.start_broker,
            broker,
            self.broker_ports[broker],
            self.broker_proxies[broker].address,
        )

    def address(self, broker: str) -> str:
        return self.broker_proxies[broker].address

    def proxies(self) -> list[FaultyProxy]:
        assert self.etcd_proxy is not None
        return [self.s3_proxy, self.etcd_proxy, *self.broker_proxies.values()]

    async def heal(self) -> None:
        """Every proxy forwarding cleanly, every process running and not stopped."""
        for proxy in self.proxies():
            proxy.resume()
            proxy.drop_requests = proxy.drop_responses = 0.0
            proxy.delay = 0.0
        etcd = self.cluster.etcd
        if etcd.alive():
            etcd.resume()
        else:
            await asyncio.to_thread(etcd.start)
        self._signal_s3(signal.SIGCONT)
        for broker in BROKERS:
            process = self.cluster.brokers[broker]
            if process.alive():
                assert process.process is not None
                os.kill(process.process.pid, signal.SIGCONT)
            else:
                await self.start_broker(broker)

    def _signal_s3(self, sig: signal.Signals) -> None:
        process = self.s3._process
        if process is not None and process.poll() is None:
            os.kill(process.pid, sig)

    async def close(self) -> None:
        await self.heal_quietly()
        for proxy in self.proxies() if self.etcd_proxy is not None else [self.s3_proxy]:
            await proxy.close()

    async def heal_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self._signal_s3(signal.SIGCONT)


class Nemesis:
    """One fault at a time, from a seeded generator, each healed before the next."""

    def __init__(self, rig: Rig, history: History) -> None:
        self.rig = rig
        self.history = history
        self.rng = random.Random(SEED)

    async def run(self, seconds: float) -> None:
        stop_at = time.monotonic() + seconds
        faults = [
            self.kill_broker,
            self.pause_broker,
            self.client_link,
            self.etcd_link,
            self.etcd_process,
            self.s3_link,
            self.s3_process,
        ]
        while time.monotonic() < stop_at:
            await asyncio.sleep(self.rng.uniform(0.3, 1.5))
            fault = self.rng.choice(faults)
            await fault()
            await self.rig.heal()

    def _note(self, text: str) -> None:
        self.history.faults.append(f"{time.monotonic():.1f} {text}")

    async def kill_broker(self) -> None:
        broker = self.rng.choice(BROKERS)
        self._note(f"kill -9 {broker}")
        self.rig.cluster.brokers[broker].kill()
        await asyncio.sleep(self.rng.uniform(0.5, 3.0))
        await self.rig.start_broker(broker)

    async def pause_broker(self) -> None:
        broker = self.rng.choice(BROKERS)
        held = self.rng.uniform(0.5, 4.0)  # past the 2 s lease about half the time
        self._note(f"SIGSTOP {broker} {held:.1f}s")
        process = self.rig.cluster.brokers[broker].process
        assert process is not None
        os.kill(process.pid, signal.SIGSTOP)
        await asyncio.sleep(held)
        os.kill(process.pid, signal.SIGCONT)

    async def client_link(self) -> None:
        broker = self.rng.choice(BROKERS)
        proxy = self.rig.broker_proxies[broker]
        kind = self.rng.choice(["blackhole", "one-way", "cuts", "slow"])
        held = self.rng.uniform(0.5, 3.0)
        self._note(f"client link to {broker}: {kind} {held:.1f}s")
        if kind == "blackhole":
            proxy.pause()
        elif kind == "one-way":
            proxy.pause("response")
        elif kind == "cuts":
            proxy.drop_requests = proxy.drop_responses = 0.05
        else:
            proxy.delay = 0.05
        await asyncio.sleep(held)

    async def etcd_link(self) -> None:
        assert self.rig.etcd_proxy is not None
        held = self.rng.uniform(0.5, 3.0)
        self._note(f"etcd link blackholed {held:.1f}s")
        self.rig.etcd_proxy.pause()
        await asyncio.sleep(held)

    async def etcd_process(self) -> None:
        etcd = self.rig.cluster.etcd
        if self.rng.random() < 0.5:
            held = self.rng.uniform(0.5, 3.0)
            self._note(f"SIGSTOP etcd {held:.1f}s")
            etcd.pause()
            await asyncio.sleep(held)
            etcd.resume()
        else:
            self._note("kill -9 etcd, restart")
            etcd.kill()
            await asyncio.sleep(self.rng.uniform(0.2, 2.0))
            await asyncio.to_thread(etcd.start)

    async def s3_link(self) -> None:
        held = self.rng.uniform(0.5, 3.0)
        proxy = self.rig.s3_proxy
        if self.rng.random() < 0.5:
            self._note(f"object-store link blackholed {held:.1f}s")
            proxy.pause()
        else:
            self._note(f"object-store link cut at random {held:.1f}s")
            proxy.drop_requests = proxy.drop_responses = 0.1
        await asyncio.sleep(held)

    async def s3_process(self) -> None:
        held = self.rng.uniform(0.5, 3.0)
        self._note(f"SIGSTOP object store {held:.1f}s")
        self.rig._signal_s3(signal.SIGSTOP)
        await asyncio.sleep(held)
        self.rig._signal_s3(signal.SIGCONT)


@pytest.fixture
async def rig(tmp_path: Path, s3: MotoS3, bucket: str) -> AsyncIterator[Rig]:
    s3_proxy = await FaultyProxy(s3.port, seed=SEED).start()
    with running_cluster(
        tmp_path, s3, bucket, LEASE_TTL_MS, f"http://{s3_proxy.address}"
    ) as cluster:
        rig = Rig(cluster, s3, s3_proxy)
        try:
            await rig.start()
            yield rig
        finally:
            await rig.close()


@pytest.mark.timeout(int(SECONDS * 4 + 600))  # bounds a hang only
async def test_nemesis_keeps_every_promise(rig: Rig) -> None:
    print(f"nemesis seed {SEED}, {SECONDS:.0f}s of faults")
    history = History()
    stop = asyncio.Event()
    admin = await headwater.connect(rig.address("b1"), reconnect=True)
    clients: list[headwater.Client] = [admin]
    try:
        await admin.create_topic(TOPIC, partitions=PARTITIONS)
        await rig.cluster.wait_owned(TOPIC, PARTITIONS, set(BROKERS), timeout=60)
        for broker in ("b1", "b2", "b3", "b2", "b3"):
            clients.append(await headwater.connect(rig.address(broker), reconnect=True))
        producers, watcher, solo_a, solo_b = clients[1:3], clients[3], clients[4], clients[5]
        names = ["p0", history.idempotent + "p1"]
        tasks = [
            asyncio.ensure_future(produce(c, name, history, stop))
            for name, c in zip(names, producers, strict=True)
        ]
        tasks.append(asyncio.ensure_future(watch(watcher, history, stop)))
        tasks.append(asyncio.ensure_future(contend(solo_a, "a", history, stop)))
        tasks.append(asyncio.ensure_future(contend(solo_b, "b", history, stop)))
        await Nemesis(rig, history).run(SECONDS)
        await rig.heal()
        # traffic on the healed cluster before the stop, until there is something to judge: 50
        # more acknowledged produces and an Exclusive holding (120 s only bounds a hang). A fixed
        # 2 s left 24 acknowledged in all under `make stress-test` (seed 801379)
        acked_at_heal = len(history.acked)
        await eventually(
            lambda: len(history.acked) >= acked_at_heal + 50 and bool(history.holdings),
            timeout=120,
            interval=0.1,
            what=f"seed {SEED}: 50 acknowledged and an exclusive holding on the healed cluster",
        )
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 180)
        await rig.cluster.wait_owned(TOPIC, PARTITIONS, set(BROKERS), timeout=60)
        await read_everything(clients[1], history)
        problems = check(history)
        assert not problems, f"seed {SEED}: {problems}; faults: {history.faults}"
        assert len(history.acked) > 50, f"seed {SEED}: too little went through to judge"
        assert history.holdings, f"seed {SEED}: the exclusive subscription was never held"
        idempotent = sum(v.startswith(history.idempotent.encode()) for v in history.acked)
        print(
            f"seed {SEED}: {len(history.acked)} acked ({idempotent} idempotent), "
            f"{history.unacked} not acked, "
            f"{len(history.final)} read back, {len(history.holdings)} exclusive holdings, "
            f"{len(history.faults)} faults"
        )
    finally:
        for client in clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 30)


async def produce(
    client: headwater.Client, name: str, history: History, stop: asyncio.Event
) -> None:
    idempotent = name.startswith(history.idempotent)
    producer = client.producer(TOPIC, ProducerConfig(idempotent=idempotent))
    counter = 0

    async def one(value: bytes) -> None:
        try:
            meta = await asyncio.wait_for(await producer.send(value, key=value), 90)
        except (headwater.HeadwaterError, TimeoutError):
            history.unacked += 1  # not acknowledged: may or may not be stored
            return
        assert meta.offset is not None
        history.acked[value] = (meta.partition, meta.offset)

    while not stop.is_set() and counter < 1_000_000:
        await asyncio.gather(*(one(f"{name}-{counter + i}".encode()) for i in range(8)))
        counter += 8
    with contextlib.suppress(headwater.HeadwaterError, TimeoutError):
        await asyncio.wait_for(producer.close(), 60)


async def watch(client: headwater.Client, history: History, stop: asyncio.Event) -> None:
    """A shared consumer from earliest, subscribing again whenever it ends."""
    while not stop.is_set():
        try:
            consumer = await client.subscribe(TOPIC, "watch", type="shared", start="earliest")
        except headwater.HeadwaterError:
            await asyncio.sleep(0.3)
            continue
        try:
            while not stop.is_set():
                try:
                    message = await consumer.receive(timeout=0.5)
                except TimeoutError:
                    continue
                history.saw(message.partition, message.offset, message.value)
                await message.ack()
        except headwater.HeadwaterError:
            await asyncio.sleep(0.3)
        finally:
            with contextlib.suppress(headwater.HeadwaterError, TimeoutError):
                await asyncio.wait_for(consumer.close(), 30)


async def contend(
    client: headwater.Client, name: str, history: History, stop: asyncio.Event
) -> None:
    """Take the Exclusive subscription when free, receive for a while, let it go; again."""
    rng = random.Random(f"{SEED}-{name}")
    while not stop.is_set():
        try:
            consumer = await client.subscribe(TOPIC, "solo", type="exclusive", start="earliest")
        except headwater.HeadwaterError:
            await asyncio.sleep(rng.uniform(0.05, 0.3))
            continue
        first = last = None
        until = time.monotonic() + rng.uniform(0.5, 3.0)
        try:
            while time.monotonic() < until and not stop.is_set():
                try:
                    message = await consumer.receive(timeout=0.2)
                except TimeoutError:
                    continue
                last = time.monotonic()
                first = first or last
                history.saw(message.partition, message.offset, message.value)
                await message.ack()
        except headwater.HeadwaterError:
            pass  # the holding ended (a leg could not be placed, say)
        finally:
            with contextlib.suppress(headwater.HeadwaterError, TimeoutError):
                await asyncio.wait_for(consumer.close(), 30)
        if first is not None and last is not None:
            history.holdings.append((name, first, last))


async def read_everything(client: headwater.Client, history: History) -> None:
    """The final read: every partition from earliest to its end, through a fresh subscription."""
    deadline = time.monotonic() + 120
    ends: dict[int, int] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(headwater.HeadwaterError):
            described = await client.describe_topic(TOPIC)
            ends = dict(enumerate(described.next_offsets))
            break
        await asyncio.sleep(0.5)
    acked = set(history.acked.values())
    reached: dict[int, int] = {}  # partition -> the highest offset read

    def done() -> bool:
        at_end = all(reached.get(p, -1) >= end - 1 for p, end in ends.items())
        return at_end and acked <= history.final.keys()

    consumer = await client.subscribe(TOPIC, "final", type="exclusive", start="earliest")
    try:
        while time.monotonic() < deadline and not done():
            try:
                message = await consumer.receive(timeout=0.5)
            except TimeoutError:
                continue
            except headwater.HeadwaterError:
                await asyncio.sleep(0.3)
                continue
            place = (message.partition, message.offset)
            reached[message.partition] = max(reached.get(message.partition, -1), message.offset)
            history.saw(*place, message.value)
            history.final.setdefault(place, message.value or b"")
            await message.ack()
    finally:
        await consumer.close()


def test_the_checker_sees_each_kind_of_violation() -> None:
    """The checker itself, on made-up histories: a clean one passes, and a lost message, an
    offset with two payloads, two clients receiving an Exclusive subscription at once and a
    message of the idempotent producer at two offsets are each reported."""
    clean = History(acked={b"a": (0, 0)}, final={(0, 0): b"a", (0, 1): b"b"})
    clean.holdings = [("a", 1.0, 2.0), ("b", 2.5, 3.0), ("a", 3.5, 4.0)]
    assert check(clean) == []
    lost = History(acked={b"a": (0, 0), b"b": (1, 0)}, final={(0, 0): b"a"})
    assert any("not read back" in p for p in check(lost))
    moved = History(acked={b"a": (0, 0)}, final={(0, 0): b"x", (0, 1): b"a"})
    assert any("not read back" in p for p in check(moved))  # read back, not at its offset
    clash = History(acked={b"a": (0, 0)}, final={(0, 0): b"a"})
    clash.saw(0, 0, b"other")
    assert any("two payloads" in p for p in check(clash))
    overlap = History(holdings=[("a", 1.0, 3.0), ("b", 2.0, 4.0)])
    assert any("at once" in p for p in check(overlap))
    twice = History(acked={b"i-p1-0": (0, 0)}, final={(0, 0): b"i-p1-0", (0, 1): b"i-p1-0"})
    assert any("stored twice" in p for p in check(twice))
    plain = History(acked={b"p0-0": (0, 0)}, final={(0, 0): b"p0-0", (0, 1): b"p0-0"})
    assert check(plain) == []  # at-least-once may store a resend twice
