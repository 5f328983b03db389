"""The etcd key layout of a Headwater cluster, and the rendezvous choice of a partition's owner.

Everything lives under one prefix (default `/headwater`):

    <prefix>/brokers/<broker id>                 {"host", "port", "started"}   broker's lease
    <prefix>/owners/<topic>/<partition>          "<broker id>"                 owner's lease
    <prefix>/topics/<topic>                      the topic's definition (JSON)
    <prefix>/subscriptions/<topic>/<name>        a subscription's definition (JSON)
    <prefix>/checkpoints/<key>                   bytes (cursors), the data path's keys
    <prefix>/producer-ids                        the next idempotent-producer id not yet
                                                 given to a broker (decimal)
    <prefix>/tail/<topic>/<partition>/<first>    where a tail chunk lies in a broker's shared
                                                 object (JSON; `tail_layout = "broker"`)
    <prefix>/tail-claims/<topic>/<partition>     the owner's claim token for the shared tail
    <prefix>/txn/<transactional id>              a transactional id's coordinator state (JSON,
                                                 `durables.transaction_state`)
    <prefix>/txnpart/<id in hex>/<n, 20 digits>  a chunk of a large transaction's partitions

Topic names never hold "/" (wire.names), so `<topic>/<rest>` splits at the first "/". Pure
functions only: the coordinator and `headwater cluster status` share them.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

DEFAULT_PREFIX = "/headwater"
# etcd refuses values above 1.5 MiB by default; cursors are small, and a bound keeps it that way
MAX_CHECKPOINT_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Layout:
    prefix: str = DEFAULT_PREFIX

    def root(self, kind: str) -> bytes:
        return f"{self.prefix.rstrip('/')}/{kind}/".encode()

    def broker(self, broker_id: str) -> bytes:
        return self.root("brokers") + broker_id.encode()

    def owner(self, topic: str, partition: int) -> bytes:
        return self.root("owners") + f"{topic}/{partition}".encode()

    def owners_of(self, topic: str) -> bytes:
        return self.root("owners") + f"{topic}/".encode()

    def topic(self, name: str) -> bytes:
        return self.root("topics") + name.encode()

    def subscription(self, topic: str, name: str) -> bytes:
        return self.root("subscriptions") + f"{topic}/{name}".encode()

    def subscriptions_of(self, topic: str) -> bytes:
        return self.root("subscriptions") + f"{topic}/".encode()

    def producer_ids(self) -> bytes:
        return f"{self.prefix.rstrip('/')}/producer-ids".encode()

    def checkpoint(self, key: str) -> bytes:
        return self.root("checkpoints") + key.encode()

    def tail_of(self, topic: str, partition: int | None = None) -> bytes:
        """The prefix of a partition's shared-tail index entries (a topic's: `partition`
        None)."""
        rest = f"{topic}/" if partition is None else f"{topic}/{partition}/"
        return self.root("tail") + rest.encode()

    def tail_entry(self, topic: str, partition: int, first: int) -> bytes:
        return self.tail_of(topic, partition) + f"{first:020d}".encode()

    def tail_claim(self, topic: str, partition: int) -> bytes:
        return self.root("tail-claims") + f"{topic}/{partition}".encode()

    def transaction(self, transactional_id: str) -> bytes:
        return self.root("txn") + transactional_id.encode()

    def transaction_parts(self, transactional_id: str) -> bytes:
        """The prefix of the id's chunks of partitions (`durables.transaction_state`): the id
        in hex, so no other id's prefix is one of its."""
        return self.root("txnpart") + transactional_id.encode().hex().encode() + b"/"

    def transaction_part(self, transactional_id: str, number: int) -> bytes:
        return self.transaction_parts(transactional_id) + f"{number:020d}".encode()

    def name_in(self, kind: str, key: bytes) -> str:
        """The part of `key` after `<prefix>/<kind>/`."""
        return key[len(self.root(kind)) :].decode()

    def parse_owner(self, key: bytes) -> tuple[str, int] | None:
        """(topic, partition) of an owner key, None for a key that is not one."""
        topic, _, partition = self.name_in("owners", key).partition("/")
        if not topic or not partition.isdigit():
            return None
        return topic, int(partition)

    def parse_subscription(self, key: bytes) -> tuple[str, str] | None:
        topic, _, name = self.name_in("subscriptions", key).partition("/")
        return (topic, name) if topic and name else None


def parse_endpoint(endpoint: str) -> list[tuple[str, int]]:
    """`etcd://host:port[,host:port...]` -> [(host, port), ...]; ValueError saying what is wrong."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme != "etcd":
        raise ValueError(f"cluster endpoint {endpoint!r} must look like etcd://HOST:PORT")
    found = []
    for item in rest.rstrip("/").split(","):
        host, colon, port = item.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"cluster endpoint {endpoint!r}: {item!r} is not HOST:PORT")
        found.append((host.strip("[]"), int(port)))
    return found


def rendezvous(brokers: Iterable[str], topic: str, partition: int) -> list[str]:
    """The brokers in the partition's order of preference (highest hash first).

    Rendezvous hashing moves only the partitions a joining or leaving broker wins or held; every
    broker computes the same order from the same membership, with no coordination.
    """

    def weight(broker: str) -> tuple[bytes, str]:
        digest = hashlib.blake2b(f"{broker}\0{topic}\0{partition}".encode(), digest_size=8)
        return digest.digest(), broker

    return sorted(brokers, key=weight, reverse=True)


def balanced(
    brokers: frozenset[str],
    topic: str,
    partitions: int,
    owners: tuple[tuple[int, str], ...] = (),
) -> tuple[tuple[str, ...], ...]:
    """Each partition's brokers in order of preference, the first choices balanced: no broker is
    the first choice of more than ceil(partitions / brokers) partitions of the topic.

    Plain rendezvous gave a 6-partition topic over three brokers a 4/1/1 spread (and can give a
    broker nothing). Here partitions take, in order, their highest-ranked broker that still has
    room (rendezvous with bounded load): every broker computes the same from the same membership.

    `owners` ((partition, broker) by partition, the owners now) makes it sticky: an owner among
    `brokers` stays its partition's first choice while it has room, and only the rest are placed
    by rank. An owner over its share keeps first the partitions it would be given without owners,
    then those it ranks higher for (what it took as a fallback for a broker that could not take
    it goes back there first). So a leaving broker moves only its own partitions, and a joining
    one takes only its share, from the brokers over theirs.
    Without it, the capacity a membership change moves re-placed every partition: a broker
    frozen or killed made the survivors hand partitions to each other (1.3-3.5 s without an
    acknowledgement on partitions whose owner never failed, issue 42).
    """
    # the choices without owners are cached by membership; with owners they change every round
    # a partition changes owner, so the caller keeps them for its round (`Assignment`)
    return (
        _sticky(brokers, topic, partitions, owners)
        if owners
        else _plain(brokers, topic, partitions)
    )


@functools.lru_cache(maxsize=256)
def _plain(brokers: frozenset[str], topic: str, partitions: int) -> tuple[tuple[str, ...], ...]:
    return _sticky(brokers, topic, partitions, ())


def _sticky(
    brokers: frozenset[str], topic: str, partitions: int, owners: tuple[tuple[int, str], ...]
) -> tuple[tuple[str, ...], ...]:
    if not brokers:
        return tuple(() for _ in range(partitions))
    ranks = _ranks(brokers, topic, partitions)
    capacity = -(-partitions // len(brokers))
    load = dict.fromkeys(brokers, 0)
    kept: dict[int, str] = {}
    if owners:
        plain = _plain(brokers, topic, partitions)

        def keeps_first(owned: tuple[int, str]) -> tuple[bool, int, int]:
            partition, owner = owned
            return plain[partition][0] != owner, plain[partition].index(owner), partition

        live = [(p, b) for p, b in owners if 0 <= p < partitions and b in load]
        for partition, owner in sorted(live, key=keeps_first):
            if load[owner] < capacity:
                kept[partition] = owner
                load[owner] += 1
    choices = []
    for partition, ranked in enumerate(ranks):
        first = kept.get(partition)
        if first is None:
            first = next(b for b in ranked if load[b] < capacity)
            load[first] += 1
        choices.append((first, *(b for b in ranked if b != first)))
    return tuple(choices)


@functools.lru_cache(maxsize=64)
def _ranks(brokers: frozenset[str], topic: str, partitions: int) -> tuple[list[str], ...]:
    """Each partition's `rendezvous` order: the membership changes far less often than the
    owners `balanced` is asked about (every rebalance round after a change of owner)."""
    return tuple(rendezvous(brokers, topic, partition) for partition in range(partitions))


def encode(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def decode(value: bytes) -> dict[str, Any] | None:
    """A JSON object, or None for anything else (a value written by hand with etcdctl)."""
    try:
        parsed = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None
    return parsed if isinstance(parsed, dict) else None


def partitions_of(definition: dict[str, Any]) -> int:
    count = definition.get("partitions")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0
