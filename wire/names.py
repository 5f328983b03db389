"""Validation of names that travel on the wire: topics, subscriptions, consumers."""

from __future__ import annotations

import re
from typing import Final

from wire.errors import InvalidRequest, InvalidTopicName
from wire.limits import MAX_NAME_LENGTH, MAX_TOPIC_NAME_LENGTH

# Kafka's alphabet: safe in file names, object keys and URLs without escaping.
_TOPIC_NAME: Final = re.compile(r"[A-Za-z0-9._-]+")


def check_topic_name(name: str) -> None:
    if not name:
        raise InvalidTopicName("topic name is empty")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicName(
            f"topic name is {len(name)} characters, the limit is {MAX_TOPIC_NAME_LENGTH}"
        )
    if name in (".", ".."):
        raise InvalidTopicName(f"topic name {name!r} is reserved")
    if not _TOPIC_NAME.fullmatch(name):
        raise InvalidTopicName(
            f"topic name {name!r} may contain only ASCII letters, digits, '.', '_' and '-'"
        )


def check_name(kind: str, name: str) -> None:
    """Subscription and consumer names: non-empty, printable, bounded."""
    if not name:
        raise InvalidRequest(f"{kind} name is empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidRequest(
            f"{kind} name is {len(name)} characters, the limit is {MAX_NAME_LENGTH}"
        )
    if not name.isprintable():
        raise InvalidRequest(f"{kind} name {name!r} contains non-printable characters")
