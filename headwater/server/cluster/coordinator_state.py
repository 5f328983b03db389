"""What the coordinator knows about itself: the partitions it holds, the handler it drives, and the
errors it raises at start.

A held partition goes ACQUIRING (key won, `handler.acquire` running) -> SERVING -> RELEASING
(`handler.release` running) -> RELEASED (key to delete), or -> FENCED when the lease could not be
confirmed in time (`handler.lost` called; re-acquired with the same epoch if the key is still ours
when etcd answers again), or -> LOST when the key vanished or changed hands. Only SERVING, with the
lease deadline ahead, serves.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Protocol

from headwater.server.net.listener import StartupError


class PartitionHandler(Protocol):
    async def acquire(self, topic: str, partition: int, epoch: int) -> None:
        """After this broker won the ownership key, before `serves()` turns True. Raising means
        "cannot take it now": the coordinator deletes the key and retries later (backoff)."""
        ...

    async def release(self, topic: str, partition: int) -> None:
        """Graceful hand-off, while the key is still held and `serves()` is already False: finish
        in-flight writes and checkpoints; then the coordinator deletes the key."""
        ...

    def lost(self, topic: str, partition: int) -> None:
        """Fenced (the lease could not be confirmed in time) or the key vanished: stop at once."""
        ...


class ClusterStartupError(StartupError):
    """The coordinator cannot start: etcd unreachable, or the broker id is taken."""


class EtcdUnreachable(ClusterStartupError):
    pass


class DuplicateBroker(ClusterStartupError):
    pass


class State(enum.Enum):
    ACQUIRING = "acquiring"
    SERVING = "serving"
    RELEASING = "releasing"
    RELEASED = "released"
    FENCED = "fenced"
    LOST = "lost"


class Standing(enum.Enum):
    """Whether this broker may count what it wrote for a partition as the partition's (for
    acknowledging produces after their chunk is stored)."""

    HELD = "held"  # serving or handing off, under a lease confirmed within its deadline
    # held, but the lease's deadline passed without a confirmed renewal: the watchdog settles it
    # within half a second (a renewal arrives, or the partition is fenced and `lost` is called)
    LAPSED = "lapsed"
    GONE = "gone"


@dataclass(slots=True)
class Held:
    epoch: int
    state: State
    # taken as a fallback (not this broker's first choice): not handed back at once, so a first
    # choice that cannot take it does not make it bounce every TTL
    fallback: bool = False
    since: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class Counters:
    acquisitions: int = 0
    acquire_failures: int = 0
    releases: int = 0
    losses: int = 0
    fencings: int = 0
    lease_renewals: int = 0
    lease_failures: int = 0
    new_leases: int = 0
