"""When a client reconnects after losing its connection: `ReconnectPolicy`.

Reconnection is opt-in (`connect(..., reconnect=True)` or `reconnect=ReconnectPolicy(...)`). The
delays grow exponentially from `initial_delay` to `max_delay`; with `jitter` each is drawn from
[delay/2, delay], so clients that lost the same server do not come back in lockstep, yet never
retry at once. A reconnection episode ends after `max_attempts` attempts or `timeout` seconds
(None: no bound), whichever comes first; then the client gives up and everything waiting on it
raises `ConnectionLost`. What a reconnection keeps and what it does not: README.md, "Connection
loss and reconnection".
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from headwater.wire.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    initial_delay: float = 0.1
    max_delay: float = 5.0
    max_attempts: int | None = None
    timeout: float | None = 60.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.initial_delay <= 0 or self.max_delay < self.initial_delay:
            raise InvalidRequest("reconnect delays must be > 0 and max_delay >= initial_delay")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise InvalidRequest("max_attempts must be at least 1 (or None: no bound)")
        if self.timeout is not None and self.timeout <= 0:
            raise InvalidRequest("reconnect timeout must be > 0 (or None: no bound)")

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """The wait before each attempt; ends after `max_attempts` (the caller checks `timeout`)."""
        attempt = 0
        while self.max_attempts is None or attempt < self.max_attempts:
            delay = min(self.initial_delay * 2 ** min(attempt, 60), self.max_delay)
            yield (rng or random).uniform(delay / 2, delay) if self.jitter else delay
            attempt += 1
