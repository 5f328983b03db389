"""Byte-rate quotas per principal: a token bucket that may go into debt.

A request is never refused for its size: it is charged in full, and when the bucket goes below
zero the charge returns how long the principal must wait for the debt to be paid back (Kafka's
approach). The connection then stops reading (produce) or sending (consume) for that long, and
for produce tells the client with a THROTTLE push, so a well-behaved client holds its requests
instead of piling them into the socket; a client that ignores it is slowed all the same, since
the server does not read it. Every connection of the principal shares its bucket, so opening
more connections does not buy more rate.

The bucket holds at most one second of rate (the burst). A rate of 0 means unlimited.

A principal in produce debt is muted on the native port (`debt` says for how long): none of its
connections is read until the debt is paid, not only the one whose request ran into it, and a
connection it opens meanwhile is not read past its AUTHENTICATE. Else each connection got its own
burst: a principal limited to 100 kB/s that ignored THROTTLE made the server read 34.6 MB and
store 6.3 MB in 10 s, a mebibyte per connection it kept opening.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class Bucket:
    rate: float  # bytes per second
    tokens: float = 0.0
    stamp: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.tokens = self.rate

    def charge(self, size: int, now: float | None = None) -> float:
        """Take `size` bytes; the seconds to wait before the next request (0: none)."""
        now = time.monotonic() if now is None else now
        self.tokens = min(self.rate, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens -= size
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate

    def debt(self, now: float | None = None) -> float:
        """Seconds until the bucket is out of debt (0: it is not in debt)."""
        now = time.monotonic() if now is None else now
        tokens = self.tokens + (now - self.stamp) * self.rate
        return 0.0 if tokens >= 0 else -tokens / self.rate


class Quotas:
    """The buckets of every principal that has a rate, keyed by (principal, direction)."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[str, str], Bucket] = {}

    def charge(self, principal: str, direction: str, rate: int, size: int) -> float:
        if rate <= 0:
            return 0.0
        key = (principal, direction)
        bucket = self._buckets.get(key)
        if bucket is None or bucket.rate != rate:  # new, or its rate changed in the tokens file
            bucket = self._buckets[key] = Bucket(float(rate))
        return bucket.charge(size)

    def debt(self, principal: str, direction: str, rate: int) -> float:
        """Seconds until `principal` is out of debt in `direction` (0: it is not)."""
        bucket = self._buckets.get((principal, direction))
        if rate <= 0 or bucket is None or bucket.rate != rate:
            return 0.0
        return bucket.debt()
