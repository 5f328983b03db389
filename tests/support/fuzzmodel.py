"""The model the state-machine test checks the server against (tests/test_statemachine.py).

A topic name has at most one live *generation* (one create); each holds its kind and partition
count, every acknowledged record by (partition, offset), and per key the latest acknowledged
write. Every record value the test writes is unique (`<topic>/<uid>`), and the registry remembers
for each uid the topic and the generations it may have landed in, so a record read back can be
traced to the request that wrote it.

Requests in one round are pipelined, so the server may apply them in any order. The model reads
the order back from the answers: each successful create or delete of a name toggles whether it
exists, so the counts of successes give the end state exactly. A name with a successful create or
delete in the round is *ambiguous* for that round: its other answers are checked only for being
among the answers some order allows, and what they wrote is allowed in the new generation but
not required. Every other answer is checked exactly. Any violation raises `Violation`, whose
message names the request, what came back and what the model expected.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from headwater.wire import messages as m
from headwater.wire.errors import HeadwaterError
from headwater.wire.records import Record, build_batch
from tests.support.fuzzops import (
    KEYS,
    Ack,
    Create,
    Delete,
    DeleteSub,
    Describe,
    Flow,
    ListAll,
    MapCas,
    MapGet,
    MapSet,
    Nack,
    Op,
    Produce,
    Seek,
    Steal,
    Subscribe,
    Unsubscribe,
    WrongPartition,
    granted,
    key_partition,
)
from tests.support.fuzzpeer import Outcome

OK = "OK"
_MISSING = object()


class Violation(AssertionError):
    """The server broke a promise the model can prove."""


def code(outcome: Outcome) -> str:
    return outcome.code.name if isinstance(outcome, HeadwaterError) else OK


def show(outcome: Outcome) -> str:
    return str(outcome) if isinstance(outcome, HeadwaterError) else repr(outcome)


@dataclass
class Payload:
    uid: int
    topic: str
    key: bytes | None
    gens: set[int]
    refused: bool = False


@dataclass
class Gen:
    gid: int
    name: str
    kind: str  # "nr", "rel" or "lv" as created
    partitions: int
    map_enabled: bool
    acked: dict[tuple[int, int], bytes | None] = field(default_factory=dict)
    allowed: set[int] = field(default_factory=set)  # uids it may hold though not acked in it
    tomb_ok: bool = False  # a tombstone of an ambiguous round may be in it
    keys: dict[bytes, tuple[int, int, bytes | None]] = field(default_factory=dict)
    unsure: set[bytes] = field(default_factory=set)  # keys whose latest value is unknowable
    subs: set[str] = field(default_factory=set)  # durable subscriptions known to exist

    @property
    def reliable(self) -> bool:
        return self.kind != "nr"

    def __str__(self) -> str:
        return f"{self.name}#{self.gid}({self.kind}, {self.partitions}p)"


@dataclass
class ConsumerModel:
    cid: int
    conn: int
    topic: str
    gens: frozenset[int]
    sub: str
    reliable: bool
    shared: bool
    checked: int = 0
    seen: dict[tuple[int, int], tuple[bytes | None, bytes | None]] = field(default_factory=dict)
    unacked: list[tuple[int, int]] = field(default_factory=list)
    gone: str | None = None

    def __str__(self) -> str:
        return f"consumer {self.cid} (conn {self.conn}, {self.topic}/{self.sub})"


@dataclass
class Sent:
    op: Op
    request: m.Request
    pre: Gen | None
    uids: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)  # per record or write
    values: list[bytes | None] = field(default_factory=list)
    partition: int = -1
    consumer: ConsumerModel | None = None
    must_answer_ok: bool = False  # the consumer is certainly open
    wrong: bool = False
    revision: int = -1
    checkable: bool = False  # a CAS/get whose answer the model knows exactly
    forbidden: bool = False  # the connection's principal lacks the grant: NOT_AUTHORIZED

    def __str__(self) -> str:
        request = self.request
        if isinstance(request, m.ProduceRequest):  # the records, not the batch's bytes
            records = list(zip(self.keys, self.values, strict=True))
            return f"{self.op} [PRODUCE {request.topic!r} partition {request.partition} {records}]"
        return f"{self.op} [{request!r}]"


def parse_uid(value: bytes) -> tuple[str, int] | None:
    topic, _, uid = value.decode(errors="replace").rpartition("/")
    return (topic, int(uid)) if uid.isdigit() else None


# the grant each op needs on its topic (docs/SECURITY.md); ops not listed need none
_NEEDS = {
    Create: "admin",
    Delete: "admin",
    Produce: "produce",
    WrongPartition: "produce",
    MapSet: "produce",
    MapCas: "produce",
    Subscribe: "consume",
    MapGet: "consume",
    Describe: "consume",
    DeleteSub: "admin",  # or consume and owning it: no principal here has consume without admin
    Seek: "admin",
}


class Model:
    def __init__(self, grants: tuple[tuple[str, ...], ...] | None = None) -> None:
        self.grants = grants  # per connection, when authentication is on
        self.live: dict[str, Gen] = {}
        self.payloads: dict[int, Payload] = {}
        self.consumers: dict[tuple[int, int], ConsumerModel] = {}
        self.to_close: list[tuple[ConsumerModel, str]] = []
        self._uids = itertools.count(1)
        self._gids = itertools.count(1)

    # Planning: ops -> requests, from the state before the round

    def _payload(self, topic: str, key: bytes | None, pre: Gen | None) -> tuple[int, bytes]:
        uid = next(self._uids)
        self.payloads[uid] = Payload(uid, topic, key, {pre.gid} if pre else set())
        return uid, f"{topic}/{uid}".encode()

    def _consumer_at(self, conn: int, slot: int) -> ConsumerModel | None:
        mine = sorted((c for c in self.consumers.values() if c.conn == conn), key=lambda c: c.cid)
        return mine[slot % len(mine)] if mine else None

    def forbidden(self, op: Op) -> bool:
        needs = _NEEDS.get(type(op))
        if self.grants is None or needs is None:
            return False
        grants = self.grants[op.conn]
        topic: str = op.topic  # type: ignore[union-attr]
        if needs == "admin" and isinstance(op, DeleteSub | Seek):
            assert granted(grants, "admin", topic) or not granted(grants, "consume", topic)
        return not granted(grants, needs, topic)

    def plan(self, ops: list[Op]) -> list[Sent]:
        ops_all, ops = ops, [op for op in ops if not self.forbidden(op)]
        plans = self._plan(ops_all, ops)
        for s in plans:
            s.forbidden = self.forbidden(s.op)
        return plans

    def _plan(self, ops_all: list[Op], ops: list[Op]) -> list[Sent]:
        """Plans every op of `ops_all`; only the permitted ones (`ops`) make names ambiguous."""
        admin = {op.topic for op in ops if isinstance(op, Create | Delete)}
        dropped_subs = {(op.topic, op.sub) for op in ops if isinstance(op, DeleteSub)}
        written = {
            (op.topic, KEYS[op.key]) for op in ops if isinstance(op, MapCas | WrongPartition)
        }
        written |= {(op.topic, KEYS[k]) for op in ops if isinstance(op, MapSet) for k in op.keys}
        written |= {
            (op.topic, KEYS[op.key]) for op in ops if isinstance(op, Produce) and op.key is not None
        }
        unsubscribed: set[int] = set()
        plans = []
        for op in ops_all:
            topic = getattr(op, "topic", None)
            pre = self.live.get(topic) if topic else None
            parts = pre.partitions if pre else 1
            if isinstance(op, Create):
                configs = [m.ConfigEntry("fsync", "always")] if op.kind != "nr" else []
                if op.kind == "lv":
                    configs.append(m.ConfigEntry("last.value", "true"))
                dispatch = (
                    m.DispatchMode.NON_RELIABLE if op.kind == "nr" else m.DispatchMode.RELIABLE
                )
                s = Sent(
                    op, m.CreateTopicRequest(op.topic, op.partitions, dispatch, tuple(configs)), pre
                )
            elif isinstance(op, Delete):
                s = Sent(op, m.DeleteTopicRequest(op.topic), pre)
            elif isinstance(op, Produce | WrongPartition):
                key = KEYS[op.key] if op.key is not None else None
                count = op.count if isinstance(op, Produce) else 1
                if key is None:
                    partition = -1 if op.slot == -1 else op.slot % parts  # type: ignore[union-attr]
                else:
                    partition = key_partition(key, parts)
                wrong = isinstance(op, WrongPartition) and parts > 1
                if wrong:
                    partition = (partition + 1) % parts
                s = Sent(op, m.ProduceRequest(op.topic, partition, b""), pre, partition=partition)
                s.wrong = wrong
                s.checkable = wrong and pre is not None and pre.map_enabled
                records = []
                for _ in range(count):
                    uid, value = self._payload(op.topic, key, pre)
                    s.uids.append(uid)
                    s.keys.append(key)
                    s.values.append(value)
                    records.append((key, value, ()))
                s.request = m.ProduceRequest(op.topic, partition, build_batch(records))
            elif isinstance(op, Subscribe):
                settings = m.SubscriptionSettings()
                if op.sub == "lv":
                    settings = m.SubscriptionSettings(durable=m.Durable.LAST_VALUE, key_prefix=b"k")
                elif pre is None or pre.reliable:
                    settings = m.SubscriptionSettings(
                        start=m.StartPosition.EARLIEST,
                        ack_timeout_ms=1500,
                        backoff=m.Backoff.FIXED,
                        backoff_initial_ms=100,
                        max_deliveries=2,
                    )
                sub_type = {"sh": m.SubscriptionType.SHARED, "fo": m.SubscriptionType.FAILOVER}
                s = Sent(
                    op,
                    m.SubscribeRequest(
                        op.topic,
                        op.sub,
                        sub_type.get(op.sub, m.SubscriptionType.EXCLUSIVE),
                        f"c{op.conn}",
                        0,
                        op.credits,
                        settings,
                    ),
                    pre,
                )
            elif isinstance(op, Flow | Ack | Nack | Unsubscribe):
                consumer = self._consumer_at(op.conn, op.slot)
                cid = consumer.cid if consumer else 0
                request: m.Request
                if isinstance(op, Flow):
                    request = m.FlowRequest(cid, op.credits)
                elif isinstance(op, Unsubscribe):
                    request = m.UnsubscribeRequest(cid)
                elif isinstance(op, Nack):
                    given = consumer.unacked[:3] if consumer else [(0, 0)]
                    request = m.NackRequest(cid, tuple(m.AckEntry(p, o) for p, o in given), 50)
                else:
                    request = self._ack_request(op, consumer)
                s = Sent(op, request, None, consumer=consumer)
                s.must_answer_ok = (
                    consumer is not None
                    and consumer.gone is None
                    and consumer.topic not in admin
                    and (consumer.topic, consumer.sub) not in dropped_subs
                    and consumer.cid not in unsubscribed
                )
                if isinstance(op, Unsubscribe) and consumer is not None:
                    unsubscribed.add(consumer.cid)
            elif isinstance(op, DeleteSub):
                s = Sent(op, m.DeleteSubscriptionRequest(op.topic, op.sub), pre)
            elif isinstance(op, Seek):
                s = Sent(op, m.SeekRequest(op.topic, op.sub, m.StartPosition.EARLIEST), pre)
            elif isinstance(op, Describe):
                s = Sent(op, m.DescribeTopicRequest(op.topic), pre)
            elif isinstance(op, ListAll):
                s = Sent(op, m.ListTopicsRequest(), None)
            elif isinstance(op, Steal):
                victim = self._consumer_at(op.victim, op.slot)
                cid = victim.cid if victim else 1_000_000 + op.slot
                stolen: m.Request = {
                    "flow": m.FlowRequest(cid, 5),
                    "ack": m.AckRequest(cid, (m.AckEntry(0, 0),)),
                }.get(op.how, m.UnsubscribeRequest(cid))
                s = Sent(op, stolen, None, consumer=victim)
            elif isinstance(op, MapSet):
                s = Sent(op, m.MapGetRequest(op.topic, ()), pre)
                writes = []
                for k in op.keys:
                    value = None
                    if not op.delete:
                        uid, value = self._payload(op.topic, KEYS[k], pre)
                        s.uids.append(uid)
                    s.keys.append(KEYS[k])
                    s.values.append(value)
                    writes.append(m.MapWrite(KEYS[k], value))
                s.request = m.MapSetRequest(op.topic, tuple(writes))
            elif isinstance(op, MapCas):
                key = KEYS[op.key]
                current = pre.keys.get(key) if pre else None
                exists = current is not None and current[2] is not None
                if op.expect == "absent":
                    revision = -2
                elif op.expect == "current":
                    revision = current[1] if exists and current else -2
                else:
                    revision = (current[1] + 1000) if exists and current else 0
                uid, value = self._payload(op.topic, key, pre)
                s = Sent(op, m.MapSetRequest(op.topic, (m.MapWrite(key, value, revision),)), pre)
                s.uids, s.keys, s.values, s.revision = [uid], [key], [value], revision
                s.checkable = (
                    pre is not None and key not in pre.unsure and (op.topic, key) not in written
                )
                written.add((op.topic, key))
            else:
                assert isinstance(op, MapGet)
                keys = tuple(KEYS[k] for k in op.keys)
                s = Sent(op, m.MapGetRequest(op.topic, keys), pre)
                s.checkable = pre is not None and all(
                    k not in pre.unsure and (op.topic, k) not in written for k in keys
                )
            plans.append(s)
        return plans

    @staticmethod
    def _ack_request(op: Ack, consumer: ConsumerModel | None) -> m.AckRequest | m.AckRangesRequest:
        if consumer is None:
            return m.AckRequest(0, (m.AckEntry(0, 0),))
        pending = consumer.unacked[:100]
        if op.how == "first":
            pending = pending[:1]
        if op.how == "cumulative" and not consumer.shared and pending:
            highest: dict[int, int] = {}
            for p, o in consumer.unacked:
                highest[p] = max(highest.get(p, -1), o)
            entries = tuple(m.AckEntry(p, o) for p, o in sorted(highest.items()))
            return m.AckRequest(consumer.cid, entries, m.AckKind.CUMULATIVE)
        if op.how == "ranges":
            ranges: list[m.AckRange] = []
            for p, o in sorted(pending):
                last = ranges[-1] if ranges else None
                if last and last.partition == p and last.first_offset + last.count == o:
                    last.count += 1
                else:
                    ranges.append(m.AckRange(p, o, 1))
            return m.AckRangesRequest(consumer.cid, tuple(ranges))
        return m.AckRequest(consumer.cid, tuple(m.AckEntry(p, o) for p, o in pending))

    # Applying the answers

    def apply(
        self, plans: list[Sent], outcomes: list[Outcome], listing: dict[str, m.TopicInfo]
    ) -> None:
        from tests.support.fuzzapply import apply_round

        apply_round(self, plans, outcomes, listing)

    def ack(self, gen: Gen, partition: int, offset: int, value: bytes | None, why: Sent) -> None:
        position = (partition, offset)
        if position in gen.acked and gen.acked[position] != value:
            raise Violation(
                f"offset {offset} of partition {partition} of {gen} was given to two messages: "
                f"{gen.acked[position]!r} (acknowledged earlier) and {value!r} ({why})"
            )
        gen.acked[position] = value

    @staticmethod
    def key_write(gen: Gen, key: bytes, partition: int, offset: int, value: bytes | None) -> None:
        current = gen.keys.get(key)
        if current is not None and current[0] != partition:
            gen.unsure.add(key)
        if current is None or offset > current[1]:
            gen.keys[key] = (partition, offset, value)

    # Checks of what the server pushed or returned

    def check_record(
        self,
        where: str,
        topic: str,
        gens: frozenset[int],
        partition: int,
        record: Record,
        strict: Gen | None,
        seen: dict[tuple[int, int], tuple[bytes | None, bytes | None]],
    ) -> None:
        position = (partition, record.offset)
        found = (record.key, record.value)
        if position in seen and seen[position] != found:
            raise Violation(
                f"{where}: offset {record.offset} of partition {partition} of {topic!r} came with "
                f"two different records: {seen[position]!r} and {found!r}"
            )
        seen[position] = found
        expected = strict.acked.get(position, _MISSING) if strict else _MISSING
        if record.value is None:
            if expected is not _MISSING and expected is not None:
                raise Violation(f"{where}: tombstone at {position} of {strict}; acked {expected!r}")
            if strict and expected is _MISSING and not strict.tomb_ok:
                raise Violation(f"{where}: a tombstone at {position} of {strict} nobody wrote")
            return
        parsed = parse_uid(record.value)
        payload = self.payloads.get(parsed[1]) if parsed else None
        if payload is None:
            raise Violation(f"{where}: record {found!r} at {position} of {topic!r} was never sent")
        if payload.topic != topic:
            raise Violation(
                f"{where}: record {found!r} written to {payload.topic!r} read from {topic!r}"
            )
        if not payload.gens & gens:
            raise Violation(
                f"{where}: record {found!r} at {position} was written to generation(s) "
                f"{sorted(payload.gens)} of {topic!r} (since deleted) but read from generation(s) "
                f"{sorted(gens)}: a deleted topic's data came back"
            )
        if payload.refused:
            raise Violation(
                f"{where}: record {found!r} at {position}: its write was refused, yet stored"
            )
        if payload.key != record.key:
            raise Violation(f"{where}: record {found!r} was written with key {payload.key!r}")
        if expected is not _MISSING and expected != record.value:
            raise Violation(
                f"{where}: offset {record.offset} of partition {partition} of {strict} holds "
                f"{record.value!r} but {expected!r} was acknowledged there"
            )

    def check_map(self, gen: Gen, entries: tuple[m.MapEntry, ...], where: str) -> None:
        for entry in entries:
            if entry.key in gen.unsure:
                continue
            latest = gen.keys.get(entry.key)
            if latest is None or latest[2] is None:
                if entry.found:
                    raise Violation(
                        f"{where}: map {gen} key {entry.key!r} should be absent "
                        f"({'deleted at ' + str(latest[:2]) if latest else 'never set'}) but "
                        f"holds {entry.value!r} at partition {entry.partition} revision "
                        f"{entry.revision}"
                    )
                continue
            got = (entry.partition, entry.revision, entry.value) if entry.found else None
            if got != latest:
                raise Violation(
                    f"{where}: map {gen} key {entry.key!r}: the last acknowledged write is "
                    f"{latest[2]!r} at partition {latest[0]} revision {latest[1]}, but the map "
                    f"returns {'nothing' if got is None else repr(got)}"
                )

    def restarted(self) -> None:
        """Connections are gone, and with them every consumer; durable state stays."""
        for consumer in self.consumers.values():
            consumer.gone = consumer.gone or "server restarted"
        self.consumers.clear()
        self.to_close.clear()
