"""Spark compaction: rewrite the WAL segments in the object store into per-key Parquet snapshots.

Modules: `store` (object-store access from executors), `wal_segments` (finding and decoding segment
objects), `schema` (row shapes), `source` (the `headwater_wal` and `headwater_snapshot` Spark data
sources), `stream` (the `headwater` Structured Streaming source over a live topic), `sink` (the
`headwater` sink: `df.write` and `writeStream` into a topic), `compact` (the fold in Spark),
`one_task` (a partition read, folded and written by one task), `writer` (Parquet files),
`manifest` (names, commit, retention), `job` (one run), `session` (the Spark session),
`worker_daemon` (PySpark's worker daemon, the workers' imports done once), `standalone` (a
standalone master and workers on this machine, from the pyspark wheel), `loader` (reading a
snapshot back without Spark, for the server), `history` (synthetic WAL histories for tests and
benchmarks). Imports `wire`, `storage` and `client`; pyspark is imported by `source`, `stream`,
`sink`, `compact`, `session`, `standalone` and `worker_daemon`, which nothing outside the job
imports. docs/COMPACTION.md describes the format and the job."""
