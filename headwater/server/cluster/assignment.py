"""Which partitions this broker takes, hands off and gives up: the rebalance round.

Every live broker ranks each partition's candidates by rendezvous hash (layout.rendezvous) and
they all compute the same ranking from the same membership. A free partition (no owner key) is
taken at once by its first choice; the k-th choice takes it once it has been free for k lease
TTLs, so a first choice that cannot take it (acquire fails, or it is cut off from etcd) never
leaves it unowned. An owner key is only ever created by a transaction comparing create_revision
with 0, and only ever deleted by a transaction comparing it with the epoch held: a key is never
overwritten, so a partition never has two owners at once.

A broker serving a partition whose first choice is now another broker that has been live for
`handoff_after` (it joined, or came back) hands it off: serves() turns False, `handler.release`
finishes the in-flight writes, the key is deleted, and the first choice takes it. Not before: a
broker that crashed and restarted does not take its partitions back from healthy owners at once
(a second outage for their clients), nor over and over if it keeps crashing; it gets free
partitions at once, and its share of the others once it has stayed up. At most
`HANDOFFS_AT_ONCE` hand-offs run at a time, so a joining broker gets its share a few partitions
at a time while the rest keep being served.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import structlog

from headwater.server.cluster.coordinator_state import Counters, Held, PartitionHandler, State
from headwater.server.cluster.etcd import Entry, EtcdSession, EtcdUnavailable, PrefixWatch
from headwater.server.cluster.layout import Layout, balanced, partitions_of, rendezvous

log = structlog.get_logger(__name__)

HANDOFFS_AT_ONCE = 2
ACQUISITIONS_AT_ONCE = 4
# how long a partition this broker took as a fallback stays before it may be handed back
FALLBACK_HOLD_TTLS = 5
MAX_BACKOFF = 30.0


class Assignment:
    # the coordinator's state the rounds use (set in Coordinator.__init__ and start)
    handler: PartitionHandler | None
    _id: str
    _layout: Layout
    _session: EtcdSession
    _lease_id: int
    _lease_ttl: float
    _deadline: float
    _held: dict[tuple[str, int], Held]
    _owners: dict[tuple[str, int], Entry]
    _broker_ids: set[str]
    _joined: dict[str, float]
    _handoff_after: float
    _topics: dict[str, dict[str, Any]]
    _counters: Counters
    _owners_watch: PrefixWatch
    _acquire_timeout: float
    _take_overs: dict[tuple[str, int], asyncio.Future[None]]
    _acquiring: set[tuple[str, int]]  # keys whose acquisition task is scheduled or running
    _acquisitions: set[asyncio.Task[None]]
    _acquire_limit: asyncio.Semaphore
    _change: asyncio.Future[None] | None
    _release_timeout: float
    _free_since: dict[tuple[str, int], float]
    _backoff: dict[tuple[str, int], tuple[float, float]]
    _releasing: set[asyncio.Task[None]]
    _pending: set[tuple[str, int]]
    _in_handler: set[tuple[str, int]]
    _deleted: set[int]  # epochs of keys we deleted, until the watch shows them gone
    # each `_rebalance` sets them: the owners at its start, and the choices made from them
    _round_owners: dict[str, tuple[tuple[int, str], ...]]
    _round_choices: dict[tuple[frozenset[str], str], tuple[tuple[str, ...], ...]]
    _wake: asyncio.Event

    def _healthy(self, stopping: bool = False) -> bool:
        raise NotImplementedError

    def _partitions(self) -> set[tuple[str, int]]:
        return {
            (topic, partition)
            for topic, definition in self._topics.items()
            for partition in range(partitions_of(definition))
        }

    def _preference(self, live: set[str], key: tuple[str, int]) -> list[str]:
        """The brokers in order of preference for a partition, first choices balanced per topic
        and sticky: the live owners keep what they hold within their share (`balanced`)."""
        topic, partition = key
        count = partitions_of(self._topics.get(topic, {}))
        if partition >= count:
            return rendezvous(live, topic, partition)
        brokers = frozenset(live)
        choices = self._round_choices.get((brokers, topic))
        if choices is None:  # once per topic and round: hashing the owners costs a pass over them
            choices = balanced(brokers, topic, count, self._round_owners.get(topic, ()))
            self._round_choices[(brokers, topic)] = choices
        return list(choices[partition])

    def _owners_by_topic(self) -> dict[str, tuple[tuple[int, str], ...]]:
        """Each topic's owners as the watch shows them, (partition, broker) by partition."""
        found: dict[str, list[tuple[int, str]]] = {}
        for (topic, partition), entry in self._owners.items():
            found.setdefault(topic, []).append((partition, entry.value.decode(errors="replace")))
        return {topic: tuple(sorted(owned)) for topic, owned in found.items()}

    async def _rebalance(self) -> None:
        now = time.monotonic()
        live = self._broker_ids | {self._id}
        # the owners at the round's start: every choice of the round is made from one view
        self._round_owners = self._owners_by_topic()
        self._round_choices = {}
        wanted = self._partitions()
        self._orphans()
        for key in [k for k in self._free_since if k not in wanted]:
            del self._free_since[key]
        for key, held in list(self._held.items()):
            if self._held.get(key) is not held:
                continue  # changed while an earlier key's deletion was awaited
            if held.state is State.RELEASED:
                await self._delete_owner(key, held)
            elif key not in wanted and held.state is State.SERVING:
                if key[0] in self._topics:  # fewer partitions: hand the extra ones off cleanly
                    self._start_release(key, "partition gone")
                else:  # a deleted topic: nothing to finish (its keys usually went with it)
                    self._lose(key, held, "topic deleted")
                    gone = Held(held.epoch, State.RELEASED)
                    self._held[key] = gone
                    await self._delete_owner(key, gone)
        picks: list[tuple[tuple[str, int], bool]] = []
        for key in sorted(wanted):
            if key in self._owners or key in self._held:
                self._free_since.pop(key, None)
                continue
            if key in self._acquiring:  # an earlier round's acquisition, not started yet
                continue
            since = self._free_since.setdefault(key, now)
            retry_at = self._backoff.get(key, (0.0, 0.0))[0]
            if retry_at > now:
                continue
            rank = self._preference(live, key).index(self._id)
            if rank == 0 or now - since >= rank * self._lease_ttl:
                picks.append((key, rank > 0))
        for key, held in self._revivals():
            self._start_acquisition(key, partial(self._serve, key, held))
        for key, fallback in picks:
            self._start_acquisition(key, partial(self._take, key, fallback))
        self._hand_off(live, now)

    def _start_acquisition(self, key: tuple[str, int], work: Callable[[], Awaitable[None]]) -> None:
        """Acquire `key` in a task of its own, at most ACQUISITIONS_AT_ONCE at a time: a round
        does not wait for its take-overs. It did: a partition freed a moment after another
        (the watch delivers a lease's expired keys one by one, and the first woke a round)
        waited for the first one's whole take-over, a claim in the object store, before a
        round could take it: 250-600 ms more to its failover (issue 42)."""
        self._acquiring.add(key)
        task = asyncio.get_running_loop().create_task(self._acquisition(key, work))
        self._acquisitions.add(task)
        task.add_done_callback(self._acquisitions.discard)

    async def _acquisition(self, key: tuple[str, int], work: Callable[[], Awaitable[None]]) -> None:
        try:
            async with self._acquire_limit:
                await work()
        except Exception:
            log.exception("cluster.acquisition_failed", topic=key[0], partition=key[1])
        finally:
            self._acquiring.discard(key)
            self._wake.set()  # the next round sees what it left (a failure's backoff, a key)

    async def _take(self, key: tuple[str, int], fallback: bool) -> None:
        if self._healthy():
            await self._acquire(key, fallback)

    def _hand_off(self, live: set[str], now: float) -> None:
        room = HANDOFFS_AT_ONCE - len(self._releasing)
        # only brokers that have stayed up long enough are handed partitions
        settled = {
            b
            for b in live
            if b == self._id or now - self._joined.get(b, now) >= self._handoff_after
        }
        for key, held in sorted(self._held.items()):
            if room <= 0:
                return
            if held.state is not State.SERVING:
                continue
            if held.fallback and now - held.since < FALLBACK_HOLD_TTLS * self._lease_ttl:
                continue
            first = self._preference(settled, key)[0]
            if first != self._id:
                self._start_release(key, f"hand-off to {first}")
                room -= 1

    def taking_over(self, topic: str, partition: int) -> asyncio.Future[None] | None:
        key = (topic, partition)
        held = self._held.get(key)
        if key not in self._pending and (held is None or held.state is not State.ACQUIRING):
            return None
        future = self._take_overs.get(key)
        if future is None:
            future = self._take_overs[key] = asyncio.get_running_loop().create_future()
        return future

    def changed(self) -> asyncio.Future[None]:
        if self._change is None or self._change.done():
            self._change = asyncio.get_running_loop().create_future()
        return self._change

    def _signal_change(self) -> None:
        change, self._change = self._change, None
        if change is not None and not change.done():
            change.set_result(None)

    def _take_over_ended(self, key: tuple[str, int]) -> None:
        """The take-over of `key` ended (served, given up, or the key not won): the produces
        waiting for it go on, and LOOKUP long polls look again."""
        future = self._take_overs.pop(key, None)
        if future is not None and not future.done():
            future.set_result(None)
        self._signal_change()

    async def _acquire(self, key: tuple[str, int], fallback: bool) -> None:
        try:
            await self._win_and_serve(key, fallback)
        finally:
            self._take_over_ended(key)

    async def _win_and_serve(self, key: tuple[str, int], fallback: bool) -> None:
        topic, partition = key
        owner_key = self._layout.owner(topic, partition)
        topic_key = self._layout.topic(topic)
        lease = self._lease_id

        def transaction(c: Any) -> Any:
            return c.transaction(
                compare=[
                    c.transactions.create(owner_key) == 0,
                    c.transactions.version(topic_key) > 0,
                ],
                success=[c.transactions.put(owner_key, self._id.encode(), lease=lease)],
                failure=[],
            )

        self._pending.add(key)
        try:
            won, responses = await self._session.call(transaction)
        except EtcdUnavailable as exc:
            log.info(
                "cluster.acquire_unconfirmed", topic=topic, partition=partition, error=str(exc)
            )
            # the put may have happened: the owners watch shows it, and a later round
            # deletes a key of ours that nobody serves (`_orphans`)
            return
        finally:
            self._pending.discard(key)
        if not won:
            return
        epoch = int(responses[0].response_put.header.revision)
        held = Held(epoch, State.ACQUIRING, fallback=fallback)
        self._held[key] = held
        await self._serve(key, held)

    async def _serve(self, key: tuple[str, int], held: Held) -> None:
        """`handler.acquire` for a key we hold (won now, or still ours after an outage), then
        SERVING; if it raises, the key is given up and retried after a backoff."""
        try:
            await self._take_over(key, held)
        finally:
            self._take_over_ended(key)

    async def _take_over(self, key: tuple[str, int], held: Held) -> None:
        topic, partition = key
        log.info("cluster.acquiring", topic=topic, partition=partition, epoch=held.epoch)
        if self.handler is not None:
            self._in_handler.add(key)
            try:
                async with asyncio.timeout(self._acquire_timeout):
                    await self.handler.acquire(topic, partition, held.epoch)
            except Exception as exc:
                self._counters.acquire_failures += 1
                _, failures = self._backoff.get(key, (0.0, 0.0))
                delay = min(MAX_BACKOFF, self._lease_ttl * 2 ** min(failures, 5))
                self._backoff[key] = (time.monotonic() + delay, failures + 1)
                log.warning(
                    "cluster.acquire_failed",
                    topic=topic,
                    partition=partition,
                    epoch=held.epoch,
                    error=repr(exc),
                    retry_in=delay,
                )
                if held.state is State.ACQUIRING:
                    held.state = State.RELEASED
                    await self._delete_owner(key, held)
                elif held.state is State.LOST and self._held.get(key) is held:
                    del self._held[key]
                return
            finally:
                self._in_handler.discard(key)
        if held.state is not State.ACQUIRING:
            # fenced or lost while the handler was acquiring: it must stop again (a fenced key
            # that is still ours is acquired again when etcd answers)
            if self.handler is not None:
                self.handler.lost(topic, partition)
            if held.state is State.LOST and self._held.get(key) is held:
                del self._held[key]
            return
        held.state = State.SERVING
        held.since = time.monotonic()
        self._backoff.pop(key, None)
        self._counters.acquisitions += 1
        log.info("cluster.acquired", topic=topic, partition=partition, epoch=held.epoch)

    def _revivals(self) -> list[tuple[tuple[str, int], Held]]:
        """Fenced keys, once etcd answers again: still ours (same epoch, our lease) -> acquire
        again; otherwise forgotten (lost() was called when they were fenced)."""
        found = []
        for key, held in list(self._held.items()):
            if held.state is not State.FENCED or key in self._in_handler:
                continue
            entry = self._owners.get(key)
            if (
                entry is not None
                and entry.create_revision == held.epoch
                and entry.lease == self._lease_id
            ):
                held.state = State.ACQUIRING
                found.append((key, held))
            else:
                del self._held[key]
        return found

    def _start_release(self, key: tuple[str, int], reason: str) -> None:
        held = self._held.get(key)
        if held is None or held.state is not State.SERVING:
            return
        held.state = State.RELEASING
        task = asyncio.get_running_loop().create_task(self._release(key, held, reason))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _release(self, key: tuple[str, int], held: Held, reason: str) -> None:
        topic, partition = key
        log.info("cluster.releasing", topic=topic, partition=partition, reason=reason)
        if self.handler is not None:
            try:
                async with asyncio.timeout(self._release_timeout):
                    await self.handler.release(topic, partition)
            except Exception as exc:
                log.warning(
                    "cluster.release_failed", topic=topic, partition=partition, error=repr(exc)
                )
                if held.state is State.RELEASING:
                    self.handler.lost(topic, partition)
        if held.state is not State.RELEASING:
            return  # fenced or lost meanwhile: lost() was called, the key is not ours to delete
        held.state = State.RELEASED
        self._counters.releases += 1
        await self._delete_owner(key, held)
        self._wake.set()

    async def _delete_owner(self, key: tuple[str, int], held: Held) -> None:
        """Delete our key (only if it is still the one of `held.epoch`); on failure it stays
        RELEASED and the next healthy round tries again."""
        owner_key = self._layout.owner(*key)

        def transaction(c: Any) -> Any:
            return c.transaction(
                compare=[c.transactions.create(owner_key) == held.epoch],
                success=[c.transactions.delete(owner_key)],
                failure=[],
            )

        try:
            deleted, _ = await self._session.call(transaction)
        except EtcdUnavailable as exc:
            log.info("cluster.release_unconfirmed", topic=key[0], partition=key[1], error=str(exc))
            return
        if self._held.get(key) is held:
            del self._held[key]
        if deleted:
            self._deleted.add(held.epoch)
            log.info("cluster.released", topic=key[0], partition=key[1], epoch=held.epoch)

    async def _owner_changed(self, raw: bytes, entry: Entry | None) -> None:
        key = self._layout.parse_owner(raw)
        if key is None:
            return
        if entry is None:
            gone = self._owners.pop(key, None)
            if gone is not None:
                self._deleted.discard(gone.create_revision)
            self._free_since[key] = time.monotonic()
        else:
            self._owners[key] = entry
        self._wake.set()
        self._signal_change()
        held = self._held.get(key)
        if held is None or (entry is not None and entry.create_revision == held.epoch):
            return
        # our key vanished or another broker's key replaced it: stop at once
        if held.state in (State.SERVING, State.RELEASING):
            self._lose(key, held, "key vanished")
        elif held.state is State.ACQUIRING:
            held.state = State.LOST  # `_acquire` calls lost() when the handler returns
        elif held.state in (State.RELEASED, State.FENCED):
            self._held.pop(key, None)

    def _orphans(self) -> None:
        """Keys with our lease that we do not hold (a put whose answer was lost) are given up."""
        for key, entry in self._owners.items():
            if key in self._held or key in self._pending:
                continue
            if entry.create_revision in self._deleted:
                continue  # deleted by us a moment ago; the watch has not said so yet
            if entry.lease == self._lease_id and entry.value == self._id.encode():
                self._held[key] = Held(entry.create_revision, State.RELEASED)

    def _lose(self, key: tuple[str, int], held: Held, reason: str) -> None:
        held.state = State.LOST
        if self._held.get(key) is held:
            del self._held[key]
        self._counters.losses += 1
        log.warning("cluster.lost", topic=key[0], partition=key[1], epoch=held.epoch, reason=reason)
        if self.handler is not None:
            with contextlib.suppress(Exception):
                self.handler.lost(*key)
