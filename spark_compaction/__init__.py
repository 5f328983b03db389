"""The PySpark job that rewrites WAL segments in object storage into per-key snapshots. Empty until
reliable dispatch uploads segments; imports `wire` and `storage`."""
