"""Topic schemas: the registry of versions, the four schema requests, and the produce check.

A topic without a registered version carries bytes (nothing is checked; GET_SCHEMA answers a version
0 of type bytes). Versions are numbered 1, 2, ... per topic; a new one is accepted when the topic's
compatibility mode allows it after the latest (`server.schemas.schema_rules`), or answered with the
number of an identical one already registered. A topic keeps at most `MAX_VERSIONS`.

State (RocksDB, beside the topic's own key): `schema/<topic>\\0<version, 20 digits>` holds a
version (JSON: type, definition, time) and `schema/<topic>\\0mode` the compatibility mode. A
create with `schema.*` configs writes them in the same synced WriteBatch as the topic, a
registration in a synced write of its own before it is answered or used, and the catalog's purge
removes the prefix with the topic: the registry survives restarts and kill -9, and a re-created
name starts with no schema. Memory holds each version's type, time and digest; a definition is
read from the state when asked for, and parsed (`ParsedSchema`) on first use, a few kept per topic.

Registration runs in the topic's turn (the broker lists REGISTER_SCHEMA among the requests that
take it), so two connections registering at once are served one after the other, a registration
never races a delete, and a produce that arrives meanwhile waits for it.

Produce: a topic whose versions are all `bytes` is not in `validating`, so its produces do no
per-record work. On the others every record with a value must carry the `hw-schema-version` header
(ASCII digits) naming a registered version, and its value must pass that version's check; the
first record that does not refuses the whole batch with SCHEMA_VIOLATION "record N: ...". The
version travels with the record as the producer wrote it: nothing in the batch is rewritten.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import structlog

from headwater.server.reply import AfterWork, Reply
from headwater.server.request_table import handles
from headwater.server.schemas.schema_rules import (
    Check,
    ParsedSchema,
    compatibility_problems,
    parse_schema,
)
from headwater.storage.state import StateStore, StateWriter, key
from headwater.wire import messages as m
from headwater.wire.compression import declared_records
from headwater.wire.errors import (
    IncompatibleSchema,
    InvalidRequest,
    InvalidSchema,
    SchemaViolation,
    StorageError,
    UnknownSchema,
    UnknownTopic,
)
from headwater.wire.records import Headers, decode_records

if TYPE_CHECKING:
    from headwater.server.topics.subscription_contract import ConsumerSession as Session

log = structlog.get_logger(__name__)

SCHEMA: Final = b"schema/"
MODE: Final = "mode"
MAX_VERSIONS: Final = 1000
DEFAULT_COMPATIBILITY: Final = "backward"
CONFIGS: Final = frozenset({"schema.type", "schema.definition", "schema.compatibility"})
_PARSED_KEPT: Final = 8  # parsed versions kept per topic (producers mostly use the latest)
# A produce to a topic with a schema is checked on the loop up to this size (records, bytes):
# about a millisecond of per-record checks; larger ones on the connection's inflater thread.
INLINE_SCHEMA_RECORDS: Final = 16
INLINE_SCHEMA_BYTES: Final = 16 * 1024
_MAX_REASONS: Final = 10
_HEADER: Final = m.SCHEMA_VERSION_HEADER


@dataclass(frozen=True, slots=True)
class Version:
    version: int
    schema_type: str
    digest: str  # of the canonical definition: equal digests, identical schemas
    registered_ms: int


@dataclass(slots=True)
class TopicSchemas:
    topic: str
    state: StateStore
    compatibility: str = DEFAULT_COMPATIBILITY
    versions: list[Version] = field(default_factory=list)  # [i] is version i + 1
    parsed_cache: OrderedDict[int, ParsedSchema] = field(default_factory=OrderedDict)
    # parsed() runs on threads (a produce's check, a registration) as well as the loop: the
    # cache's updates take this, never a parse, so the loop waits microseconds at most
    _cache_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def validating(self) -> bool:
        return any(v.schema_type != "bytes" for v in self.versions)

    def definition(self, version: int) -> bytes:
        raw = self.state.get(key(SCHEMA, self.topic, version))
        if raw is None:
            raise StorageError(f"schema version {version} of {self.topic!r} is missing")
        return str(json.loads(raw)["definition"]).encode()

    def parsed(self, version: int) -> ParsedSchema:
        """Version `version` parsed: from the cache, else parsed now (up to seconds of CPU for a
        512 KiB definition, so on the loop only when `checks_cheaply` said it is cached)."""
        schema = self.parsed_cache.get(version)
        if schema is None:
            stored = self.versions[version - 1]
            schema = parse_schema(stored.schema_type, self.definition(version))
        with self._cache_lock:
            self.parsed_cache[version] = schema  # (re)inserted last: the most recently used
            if len(self.parsed_cache) > _PARSED_KEPT:
                self.parsed_cache.popitem(last=False)
        return schema

    def checks_cheaply(self, batch: bytes) -> bool:
        """Whether `check_batch` may run on the loop: a small batch, and every version a record
        could name already parsed. Else the connection checks it on its inflater thread: a
        2,000-record batch against a JSON schema held the loop 380 ms, an 8 MiB one seconds."""
        return (
            len(batch) <= INLINE_SCHEMA_BYTES
            and declared_records(batch) <= INLINE_SCHEMA_RECORDS
            and len(self.parsed_cache) == len(self.versions)
        )

    def info(self, version: int, with_definition: bool = True) -> m.SchemaInfo:
        stored = self.versions[version - 1]
        text = self.definition(version) if with_definition else b""
        return m.SchemaInfo(self.topic, version, stored.schema_type, text, stored.registered_ms)

    def identical(self, schema: ParsedSchema) -> int:
        """The version identical to `schema`, or 0."""
        wanted = digest(schema)
        for stored in self.versions:
            if stored.schema_type == schema.schema_type and stored.digest == wanted:
                return stored.version
        return 0

    def check_batch(self, batch: bytes, max_decompressed: int) -> None:
        """Raise SchemaViolation naming the first record that does not match."""
        records = decode_records(batch, _value_and_headers, max_decompressed)
        checks: dict[bytes, tuple[int, Check]] = {}  # header value -> (version, its check)
        for index, (value, headers) in enumerate(records):
            if value is None:
                continue  # a tombstone: no value to check
            raw = next((v for name, v in headers if name == _HEADER), None)
            if raw is None:
                raise SchemaViolation(
                    f"record {index}: no {_HEADER} header; topic {self.topic!r} has a schema, and "
                    "each record names the version its value was encoded with"
                )
            found = checks.get(raw)
            if found is None:
                version = self._version(index, raw)
                found = checks[raw] = (version, self.parsed(version).check)
            version, check = found
            problem = check(value)
            if problem is not None:
                schema_type = self.versions[version - 1].schema_type
                raise SchemaViolation(
                    f"record {index}: {problem} (schema version {version}, {schema_type})"
                )

    def _version(self, index: int, raw: bytes) -> int:
        version = int(raw) if raw.isdigit() and len(raw) <= 9 else -1
        if not 1 <= version <= len(self.versions):
            raise SchemaViolation(
                f"record {index}: {_HEADER} {raw[:20]!r} is not a registered version of "
                f"topic {self.topic!r} (1..{len(self.versions)})"
            )
        return version


def _value_and_headers(
    offset: int,
    timestamp: int,
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
) -> tuple[bytes | None, Headers]:
    return value, headers


def digest(schema: ParsedSchema) -> str:
    canonical = json.dumps(schema.document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _check_mode(mode: str) -> None:
    if mode not in m.COMPATIBILITY_MODES:
        raise InvalidRequest(
            f"unknown compatibility mode {mode!r} (one of {', '.join(m.COMPATIBILITY_MODES)})"
        )


class SchemaRegistry:
    def __init__(self, state: StateStore, writer: StateWriter) -> None:
        self._state = state
        self._writer = writer
        self.topics: dict[str, TopicSchemas] = {}
        self.validating: dict[str, TopicSchemas] = {}  # what produce checks

    def load(self, names: Collection[str]) -> None:
        """Read every topic's schemas (at startup, after the topics)."""
        for raw_key, value in self._state.scan(SCHEMA):
            topic, _, part = raw_key.decode().partition("\0")
            if topic not in names:
                continue
            schemas = self.topics.setdefault(topic, TopicSchemas(topic, self._state))
            data = json.loads(value)
            if part == MODE:
                schemas.compatibility = data["compatibility"]
            else:
                schemas.versions.append(
                    Version(int(part), data["type"], data["digest"], data["registered_ms"])
                )
        for schemas in self.topics.values():
            schemas.versions.sort(key=lambda v: v.version)
            self._index(schemas)
        log.info("schemas.loaded", topics=len(self.topics))

    def _index(self, schemas: TopicSchemas) -> None:
        self.topics[schemas.topic] = schemas
        if schemas.validating:
            self.validating[schemas.topic] = schemas
        else:
            self.validating.pop(schemas.topic, None)

    def forget(self, topic: str) -> None:
        """The topic is deleted (its keys go with the catalog's purge, `purge_prefix`)."""
        self.topics.pop(topic, None)
        self.validating.pop(topic, None)

    @staticmethod
    def purge_prefix(topic: str) -> bytes:
        return key(SCHEMA, topic) + b"\0"

    # Creating a topic with a schema

    @staticmethod
    def split_configs(
        configs: Iterable[m.ConfigEntry],
    ) -> tuple[dict[str, str], tuple[m.ConfigEntry, ...]]:
        """(the `schema.*` configs, the others)."""
        schema: dict[str, str] = {}
        rest = []
        for entry in configs:
            if entry.name.startswith("schema."):
                if entry.name not in CONFIGS:
                    raise InvalidRequest(
                        f"unknown config {entry.name!r} "
                        f"(schema configs: {', '.join(sorted(CONFIGS))})"
                    )
                schema[entry.name] = entry.value
            else:
                rest.append(entry)
        return schema, tuple(rest)

    async def prepare(
        self, topic: str, configs: dict[str, str]
    ) -> tuple[TopicSchemas, dict[bytes, bytes]]:
        """A new topic's schemas from its `schema.*` configs, and the state to write with it.
        The definition is parsed on a thread, as REGISTER_SCHEMA's is: checking a 64 KiB JSON
        schema takes the schema library about a second of CPU, which the loop must not spend."""
        schemas = TopicSchemas(topic, self._state)
        mode = configs.get("schema.compatibility", DEFAULT_COMPATIBILITY)
        _check_mode(mode)
        schemas.compatibility = mode
        puts = {key(SCHEMA, topic, MODE): json.dumps({"compatibility": mode}).encode()}
        definition = configs.get("schema.definition", "").encode()
        if "schema.type" in configs:
            parsed = await asyncio.to_thread(parse_schema, configs["schema.type"], definition)
            puts.update(self._new_version(schemas, parsed))
        elif definition:
            raise InvalidRequest("schema.definition needs schema.type")
        return schemas, puts

    def install(self, schemas: TopicSchemas) -> None:
        self._index(schemas)

    def _new_version(self, schemas: TopicSchemas, parsed: ParsedSchema) -> dict[bytes, bytes]:
        version = Version(
            len(schemas.versions) + 1, parsed.schema_type, digest(parsed), int(time.time() * 1000)
        )
        schemas.versions.append(version)
        schemas.parsed_cache[version.version] = parsed
        record = {
            "type": version.schema_type,
            "definition": parsed.definition.decode(),
            "digest": version.digest,
            "registered_ms": version.registered_ms,
        }
        return {key(SCHEMA, schemas.topic, version.version): json.dumps(record).encode()}

    # Requests

    def _schemas(self, topics: Collection[str], topic: str) -> TopicSchemas:
        if topic not in topics:
            raise UnknownTopic(f"topic {topic!r} does not exist")
        return self.topics.get(topic) or TopicSchemas(topic, self._state)

    @staticmethod
    async def _evaluate(
        schemas: TopicSchemas, request: m.RegisterSchemaRequest | m.CheckSchemaRequest
    ) -> tuple[ParsedSchema, str, int, list[str]]:
        """(the parsed schema, the mode that decides, an identical version or 0, problems).
        Parsing and comparing run in a worker thread: a 512 KiB definition, or two large
        schemas to compare, must not hold up the other connections."""
        mode = request.compatibility or schemas.compatibility
        _check_mode(mode)
        latest = (
            await asyncio.to_thread(schemas.parsed, len(schemas.versions))
            if schemas.versions
            else None
        )
        parsed = await asyncio.to_thread(parse_schema, request.schema_type, request.definition)
        existing = schemas.identical(parsed)
        if existing or latest is None:
            return parsed, mode, existing, []
        problems = await asyncio.to_thread(compatibility_problems, mode, latest, parsed)
        return parsed, mode, 0, problems

    async def register(
        self, topics: Collection[str], request: m.RegisterSchemaRequest
    ) -> m.RegisterSchemaResponse:
        """Add a version (the caller holds the topic's turn)."""
        schemas = self._schemas(topics, request.topic)
        parsed, mode, existing, problems = await self._evaluate(schemas, request)
        if problems:
            raise IncompatibleSchema(_reasons(request.topic, mode, problems))
        puts: dict[bytes, bytes] = {}
        if mode != schemas.compatibility or request.topic not in self.topics:
            puts[key(SCHEMA, request.topic, MODE)] = json.dumps({"compatibility": mode}).encode()
        if not existing and len(schemas.versions) >= MAX_VERSIONS:
            raise InvalidSchema(
                f"topic {request.topic!r} has {MAX_VERSIONS} schema versions, the most it may keep"
            )
        staged = TopicSchemas(request.topic, self._state, mode, list(schemas.versions))
        if not existing:
            puts.update(self._new_version(staged, parsed))
        if puts:
            await self._writer.synced(puts)
        if request.topic not in topics:  # cannot happen in the turn; never resurrect a topic
            raise UnknownTopic(f"topic {request.topic!r} was deleted")
        schemas.compatibility = mode
        if not existing:
            schemas.versions.append(staged.versions[-1])
            schemas.parsed_cache[staged.versions[-1].version] = parsed
            log.info(
                "schema.registered",
                topic=request.topic,
                version=len(schemas.versions),
                type=parsed.schema_type,
                compatibility=mode,
            )
        self._index(schemas)
        return m.RegisterSchemaResponse(existing or len(schemas.versions), not existing)

    def get(self, topics: Collection[str], request: m.GetSchemaRequest) -> m.GetSchemaResponse:
        schemas = self._schemas(topics, request.topic)
        count = len(schemas.versions)
        if request.version in (m.LATEST_SCHEMA, 0) and count == 0:
            bare = m.SchemaInfo(request.topic, 0, "bytes", b"", 0)
            return m.GetSchemaResponse(bare, schemas.compatibility)
        version = count if request.version == m.LATEST_SCHEMA else request.version
        if not 1 <= version <= count:
            raise UnknownSchema(
                f"topic {request.topic!r} has no schema version {request.version} "
                f"({'none registered' if count == 0 else f'versions 1..{count}'})"
            )
        return m.GetSchemaResponse(schemas.info(version), schemas.compatibility)

    def list(self, topics: Collection[str], request: m.ListSchemasRequest) -> m.ListSchemasResponse:
        schemas = self._schemas(topics, request.topic)
        versions = tuple(schemas.info(v.version, False) for v in schemas.versions)
        return m.ListSchemasResponse(schemas.compatibility, versions)

    async def check(
        self, topics: Collection[str], request: m.CheckSchemaRequest
    ) -> m.CheckSchemaResponse:
        schemas = self._schemas(topics, request.topic)
        _, _, existing, problems = await self._evaluate(schemas, request)
        shown = tuple(p[:1000] for p in problems[:_MAX_REASONS])
        return m.CheckSchemaResponse(not problems, existing, shown)


def _reasons(topic: str, mode: str, problems: list[str]) -> str:
    more = len(problems) - _MAX_REASONS
    text = "; ".join(problems[:_MAX_REASONS]) + (f"; and {more} more" if more > 0 else "")
    return f"schema is not {mode}-compatible with the latest version of {topic!r}: {text}"


class SchemaHandlers:
    """The broker's handlers of the schema requests."""

    def __init__(self, registry: SchemaRegistry, topics: dict[str, Any]) -> None:
        self._registry = registry
        self._topics = topics

    @handles(m.RegisterSchemaRequest, "topic", "admin", in_turn=True)
    def register(self, session: Session, request: m.RegisterSchemaRequest) -> Reply:
        return AfterWork(self._registry.register(self._topics, request))

    # producers encode by a topic's schemas and consumers decode by them (so too list, check)
    @handles(m.GetSchemaRequest, "topic", "any-grant")
    def get(self, session: Session, request: m.GetSchemaRequest) -> Reply:
        return self._registry.get(self._topics, request)

    @handles(m.ListSchemasRequest, "topic", "any-grant")
    def list(self, session: Session, request: m.ListSchemasRequest) -> Reply:
        return self._registry.list(self._topics, request)

    @handles(m.CheckSchemaRequest, "topic", "any-grant")
    def check(self, session: Session, request: m.CheckSchemaRequest) -> Reply:
        return AfterWork(self._registry.check(self._topics, request))
