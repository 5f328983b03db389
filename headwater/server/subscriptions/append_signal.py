"""What a reliable subscription's pump needs besides its state: the append signal, and the shape
of the dead-letter sender (`server.subscriptions.deadletter` makes one per subscription)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from headwater.wire.records import Record

DeadLetter = Callable[[int, Record, int], Awaitable[None]]


class AppendSignal:
    """One per reliable topic, the only append listener of its partitions' logs: it wakes the
    pumps waiting for new data, once, and forgets them."""

    def __init__(self) -> None:
        self._waiting: dict[int, Callable[[], None]] = {}
        # how many times it fired: a pump compares it across a round that awaited, to know that
        # an append it could not have been waiting for happened meanwhile
        self.fired = 0

    def fire(self) -> None:
        self.fired += 1
        if self._waiting:
            waiting, self._waiting = self._waiting, {}
            for wake in waiting.values():
                wake()

    def join(self, ident: int, wake: Callable[[], None]) -> None:
        self._waiting[ident] = wake

    def leave(self, ident: int) -> None:
        self._waiting.pop(ident, None)
