"""The Arrow schemas of snapshot files (pyarrow), apart from their layout and manifests.

`storage.snapshots` names, lists and commits snapshots and is imported by the server at start-up;
importing pyarrow costs about 0.4 s of CPU, and a server reads a snapshot file only when a topic
has one. So the schema lives here and is imported where files are read or written: by the
snapshot readers' functions when they first run, and by the compaction job. SCHEMA_VERSION
(in `storage.snapshots`, written into every manifest) changes whenever SNAPSHOT_SCHEMA does.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

HEADER_TYPE: Final = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE: Final = pa.list_(pa.field("element", HEADER_TYPE))
SNAPSHOT_SCHEMA: Final = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("key", pa.binary(), nullable=False),
        pa.field("value", pa.binary(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("headers", HEADERS_TYPE, nullable=False),
    ]
)
# A delta layer's files (`delta-NNNNN.parquet`): the keys a run changed, deletions included, so
# `value` is null for a key the run deleted; every other column as in a full snapshot.
DELTA_SCHEMA: Final = SNAPSHOT_SCHEMA.set(
    SNAPSHOT_SCHEMA.get_field_index("value"), pa.field("value", pa.binary(), nullable=True)
)
