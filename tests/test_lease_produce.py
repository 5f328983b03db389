"""Issue 37: a produce the offset lease does not cover is answered with no lease write on the event
loop (the syncer extends the lease in its pool while the produce waits), over real TCP to a real
server; the lease on disk covers every offset handed out. The units are in
tests/test_lease_off_loop.py.
"""

from __future__ import annotations

import threading
from pathlib import Path

import headwater
from headwater.server.config import ServerConfig
from headwater.storage.offsets import read_lease
from headwater.wire import messages as m
from tests.support.in_process import in_process_server
from tests.support.rawwire import RawPeer
from tests.test_lease_off_loop import MANY, _batch, lease_threads

__all__ = ["lease_threads"]  # the fixture, shared with the units


async def test_a_produce_past_the_lease_is_answered_without_a_lease_write_on_the_loop(
    tmp_path: Path, lease_threads: list[str]
) -> None:
    async with in_process_server(ServerConfig(data_dir=tmp_path / "data")) as server:
        async with await headwater.connect(server.address) as admin:
            await admin.create_topic("t")  # reliable
        lease_threads.clear()
        peer = await RawPeer.open(server.address)
        loop_thread = threading.current_thread().name
        for round_ in range(3):  # each batch outruns the lease the one before left
            answer = await peer.call(m.ProduceRequest("t", 0, _batch(MANY)))
            assert isinstance(answer, m.ProduceResponse), answer
            assert answer.base_offset == round_ * MANY
        assert lease_threads and loop_thread not in lease_threads
        log = server.catalog.topics["t"].partitions[0].log  # type: ignore[union-attr]
        assert log.lease_in_line == 0
        lease = read_lease(log.directory)
        assert lease is not None and lease.reserved >= 3 * MANY
        await peer.close()
