"""No acknowledged offset is ever given to another message after kill -9, whatever the tail holds.

A kill -9 leaves the active segment as the page cache had it; a disk or an operator may then
shorten it. Recovery must not guess from what is left which offsets were handed out: after any
unclean stop appends continue at or above the offset lease (docs/DURABILITY.md). The storage-level
test tries every cut length, from one byte to the whole last batch, and cuts inside the batch
before it, on real segment files; the end-to-end test does the same once through a real server
process, on a plain topic and on a map (last-value) topic, where an offset is also a revision.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

import headwater
from headwater.storage.fileio import BOOT_ID_ENV
from headwater.storage.segments import segment_name
from headwater.storage.wal import FsyncPolicy, LogConfig, PartitionLog
from headwater.testing import ServerProcess
from headwater.wire.records import BATCH_HEADER_SIZE, build_batch, read_records
from tests.support.faults import batches, produce_each, segments

_BATCHES = 40
_LAST_BATCH = 73  # the size the server log showed


def batch(value: bytes) -> bytes:
    return build_batch([(None, value, [])])


def _values() -> list[bytes]:
    """Batches of varied sizes, the last one exactly `_LAST_BATCH` bytes long."""
    values = [f"m-{i:03d}-{'x' * (i * 7 % 50)}".encode() for i in range(_BATCHES - 1)]
    last = b""
    while len(batch(last)) < _LAST_BATCH:
        last += b"z"
    assert len(batch(last)) == _LAST_BATCH
    return [*values, last]


def _cuts() -> list[int]:
    last = _LAST_BATCH
    before = len(batch(_values()[-2]))
    return [*range(1, last + 1), last + 1, last + before // 2, last + before - 1]


def _kill(log: PartitionLog) -> None:
    """What kill -9 leaves: the syncer stops, nothing is closed cleanly, the lease stays as is."""
    log.syncer.halt()
    for segment in log._segments:
        if segment.write_fd is not None:
            os.close(segment.write_fd)
            segment.write_fd = None


async def _read_all(log: PartitionLog) -> dict[int, bytes | None]:
    found: dict[int, bytes | None] = {}
    offset = log.start_offset
    while offset < log.next_offset:
        read = await log.read(offset)
        if not read:
            break
        for data in read:
            for record in read_records(data):
                assert record.offset not in found, f"offset {record.offset} stored twice"
                found[record.offset] = record.value
                offset = record.offset + 1
    return found


@pytest.mark.parametrize("cut", _cuts())
async def test_no_acked_offset_is_given_again_after_kill_and_a_cut_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: int
) -> None:
    monkeypatch.setenv(BOOT_ID_ENV, "one-boot")  # the restart is on the same boot
    log = PartitionLog.open(tmp_path, LogConfig(fsync=FsyncPolicy.INTERVAL))
    log.start()
    acked: dict[int, bytes] = {}
    for value in _values():
        base, _ = log.append(batch(value), 1)
        acked[base] = value
    await asyncio.sleep(0)
    _kill(log)
    path = tmp_path / segment_name(0)
    size = path.stat().st_size
    with path.open("r+b") as file:
        file.truncate(size - cut)

    reopened = PartitionLog.open(tmp_path, LogConfig(fsync=FsyncPolicy.INTERVAL))
    reopened.start()
    try:
        new = {
            reopened.append(batch(f"new-{i}".encode()), 1)[0]: f"new-{i}".encode() for i in range(5)
        }
        reused = set(new) & set(acked)
        assert not reused, f"cut {cut}: acked offsets {sorted(reused)} given to new messages"
        stored = await _read_all(reopened)
        for offset, value in stored.items():
            assert value == acked.get(offset, new.get(offset)), f"offset {offset} changed hands"
        assert set(new) <= set(stored)
        # and a second kill -9 right after, with nothing cut: still nothing given twice
        await asyncio.sleep(0)
        _kill(reopened)
        again = PartitionLog.open(tmp_path, LogConfig(fsync=FsyncPolicy.INTERVAL))
        try:
            newer = again.append(batch(b"newer"), 1)[0]
            assert newer not in acked and newer not in new
        finally:
            await again.close()
    finally:
        await reopened.close()
        await log.close()


def _no_object_store(tmp_path: Path) -> ServerProcess:
    config = tmp_path / "no-store.toml"
    config.write_text('[object_store]\nbackend = "none"\n')
    return ServerProcess(tmp_path / "data", extra_args=("--config", str(config)))


_CUTS = ["5 bytes", "below a header", "the whole last batch", "into the batch before"]


def _cut(path: Path, how: str) -> None:
    """Shorten the active segment: the header left whole, fewer bytes than a header left of the
    last batch (the issue's case), the last batch gone, or a cut inside the batch before."""
    found = batches(path)
    last = found[-1]
    end = {
        "5 bytes": last.position + last.size - 5,
        "below a header": last.position + min(BATCH_HEADER_SIZE - 1, last.size // 3),
        "the whole last batch": last.position,
        "into the batch before": found[-2].position + found[-2].size // 2,
    }[how]
    with path.open("r+b") as file:
        file.truncate(end)


@pytest.mark.parametrize("how", _CUTS)
async def test_kill_and_a_cut_tail_reuse_no_offset_or_revision(tmp_path: Path, how: str) -> None:
    server = _no_object_store(tmp_path).start()
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic("plain", dispatch="reliable", configs={"fsync": "never"})
            await client.create_topic("kv", dispatch="reliable", configs={"fsync": "never"})
            acked, errors = await produce_each(
                client, "plain", [f"m-{i}".encode() for i in range(500)]
            )
            assert not errors and sorted(acked) == list(range(500))
            kv = client.map("kv")
            revisions = {f"k{i}": await kv.set(f"k{i}", f"v{i}") for i in range(300)}
            assert sorted(revisions.values()) == list(range(300))
        server.kill()
        _cut(segments(server, "plain")[-1], how)
        _cut(segments(server, "kv")[-1], how)
        server.start()
        async with await headwater.connect(server.address) as client:
            new, errors = await produce_each(client, "plain", [b"after-0", b"after-1"])
            assert not errors and min(new) >= 500, f"acked offsets given again: {sorted(new)}"
            kv = client.map("kv")
            fresh = await kv.set("fresh", "value")
            assert fresh >= 300, f"revision {fresh} of k{fresh} given to another key"
            for name, revision in revisions.items():
                found = await kv.get(name)
                # a record that was cut: the map (RocksDB) still holds it at its own revision
                assert found is not None and found.revision == revision
    finally:
        server.kill()
