"""Helpers for the storage-fault tests: produce one message per batch and keep what was acked,
read a topic from its first offset, damage segment files, simulate a power cut, and mount a small
disk that fills."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import headwater
from headwater.storage.segments import BatchLocation, scan_segment
from headwater.testing import ServerProcess
from headwater.wire.errors import HeadwaterError
from tests.support.helpers import drain, drain_until


async def produce_each(
    client: headwater.Client, topic: str, values: list[bytes]
) -> tuple[dict[int, bytes], list[HeadwaterError]]:
    """Send each value as its own batch, without retries: (acked offset -> value, errors)."""
    producer = client.producer(
        topic, delivery=headwater.AtLeastOnce(headwater.RetryPolicy(max_retries=0))
    )
    acked: dict[int, bytes] = {}
    errors: list[HeadwaterError] = []
    for value in values:
        try:
            metadata = await asyncio.wait_for(await producer.send(value), 30)
        except HeadwaterError as exc:
            errors.append(exc)
            continue
        assert metadata.offset is not None
        assert metadata.offset not in acked, f"offset {metadata.offset} acked twice"
        acked[metadata.offset] = value
    with contextlib.suppress(HeadwaterError):  # errors were collected above
        await producer.close()
    return acked, errors


async def read_from_earliest(
    client: headwater.Client,
    topic: str,
    subscription: str,
    count: int | None = None,
    until: int | None = None,
) -> dict[int, bytes]:
    """What a new subscription from `earliest` receives (offset -> value), acked: `count`
    messages (failing if one more is already at hand), or, in a one-partition topic whose count
    is unknown, those before offset `until` (an end marker the caller produced, left out)."""
    consumer = await client.subscribe(topic, subscription, start="earliest", prefetch=5000)
    if count is not None:
        messages = await drain(consumer, count)
    else:
        assert until is not None, "read_from_earliest needs a count or an end marker"
        messages = await drain_until(consumer, lambda got: bool(got) and got[-1].offset >= until)
        assert messages.pop().offset == until
    received: dict[int, bytes] = {}
    for message in messages:
        assert message.value is not None
        assert message.offset not in received, f"offset {message.offset} delivered twice"
        received[message.offset] = message.value
        await message.ack()
    await consumer.close()
    return received


def partition_dir(server: ServerProcess, topic: str, partition: int = 0) -> Path:
    return server.data_dir / "topics" / topic / str(partition)


def segments(server: ServerProcess, topic: str) -> list[Path]:
    return sorted(partition_dir(server, topic).glob("*.log"))


def batches(path: Path) -> list[BatchLocation]:
    scan = scan_segment(path)
    assert scan.problem is None, scan.problem
    return scan.batches


def flip(path: Path, position: int, count: int = 4) -> None:
    data = bytearray(path.read_bytes())
    for i in range(position, position + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def cut_to_last_fsync(data_dir: Path, journal: Path) -> dict[str, int]:
    """What a power cut leaves after the server was killed: every segment file back to the length
    its last completed fsync covered (empty if none did). Returns the bytes cut per file."""
    covered: dict[str, int] = {}
    if journal.exists():
        for line in journal.read_text().splitlines():
            name, length = line.rsplit("\t", 1)
            covered[name] = int(length)
    cut: dict[str, int] = {}
    for path in sorted((data_dir / "topics").rglob("*.log")):
        size = path.stat().st_size
        keep = min(size, covered.get(str(path), 0))
        if keep < size:
            with path.open("r+b") as file:
                file.truncate(keep)
            cut[str(path)] = size - keep
    return cut


@contextlib.contextmanager
def small_tmpfs(mount_point: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's syntax: "12m") mounted at `mount_point` for the block: a disk
    that fills. Fails the test, saying why, where mounting is not allowed."""
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(
            "a disk-full test needs to mount a tmpfs (run the tests as root, or in a container "
            f"allowed to mount): mount said {result.stderr.strip()!r}"
        )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(directory: Path) -> Path:
    """Take every free byte of `directory`'s file system with one file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (1 << 20, 1 << 16, 1 << 12, 1 << 8, 1):
            for _ in range(100_000):
                try:
                    os.write(fd, b"\0" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    return filler
