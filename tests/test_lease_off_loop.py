"""Issue 37: the offset lease is never written on the event loop, and still covers every offset
before it is handed out (so a crash never gives an offset to two messages).

An append the lease does not cover (a batch of more records than the lease has room for) waits
for the partition's syncer to extend it in its pool, and the partition's later appends queue
behind it, in order. Checked as units on a real `PartitionLog` (the thread each lease write runs
on is noted), and through a real server's produce path.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from headwater.server.reply import AfterWork, resolve
from headwater.server.topics.topic import LogPartition, LogTopic
from headwater.storage import offsets
from headwater.storage.offsets import MIN_LEASE_BLOCK, read_lease
from headwater.storage.wal import LogConfig, PartitionLog
from headwater.wire import messages as m
from headwater.wire.errors import StorageError
from headwater.wire.records import build_batch

MANY = 3 * MIN_LEASE_BLOCK  # records in one batch: more than a fresh lease covers


@pytest.fixture
def lease_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The name of the thread each lease write runs on."""
    names: list[str] = []
    write = offsets.write_lease

    def noted(directory: Path, reserved: int, clean: bool) -> None:
        names.append(threading.current_thread().name)
        write(directory, reserved, clean)

    monkeypatch.setattr(offsets, "write_lease", noted)
    yield names


def _batch(count: int) -> bytes:
    return build_batch([(None, b"", ())] * count)


async def test_an_append_the_lease_does_not_cover_waits_for_it_off_the_loop(
    tmp_path: Path, lease_threads: list[str]
) -> None:
    log = PartitionLog.open(tmp_path, LogConfig())
    log.start()
    partition = LogPartition(0, log)
    lease_threads.clear()  # the open's own, in the caller's thread
    seen: list[tuple[int, int]] = []  # (lease on disk, next offset) as each append ran

    def append(count: int) -> m.Response:
        seen.append((log.lease_end, log.next_offset + count))
        base, _ = log.append(_batch(count), count)
        return m.ProduceResponse(0, base)

    big = LogTopic.when_leased([(partition, MANY)], lambda: append(MANY))
    assert isinstance(big, AfterWork)  # it waits: nothing appended, no lease written yet
    assert log.next_offset == 0 and lease_threads == []
    # a small append after it would fit the lease, but queues behind it: order is kept
    small = LogTopic.when_leased([(partition, 1)], lambda: append(1))
    assert isinstance(small, AfterWork)
    first, second = await resolve(big), await resolve(small)
    assert isinstance(first, m.ProduceResponse) and isinstance(second, m.ProduceResponse)
    assert (first.base_offset, second.base_offset) == (0, MANY)
    assert all(lease >= end for lease, end in seen)  # covered before each append ran
    assert lease_threads and threading.main_thread().name not in lease_threads
    assert log.lease_in_line == 0
    assert read_lease(tmp_path) is not None
    assert read_lease(tmp_path).reserved >= MANY + 1  # type: ignore[union-attr]
    # now covered, nothing waits: at once
    assert isinstance(LogTopic.when_leased([(partition, 1)], lambda: append(1)), m.ProduceResponse)
    await log.close()


async def test_a_lease_that_cannot_be_written_refuses_the_waiting_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = PartitionLog.open(tmp_path, LogConfig())
    log.start()
    partition = LogPartition(0, log)

    def fails(directory: Path, reserved: int, clean: bool) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(offsets, "write_lease", fails)
    waiting = LogTopic.when_leased([(partition, MANY)], lambda: m.ProduceResponse(0, 0))
    assert isinstance(waiting, AfterWork)
    with pytest.raises(StorageError, match="offset lease"):
        await resolve(waiting)
    assert log.next_offset == 0  # nothing appended: no offset handed out past the lease
    assert partition.lease_line is None  # the line is free for the retry
    monkeypatch.undo()
    await log.close()
