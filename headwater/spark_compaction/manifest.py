"""Snapshot names and manifests: where a snapshot lives, and the object that makes it exist.

Layout, per topic and partition, all under the object store's root or prefix:

    snapshots/<topic>/<partition>/<horizon, 20 digits>/part-00000.parquet, part-00001.parquet, ...
    snapshots/<topic>/<partition>/manifest-<horizon, 20 digits>.json

The horizon is the offset after the last record folded in: the snapshot holds, for every live key,
the newest record below it. Data files are written first, under a path that depends only on the
horizon, so a rerun rewrites the same names with the same bytes. The manifest is written last
with a conditional put (`put_if_absent`); it is the commit. Readers only look for manifests, take
the one with the highest horizon, and read the files it lists, so an interrupted run (files but no
manifest) is invisible to them.

Retention: a snapshot whose manifest was superseded more than `retention` seconds ago is removed
(manifest first, then its files, so no manifest ever points at missing files); so are data
directories below the newest horizon that never got a manifest. The newest manifest and its files
are never removed. Directories above the newest horizon are left alone: a running job may be
writing them.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from headwater.spark_compaction.schema import SCHEMA_VERSION
from headwater.storage.objectstore import ObjectInfo
from headwater.wire.errors import StorageError

ROOT = "snapshots"
_MANIFEST_PREFIX = "manifest-"
_MANIFEST_SUFFIX = ".json"


def partition_prefix(topic: str, partition: int) -> str:
    return f"{ROOT}/{topic}/{partition}/"


def manifest_key(topic: str, partition: int, horizon: int) -> str:
    return f"{partition_prefix(topic, partition)}{_MANIFEST_PREFIX}{horizon:020d}{_MANIFEST_SUFFIX}"


def data_prefix(topic: str, partition: int, horizon: int) -> str:
    return f"{partition_prefix(topic, partition)}{horizon:020d}/"


def data_key(topic: str, partition: int, horizon: int, index: int) -> str:
    return f"{data_prefix(topic, partition, horizon)}part-{index:05d}.parquet"


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    key: str
    rows: int
    bytes: int


@dataclass(frozen=True, slots=True)
class Manifest:
    topic: str
    partition: int
    horizon: int  # every record below this offset is folded in
    last_segment: int  # base offset of the last WAL segment folded in; the next run reads past it
    previous_horizon: int | None  # the snapshot this one was merged with, if any
    files: tuple[SnapshotFile, ...]
    rows: int  # live keys
    records_in: int  # WAL records read by the run that made this snapshot
    tombstones_dropped: int
    keyless_skipped: int
    corrupt_batches: int
    created_at: str  # ISO 8601, UTC: the only field that depends on the clock
    schema_version: int = SCHEMA_VERSION

    def encode(self) -> bytes:
        document = asdict(self)
        document["files"] = [asdict(f) for f in self.files]
        return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def decode(cls, key: str, data: bytes) -> Manifest:
        try:
            document = json.loads(data)
            files = tuple(SnapshotFile(**f) for f in document.pop("files"))
            manifest = cls(files=files, **document)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise StorageError(f"snapshot manifest {key} is not valid: {exc}") from None
        if manifest.schema_version != SCHEMA_VERSION:
            raise StorageError(
                f"snapshot manifest {key} has schema version {manifest.schema_version}; "
                f"this version reads {SCHEMA_VERSION}"
            )
        return manifest

    @property
    def created_at_seconds(self) -> float:
        return datetime.fromisoformat(self.created_at).timestamp()


def now_iso(now: float | None = None) -> str:
    moment = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    return moment.isoformat(timespec="milliseconds")


def parse_manifest_key(key: str) -> int | None:
    name = key.rsplit("/", 1)[-1]
    if not (name.startswith(_MANIFEST_PREFIX) and name.endswith(_MANIFEST_SUFFIX)):
        return None
    digits = name[len(_MANIFEST_PREFIX) : -len(_MANIFEST_SUFFIX)]
    return int(digits) if len(digits) == 20 and digits.isdigit() else None


def manifest_horizons(listing: Sequence[ObjectInfo]) -> list[int]:
    """Horizons of the manifests in a partition's listing, lowest first."""
    return sorted(h for h in (parse_manifest_key(i.key) for i in listing) if h is not None)


def data_directories(listing: Sequence[ObjectInfo], prefix: str) -> dict[int, list[str]]:
    """Data object keys of a partition's listing, by the horizon directory they are in."""
    found: dict[int, list[str]] = {}
    for info in listing:
        rest = info.key[len(prefix) :].split("/")
        if len(rest) == 2 and len(rest[0]) == 20 and rest[0].isdigit():
            found.setdefault(int(rest[0]), []).append(info.key)
    return found


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    manifests: list[str]  # delete these first
    files: list[str]  # then these


def retention_plan(
    topic: str,
    partition: int,
    listing: Sequence[ObjectInfo],
    created_at: dict[int, float],
    retention: float,
    now: float,
) -> RetentionPlan:
    """What to remove from one partition; `created_at` maps each manifest's horizon to its time."""
    horizons = manifest_horizons(listing)
    if not horizons:
        return RetentionPlan([], [])
    newest = horizons[-1]
    directories = data_directories(listing, partition_prefix(topic, partition))
    doomed: list[int] = []
    for older, newer in itertools.pairwise(horizons):
        if created_at[newer] + retention <= now:  # superseded long enough ago
            doomed.append(older)
    if created_at[newest] + retention <= now:
        doomed.extend(h for h in directories if h < newest and h not in horizons)
    return RetentionPlan(
        [manifest_key(topic, partition, h) for h in doomed if h in horizons],
        sorted(key for h in doomed for key in directories.get(h, [])),
    )
