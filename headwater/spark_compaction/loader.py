"""Loading a partition's newest snapshot without Spark: for the server, and for anyone with pyarrow.

`load_snapshot(store, topic, partition)` finds the manifest with the highest horizon (the commit
of the newest complete snapshot) and returns a `Snapshot`: its horizon and an async iterator of
its rows, one per live key, in key order, the delta layers merged over the full one. The code
lives in `headwater.storage.snapshots`, where the server reads it too (the server never imports
this package); this module keeps the job's public names.
"""

from __future__ import annotations

from headwater.storage.snapshots import (
    Overlay,
    Snapshot,
    SnapshotRow,
    decode_snapshot_file,
    load_snapshot,
    newest_manifest,
    read_manifest,
    read_snapshot_file,
)

__all__ = [
    "Overlay",
    "Snapshot",
    "SnapshotRow",
    "decode_snapshot_file",
    "load_snapshot",
    "newest_manifest",
    "read_manifest",
    "read_snapshot_file",
]
