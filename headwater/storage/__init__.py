"""Bytes at rest. Imports `wire` only.

The WAL of a partition: `wal` (append, group commit, roll, read), `logstate` (its in-memory model),
`segments` (segment files: naming, scanning, resynchronising past damage, the index), `reader`
(reading batches back past damage), `log_reader` (the one damage-aware read path of every reader:
the archive's copy of a damaged batch, else a logged skip), `recovery` (what is on disk at open,
where offsets continue), `offsets` (the offset lease), `syncer` (each partition's fsyncs, seals,
deletions and lease writes, one job at a time on a pool of their own) and `fileio` (the one seam
to the file system, where faults are injected), `latency` (a histogram cheap enough for hot
paths), `tasks` (background tasks: started with their failures logged, ended by every close and
stop, here and in the server). The object store: `objectstore` (local directory and S3),
`uploader` (shipping sealed segments), `archive` (reading history back from it), `cloud_tail` (a
cluster's newest batches as small objects), `partition_manifest` (a cluster partition's segments,
versioned by conditional PUT), `snapshots` (per-key snapshots and their manifests) and
`snapshot_schema` (their files' Arrow schema, apart so that pyarrow is imported only when a file is
read or written).
RocksDB: `state` (server state, with the group-committing `StateWriter`), `lastvalue_store` (a
topic's last value per key) and `known_keys` (keys known to exist, which spare the key count a
lookup)."""
