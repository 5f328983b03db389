"""A power cut, simulated on a real server, and a real full disk (a size-limited tmpfs).

Power loss: the server runs with `HEADWATER_TEST_FSYNC_JOURNAL`, so every completed segment fsync
records the length it covered. The test kills the server (SIGKILL) while producers stream and a
subscription acks, cuts every segment back to its last journaled length (what the disk would
hold after the power went), and restarts it as a new boot (`HEADWATER_TEST_BOOT_ID`). RocksDB is
not cut: its synced writes are durable by its own WAL, and this simulates the segments only.

Disk full: the topics directory is a tmpfs of a few MiB mounted by the test (we run as root; if
the mount fails the test fails and says why). A filler file takes the last free byte while
producers keep sending; space comes back; the server is killed and restarted, then stopped
gracefully and restarted.

Both check the promises: every acknowledged message is there, read back from `earliest`; no
offset is given to two messages; the subscription skips nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import headwater
from headwater.testing import ServerProcess
from headwater.wire.errors import StorageError
from tests.support.faults import (
    cut_to_last_fsync,
    fill,
    produce_each,
    read_from_earliest,
    small_tmpfs,
)
from tests.support.helpers import HANG


def values(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i:05d}-{'p' * 50}".encode() for i in range(count)]


async def test_power_loss_keeps_every_acked_message_and_no_subscription_skips(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "fsync-journal"
    env = {"HEADWATER_TEST_FSYNC_JOURNAL": str(journal), "HEADWATER_TEST_BOOT_ID": "boot-1"}
    server = ServerProcess(tmp_path / "data", env=env).start()
    acked: dict[int, bytes] = {}
    sub_acked: set[int] = set()
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic(
                "power", dispatch="reliable", configs={"fsync": "always", "segment.bytes": 65536}
            )
            consumer = await client.subscribe("power", "sub", start="earliest", prefetch=500)

            async def stream(name: str) -> None:
                producer = client.producer("power", linger=0.001)
                for start in range(0, 200_000, 100):
                    batch = values(f"{name}{start}", 100)
                    sent = [(await producer.send(v), v) for v in batch]
                    with contextlib.suppress(headwater.HeadwaterError):
                        await producer.flush()
                    for future, value in sent:
                        with contextlib.suppress(headwater.HeadwaterError):
                            metadata = await future
                            assert metadata.offset is not None
                            assert metadata.offset not in acked
                            acked[metadata.offset] = value

            async def consume() -> None:
                for _ in range(1_000_000):
                    message = await consumer.receive(timeout=30)
                    await message.ack()
                    sub_acked.add(message.offset)

            tasks = [asyncio.create_task(stream(f"p{i}-")) for i in range(4)]
            tasks.append(asyncio.create_task(consume()))
            deadline = asyncio.get_running_loop().time() + 60  # bounds a hang only
            while len(acked) < 5000 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            server.kill()  # the power goes
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        assert len(acked) >= 5000, "too few acks before the cut"
        cut = cut_to_last_fsync(server.data_dir, journal)
        server.env = {**env, "HEADWATER_TEST_BOOT_ID": "boot-2"}  # the machine rebooted
        server.start()
        async with await headwater.connect(server.address) as client:
            # the count stored is unknown (and offsets may have holes): read up to a marker
            marker, errors = await produce_each(client, "power", [b"end of the audit"])
            assert not errors
            stored = await read_from_earliest(client, "power", "audit", until=min(marker))
            missing = set(acked) - set(stored)
            assert not missing, f"{len(missing)} acknowledged messages lost"
            assert all(stored[o] == v for o, v in acked.items()), "an offset was reused"
            # the subscription: everything stored is either acked before the cut or comes now,
            # and new messages are not skipped
            consumer = await client.subscribe("power", "sub", prefetch=5000)
            new, errors = await produce_each(client, "power", values("after", 20))
            assert not errors and min(new) > max(acked)
            # in offset order from the cursor: once the last new message came, all before it did
            received: set[int] = set()
            for _ in range(len(stored) + len(new) + 1):  # each stored, the marker, each new once
                if set(new) <= received:
                    break
                received.add((await consumer.receive(timeout=HANG)).offset)
            assert set(new) <= received, "the new messages did not all come"
            skipped = (set(stored) | set(new)) - sub_acked - received
            assert not skipped, f"the subscription skipped {len(skipped)} messages"
        report = (
            f"acked={len(acked)} stored={len(stored)} cut_bytes={sum(cut.values())} "
            f"sub_acked={len(sub_acked)} redelivered={len(received - set(new))}"
        )
        print(f"\npower loss: {report}")
    finally:
        server.kill()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 12 MiB tmpfs, mounted for this test only."""
    mount_point = tmp_path / "data" / "topics"
    mount_point.mkdir(parents=True)
    with small_tmpfs(mount_point, "12m"):
        yield mount_point


@pytest.mark.parametrize("fsync", ["always", "interval"])
async def test_disk_full_on_a_real_filesystem(tmp_path: Path, small_disk: Path, fsync: str) -> None:
    config = tmp_path / "server.toml"
    config.write_text('[object_store]\nbackend = "none"\n')
    server = ServerProcess(tmp_path / "data", extra_args=("--config", str(config))).start()
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic("full", dispatch="reliable", configs={"fsync": fsync})
            acked, errors = await produce_each(client, "full", values("before", 200))
            assert not errors
            filler = await asyncio.to_thread(fill, small_disk)
            during, errors = await produce_each(client, "full", values("during", 100))
            acked.update(during)
            assert errors, "the disk was full and no produce failed"
            assert all(isinstance(e, StorageError) and e.retriable for e in errors), errors
            refused = len(errors)
            os.unlink(filler)
            after, errors = await produce_each(client, "full", values("after", 300))
            assert not errors
            acked.update(after)
            assert await read_from_earliest(client, "full", "live", len(acked)) == acked
        server.kill()
        server.start()
        async with await headwater.connect(server.address) as client:
            assert await read_from_earliest(client, "full", "after-kill", len(acked)) == acked
            new, errors = await produce_each(client, "full", values("new", 20))
            assert not errors and min(new) > max(acked)
            acked.update(new)
        assert server.stop() == 0
        server.start()
        async with await headwater.connect(server.address) as client:
            assert await read_from_earliest(client, "full", "after-stop", len(acked)) == acked
        print(f"\ndisk full ({fsync}): acked={len(acked)} refused={refused}")
    finally:
        server.kill()


async def test_map_state_survives_a_reboot_gap_at_the_end_of_the_log(tmp_path: Path) -> None:
    """After a reboot the log continues above its offset lease, leaving a gap at its end. The
    last-value state built over it at start must step over the gap (it once waited for offsets
    that will never exist, and the map stayed unreadable)."""
    env = {"HEADWATER_TEST_BOOT_ID": "boot-1"}
    server = ServerProcess(tmp_path / "data", env=env).start()
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic(
                "prices", dispatch="reliable", configs={"last.value": "true", "fsync": "always"}
            )
            prices = client.map("prices")
            for i in range(10):
                await prices.set(f"k{i}".encode(), f"v{i}".encode())
        server.kill()
        server.env = {"HEADWATER_TEST_BOOT_ID": "boot-2"}  # the machine rebooted
        server.start()
        async with await headwater.connect(server.address) as client:
            prices = client.map("prices")
            assert await prices.size() == 10
            found = await prices.get(b"k3")
            assert found is not None and found.value == b"v3"
            await prices.set(b"k3", b"after")
            found = await prices.get(b"k3")
            assert found is not None and found.value == b"after"
        assert "last_value.rebuild_failed" not in server.log()
    finally:
        server.kill()


async def test_a_failed_fsync_refuses_the_produce_waiting_for_it(tmp_path: Path) -> None:
    """An fsync that fails after the data reached the file: the produce waiting for it (answered
    from the fsync's callback, not a task) is refused PARTITION_OFFLINE, never acknowledged, and
    the partition stays offline. The power-loss seam records each completed fsync in its journal;
    with the journal's directory gone, recording it fails, and the fsync with it."""
    journal = tmp_path / "journal"
    journal.mkdir()
    env = {"HEADWATER_TEST_FSYNC_JOURNAL": str(journal / "fsyncs")}
    server = ServerProcess(tmp_path / "data", env=env).start()
    try:
        async with await headwater.connect(server.address) as client:
            await client.create_topic("failing", dispatch="reliable", configs={"fsync": "always"})
            acked, errors = await produce_each(client, "failing", [b"before"])
            assert list(acked.values()) == [b"before"] and not errors
            shutil.rmtree(journal)
            acked, errors = await produce_each(
                client, "failing", [b"after-%d" % i for i in range(5)]
            )
            assert not acked, "a produce whose fsync failed was acknowledged"
            assert [e.code for e in errors] == [headwater.ErrorCode.PARTITION_OFFLINE] * 5
            assert "fsync failed" in errors[0].message
    finally:
        server.stop()
    assert "wal.partition_failed" in server.log_path.read_text()
