"""A randomized state-machine test of a live server: pipelined requests, restarts, invariants.

Hypothesis drives a `RuleBasedStateMachine` against a real server process (JSON logs) with three
raw-protocol connections. A step is either a *round*, up to 8 create/delete/produce/subscribe/
flow/ack/unsubscribe/delete-subscription/map requests spread over the connections and all written
before any answer is read, or a *restart*, graceful (SIGTERM) or `kill -9`. The model
(tests/support/fuzzmodel.py, tests/support/fuzzapply.py) checks after every round:

- every request is answered within `HEADWATER_FUZZ_ANSWER_S` (a missing answer fails, naming it);
- every answer is one some order of the round allows, LIST_TOPICS matches the model, no offset is
  given to two records, every delivered record was written to that topic generation, consumers
  of a deleted topic or subscription are told, and `map get` returns the last acknowledged set;
- the server log has no error-level line and no traceback;

and after every restart (and at the end of each example, after a graceful one), also that every
acknowledged record of every live reliable topic (fsync=always) is read back from earliest by a
fresh subscription, that deleted topics stay deleted and refuse produces, and that maps survive.

Modes: CI by default (a few examples, no shrinking, well under two minutes when nothing fails);
`HEADWATER_FUZZ=long` (`make fuzz`) runs many more examples and shrinks a failure to a minimal
program. `HEADWATER_FUZZ_SEED` replays a run; `HEADWATER_FUZZ_EXAMPLES` and `HEADWATER_FUZZ_STEPS`
override the sizes; `HEADWATER_FUZZ_SKIP=Delete,WrongPartition` leaves out op kinds (to get past a
known bug). `test_state_machine_with_auth` runs the same machine with authentication on, three
principals, one of them hostile (tests/support/fuzzauth.py); `make fuzz` runs both long. A failure
prints the seed, the steps as a replayable program and the violated promise.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.records import build_batch
from tests.support.fuzzapply import _check_listing, expect
from tests.support.fuzzmodel import OK, Gen, Model, Sent, Violation, code, show
from tests.support.fuzzops import CONNECTIONS, KEYS, TOPICS, Op, rounds
from tests.support.fuzzpeer import FuzzPeer, Outcome
from tests.support.fuzzrepro import REPRODUCTIONS

LONG = os.environ.get("HEADWATER_FUZZ") == "long"
ANSWER_S = float(os.environ.get("HEADWATER_FUZZ_ANSWER_S", "5"))
READ_BACK_S = 5.0  # reading a topic back after a restart
CLOSE_NOTICE_S = 3.0  # a consumer of a deleted topic hears of it within this
STOP_S = 15.0  # a graceful shutdown finishes within this
SETTINGS = settings(
    max_examples=int(os.environ.get("HEADWATER_FUZZ_EXAMPLES", "150" if LONG else "4")),
    stateful_step_count=int(os.environ.get("HEADWATER_FUZZ_STEPS", "40" if LONG else "14")),
    deadline=None,
    phases=(
        (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)
        if LONG
        else (Phase.explicit, Phase.reuse, Phase.generate)
    ),
    suppress_health_check=list(HealthCheck),
    print_blob=True,
    # HEADWATER_FUZZ_DB=0: no example database, so each seed explores afresh instead of first
    # replaying the last failure
    **({"database": None} if os.environ.get("HEADWATER_FUZZ_DB") == "0" else {}),
    report_multiple_bugs=False,
)


class HeadwaterMachine(RuleBasedStateMachine):
    last_failure_dir: Path | None = None
    topics: tuple[str, ...] = TOPICS
    check_conn = 0  # the connection the checks (listing, read-back, map get) use
    connections = CONNECTIONS

    def __init__(self) -> None:
        super().__init__()
        self.failed = False
        self.rounds = 0
        self.since_restart = 0
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="hw-fuzz-"))
        self.tokens: list[str | None] = [None] * self.connections
        self.server = ServerProcess(
            self.dir / "data", extra_args=("--log-format", "json", *self._server_args())
        )
        self.server.start()
        self.log_position = 0
        self.model = Model(self._grants())
        self.peers: list[FuzzPeer] = []
        self.run(self._connect())

    def _server_args(self) -> tuple[str, ...]:
        return ()

    def _grants(self) -> tuple[tuple[str, ...], ...] | None:
        return None

    def run(self, coroutine):  # type: ignore[no-untyped-def]
        try:
            return self.loop.run_until_complete(coroutine)
        except BaseException:
            self.failed = True
            raise

    # Steps

    @rule(ops=rounds(), trickle=st.sampled_from([None, 0.0, 0.0003, 0.001]))
    def pipeline(self, ops: list[Op], trickle: float | None = None) -> None:
        """Send a round pipelined: all at once, one write per connection, or (`trickle` seconds
        apart) one write per request, so later requests arrive while the server works on
        earlier ones."""
        self.rounds += 1
        self.since_restart += 1
        self.run(self._round(ops, trickle))

    @precondition(lambda self: self.since_restart >= 3)
    @rule(how=st.sampled_from(["graceful", "kill -9"]))
    def restart(self, how: str) -> None:
        self.since_restart = 0
        self.run(self._restart(how))

    def teardown(self) -> None:
        try:
            if not self.failed:
                self.run(self._restart("graceful"))
        finally:
            self.loop.run_until_complete(self._disconnect())
            self.loop.close()
            self.server.kill()
            if self.failed:
                if HeadwaterMachine.last_failure_dir is not None:
                    shutil.rmtree(HeadwaterMachine.last_failure_dir, ignore_errors=True)
                HeadwaterMachine.last_failure_dir = self.dir
                print(f"server data and log of the failing example: {self.dir}")
            else:
                shutil.rmtree(self.dir, ignore_errors=True)

    # A round

    async def _round(self, ops: list[Op], trickle: float | None) -> None:
        plans = self.model.plan(ops)
        items = [(s.op.conn, s) for s in plans]
        outcomes = await self._exchange(items, f"round {self.rounds}", trickle)
        listing = await self._listing()
        table = "\n    ".join(f"{s.op} -> {show(o)}" for s, o in zip(plans, outcomes, strict=True))
        try:
            self.model.apply(plans, outcomes, listing)
            await self._after_round()
        except Violation as exc:
            raise Violation(
                f"{exc}\n  the round's answers:\n    {table}{self._errors_logged()}"
            ) from None

    async def _exchange(
        self, items: list[tuple[int, Sent]], what: str, trickle: float | None = None
    ) -> list[Outcome]:
        """Send every request pipelined, then wait for all answers."""
        batches: dict[int, list[bytes]] = {}
        waiting = []
        for conn, sent in items:
            correlation, data, future = self.peers[conn].encode(sent.request)
            batches.setdefault(conn, []).append(data)
            waiting.append((conn, correlation, sent, future))
            if trickle is not None:
                await self.peers[conn].send(data)
                await asyncio.sleep(trickle)  # shapes arrival times; nothing waits on it
        if trickle is None:
            await asyncio.gather(*(self.peers[c].send(b"".join(d)) for c, d in batches.items()))
        await asyncio.wait([f for *_, f in waiting], timeout=ANSWER_S)
        missing = [
            f"connection {conn}, correlation id {correlation}: {sent}"
            + (f" (connection {self.peers[conn].lost})" if self.peers[conn].lost else "")
            for conn, correlation, sent, future in waiting
            if not future.done()
        ]
        if missing:
            answered = "\n    ".join(
                f"{s.op} -> {show(f.result())}" for _, _, s, f in waiting if f.done()
            )
            raise Violation(
                f"{what}: no answer within {ANSWER_S}s to {len(missing)} of {len(waiting)} "
                "pipelined requests:\n    "
                + "\n    ".join(missing)
                + f"\n  answered:\n    {answered}"
                + self._log_tail()
            )
        return [f.result() for *_, f in waiting]

    async def _call(self, conn: int, request: m.Request, what: str) -> Outcome:
        sent = Sent(op=what, request=request, pre=None)  # type: ignore[arg-type]
        return (await self._exchange([(conn, sent)], what))[0]

    async def _listing(self) -> dict[str, m.TopicInfo]:
        outcome = await self._call(self.check_conn, m.ListTopicsRequest(), "LIST_TOPICS")
        if not isinstance(outcome, m.ListTopicsResponse):
            raise Violation(f"LIST_TOPICS answered {show(outcome)}")
        return {t.name: t for t in outcome.topics}

    async def _after_round(self) -> None:
        self._check_peers()
        self._check_pushed_ids()
        self._check_deliveries()
        await self._check_closed()
        await self._check_maps("after the round")
        self._check_log()

    def _check_peers(self) -> None:
        for peer in self.peers:
            if peer.lost or peer.bad_frames:
                raise Violation(
                    f"connection {peer.index}: {peer.lost or ''} {peer.bad_frames}"
                    + self._log_tail()
                )

    def _check_pushed_ids(self) -> None:
        """A connection is pushed only for consumer ids its own SUBSCRIBE was given."""
        for peer in self.peers:
            if peer.index == self.check_conn:
                continue
            own = {c.cid for c in self.model.consumers.values() if c.conn == peer.index}
            stray = sorted(cid for cid, p in peer.pushes.items() if p.records and cid not in own)
            if stray:
                raise Violation(
                    f"connection {peer.index} was delivered records for consumer ids {stray} "
                    f"it never subscribed (its own: {sorted(own)})"
                )

    def _check_deliveries(self) -> None:
        for consumer in list(self.model.consumers.values()):
            pushes = self.peers[consumer.conn].pushes_for(consumer.cid)
            single = next((g for g in self.model.live.values() if {g.gid} == consumer.gens), None)
            strict = single if consumer.reliable else None
            for partition, _, record in pushes.records[consumer.checked :]:
                self.model.check_record(
                    f"delivery to {consumer}",
                    consumer.topic,
                    consumer.gens,
                    partition,
                    record,
                    strict,
                    consumer.seen,
                )
                position = (partition, record.offset)
                if consumer.reliable and consumer.sub != "lv" and position not in consumer.unacked:
                    consumer.unacked.append(position)
            consumer.checked = len(pushes.records)
            if pushes.closed is not None and consumer.gone is None:
                consumer.gone = f"closed by the server: {pushes.closed.message}"

    async def _check_closed(self) -> None:
        """Consumers of a deleted topic or subscription must be sent CONSUMER_CLOSED."""
        deadline = self.loop.time() + CLOSE_NOTICE_S
        for consumer, reason in self.model.to_close:
            peer = self.peers[consumer.conn]
            while peer.pushes_for(consumer.cid).closed is None and not peer.lost:
                if self.loop.time() > deadline:
                    raise Violation(
                        f"{consumer}: {reason}, but no CONSUMER_CLOSED came within "
                        f"{CLOSE_NOTICE_S}s"
                    )
                await peer.arrival(deadline - self.loop.time())
        self.model.to_close.clear()

    async def _check_maps(self, when: str) -> None:
        for gen in list(self.model.live.values()):
            if not gen.map_enabled:
                continue
            outcome = await self._call(
                self.check_conn, m.MapGetRequest(gen.name, KEYS), f"map get {gen}"
            )
            if not isinstance(outcome, m.MapGetResponse):
                raise Violation(f"{when}: map get of every key of {gen} answered {show(outcome)}")
            self.model.check_map(gen, outcome.entries, f"{when}: map get of every key")

    def _check_log(self) -> None:
        with self.server.log_path.open("rb") as log:
            log.seek(self.log_position)
            data = log.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.log_position += len(complete)
        bad = []
        for raw in complete.decode(errors="replace").splitlines():
            try:
                entry = json.loads(raw)
            except ValueError:
                if any(word in raw for word in ("Traceback", "Error", "Exception")):
                    bad.append(raw)
                continue
            if not isinstance(entry, dict):
                continue
            if entry.get("level") in ("error", "critical", "exception") or "exception" in entry:
                bad.append(raw)
        if bad:
            raise Violation(
                f"the server logged {len(bad)} error or traceback line(s):\n    "
                + "\n    ".join(line[:3000] for line in bad[:5])
            )

    def _errors_logged(self) -> str:
        """The server's error lines so far, each as its event and the exception's last line."""
        found = []
        for raw in self.server.log().splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(raw)
                if isinstance(entry, dict) and entry.get("level") in ("error", "critical"):
                    last = str(entry.get("exception", "")).strip().splitlines()[-1:]
                    found.append(f"{entry.get('event')}: {' '.join(last)}")
        return "\n  server errors:\n    " + "\n    ".join(found) if found else ""

    def _log_tail(self, lines: int = 12) -> str:
        tail = self.server.log().splitlines()[-lines:]
        return "\n  server log tail:\n    " + "\n    ".join(t[:400] for t in tail)

    # Restarts and what must survive them

    async def _restart(self, how: str) -> None:
        self._check_log()
        if how == "graceful":
            try:
                code_ = await asyncio.to_thread(self.server.stop, STOP_S)
            except subprocess.TimeoutExpired:
                self.server.kill()
                raise Violation(
                    f"graceful shutdown (SIGTERM) did not finish within {STOP_S}s"
                    + self._log_tail()
                ) from None
            if code_ != 0:
                raise Violation(f"graceful shutdown exited {code_}" + self._log_tail())
        else:
            self.server.kill()
        await self._disconnect()
        self.model.restarted()
        self._check_log()
        self.server.start()
        await self._connect()
        await self._verify(f"after a {how} restart")

    async def _verify(self, when: str) -> None:
        listing = await self._listing()
        try:
            _check_listing(self.model, listing)
        except Violation as exc:
            raise Violation(f"{when}: {exc}") from None
        for name in self.topics:
            if name not in self.model.live:
                batch = build_batch([(None, f"{name}/0".encode(), ())])
                outcome = await self._call(
                    self.check_conn, m.ProduceRequest(name, 0, batch), "produce"
                )
                if code(outcome) != "UNKNOWN_TOPIC":
                    raise Violation(
                        f"{when}: producing to {name!r}, deleted or never created, answered "
                        f"{show(outcome)}; expected UNKNOWN_TOPIC"
                    )
        for gen in list(self.model.live.values()):
            if gen.reliable:
                await self._read_back(gen, when)
        await self._check_maps(when)
        self._check_log()

    async def _read_back(self, gen: Gen, when: str) -> None:
        """Every acknowledged record of `gen`, read from earliest by the `verify` subscription."""
        peer = self.peers[self.check_conn]
        where = f"{when}: reading {gen} back from earliest"
        described = await self._call(
            self.check_conn, m.DescribeTopicRequest(gen.name), f"describe {gen}"
        )
        if not isinstance(described, m.DescribeTopicResponse):
            raise Violation(f"{where}: DESCRIBE_TOPIC answered {show(described)}")
        if "verify" in gen.subs:
            seek = m.SeekRequest(gen.name, "verify", m.StartPosition.EARLIEST)
            outcome = await self._call(self.check_conn, seek, f"seek verify of {gen}")
            expect(Sent(f"seek {gen}", seek, gen), outcome, {OK}, "verify exists")  # type: ignore[arg-type]
        subscribe = m.SubscribeRequest(
            gen.name,
            "verify",
            m.SubscriptionType.EXCLUSIVE,
            "verifier",
            0,
            1_000_000,
            m.SubscriptionSettings(start=m.StartPosition.EARLIEST),
        )
        outcome = await self._call(self.check_conn, subscribe, f"subscribe verify to {gen}")
        if not isinstance(outcome, m.SubscribeResponse):
            raise Violation(f"{where}: SUBSCRIBE answered {show(outcome)}")
        gen.subs.add("verify")
        pushes = peer.pushes_for(outcome.consumer_id)
        seen: dict[tuple[int, int], tuple[bytes | None, bytes | None]] = {}
        # read up to the highest acknowledged offset: after kill -9 the next offset lies past a
        # gap (appends continue at the offset lease), so waiting for it would only time out
        ends = [-1] * len(described.next_offsets)
        for partition, offset in gen.acked:
            ends[partition] = max(ends[partition], offset)
        deadline = self.loop.time() + READ_BACK_S
        checked = 0
        while True:
            for partition, _, record in pushes.records[checked:]:
                self.model.check_record(
                    where, gen.name, frozenset({gen.gid}), partition, record, gen, seen
                )
            checked = len(pushes.records)
            highest = {p: o for p, o in sorted(seen)}
            complete = all(
                highest.get(p, -1) >= end or end < described.start_offsets[p]
                for p, end in enumerate(ends)
            )
            if (complete and set(gen.acked) <= set(seen)) or self.loop.time() > deadline:
                break
            await peer.arrival(deadline - self.loop.time())
        lost = sorted(set(gen.acked) - set(seen))
        if lost:
            shown = ", ".join(f"p{p}@{o}={gen.acked[(p, o)]!r}" for p, o in lost[:10])
            raise Violation(
                f"{where}: {len(lost)} of {len(gen.acked)} acknowledged records are missing: "
                f"{shown}; read {len(seen)} records, DESCRIBE next offsets "
                f"{described.next_offsets}, start offsets {described.start_offsets}"
            )
        twice = [
            v for v, n in Counter(v for _, v in seen.values() if v is not None).items() if n > 1
        ]
        if twice:
            raise Violation(f"{where}: records stored at two offsets: {twice[:5]}")
        highest = {p: o for p, o in sorted(seen)}
        if highest:
            ack = m.AckRequest(
                outcome.consumer_id,
                tuple(m.AckEntry(p, o) for p, o in sorted(highest.items())),
                m.AckKind.CUMULATIVE,
            )
            await self._call(self.check_conn, ack, "ack verify")
        await self._call(
            self.check_conn, m.UnsubscribeRequest(outcome.consumer_id), "unsubscribe verify"
        )

    # Connections

    async def _connect(self) -> None:
        self.peers = [
            await FuzzPeer.open(i, self.server.address, self.tokens[i])
            for i in range(self.connections)
        ]

    async def _disconnect(self) -> None:
        for peer in self.peers:
            with contextlib.suppress(Exception):
                await peer.close()
        self.peers = []


# CI mode replays one fixed exploration, so a red run always means a change broke something; the
# long run (`make fuzz`) explores new seeds; what a seed finds becomes a REPRODUCTIONS entry.
CI_SEED = 20261122


def _seed() -> int:
    chosen = os.environ.get("HEADWATER_FUZZ_SEED")
    if chosen:
        return int(chosen)
    return random.SystemRandom().randrange(2**32) if LONG else CI_SEED


@pytest.mark.timeout(0 if LONG else 600)
def test_state_machine() -> None:
    """Pipelined requests on 3 connections and restarts against a live server keep every promise."""
    value = _seed()
    print(f"reproduce: HEADWATER_FUZZ_SEED={value} HEADWATER_FUZZ={'long' if LONG else 'ci'}")
    run_state_machine_as_test(seed(value)(HeadwaterMachine), settings=SETTINGS)


@pytest.mark.parametrize("name", sorted(REPRODUCTIONS))
def test_reproduction(name: str) -> None:
    machine = HeadwaterMachine()
    try:
        for step in REPRODUCTIONS[name]:
            if isinstance(step, str):
                machine.restart(step)
            else:
                machine.pipeline(list(step))
    finally:
        machine.teardown()


@pytest.mark.timeout(0 if LONG else 600)
def test_state_machine_with_auth() -> None:
    """The same with authentication on: well-behaved principals and one hostile one, which is
    refused everything outside its grants (tests/support/fuzzauth.py)."""
    from tests.support.fuzzauth import AuthMachine

    value = _seed()
    print(f"reproduce: HEADWATER_FUZZ_SEED={value} HEADWATER_FUZZ={'long' if LONG else 'ci'}")
    run_state_machine_as_test(seed(value)(AuthMachine), settings=SETTINGS)
