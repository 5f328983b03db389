"""The two row shapes of compaction, as Arrow schemas and Spark DDL: WAL rows and snapshot rows.

WAL rows are what the `headwater_wal` data source yields, one per record of a segment object (plus
one per corrupt stretch of a segment, with only `topic`, `partition` and `corrupt` set). The
streaming source's rows are WAL rows without `corrupt`. Their Arrow schema must equal, field for
field, what Spark derives from `WAL_DDL` (`STREAM_DDL`; pyspark checks it before it accepts an
Arrow batch from a data source); tests/test_spark_reader.py checks that.

Snapshot rows are the Parquet files the job writes (docs/COMPACTION.md documents them): one row
per live key of a partition, sorted by key, tombstones and keyless records already gone; a delta
layer's files (DELTA_SCHEMA) hold the keys a run changed, with a null value for a deletion.
`SCHEMA_VERSION` goes into every manifest and changes whenever this file changes the Parquet
schema, so a reader can refuse a snapshot it does not understand.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

# the snapshot schema is read by the server too, so it lives in storage
from headwater.storage.snapshot_schema import (
    DELTA_SCHEMA,
    HEADER_TYPE,
    HEADERS_TYPE,
    SNAPSHOT_SCHEMA,
)
from headwater.storage.snapshots import SCHEMA_VERSION

__all__ = [
    "DELTA_SCHEMA",
    "FOLDED_DDL",
    "FOLDED_SCHEMA",
    "HEADERS_TYPE",
    "HEADER_TYPE",
    "SCHEMA_VERSION",
    "SNAPSHOT_SCHEMA",
    "STREAM_DDL",
    "STREAM_SCHEMA",
    "WAL_DDL",
    "WAL_SCHEMA",
]

WAL_SCHEMA: Final = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.int64()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADERS_TYPE),
        pa.field("corrupt", pa.string()),
    ]
)
WAL_DDL: Final = (
    "topic string, partition int, offset bigint, timestamp bigint, key binary, value binary, "
    "headers array<struct<key: string, value: binary>>, corrupt string"
)

# The streaming source's rows (`headwater` in spark.readStream): WAL rows without `corrupt`, since
# the server's read path gets past damage itself (and logs it, `topic.data_skipped`).
STREAM_SCHEMA: Final = pa.schema(list(WAL_SCHEMA)[:-1])
STREAM_DDL: Final = WAL_DDL.removesuffix(", corrupt string")

# `fold=true` rows: WAL rows already folded within one Spark task, with `records`, the number of
# WAL records each row stands for (a key's winner: that key's records; the key-null row: the
# keyless records; a corrupt stretch: 0), and, set only on each task's one row about itself
# (wal_segments.info_batch), `aborted` (records of aborted transactions left out) and `undecided`
# (where a transaction still open begins).
FOLDED_SCHEMA: Final = (
    WAL_SCHEMA.append(pa.field("records", pa.int64()))
    .append(pa.field("aborted", pa.int64()))
    .append(pa.field("undecided", pa.int64()))
)
FOLDED_DDL: Final = WAL_DDL + ", records bigint, aborted bigint, undecided bigint"
