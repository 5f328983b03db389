"""A producer's settings: delivery semantics, retry policy, batching limits (`ProducerConfig`).

Frozen dataclasses that check their values when built, so a bad setting fails where it is
written rather than at the first send. How the producer uses them: headwater/client/producer.py.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from headwater.wire import messages as m
from headwater.wire.errors import InvalidRequest
from headwater.wire.limits import MAX_TRANSACTION_TIMEOUT_MS
from headwater.wire.records import Compression

Isolation = m.Isolation
MAX_TRANSACTION_TIMEOUT = MAX_TRANSACTION_TIMEOUT_MS / 1000  # seconds


class RetryStrategy(enum.StrEnum):
    FIXED = "fixed"
    FIBONACCI = "fibonacci"
    EXPONENTIAL = "exponential"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When to resend after a retriable failure.

    The delay before retry n (n = 1, 2, ..., `max_retries`), each capped at `max_delay`:

    - fixed: `initial_delay` every time;
    - Fibonacci: `initial_delay` x 1, 1, 2, 3, 5, 8, ...;
    - exponential: `initial_delay` x 1, 2, 4, 8, ... (doubling).

    With `jitter`, each delay is drawn uniformly from [0, delay] ("full jitter"), which spreads
    out producers that failed together. No retry starts later than `timeout` seconds after the
    batch was first sent: the total budget across all attempts.
    """

    max_retries: int = 5
    initial_delay: float = 0.01
    max_delay: float = 2.0
    timeout: float = 30.0
    strategy: RetryStrategy = RetryStrategy.EXPONENTIAL
    jitter: bool = False

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.initial_delay < 0 or self.max_delay < 0:
            raise InvalidRequest("retry counts and delays must be >= 0")
        if self.timeout <= 0:
            raise InvalidRequest("retry timeout must be > 0")

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        fibonacci, following = self.initial_delay, self.initial_delay
        for attempt in range(self.max_retries):
            if self.strategy == RetryStrategy.FIXED:
                delay = self.initial_delay
            elif self.strategy == RetryStrategy.FIBONACCI:
                delay = fibonacci
                fibonacci, following = following, fibonacci + following
            else:
                delay = self.initial_delay * 2**attempt
            delay = min(delay, self.max_delay)
            if self.jitter:
                delay = (rng or random).uniform(0, delay)
            yield delay

    def schedule(self) -> list[float]:
        """Seconds after the first attempt at which each retry starts (no jitter, instant
        attempts): the retries that fit in `timeout`."""
        starts, elapsed = [], 0.0
        for delay in self.delays():
            elapsed += delay
            if elapsed > self.timeout:
                break
            starts.append(elapsed)
        return starts


@dataclass(frozen=True, slots=True)
class AtMostOnce:
    wait_for_offsets: bool = False


@dataclass(frozen=True, slots=True)
class AtLeastOnce:
    retry: RetryPolicy = field(default_factory=RetryPolicy)


DeliverySemantic = AtMostOnce | AtLeastOnce


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    delivery: DeliverySemantic = field(default_factory=AtLeastOnce)
    batch_size: int = 64 * 1024
    linger: float = 0.0
    max_request_size: int = 1024 * 1024
    max_queued_batches: int = 64
    max_in_flight: int = 16
    # an unanswered request older than this drops the connection (a retriable failure)
    request_timeout: float = 30.0
    compression: Compression = Compression.NONE
    isolation: m.Isolation = m.Isolation.APPENDED
    idempotent: bool = False
    # seconds a topic's partition count is trusted before a keyed send asks again (partitions
    # may be added); a WRONG_PARTITION or INVALID_PARTITION answer asks again at once
    metadata_max_age: float = 30.0
    # a transactional producer's id (docs/PRODUCING.md, "Transactions"): it writes in
    # transactions only (`producer.transaction()`), idempotent and at least once; the server
    # aborts a transaction open longer than `transaction_timeout` seconds (and fences its
    # producer)
    transactional_id: str | None = None
    transaction_timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.max_request_size < 1024:
            raise InvalidRequest("batch_size must be >= 1 and max_request_size >= 1024")
        if self.linger < 0 or self.request_timeout <= 0 or self.metadata_max_age < 0:
            raise InvalidRequest("linger and metadata_max_age must be >= 0 and request_timeout > 0")
        if self.max_queued_batches < 1 or self.max_in_flight < 1:
            raise InvalidRequest("max_queued_batches and max_in_flight must be >= 1")
        if self.transactional_id is not None:
            if not self.transactional_id:
                raise InvalidRequest("a transactional id is not empty")
            if not isinstance(self.delivery, AtLeastOnce):
                raise InvalidRequest("a transactional producer delivers at least once")
            if not 0 < self.transaction_timeout <= MAX_TRANSACTION_TIMEOUT:
                raise InvalidRequest(
                    f"transaction_timeout must be in (0, {MAX_TRANSACTION_TIMEOUT:.0f}] seconds"
                )
            object.__setattr__(self, "idempotent", True)  # what transactions are built on
        if self.idempotent and self.max_in_flight > 16:
            raise InvalidRequest("an idempotent producer keeps at most 16 batches in flight")


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int | None  # None for at-most-once sends that did not ask for offsets
    timestamp: int
