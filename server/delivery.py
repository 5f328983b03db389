"""Parts of reliable delivery that hold no subscription state: settings, the append signal, and
splitting records into runs of consecutive offsets (one re-encoded batch each)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from wire.messages import Backoff
from wire.records import Record


@dataclass(frozen=True, slots=True)
class ReliableSettings:
    ack_timeout_ms: int
    max_deliveries: int  # 0: no limit
    backoff: Backoff
    backoff_initial_ms: int
    backoff_max_ms: int
    committed_only: bool = False  # deliver only what an fsync covers

    def redelivery_delay(self, deliveries: int) -> float:
        """Seconds to wait before delivery number `deliveries + 1`."""
        initial = self.backoff_initial_ms / 1000
        if self.backoff == Backoff.FIXED:
            return initial
        return float(min(initial * 2 ** max(0, deliveries - 1), self.backoff_max_ms / 1000))


DeadLetter = Callable[[int, Record, int], Awaitable[None]]

DEAD_LETTER_RETRY = 1.0  # seconds before a message whose dead-lettering failed is tried again


class AppendSignal:
    """One per reliable topic, the only append listener of its partitions' logs: it wakes the
    pumps waiting for new data, once, and forgets them."""

    def __init__(self) -> None:
        self._waiting: dict[int, Callable[[], None]] = {}

    def fire(self) -> None:
        if self._waiting:
            waiting, self._waiting = self._waiting, {}
            for wake in waiting.values():
                wake()

    def join(self, ident: int, wake: Callable[[], None]) -> None:
        self._waiting[ident] = wake

    def leave(self, ident: int) -> None:
        self._waiting.pop(ident, None)


def runs(records: list[Record]) -> list[list[Record]]:
    """Split offset-sorted records into runs of consecutive offsets (one batch each)."""
    runs: list[list[Record]] = []
    for record in records:
        if runs and runs[-1][-1].offset + 1 == record.offset:
            runs[-1].append(record)
        else:
            runs.append([record])
    return runs
