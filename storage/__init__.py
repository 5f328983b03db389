"""Bytes at rest: RocksDB state (topic metadata today); WAL segments, recovery and the object store
(local directory and S3) arrive with reliable dispatch. Imports `wire` only."""
