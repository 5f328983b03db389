"""Kafka topic ids (KIP-516): the 16-byte uuid newer Kafka APIs name a topic by (Metadata from v10,
the share group APIs), derived from the topic's name.

Headwater topics have no id of their own, so a topic's id is the name-based uuid (uuid5) of its
name under a fixed namespace: every broker of a cluster, and every restart, gives a topic the same
id without storing or agreeing on anything. The cost: a topic deleted and made again under the
same name keeps its id, so a client cannot tell the two apart by id (docs/DECISIONS.md). `TopicIds`
maps ids back to names over the topics that exist now, computing each name's id once.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Final

# the namespace of Headwater's topic ids (any fixed uuid: it only keeps them apart from other
# name-based uuids)
NAMESPACE: Final = uuid.UUID("5f0c8c2e-8f3b-4a53-9a59-2a6b1d7e4c11")
ZERO: Final = bytes(16)


def topic_id(name: str) -> bytes:
    """The topic's id: 16 bytes, never the zero uuid (which Kafka reads as "no id")."""
    return uuid.uuid5(NAMESPACE, name).bytes


class TopicIds:
    """Ids of the topics `topics()` holds (the catalog's, read at each call), and names by id."""

    def __init__(self, topics: Callable[[], Mapping[str, object]]) -> None:
        self._topics = topics
        self._ids: dict[str, bytes] = {}
        self._names: dict[bytes, str] = {}

    def id_of(self, name: str) -> bytes:
        found = self._ids.get(name)
        if found is None:
            found = self._ids[name] = topic_id(name)
            self._names[found] = name
        return found

    def name_of(self, topic: bytes) -> str | None:
        """The existing topic with this id, None when there is none."""
        topics = self._topics()
        name = self._names.get(topic)
        if name is None:
            for known in list(topics):  # a topic not seen yet: learn every name's id
                if known not in self._ids:
                    self.id_of(known)
            name = self._names.get(topic)
        return name if name is not None and name in topics else None
