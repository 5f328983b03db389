"""Checking one pipelined round's answers against the model (see tests/support/fuzzmodel.py).

First the creates and deletes, name by name: the answers must fit some order of the round's
requests, and LIST_TOPICS after the round must show the state they imply. Then every other
answer, in the order sent: exactly when its topic had no successful create or delete in the
round, else only for being one of the answers some order allows. Successful writes are recorded
as acknowledged (or, in an ambiguous round, as allowed in the new generation).
"""

from __future__ import annotations

from headwater.wire import messages as m
from tests.support.fuzzmodel import (
    OK,
    ConsumerModel,
    Gen,
    Model,
    Sent,
    Violation,
    code,
    show,
)
from tests.support.fuzzops import (
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
    Produce,
    Seek,
    Steal,
    Subscribe,
    Unsubscribe,
    WrongPartition,
    key_partition,
    visible,
)
from tests.support.fuzzpeer import Outcome

_AMBIGUOUS = {
    Produce: {OK, "UNKNOWN_TOPIC", "INVALID_PARTITION", "WRONG_PARTITION"},
    WrongPartition: {OK, "UNKNOWN_TOPIC", "INVALID_PARTITION", "WRONG_PARTITION"},
    Subscribe: {OK, "UNKNOWN_TOPIC", "CONSUMER_BUSY", "INVALID_REQUEST"},
    DeleteSub: {OK, "UNKNOWN_TOPIC", "INVALID_REQUEST", "UNKNOWN_SUBSCRIPTION"},
    MapSet: {OK, "UNKNOWN_TOPIC", "INVALID_REQUEST"},
    MapCas: {OK, "UNKNOWN_TOPIC", "INVALID_REQUEST", "REVISION_MISMATCH"},
    MapGet: {OK, "UNKNOWN_TOPIC", "INVALID_REQUEST"},
}


def expect(sent: Sent, outcome: Outcome, allowed: set[str], why: str) -> None:
    if code(outcome) not in allowed:
        raise Violation(
            f"{sent}\n  answered {show(outcome)}\n  expected one of {sorted(allowed)}: {why}"
        )


def kind_of(info: m.TopicInfo) -> tuple[str, bool]:
    if info.dispatch == m.DispatchMode.NON_RELIABLE:
        return "nr", False
    enabled = any(c.name == "last.value" and c.value == "true" for c in info.configs)
    return "rel", enabled


def apply_round(
    model: Model, plans: list[Sent], outcomes: list[Outcome], listing: dict[str, m.TopicInfo]
) -> None:
    permitted = []
    for sent, outcome in zip(plans, outcomes, strict=True):
        if sent.forbidden:  # checked before the broker sees it: no topic state matters
            expect(sent, outcome, {"NOT_AUTHORIZED"}, "the principal has no grant for it")
            _refused(model, sent)
        else:
            permitted.append((sent, outcome))
    plans = [s for s, _ in permitted]
    outcomes = [o for _, o in permitted]
    _apply_unsubscribes(plans, outcomes)
    changed = _apply_admin(model, plans, outcomes, listing)
    for sent, outcome in zip(plans, outcomes, strict=True):
        if isinstance(sent.op, Create | Delete):
            continue
        topic = getattr(sent.op, "topic", None)
        if isinstance(sent.op, Seek | Describe | ListAll | Steal):
            _apply_probe(model, sent, outcome, topic in changed)
        elif topic is not None and topic in changed:
            _apply_ambiguous(model, sent, outcome, changed[topic])
        else:
            _apply_exact(model, sent, outcome)
    _check_listing(model, listing)


def _apply_unsubscribes(plans: list[Sent], outcomes: list[Outcome]) -> None:
    """An UNSUBSCRIBE answered OK detached its consumer before any close of the round could reach
    it (a closed consumer id answers UNKNOWN_CONSUMER), so a topic or subscription deleted in the
    same round owes it no CONSUMER_CLOSED. Applied before deletes, whatever their order in the
    round: rounds run on several connections at once."""
    for sent, outcome in zip(plans, outcomes, strict=True):
        consumer = sent.consumer
        unsubscribed = isinstance(sent.op, Unsubscribe) and code(outcome) == OK
        if unsubscribed and consumer is not None and consumer.gone is None:
            consumer.gone = "unsubscribed"


def _apply_admin(
    model: Model, plans: list[Sent], outcomes: list[Outcome], listing: dict[str, m.TopicInfo]
) -> dict[str, Gen | None]:
    """Returns the names with a successful create or delete, each with its new generation."""
    by_name: dict[str, list[tuple[Sent, Outcome]]] = {}
    for sent, outcome in zip(plans, outcomes, strict=True):
        if isinstance(sent.op, Create):
            expect(sent, outcome, {OK, "TOPIC_EXISTS"}, "a create succeeds or finds the name taken")
        elif isinstance(sent.op, Delete):
            expect(sent, outcome, {OK, "UNKNOWN_TOPIC"}, "a delete succeeds or finds no topic")
        else:
            continue
        by_name.setdefault(sent.op.topic, []).append((sent, outcome))
    changed: dict[str, Gen | None] = {}
    for name, answers in by_name.items():
        before = model.live.get(name)
        creates = [s for s, o in answers if isinstance(s.op, Create) and code(o) == OK]
        deletes = [s for s, o in answers if isinstance(s.op, Delete) and code(o) == OK]
        if len(answers) == 1:
            sent, outcome = answers[0]
            wanted = (
                OK
                if isinstance(sent.op, Create) == (before is None)
                else ("TOPIC_EXISTS" if isinstance(sent.op, Create) else "UNKNOWN_TOPIC")
            )
            expect(
                sent, outcome, {wanted}, f"the only create/delete of {name!r}; before it: {before}"
            )
        toggles = len(creates) - len(deletes)
        if toggles not in ((-1, 0) if before else (0, 1)):
            raise Violation(
                f"{len(creates)} creates and {len(deletes)} deletes of {name!r} succeeded in one "
                f"round, starting from {before or 'no topic'}: no order of them allows that\n  "
                + "\n  ".join(f"{s} -> {show(o)}" for s, o in answers)
            )
        if not creates and not deletes:
            continue
        exists = (before is not None) if toggles == 0 else toggles == 1
        if exists != (name in listing):
            raise Violation(
                f"after {len(creates)} successful creates and {len(deletes)} deletes of {name!r} "
                f"(before: {before or 'no topic'}) LIST_TOPICS {'lacks' if exists else 'shows'} it"
            )
        if before is not None and deletes:
            del model.live[name]
            _closing(model, lambda c, g=before: c.gens == {g.gid}, f"topic {before} was deleted")
        new = None
        if creates and exists:
            info = listing[name]
            kind, enabled = kind_of(info)
            fits = [
                s
                for s in creates
                if (s.op.kind == "nr") == (kind == "nr") and s.op.partitions == info.partitions
            ]
            if not fits:
                raise Violation(f"LIST_TOPICS shows {info} after creates {creates}: none of them")
            created = fits[-1].op
            new = Gen(next(model._gids), name, created.kind, info.partitions, enabled)
            model.live[name] = new
        changed[name] = new
    return changed


def _apply_probe(model: Model, sent: Sent, outcome: Outcome, ambiguous: bool) -> None:
    """The hostile connection's extra requests (authenticated run)."""
    op, pre = sent.op, sent.pre
    if isinstance(op, Steal):
        expect(sent, outcome, {"UNKNOWN_CONSUMER"}, "the consumer id belongs to another connection")
    elif isinstance(op, ListAll):
        expect(sent, outcome, {OK}, "anyone may list")
        assert isinstance(outcome, m.ListTopicsResponse) and model.grants is not None
        hidden = [t.name for t in outcome.topics if not visible(model.grants[op.conn], t.name)]
        if hidden:
            raise Violation(f"{sent}\n  LIST_TOPICS showed topics without a grant: {hidden}")
    elif isinstance(op, Describe):
        allowed = {OK, "UNKNOWN_TOPIC"} if ambiguous else {OK if pre else "UNKNOWN_TOPIC"}
        expect(sent, outcome, allowed, f"describing {pre or 'no topic'}")
        if isinstance(outcome, m.DescribeTopicResponse) and outcome.topic.name != op.topic:
            raise Violation(f"{sent}\n  answered {outcome}: another topic")
    else:
        assert isinstance(op, Seek)
        allowed = {OK, "UNKNOWN_TOPIC", "UNKNOWN_SUBSCRIPTION", "INVALID_REQUEST"}
        if not ambiguous and pre is None:
            allowed = {"UNKNOWN_TOPIC"}
        elif not ambiguous and pre is not None and op.sub in pre.subs:
            allowed = {OK}
        expect(sent, outcome, allowed, f"seeking {op.sub!r} of {pre or 'no topic'}")
        if code(outcome) == OK:
            for consumer in model.consumers.values():
                if consumer.topic == op.topic and consumer.sub == op.sub:
                    consumer.unacked.clear()  # forgotten; redelivered from earliest


def _closing(model: Model, which: object, reason: str) -> None:
    for consumer in model.consumers.values():
        if consumer.gone is None and which(consumer):  # type: ignore[operator]
            model.to_close.append((consumer, reason))
            consumer.gone = reason


def _record_write(model: Model, gen: Gen, sent: Sent, outcome: Outcome) -> None:
    """An exactly-known successful write: every record acknowledged at its offset."""
    if isinstance(outcome, m.ProduceResponse):
        positions = [(outcome.partition, outcome.base_offset + i) for i in range(len(sent.uids))]
    else:
        assert isinstance(outcome, m.MapSetResponse)
        if len(outcome.revisions) != len(sent.keys):
            raise Violation(f"{sent}\n  answered {outcome}: one revision per write expected")
        positions = [
            (key_partition(k, gen.partitions), r)  # type: ignore[arg-type]
            for k, r in zip(sent.keys, outcome.revisions, strict=True)
        ]
    for (partition, offset), key, value in zip(positions, sent.keys, sent.values, strict=True):
        model.ack(gen, partition, offset, value, sent)
        if key is not None:
            if sent.wrong:
                gen.unsure.add(key)
            model.key_write(gen, key, partition, offset, value)


def _refused(model: Model, sent: Sent) -> None:
    for uid in sent.uids:
        model.payloads[uid].refused = True


def _apply_exact(model: Model, sent: Sent, outcome: Outcome) -> None:
    op, pre = sent.op, sent.pre
    if isinstance(op, Flow | Ack | Nack | Unsubscribe):
        if sent.must_answer_ok:
            expect(sent, outcome, {OK}, f"{sent.consumer} is open")
        else:
            expect(sent, outcome, {OK, "UNKNOWN_CONSUMER"}, "the consumer may be gone")
        consumer = sent.consumer
        if code(outcome) == OK and consumer is not None:
            if isinstance(op, Unsubscribe):
                consumer.gone = "unsubscribed"
            elif isinstance(op, Nack):
                assert isinstance(sent.request, m.NackRequest)
                given = {(a.partition, a.offset) for a in sent.request.acks}
                consumer.unacked = [x for x in consumer.unacked if x not in given]
            elif isinstance(op, Ack) and isinstance(sent.request, m.AckRangesRequest):
                done = {
                    (r.partition, o)
                    for r in sent.request.ranges
                    for o in range(r.first_offset, r.first_offset + r.count)
                }
                consumer.unacked = [x for x in consumer.unacked if x not in done]
            elif isinstance(op, Ack):
                assert isinstance(sent.request, m.AckRequest)
                done = {(a.partition, a.offset) for a in sent.request.acks}
                if sent.request.kind == m.AckKind.CUMULATIVE:
                    top = {a.partition: a.offset for a in sent.request.acks}
                    consumer.unacked = [(p, o) for p, o in consumer.unacked if o > top.get(p, -1)]
                else:
                    consumer.unacked = [x for x in consumer.unacked if x not in done]
        return
    if pre is None:
        expect(sent, outcome, {"UNKNOWN_TOPIC"}, f"topic {op.topic!r} does not exist")  # type: ignore[union-attr]
        _refused(model, sent)
        return
    if isinstance(op, Produce | WrongPartition):
        if sent.checkable:
            expect(
                sent,
                outcome,
                {"WRONG_PARTITION"},
                f"{pre} keeps last values: a keyed record "
                "must go to its key's partition, or revisions stop being unique per key",
            )
        elif sent.wrong:
            expect(sent, outcome, {OK, "WRONG_PARTITION"}, f"{pre} may be gaining a map")
        else:
            expect(sent, outcome, {OK}, f"{pre} exists")
        if code(outcome) != OK:
            _refused(model, sent)
            return
        assert isinstance(outcome, m.ProduceResponse)
        if (
            sent.partition not in (-1, outcome.partition)
            or not 0 <= outcome.partition < pre.partitions
        ):
            raise Violation(f"{sent}\n  answered {outcome}: wrong partition")
        if pre.reliable:
            _record_write(model, pre, sent, outcome)
    elif isinstance(op, Subscribe):
        allowed = {OK}
        if op.sub in ("ex", "lv"):
            allowed.add("CONSUMER_BUSY")
        if op.sub == "lv" and not pre.reliable:
            allowed = {"INVALID_REQUEST"}
        elif op.sub == "lv" and not pre.map_enabled:
            # a read never switches last-value state on; a write of this round may have
            allowed.add("INVALID_REQUEST")
        expect(sent, outcome, allowed, f"subscribing {op.sub!r} to {pre}")
        if isinstance(outcome, m.SubscribeResponse):
            _new_consumer(model, sent, outcome, frozenset({pre.gid}), pre.reliable)
            if pre.reliable and op.sub != "lv":
                pre.subs.add(op.sub)
            if op.sub == "lv":
                pre.map_enabled = True
    elif isinstance(op, DeleteSub):
        if op.sub in pre.subs:
            expect(sent, outcome, {OK}, f"durable subscription {op.sub!r} of {pre} exists")
        else:
            expect(sent, outcome, {OK, "INVALID_REQUEST", "UNKNOWN_SUBSCRIPTION"}, "may not exist")
        if code(outcome) == OK:
            pre.subs.discard(op.sub)
            _closing(
                model,
                lambda c: c.gens == {pre.gid} and c.sub == op.sub,
                f"subscription {op.sub!r} of {pre} was deleted",
            )
    else:
        _apply_map_exact(model, sent, outcome, pre)


def _apply_map_exact(model: Model, sent: Sent, outcome: Outcome, pre: Gen) -> None:
    op = sent.op
    if not pre.reliable:
        expect(sent, outcome, {"INVALID_REQUEST"}, f"{pre} is non-reliable: no map")
        _refused(model, sent)
        return
    if isinstance(op, MapCas):
        if not sent.checkable:
            allowed = {OK, "REVISION_MISMATCH"}
        elif op.expect == "stale":
            allowed = {"REVISION_MISMATCH"}
        elif op.expect == "current":
            allowed = {OK}
        else:
            latest = pre.keys.get(sent.keys[0])  # type: ignore[arg-type]
            allowed = {OK} if latest is None or latest[2] is None else {"REVISION_MISMATCH"}
        expect(
            sent, outcome, allowed, f"compare-and-set on {pre}, model: {pre.keys.get(sent.keys[0])}"
        )  # type: ignore[arg-type]
    elif isinstance(op, MapGet) and not pre.map_enabled:
        # a read never switches last-value state on; a write of this round may have
        expect(sent, outcome, {OK, "INVALID_REQUEST"}, f"{pre} may have no last-value state")
    else:
        expect(sent, outcome, {OK}, f"{pre} is reliable")
    if code(outcome) != OK:
        _refused(model, sent)
        return
    pre.map_enabled = True
    if isinstance(outcome, m.MapGetResponse):
        if sent.checkable:
            model.check_map(pre, outcome.entries, f"{sent}")
    else:
        _record_write(model, pre, sent, outcome)


def _apply_ambiguous(model: Model, sent: Sent, outcome: Outcome, new: Gen | None) -> None:
    allowed = _AMBIGUOUS.get(type(sent.op))
    assert allowed is not None, sent
    expect(sent, outcome, allowed, f"{sent.op.topic!r} was created or deleted in this round")  # type: ignore[union-attr]
    if code(outcome) != OK:
        _refused(model, sent)
        return
    if isinstance(sent.op, Subscribe):
        assert isinstance(outcome, m.SubscribeResponse)
        gens = {g.gid for g in (sent.pre, new) if g is not None}
        reliable = all(g.reliable for g in (sent.pre, new) if g is not None)
        _new_consumer(model, sent, outcome, frozenset(gens), reliable)
        return
    if new is None:
        return
    for uid in sent.uids:
        model.payloads[uid].gens.add(new.gid)
        new.allowed.add(uid)
    for key, value in zip(sent.keys, sent.values, strict=True):
        if key is not None:
            new.unsure.add(key)
        if value is None and isinstance(sent.op, MapSet):
            new.tomb_ok = True


def _new_consumer(
    model: Model, sent: Sent, outcome: m.SubscribeResponse, gens: frozenset[int], reliable: bool
) -> None:
    op = sent.op
    assert isinstance(op, Subscribe)
    ident = (op.conn, outcome.consumer_id)
    if any(c.cid == outcome.consumer_id for c in model.consumers.values()):
        raise Violation(f"{sent}\n  answered {outcome}: that consumer id is already in use")
    model.consumers[ident] = ConsumerModel(
        outcome.consumer_id, op.conn, op.topic, gens, op.sub, reliable, op.sub == "sh"
    )


def _check_listing(model: Model, listing: dict[str, m.TopicInfo]) -> None:
    names = {n for n in listing if not n.endswith("-DLQ")}
    if names != set(model.live):
        raise Violation(
            f"LIST_TOPICS shows {sorted(names)}, the model has {sorted(model.live)}; "
            f"live: {[str(g) for g in model.live.values()]}"
        )
    for name, gen in model.live.items():
        info = listing[name]
        kind, enabled = kind_of(info)
        if (kind == "nr") != (gen.kind == "nr") or info.partitions != gen.partitions:
            raise Violation(f"LIST_TOPICS shows {info}, the model has {gen}")
        if gen.map_enabled and not enabled:
            raise Violation(f"LIST_TOPICS shows {info} without last.value; {gen} has a map")
        gen.map_enabled = enabled
