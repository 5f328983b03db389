"""Kafka topic ids (KIP-516) of Headwater topics: Metadata v10+ names each topic's id, and the
consumer group protocol (KIP-848) assigns partitions by topic id.

Headwater topics have no id of their own, so a topic's id is the UUID-5 of its name in a fixed
namespace: every broker of a cluster answers the same id without storing one, and it never
changes while the topic lives. A topic deleted and created again under the same name has the same
id (Kafka would give it a new one), so a client does not see the recreation through the id; it
sees the offsets it had go out of range, as with a topic truncated. `TopicIds` maps ids back to
the names they are of (Metadata by id, a heartbeat's owned partitions).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Collection
from typing import Final

NAMESPACE: Final = uuid.UUID("6f1d6a52-2f0b-4d53-9a4b-6865616477a7")
ZERO: Final = bytes(16)  # Kafka's "no topic id"


@functools.lru_cache(maxsize=65_536)
def topic_id(name: str) -> bytes:
    """The 16 bytes of `name`'s topic id (never the zero id: UUID-5 sets version bits)."""
    return uuid.uuid5(NAMESPACE, name).bytes


class TopicIds:
    """Topic id -> name over the topics `names` lists now, rebuilt when an id is not found."""

    def __init__(self, names: Callable[[], Collection[str]]) -> None:
        self._names = names
        self._by_id: dict[bytes, str] = {}

    def name(self, wanted: bytes) -> str | None:
        """The name of the topic with this id, None if no topic has it."""
        found = self._by_id.get(wanted)
        names = self._names()
        if found is not None and found in names:
            return found
        self._by_id = {topic_id(name): name for name in names}
        return self._by_id.get(wanted)
