"""The offset lease: a durable upper bound on every offset a partition has handed out.

An offset must never be given to two messages, even when a crash or a power cut takes away
records that someone already saw (an acked produce under `fsync=interval`, a record read from the
page cache, an idempotent producer's saved sequence). So before the WAL hands out an offset it
makes sure a file `next_offset` beside the segments durably says "offsets below R may be in use"
with R above it: a lease, extended a block at a time (written to a temporary file, fsynced,
renamed, directory fsynced). Extending ahead of need is the syncer's job, in a worker thread; an
append only extends in line if a burst outran it.

The file also records whether the server closed the log cleanly (and the kernel's boot id, for
diagnosis):

- clean close: R is exactly the next offset (no gap after a graceful restart);
- any other stop (kill -9, power loss, OS crash): appends continue at R. A gap of up to one block
  is the price; recovery does not try to tell from a damaged tail which of its offsets were
  handed out (a tail cut below a whole batch header says nothing about them).

The file is 8-byte magic, 8-byte R, 1-byte clean flag, 36-byte boot id, 4-byte CRC-32C. A missing
or damaged file gives no bound (a log written before leases existed): recovery then uses the data.
"""

from __future__ import annotations

import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import crc32c

from headwater.storage.fileio import boot_id, write_file_durably

LEASE_FILE: Final = "next_offset"
_MAGIC: Final = b"HWLEASE1"
_BODY = struct.Struct(">8sqB36s")
MIN_LEASE_BLOCK: Final = 4096
MAX_LEASE_BLOCK: Final = 1 << 16


@dataclass(frozen=True, slots=True)
class Lease:
    reserved: int  # no offset at or above this was ever handed out
    clean: bool  # written by a graceful close: `reserved` is exactly the next offset
    boot_id: str  # the boot that wrote it (diagnosis only: recovery does not depend on it)


def read_lease(directory: Path) -> Lease | None:
    try:
        data = (directory / LEASE_FILE).read_bytes()
    except FileNotFoundError:
        return None
    if len(data) != _BODY.size + 4:
        return None
    body, (checksum,) = data[: _BODY.size], struct.unpack(">I", data[_BODY.size :])
    if crc32c.crc32c(body) != checksum:
        return None
    magic, reserved, clean, raw_boot = _BODY.unpack(body)
    if magic != _MAGIC:
        return None
    return Lease(reserved, bool(clean), raw_boot.rstrip(b"\0").decode(errors="replace"))


def write_lease(directory: Path, reserved: int, clean: bool) -> None:
    """Durably record the lease (blocking: call from a worker thread on the hot path)."""
    raw_boot = boot_id().encode()[:36]
    body = _BODY.pack(_MAGIC, reserved, int(clean), raw_boot)
    write_file_durably(directory / LEASE_FILE, body + struct.pack(">I", crc32c.crc32c(body)))


class OffsetLease:
    """The lease of one partition: extended ahead of need, never moved back but by a clean close.

    Writes may come from the syncer's worker thread and, rarely, from an append on the event loop
    (a burst that outran the syncer); a lock keeps the file's value increasing."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.on_disk = -1  # offsets below this are covered
        self._lock = threading.Lock()
        self._block = MIN_LEASE_BLOCK
        self._extended = 0.0

    @property
    def block(self) -> int:
        return self._block

    def extend(self, reserved: int) -> None:
        """Durably record that offsets below `reserved` may be in use (blocking)."""
        with self._lock:
            if reserved <= self.on_disk:
                return
            write_lease(self.directory, reserved, clean=False)
            self.on_disk = reserved

    def target(self, next_offset: int) -> int | None:
        """How far to extend now, or None if more than half a block is left. The block doubles
        while extensions come less than a second apart (a fast producer) and shrinks back when
        they do not, which bounds both the lease writes per second and the gap after a crash."""
        if self.on_disk - next_offset >= self._block // 2:
            return None
        now = time.monotonic()
        if now - self._extended < 1.0:
            self._block = min(self._block * 2, MAX_LEASE_BLOCK)
        else:
            self._block = max(self._block // 2, MIN_LEASE_BLOCK)
        self._extended = now
        return next_offset + self._block

    def close(self, next_offset: int) -> None:
        """A clean close: the exact next offset, so the next open leaves no gap (blocking)."""
        with self._lock:
            write_lease(self.directory, next_offset, clean=True)
            self.on_disk = next_offset
