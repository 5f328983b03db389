"""One holder per Exclusive subscription across the cluster, fenced in etcd.

A client consumes a partitioned topic of a cluster through a leg at every owner broker, each a
consumer with the same name (docs/CLUSTER.md). Each broker alone can only keep its own consumers
exclusive, so two clients subscribing at the same moment through two brokers both won. Now the
subscription's holder is decided once, in etcd:

    <prefix>/exclusive/<topic>/<subscription>   {"holder": <consumer name>,
                                                 "brokers": {<broker id>: <registration revision>}}

`claim` (before a broker attaches a consumer to an Exclusive subscription) reads the key; it
succeeds when there is none, when its holder is the same consumer name (another leg of the same
consumer), or when none of the brokers it lists is still registered under the same registration
(their broker key's create_revision: a broker that died, or died and came back, has no legs left);
it then writes the key with this broker added, by a transaction comparing the key's mod_revision
(or its absence) with what it read and this broker's own registration with the one it holds, so
of two claims racing one fails and reads again. Any other holder is CONSUMER_BUSY, naming it.
`release` (when the holder's last consumer here is gone) removes this broker from the key, and
deletes the key with the last one, by the same comparison. A release that cannot reach etcd is
retried by the caller; until then the holder keeps the subscription, never two holders.

The key has no lease: a broker that dies cannot release, and its entry counts for nothing once
its registration is gone. `ExclusiveGate` is the broker's side: it wraps SUBSCRIBE, serialises
the claims and releases of one subscription on this broker, and releases after detaches (and
every few seconds for whatever closed a consumer by another path).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from headwater.server.cluster.etcd import UNFENCED_CALL_TIMEOUT, EtcdSession, EtcdUnavailable
from headwater.server.cluster.layout import Layout
from headwater.server.reply import AfterWork, Reply
from headwater.server.requests.consumer_requests import close_consumers
from headwater.server.topics.subscription_contract import Consumer
from headwater.server.topics.subscription_contract import ConsumerSession as Session
from headwater.server.topics.topic import Topic
from headwater.wire import messages as m
from headwater.wire.errors import ConsumerBusy, ErrorCode, StorageError

log = structlog.get_logger(__name__)

CLAIM_ATTEMPTS = 8  # transactions lost to a racing claim before giving up (STORAGE_ERROR)
SWEEP_INTERVAL = 2.0  # seconds between checks for holders with no consumer left here


class ExclusiveClaims:
    """The etcd side, mixed into the coordinator (it has the session, the layout, the id)."""

    _id: str
    _layout: Layout
    _session: EtcdSession

    async def _claims_call(self, operation: Callable[[Any], Awaitable[Any]]) -> Any:
        try:
            timeout = max(UNFENCED_CALL_TIMEOUT, self._session.call_timeout)
            return await self._session.call(operation, timeout)
        except EtcdUnavailable as exc:
            raise StorageError(f"cluster metadata unavailable: {exc}") from None

    def _claim_key(self, topic: str, subscription: str) -> bytes:
        return self._layout.root("exclusive") + f"{topic}/{subscription}".encode()

    async def _registration(self, broker_id: str) -> int:
        """The create_revision of the broker's registration key (0: not registered)."""
        key = self._layout.broker(broker_id)
        found = await self._claims_call(lambda c: c.get(key))
        return 0 if found is None else int(found.create_revision)

    async def claim(self, topic: str, subscription: str, holder: str) -> None:
        """Make `holder` the subscription's holder through this broker, or raise ConsumerBusy."""
        key = self._claim_key(topic, subscription)
        mine = self._layout.broker(self._id)
        for _ in range(CLAIM_ATTEMPTS):
            registered = await self._registration(self._id)
            if not registered:
                raise StorageError(f"broker {self._id!r} is not registered in the cluster now")
            found = await self._claims_call(lambda c: c.get(key))
            current = _decode(found.value) if found is not None else None
            brokers: dict[str, int] = {}
            if current is not None:
                holder_now, listed = current
                if holder_now == holder and listed.get(self._id) == registered:
                    return  # ours here already, under this registration: nothing to write
                # our own entry counts too: under our current registration it is a consumer
                # of that holder attached here
                live = {
                    broker: revision
                    for broker, revision in listed.items()
                    if revision
                    == (registered if broker == self._id else await self._registration(broker))
                }
                if holder_now != holder and live:
                    raise ConsumerBusy(
                        f"exclusive subscription {subscription!r} of topic {topic!r} is held by "
                        f"consumer {holder_now!r} through broker(s) {', '.join(sorted(live))}"
                    )
                if holder_now == holder:
                    brokers = live
            brokers[self._id] = registered
            value = _encode(holder, brokers)
            seen = 0 if found is None else int(found.mod_revision)

            def transaction(
                c: Any, seen: int = seen, value: bytes = value, registered: int = registered
            ) -> Any:
                same = (
                    c.transactions.version(key) == 0
                    if seen == 0
                    else c.transactions.mod(key) == seen
                )
                return c.transaction(
                    compare=[same, c.transactions.create(mine) == registered],
                    success=[c.transactions.put(key, value)],
                    failure=[],
                )

            won, _ = await self._claims_call(transaction)
            if won:
                return
        raise StorageError(
            f"exclusive subscription {subscription!r} of topic {topic!r}: "
            f"{CLAIM_ATTEMPTS} claims in a row lost to concurrent changes"
        )

    async def release(self, topic: str, subscription: str, holder: str) -> None:
        """This broker no longer has a consumer of `holder`: take it off the key (deleting the
        key with the last broker). Nothing to do when the key names another holder."""
        key = self._claim_key(topic, subscription)
        for _ in range(CLAIM_ATTEMPTS):
            found = await self._claims_call(lambda c: c.get(key))
            current = _decode(found.value) if found is not None else None
            if found is None or current is None:
                return
            holder_now, listed = current
            if holder_now != holder or self._id not in listed:
                return
            rest = {b: r for b, r in listed.items() if b != self._id}
            seen = int(found.mod_revision)

            def transaction(c: Any, seen: int = seen, rest: dict[str, int] = rest) -> Any:
                change = (
                    c.transactions.put(key, _encode(holder, rest))
                    if rest
                    else c.transactions.delete(key)
                )
                return c.transaction(
                    compare=[c.transactions.mod(key) == seen], success=[change], failure=[]
                )

            won, _ = await self._claims_call(transaction)
            if won:
                return
        raise StorageError(f"exclusive subscription {subscription!r}: release kept losing races")


def _encode(holder: str, brokers: dict[str, int]) -> bytes:
    return json.dumps({"holder": holder, "brokers": brokers}, sort_keys=True).encode()


def _decode(raw: bytes) -> tuple[str, dict[str, int]] | None:
    try:
        value = json.loads(raw)
        holder, brokers = value["holder"], value["brokers"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(holder, str) or not isinstance(brokers, dict):
        return None
    return holder, {str(b): int(r) for b, r in brokers.items() if isinstance(r, int)}


Handler = Callable[[Session, Any], Reply]


class ExclusiveGate:
    """The broker's side: SUBSCRIBE to an Exclusive subscription claims first; the claim is
    released once this broker has no consumer of the holder left on the subscription."""

    def __init__(self, claims: ExclusiveClaims, topics: dict[str, Topic]) -> None:
        self._claims = claims
        self._topics = topics
        self._held: set[tuple[str, str, str]] = set()  # (topic, subscription, holder) claimed
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def close(self) -> None:
        for task in [*self._tasks, *([self._sweeper] if self._sweeper else [])]:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._sweeper is not None:
            await asyncio.gather(self._sweeper, return_exceptions=True)

    def wrap(self, subscribe: Handler) -> Handler:
        def gated(session: Session, request: m.SubscribeRequest) -> Reply:
            if request.sub_type != m.SubscriptionType.EXCLUSIVE:
                return subscribe(session, request)
            return AfterWork(self._subscribe(subscribe, session, request))

        return gated

    async def _subscribe(
        self, subscribe: Handler, session: Session, request: m.SubscribeRequest
    ) -> Reply:
        topic, name, holder = request.topic, request.subscription, request.consumer_name
        async with self._lock(topic, name):
            await self._claims.claim(topic, name, holder)
            self._held.add((topic, name, holder))
            try:
                reply = subscribe(session, request)
                while isinstance(reply, AfterWork):
                    reply = await reply.work
            except BaseException:
                self._release_soon(topic, name, holder)
                raise
        return reply

    def _lock(self, topic: str, subscription: str) -> asyncio.Lock:
        return self._locks.setdefault((topic, subscription), asyncio.Lock())

    def _attached(self, topic: str, subscription: str, holder: str) -> bool:
        found = self._topics.get(topic)
        kind = found.subscriptions.get(subscription) if found is not None else None
        if kind is None:
            return False
        return any(c.name == holder for c in kind.consumers.values())

    def detached_consumer(self, consumer: Consumer) -> None:
        """A consumer left (unsubscribed, its connection closed): release if it was the last."""
        subscription = consumer.subscription
        if (subscription.topic, subscription.name, consumer.name) in self._held:
            self._release_soon(subscription.topic, subscription.name, consumer.name)

    def _release_soon(self, topic: str, subscription: str, holder: str) -> None:
        task = asyncio.get_running_loop().create_task(self._release(topic, subscription, holder))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release(self, topic: str, subscription: str, holder: str) -> None:
        async with self._lock(topic, subscription):
            if self._attached(topic, subscription, holder):
                return  # attached again meanwhile (a leg placed anew): still the holder here
            try:
                await self._claims.release(topic, subscription, holder)
            except StorageError as exc:
                log.warning(
                    "cluster.exclusive_release_failed",
                    topic=topic,
                    subscription=subscription,
                    holder=holder,
                    error=str(exc),
                )
                return  # still in _held: the sweep tries again
            self._held.discard((topic, subscription, holder))
            log.info(
                "cluster.exclusive_released", topic=topic, subscription=subscription, holder=holder
            )

    async def _sweep(self) -> None:
        """Release the claims whose consumers went by a path that did not tell us (the topic or
        subscription deleted, a partition lost), and the releases that failed; and claim again
        the ones still attached here: this broker's entry counts only under its current
        registration (after its lease expired, say in a long pause, and it registered again), and
        a claim lost meanwhile to another holder closes the consumers here (CONSUMER_BUSY)."""
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            for topic, subscription, holder in list(self._held):
                with contextlib.suppress(StorageError):
                    if not self._attached(topic, subscription, holder):
                        await self._release(topic, subscription, holder)
                    else:
                        await self._reassert(topic, subscription, holder)

    async def _reassert(self, topic: str, subscription: str, holder: str) -> None:
        async with self._lock(topic, subscription):
            try:
                await self._claims.claim(topic, subscription, holder)
            except ConsumerBusy as exc:
                found = self._topics.get(topic)
                kind = found.subscriptions.get(subscription) if found is not None else None
                if kind is not None:
                    close_consumers(
                        [c for c in kind.consumers.values() if c.name == holder],
                        ErrorCode.CONSUMER_BUSY,
                        exc.message,
                    )
                self._held.discard((topic, subscription, holder))
                log.warning(
                    "cluster.exclusive_lost",
                    topic=topic,
                    subscription=subscription,
                    holder=holder,
                    error=exc.message,
                )
