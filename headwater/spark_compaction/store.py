"""The object store as the compaction job sees it: a picklable description and a blocking handle.

Spark ships work to executors by pickling it, and executors run plain synchronous Python, so the
job never passes a store around: it passes a `StoreSpec` (backend, directory or bucket, prefix,
endpoint), and each task opens a `BlockingStore` from it. `BlockingStore` runs the server's own
async `ObjectStore` (storage/objectstore.py) on a private event loop, so the job reads and writes
exactly the objects the server's uploader writes, with the same conditional-put semantics, and
needs no Hadoop S3 connector. S3 credentials come from the usual AWS variables and files of the
process that runs the task.

A local directory is only shared by a cluster's executors when it is on a shared file system; on
a multi-host cluster use S3.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from headwater.storage.objectstore import LocalObjectStore, ObjectInfo, ObjectStore, S3ObjectStore
from headwater.wire.errors import StorageError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StoreSpec:
    backend: str  # "local" or "s3"
    path: str = ""  # local: the directory (absolute, so every executor finds the same one)
    bucket: str = ""
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> StoreSpec:
        try:
            return cls(**json.loads(text))
        except (TypeError, ValueError) as exc:
            raise StorageError(f"invalid object store description {text!r}: {exc}") from None

    @classmethod
    def local(cls, path: Path | str) -> StoreSpec:
        return cls("local", path=str(Path(path).resolve()))

    def describe(self) -> str:
        if self.backend == "local":
            return self.path
        endpoint = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"s3://{self.bucket}/{self.prefix}{endpoint}"


async def open_store(spec: StoreSpec) -> ObjectStore:
    if spec.backend == "local":
        if not spec.path:
            raise StorageError("the local object store needs a directory")
        return LocalObjectStore(Path(spec.path))
    if spec.backend == "s3":
        if not spec.bucket:
            raise StorageError("the s3 object store needs a bucket")
        return await S3ObjectStore(spec.bucket, spec.prefix, spec.endpoint_url, spec.region).open()
    raise StorageError(f"unknown object store backend {spec.backend!r} (local or s3)")


class BlockingStore:
    """An `ObjectStore` with blocking methods, for executors and the job's driver code.

    Each call runs on an event loop of its own, with `run_until_complete`, not `asyncio.Runner`:
    on Python 3.11 `Runner.run` in a main thread whose SIGINT handler is the default (a PySpark
    worker's) looks its own handler up again when the call ends, and the failed lookup builds an
    error message holding the repr of the finished task, result included. For a 64 MiB segment
    that repr cost more CPU than decoding the segment (docs/BENCHMARKS.md, 2026-11-26)."""

    def __init__(self, spec: StoreSpec) -> None:
        self.spec = spec
        self._loop = asyncio.new_event_loop()
        try:
            self._store = self._run(open_store(spec))
        except BaseException:
            self._loop.close()
            raise

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coroutine)

    def get(self, key: str) -> bytes:
        return self._run(self._store.get(key))

    def put(self, key: str, data: bytes) -> None:
        self._run(self._store.put(key, data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self._run(self._store.put_if_absent(key, data))

    def list(self, prefix: str) -> list[ObjectInfo]:
        return self._run(self._store.list(prefix))

    def delete(self, key: str) -> None:
        self._run(self._store.delete(key))

    def close(self) -> None:
        try:
            self._run(self._store.close())
        finally:
            try:
                self._run(self._loop.shutdown_asyncgens())
                self._run(self._loop.shutdown_default_executor())
            finally:
                self._loop.close()

    def __enter__(self) -> BlockingStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
