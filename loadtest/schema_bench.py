"""What a topic schema costs a produce: the server's per-record check, and end to end.

    python -m loadtest.schema_bench [--records 20000] [--end-to-end 50000]

Part 1 times `TopicSchemas.check_batch` (what the produce handler runs on a schema topic) on
batches of 1,000 records, in this process, for each schema type, against decoding the batch alone
(what a `bytes` topic does not even pay). Part 2 starts a server (`python -m headwater serve`, its
own process, 127.0.0.1) and sends `--end-to-end` records through one producer per topic type,
values encoded by the client (`producer(schema="auto")`), and reports records per second
acknowledged. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import fastavro

import headwater
from headwater.server.schemas.schema_registry import SchemaRegistry, TopicSchemas
from headwater.storage.state import StateStore, StateWriter
from headwater.testing import ServerProcess
from headwater.wire import messages as m
from headwater.wire.records import build_batch, decode_records

ORDER_AVRO = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "item", "type": "string"},
        {"name": "quantity", "type": "int"},
        {"name": "price", "type": "double"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}
ORDER_JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "item": {"type": "string", "maxLength": 64},
        "quantity": {"type": "integer", "minimum": 1},
        "price": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["id", "item", "quantity", "price"],
    "additionalProperties": False,
}
ORDER = {"id": 7, "item": "fountain pen", "quantity": 2, "price": 12.5, "tags": ["a", "b"]}


def _avro(value: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(ORDER_AVRO), value)
    return out.getvalue()


# name -> (schema type, definition, a value as bytes, a value for the client)
CASES: dict[str, tuple[str, Any, bytes, Any]] = {
    "bytes": ("bytes", None, json.dumps(ORDER).encode(), json.dumps(ORDER).encode()),
    "string": ("string", None, json.dumps(ORDER).encode(), json.dumps(ORDER)),
    "int64": ("int64", None, (7).to_bytes(8, "big"), 7),
    "json": ("json", None, json.dumps(ORDER).encode(), ORDER),
    "json+schema": ("json", ORDER_JSON_SCHEMA, json.dumps(ORDER).encode(), ORDER),
    "avro": ("avro", ORDER_AVRO, _avro(ORDER), ORDER),
}


async def server_side(records: int) -> dict[str, float]:
    """Microseconds per record of the produce handler's schema check (and of decoding alone)."""
    results = {}
    with tempfile.TemporaryDirectory() as directory:
        state = StateStore(Path(directory))
        registry = SchemaRegistry(state, StateWriter(state))
        for name, (kind, definition, value, _) in CASES.items():
            configs = {"schema.type": kind}
            if definition is not None:
                configs["schema.definition"] = json.dumps(definition)
            schemas, _ = registry.prepare(name, configs)
            batch = build_batch([(None, value, [(m.SCHEMA_VERSION_HEADER, b"1")])] * 1000)
            results[name] = _per_record(schemas, batch, records)
        plain = build_batch([(None, CASES["json"][2], [])] * 1000)
        started = time.perf_counter()
        for _ in range(records // 1000):
            decode_records(plain, lambda *r: r)
        results["decode only"] = (time.perf_counter() - started) / records * 1e6
        state.close()
    return results


def _per_record(schemas: TopicSchemas, batch: bytes, records: int) -> float:
    started = time.perf_counter()
    for _ in range(records // 1000):
        schemas.check_batch(batch, 64 << 20)
    return (time.perf_counter() - started) / records * 1e6


async def end_to_end(address: str, records: int) -> dict[str, float]:
    """Records per second acknowledged, one producer, values encoded by the client."""
    results = {}
    async with await headwater.connect(address) as client:
        for name, (kind, definition, _, value) in CASES.items():
            topic = f"bench-{name.replace('+', '-')}"
            await client.create_topic(topic, schema=kind, schema_definition=definition)
            producer = client.producer(topic, schema="auto")
            await (await producer.send(value))  # the schema is fetched before the clock starts
            started = time.perf_counter()
            for _ in range(records):
                await producer.send(value)
            await producer.flush()
            results[name] = records / (time.perf_counter() - started)
            await producer.close()
        unchecked = "bench-plain"
        await client.create_topic(unchecked)
        producer = client.producer(unchecked)
        raw = CASES["json"][2]
        started = time.perf_counter()
        for _ in range(records):
            await producer.send(raw)
        await producer.flush()
        results["no schema"] = records / (time.perf_counter() - started)
        await producer.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--end-to-end", type=int, default=50_000)
    args = parser.parse_args()
    out: dict[str, Any] = {"us_per_record": asyncio.run(server_side(args.records))}
    if args.end_to_end:
        with tempfile.TemporaryDirectory() as directory:
            server = ServerProcess(Path(directory) / "data").start()
            try:
                out["records_per_s"] = asyncio.run(end_to_end(server.address, args.end_to_end))
            finally:
                server.stop()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
