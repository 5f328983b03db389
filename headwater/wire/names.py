"""Validation of names that travel on the wire: topics, subscriptions, consumers.

Limits are in bytes of UTF-8, not characters: a topic name becomes a directory and object-key
name (file systems cap a name at 255 bytes), and subscription names are part of state-store keys.
Topic names are ASCII anyway; a subscription name of multi-byte characters reaches its limit in
fewer characters.
"""

from __future__ import annotations

import re
from typing import Final

from headwater.wire.errors import InvalidRequest, InvalidTopicName
from headwater.wire.limits import MAX_NAME_LENGTH, MAX_TOPIC_NAME_LENGTH

# Kafka's alphabet: safe in file names, object keys and URLs without escaping.
_TOPIC_NAME: Final = re.compile(r"[A-Za-z0-9._-]+")


def check_topic_name(name: str) -> None:
    if not name:
        raise InvalidTopicName("topic name is empty")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicName(
            f"topic name is {size} bytes, the limit is {MAX_TOPIC_NAME_LENGTH} bytes"
        )
    if name in (".", ".."):
        raise InvalidTopicName(f"topic name {name!r} is reserved")
    if not _TOPIC_NAME.fullmatch(name):
        raise InvalidTopicName(
            f"topic name {name!r} may contain only ASCII letters, digits, '.', '_' and '-'"
        )


def check_name(kind: str, name: str) -> None:
    """Subscription and consumer names: non-empty, printable, bounded in bytes."""
    if not name:
        raise InvalidRequest(f"{kind} name is empty")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_LENGTH:
        raise InvalidRequest(f"{kind} name is {size} bytes, the limit is {MAX_NAME_LENGTH} bytes")
    if not name.isprintable():
        raise InvalidRequest(f"{kind} name {name!r} contains non-printable characters")
