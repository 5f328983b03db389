"""The WAL's one seam to the file system: every segment write, truncate and fsync goes through here.

`FileOps` is a small object whose methods are thin wrappers over `os.*`. The WAL never calls
`os.write` or `os.fsync` on a segment itself, so a test can hand it a subclass that fails exactly
where a real disk does (a short write, ENOSPC, EIO, a failing fsync) and check what the WAL does
next, without a special file system.

Power-loss simulation: when the environment variable `HEADWATER_TEST_FSYNC_JOURNAL` names a file,
`default_file_ops()` returns a `JournalingFileOps` that appends `<path>\\t<length>` to that file
after each fsync of a segment completes (the length the file had when the fsync started, which the
fsync therefore covers). A test kills the server with SIGKILL and cuts every segment back to its
last journaled length: what a power cut would have left on the disk. Without the variable the
journal does not exist and costs nothing. `fsync_directory` makes a created, renamed or deleted
name durable (POSIX needs an fsync of the directory for that).

Deleting a segment is two steps: `detach` unlinks its name and keeps it open (a directory change,
cheap), and `release` frees its blocks a mebibyte per journal commit before closing it (freeing a
64 MiB segment in one commit held every fsync on the disk for 10-15 ms). A power cut between
the two leaves an unlinked inode, which the file system frees when it mounts.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import threading
from pathlib import Path
from typing import Final

JOURNAL_ENV: Final = "HEADWATER_TEST_FSYNC_JOURNAL"
BOOT_ID_ENV: Final = "HEADWATER_TEST_BOOT_ID"
_BOOT_ID_FILE: Final = Path("/proc/sys/kernel/random/boot_id")


class FileOps:
    """Segment file operations; subclass and override to inject faults."""

    def open_append(self, path: Path, create: bool = False) -> int:
        flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT if create else 0)
        return os.open(path, flags, 0o644)

    def write(self, fd: int, data: memoryview) -> int:
        return os.write(fd, data)

    def truncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def fsync(self, fd: int, path: Path) -> None:
        os.fsync(fd)

    def fsync_directory(self, directory: Path) -> None:
        fsync_directory(directory)

    def close(self, fd: int) -> None:
        os.close(fd)

    def remove(self, path: Path) -> None:
        """Delete a file if it exists (a segment's index, by retention)."""
        path.unlink(missing_ok=True)

    def detach(self, path: Path) -> int | None:
        """Delete a segment's name but keep the file open: a descriptor to `release` when the
        file's blocks are now freed only by it, None when there is nothing to free (no such
        file, a small one, or one with other names left: a hard link of the local object
        store). Unlinking an open file is a directory change; the blocks go when it closes."""
        try:
            # not through a symbolic link, and never waiting on a FIFO: `remove_tree` detaches
            # whatever a directory holds
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError:
            # no descriptor free (EMFILE), no write permission, a symbolic link: deleting it
            # needs none of these, and it is deleted, freed at once as it always was
            path.unlink(missing_ok=True)
            return None
        try:
            os.unlink(path)
            status = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        if status.st_nlink == 0 and status.st_size > RELEASE_STEP:
            return fd
        os.close(fd)
        return None

    def release(self, fd: int) -> None:
        """Free a detached file's blocks `RELEASE_STEP` at a time, each step committed, then
        close it."""
        try:
            size = os.fstat(fd).st_size
            while size > 0:  # bounded: the size falls by a step each time
                size = max(0, size - RELEASE_STEP)
                self.truncate(fd, size)
                os.fdatasync(fd)
        finally:
            os.close(fd)


class JournalingFileOps(FileOps):
    """Records the length every completed segment fsync covers (power-loss tests only)."""

    def __init__(self, journal: Path) -> None:
        self._journal = journal
        self._lock = threading.Lock()  # fsyncs run in worker threads

    def fsync(self, fd: int, path: Path) -> None:
        length = os.fstat(fd).st_size
        os.fsync(fd)
        line = f"{path}\t{length}\n".encode()
        with self._lock:
            journal = os.open(self._journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(journal, line)
            finally:
                os.close(journal)


def default_file_ops() -> FileOps:
    journal = os.environ.get(JOURNAL_ENV)
    return JournalingFileOps(Path(journal)) if journal else FileOps()


def write_all(ops: FileOps, fd: int, data: bytes) -> None:
    """Write every byte or raise OSError (a short write that makes no progress is ENOSPC)."""
    view = memoryview(data)
    while view:
        written = ops.write(fd, view)
        if written <= 0:
            raise OSError(28, "No space left on device (write made no progress)")
        view = view[written:]


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_durably(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically and durably: temporary file, fsync, rename, and an
    fsync of the directory so the new name survives a power loss too."""
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)


# How much of a copy reaches the disk at a time (copy_durably): a synced step of 256 KiB held the
# disk for 0.3 ms on the test machine, one of 4 MiB for 8 ms, and every WAL fsync that came in
# the meantime waited for it (the soak's reliable p99 rose from 2-4 ms to 6-17 ms with the 64
# MiB copies of a local object store flushed whole).
COPY_STEP: Final = 256 * 1024


def copy_durably(source: Path, target: Path, step: int = COPY_STEP) -> None:
    """Copy `source` to a new file `target` in the kernel (sendfile: no bytes through Python,
    across file systems), syncing every `step` bytes so the copy never queues more than that
    ahead of anybody else's fsync on the disk."""
    with source.open("rb") as reading, target.open("xb") as writing:
        size = os.fstat(reading.fileno()).st_size
        position = 0
        while position < size:
            sent = os.sendfile(
                writing.fileno(), reading.fileno(), position, min(step, size - position)
            )
            if sent == 0:  # the file got shorter: it is being changed, which callers rule out
                raise OSError(errno.EIO, f"{source} ended {size - position} bytes early")
            position += sent
            os.fdatasync(writing.fileno())
        os.fsync(writing.fileno())


# How much of a deleted segment is freed at a time (FileOps.release). On the test machine (ext4
# mounted with `discard`) closing the last descriptor of a 64 MiB segment freed it in one journal
# commit of 13-15 ms, and every fsync on the disk waited for it: the soak's reliable p99 rose from
# 2 to 3.5 ms once local retention began deleting segments. Freed a mebibyte per commit, the same
# file takes 31 ms and no fsync beside it waited more than 0.7 ms (docs/BENCHMARKS.md). RocksDB's
# DeleteScheduler truncates large files in chunks for the same reason (`bytes_max_delete_chunk`).
RELEASE_STEP: Final = 1 << 20


def remove_tree(directory: Path, ops: FileOps | None = None) -> None:
    """Remove a directory tree (a deleted topic's), freeing each large file a step at a time as
    `FileOps.release` does, so a gigabyte of segments never holds the other topics' fsyncs; what
    cannot be removed is left, as `shutil.rmtree(directory, ignore_errors=True)` leaves it."""
    ops = ops or FileOps()
    if directory.is_symlink():  # as rmtree: a link is not followed into what it names
        shutil.rmtree(directory, ignore_errors=True)
        return
    for folder, _, names in os.walk(directory):
        for name in names:
            with contextlib.suppress(OSError):
                fd = ops.detach(Path(folder) / name)
                if fd is not None:
                    ops.release(fd)
    shutil.rmtree(directory, ignore_errors=True)


def boot_id() -> str:
    """Identifies the running kernel: it changes when the machine restarts (or loses power), so
    a WAL can tell a killed process (page cache kept) from a lost page cache."""
    override = os.environ.get(BOOT_ID_ENV)
    if override:
        return override
    try:
        return _BOOT_ID_FILE.read_text().strip()
    except OSError:
        return "unknown"
