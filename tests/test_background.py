"""Issue 37's background bounds, as units: a turn taken for a coroutine that is closed or dropped
before it gets its turn is given up (else its topic's line holds forever), and a fire-and-forget
task's failure is logged under its own event when it happens.
"""

from __future__ import annotations

import asyncio
import gc
import warnings

import structlog

from headwater.server.topic_turns import NameLocks, Turn
from headwater.storage.tasks import spawn


async def _in_turn(turn: Turn, ran: list[str]) -> None:
    async with turn:
        ran.append("in turn")


async def test_a_turn_whose_coroutine_is_closed_before_it_runs_is_given_up() -> None:
    locks = NameLocks()
    ran: list[str] = []
    work = _in_turn(locks.turn("t"), ran)
    behind = locks.turn("t")  # queued behind the first
    work.close()  # never started: its `async with` never runs
    del work
    await asyncio.wait_for(_in_turn(behind, ran), 10)  # a hang bound, not a timing
    assert ran == ["in turn"]
    await locks.idle()
    assert not locks.busy("t")


async def test_a_turn_whose_coroutine_is_dropped_unawaited_is_given_up() -> None:
    locks = NameLocks()
    ran: list[str] = []
    with warnings.catch_warnings():
        # "never awaited" is the point; a recorded warning would keep the coroutine alive
        warnings.simplefilter("ignore", RuntimeWarning)
        dropped = [_in_turn(locks.turn("t"), ran)]  # as a handler's AfterWork nobody awaited
        dropped.clear()
        gc.collect()
    await asyncio.wait_for(_in_turn(locks.turn("t"), ran), 10)
    assert ran == ["in turn"]
    await locks.idle()
    assert not locks.busy("t")


async def test_a_released_turn_is_not_given_up_again_when_collected() -> None:
    locks = NameLocks()
    ran: list[str] = []
    first = locks.turn("t")
    await _in_turn(first, ran)
    second = locks.turn("t")  # now first in its line
    third = locks.turn("t")
    del first
    gc.collect()
    await asyncio.sleep(0)  # let a wrongly queued release run, if there were one
    assert locks.busy("t")
    await _in_turn(second, ran)
    await _in_turn(third, ran)
    assert ran == ["in turn"] * 3


async def test_a_spawned_task_s_failure_is_logged_under_its_event() -> None:
    owner: set[asyncio.Task[object]] = set()

    async def fails() -> None:
        raise RuntimeError("boom")

    with structlog.testing.capture_logs() as logs:
        task = spawn(fails(), "test.background_failed", owner, topic="t")
        assert owner == {task}
        await asyncio.wait([task])
    assert not owner  # the reference went with the task
    failures = [e for e in logs if e["event"] == "test.background_failed"]
    assert len(failures) == 1
    assert failures[0]["topic"] == "t" and "boom" in failures[0]["error"]


async def test_a_cancelled_or_successful_spawned_task_logs_nothing() -> None:
    started = asyncio.Event()

    async def waits() -> None:
        started.set()
        await asyncio.Event().wait()

    async def ends() -> None:
        return None

    with structlog.testing.capture_logs() as logs:
        cancelled = spawn(waits(), "test.background_failed")
        ended = spawn(ends(), "test.background_failed")
        await started.wait()
        cancelled.cancel()
        await asyncio.wait([cancelled, ended])
    assert [e for e in logs if e["event"] == "test.background_failed"] == []
