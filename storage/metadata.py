"""Topic metadata in RocksDB (rocksdict), under `<data_dir>/state`.

One key per topic, `topic/<name>`, holding the topic's settings as JSON. RocksDB's own write-ahead
log makes each put durable against a process crash; topic changes are rare, so the synchronous
calls are fine on the event loop. Later state (cursors, acks, last values) shares this database,
each kind under its own key prefix.
"""

from __future__ import annotations

import json
from pathlib import Path

from rocksdict import Options, Rdict

from wire.messages import TopicInfo

_TOPIC_PREFIX = b"topic/"


class MetadataStore:
    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self._db = Rdict(str(path), options)

    def save_topic(self, topic: TopicInfo) -> None:
        value = {"partitions": topic.partitions, "dispatch": topic.dispatch}
        self._db[_TOPIC_PREFIX + topic.name.encode()] = json.dumps(value).encode()

    def delete_topic(self, name: str) -> None:
        del self._db[_TOPIC_PREFIX + name.encode()]

    def load_topics(self) -> list[TopicInfo]:
        topics = []
        iterator = self._db.iter()
        iterator.seek(_TOPIC_PREFIX)
        while iterator.valid() and iterator.key().startswith(_TOPIC_PREFIX):
            name = iterator.key()[len(_TOPIC_PREFIX) :].decode()
            settings = json.loads(iterator.value())
            topics.append(TopicInfo(name, settings["partitions"], settings["dispatch"]))
            iterator.next()
        return topics

    def close(self) -> None:
        self._db.close()
