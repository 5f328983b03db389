"""A cancellation that races the completion of what a task awaits under a timeout must still
cancel the task. Python 3.11's `asyncio.wait_for` returned the result instead: the cancelled
task ran on, and a stop that cancelled it and awaited it waited forever (a cluster broker's
keepalive loop, whose etcd calls run under a timeout, held a graceful stop past 60 s in CI).
The server's code uses `asyncio.timeout` (ruff bans `asyncio.wait_for` there: TID251); this
checks the etcd session, through which every coordinator loop calls."""

from __future__ import annotations

import asyncio

import pytest

from headwater.server.cluster.etcd import EtcdSession
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
