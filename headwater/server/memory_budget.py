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

What else a client makes the server hold is bounded where it arises, per connection: a frame is at
most `max_frame_size` (8 KiB before authentication), a connection's unsent answers and deliveries
at most the write buffer's high-water mark (`max_pending_response_bytes`, `consumer_write_buffer`:
past it the connection is not read, so a producer that does not read is back-pressured, and
subscriptions skip its consumers), and one read's frames at a time are queued.
"""

from __future__ import annotations

import os


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


class MemoryBudget:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.refused = 0  # bytes refused since start-up (dropped batches)

    def take(self, size: int) -> bool:
        """Charge `size` bytes; False (nothing charged) when they would exceed the budget."""
        if self.used + size > self.max_bytes:
            self.refused += size
            return False
        self.used += size
        return True

    def give_back(self, size: int) -> None:
        self.used -= size
