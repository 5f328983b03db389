"""The connection core both front ends run on (server/net/connection_core.py), without sockets:
events in, decisions out, time passed as an argument."""

from __future__ import annotations

import ast
from pathlib import Path

import headwater.server.requests.broker  # noqa: F401  (declares the requests: REQUESTS)
from headwater.server.memory_budget import MemoryBudget
from headwater.server.net.connection_core import (
    INLINE_INFLATE,
    INLINE_RECORDS,
    ConnectionCore,
    Hold,
    State,
    Verdict,
    Work,
)
from headwater.server.security.pre_auth import BEFORE_AUTH_KEYS
from headwater.wire import messages as m
from headwater.wire.compression import Compression
from headwater.wire.limits import MAX_PRE_AUTH_FRAME, MAX_WAITING_REQUESTS
from headwater.wire.records import BatchBuilder

MAX_FRAME = 1 << 20


def native(memory: MemoryBudget | None = None, authenticating: bool = True) -> ConnectionCore:
    return ConnectionCore(
        memory or MemoryBudget(1 << 30),
        max_frame_size=MAX_FRAME,
        authenticating=authenticating,
        before_auth=BEFORE_AUTH_KEYS,
        max_decompressed=64 << 20,
    )


def kafka(memory: MemoryBudget | None = None, authenticating: bool = True) -> ConnectionCore:
    return ConnectionCore(
        memory or MemoryBudget(1 << 30),
        max_frame_size=MAX_FRAME,
        authenticating=authenticating,
        before_auth=frozenset({18, 17, 36}),
        ordered=True,
        oversize_closes=True,
        min_frame=10,
        inline_elements=1024,
    )


def test_the_core_does_no_io() -> None:
    source = Path(__file__).parent.parent / "headwater/server/net/connection_core.py"
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"asyncio", "socket", "selectors", "ssl", "time", "structlog"}


# framing and pre-auth


def test_before_authentication_frames_are_capped_and_only_some_keys_handled() -> None:
    core = native()
    assert core.state is State.AWAITING_AUTH
    assert core.frame_limit == MAX_PRE_AUTH_FRAME
    assert core.frame_verdict(MAX_PRE_AUTH_FRAME) is Verdict.ACCEPT
    assert core.frame_verdict(MAX_PRE_AUTH_FRAME + 1) is Verdict.CLOSE  # its body never read
    assert core.admits(m.ApiKey.API_VERSIONS)
    assert core.admits(m.ApiKey.AUTHENTICATE)
    assert not core.admits(m.ApiKey.PRODUCE)
    assert not core.admits(m.ApiKey.CREATE_TOPIC)

    core.authenticated("alice")
    assert core.state is State.OPEN
    assert core.principal == "alice"
    assert core.frame_limit == MAX_FRAME
    assert core.admits(m.ApiKey.PRODUCE)
    assert core.frame_verdict(MAX_PRE_AUTH_FRAME + 1) is Verdict.ACCEPT


def test_the_native_port_skips_a_frame_over_the_limit_once_authenticated() -> None:
    core = native(authenticating=False)
    assert core.state is State.OPEN
    assert core.frame_limit == MAX_FRAME
    assert core.frame_verdict(MAX_FRAME + 1) is Verdict.SKIP
    assert core.refused_limit(MAX_FRAME + 1) == (MAX_FRAME, False)
    # read under the pre-auth cap before a pipelined AUTHENTICATE succeeded
    assert core.refused_limit(MAX_PRE_AUTH_FRAME + 1) == (MAX_PRE_AUTH_FRAME, True)


def test_the_kafka_port_closes_for_a_frame_out_of_bounds() -> None:
    core = kafka()
    assert core.frame_verdict(9) is Verdict.CLOSE
    assert core.frame_verdict(MAX_PRE_AUTH_FRAME + 1) is Verdict.CLOSE
    assert not core.admits(0)  # Produce before SaslAuthenticate
    assert core.admits(18)
    core.authenticated("bob")
    assert core.frame_verdict(MAX_PRE_AUTH_FRAME + 1) is Verdict.ACCEPT
    assert core.frame_verdict(MAX_FRAME + 1) is Verdict.CLOSE
    assert core.frame_verdict(9) is Verdict.CLOSE


def test_a_closed_connection_stays_closed() -> None:
    core = native()
    core.close()
    core.authenticated("alice")
    assert core.state is State.CLOSED
    assert core.next_reading() is False  # nothing more is read


# reading: the named holds


def test_reading_follows_the_holds() -> None:
    core = native(authenticating=False)
    assert core.reading and core.hold == Hold(0)
    assert core.next_reading() is None

    core.pause_writing()
    assert core.hold == Hold.WRITE_PAUSED
    assert not core.may_handle()
    assert core.next_reading() is False
    assert core.next_reading() is None  # told once
    core.resume_writing()
    assert core.next_reading() is True

    # a read's frames queued: handled, not read
    assert core.next_reading(backlog=True) is False
    assert core.hold == Hold.BACKLOG
    assert core.may_handle() and not core.wants_reading()
    assert core.next_reading(backlog=False) is True

    core.begin_off_loop()
    assert core.hold == Hold.OFF_LOOP
    assert not core.may_handle()
    core.end_off_loop()
    assert core.may_handle()


# requests waiting, and answers in order


def test_at_most_max_waiting_requests_wait_and_their_bytes_are_charged() -> None:
    memory = MemoryBudget(1 << 30)
    core = native(memory, authenticating=False)
    principals = [core.wait_started(100) for _ in range(MAX_WAITING_REQUESTS - 1)]
    assert core.may_handle()
    principals.append(core.wait_started(100))
    assert core.waiting == MAX_WAITING_REQUESTS
    assert core.hold == Hold.WAITING_CAP
    assert not core.may_handle()
    assert core.next_reading() is False
    assert memory.used == 100 * MAX_WAITING_REQUESTS
    assert core.wait_ended(100, principals.pop()) is True  # off the cap: read again
    assert core.wait_ended(100, principals.pop()) is False
    assert core.next_reading() is True
    for principal in principals:
        core.wait_ended(100, principal)
    assert memory.used == 0 and core.waiting == 0


def test_ordered_answers_go_out_in_request_order() -> None:
    core = kafka(authenticating=False)
    first, second, third = core.open_slot(), core.open_slot(), core.open_slot()
    assert core.waiting == 3
    core.fill(third, b"three")
    core.fill(second, b"two")
    assert core.ready == 8
    assert core.take_ready() == ([], False)  # the head is not answered
    core.fill(first, b"one")
    core.fill(first, b"again")  # a slot is answered once
    assert core.take_ready() == ([b"one", b"two", b"three"], False)
    assert core.ready == 0 and core.waiting == 0


def test_an_answer_without_bytes_holds_its_place_and_a_closing_one_ends_the_line() -> None:
    core = kafka(authenticating=False)
    first, second, third = core.open_slot(), core.open_slot(), core.open_slot()
    core.fill(first, None)  # a request without an answer (acks=0)
    core.fill(second, None, closes=True)  # a failed authentication
    core.fill(third, b"late")
    assert core.take_ready() == ([], True)  # nothing after it


def test_every_request_in_progress_counts_on_the_ordered_port() -> None:
    core = kafka(authenticating=False)
    slots = [core.open_slot() for _ in range(MAX_WAITING_REQUESTS)]
    assert core.hold == Hold.WAITING_CAP and not core.may_handle()
    core.fill(slots[1], b"x")
    assert core.take_ready() == ([], False)
    assert not core.may_handle()  # the head still waits
    core.fill(slots[0], b"y")
    assert core.take_ready() == ([b"y", b"x"], False)
    assert core.may_handle()


def test_closing_drops_the_line_and_gives_back_the_charge() -> None:
    memory = MemoryBudget(1 << 30)
    core = kafka(memory, authenticating=False)
    first, second = core.open_slot(), core.open_slot()
    core.fill(second, b"x" * 10)
    core.account(100)
    assert memory.used == 110
    core.close()
    assert memory.used == 0 and core.waiting == 0 and core.ready == 0
    core.fill(first, b"after")  # a handler finishing after the close
    assert core.ready == 0
    core.account(100)
    assert memory.used == 0


# memory


def test_the_charge_replaces_the_last_one_and_goes_to_the_principal() -> None:
    memory = MemoryBudget(1000, 100)
    core = native(memory)
    core.account(50)
    assert memory.by_principal == {"": 50}
    core.authenticated("alice")
    core.account(60)
    assert memory.by_principal == {"alice": 60}
    assert memory.used == 60
    assert not core.memory_held()
    core.account(150)  # over alice's share of 100
    assert core.memory_held()
    assert core.hold == Hold.MEMORY
    assert core.next_reading() is False
    assert not core.deliverable()
    assert core.take_skipped() and not core.take_skipped()
    core.account(0)  # its client took its output
    assert not core.memory_held()
    assert core.hold == Hold(0)
    assert core.next_reading() is True


def test_a_connection_holding_nothing_is_read_whatever_its_principal_holds() -> None:
    memory = MemoryBudget(1000, 100)
    core = native(memory)
    core.authenticated("alice")
    memory.charge(500, "alice")  # another connection of alice's
    assert core.may_handle()
    core.wait_started(10)  # a request waits holding its frame
    assert not core.may_handle()


def test_answers_ready_behind_the_head_are_charged() -> None:
    memory = MemoryBudget(1000, 100)
    core = kafka(memory)
    core.authenticated("bob")
    core.open_slot()
    core.fill(core.open_slot(), b"x" * 200)
    core.account(0)
    assert memory.by_principal == {"bob": 200}
    assert core.memory_held() and not core.may_handle()


# off the loop


class Schemas:
    def __init__(self, cheap: bool) -> None:
        self.cheap = cheap

    def checks_cheaply(self, batch: bytes) -> bool:
        return self.cheap


def batch(records: int, compression: Compression = Compression.NONE) -> bytes:
    builder = BatchBuilder(compression=compression)
    for _ in range(records):
        builder.append(None, b"v" * 10)
    return builder.build()


def test_what_runs_off_the_loop() -> None:
    core = native(authenticating=False)
    small, many = batch(3), batch(INLINE_RECORDS + 1)
    assert core.batch_work(small, None) is Work.ON_LOOP
    assert core.batch_work(small, Schemas(cheap=True)) is Work.ON_LOOP
    assert core.batch_work(small, Schemas(cheap=False)) is Work.SCHEMA_OFF_LOOP
    assert core.batch_work(many, None) is Work.OFF_LOOP
    assert core.batch_work(batch(3, Compression.GZIP), None) is Work.BOUNDED
    assert core.batch_work(batch(INLINE_RECORDS + 1, Compression.GZIP), None) is Work.OFF_LOOP
    assert core.inline_inflate == INLINE_INFLATE
    assert core.inflates_off_loop()
    capped = ConnectionCore(
        MemoryBudget(1 << 30),
        max_frame_size=MAX_FRAME,
        authenticating=False,
        before_auth=(),
        max_decompressed=INLINE_INFLATE // 2,
    )
    assert capped.inline_inflate == INLINE_INFLATE // 2
    assert not capped.inflates_off_loop()  # too large is refused, not sent to the thread

    kafka_core = kafka()
    assert kafka_core.inline_elements == 1024
    assert not kafka_core.answer_off_loop(1024)
    assert kafka_core.answer_off_loop(1025)


# quotas


def test_a_muted_connection_is_not_read_until_its_time_and_its_debt_is_paid() -> None:
    core = native(authenticating=False)
    assert core.mute(105.0) is True
    assert core.hold == Hold.MUTED and core.muted_until == 105.0
    assert core.next_reading() is False
    assert core.mute(107.0) is False  # a mute in force stays as it is
    assert core.muted_until == 105.0
    assert core.unmute(105.0, debt=2.0) is False  # the debt grew meanwhile
    assert core.muted_until == 107.0 and core.hold == Hold.MUTED
    assert core.unmute(107.0) is True
    assert core.next_reading() is True


def test_consume_debt_stops_deliveries_not_reading() -> None:
    core = native(authenticating=False)
    assert core.deliverable()
    assert core.mute_deliveries(110.0)
    assert not core.mute_deliveries(120.0)
    assert core.deliveries_until == 110.0
    assert not core.deliverable()
    assert core.may_handle() and core.next_reading() is None
    core.unmute_deliveries()
    assert core.deliverable()


# write back-pressure


def test_write_back_pressure_stops_reading_and_deliveries() -> None:
    core = native(authenticating=False)
    core.pause_writing()
    assert not core.deliverable()
    assert not core.take_skipped()  # not for memory: nothing for the sweep to drain
    assert core.next_reading() is False
    core.resume_writing()
    assert core.deliverable()
    assert core.next_reading() is True
