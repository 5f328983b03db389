"""Housekeeping of reliable topics, once a second: age-based rolling and local retention.

Rolling an active segment once it reaches `segment.ms` bounds how far object-store uploads lag
behind. Retention deletes the oldest sealed segments past `retention.bytes` or `retention.ms`, but
only segments already uploaded (or any sealed segment when no object store is configured): what
exists only here is never deleted. The pass is synchronous, so it sees each topic either whole or
already removed by a delete.
"""

from __future__ import annotations

import time

import structlog

from headwater.server.topics.topic import Topic
from headwater.storage.uploader import Uploader

log = structlog.get_logger(__name__)

HOUSEKEEPING_INTERVAL = 1.0


def housekeep_once(topics: dict[str, Topic], uploader: Uploader | None) -> None:
    now = time.time()
    for topic in list(topics.values()):
        if not topic.reliable:
            continue
        settings = topic.settings
        for partition in topic.partitions:
            partition_log = partition.log
            partition_log.roll_if_old()
            sealed = partition_log.sealed_segments()
            total = partition_log.size
            for segment in sealed:
                too_big = 0 <= settings.retention_bytes < total
                age_ms = (now - segment.path.stat().st_mtime) * 1000
                too_old = 0 <= settings.retention_ms < age_ms
                if not (too_big or too_old):
                    break
                if uploader is not None and not uploader.holds(
                    topic.name, partition.index, segment.base_offset, segment.next_offset
                ):
                    break  # never delete what only exists here
                if partition_log.delete_segment(segment.base_offset):
                    total -= segment.size
                    log.info(
                        "retention.deleted",
                        topic=topic.name,
                        partition=partition.index,
                        base_offset=segment.base_offset,
                    )
