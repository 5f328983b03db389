"""One compaction run: plan, fold and write, commit, clean up; and the summary it reports.

1. Plan (driver, object store only): list the WAL segment objects of the chosen topics and each
   partition's newest manifest; a partition takes part when it has segments past the manifest's
   `last_segment`. The list is pinned: segments uploaded while the run is going wait for the next.
2. Compute: a partition whose new segments fit one reading task is read, folded, counted and
   written by that task (one_task.py), all such partitions in one Spark job; the others (and
   one whose changes are too many for a delta layer) go through the Spark fold (compact.py):
   fold the new records, collect each partition's counts, set its
   horizon (highest offset read + 1), and write its Parquet files: a delta layer of the keys that
   changed while the partition's deltas stay small beside its full layer (`takes_delta`),
   otherwise a full snapshot, the new winners folded with the previous snapshot's layers.
   Transactions are decided by the reading tasks (wal_segments.DecidedBatches): only committed
   and plain records are folded. A partition whose segments end inside a transaction gets that
   transaction's first offset as its horizon (the LSO of what was uploaded; nothing from it on
   is folded) and a `last_segment` below the segment holding it, so the next run reads it again;
   if a task after the one where it began folded past it, the partition is read again up to
   there (`_read_again`), and those groups replace the first read's.
   A partition whose new segments hold no readable record gets no new snapshot; its corrupt
   batches are reported, and reported again by the next run, which reads them again.
3. Commit: one manifest per partition, written with a conditional put. If the manifest is already
   there (a rerun that finishes what a crashed run began), the one that is there stands.
4. Retention (manifest.py): superseded snapshots older than `retention` go.

`compute` is separate from `commit` so a test can stop a run exactly where a crash would.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from headwater.spark_compaction.manifest import (
    LAYERED_SCHEMA_VERSION,
    ROOT,
    Manifest,
    SnapshotFile,
    data_prefix,
    manifest_horizons,
    manifest_key,
    manifest_keys,
    now_iso,
    partition_prefix,
    retention_plan,
)
from headwater.spark_compaction.one_task import DELTA, MERGE, OneTask, PartitionStats
from headwater.spark_compaction.schema import SCHEMA_VERSION
from headwater.spark_compaction.source import DEFAULT_GROUP_BYTES
from headwater.spark_compaction.store import BlockingStore, StoreSpec
from headwater.spark_compaction.wal_segments import SegmentObject, group_segments, list_segments
from headwater.spark_compaction.writer import ROWS_PER_FILE, expected_files
from headwater.wire.errors import StorageError

Progress = Callable[[str], None]


class UnknownTopic(ValueError):
    """A topic named in `CompactionSettings.topics` has no object in the store at all."""


@dataclass(frozen=True, slots=True)
class CompactionSettings:
    store: StoreSpec
    topics: tuple[str, ...] = ()  # empty: every topic with segments in the store
    retention: float = 3600.0  # seconds a superseded snapshot stays readable
    rows_per_file: int = ROWS_PER_FILE
    group_bytes: int = DEFAULT_GROUP_BYTES  # segment bytes per Spark input partition
    # a run writes a delta layer (the changed keys) over a partition's snapshot while its deltas
    # hold at most this fraction of the full layer's rows, and at most `max_deltas` of them;
    # otherwise a full snapshot (0: always full)
    delta_ratio: float = 0.25
    max_deltas: int = 8
    # a partition whose new segments fit one reading task (`group_bytes`) is folded and written
    # by that task (one_task.py); False: every partition through the Spark fold
    one_task: bool = True


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    topic: str
    partition: int
    previous: Manifest | None
    segments: tuple[SegmentObject, ...]

    @property
    def from_offset(self) -> int:
        return self.previous.horizon if self.previous else 0


@dataclass(frozen=True, slots=True)
class Outcome:
    """One partition's result: counts, and the manifest to commit (None: nothing new)."""

    plan: PartitionPlan
    records_in: int
    keyless: int
    tombstones: int
    corrupt: tuple[str, ...]
    manifest: Manifest | None
    bytes_read: int  # segments, and the earlier layers' files when it merged them
    aborted: int = 0  # records of aborted transactions left out (counted in records_in)


@dataclass
class Summary:
    segments: int = 0
    records_in: int = 0
    keys_out: int = 0
    tombstones_dropped: int = 0
    keyless_skipped: int = 0
    aborted_skipped: int = 0  # records of aborted transactions (counted in records_in)
    corrupt_batches: int = 0
    bytes_read: int = 0  # object bytes read: new segments, and snapshot layers merged
    bytes_written: int = 0  # snapshot file bytes written
    seconds: float = 0.0
    corrupt: list[str] = field(default_factory=list)
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    removed_objects: int = 0
    phases: dict[str, float] = field(default_factory=dict)  # seconds, by phase of the run

    def as_dict(self) -> dict[str, Any]:
        return {
            "segments": self.segments,
            "records_in": self.records_in,
            "keys_out": self.keys_out,
            "tombstones_dropped": self.tombstones_dropped,
            "keyless_skipped": self.keyless_skipped,
            "aborted_skipped": self.aborted_skipped,
            "corrupt_batches": self.corrupt_batches,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "seconds": round(self.seconds, 3),
            "corrupt": self.corrupt,
            "snapshots": self.snapshots,
            "removed_objects": self.removed_objects,
            "phases": {name: round(seconds, 3) for name, seconds in self.phases.items()},
        }


def read_newest_manifest(store: BlockingStore, topic: str, partition: int) -> Manifest | None:
    keys = manifest_keys(store.list(partition_prefix(topic, partition)))
    if not keys:
        return None
    key = keys[max(keys)]
    return Manifest.decode(key, store.get(key))


def plan(store: BlockingStore, settings: CompactionSettings) -> list[PartitionPlan]:
    by_partition: dict[tuple[str, int], list[SegmentObject]] = {}
    for segment in list_segments(store, settings.topics):
        by_partition.setdefault((segment.topic, segment.partition), []).append(segment)
    seen = {topic for topic, _ in by_partition}
    for topic in sorted(set(settings.topics) - seen):  # a typo would otherwise do nothing, quietly
        if not store.list(f"{topic}/") and not store.list(f"{ROOT}/{topic}/"):
            raise UnknownTopic(
                f"topic {topic!r} has nothing in the object store {settings.store.describe()}: "
                "no such topic, or none of its segments uploaded yet"
            )
    plans = []
    for (topic, partition), segments in sorted(by_partition.items()):
        previous = read_newest_manifest(store, topic, partition)
        done = previous.last_segment if previous else -1
        new = tuple(s for s in segments if s.base_offset > done)
        if new:
            plans.append(PartitionPlan(topic, partition, previous, new))
    return plans


def written_files(
    store: BlockingStore,
    topic: str,
    partition: int,
    horizon: int,
    rows: int,
    rows_per_file: int,
    delta: bool,
) -> list[SnapshotFile]:
    """The files the writer tasks stored for a partition, checked against what they had to store."""
    sizes = {i.key: i.size for i in store.list(data_prefix(topic, partition, horizon))}
    files = []
    for key, count in expected_files(topic, partition, horizon, rows, rows_per_file, delta):
        if key not in sizes:
            raise StorageError(f"snapshot file {key} is missing after the write")
        files.append(SnapshotFile(key, count, sizes[key]))
    return files


def delta_budget(previous: Manifest | None, settings: CompactionSettings) -> int | None:
    """How many changed keys a delta layer over `previous` may hold: the deltas, the new one
    included, stay within `delta_ratio` of the full layer's rows and number at most `max_deltas`
    (None: no delta, a full snapshot)."""
    if previous is None or settings.delta_ratio <= 0:
        return None
    full, *deltas = previous.all_layers
    if len(deltas) + 1 > settings.max_deltas:
        return None
    budget = int(settings.delta_ratio * full.rows) - sum(d.rows for d in deltas)
    return budget if budget >= 0 else None


def takes_delta(previous: Manifest | None, changed: int, settings: CompactionSettings) -> bool:
    """Whether a partition's run writes a delta layer of `changed` keys over `previous` rather
    than a full snapshot (`delta_budget`)."""
    budget = delta_budget(previous, settings)
    return budget is not None and changed <= budget


@dataclass
class _Found:
    """What the Spark work found and wrote, by (topic, partition)."""

    stats: dict[tuple[str, int], PartitionStats] = field(default_factory=dict)
    horizons: dict[tuple[str, int], int] = field(default_factory=dict)
    deltas: set[tuple[str, int]] = field(default_factory=set)  # a delta layer was written
    rows: dict[tuple[str, int], int] = field(default_factory=dict)  # rows of the files written
    cuts: dict[tuple[str, int], int] = field(default_factory=dict)  # open transactions' starts
    read_twice: set[tuple[str, int]] = field(default_factory=set)  # segments read twice


def compute(
    spark: Any,
    store: BlockingStore,
    settings: CompactionSettings,
    plans: Sequence[PartitionPlan],
    progress: Progress,
    phases: dict[str, float] | None = None,
) -> list[Outcome]:
    """Fold and write the data files of every planned partition; commits nothing. A partition
    whose new segments fit one reading task is done by that task (one_task.py, when
    `settings.one_task`); the others, and those whose changes need their earlier layers
    merged, go through the Spark fold (`_through_spark`)."""
    phases = {} if phases is None else phases
    if not plans:
        return []
    from headwater.spark_compaction import compact

    found = _Found()
    single = [p for p in plans if settings.one_task and _one_group(p, settings)]
    rest = [p for p in plans if p not in single]
    if single:
        clock = time.monotonic()
        progress(f"reading and writing {len(single)} partitions, one task each")
        tasks = [
            OneTask(
                p.topic,
                p.partition,
                p.segments,
                p.from_offset,
                p.previous is None,
                delta_budget(p.previous, settings),
            )
            for p in single
        ]
        written = compact.fold_in_one_task(spark, settings.store, tasks, settings.rows_per_file)
        for p, done in zip(single, written, strict=True):
            part = (p.topic, p.partition)
            if done.kind == MERGE:  # too many changes for a delta: merged by the Spark path
                rest.append(p)
                found.read_twice.add(part)
                continue
            found.stats[part] = done.stats
            if done.stats.undecided is not None:
                found.cuts[part] = done.stats.undecided
            if done.horizon is not None:
                found.horizons[part] = done.horizon
                found.rows[part] = done.rows
                if done.kind == DELTA:
                    found.deltas.add(part)
        phases["one_task"] = time.monotonic() - clock
    if rest:
        _through_spark(spark, settings, rest, progress, phases, found)
    created_at = now_iso()
    outcomes = []
    for p in plans:
        name = (p.topic, p.partition)
        s = found.stats.get(name)
        horizon = found.horizons.get(name)
        manifest = None
        bytes_read = sum(segment.size for segment in p.segments) * (
            2 if name in found.read_twice else 1
        )
        if s is not None and horizon is not None:
            delta = name in found.deltas
            files = tuple(
                written_files(
                    store,
                    p.topic,
                    p.partition,
                    horizon,
                    found.rows.get(name, 0),
                    settings.rows_per_file,
                    delta,
                )
            )
            if p.previous is not None and not delta:
                bytes_read += sum(f.bytes for x in p.previous.all_layers for f in x.files)
            manifest = Manifest(
                topic=p.topic,
                partition=p.partition,
                horizon=horizon,
                last_segment=_last_segment(p, found.cuts.get(name)),
                previous_horizon=p.previous.horizon if p.previous else None,
                files=files,
                rows=sum(f.rows for f in files),
                records_in=s.records_in,
                tombstones_dropped=s.tombstones,
                keyless_skipped=s.keyless,
                corrupt_batches=len(s.corrupt),
                created_at=created_at,
                schema_version=LAYERED_SCHEMA_VERSION if delta else SCHEMA_VERSION,
                delta=delta,
                layers=p.previous.all_layers if delta and p.previous else (),
            )
        outcomes.append(
            Outcome(
                p,
                s.records_in if s else 0,
                s.keyless if s else 0,
                s.tombstones if s else 0,
                s.corrupt if s else (),
                manifest,
                bytes_read,
                s.aborted if s else 0,
            )
        )
    return outcomes


def _through_spark(
    spark: Any,
    settings: CompactionSettings,
    plans: Sequence[PartitionPlan],
    progress: Progress,
    phases: dict[str, float],
    found: _Found,
) -> None:
    """The Spark fold of `plans`' new records (compact.py), their counts, then their files."""
    from headwater.spark_compaction import compact

    clock = time.monotonic()
    segments = [s for p in plans for s in p.segments]
    from_offsets = {f"{p.topic}/{p.partition}": p.from_offset for p in plans}
    progress(f"reading {len(segments)} segments of {len(plans)} partitions")
    wal = compact.read_wal(spark, settings.store, segments, from_offsets, settings.group_bytes)
    groups = compact.persisted(compact.fold(wal))
    merged = redone = None
    try:
        stats = {(s.topic, s.partition): s for s in compact.partition_stats(groups)}
        # a partition whose segments end inside a transaction stops at its first offset (the
        # LSO of what was uploaded); read again up to there if a later task folded past it
        cuts = {n: s.undecided for n, s in stats.items() if s.undecided is not None}
        again = [
            p
            for p in plans
            if (p.topic, p.partition) in cuts
            and cuts[(p.topic, p.partition)] < _last_task_start(p, settings)
        ]
        if again:
            progress(f"reading {len(again)} partitions again, up to their open transactions")
            redone = compact.persisted(compact.fold(_read_again(spark, settings, again, cuts)))
            stats.update({(s.topic, s.partition): s for s in compact.partition_stats(redone)})
            groups = compact.replaced(groups, redone, _names((p.topic, p.partition) for p in again))
        found.stats.update(stats)
        found.cuts.update(cuts)
        found.read_twice.update((p.topic, p.partition) for p in again)
        horizons: dict[tuple[str, int], int] = {}
        deltas: set[tuple[str, int]] = set()  # a delta layer over the previous snapshot
        fresh: set[tuple[str, int]] = set()  # a first snapshot: the WAL's winners
        remerged: list[PartitionPlan] = []  # a full snapshot: the winners folded with the layers
        rows: dict[tuple[str, int], int] = {}  # rows each partition's files will hold
        for p in plans:
            part = (p.topic, p.partition)
            known = stats.get(part)
            if known is None or known.records_in == 0 or known.max_offset is None:
                continue
            end = cuts.get(part, max(known.max_offset + 1, p.from_offset))
            if end <= p.from_offset:
                continue  # an open transaction where the previous snapshot ends: nothing new
            horizons[part] = end
            if takes_delta(p.previous, known.live + known.tombstones, settings):
                deltas.add(part)
                rows[part] = known.live + known.tombstones
            elif p.previous is None:
                fresh.add(part)
                rows[part] = known.live
            else:
                remerged.append(p)
        to_write = [
            compact.winners(groups, _names(deltas), deletions=True),
            compact.winners(groups, _names(fresh), deletions=False),
        ]
        if remerged:
            progress(f"merging {len(remerged)} partitions with their snapshots")
            parts = _names((p.topic, p.partition) for p in remerged)
            layers = [
                f for p in remerged if p.previous for x in p.previous.all_layers for f in x.files
            ]
            records = compact.as_records(compact.winners(groups, parts, deletions=True))
            below = compact.read_layers(spark, settings.store, layers)
            merged = compact.persisted(compact.fold(records.unionByName(below)))
            for known in compact.partition_stats(merged):
                rows[(known.topic, known.partition)] = known.live
            to_write.append(compact.winners(merged, parts, deletions=False))
        phases["read_and_fold"] = time.monotonic() - clock
        clock = time.monotonic()
        progress(f"writing snapshots of {len(horizons)} partitions ({len(deltas)} deltas)")
        tasks = int(spark.conf.get("spark.sql.shuffle.partitions"))
        everything = functools.reduce(lambda a, b: a.unionByName(b), to_write)
        compact.write(everything, settings.store, horizons, deltas, settings.rows_per_file, tasks)
        found.horizons.update(horizons)
        found.deltas.update(deltas)
        found.rows.update(rows)
        phases["write"] = time.monotonic() - clock
    finally:
        for frame in (groups, redone, merged):
            if frame is not None:
                frame.unpersist()


def _one_group(p: PartitionPlan, settings: CompactionSettings) -> bool:
    """Whether the partition's new segments make one reading task (`group_segments`)."""
    return len(group_segments(p.segments, settings.group_bytes)) == 1


def _names(parts: Iterable[tuple[str, int]]) -> set[str]:
    return {f"{topic}/{partition}" for topic, partition in parts}


def _last_task_start(p: PartitionPlan, settings: CompactionSettings) -> int:
    """Where the last Spark task reading the partition's segments begins (`group_segments`, as
    the `headwater_wal` source groups them)."""
    return group_segments(p.segments, settings.group_bytes)[-1][0].base_offset


def _read_again(
    spark: Any,
    settings: CompactionSettings,
    plans: Sequence[PartitionPlan],
    cuts: dict[tuple[str, int], int],
) -> Any:
    """The partitions' new records below their cuts, folded within each reading task."""
    from headwater.spark_compaction import compact

    return compact.read_wal(
        spark,
        settings.store,
        [s for p in plans for s in p.segments],
        {f"{p.topic}/{p.partition}": p.from_offset for p in plans},
        settings.group_bytes,
        {f"{p.topic}/{p.partition}": cuts[(p.topic, p.partition)] for p in plans},
    )


def _last_segment(p: PartitionPlan, cut: int | None) -> int:
    """The base offset of the newest segment the snapshot folded whole: the next run reads the
    segments past it. Below an open transaction's `cut`, the segment holding the cut is read
    again (and the earlier run's `last_segment` kept if that is the first new one)."""
    if cut is None:
        return p.segments[-1].base_offset
    kept = p.previous.last_segment if p.previous else -1
    for segment, after in itertools.pairwise(p.segments):
        if after.base_offset <= cut:
            kept = segment.base_offset
    return kept


def commit(store: BlockingStore, outcomes: Sequence[Outcome]) -> list[Manifest]:
    """Write each new manifest unless a manifest at or past its horizon exists already."""
    committed = []
    for outcome in outcomes:
        manifest = outcome.manifest
        if manifest is None:
            continue
        prefix = partition_prefix(manifest.topic, manifest.partition)
        existing = manifest_horizons(store.list(prefix))
        if existing and existing[-1] >= manifest.horizon:
            continue  # a rerun, or a concurrent run that got further: what is there stands
        key = manifest_key(manifest.topic, manifest.partition, manifest.horizon)
        if store.put_if_absent(key, manifest.encode()):
            committed.append(manifest)
    return committed


def apply_retention(
    store: BlockingStore, topics: Sequence[str], retention: float, now: float | None = None
) -> int:
    """Remove expired snapshots of `topics` (all when empty); returns how many objects went."""
    now = time.time() if now is None else now
    prefixes = [f"{ROOT}/{t}/" for t in sorted(set(topics))] or [f"{ROOT}/"]
    by_partition: dict[tuple[str, int], list[Any]] = {}
    for prefix in prefixes:
        for info in store.list(prefix):
            parts = info.key.split("/")
            if len(parts) >= 4 and parts[2].isdigit():
                by_partition.setdefault((parts[1], int(parts[2])), []).append(info)
    removed = 0
    for (topic, partition), listing in sorted(by_partition.items()):
        keys = manifest_keys(listing)
        if len(keys) < 2 and len(listing) == len(keys):
            continue  # one snapshot and nothing else: nothing can expire
        manifests = {horizon: Manifest.decode(key, store.get(key)) for horizon, key in keys.items()}
        doomed = retention_plan(topic, partition, listing, manifests, retention, now)
        for key in [*doomed.manifests, *doomed.files]:
            store.delete(key)
            removed += 1
    return removed


def run(
    session: Callable[[], Any], settings: CompactionSettings, progress: Progress | None = None
) -> Summary:
    """One run; `session` gives the Spark session, called only when there is something to read."""
    started = time.monotonic()
    report = progress or (lambda _: None)
    summary = Summary()
    phases = summary.phases
    with BlockingStore(settings.store) as store:
        report(f"listing {settings.store.describe()}")
        plans = plan(store, settings)
        phases["plan"] = time.monotonic() - started
        if plans:
            clock = time.monotonic()
            spark = session()
            phases["spark_start"] = time.monotonic() - clock
            outcomes = compute(spark, store, settings, plans, report, phases)
        else:
            outcomes = []
        report("committing manifests")
        clock = time.monotonic()
        committed = commit(store, outcomes)
        phases["commit"] = time.monotonic() - clock
        report("removing expired snapshots")
        clock = time.monotonic()
        summary.removed_objects = apply_retention(store, settings.topics, settings.retention)
        phases["retention"] = time.monotonic() - clock
    summary.segments = sum(len(p.segments) for p in plans)
    for outcome in outcomes:
        summary.records_in += outcome.records_in
        summary.tombstones_dropped += outcome.tombstones
        summary.keyless_skipped += outcome.keyless
        summary.aborted_skipped += outcome.aborted
        summary.corrupt.extend(outcome.corrupt)
        summary.bytes_read += outcome.bytes_read
        if outcome.manifest is not None:
            summary.bytes_written += sum(f.bytes for f in outcome.manifest.files)
    summary.corrupt_batches = len(summary.corrupt)
    for manifest in committed:
        summary.keys_out += manifest.rows
        summary.snapshots.append(
            {
                "topic": manifest.topic,
                "partition": manifest.partition,
                "horizon": manifest.horizon,
                "rows": manifest.rows,
                "files": len(manifest.files),
                "delta": manifest.delta,
                "layers": len(manifest.all_layers),
            }
        )
    summary.seconds = time.monotonic() - started
    return summary
