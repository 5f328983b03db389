"""Bytes at rest: the WAL (segments, group commit, recovery, reads past damage), the object store
(local directory and S3) and uploads, a cluster's cloud tail (`cloud_tail`) and partition
manifests (`partition_manifest`), RocksDB state (`state`, with the group-committing
`StateWriter`) and the last-value store. Imports `wire` only."""
