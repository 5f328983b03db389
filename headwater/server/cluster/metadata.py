"""Topic and subscription definitions, and cursor checkpoints, kept in etcd (cluster mode's source
of truth).

Writes go straight to etcd (a topic is created by a transaction comparing its key's version with
0, so two brokers creating the same topic cannot both succeed). Reads come from the caches the
watches keep; `on_topic` / `on_subscription` are awaited in revision order for every change the
watch sees, and for every existing definition when the coordinator starts. A failed etcd call
raises `StorageError` (retriable), which the server answers as STORAGE_ERROR.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from headwater.server.cluster.etcd import (
    UNFENCED_CALL_TIMEOUT,
    Changed,
    Entry,
    EtcdSession,
    EtcdUnavailable,
    PrefixWatch,
)
from headwater.server.cluster.layout import MAX_CHECKPOINT_BYTES, Layout, decode, encode
from headwater.server.cluster.producer_ids import ClusterProducerIds
from headwater.wire.errors import StorageError

TopicCallback = Callable[[str, dict[str, Any] | None], Awaitable[None]]
SubscriptionCallback = Callable[[str, str, dict[str, Any] | None], Awaitable[None]]


def _check_definition(definition: dict[str, Any]) -> None:
    count = definition.get("partitions")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"a topic definition needs 'partitions' >= 1, got {count!r}")


def _check_checkpoint(key: str, value: bytes) -> None:
    if len(value) > MAX_CHECKPOINT_BYTES:
        raise ValueError(
            f"checkpoint {key!r} is {len(value)} bytes, the limit is {MAX_CHECKPOINT_BYTES}"
        )


# operations in one etcd transaction: etcd refuses more than --max-txn-ops (128 by default)
TXN_OPS = 100


class Metadata:
    on_topic: TopicCallback | None
    on_subscription: SubscriptionCallback | None
    _layout: Layout
    _session: EtcdSession
    _topics: dict[str, dict[str, Any]]
    # topic -> the create_revision of its definition: which incarnation of the name this is
    _incarnations: dict[str, int]
    _subscriptions: dict[str, dict[str, dict[str, Any]]]
    _topics_changed: asyncio.Condition
    _wake: asyncio.Event

    async def _etcd(self, operation: Callable[[Any], Awaitable[Any]]) -> Any:
        # a deadline of their own: nothing fences on a definition or a checkpoint, and the lease
        # renewal's (max(2 s, TTL/2)) failed DELETE_TOPIC when etcd's fsync was slow under load
        timeout = max(UNFENCED_CALL_TIMEOUT, self._session.call_timeout)
        try:
            return await self._session.call(operation, timeout)
        except EtcdUnavailable as exc:
            raise StorageError(f"cluster metadata unavailable: {exc}") from None

    async def call_etcd(self, operation: Callable[[Any], Awaitable[Any]]) -> Any:
        """One etcd call for the data path (the shared tail's index); `StorageError` when etcd
        does not answer in time."""
        return await self._etcd(operation)

    @property
    def layout(self) -> Layout:
        return self._layout

    def watch(self, kind: str, on_change: Changed) -> PrefixWatch:
        """A copy of every key under `<prefix>/<kind>/`, kept by a watch on this broker's etcd
        session (`load` it, then `start` it; after `start` of the coordinator)."""
        return PrefixWatch(self._session, self._layout.root(kind), on_change)

    # topics

    async def create_topic(self, name: str, definition: dict[str, Any]) -> bool:
        """Create the topic; False when it exists already."""
        _check_definition(definition)
        key = self._layout.topic(name)
        value = encode(definition)
        won, _ = await self._etcd(
            lambda c: c.transaction(
                compare=[c.transactions.version(key) == 0],
                success=[c.transactions.put(key, value)],
                failure=[],
            )
        )
        return bool(won)

    async def update_topic(self, name: str, definition: dict[str, Any]) -> None:
        """Replace the definition (alter, more partitions); partitions past a smaller count are
        given up by their owners."""
        _check_definition(definition)
        key = self._layout.topic(name)
        value = encode(definition)
        await self._etcd(lambda c: c.put(key, value))

    async def grow_topic(self, name: str, partitions: int) -> int:
        """Raise the topic's partition count to `partitions` unless it has as many already, by a
        transaction on its definition's mod_revision, so two growths racing through two brokers
        can never leave it smaller than either saw; the count it has after (0: no such topic)."""
        key = self._layout.topic(name)
        for _ in range(16):
            found = await self._etcd(lambda c: c.get(key))
            definition = decode(found.value) if found is not None else None
            if found is None or definition is None:
                return 0
            count = int(definition.get("partitions", 0))
            if count >= partitions:
                return count
            value = encode({**definition, "partitions": partitions})
            seen = int(found.mod_revision)

            def transaction(c: Any, seen: int = seen, value: bytes = value) -> Any:
                return c.transaction(
                    compare=[c.transactions.mod(key) == seen],
                    success=[c.transactions.put(key, value)],
                    failure=[],
                )

            won, _ = await self._etcd(transaction)
            if won:
                return partitions
        raise StorageError(f"topic {name!r}: its definition kept changing while growing it")

    async def delete_topic(self, name: str) -> int:
        """Delete the topic with its owner keys, subscriptions and cursor checkpoints, in one
        transaction; the revision it happened at (every epoch of the deleted topic is smaller,
        every epoch of a topic re-created under the name larger), 0 when it does not exist."""
        key = self._layout.topic(name)
        owners = self._layout.owners_of(name)
        subscriptions = self._layout.subscriptions_of(name)
        # the cursors go with the topic: a topic re-created under the name starts from nothing
        checkpoints = self._layout.checkpoint(f"{name}/")

        def transaction(c: Any) -> Any:
            from aetcd.utils import prefix_range_end

            return c.transaction(
                compare=[c.transactions.version(key) > 0],
                success=[
                    c.transactions.get(key),  # its answer carries the transaction's revision
                    c.transactions.delete(key),
                    c.transactions.delete(owners, range_end=prefix_range_end(owners)),
                    c.transactions.delete(subscriptions, range_end=prefix_range_end(subscriptions)),
                    c.transactions.delete(checkpoints, range_end=prefix_range_end(checkpoints)),
                ],
                failure=[],
            )

        won, responses = await self._etcd(transaction)
        if not won:
            return 0
        found = responses[0]
        return int(found[0][1].header.revision) if found else 1

    def topics(self) -> dict[str, dict[str, Any]]:
        return dict(self._topics)

    def incarnation(self, name: str) -> int:
        """The etcd revision that created the topic's current definition (0 if unknown). Every
        epoch of this incarnation is larger; anything a deleted topic of the same name left in
        the shared object store or in etcd is tagged with a smaller one."""
        return self._incarnations.get(name, 0)

    async def wait_topic(self, name: str, present: bool, timeout: float) -> bool:
        """Whether the watched cache shows the topic (or its absence) within `timeout`."""
        deadline = time.monotonic() + timeout
        async with self._topics_changed:
            while (name in self._topics) != present:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                try:
                    async with asyncio.timeout(left):
                        await self._topics_changed.wait()
                except TimeoutError:
                    return (name in self._topics) == present
            return True

    async def _topic_changed(self, raw: bytes, entry: Entry | None) -> None:
        name = self._layout.name_in("topics", raw)
        definition = decode(entry.value) if entry is not None else None
        if entry is not None and definition is None:
            return  # not a definition of ours (written by hand): ignored
        if definition is None:
            self._topics.pop(name, None)
            self._incarnations.pop(name, None)
        else:
            self._topics[name] = definition
            assert entry is not None
            self._incarnations[name] = entry.create_revision
        async with self._topics_changed:
            self._topics_changed.notify_all()
        self._wake.set()
        if self.on_topic is not None:
            await self.on_topic(name, definition)

    # subscriptions

    async def define_subscription(
        self, topic: str, name: str, definition: dict[str, Any]
    ) -> dict[str, Any]:
        """Record the subscription's definition unless etcd has one already (one transaction on
        the key's version, 0 while absent): the definition that stands, ours or the first
        creator's, so two brokers creating it at once agree on its type, settings and start."""
        key = self._layout.subscription(topic, name)
        value = encode(definition)

        def transaction(c: Any) -> Any:
            return c.transaction(
                compare=[c.transactions.version(key) == 0],
                success=[c.transactions.put(key, value)],
                failure=[c.transactions.get(key)],
            )

        won, responses = await self._etcd(transaction)
        if won:
            return definition
        found = responses[0]
        theirs = decode(bytes(found[0][0])) if found else None
        if theirs is None:  # (the compare and the get are atomic: the key holds no JSON object)
            raise StorageError(
                f"subscription {name!r} of topic {topic!r}: etcd holds something other than a "
                "definition under its key (written by hand?)"
            )
        return theirs

    async def delete_subscription(self, topic: str, name: str) -> None:
        key = self._layout.subscription(topic, name)
        await self._etcd(lambda c: c.delete(key))

    def subscriptions(self, topic: str) -> dict[str, dict[str, Any]]:
        return dict(self._subscriptions.get(topic, {}))

    async def _subscription_changed(self, raw: bytes, entry: Entry | None) -> None:
        parsed = self._layout.parse_subscription(raw)
        definition = decode(entry.value) if entry is not None else None
        if parsed is None or (entry is not None and definition is None):
            return
        topic, name = parsed
        if definition is None:
            named = self._subscriptions.get(topic, {})
            named.pop(name, None)
            if not named:
                self._subscriptions.pop(topic, None)
        else:
            self._subscriptions.setdefault(topic, {})[name] = definition
        if self.on_subscription is not None:
            await self.on_subscription(topic, name, definition)

    # idempotent producers

    def producer_ids(self) -> ClusterProducerIds:
        """Producer ids unique in the whole cluster, from a counter in etcd."""
        return ClusterProducerIds(self._etcd, self._layout.producer_ids())

    # checkpoints

    async def put_checkpoint(self, key: str, value: bytes) -> None:
        await self.put_checkpoints({key: value})

    async def create_checkpoint(
        self, key: str, value: bytes, since: int = 0, topic: str | None = None
    ) -> bytes | None:
        """Write `value` unless the key holds a checkpoint of this incarnation (written at or
        after revision `since`): None when written (or fenced: `swap_checkpoint`), else the one
        there, left as it is. One transaction: a cursor another broker stored meanwhile (a Kafka
        group's commit through its coordinator) is never overwritten by a start."""
        written, found = await self.swap_checkpoint(key, value, None, since, topic)
        return None if written else found

    async def swap_checkpoint(
        self,
        key: str,
        value: bytes,
        expected: bytes | None,
        since: int = 0,
        topic: str | None = None,
    ) -> tuple[bool, bytes | None]:
        """Write `value` if the key still holds `expected` (None: no checkpoint of this
        incarnation, written at or after revision `since`), in one transaction. (True, None)
        when written; else (False, what the key holds, None when nothing): another broker wrote
        it since (a Kafka group's commit through its coordinator), and it stands.

        With `topic`, the write is also fenced on the topic's incarnation: it happens only while
        the topic's definition is still the one created at revision `since`, else (False, None).
        A cursor of a deleted topic written late (its owner's last round, or the release of its
        partitions, after a topic of the same name was created) would otherwise carry a
        revision of the new incarnation, and the new topic's subscription of that name would
        start from it: the new topic's first messages skipped as acknowledged."""
        _check_checkpoint(key, value)
        raw = self._layout.checkpoint(key)
        fence = self._layout.topic(topic) if topic is not None and since > 0 else None

        def transaction(c: Any) -> Any:
            if expected is None:
                # an absent key's mod revision is 0: below every revision etcd gives
                holds = c.transactions.mod(raw) < max(since, 1)
            else:
                holds = c.transactions.value(raw) == bytes(expected)
            compare = [holds]
            failure = [c.transactions.get(raw)]
            if fence is not None:
                compare.append(c.transactions.create(fence) == since)
                failure.append(c.transactions.get(fence))
            return c.transaction(
                compare=compare, success=[c.transactions.put(raw, bytes(value))], failure=failure
            )

        written, responses = await self._etcd(transaction)
        if written:
            return True, None
        if fence is not None:
            definition = responses[1]
            if not definition or int(definition[0][1].create_revision) != since:
                return False, None  # the topic this cursor belongs to is gone
        found = responses[0]
        return False, (bytes(found[0][0]) if found else None)

    async def get_checkpoint(self, key: str, since: int = 0) -> bytes | None:
        """The checkpoint, unless it was last written before revision `since` (by a deleted
        topic of the same name: `incarnation`)."""
        return (await self.get_checkpoints([key], since)).get(key)

    async def put_checkpoints(self, values: dict[str, bytes]) -> None:
        """Several checkpoints, `TXN_OPS` to an etcd transaction (one round trip each). A
        failure raises after the transactions before it were applied: a retry writes them
        again, to the same values."""
        for key, value in values.items():
            _check_checkpoint(key, value)
        items = [(self._layout.checkpoint(key), bytes(value)) for key, value in values.items()]
        for start in range(0, len(items), TXN_OPS):
            chunk = items[start : start + TXN_OPS]

            def transaction(c: Any, chunk: list[tuple[bytes, bytes]] = chunk) -> Any:
                puts = [c.transactions.put(raw, value) for raw, value in chunk]
                return c.transaction(compare=[], success=puts, failure=[])

            await self._etcd(transaction)

    async def get_checkpoints(self, keys: list[str], since: int = 0) -> dict[str, bytes]:
        """The checkpoints of `keys` that exist and were last written at or after revision
        `since` (not by a deleted topic of the same name: `incarnation`), `TXN_OPS` to a
        transaction."""
        found: dict[str, bytes] = {}
        for start in range(0, len(keys), TXN_OPS):
            chunk = keys[start : start + TXN_OPS]

            def transaction(c: Any, chunk: list[str] = chunk) -> Any:
                gets = [c.transactions.get(self._layout.checkpoint(key)) for key in chunk]
                return c.transaction(compare=[], success=gets, failure=[])

            _, answers = await self._etcd(transaction)
            for key, answer in zip(chunk, answers, strict=True):
                if answer and int(answer[0][1].mod_revision) >= since:
                    found[key] = bytes(answer[0][0])
        return found

    async def delete_checkpoints(self, prefix: str) -> None:
        raw = self._layout.checkpoint(prefix)
        await self._etcd(lambda c: c.delete_prefix(raw))
