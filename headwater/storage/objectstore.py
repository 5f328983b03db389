"""Object storage behind one small async interface, with two backends.

- `LocalObjectStore`: a directory (the embedded default, `<data_dir>/objects`). Puts write a
  temporary file, fsync it and rename it, so an object is whole or absent; conditional puts use a
  hard link, which fails if the name exists. The directory is fsynced after the rename (and any
  directory the put created, after its creation), so a stored object survives a power cut: the
  uploader counts a segment as safe, and retention deletes the local copy, on that promise.
  `put_file` stores a file that never changes again (a sealed, fsynced WAL segment): it copies it
  in the kernel, synced in steps (`fileio.copy_durably`: a copy flushed whole held the disk, and
  every WAL fsync behind it, for tens of milliseconds). With `link=True` on the same file system
  it hard-links it instead: no bytes written, and the object is the segment's own blocks, so
  nothing may change a linked segment in place (storage/recovery.py gives the last segment a
  private file first when it has other links). A server killed during a put leaves its
  temporary file (`.<name>.<32 hex>.tmp`, never listed); `remove_abandoned` deletes those whose
  inode has not changed for a while, which the server runs at start (a live copy writes, and a
  link changes the inode's change time, so another broker's put in progress on a shared
  directory is never taken for one).
- `S3ObjectStore`: S3 or any S3-compatible server through aiobotocore (`endpoint_url`), with
  credentials from the usual AWS variables or config files. Conditional puts send
  `If-None-Match: *`. `put_file` uploads a file over `part_size` (8 MiB) in parts, read one at a
  time, and aborts the upload if a part fails.

The local store's file work runs on threads of its own (`LOCAL_STORE_THREADS`, started on first
use, ended by `close`), not asyncio's default executor: a segment's copy takes long enough to hold
a thread, and other servers in the process, and the default executor's other work, share none.

Keys are '/'-separated relative names; `prefix` (S3) or the root directory (local) is added here.
Every failure is raised as `StorageError` (`ObjectNotFound` for a missing key), so callers retry
without knowing the backend.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import os
import re
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

from headwater.storage.fileio import copy_durably, fsync_directory
from headwater.wire.errors import ObjectNotFound, StorageError

T = TypeVar("T")

# Uploads, archive reads and listings of one local store at once: a few, as a disk serves a few
# streams well; more would only queue in the kernel.
LOCAL_STORE_THREADS: Final = 4


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int


class ObjectStore(Protocol):
    async def put(self, key: str, data: bytes) -> None: ...

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        """Store unless `key` exists; returns whether it stored."""
        ...

    async def put_file(self, key: str, path: Path) -> int:
        """Store the bytes of the file at `path`, which must not change again (a sealed segment);
        returns their count. FileNotFoundError if the file is gone."""
        ...

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of the object (to its end when `end` is None)."""
        ...

    async def list(self, prefix: str) -> list[ObjectInfo]: ...

    async def delete(self, key: str) -> None: ...

    async def close(self) -> None: ...


def _check_key(key: str) -> None:
    parts = key.split("/")
    if not key or any(p in ("", ".", "..") for p in parts):
        raise StorageError(f"invalid object key {key!r}")


# a put whose directory a concurrent delete removes (empty) between mkdir and open tries again
_DIRECTORY_RACES = 5


# Why a hard link may fail where a copy would not: another file system, a file system without
# links, too many links to one file.
_CANNOT_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, errno.ENOTSUP})


# A put's temporary file: `.<object name>.<uuid4 hex>.tmp` (LocalObjectStore._store).
_TEMPORARY = re.compile(r"\..+\.[0-9a-f]{32}\.tmp")


class LocalObjectStore:
    def __init__(self, root: Path, link: bool = False) -> None:
        """`link`: let `put_file` hard-link files on the same file system (else it copies)."""
        self.root = root
        self.link = link
        root.mkdir(parents=True, exist_ok=True)
        self._threads: ThreadPoolExecutor | None = None  # started on first use
        self._closed = False

    async def _in_thread(self, job: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StorageError(f"the object store at {self.root} is closed")
        if self._threads is None:
            self._threads = ThreadPoolExecutor(LOCAL_STORE_THREADS, thread_name_prefix="hw-objects")
        return await asyncio.get_running_loop().run_in_executor(self._threads, job, *args)

    def _path(self, key: str) -> Path:
        _check_key(key)
        return self.root / key

    def remove_abandoned(self, older_than: float, now: float | None = None) -> int:
        """Delete the temporary files of puts that died with their server: those whose inode
        has not changed for `older_than` seconds (before `now`, default the clock). Blocking
        (a walk of the store): run it in a worker thread. Returns how many it deleted."""
        now = time.time() if now is None else now
        removed = 0
        for directory, _, files in os.walk(self.root):
            for name in files:
                if not _TEMPORARY.fullmatch(name):
                    continue
                path = Path(directory) / name
                try:
                    if now - path.lstat().st_ctime >= older_than:
                        path.unlink()
                        removed += 1
                except FileNotFoundError:
                    continue  # its put renamed or removed it meanwhile
        return removed

    async def put(self, key: str, data: bytes) -> None:
        await self._in_thread(self._put, self._path(key), data, False)

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        return await self._in_thread(self._put, self._path(key), data, True)

    async def put_file(self, key: str, path: Path) -> int:
        return await self._in_thread(self._put_file, self._path(key), path)

    def _put_file(self, target: Path, source: Path) -> int:
        try:
            size = source.stat().st_size
            if self.link:
                try:
                    self._store(target, lambda temporary: os.link(source, temporary), False)
                    return size
                except OSError as exc:
                    if exc.errno not in _CANNOT_LINK:
                        raise
            self._store(target, lambda temporary: copy_durably(source, temporary), False)
            return size
        except OSError as exc:
            if isinstance(exc, FileNotFoundError) and not source.exists():
                raise  # the segment is gone (its topic was deleted): not a store failure
            raise StorageError(f"cannot store {source} as object {target}: {exc}") from None

    @staticmethod
    def _put(path: Path, data: bytes, only_if_absent: bool) -> bool:
        def write(temporary: Path) -> None:
            with temporary.open("wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())

        try:
            return LocalObjectStore._store(path, write, only_if_absent)
        except OSError as exc:
            raise StorageError(f"cannot write object {path}: {exc}") from None

    @staticmethod
    def _store(path: Path, fill: Callable[[Path], object], only_if_absent: bool) -> bool:
        """Make a durable temporary file beside `path` with `fill`, then give it the object's
        name: replacing any object there, or only if there is none (returns whether it did)."""
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        for attempt in range(_DIRECTORY_RACES):
            try:
                created = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
                path.parent.mkdir(parents=True, exist_ok=True)
                for directory in reversed(created):
                    fsync_directory(directory.parent)
                fill(temporary)
                break
            except (FileNotFoundError, FileExistsError):
                # a delete removed a directory, empty, while we made or used it
                temporary.unlink(missing_ok=True)
                if attempt == _DIRECTORY_RACES - 1:
                    raise
            except OSError:  # a full disk, say: leave no temporary file behind
                temporary.unlink(missing_ok=True)
                raise
        try:
            if only_if_absent:
                try:
                    os.link(temporary, path)
                except FileExistsError:
                    return False
            else:
                os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
        fsync_directory(path.parent)
        return True

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return await self._in_thread(self._get, key, self._path(key), start, end)

    @staticmethod
    def _get(key: str, path: Path, start: int, end: int | None) -> bytes:
        try:
            with path.open("rb") as file:
                file.seek(start)
                return file.read() if end is None else file.read(max(0, end - start))
        except FileNotFoundError:
            raise ObjectNotFound(f"object {key!r} does not exist") from None
        except OSError as exc:
            raise StorageError(f"cannot read object {key!r}: {exc}") from None

    async def list(self, prefix: str) -> list[ObjectInfo]:
        return await self._in_thread(self._list, prefix)

    def _list(self, prefix: str) -> builtins.list[ObjectInfo]:
        found = []
        for directory, _, files in os.walk(self.root):
            for name in files:
                if name.startswith("."):
                    continue
                path = Path(directory) / name
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    try:
                        size = path.stat().st_size
                    except FileNotFoundError:
                        continue  # deleted since the walk saw it: not there, as in S3's list
                    found.append(ObjectInfo(key, size))
        return sorted(found, key=lambda o: o.key)

    async def delete(self, key: str) -> None:
        await self._in_thread(self._delete, self._path(key))

    def _delete(self, path: Path) -> None:
        """Unlink, then remove the directories the key leaves empty, up to the root: an object
        store has no directories, and retention (segments, superseded snapshots' horizon
        directories) left one behind for every prefix it emptied."""
        path.unlink(missing_ok=True)
        directory = path.parent
        while directory != self.root and self.root in directory.parents:
            try:
                directory.rmdir()
            except OSError:  # not empty (or gone): whatever is above it is not empty either
                return
            directory = directory.parent

    async def close(self) -> None:
        """End the store's threads once the work they run ends (a later call is refused)."""
        self._closed = True
        threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown(wait=False)
            # a copy in progress finishes first: waited for without holding the loop
            await asyncio.get_running_loop().run_in_executor(None, threads.shutdown, True)


class S3ObjectStore:
    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        part_size: int = 8 * 1024 * 1024,
    ) -> None:
        """`part_size`: files larger than this are uploaded in parts of this size (S3 takes
        5 MiB to 5 GiB for every part but the last)."""
        self.bucket = bucket
        self.part_size = part_size
        self.prefix = prefix.strip("/")
        self._endpoint_url = endpoint_url
        self._region = region
        self._client: Any = None
        self._exit: contextlib.AsyncExitStack | None = None

    async def open(self) -> S3ObjectStore:
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session

        self._exit = contextlib.AsyncExitStack()
        config = AioConfig(
            retries={"max_attempts": 2, "mode": "standard"},
            connect_timeout=5,
            read_timeout=30,
        )
        self._client = await self._exit.enter_async_context(
            get_session().create_client(
                "s3",
                endpoint_url=self._endpoint_url,
                region_name=self._region or "us-east-1",
                config=config,
            )
        )
        return self

    def _key(self, key: str) -> str:
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    async def put(self, key: str, data: bytes) -> None:
        try:
            await self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        except Exception as exc:
            raise StorageError(f"S3 put {key!r} failed: {exc}") from None

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        try:
            await self._client.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*"
            )
            return True
        except Exception as exc:
            if _status(exc) in (409, 412):
                return False
            raise StorageError(f"S3 conditional put {key!r} failed: {exc}") from None

    async def put_file(self, key: str, path: Path) -> int:
        """One PUT up to `part_size` bytes; a larger file (a 64 MiB segment) goes up in parts read
        one at a time, so an upload holds `part_size` bytes of memory, not the whole segment.
        FileNotFoundError passes: the segment is gone."""
        file = await asyncio.to_thread(path.open, "rb")
        try:
            size = os.fstat(file.fileno()).st_size
            if size <= self.part_size:
                data = await asyncio.to_thread(file.read)
                await self.put(key, data)
                return len(data)
            await self._put_in_parts(key, file.fileno(), size)
            return size
        finally:
            file.close()

    async def _put_in_parts(self, key: str, fd: int, size: int) -> None:
        target = {"Bucket": self.bucket, "Key": self._key(key)}
        try:
            started = await self._client.create_multipart_upload(**target)
        except Exception as exc:
            raise StorageError(f"S3 multipart put {key!r} failed to start: {exc}") from None
        upload = target | {"UploadId": started["UploadId"]}
        try:
            parts = []
            for number, start in enumerate(range(0, size, self.part_size), 1):
                length = min(self.part_size, size - start)
                chunk = await asyncio.to_thread(os.pread, fd, length, start)
                if len(chunk) != length:  # callers rule it out: the file is sealed
                    raise StorageError(f"{key!r}: the file got shorter while it was uploaded")
                answer = await self._client.upload_part(**upload, PartNumber=number, Body=chunk)
                parts.append({"ETag": answer["ETag"], "PartNumber": number})
            await self._client.complete_multipart_upload(**upload, MultipartUpload={"Parts": parts})
        except Exception as exc:
            # A cancelled upload is left to the bucket's lifecycle rule for incomplete ones.
            with contextlib.suppress(Exception):
                await self._client.abort_multipart_upload(**upload)
            if isinstance(exc, StorageError):
                raise
            raise StorageError(f"S3 multipart put {key!r} failed: {exc}") from None

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        arguments: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key)}
        if start or end is not None:
            if end is not None and end <= start:
                return b""
            arguments["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        try:
            response = await self._client.get_object(**arguments)
            async with response["Body"] as stream:
                data: bytes = await stream.read()
                return data
        except Exception as exc:
            if _status(exc) == 404:
                raise ObjectNotFound(f"object {key!r} does not exist") from None
            raise StorageError(f"S3 get {key!r} failed: {exc}") from None

    async def list(self, prefix: str) -> list[ObjectInfo]:
        found = []
        strip = len(self.prefix) + 1 if self.prefix else 0
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            full_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=full_prefix):
                for item in page.get("Contents", []):
                    found.append(ObjectInfo(item["Key"][strip:], item["Size"]))
        except Exception as exc:
            raise StorageError(f"S3 list {prefix!r} failed: {exc}") from None
        return found

    async def delete(self, key: str) -> None:
        try:
            await self._client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            raise StorageError(f"S3 delete {key!r} failed: {exc}") from None

    async def close(self) -> None:
        if self._exit is not None:
            await self._exit.aclose()
            self._exit = None


def _status(exc: Exception) -> int | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if status is not None else None
    return None
