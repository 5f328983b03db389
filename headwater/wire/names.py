"""Validation of names that travel on the wire: topics, subscriptions, consumers.

Limits are in bytes of UTF-8, not characters: a topic name becomes a directory and object-key
name (file systems cap a name at 255 bytes), and subscription names are part of state-store keys.
Topic names are ASCII anyway; a subscription name of multi-byte characters reaches its limit in
fewer characters.

A dead-letter topic's name is derived from its topic and subscription by `dead_letter_topic`,
which the server and clients share: `<topic>-<subscription, readable>-<16 hex digits>-DLQ`. The
digits are a SHA-256 of the exact topic and subscription names, so two subscriptions whose
readable forms agree (`bob/sub` and `bob_sub`), or whose names are cut to fit 249 bytes, get
different topics; the name always ends in `-DLQ` and is never its own topic's. Names of that
shape are reserved (`is_dead_letter_name`): CREATE_TOPIC refuses them, so only the server
creates a dead-letter topic, and no principal can claim the name another's subscription will use.
"""

from __future__ import annotations

import hashlib
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


DEAD_LETTER_SUFFIX: Final = "-DLQ"
_DIGEST_HEX: Final = 16  # 64 bits of SHA-256: no two subscriptions' names meet by chance
_DEAD_LETTER_NAME: Final = re.compile(r"[A-Za-z0-9._-]*-[0-9a-f]{16}-DLQ")
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]")


def dead_letter_topic(topic: str, subscription: str) -> str:
    """The dead-letter topic of `subscription` on `topic` (module docstring)."""
    exact = f"{topic}\0{subscription}".encode("utf-8", "surrogatepass")
    tail = f"-{hashlib.sha256(exact).hexdigest()[:_DIGEST_HEX]}{DEAD_LETTER_SUFFIX}"
    readable = f"{topic}-{_UNSAFE.sub('_', subscription)}"
    return readable[: MAX_TOPIC_NAME_LENGTH - len(tail)] + tail


def is_dead_letter_name(name: str) -> bool:
    """Whether `name` has the shape only dead-letter topics may have."""
    return _DEAD_LETTER_NAME.fullmatch(name) is not None


def check_name(kind: str, name: str) -> None:
    """Subscription and consumer names: non-empty, printable, bounded in bytes."""
    if not name:
        raise InvalidRequest(f"{kind} name is empty")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_LENGTH:
        raise InvalidRequest(f"{kind} name is {size} bytes, the limit is {MAX_NAME_LENGTH} bytes")
    if not name.isprintable():
        raise InvalidRequest(f"{kind} name {name!r} contains non-printable characters")
