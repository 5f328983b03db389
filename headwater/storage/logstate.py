"""The in-memory model of one partition's WAL: its settings and its segments.

Shared by the log itself (`wal`), its recovery (`recovery`) and its syncer (`syncer`), so none of
them imports another's internals.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from headwater.storage.segments import (
    INDEX_INTERVAL_BYTES,
    INDEX_SUFFIX,
    BatchLocation,
    SparseIndex,
)


class FsyncPolicy(enum.StrEnum):
    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class LogConfig:
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_ms: int = 100
    segment_bytes: int = 64 * 1024 * 1024
    segment_ms: int = 10 * 60 * 1000
    tail_cache_bytes: int = 8 * 1024 * 1024


@dataclass(slots=True)
class Segment:
    base_offset: int
    path: Path
    next_offset: int
    size: int
    index: SparseIndex
    created: float  # monotonic time of its first append (age-based rolling)
    sealed: bool
    write_fd: int | None = None
    last_index_position: int = -INDEX_INTERVAL_BYTES
    max_timestamp: int = -1
    # the batches found by the recovery scan (active segment only)
    recovered: list[BatchLocation] = field(default_factory=list)

    @property
    def index_path(self) -> Path:
        return self.path.with_suffix(INDEX_SUFFIX)


@dataclass(frozen=True, slots=True)
class SealedSegment:
    base_offset: int
    next_offset: int
    path: Path
    size: int
