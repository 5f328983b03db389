"""What a reliable subscription's pump needs besides its state: the append signal, and the shape
of the dead-letter sender (`server.subscriptions.deadletter` makes one per subscription)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from headwater.wire.records import Record

DeadLetter = Callable[[int, Record, int], Awaitable[None]]


class AppendSignal:
    """One per reliable topic, the only append listener of its partitions' logs (each log calls
    `fire` with its partition): it wakes the waiters, once, and forgets them. A pump reads every
    partition, so it waits for any (`join`); a FETCH long poll reads one, so it waits for that
    one only (`join_partition`): woken by every append to the topic, a poll on a quiet
    partition of a busy topic went round its loop once per append to the others."""

    def __init__(self) -> None:
        self._waiting: dict[int, Callable[[], None]] = {}
        self._by_partition: dict[int, dict[int, Callable[[], None]]] = {}
        # how many times it fired: a pump compares it across a round that awaited, to know that
        # an append it could not have been waiting for happened meanwhile
        self.fired = 0

    def fire(self, partition: int | None = None) -> None:
        """An append to `partition`, or its durable offset or cloud tail moved (None: to some
        partition, unknown: every waiter is woken)."""
        self.fired += 1
        if self._waiting:
            waiting, self._waiting = self._waiting, {}
            for wake in waiting.values():
                wake()
        if not self._by_partition:
            return
        if partition is None:
            woken = [w for ws in self._by_partition.values() for w in ws.values()]
            self._by_partition = {}
        else:
            found = self._by_partition.pop(partition, None)
            woken = list(found.values()) if found else []
        for wake in woken:
            wake()

    def join(self, ident: int, wake: Callable[[], None]) -> None:
        self._waiting[ident] = wake

    def leave(self, ident: int) -> None:
        self._waiting.pop(ident, None)

    def join_partition(self, partition: int, ident: int, wake: Callable[[], None]) -> None:
        self._by_partition.setdefault(partition, {})[ident] = wake

    def leave_partition(self, partition: int, ident: int) -> None:
        waiting = self._by_partition.get(partition)
        if waiting is not None:
            waiting.pop(ident, None)
            if not waiting:
                del self._by_partition[partition]
