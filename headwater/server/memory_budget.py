"""The memory budget: bytes the server holds for clients that have not taken them yet.

A non-reliable subscription keeps the batches its consumers have no credit for; without a bound
in bytes a principal with produce and consume on one topic of its own, a subscription granting no
credit and 1 MiB batches took a server from 120 MiB to 2.1 GiB in 4.5 s (the backlog was bounded
in messages only: 10,000 batches of 8 MiB would be 80 GB). So every such batch is charged here
before it is kept: to its subscription's own cap (`subscription_backlog_bytes`, checked by the
subscription) and to this server-wide budget (`memory_max_bytes`, default a quarter of the
machine's memory). A batch that does not fit is dropped for that subscription, counted, and its
consumers get MESSAGES_DROPPED before their next delivery: non-reliable topics promise no more.
Bytes are given back as batches are delivered, discarded, or their subscription ends.

The batch bytes are shared by every subscription of a topic, so charging each subscription the
full size over-counts: the budget errs towards dropping early, never towards holding more.

Each batch is also charged to the principal whose connection made the subscription, and a
principal may hold at most its share (`memory_max_bytes_per_principal`, default a quarter of the
budget) of the budget: one principal's zero-credit subscriptions fill its own share and drop its
own batches, never the rest of the budget, so other principals' subscriptions keep theirs.
Without authentication every client is the anonymous principal "", whose share is the whole
budget.

A connection's unsent answers and deliveries (its transport's write buffer) are charged too, to
its principal and the server-wide use (a Kafka connection's with its frames read and not yet
handled and its answers ready behind a slower one: `kafka.kafka_connection`), sampled when a
slice of its frames ends, when its buffer crosses the high-water mark and on the listener's
sweep: the charge lags the buffer by a sweep at most. They cannot be dropped, so a connection
with unsent output is back-pressured instead: it is not read while its principal is over its
share (`over_share`), until its client takes its output or the principal's use falls back.
And where the bytes would be neither droppable nor back-pressurable, the request is refused
with the retriable OVER_MEMORY_BUDGET: a SUBSCRIBE that would make a new live subscription while
its principal's share, or the budget, has less than one largest frame (`max_frame_size`) left
(`room`), since a backlog that could not take one batch would drop everything it was made for.

What else a client makes the server hold is bounded where it arises, per connection: a frame is at
most `max_frame_size` (8 KiB before authentication), a connection's unsent answers and deliveries
at most the write buffer's high-water mark (`max_pending_response_bytes`, `consumer_write_buffer`:
past it the connection is not read, so a producer that does not read is back-pressured, and
subscriptions skip its consumers), one read's frames at a time are queued, and at most
`MAX_WAITING_REQUESTS` requests wait to be answered (for a busy topic's turn), their frames charged
here while they wait.
"""

from __future__ import annotations

import heapq
import os
from typing import Final

# SERVER_INFO and /metrics list the principals holding the most, not all of them: one line per
# principal of a server with thousands would bury the few that matter.
MAX_MEMORY_PRINCIPALS_SHOWN: Final = 10


def machine_memory() -> int:
    """Bytes of physical memory (0 when the platform does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def default_max_bytes() -> int:
    """A quarter of the machine's memory, or 1 GiB when it cannot be told."""
    total = machine_memory()
    return total // 4 if total > 0 else 1 << 30


def default_principal_share(max_bytes: int) -> int:
    """A quarter of the budget: four principals filling their shares leave room for the rest."""
    return max(1, max_bytes // 4)


class MemoryBudget:
    def __init__(self, max_bytes: int, principal_max_bytes: int = 0) -> None:
        """`principal_max_bytes`: each authenticated principal's share; 0, the whole budget."""
        self.max_bytes = max_bytes
        self.principal_max_bytes = principal_max_bytes or max_bytes
        self.used = 0
        self.refused = 0  # bytes refused since start-up (dropped batches)
        self.refused_by_share = 0  # of those, refused because their principal was at its share
        self.by_principal: dict[str, int] = {}  # bytes held per principal (none: not listed)

    def share(self, principal: str) -> int:
        """Bytes `principal` may hold: the anonymous principal "" (no authentication) is every
        client, so its share is the whole budget."""
        return self.principal_max_bytes if principal else self.max_bytes

    def take(self, size: int, principal: str = "") -> bool:
        """Charge `size` bytes to the budget and `principal`; False (nothing charged) when they
        would exceed either."""
        held = self.by_principal.get(principal, 0)
        if held + size > self.share(principal):
            self.refused += size
            self.refused_by_share += size
            return False
        if self.used + size > self.max_bytes:
            self.refused += size
            return False
        self.used += size
        self.by_principal[principal] = held + size
        return True

    def charge(self, delta: int, principal: str = "") -> None:
        """Bytes already held (a connection's write buffer grew by `delta`, or shrank when it is
        negative): counted whatever the budget, since they cannot be refused after the fact."""
        self.used += delta
        held = self.by_principal.get(principal, 0) + delta
        if held:
            self.by_principal[principal] = held
        else:
            self.by_principal.pop(principal, None)

    def give_back(self, size: int, principal: str = "") -> None:
        self.charge(-size, principal)

    def over_share(self, principal: str) -> bool:
        """`principal` holds more than its share (its connections with output are not read)."""
        return self.by_principal.get(principal, 0) > self.share(principal)

    def room(self, principal: str) -> int:
        """Bytes `principal` could still be charged: the least of its share's and the budget's."""
        return min(
            self.share(principal) - self.by_principal.get(principal, 0),
            self.max_bytes - self.used,
        )

    def largest(self, count: int) -> list[tuple[str, int]]:
        """The `count` principals holding the most bytes, most first (none holding 0 or less)."""
        held = ((p, n) for p, n in self.by_principal.items() if n > 0)
        return heapq.nlargest(count, held, key=lambda item: item[1])
