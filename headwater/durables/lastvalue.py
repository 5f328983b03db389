"""The last value per key of a topic: which keys a batch changes, and to what (no I/O).

Each record of a topic with last-value state is applied in offset order: a record with a value
becomes its key's current value (its offset is the key's *revision*); a record with a key and a
null value (a tombstone) deletes the key; a record without a key is not part of the state. The
key is the record key, or, when the topic names a key field, that field of the record's JSON
value (dotted paths reach into nested objects).

`KeyedBatch` plans what a batch does to the state: the newest record per key, as the bytes to
store for a key with a value and as a deletion for a tombstone. It reads the batch as parallel
columns (keys, values, timestamps, headers), so a map set, which has its keys and values already,
never builds a `Record` or a `StoredValue` per write; `StoredValue`s are built only for the
last-value subscriptions told of the changes. `storage.lastvalue_store` writes the plan to
RocksDB, with the partition's position, in one WriteBatch; `server.topics.lastvalue_index.
LastValueIndex` joins the two.

A key's revision is an offset, unique only within a partition, so on a topic with last-value
state a keyed record belongs to its key's partition, `crc32(key) % partitions` (what the client's
producer and map set use): `check` refuses any other with WRONG_PARTITION. Compare-and-set then
compares revisions of one partition, where no two records share an offset.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from headwater.wire.errors import InvalidRequest, WrongPartition
from headwater.wire.keys import partition_for_key
from headwater.wire.limits import MAX_KEY_SIZE
from headwater.wire.records import Record

_HEAD = struct.Struct(">iqqi")  # partition, offset, timestamp, value length (-1: null)
_HEADER = struct.Struct(">Hi")  # header name length, value length (-1: null)
_HEADER_COUNT = struct.Struct(">H")
_NO_HEADERS = _HEADER_COUNT.pack(0)

Headers = tuple[tuple[str, bytes | None], ...]


def encode_stored(
    partition: int,
    offset: int,
    timestamp: int,
    value: bytes,
    headers: Sequence[tuple[str, bytes | None]] = (),
) -> bytes:
    """The bytes a key's value is stored as (what `StoredValue.decode` reads back)."""
    if not headers:
        return _HEAD.pack(partition, offset, timestamp, len(value)) + value + _NO_HEADERS
    parts = [
        _HEAD.pack(partition, offset, timestamp, len(value)),
        value,
        _HEADER_COUNT.pack(len(headers)),
    ]
    for name, data in headers:
        encoded = name.encode()
        parts.append(_HEADER.pack(len(encoded), -1 if data is None else len(data)))
        parts.append(encoded + (data or b""))
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class StoredValue:
    key: bytes
    partition: int
    offset: int  # the revision
    timestamp: int
    value: bytes | None  # None only in changes (notifications, a transaction's): deleted
    headers: tuple[tuple[str, bytes | None], ...] = ()

    def encode(self) -> bytes:
        """As stored; a deletion (a transaction's held tombstone) with value length -1."""
        if self.value is None:
            return _HEAD.pack(self.partition, self.offset, self.timestamp, -1) + _NO_HEADERS
        return encode_stored(self.partition, self.offset, self.timestamp, self.value, self.headers)

    @staticmethod
    def decode_head(data: bytes) -> tuple[int, int, int, bytes]:
        """(partition, offset, timestamp, value) of stored data, headers left unread: what a
        map get answers, without building a StoredValue per key."""
        partition, offset, timestamp, length = _HEAD.unpack_from(data, 0)
        return partition, offset, timestamp, data[_HEAD.size : _HEAD.size + length]

    @classmethod
    def decode(cls, stored_key: bytes, data: bytes) -> StoredValue:
        partition, offset, timestamp, length = _HEAD.unpack_from(data, 0)
        position = _HEAD.size
        value = None if length < 0 else data[position : position + length]
        position += max(length, 0)
        (count,) = _HEADER_COUNT.unpack_from(data, position)
        position += 2
        headers: list[tuple[str, bytes | None]] = []
        for _ in range(count):
            name_length, data_length = _HEADER.unpack_from(data, position)
            position += _HEADER.size
            name = data[position : position + name_length].decode()
            position += name_length
            if data_length < 0:
                headers.append((name, None))
            else:
                headers.append((name, data[position : position + data_length]))
                position += data_length
        return cls(stored_key, partition, offset, timestamp, value, tuple(headers))

    def as_record(self) -> Record:
        return Record(self.offset, self.timestamp, self.key, self.value, self.headers)


def check_key(key_bytes: bytes) -> None:
    if not key_bytes:
        raise InvalidRequest("a last-value key must not be empty")
    if len(key_bytes) > MAX_KEY_SIZE:
        raise InvalidRequest(f"key of {len(key_bytes)} bytes exceeds the {MAX_KEY_SIZE}-byte limit")


class LastValueKeys:
    """A topic's rule for last-value keys: which key a record has, which partition it belongs
    to, and what a batch changes."""

    def __init__(self, topic: str, partitions: int, key_field: str = "") -> None:
        self.topic = topic
        self.partitions = partitions
        self.key_field = key_field

    def partition_of(self, record_key: bytes) -> int:
        return partition_for_key(record_key, self.partitions)

    def partition_for(self, records: Sequence[Record]) -> int:
        """Where a batch sent with no partition named goes: its first keyed record's partition
        (`check` then refuses it if another keyed record belongs elsewhere)."""
        for record in records:
            record_key = self.key_of(record)
            if record_key is not None:
                return self.partition_of(record_key)
        return 0

    # Keys

    def key_of(self, record: Record) -> bytes | None:
        """The record's last-value key; raises InvalidRequest when it cannot have one."""
        if not self.key_field:
            if record.key is not None:
                check_key(record.key)
            return record.key
        if record.value is None:  # a tombstone names its key in the record key
            if record.key is None:
                raise InvalidRequest("a tombstone on a key-field topic needs a record key")
            check_key(record.key)
            return record.key
        try:
            document = json.loads(record.value)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise InvalidRequest(
                f"record at offset delta {record.offset} is not JSON; topic {self.topic!r} "
                f"takes its key from field {self.key_field!r}"
            ) from None
        found = document
        for part in self.key_field.split("."):
            if not isinstance(found, dict) or part not in found:
                raise InvalidRequest(
                    f"record at offset delta {record.offset} has no key field {self.key_field!r}"
                )
            found = found[part]
        if isinstance(found, dict | list) or found is None:
            raise InvalidRequest(f"key field {self.key_field!r} must be a string or a number")
        result = (found if isinstance(found, str) else json.dumps(found)).encode()
        check_key(result)
        return result

    def check(self, records: Sequence[Record], partition: int | None = None) -> list[bytes | None]:
        """Every record's key, before the batch is accepted into `partition` (raises on a bad
        key, and on a keyed record that belongs to another partition)."""
        keys = [self.key_of(record) for record in records]
        if partition is not None and self.partitions > 1:
            for record_key in keys:
                if record_key is not None and self.partition_of(record_key) != partition:
                    raise WrongPartition(
                        f"key {record_key[:64]!r} belongs to partition "
                        f"{self.partition_of(record_key)} of topic {self.topic!r} "
                        f"(crc32(key) % {self.partitions}), not {partition}: a last-value "
                        "topic keeps each key in one partition"
                    )
        return keys


@dataclass(frozen=True, slots=True)
class KeyedBatch:
    """A batch's records as last-value state reads them, as columns: record i has `keys[i]`
    (None: not part of the state), `values[i]` (None: a tombstone), `timestamps[i]` and
    `headers[i]` (`headers` None: no record has any). Appended at `base_offset`, record i is
    at offset `base_offset + i`."""

    keys: Sequence[bytes | None]
    values: Sequence[bytes | None]
    timestamps: Sequence[int]
    headers: Sequence[Headers] | None = None

    @classmethod
    def of_records(cls, records: Sequence[Record], keys: Sequence[bytes | None]) -> KeyedBatch:
        headers = [record.headers for record in records]
        return cls(
            keys,
            [record.value for record in records],
            [record.timestamp for record in records],
            headers if any(headers) else None,
        )

    def newest(self) -> dict[bytes, int]:
        """The position of each key's newest record (a later record of a key replaces an
        earlier one: in a dict built in order, the last position of a key is the one kept)."""
        latest: dict[bytes | None, int] = dict(zip(self.keys, range(len(self.keys)), strict=True))
        latest.pop(None, None)
        return latest  # type: ignore[return-value]  # None was just removed

    def plan(
        self, partition: int, base_offset: int, newest: dict[bytes, int]
    ) -> tuple[dict[bytes, bytes], list[bytes]]:
        """(key -> bytes to store, keys to delete) for the records at `newest`'s positions."""
        puts: dict[bytes, bytes] = {}
        deletes: list[bytes] = []
        values, timestamps, headers = self.values, self.timestamps, self.headers
        if headers is None:  # a map set's batch, and most produced ones: the encoding inline
            head = _HEAD.pack
            for record_key, position in newest.items():
                value = values[position]
                if value is None:
                    deletes.append(record_key)
                else:
                    puts[record_key] = (
                        head(partition, base_offset + position, timestamps[position], len(value))
                        + value
                        + _NO_HEADERS
                    )
            return puts, deletes
        for record_key, position in newest.items():
            value = values[position]
            if value is None:
                deletes.append(record_key)
            else:
                puts[record_key] = encode_stored(
                    partition,
                    base_offset + position,
                    timestamps[position],
                    value,
                    headers[position],
                )
        return puts, deletes

    def changes(
        self, partition: int, base_offset: int, newest: dict[bytes, int]
    ) -> list[StoredValue]:
        """The newest value per key, as last-value subscriptions are told (None: deleted)."""
        headers = self.headers
        return [
            StoredValue(
                record_key,
                partition,
                base_offset + position,
                self.timestamps[position],
                self.values[position],
                () if headers is None else tuple(headers[position]),
            )
            for record_key, position in newest.items()
        ]
