"""One Kafka client connection: size-prefixed frames in, each request handled, responses out in
request order.

The Kafka port's shell around the connection core (`server.net.connection_core`, the native
port's too), which decides the rules both ports share; this module keeps the Kafka protocol (size
prefixes, request headers, decoding and encoding through `codec`, dispatch to `handlers`) and the
asyncio transport.

Kafka clients match responses to requests by order as well as by correlation id, so the core is
`ordered`: each request gets a slot (`ConnectionCore.open_slot`) when it is read and answers are
written from the head as their slots fill (`take_ready`): a produce waiting for its fsync holds
back the answers to requests read after it, never reorders them. Work per connection is
bounded, as on the native port (`net.client_connection`):

- a frame whose size prefix is over `max_frame_size` (or under a header's size) closes the
  connection before any of its body is buffered; so does a body that does not decode
  (`codec.MalformedKafka`: short fields, hostile array counts, bytes left over);
- at most `MAX_WAITING_REQUESTS` requests (`wire.limits`, the native port's bound too) are
  handled at once, those waiting for a busy topic's turn included: past it, and while the
  transport's write buffer is over its high-water mark (a client that does not read), the
  connection is not read and the frames already buffered wait;
- the event loop is held a few milliseconds at most per request: a body announcing more than
  `codec.INLINE_ELEMENTS` array elements is decoded again on the listener's inflater thread
  (`codec.Deferred`, found before those elements are read) while the connection's later frames
  wait, so requests are still handled in order; an answer holding that many is encoded there too;
- such a request, and every Fetch, is handled alone: the connection's later frames wait until it
  is answered, as a Kafka broker reads nothing more of a connection until it has answered (its
  consumers keep one Fetch per broker in flight). Pipelined Fetches of 10,000 partitions, or of
  a megabyte each, had 64 in progress per connection;
- memory: the bytes it holds for its client (the transport's unsent output, frames read and not
  yet handled, answers ready behind the head of the line) are charged to the server's memory
  budget and the connection's principal (`_account` → `ConnectionCore.account`: as frames are
  read and answers written, at the high-water mark and on the listener's sweep). While the
  principal holds more than its share (`MemoryBudget.over_share`), a connection with bytes
  charged is not read, as a native one;
- a principal over its produce quota: the Produce that put it in debt is charged as it is read and
  the connection is then not read for the delay the debt needs (`_mute`, the core's
  `Hold.MUTED`, as Kafka mutes a throttled channel), and the answer says so in
  `throttle_time_ms`. Without it a principal limited to 100 kB/s that ignored throttling made
  the server read 34.6 MB in 10 s;
- an API or version not served is answered UNSUPPORTED_VERSION (ApiVersions in its v0 layout,
  with the versions served, so a client can pick one); the connection stays open.

With authentication on (`security`), a connection that has not authenticated (SaslHandshake and
SaslAuthenticate PLAIN, the password a Headwater token) may send only ApiVersions and those two,
in frames of at most `MAX_PRE_AUTH_FRAME` bytes, for at most `handshake_timeout` seconds; any
other request closes it, as Kafka does: the api key is read from the header before anything else
of the body is decoded, and a size prefix over the cap closes the connection before any of the
body is buffered. Until it authenticates it holds a slot of the listener's `Admission` (the
caps on connections waiting to authenticate), released on success or close. It is then the
peer `security.access.Security` checks each native request against, and revokes (closes) when its
token goes.

The connection is a `ConsumerSession` for the broker's handlers: it holds no consumers (a Kafka
client fetches by offset), so deliveries never reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial
from typing import Any, Final, cast

import structlog

from headwater.server.config import ServerConfig
from headwater.server.kafka import codec
from headwater.server.kafka.apis import API_VERSIONS, BEFORE_AUTH, FETCH, PRODUCE, SERVED, Api
from headwater.server.kafka.handlers import KafkaHandlers, closes_after, produce_bytes, throttled
from headwater.server.kafka.kafka_errors import UNSUPPORTED_VERSION
from headwater.server.kafka.kafka_metrics import KafkaStats
from headwater.server.kafka.messages.metadata import ApiVersionsResponse
from headwater.server.kafka.messages.sasl import SaslAuthenticateRequest
from headwater.server.net.admission import Admission
from headwater.server.net.connection_core import ConnectionCore, Slot, State, Verdict
from headwater.server.security.access import Security, Session
from headwater.server.topics.subscription_contract import Consumer
from headwater.wire.errors import HeadwaterError

log = structlog.get_logger(__name__)

# the fewest bytes a request can be: api key, version, correlation id, client id length
_MIN_REQUEST: Final = 10
_ACCEPT: Final = Verdict.ACCEPT


class KafkaConnection(asyncio.Protocol):
    def __init__(
        self,
        handlers: KafkaHandlers,
        config: ServerConfig,
        connections: set[KafkaConnection],
        security: Security | None = None,
        stats: KafkaStats | None = None,
        admission: Admission | None = None,
        admitted: str | None = None,
    ) -> None:
        """`admitted`: the source address `admission` counts this connection under until it
        authenticates or closes."""
        self._handlers = handlers
        self._admission = admission
        self._admitted_as = admitted
        self._stats = stats or KafkaStats()
        self._security = security
        self._handshake_timeout = config.security.handshake_timeout
        # the connection's rules (server.net.connection_core): answers in request order, a frame
        # over the limit (MAX_PRE_AUTH_FRAME before SaslAuthenticate) closes the connection
        self.core = ConnectionCore(
            handlers.memory,
            max_frame_size=config.max_frame_size,
            authenticating=security is not None,
            before_auth=BEFORE_AUTH,
            ordered=True,
            oversize_closes=True,
            min_frame=_MIN_REQUEST,
            max_decompressed=config.max_decompressed_batch,
            inline_elements=codec.INLINE_ELEMENTS,
        )
        self._write_buffer = min(config.consumer_write_buffer, config.max_pending_response_bytes)
        self._connections = connections
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop = asyncio.get_running_loop()
        self.last_activity = self._loop.time()
        self.partial_since: float | None = None
        # ConsumerSession: what the broker's handlers may look at
        self.consumers: dict[int, Consumer] = {}
        self.peer = "?"
        self.client_id = ""  # the request header's, as JoinGroup names members by it
        self._auth: Session | None = None  # set by Security.authenticate
        self.raw_sasl = False
        self.produce_tail: asyncio.Future[None] | None = None
        self.peercert: object = None
        self._opened_at = self._loop.time()
        self._worker = handlers.worker

    # ConsumerSession (no consumers ever attach to a Kafka connection)

    @property
    def auth(self) -> Session | None:
        return self._auth

    @auth.setter
    def auth(self, session: Session | None) -> None:
        """Set by `Security.authenticate` (and cleared by `release`): authenticated, the
        connection no longer counts as waiting to."""
        self._auth = session
        if session is not None:
            self.core.authenticated(session.principal)
            self.leave_admission()

    def leave_admission(self) -> None:
        address, self._admitted_as = self._admitted_as, None
        if address is not None and self._admission is not None:
            self._admission.release(address)

    @property
    def principal(self) -> str:
        return self.auth.principal if self.auth is not None else ""

    @property
    def writable(self) -> bool:
        return False

    def send_delivery(
        self, consumer_id: int, partition: int, batch: bytes, delivery_count: int = 1
    ) -> None:
        pass

    def send_consumer_closed(self, consumer_id: int, code: int, message: str) -> None:
        pass

    def send_messages_dropped(self, consumer_id: int, count: int) -> None:
        pass

    # asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._transport.set_write_buffer_limits(high=self._write_buffer)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        if self._security is not None:
            self.peercert = transport.get_extra_info("peercert")
        self._connections.add(self)
        log.debug("kafka.conn_opened", peer=self.peer)

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        self.core.close()  # gives back its charge, drops the answers not yet written
        self.leave_admission()
        if self._security is not None:
            self._security.release(self)
        self._transport = None
        self._buffer.clear()
        for task in list(self._tasks):
            task.cancel()
        self._handlers.share.connection_closed(self)  # its share sessions, and what they hold
        log.debug("kafka.conn_closed", peer=self.peer, error=str(exc) if exc else None)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self.last_activity = self._loop.time()
        self._drain_frames()
        self._account()

    def eof_received(self) -> bool:
        return False

    def pause_writing(self) -> None:
        self.core.pause_writing()
        self._account()
        self._update_reading()

    def resume_writing(self) -> None:
        self.core.resume_writing()
        self._account()
        self._drain_frames()

    # frames

    def _drain_frames(self) -> None:
        """Handle the complete frames buffered, while fewer than MAX_WAITING_REQUESTS are
        handled, the client takes its answers, no body is decoded off the loop, the principal's
        quota and memory share allow."""
        buffer = self._buffer
        core = self.core
        while self._transport is not None and core.may_handle():
            if len(buffer) < 4:
                break
            size = codec.frame_size(buffer)
            if core.frame_verdict(size) is not _ACCEPT:
                limit = core.frame_limit
                self._fatal(f"a frame of {size} bytes (limits {_MIN_REQUEST}..{limit})")
                return
            if len(buffer) < 4 + size:
                break
            body = bytes(buffer[4 : 4 + size])
            del buffer[: 4 + size]
            self._request(body)
        self.partial_since = None if not buffer else self.partial_since or self._loop.time()
        self._update_reading()

    def _request(self, body: bytes) -> None:
        if self.raw_sasl:
            self.raw_sasl = False
            self._raw_sasl(body)
            return
        try:
            key, version, correlation = codec.peek_header(body)
        except codec.MalformedKafka as exc:
            self._fatal(str(exc))
            return
        core = self.core
        if not core.admits(key):
            self._fatal(f"api key {key} before SaslAuthenticate")
            return
        slot = core.open_slot()
        api = SERVED.get(key)
        if api is None or not api.min_version <= version <= api.max_version:
            if key == API_VERSIONS:  # v0's layout, which every client reads, with our versions
                core.fill(
                    slot,
                    codec.encode_response(
                        correlation,
                        SERVED[API_VERSIONS].responses[0],
                        ApiVersionsResponse(
                            error_code=UNSUPPORTED_VERSION, api_keys=self._handlers.versions()
                        ),
                    ),
                )
            else:
                core.fill(slot, codec.encode_error_only(correlation, UNSUPPORTED_VERSION))
            self._stats.unsupported += 1
            log.debug("kafka.unsupported", peer=self.peer, api_key=key, api_version=version)
            self._flush()
            return
        try:
            decoded = _decode(body, api, version, core.inline_elements)
        except codec.Deferred:  # too many elements for the loop: again on the thread
            core.begin_off_loop()
            future = self._loop.run_in_executor(
                self._worker, _decode, body, api, version, codec.MAX_ELEMENTS
            )
            future.add_done_callback(partial(self._decoded, slot, api, version, correlation))
            return
        except codec.MalformedKafka as exc:
            core.fill(slot, None)
            self._fatal(f"{api.name} v{version}: {exc}")
            return
        if key == FETCH:
            # one Fetch of a connection at a time, as a Kafka broker reads nothing more of a
            # connection until it has answered (its consumers keep one Fetch per broker in
            # flight): 64 pipelined Fetches of a megabyte each on every connection were read
            # from the log in the same turn of the loop (docs/BENCHMARKS.md, hostile requests)
            core.begin_off_loop()
            self._start(slot, api, version, correlation, decoded, alone=True)
            return
        self._start(slot, api, version, correlation, decoded)

    def _decoded(
        self,
        slot: Slot,
        api: Api,
        version: int,
        correlation: int,
        future: asyncio.Future[_Decoded],
    ) -> None:
        """A body decoded on the thread: handled as if decoded inline, alone. The frames read
        after it wait until it is answered, as Kafka handles one request of a connection at a
        time: a connection pipelining Fetches of 10,000 partitions holds one of them in
        progress, not `MAX_WAITING_REQUESTS` (each some 20,000 objects the collector walks:
        64 of them on a few connections made every full collection a second's stall)."""
        if self._transport is None or future.cancelled():
            self.core.end_off_loop()
            return
        try:
            decoded = future.result()
        except codec.MalformedKafka as exc:
            self.core.end_off_loop()
            self.core.fill(slot, None)
            self._fatal(f"{api.name} v{version}: {exc}")
            return
        self._start(slot, api, version, correlation, decoded, alone=True)

    def _start(
        self,
        slot: Slot,
        api: Api,
        version: int,
        correlation: int,
        decoded: _Decoded,
        alone: bool = False,
    ) -> None:
        """`alone`: the connection's later frames wait until this one is answered (a body
        decoded off the loop holds the core's OFF_LOOP until then)."""
        header, fields, elements, produced = decoded
        self.client_id = header.client_id or ""
        self._stats.requests[api.key] = self._stats.requests.get(api.key, 0) + 1
        if produced and self._security is not None:
            # charged now, as it is read: in debt, nothing more is read until it is paid
            delay = self._security.charge_produce(self, produced)
            if delay > 0:
                fields = throttled(fields, delay)
                self._mute(delay)
        task = self._loop.create_task(
            self._handle(slot, api.key, version, correlation, fields, elements, alone)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _raw_sasl(self, token: bytes) -> None:
        """The SASL bytes after a SaslHandshake v0: answered with an empty SASL token (a size of
        0) on success; a failure closes the connection, as Kafka does."""
        slot = self.core.open_slot()

        async def authenticate() -> None:
            request = SaslAuthenticateRequest(auth_bytes=token)
            values = await self._handlers.sasl_authenticate(self, 0, request)
            if values.error_code:
                self.core.fill(slot, None, closes=True)
            else:
                self.core.fill(slot, codec.encode_sasl_token())
            self._flush()

        task = self._loop.create_task(authenticate())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(
        self,
        slot: Slot,
        key: int,
        version: int,
        correlation: int,
        fields: Any,
        elements: int,
        alone: bool = False,
    ) -> None:
        """`elements`: the request's array elements; an answer to more than the loop decodes,
        or holding more than that, is encoded on the thread. `alone`: the later frames are
        let in once this is answered."""
        api = SERVED[key]
        closes = False
        try:
            values = await self._handlers.handlers[key](self, version, fields)
            if closes_after(values):
                closes = True
            # a flexible version's answer has the response header v1 (its empty tagged
            # fields), ApiVersions' excepted: every client reads its header as v0 (KIP-511)
            encode = partial(
                codec.encode_response,
                flexible_header=api.flexible(version) and key != API_VERSIONS,
            )
            if values is None:
                out = None
            elif self.core.answer_off_loop(elements) or codec.many(values):
                out = await self._loop.run_in_executor(
                    self._worker, encode, correlation, api.responses[version], values
                )
            else:
                out = encode(correlation, api.responses[version], values)
        except Exception:  # a bug: the connection cannot answer in order any more
            log.error("kafka.handler_failed", peer=self.peer, api=api.name, exc_info=True)
            out = None
            self.close()
        self.core.fill(slot, out, closes)  # held (and charged) until the slots before it go
        if alone:
            self.core.end_off_loop()
        self._flush()

    def _flush(self) -> None:
        """Write the answers at the head of the line that are ready, in request order."""
        transport = self._transport
        # `closing`: a failed authentication, nothing after it
        ready, closing = self.core.take_ready()
        if ready and transport is not None and not transport.is_closing():
            transport.write(b"".join(ready))
        self._account()
        if closing:
            self.close()
            return
        self.last_activity = self._loop.time()
        if self._buffer:
            self._drain_frames()
        else:
            self._update_reading()

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        want = self.core.next_reading()
        if want is None:
            return
        if want:
            transport.resume_reading()
        else:
            transport.pause_reading()

    # the produce quota

    def _mute(self, delay: float) -> None:
        if self.core.mute(self._loop.time() + delay):
            self._loop.call_later(delay, self._unmute)
            self._update_reading()

    def _unmute(self) -> None:
        self.core.unmute(self._loop.time())
        if self._transport is not None:
            self._drain_frames()

    # memory

    def _account(self) -> None:
        """Charge what the connection holds for its client now (its unsent output, the frames
        read and not handled, the answers ready behind the head of the line), in place of the
        last charge."""
        transport = self._transport
        self.core.account(
            0 if transport is None else transport.get_write_buffer_size() + len(self._buffer)
        )

    # authentication

    def revoke(self, error: HeadwaterError) -> None:
        """Its token was removed or expired (`Security`): Kafka has no frame to say so."""
        self._fatal(f"credential revoked: {error.message}", malformed=False)

    # closing

    def _fatal(self, why: str, malformed: bool = True) -> None:
        """Close, logging why; `malformed`: for bytes that are not Kafka (counted)."""
        if malformed:
            self._stats.protocol_errors += 1
        log.info("kafka.protocol_error", peer=self.peer, error=why)
        self.close()

    def check_timeouts(self, now: float, idle: float, frame: float) -> None:
        """Close a connection idle for `idle` seconds (nothing in flight) or stuck inside a
        frame for `frame` seconds (the listener's sweep calls this)."""
        if self._transport is None:
            return
        core = self.core
        self._account()
        if core.may_handle() and self._buffer:
            self._drain_frames()  # resumes a connection its principal's memory share held
        else:
            self._update_reading()
        if core.state is State.AWAITING_AUTH and now - self._opened_at > self._handshake_timeout:
            self._fatal(f"not authenticated within {self._handshake_timeout:g} s", False)
        elif self.partial_since is not None and core.reading and now - self.partial_since > frame:
            self._fatal(f"no complete frame within {frame:g} s", malformed=False)
        elif not core.waiting and now - self.last_activity > idle:
            self._fatal(f"idle for {idle:g} s", malformed=False)

    def close(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.close()
        if transport.get_write_buffer_size():
            with contextlib.suppress(RuntimeError):
                self._loop.call_later(5.0, transport.abort)


# a body decoded: its header, request (its API's message class), array elements and (a Produce)
# record bytes
_Decoded = tuple[codec.RequestHeader, Any, int, int]


def _decode(body: bytes, api: Api, version: int, inline: int) -> _Decoded:
    """On the loop up to `inline` array elements (`codec.Deferred` past them), on the inflater
    thread for the rest: what a request's handling starts from."""
    header, fields, elements = codec.decode_request(body, api.requests[version], inline)
    return header, fields, elements, produce_bytes(fields) if api.key == PRODUCE else 0
