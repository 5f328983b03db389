"""Topics and partitions: `topic` (the non-reliable publish path and the reliable append path),
`catalog` (every topic's files, state and lifecycle, opened a few at a time by `bounded`),
`topic_settings`, `housekeeping` (age-based rolling and local retention), `lastvalue_index` (a
topic's last value per key) and `idempotent_producers` (producer ids and their recent batches)."""
