"""The etcd coordinator: membership, ownership and fencing for `headwater serve --cluster`.

At start the broker grants itself a lease (TTL `lease_ttl`) and registers
`<prefix>/brokers/<id>` under it by a create-only transaction (a second broker with the same id is
refused, after waiting one TTL for a killed predecessor's lease to run out). It then reads and
watches the brokers, owner keys, topics and subscriptions (etcd.PrefixWatch), and runs three
loops:

- keepalive, every TTL/3: a renewal *sent* at t and confirmed moves the serving deadline to
  t + TTL - TTL/4. etcd expires the lease no earlier than TTL after it received that renewal, so
  the broker stops serving (fenced) at least TTL/4 before another broker can win its keys: a
  partition is never served by two brokers at once, whatever the clocks' rates within that margin.
- watchdog: when the deadline passes unconfirmed, every held partition is fenced
  (`handler.lost`), and nothing is acquired until etcd answers. If the lease survived (etcd keeps
  leases across its own restart), the keys still ours are acquired again with the same epoch; if
  it expired, the broker takes a new lease, registers again and rebalances from nothing.
- rebalance (assignment.Assignment): takes free partitions, hands off others to a joining broker.

`serves()` is True only for a SERVING partition while the deadline is ahead, checked at each call
(no timer has to fire for it to turn False).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import asdict
from typing import Any, Final

import structlog

from headwater.server.cluster.assignment import ACQUISITIONS_AT_ONCE, Assignment
from headwater.server.cluster.coordinator_state import (
    Counters,
    DuplicateBroker,
    EtcdUnreachable,
    Held,
    PartitionHandler,
    Standing,
    State,
)
from headwater.server.cluster.etcd import Entry, EtcdSession, EtcdUnavailable, PrefixWatch
from headwater.server.cluster.exclusive_claims import ExclusiveClaims
from headwater.server.cluster.layout import DEFAULT_PREFIX, Layout, decode, encode, parse_endpoint
from headwater.server.cluster.metadata import Metadata, SubscriptionCallback, TopicCallback
from headwater.server.requests.partition_ownership import BrokerAddress
from headwater.storage.tasks import end_tasks

log = structlog.get_logger(__name__)

# How long a starting broker keeps trying an etcd that does not answer before it gives up: an
# etcd restart or a slow moment under load passes; a wrong address still fails the start.
START_PATIENCE: Final = 10.0


class Coordinator(Assignment, Metadata, ExclusiveClaims):
    def __init__(
        self,
        endpoint: str,
        this_broker: BrokerAddress,
        *,
        lease_ttl: float = 2.0,
        prefix: str = DEFAULT_PREFIX,
        rebalance_interval: float = 1.0,
        acquire_timeout: float = 30.0,
        release_timeout: float = 30.0,
        handoff_after: float = 300.0,
        kafka: tuple[str, int] | None = None,
        start_patience: float = START_PATIENCE,
    ) -> None:
        """`kafka`: where this broker's Kafka listener is reached (host, port), registered
        with it so that every broker's Kafka Metadata can name it; None: no Kafka port.
        `start_patience`: how long `start` keeps trying an etcd that does not answer."""
        self.endpoint = endpoint
        self._endpoints = parse_endpoint(endpoint)
        self._this = this_broker
        self._id = this_broker.broker_id
        if not self._id or "/" in self._id:
            raise ValueError(f"broker id {self._id!r} must be non-empty and without '/'")
        self._layout = Layout(prefix)
        self._lease_ttl = lease_ttl
        # etcd counts leases in whole seconds
        self._requested_ttl = max(2, math.ceil(lease_ttl))
        self._granted_ttl = self._requested_ttl
        self._rebalance_interval = rebalance_interval
        self._acquire_timeout = acquire_timeout
        self._release_timeout = release_timeout
        self._handoff_after = handoff_after
        self._start_patience = start_patience
        # a deadline on every etcd call (a blackholed etcd must not hang anything); generous,
        # because a slow answer costs nothing but time: a renewal counts from when it was sent,
        # and the watchdog fences on the deadline whatever the calls in flight
        self._call_timeout = max(2.0, lease_ttl / 2)
        self.handler: PartitionHandler | None = None
        self.on_topic: TopicCallback | None = None
        self.on_subscription: SubscriptionCallback | None = None
        self._lease_id = 0
        self._deadline = 0.0
        self._fenced = False
        self._registered = False
        self._reachable = True
        self._stopping = False
        self._held: dict[tuple[str, int], Held] = {}
        self._owners: dict[tuple[str, int], Entry] = {}
        self._round_owners: dict[str, tuple[tuple[int, str], ...]] = {}
        self._round_choices: dict[tuple[frozenset[str], str], tuple[tuple[str, ...], ...]] = {}
        self._brokers: dict[str, BrokerAddress] = {}
        self._kafka = kafka
        # live broker id -> its Kafka listener's (host, port), for those that have one
        self._kafka_addresses: dict[str, tuple[str, int]] = {}
        self._broker_ids: set[str] = set()
        self._joined: dict[str, float] = {}  # broker id -> when this broker first saw it live
        self._topics: dict[str, dict[str, Any]] = {}
        self._incarnations: dict[str, int] = {}
        self._subscriptions: dict[str, dict[str, dict[str, Any]]] = {}
        self._counters = Counters()
        self._free_since: dict[tuple[str, int], float] = {}
        self._backoff: dict[tuple[str, int], tuple[float, float]] = {}
        self._releasing: set[asyncio.Task[None]] = set()
        self._pending: set[tuple[str, int]] = set()
        # take-overs under way that a produce waits for (`taking_over`), done when each ends
        self._take_overs: dict[tuple[str, int], asyncio.Future[None]] = {}
        self._acquiring: set[tuple[str, int]] = set()
        self._acquisitions: set[asyncio.Task[None]] = set()
        self._acquire_limit = asyncio.Semaphore(ACQUISITIONS_AT_ONCE)
        self._change: asyncio.Future[None] | None = None  # `changed()`'s, until the next change
        self._in_handler: set[tuple[str, int]] = set()
        self._deleted: set[int] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._watches: list[PrefixWatch] = []

    # lifecycle

    async def start(self) -> None:
        """Connect, take a lease, register, read and watch, start the loops. `EtcdUnreachable` or
        `DuplicateBroker` (both `StartupError`s) when the broker cannot join.

        An etcd that does not answer is tried again, the whole join from a new session, for
        `start_patience` seconds: a broker restarted during an etcd blip, or while etcd is slow
        under load (its connection timing out before etcd's first answer), waits for it instead
        of exiting. An etcd that never answers is still a start-up error within that time."""
        self._wake = asyncio.Event()
        self._topics_changed = asyncio.Condition()
        deadline = time.monotonic() + self._start_patience
        delay = 0.2
        while True:
            self._session = EtcdSession(self._endpoints, self._call_timeout)
            try:
                await self._join()
                break
            except EtcdUnavailable as exc:
                await self._abandon()
                if time.monotonic() + delay >= deadline:
                    raise EtcdUnreachable(f"cannot reach etcd at {self.endpoint}: {exc}") from None
                log.warning("cluster.join_retry", error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            except BaseException:
                await self._abandon()
                raise
        for watch in self._watches:
            watch.start()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._keepalive()),
            loop.create_task(self._watchdog()),
            loop.create_task(self._assign()),
        ]
        self._wake.set()
        log.info(
            "cluster.started",
            broker=str(self._this),
            lease=self._lease_id,
            ttl=self._granted_ttl,
            endpoint=self._session.current,
        )

    async def _join(self) -> None:
        """Lease, registration, the watches' first reads: what `start` tries again."""
        await self._new_lease()
        await self._register(patience=self._lease_ttl + 1.0)
        self._owners_watch = PrefixWatch(
            self._session, self._layout.root("owners"), self._owner_changed
        )
        self._watches = [
            PrefixWatch(self._session, self._layout.root("brokers"), self._broker_changed),
            self._owners_watch,
            PrefixWatch(self._session, self._layout.root("topics"), self._topic_changed),
            PrefixWatch(
                self._session,
                self._layout.root("subscriptions"),
                self._subscription_changed,
            ),
        ]
        for watch in self._watches:
            await watch.load()

    async def _abandon(self) -> None:
        if self._lease_id:
            with contextlib.suppress(EtcdUnavailable):
                await self._session.call(lambda c: c.revoke_lease(self._lease_id))
            self._lease_id = 0
        await self._session.close()

    async def stop(self, graceful: bool = True) -> None:
        """Hand off every partition (release, then delete its key) and revoke the lease, which
        deletes the registration; with `graceful=False`, lost() for each and revoke at once."""
        if self._stopping or not hasattr(self, "_session"):
            return  # stopped already, or never started
        self._stopping = True
        self._wake.set()
        assign = self._tasks[-1] if self._tasks else None
        if assign is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._acquire_timeout):
                    await asyncio.shield(assign)
        if self._acquisitions:  # the take-overs under way end before the hand-off
            await asyncio.wait(set(self._acquisitions), timeout=self._acquire_timeout)
        if graceful and self._healthy(stopping=True):
            for key in list(self._held):
                self._start_release(key, "broker stopping")
        else:
            for key, held in list(self._held.items()):
                if held.state in (State.SERVING, State.RELEASING):
                    self._lose(key, held, "broker stopping")
        if self._releasing:
            await asyncio.wait(set(self._releasing), timeout=self._release_timeout + 2.0)
        await end_tasks(*self._tasks, *self._acquisitions)
        for watch in self._watches:
            await watch.stop()
        for key, held in list(self._held.items()):
            if held.state in (State.SERVING, State.ACQUIRING, State.RELEASING):
                self._lose(key, held, "broker stopping")
        self._held.clear()
        try:
            await self._session.call(lambda c: c.revoke_lease(self._lease_id))
        except EtcdUnavailable as exc:
            log.warning("cluster.revoke_failed", error=str(exc))
        await self._session.close()
        log.info("cluster.stopped", broker=str(self._this), graceful=graceful)

    # lease, registration, fencing

    async def _new_lease(self) -> None:
        sent = time.monotonic()
        lease = await self._session.call(lambda c: c.lease(self._requested_ttl))
        self._lease_id = int(lease.id)
        self._granted_ttl = int(lease.ttl)
        self._deadline = sent + self._granted_ttl - self._margin()
        self._counters.new_leases += 1

    def _margin(self) -> float:
        return self._granted_ttl / 4

    async def _register(self, patience: float) -> None:
        key = self._layout.broker(self._id)
        details: dict[str, Any] = {
            "host": self._this.host,
            "port": self._this.port,
            "started": time.time(),
        }
        if self._kafka is not None:
            details["kafka_host"], details["kafka_port"] = self._kafka
        value = encode(details)
        lease = self._lease_id
        give_up = time.monotonic() + patience
        while True:
            won, _ = await self._session.call(
                lambda c: c.transaction(
                    compare=[c.transactions.create(key) == 0],
                    success=[c.transactions.put(key, value, lease=lease)],
                    failure=[],
                )
            )
            if won:
                self._registered = True
                return
            if time.monotonic() >= give_up:
                found = await self._session.call(lambda c: c.get(key))
                holder = decode(found.value) if found is not None else None
                raise DuplicateBroker(
                    f"broker id {self._id!r} is already registered in etcd by a live broker "
                    f"({holder.get('host') if holder else '?'}:"
                    f"{holder.get('port') if holder else '?'}): give each broker its own "
                    "--broker-id"
                )
            await asyncio.sleep(0.2)

    async def _keepalive(self) -> None:
        while True:
            period = self._granted_ttl / 3
            sent = time.monotonic()
            try:
                reply = await self._session.call(lambda c: c.refresh_lease(self._lease_id))
                if reply is None:
                    raise EtcdUnavailable("keepalive stream ended without an answer")
            except EtcdUnavailable as exc:
                self._counters.lease_failures += 1
                if self._reachable:
                    self._reachable = False
                    log.warning("cluster.etcd_unreachable", error=str(exc))
                await asyncio.sleep(min(period, 0.2))
                continue
            ttl = int(reply.TTL)
            try:
                if ttl <= 0:
                    await self._lease_expired()
                else:
                    self._deadline = max(self._deadline, sent + ttl - self._margin())
                    self._counters.lease_renewals += 1
                    if not self._reachable or self._fenced or not self._registered:
                        await self._recover()
            except Exception:
                # never let the renewals stop: without them every partition would stay fenced
                log.exception("cluster.keepalive_failed")
            await asyncio.sleep(max(0.0, sent + period - time.monotonic()))

    async def _watchdog(self) -> None:
        while True:
            left = self._deadline - time.monotonic()
            if left <= 0 and not self._fenced:
                self._fence()
            await asyncio.sleep(min(max(left, 0.01), 0.5))

    def _fence(self) -> None:
        self._fenced = True
        self._counters.fencings += 1
        log.warning("cluster.fenced", broker=self._id, held=len(self._held))
        for key, held in list(self._held.items()):
            if held.state in (State.SERVING, State.RELEASING):
                held.state = State.FENCED
                self._counters.losses += 1
                log.warning("cluster.lost", topic=key[0], partition=key[1], reason="fenced")
                if self.handler is not None:
                    with contextlib.suppress(Exception):
                        self.handler.lost(*key)
            elif held.state is State.ACQUIRING:
                held.state = State.FENCED  # `_serve` calls lost() when the handler returns

    async def _recover(self) -> None:
        """etcd answers again (and the lease is alive): read everything afresh; the next
        rebalance round re-acquires the fenced keys still ours."""
        if not self._registered:
            try:
                await self._register(patience=0.0)
            except DuplicateBroker as exc:
                log.error("cluster.register_refused", error=str(exc))
                return
            except EtcdUnavailable:
                return
        log.info("cluster.etcd_reachable", fenced=self._fenced)
        self._reachable = True
        for watch in self._watches:
            watch.restart()
        self._fenced = False
        self._wake.set()

    async def _lease_expired(self) -> None:
        log.warning("cluster.lease_expired", lease=self._lease_id)
        if not self._fenced:
            self._fence()
        self._fenced = True
        self._registered = False
        self._held.clear()  # the keys went with the lease
        try:
            await self._new_lease()
        except EtcdUnavailable:
            return
        await self._recover()

    def _healthy(self, stopping: bool = False) -> bool:
        return (
            (stopping or not self._stopping)
            and self._registered
            and self._reachable
            and not self._fenced
            and time.monotonic() < self._deadline
            and all(watch.synced.is_set() for watch in self._watches)
        )

    async def _assign(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._rebalance_interval):
                    await self._wake.wait()
            self._wake.clear()
            if self._stopping or not self._healthy():
                continue
            try:
                await self._rebalance()
            except Exception:
                log.exception("cluster.rebalance_failed")

    async def _broker_changed(self, raw: bytes, entry: Entry | None) -> None:
        broker_id = self._layout.name_in("brokers", raw)
        details = decode(entry.value) if entry is not None else None
        if details is None:
            if self._brokers.pop(broker_id, None) is not None:
                # its lease expired (a crash) or was revoked (a clean stop): when a failover's
                # detection ended, for operators and the failover benchmark
                log.info("cluster.broker_gone", broker=broker_id)
            self._broker_ids.discard(broker_id)
            self._joined.pop(broker_id, None)
            self._kafka_addresses.pop(broker_id, None)
        else:
            host, port = details.get("host"), details.get("port")
            if not isinstance(host, str) or not isinstance(port, int):
                return
            self._brokers[broker_id] = BrokerAddress(broker_id, host, port)
            kafka_host, kafka_port = details.get("kafka_host"), details.get("kafka_port")
            if isinstance(kafka_host, str) and isinstance(kafka_port, int):
                self._kafka_addresses[broker_id] = (kafka_host, kafka_port)
            else:  # registered without a Kafka port (or by an older broker)
                self._kafka_addresses.pop(broker_id, None)
            self._broker_ids.add(broker_id)
            self._joined.setdefault(broker_id, time.monotonic())
        self._wake.set()
        self._signal_change()

    # Ownership

    @property
    def this_broker(self) -> BrokerAddress:
        return self._this

    def serves(self, topic: str, partition: int) -> bool:
        held = self._held.get((topic, partition))
        return (
            held is not None and held.state is State.SERVING and time.monotonic() < self._deadline
        )

    def serves_every(self, topic: str, partitions: int) -> bool:
        return all(self.serves(topic, partition) for partition in range(partitions))

    def standing(self, topic: str, partition: int) -> Standing:
        """Unlike `serves`, a partition being handed off is still HELD (its last chunks are
        stored and acknowledged during the release), and a lease confirmation that is late is
        LAPSED rather than over."""
        held = self._held.get((topic, partition))
        if held is None or held.state not in (State.SERVING, State.RELEASING):
            return Standing.GONE
        return Standing.HELD if time.monotonic() < self._deadline else Standing.LAPSED

    def owner(self, topic: str, partition: int) -> BrokerAddress | None:
        """The partition's owner as this broker knows it. Never this broker once its serving
        deadline has passed: a broker that wakes from a freeze (SIGSTOP, a long pause) past its
        lease has lost what it held, though neither its watchdog nor its watches have run yet;
        LOOKUP and Kafka's Metadata then name no owner here (the other brokers name the new
        one), and its requests are refused NOT_OWNER (`serves`, checked before any append)."""
        held = self._held.get((topic, partition))
        lapsed = time.monotonic() >= self._deadline
        if held is not None and held.state is State.SERVING and not lapsed:
            return self._this
        entry = self._owners.get((topic, partition))
        if entry is None:
            return None
        broker_id = entry.value.decode(errors="replace")
        if broker_id == self._id:
            return None if lapsed else self._this
        return self._brokers.get(broker_id)

    def brokers(self) -> list[BrokerAddress]:
        others = [b for i, b in sorted(self._brokers.items()) if i != self._id]
        return [self._this, *others]

    def kafka_addresses(self) -> dict[str, tuple[str, int]]:
        """Live broker id -> its Kafka listener's (host, port), for the brokers registered
        with one (this one included, whatever the watch has shown yet)."""
        found = dict(self._kafka_addresses)
        if self._kafka is not None:
            found[self._id] = self._kafka
        else:
            found.pop(self._id, None)
        return found

    def epoch(self, topic: str, partition: int) -> int | None:
        held = self._held.get((topic, partition))
        return held.epoch if held is not None else None

    @property
    def lease_ms(self) -> int:
        """The lease etcd granted this broker (whole seconds, at least 2), in ms, for LOOKUP: a
        frozen or dead owner's partitions are taken over once it runs out."""
        return self._granted_ttl * 1000

    def owner_epoch(self, topic: str, partition: int) -> int:
        """The epoch of the partition's owner as last seen (0: no owner), for LOOKUP."""
        held = self._held.get((topic, partition))
        if held is not None:
            return held.epoch
        entry = self._owners.get((topic, partition))
        return entry.create_revision if entry is not None else 0

    def owned(self) -> list[tuple[str, int]]:
        return sorted(k for k, held in self._held.items() if held.state is State.SERVING)

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "broker": {"id": self._id, "host": self._this.host, "port": self._this.port},
            "etcd": {"endpoint": self.endpoint, "reachable": self._reachable},
            "lease": {
                "id": self._lease_id,
                "ttl": self._granted_ttl,
                "serving_for": round(max(0.0, self._deadline - now), 3),
                "fenced": self._fenced,
                "registered": self._registered,
            },
            "brokers": [
                {"id": b.broker_id, "host": b.host, "port": b.port} for b in self.brokers()
            ],
            "partitions": [
                {"topic": t, "partition": p, "epoch": h.epoch, "state": h.state.value}
                for (t, p), h in sorted(self._held.items())
            ],
            "topics": len(self._topics),
            "counters": asdict(self._counters),
        }
