"""The client's routing table (sans I/O): topic -> partition -> the broker that owns it.

Filled from LOOKUP answers (`apply`) and corrected by what the client meets on the way: a
NOT_OWNER answer (`not_owner`: the topic is looked up again, and the owner the error names, if
it is a broker we know, is used meanwhile) and a lost connection to a broker (`broker_lost`: every
topic with a partition there is looked up again). `needs_lookup` says when a topic's routes are
missing, marked stale, or older than the refresh interval (`refresh_interval` while the cluster
has more than one broker, `single_refresh` otherwise). `LookupBackoff` spaces the lookups a client
repeats while a partition has no owner (a failover under way), and bounds them in time.

On a single broker (LOOKUP names one broker, or the server predates LOOKUP) every route is
`bootstrap`, the address the client connected to: its traffic stays on that one connection,
exactly as without routing. The I/O around this table is headwater/client/router.py.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError, NotOwner, error_for_code

__all__ = ["BrokerAddress", "LookupBackoff", "RoutingTable", "TopicRoutes"]


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """A broker as LOOKUP names it; broker_id "" is the bootstrap address (no cluster seen)."""

    broker_id: str
    host: str
    port: int

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def __str__(self) -> str:
        return f"{self.broker_id or 'bootstrap'}@{self.host}:{self.port}"


@dataclass(slots=True)
class TopicRoutes:
    owners: list[str]  # per partition: the owner's broker id, "" while nobody owns it
    epochs: list[int]
    fetched_at: float
    error: HeadwaterError | None = None  # the topic's own LOOKUP error (UNKNOWN_TOPIC, ...)
    stale: bool = False


@dataclass(frozen=True, slots=True)
class LookupBackoff:
    """Delays between the lookups of one episode (a partition without owner, a broker gone):
    exponential from `initial` to `maximum`, each drawn from [delay/2, delay] so clients that
    lost the same broker do not ask in lockstep; the episode ends after `timeout` seconds."""

    initial: float = 0.05
    # a failover's new owner serves about 2-2.5 s after a kill -9 (the default 2 s lease), then
    # the client waits out the delay it is in: at 1 s that added up to 1 s to the failover a
    # client sees (issue 21: under 3 s). 250 ms failed once (59afe5f): clients reaching a new
    # owner mid-take-over used up their retries on its NOT_OWNER answers; the producer now waits
    # for the new owner without using retries (sender.py `_between_owners`), consumer legs and
    # maps retry within this backoff's time, not a count. The cost: a LOOKUP per client every
    # 125-250 ms while one of its partitions has no owner, answered from the broker's memory
    maximum: float = 0.25
    timeout: float = 30.0

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """The waits before each further lookup; stops once they add up to `timeout`."""
        elapsed, attempt = 0.0, 0
        while True:
            delay = min(self.initial * 2 ** min(attempt, 30), self.maximum)
            delay = (rng or random).uniform(delay / 2, delay)
            if elapsed + delay > self.timeout:
                return
            elapsed += delay
            attempt += 1
            yield delay


@dataclass(slots=True)
class RoutingTable:
    bootstrap: BrokerAddress
    refresh_interval: float = 2.0  # seconds routes are trusted while there are several brokers
    # seconds a partition's request may stay unanswered before the client asks the other
    # brokers whether the partition moved (its owner may be frozen: its connection stays open):
    # half the cluster's lease, which LOOKUP answers carry (`lease_ms`; 1 s, half the default 2 s
    # lease, until one does); a frozen owner's lease runs out 1.3-2.5 s after it froze with the
    # default, and the next asks (every `LookupBackoff.maximum`) find the new owner soon after
    # the take-over. An owner that is only slow keeps its requests: nothing is resent while the
    # cluster still names it. `owner_check_fixed`: the application set it; leases change nothing.
    owner_check: float = 1.0
    owner_check_fixed: bool = False
    single_refresh: float = 30.0  # ... and on a single broker
    brokers: dict[str, BrokerAddress] = field(default_factory=dict)
    topics: dict[str, TopicRoutes] = field(default_factory=dict)
    lookup_supported: bool = True  # False: the server predates LOOKUP (a single broker)
    clustered: bool = False  # a LOOKUP named several brokers once: routed by owner from then on
    # bumped by every change: a decision taken from the table holds while this is unchanged (the
    # producer's keyless sends skip the router this way: producer.Producer._unrouted_until)
    version: int = 0

    @property
    def multi_broker(self) -> bool:
        """Whether requests go to each partition's owner (else all to the bootstrap address).
        Once several brokers were seen this stays true, even if all but one die: that one
        need not be the bootstrap broker."""
        return self.clustered

    def apply(self, response: m.LookupResponse, now: float) -> None:
        """Take a LOOKUP answer: the live brokers, each named topic's owners, and the lease
        (`owner_check` becomes half of it, unless the application set it). A partition
        whose epoch is older than the one already known keeps its known owner (a lagging broker
        answered); a partition owned by a broker missing from the list has no owner."""
        self.version += 1
        self.brokers = {
            b.broker_id: BrokerAddress(b.broker_id, b.host, b.port) for b in response.brokers
        }
        self.clustered = self.clustered or len(self.brokers) > 1
        if response.lease_ms > 0 and not self.owner_check_fixed:
            self.owner_check = response.lease_ms / 2000
        for answer in response.topics:
            if answer.error_code:
                error = error_for_code(answer.error_code, answer.error_message)
                self.topics[answer.name] = TopicRoutes([], [], now, error)
                continue
            known = self.topics.get(answer.name)
            owners, epochs = [], []
            for entry in sorted(answer.partitions, key=lambda p: p.partition):
                owner, epoch = entry.broker_id, entry.epoch
                if (
                    known is not None
                    and known.error is None
                    and entry.partition < len(known.owners)
                    and known.epochs[entry.partition] > epoch
                ):
                    owner, epoch = known.owners[entry.partition], known.epochs[entry.partition]
                owners.append(owner if owner in self.brokers else "")
                epochs.append(epoch)
            self.topics[answer.name] = TopicRoutes(owners, epochs, now)

    def unsupported(self, topics: list[str], now: float) -> None:
        """The server does not know LOOKUP: one broker, which serves everything."""
        self.version += 1
        self.lookup_supported = False
        self.brokers = {}
        for topic in topics:
            self.topics[topic] = TopicRoutes([], [], now)

    def needs_lookup(self, topic: str, now: float) -> bool:
        return now >= self.fresh_until(topic)

    def fresh_until(self, topic: str) -> float:
        """Until when (loop time) the topic's routes need no lookup, unless the table changes
        meanwhile (`version`): -inf when they need one now, inf when LOOKUP is not supported."""
        routes = self.topics.get(topic)
        if routes is None or routes.stale:
            return -math.inf
        if not self.lookup_supported:
            return math.inf
        several = self.multi_broker or routes.error is not None  # a topic may appear soon
        return routes.fetched_at + (self.refresh_interval if several else self.single_refresh)

    def error(self, topic: str) -> HeadwaterError | None:
        routes = self.topics.get(topic)
        return None if routes is None else routes.error

    def partitions(self, topic: str) -> int | None:
        """The partition count LOOKUP reported (None: not known)."""
        routes = self.topics.get(topic)
        return None if routes is None or routes.error is not None else len(routes.owners)

    def owner(self, topic: str, partition: int) -> BrokerAddress | None:
        """Where to send a request for the partition: the bootstrap address on a single
        broker, else the owner, or None while nobody owns it (or it is not known)."""
        if not self.multi_broker:
            return self.bootstrap
        routes = self.topics.get(topic)
        if routes is None or routes.error is not None:
            return None
        if partition < 0:  # "any partition": a broker owning one picks (a keyless record)
            return next(iter(self.owned_by(topic)), self.bootstrap)
        if partition >= len(routes.owners):
            return None
        return self.brokers.get(routes.owners[partition])

    def owners(self, topic: str) -> dict[int, BrokerAddress | None]:
        routes = self.topics.get(topic)
        if routes is None or routes.error is not None:
            return {}
        return {p: self.owner(topic, p) for p in range(len(routes.owners))}

    def owned_by(self, topic: str) -> dict[BrokerAddress, list[int]]:
        """Each broker owning partitions of the topic, with them (the ones without owner left
        out): what a consumer subscribes to."""
        found: dict[BrokerAddress, list[int]] = {}
        for partition, address in self.owners(topic).items():
            if address is not None:
                found.setdefault(address, []).append(partition)
        return found

    def not_owner(self, topic: str, partition: int, error: NotOwner) -> BrokerAddress | None:
        """A broker answered NOT_OWNER for the partition: the topic is stale. When the error
        names an owner we know, it becomes the partition's route until the next lookup (the
        address returned); otherwise the partition has none until then."""
        routes = self.topics.get(topic)
        if routes is None:
            return None
        self.version += 1
        routes.stale = True
        if routes.error is not None or not 0 <= partition < len(routes.owners):
            return None
        named = error.owner_address
        for broker in self.brokers.values():
            if named is not None and broker.address == named:
                routes.owners[partition] = broker.broker_id
                return broker
        routes.owners[partition] = ""
        return None

    def broker_lost(self, address: tuple[str, int]) -> list[str]:
        """The connection to the broker at `address` was lost (it may be dead): every topic with
        a partition there is stale, and those partitions have no route until looked up again.
        Returns the topics affected."""
        ids = {b.broker_id for b in self.brokers.values() if b.address == address}
        affected = []
        for name, routes in self.topics.items():
            hit = False
            for index, owner in enumerate(routes.owners):
                if owner in ids:
                    routes.owners[index] = ""
                    hit = True
            if hit:
                self.version += 1
                routes.stale = True
                affected.append(name)
        return affected

    def invalidate(self, topic: str) -> None:
        routes = self.topics.get(topic)
        if routes is not None:
            self.version += 1
            routes.stale = True
