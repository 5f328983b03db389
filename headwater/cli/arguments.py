"""Command-line text that the wire cannot carry, refused before anything connects; and the
`--key-encoding`/`--value-encoding` of produce and map.

A shell passes bytes; Python turns argument bytes that are not UTF-8 into lone surrogates
("surrogateescape"), which no name, key or value on the wire can hold (names are UTF-8 text). Every
command checks its arguments with `not_utf8` first and says which one, with the code the server
would have used (INVALID_TOPIC_NAME for a topic, INVALID_REQUEST for the rest), instead of failing
in the middle of a request. Binary keys and values travel as base64 or hex text
(`--key-encoding`, `--value-encoding`). This module imports no client or server code: `serve`
uses it too.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import os
from pathlib import Path

from headwater.wire.errors import HeadwaterError, InvalidRequest, InvalidTopicName

ENCODINGS = ("utf8", "base64", "hex")
ENCODING_HELP = "utf8 (default), base64 or hex: how {what} are written on the command line"

# how an argument names itself in an error: its option (or its place), by its attribute name
_NAMES = {
    "values": "VALUE",
    "value": "VALUE",
    "key": "the key",
    "subscription": "the subscription name",
    "key_separator": "--key-separator",
    "key_prefix": "--key-prefix",
    "prefix": "--prefix",
    "header": "--header",
    "config": "--config",
    "server": "--server",
    "token": "--token",
}
# the attributes that are a topic's name (`name` only in the topic commands: consume's --name
# is the consumer's)
_TOPIC_FIELDS = {"topic"}


def shown(text: str) -> str:
    """An argument as the bytes the shell gave, for an error message: b'bad\\xffname'."""
    return repr(os.fsencode(text))


def is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def not_utf8(args: argparse.Namespace) -> HeadwaterError | None:
    """The error for the first argument that is not UTF-8 text, or None."""
    command = getattr(args, "command", None)
    for field, value in vars(args).items():
        items = value if isinstance(value, list | tuple) else [value]
        for item in items:
            if isinstance(item, Path):
                continue  # a file name: the operating system's bytes are fine
            if not isinstance(item, str) or is_utf8(item):
                continue
            if field in _TOPIC_FIELDS or (field == "name" and command == "topic"):
                return InvalidTopicName(
                    f"topic name {shown(item)} is not UTF-8: topic names are UTF-8 text"
                )
            what = _NAMES.get(field, "--" + field.replace("_", "-"))
            hint = ""
            if field in ("key", "values", "value"):
                option = "--key-encoding" if field == "key" else "--value-encoding"
                hint = f" (for binary data give it as base64 or hex with {option})"
            return InvalidRequest(f"{what} {shown(item)} is not UTF-8{hint}")
    return None


def decode(data: bytes, encoding: str, what: str, option: str = "--value-encoding") -> bytes:
    """`data` as written on the command line in `encoding` (`option`'s value): the bytes it
    stands for. INVALID_REQUEST when it is not valid in that encoding (UTF-8 text included)."""
    try:
        if encoding == "base64":
            return base64.b64decode(data.strip(), validate=True)
        if encoding == "hex":
            return bytes.fromhex(data.decode("ascii"))
        data.decode()  # utf8: sent as is, but it must be text
        return data
    except (binascii.Error, ValueError):
        if encoding == "utf8":
            hint = f" (for binary data give it as base64 or hex with {option})"
            raise InvalidRequest(f"{what} {data[:80]!r} is not UTF-8{hint}") from None
        raise InvalidRequest(f"{what} {data[:80]!r} is not {encoding} ({option})") from None


def encode(data: bytes, encoding: str) -> str:
    """Bytes as text in `encoding`, for printing; utf8 prints bytes that are not UTF-8 with
    backslash escapes (which the base64 and hex encodings never need)."""
    if encoding == "base64":
        return base64.b64encode(data).decode()
    if encoding == "hex":
        return data.hex()
    return data.decode(errors="backslashreplace")
