"""`Fetched`: one FETCH answer (`Client.fetch`), its batches decoded only when asked for.

The server answers whole record batches back to back, as stored: the first may start below the
offset asked for (it is the batch holding it), or above it (the server read past damage or a
gap). `batches()` cuts them apart by their length fields (each checked: header and CRC-32C, as a
delivery is); `records(build)` decodes them in C and leaves out the records below the offset asked
for; `next_offset` is where the next FETCH goes on, as the server says: after the last batch it
read, sent or left out (a transaction's marker or aborted batch, which a transaction-aware read
leaves out), or the offset asked for when it read none. The bytes are the frame's own: nothing is
copied until decoded.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from headwater.wire.errors import CorruptBatch
from headwater.wire.limits import MAX_DECOMPRESSED_BATCH
from headwater.wire.markers import peek
from headwater.wire.records import (
    BATCH_HEADER_SIZE,
    Headers,
    decode_records,
    inspect_batch,
    record_of,
)

T = TypeVar("T")

_OFFSET_AND_LENGTH = struct.Struct(">qi")
_LENGTH_FIELD_END = 12  # a batch's length field counts the bytes after it


@dataclass(frozen=True, slots=True)
class Fetched:
    topic: str
    partition: int
    offset: int  # the offset asked for
    start_offset: int  # the partition's oldest stored offset when answered
    end_offset: int  # its readable end (or last stable offset): offsets below it can be read now
    data: bytes  # the batches, back to back
    next_offset: int  # where to fetch next (the module doc)

    def _spans(self) -> list[tuple[int, int]]:
        """(start, end) of each batch in `data`, by the length fields."""
        spans: list[tuple[int, int]] = []
        position, size = 0, len(self.data)
        for _ in range(size // BATCH_HEADER_SIZE + 1):  # every batch is at least a header long
            if position >= size:
                break
            if size - position < BATCH_HEADER_SIZE:
                raise CorruptBatch(f"{size - position} trailing bytes after the last batch")
            _, length = _OFFSET_AND_LENGTH.unpack_from(self.data, position)
            end = position + _LENGTH_FIELD_END + length
            if length < 0 or end > size:
                raise CorruptBatch(f"a batch's length field ({length}) runs past the answer")
            spans.append((position, end))
            position = end
        return spans

    def batches(self) -> list[bytes]:
        """Each batch, checked (CorruptBatch otherwise); a raw fetch's have the transaction
        markers among them."""
        found = [self.data[start:end] for start, end in self._spans()]
        for batch in found:
            inspect_batch(batch, control=True)
        return found

    def records(
        self,
        build: Callable[[int, int, bytes | None, bytes | None, Headers], T] = record_of,  # type: ignore[assignment]  # mypy: no default for a TypeVar parameter (#3737)
        max_decompressed: int = MAX_DECOMPRESSED_BATCH,
    ) -> list[T]:
        """Every record at or above the offset asked for, as `build(offset, timestamp, key,
        value, headers)` (a `wire.records.Record` by default); never a marker's."""
        out: list[T] = []
        for batch in self.batches():
            if peek(batch).control:
                continue  # a transaction's marker (a raw fetch's), no record of the topic's
            records = decode_records(batch, build, max_decompressed)
            base = _OFFSET_AND_LENGTH.unpack_from(batch)[0]
            if base < self.offset:  # the batch holding the offset: offsets run base, base+1, ...
                records = records[self.offset - base :]
            out.extend(records)
        return out
