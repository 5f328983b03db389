"""Snapshot names and manifests: where a snapshot lives, and the object that makes it exist.

Layout, per topic and partition, all under the object store's root or prefix:

    snapshots/<topic>/<partition>/<horizon, 20 digits>/part-00000.parquet, part-00001.parquet, ...
    snapshots/<topic>/<partition>/_manifest-<horizon, 20 digits>.json

(`manifest-<horizon>.json` before the leading `_`, which makes Parquet readers of the directory
skip it; such manifests are still read and expire like the others.)

The horizon is the offset after the last record folded in: the snapshot holds, for every live key,
the newest record below it. Data files are written first, under a path that depends only on the
horizon, so a rerun rewrites the same names with the same bytes. The manifest is written last
with a conditional put (`put_if_absent`); it is the commit. Readers only look for manifests, take
the one with the highest horizon, and read the files it lists, so an interrupted run (files but no
manifest) is invisible to them.

Names and the `Manifest` itself live in `headwater.storage.snapshots` (the server reads them
too); they are re-exported here.

Retention: a snapshot whose manifest was superseded more than `retention` seconds ago is removed
(manifest first, then its files, so no manifest ever points at missing files); so are data
directories below the newest horizon that never got a manifest. The newest manifest and its files
are never removed, nor any directory a kept manifest lists as one of its layers (a delta's full
layer outlives its own manifest). Directories above the newest horizon are left alone: a running
job may be writing them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from headwater.storage.objectstore import ObjectInfo
from headwater.storage.snapshots import (
    LAYERED_SCHEMA_VERSION,
    ROOT,
    Layer,
    Manifest,
    SnapshotFile,
    data_key,
    data_prefix,
    legacy_manifest_key,
    manifest_horizons,
    manifest_key,
    manifest_keys,
    now_iso,
    parse_manifest_key,
    partition_prefix,
)

__all__ = [
    "LAYERED_SCHEMA_VERSION",
    "ROOT",
    "Layer",
    "Manifest",
    "RetentionPlan",
    "SnapshotFile",
    "data_directories",
    "data_key",
    "data_prefix",
    "legacy_manifest_key",
    "manifest_horizons",
    "manifest_key",
    "manifest_keys",
    "now_iso",
    "parse_manifest_key",
    "partition_prefix",
    "retention_plan",
]


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
    manifests: dict[int, Manifest],
    retention: float,
    now: float,
) -> RetentionPlan:
    """What to remove from one partition; `manifests` holds each of its manifests by horizon."""
    keys = manifest_keys(listing)
    horizons = sorted(keys)
    if not horizons:
        return RetentionPlan([], [])
    newest = horizons[-1]
    directories = data_directories(listing, partition_prefix(topic, partition))
    doomed: list[int] = []
    for older, newer in itertools.pairwise(horizons):
        if manifests[newer].created_at_seconds + retention <= now:  # superseded long enough ago
            doomed.append(older)
    kept = [h for h in horizons if h not in doomed]
    in_use = {layer.horizon for h in kept for layer in manifests[h].all_layers}
    if manifests[newest].created_at_seconds + retention <= now:
        doomed.extend(h for h in directories if h < newest and h not in horizons)
    return RetentionPlan(
        [keys[h] for h in doomed if h in keys],
        sorted(key for h in doomed if h not in in_use for key in directories.get(h, [])),
    )
