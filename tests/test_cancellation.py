"""A cancellation that races the completion of what a task awaits under a timeout must still
cancel the task. Python 3.11's `asyncio.wait_for` returned the result instead: the cancelled
task ran on, and a stop that cancelled it and awaited it waited forever (a cluster broker's
keepalive loop, whose etcd calls run under a timeout, held a graceful stop past 60 s in CI).
The server's code uses `asyncio.timeout` (ruff bans `asyncio.wait_for` there: TID251); this
checks the etcd session, through which every coordinator loop calls."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from headwater.server.cluster.etcd import EtcdSession, PrefixWatch
from tests.support.s3 import free_port


async def test_an_etcd_call_cancelled_as_it_completes_is_cancelled() -> None:
    session = EtcdSession([("127.0.0.1", free_port())], call_timeout=5.0)
    try:
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(session.call(lambda client: answer))
        await asyncio.sleep(0)  # the call awaits the answer
        answer.set_result(1)  # etcd answers
        task.cancel()  # in the same turn, the stop cancels the loop making the call
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await session.close()


async def test_an_etcd_call_whose_inner_wait_for_swallows_the_cancellation_is_cancelled() -> None:
    """aetcd itself waits with `asyncio.wait_for` (creating a watch, connecting). A cancellation
    in the turn its wait completes is swallowed there; the session must still end the caller. A
    watch loop that ran on, blocked on its stream, held a cluster broker's stop until the
    test's 300 s timeout (test_second_broker_with_the_same_id_is_refused, 2026-11-26)."""
    session = EtcdSession([("127.0.0.1", free_port())], call_timeout=5.0)
    try:
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def like_aetcd(client: object) -> int:
            return await asyncio.wait_for(answer, 5)  # as aetcd waits

        task = asyncio.create_task(session.call(like_aetcd))
        await asyncio.sleep(0)  # the call awaits the answer inside wait_for
        answer.set_result(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await session.close()


async def test_a_watch_stop_that_is_cancelled_itself_ends() -> None:
    """A stop cancels its loop and waits for it; cancelled itself meanwhile (a shutdown's
    deadline), it must end. `suppress(CancelledError)` around the wait swallowed the stop's own
    cancellation along with the loop's, and a stop waiting on a stuck loop could not be bounded
    (found by a start/stop attack on the coordinator, 2026-11-26)."""
    session = EtcdSession([("127.0.0.1", free_port())], call_timeout=5.0)
    never = asyncio.Event()  # set at the end: the stuck loop ends

    async def stuck_loop() -> None:  # a loop that has lost its cancellation, as above
        while not never.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await never.wait()

    async def ignore(key: bytes, entry: object) -> None:
        pass

    watch = PrefixWatch(session, b"/x/", ignore)
    watch._task = asyncio.create_task(stuck_loop())
    try:
        stopping = asyncio.create_task(watch.stop())
        await asyncio.sleep(0)  # the stop has cancelled the loop and waits for it
        stopping.cancel()
        await asyncio.wait({stopping}, timeout=5)
        assert stopping.cancelled(), "the stop swallowed its own cancellation"
    finally:
        never.set()  # the stuck loop ends, and with it a stop that waited for it
        await asyncio.wait({watch._task, stopping})
        await session.close()
