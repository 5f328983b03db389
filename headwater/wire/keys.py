"""Where a keyed record goes, and the map revision sentinels: shared by clients and server.

A keyed record belongs to partition `crc32(key) % partitions` (zlib's CRC-32, the IEEE polynomial,
of the key bytes as sent; unsigned). Clients in any language route the same way, and on last-value
and map topics the server refuses a keyed record sent elsewhere (WRONG_PARTITION), which is what
keeps a key's revisions unique and compare-and-set sound.

A map revision is the offset of the record that wrote the value. Compare-and-set names the
revision it expects, or one of the two sentinels below.
"""

from __future__ import annotations

import zlib
from typing import Final

# MAP_SET expected_revision: apply whatever the key's current revision is.
ANY_REVISION: Final = -1
# MAP_SET expected_revision: apply only if the key does not exist (create).
ABSENT_REVISION: Final = -2


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition a keyed record belongs to."""
    return zlib.crc32(key) % partitions
