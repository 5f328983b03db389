"""The open-files limit and how many reliable partitions it allows (issue 41).

Start-up raises the soft RLIMIT_NOFILE to the hard one (`raise_limit`), as servers do: the
default soft limit of many systems, 1,024, is under what a 1,024-partition reliable topic needs.
What a partition holds (docs/OPERATIONS.md, "Open files"): a reliable partition keeps one
descriptor open, its active segment's (`storage.wal`: `Segment.write_fd`); a roll opens the next
segment before the syncer has fsynced and closed the sealed one (`storage.syncer._seal`), and
time-based rolls (`segment.ms`) come to every partition written in the same interval together,
so a partition is counted at two. Everything else is short-lived or server-wide: reads open a
segment for the read only, in a bounded pool of threads; the offset lease is written as a new file
and renamed; RocksDB, the listeners, logs and the thread pools take the `RESERVED` few hundred.
A non-reliable partition holds none. Connections take one each, up to `server.max_connections`.
"""

from __future__ import annotations

import contextlib
import resource
from typing import Final

DESCRIPTORS_PER_PARTITION: Final = 2
RESERVED: Final = 256  # listeners, RocksDB's files, logs, reads and lease writes in flight
UNLIMITED: Final = -1


def raise_limit() -> int:
    """Raise the soft limit to the hard one; the soft limit then (UNLIMITED for none)."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return open_files_limit()


def open_files_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return UNLIMITED if soft == resource.RLIM_INFINITY else soft


def partitions_allowed(limit: int, max_connections: int) -> int:
    """Reliable partitions that fit in `limit` descriptors beside `max_connections` connections
    and the server's own; UNLIMITED when the limit is."""
    if limit == UNLIMITED:
        return UNLIMITED
    return max(0, (limit - RESERVED - max_connections) // DESCRIPTORS_PER_PARTITION)
