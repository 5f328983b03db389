"""One client connection: bytes in, frames decoded, handlers called, responses and deliveries out.

The native port's shell around the connection core (`server.net.connection_core`), which decides
the rules both ports share: the frame limits and the authentication state, the requests waiting
and their cap, the memory charges, what runs off the loop, the quota mutes and write
back-pressure. This module keeps the native protocol (frame headers, decoding requests, the
broker's handlers, encoding answers and deliveries, answers written as they complete) and the
asyncio transport: it tells the core what happened and does what the core says.

An `asyncio.Protocol` rather than streams: `data_received` decodes and handles complete frames
without a task switch, which is what lets a non-reliable produce cost a few microseconds. Errors
are contained to the connection: a request the broker refuses gets an error response and the
connection carries on; framing that cannot be resynchronised (a size below the header) gets an
error response and the connection is closed; an oversized frame is answered and skipped.
Unexpected exceptions are logged and answered with UNKNOWN_SERVER_ERROR, never raised into the
event loop.

No client may stall the others, so the work one connection gets is bounded:
- Frames are handled in slices (`SLICE_FRAMES` frames or `SLICE_SECONDS`, whichever ends first);
  the rest of a large read waits in a queue for the next loop iteration (`call_soon`), after the
  other connections' ready I/O. Reading is paused while the queue is not empty, so the queue holds
  at most one read's frames.
- Output: the transport's write-buffer high-water mark is the smaller of `consumer_write_buffer`
  and `max_pending_response_bytes`. Above it (`pause_writing`) subscriptions stop sending to this
  connection's consumers and its frames stop being read and handled; both resume when the buffer
  drains to a quarter of it. A client that pipelines requests and never reads costs that many
  bytes, not more.
- A compressed PRODUCE batch is inflated on the loop up to `INLINE_INFLATE` bytes; a larger one is
  inflated (under `max_decompressed_batch`) on the listener's inflater thread, and the
  connection's later frames wait for it, so order is kept and the loop never spends the cap.
  A batch declaring more than `INLINE_RECORDS` records is decoded there too: an 8 MiB batch of
  a million empty records took 1.4 s to check on the loop. So is a batch for a topic with a
  schema unless its check is cheap (`TopicSchemas.checks_cheaply`: a few records, every version
  already parsed): checking 2,000 records against a JSON schema held the loop 380 ms.
- Memory: the write buffer's bytes are charged to the server's memory budget and the
  connection's principal (`_account` → `ConnectionCore.account`: when a slice ends, at the
  high-water mark and on the listener's sweep; after each delivery written outside a slice).
  While the principal holds more than its share, a connection with unsent output is neither
  read nor sent deliveries (`Hold.MEMORY`; its subscriptions keep or drop them against the same
  share): one principal's
  pipelining or unread deliveries across many connections cost its own share, and other
  principals' connections carry on. The sweep lets it go once its client took its output or its
  principal's use fell.
- Requests that wait before they can be answered (`AfterWork`: for their topic's turn while a
  delete or a take-over holds it, for last-value state being built) hold their frames: at
  `MAX_WAITING_REQUESTS` of them the connection is neither read nor handled until one is
  answered, and their frames' bytes are charged to the memory budget and the principal while
  they wait (`Hold.MEMORY` then holds the connection too); so do produces waiting for this
  broker's take-over of their partition (`AfterOwner`). A producer pipelining thousands of
  produces into a busy topic is back-pressured through TCP, not buffered. A FETCH long poll
  (`AfterData`) waits for data, not for work, and holds no batch: it is not counted.
- Idle and incomplete-frame timeouts are checked by the listener's sweep (`check_timeouts`).

With authentication on (`Shared.security`), a connection that has not authenticated reads frames
of at most `MAX_PRE_AUTH_FRAME` bytes, and a request other than API_VERSIONS and AUTHENTICATE is
answered AUTHENTICATION_REQUIRED from its header alone (`server.security.pre_auth`), its body
never decoded, and the connection closed. `_guard` runs before the broker: AUTHENTICATE is
answered there, any other request must pass `Security.check` (a grant for its action and
topic), and produce bytes are charged to the principal's quota: in debt, the principal is
muted: each of its connections gets a THROTTLE push and is not read (`Hold.MUTED`) until the
debt is paid, and one it authenticates meanwhile is held as soon as AUTHENTICATE is answered.
Deliveries are charged to the consume quota the same way, by making the connection unwritable
for a while.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, cast

import structlog

from headwater.server.config import ServerConfig
from headwater.server.logs import ProtocolErrorLog
from headwater.server.loop_lag import LoopLag
from headwater.server.net.admission import Admission
from headwater.server.net.connection_core import (
    ENDS_SLICE,
    INLINE_INFLATE,
    INLINE_RECORDS,
    OFF_LOOP,
    STOPS_HANDLING,
    ConnectionCore,
    State,
    Verdict,
    Work,
)
from headwater.server.net.guard import Guarded
from headwater.server.net.stage_trace import ProduceTrace, StageTrace
from headwater.server.net.traffic import TrafficStats
from headwater.server.reply import AfterDurable, AfterOwner, AfterWork, bulky, encode_off_loop
from headwater.server.requests.broker import Broker, Reply, Waiting
from headwater.server.schemas.schema_registry import TopicSchemas
from headwater.server.security.access import Security, Session
from headwater.server.security.pre_auth import (
    BEFORE_AUTH_KEYS,
    pre_auth_oversized,
    pre_auth_required,
)
from headwater.server.security.tls import ServerTls
from headwater.server.subscriptions.live_subscription import Consumer
from headwater.storage.tasks import spawn
from headwater.wire import messages as m
from headwater.wire.api.produce import delivery_prefix, encode_produce_response
from headwater.wire.errors import (
    AuthenticationFailed,
    ConnectionTimeout,
    DecompressedTooLarge,
    ErrorCode,
    FrameTooLarge,
    HeadwaterError,
    MalformedFrame,
    ProtocolError,
    TruncatedFrame,
    UnknownServerError,
)
from headwater.wire.frames import (
    KNOWN_FLAGS,
    Flags,
    Frame,
    FrameDecoder,
    FrameHeader,
    FrameRejected,
)
from headwater.wire.protocol import decode_request, encode_error, encode_push, encode_response
from headwater.wire.records import BatchInfo, validate_records

log = structlog.get_logger(__name__)

# plain ints: enum flag arithmetic costs microseconds per frame
_NO_RESPONSE = int(Flags.NO_RESPONSE)
_NOT_ON_REQUESTS = ~KNOWN_FLAGS | int(Flags.RESPONSE | Flags.PUSH)

SLICE_FRAMES: Final = 256
SLICE_SECONDS: Final = 0.002
_AWAITING_AUTH: Final = State.AWAITING_AUTH
_ON_LOOP: Final = Work.ON_LOOP
__all__ = ["INLINE_INFLATE", "INLINE_RECORDS", "Connection", "Shared"]  # the core's, re-exported
# A connection closed for a timeout gets this long to take its error frame before it is aborted.
CLOSE_GRACE: Final = 5.0


@dataclass(eq=False)
class Shared:
    """What every connection of one listener shares."""

    connections: set[Connection] = field(default_factory=set)
    inflater: Executor | None = None  # None: inflate on the loop (tests, embedders)
    encoder: Executor | None = None  # bulky answers (server.reply); None: on the loop
    protocol_errors: ProtocolErrorLog = field(default_factory=ProtocolErrorLog)
    security: Security | None = None  # None: no authentication (the embedded loopback default)
    admission: Admission | None = None  # with security: connections waiting to authenticate
    tls: ServerTls | None = None  # None: plaintext
    traffic: TrafficStats = field(default_factory=TrafficStats)  # for server.ops.metrics
    loop_lag: LoopLag = field(default_factory=LoopLag)  # started by the listener
    # sampled stage times (`trace_every`, or GET /debug/stages?every=N on a live server)
    trace: StageTrace | None = None


class Connection(Guarded, asyncio.Protocol):
    def __init__(
        self, broker: Broker, config: ServerConfig, shared: Shared, admitted: str | None = None
    ) -> None:
        """`admitted`: the source address `shared.admission` counts this connection under until
        it authenticates or closes."""
        self._broker = broker
        self._config = config
        self._shared = shared
        # the connection's rules (server.net.connection_core): until AUTHENTICATE succeeds, only
        # small frames are read and only API_VERSIONS and AUTHENTICATE decoded
        self.core = ConnectionCore(
            broker.memory,
            max_frame_size=config.max_frame_size,
            authenticating=shared.security is not None,
            before_auth=BEFORE_AUTH_KEYS,
            max_decompressed=config.max_decompressed_batch,
        )
        self._decoder = FrameDecoder(self.core.frame_limit)
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self.consumers: dict[int, Consumer] = {}
        self.peer = "?"
        self._tasks: set[asyncio.Task[Any]] = set()  # requests answered from a task
        self._out: list[bytes] | None = None
        self._out_bytes = 0
        self._queue: list[Frame | FrameRejected] = []
        self._read_ns = 0  # when the last read arrived (0: it arrived untraced)
        self._traced: ProduceTrace | None = None  # the produce being handled, if sampled
        self._next = 0  # index of the next frame to handle in `_queue`
        self._scheduled = False
        self._protocol_errors = 0
        self.last_frame = self._loop.time()
        self._partial_since: float | None = None
        self._security = shared.security
        self.auth: Session | None = None
        self.peercert: object = None
        self._admitted = admitted
        self.opened = False  # connection_made ran (a TLS handshake may fail before it)
        self.bytes_read = 0  # what this connection's peer made the server read

    # asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.opened = True
        self._transport = cast(asyncio.Transport, transport)
        self._transport.set_write_buffer_limits(
            high=min(self._config.consumer_write_buffer, self._config.max_pending_response_bytes)
        )
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        if self._security is not None:
            self.peercert = transport.get_extra_info("peercert")
        self._shared.connections.add(self)
        log.debug("conn.opened", peer=self.peer)

    def data_received(self, data: bytes) -> None:
        # 0 while untraced: a trace turned on later must not take an old read for this one's
        self._read_ns = time.monotonic_ns() if self._shared.trace is not None else 0
        self.bytes_read += len(data)
        self._shared.traffic.bytes_read += len(data)
        try:
            events = self._decoder.feed(data)
        except MalformedFrame as exc:
            self._fatal(exc)
            return
        if self._decoder.pending_bytes == 0:
            self._partial_since = None
        elif events or self._partial_since is None:
            self._partial_since = self._loop.time()
        if not events:
            return
        if self._next == len(self._queue):
            self._queue = events
            self._next = 0
        else:  # only if the transport delivered data after pause_reading
            self._queue += events
        self._run()

    def eof_received(self) -> bool:
        if self._decoder.pending_bytes:
            header = self._decoder.partial_header()
            error = TruncatedFrame(
                f"connection closed by the client with {self._decoder.pending_bytes} bytes "
                "of an incomplete frame"
            )
            if header is None:
                self._send_error(0, 0, 0, error)
            else:
                self._send_error(header.api_key, header.api_version, header.correlation_id, error)
        return False  # close once the error is flushed

    def connection_lost(self, exc: Exception | None) -> None:
        self._shared.connections.discard(self)
        self.core.close()
        self._leave_admission()
        if self._security is not None:
            self._security.release(self)
        for consumer in list(self.consumers.values()):
            self._broker.detach(consumer)
        self.consumers.clear()
        self._transport = None
        self._queue = []
        self._next = 0
        # Requests still waiting (a produce for its fsync) complete; their answers are dropped.
        log.debug("conn.closed", peer=self.peer, error=str(exc) if exc else None)

    def pause_writing(self) -> None:
        self.core.pause_writing()
        self._account()
        self._update_reading()

    def resume_writing(self) -> None:
        self.core.resume_writing()
        self._account()
        for consumer in list(self.consumers.values()):
            consumer.subscription.drain()
        if self._next < len(self._queue):
            self._schedule()
        self._update_reading()

    # Slices

    def _run(self) -> None:
        """Handle queued frames until the queue is empty, the slice is spent, the output is over
        its bound, or a frame waits for its batch to be inflated off the loop."""
        self._scheduled = False
        transport = self._transport
        core = self.core
        if transport is None or not core.may_handle():
            self._update_reading()  # a memory hold: not read, not handled; the sweep looks again
            return
        # Everything written while handling the slice goes out in one write: pipelined
        # requests get their responses in one syscall, not one each.
        self._out = []
        self._out_bytes = 0
        queue = self._queue
        limit = min(self._next + SLICE_FRAMES, len(queue))
        deadline = time.perf_counter() + SLICE_SECONDS
        bound = self._config.max_pending_response_bytes
        try:
            while self._next < limit:
                event = queue[self._next]
                self._next += 1
                if type(event) is Frame:
                    self._handle(event)
                else:
                    self._rejected(cast(FrameRejected, event))
                if transport.is_closing():
                    self._queue = []
                    self._next = 0
                    return
                if (
                    core.holds & ENDS_SLICE
                    or self._out_bytes > bound
                    or time.perf_counter() > deadline
                ):
                    break
        finally:
            out, self._out = self._out, None
            if out and not transport.is_closing():
                transport.write(b"".join(out))
                self._account()
        self.last_frame = self._loop.time()
        if self._next == len(queue):
            self._queue = []
            self._next = 0
        elif not core.holds & STOPS_HANDLING:
            self._schedule()
        self._update_reading()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._run)

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        want = self.core.next_reading(self._next < len(self._queue))
        if want is None:
            return
        if want:
            transport.resume_reading()
            if self._partial_since is not None:  # the frame's clock stopped while we did not read
                self._partial_since = self._loop.time()
        else:
            transport.pause_reading()

    @property
    def reading(self) -> bool:
        """Whether the transport is being read (False: back-pressured, held or muted)."""
        return self.core.reading

    @property
    def waiting(self) -> int:
        """Requests waiting to be answered (`AfterWork`): at MAX_WAITING_REQUESTS, not read."""
        return self.core.waiting

    # Memory

    @property
    def principal(self) -> str:
        return self.auth.principal if self.auth is not None else ""

    def _account(self) -> None:
        """Charge the write buffer's size now, in place of what was charged before."""
        transport = self._transport
        self.core.account(transport.get_write_buffer_size() if transport is not None else 0)

    # Requests

    def _handle(self, frame: Frame) -> None:
        header = frame.header
        started = time.perf_counter()  # produce latency (server.net.traffic)
        try:
            if header.flags & _NOT_ON_REQUESTS:
                raise MalformedFrame(f"flags {header.flags:#06x} are not valid on a request")
            if self.core.state is _AWAITING_AUTH and not self.core.admits(header.api_key):
                # from the header alone: the body is never decoded
                self._refuse(header, pre_auth_required())
                self.close()
                return
            request = decode_request(header, frame.body)
            if self._security is not None or type(request) is m.AuthenticateRequest:
                early = self._guard(request)
                if early is not None:
                    authenticated = False
                    if type(request) is m.AuthenticateRequest:
                        if self.auth is not None:
                            authenticated = True
                            self._authenticated()
                        elif isinstance(early, Waiting):
                            # a failure answered after a delay, then the connection closes:
                            # nothing more is read meanwhile
                            self.core.begin_off_loop()
                    self._answer(header, early)
                    if authenticated and (debt := self._produce_debt()) > 0:
                        # its principal is muted: nothing past the AUTHENTICATE is read meanwhile
                        self._mute(debt)
                    return
            if type(request) is m.ProduceRequest:
                schemas = self._broker.catalog.schemas.validating.get(request.topic)
                work = self.core.batch_work(request.batch, schemas)
                if work is not _ON_LOOP:
                    if work is Work.SCHEMA_OFF_LOOP:
                        assert schemas is not None
                        self._produce_off_loop(header, request, schemas)
                    else:
                        self._produce_checked(header, request, started, work)
                    return
            response = self._broker.handle(self, request)
            if self.auth is not None:
                assert self._security is not None
                response = self._security.after(self, request, response)
            if self._shared.trace is not None and type(request) is m.ProduceRequest:
                self._trace_produce(request, response)
        except Exception as exc:
            self._refuse(header, exc)
            if isinstance(exc, AuthenticationFailed):
                self.close()
            return
        self._answer(header, response, started, len(frame.body))

    def _trace_produce(self, request: m.ProduceRequest, reply: Reply) -> Reply:
        """With a stage trace: note a sampled produce, answered next by `_answer`."""
        trace = self._shared.trace
        if trace is not None:
            self._traced = trace.produced(request.topic, request.batch, reply, self._read_ns)
        return reply

    def _answer(
        self, header: FrameHeader, response: Reply, started: float | None = None, size: int = 0
    ) -> None:
        """`size`: the request frame's bytes, held while it waits (`AfterWork`)."""
        traced = self._traced  # None unless a stage trace sampled this produce
        if traced is not None:
            self._traced = None
        if type(response) is AfterDurable and isinstance(response.durable, asyncio.Future):
            # the common wait (a produce under fsync `always`): answered from the future's
            # callback, with no task and no coroutine per produce
            response.durable.add_done_callback(
                partial(self._durable, header, response.response, started, traced)
            )
            return
        if isinstance(response, Waiting):
            task = spawn(
                self._finish(header, response.resolve(), started, traced),
                "conn.request_failed",
                self._tasks,
                peer=self.peer,
                api_key=header.api_key,
            )
            if type(response) is AfterWork or type(response) is AfterOwner:  # holds its batch
                self._wait_started(task, size)
            return
        self._shared.traffic.produced(started, response)
        self._respond(header, response)
        if traced is not None:
            traced.answered(response)

    def _wait_started(self, task: asyncio.Task[None], size: int) -> None:
        """A request waits to be answered, holding `size` bytes: counted against
        MAX_WAITING_REQUESTS and charged to the memory budget until it is."""
        principal = self.core.wait_started(size)
        task.add_done_callback(partial(self._wait_ended, size, principal))

    def _wait_ended(self, size: int, principal: str, task: asyncio.Task[None]) -> None:
        if self.core.wait_ended(size, principal) and self._transport is not None:
            self._resume()  # it was at the cap: read and handle again

    def _produce_checked(
        self, header: FrameHeader, request: m.ProduceRequest, started: float, work: Work
    ) -> None:
        """A compressed batch, or one of many records: checked on the loop when that is cheap,
        else on the inflater thread while the connection's later frames wait."""
        cap = self._config.max_decompressed_batch
        if work is Work.BOUNDED:
            info: BatchInfo | None = None
            try:
                info = validate_records(request.batch, self.core.inline_inflate)
            except DecompressedTooLarge:
                if not self.core.inflates_off_loop():
                    raise
                info = None  # inflates past INLINE_INFLATE: on the thread, below
            except HeadwaterError:
                # the broker reports it, after its own checks (unknown topic first)
                reply = self._broker.produce_validated(self, request, None)
                self._answer(header, self._trace_produce(request, reply), started)
                return
            if info is not None:
                reply = self._broker.produce_validated(self, request, info)
                self._answer(header, self._trace_produce(request, reply), started)
                return
        self.core.begin_off_loop()
        future = self._loop.run_in_executor(
            self._shared.inflater, validate_records, request.batch, cap
        )
        future.add_done_callback(partial(self._inflated, header, request))

    def _produce_off_loop(
        self, header: FrameHeader, request: m.ProduceRequest, schemas: TopicSchemas
    ) -> None:
        """A produce to a topic with a schema whose check is not cheap: the batch is validated
        and its records checked against their versions (parsed there if need be) on the
        inflater thread while the connection's later frames wait."""
        self.core.begin_off_loop()
        future = self._loop.run_in_executor(
            self._shared.inflater,
            _check_with_schema,
            request.batch,
            self._config.max_decompressed_batch,
            schemas,
        )
        future.add_done_callback(partial(self._inflated, header, request, schema_checked=True))

    def _inflated(
        self,
        header: FrameHeader,
        request: m.ProduceRequest,
        future: asyncio.Future[BatchInfo],
        schema_checked: bool = False,
    ) -> None:
        self.core.end_off_loop()
        if self._transport is None:
            return
        try:
            info = future.result()
            reply = self._broker.produce_validated(self, request, info, schema_checked)
            self._answer(header, self._trace_produce(request, reply))
        except Exception as exc:
            self._refuse(header, exc)
        self._resume()

    def _encoded(self, task: asyncio.Task[None]) -> None:
        self.core.end_off_loop()
        self._resume()

    def _resume(self) -> None:
        self.last_frame = self._loop.time()
        if self._next < len(self._queue):
            self._schedule()
        self._update_reading()

    def _authenticated(self) -> None:
        """AUTHENTICATE succeeded: frames up to the server's own limit are read from now on, and
        the connection no longer counts as waiting to authenticate."""
        assert self.auth is not None
        self.core.authenticated(self.auth.principal)
        self._decoder.max_frame_size = self.core.frame_limit
        self._leave_admission()

    def _principal_connections(self, principal: str) -> list[Connection]:
        """This port's connections authenticated as `principal` (a scan: only when the
        principal runs into produce debt, at most once per mute of each connection)."""
        return [
            c
            for c in self._shared.connections
            if c.auth is not None and c.auth.principal == principal
        ]

    def _leave_admission(self) -> None:
        address, self._admitted = self._admitted, None
        if address is not None and self._shared.admission is not None:
            self._shared.admission.release(address)

    def _rejected(self, event: FrameRejected) -> None:
        header = event.header
        if self.core.oversized(event.size) is Verdict.CLOSE:
            self._refuse(header, pre_auth_oversized(header.api_key, event.size))
            self.close()
            return
        limit, pre_auth = self.core.refused_limit(event.size)
        why = (  # read before the AUTHENTICATE that was pipelined ahead of it
            "; a client waits for the AUTHENTICATE answer before sending larger frames"
            if pre_auth
            else ""
        )
        self._send_error(
            header.api_key,
            header.api_version,
            header.correlation_id,
            FrameTooLarge(f"frame of {event.size} bytes exceeds the {limit}-byte limit{why}"),
        )

    async def _finish(
        self,
        header: FrameHeader,
        pending: Awaitable[m.Response],
        started: float | None = None,
        traced: ProduceTrace | None = None,
    ) -> None:
        try:
            response = await pending
        except Exception as exc:
            self._refuse(header, exc)
            if isinstance(exc, AuthenticationFailed):
                self.close()
            return
        self._shared.traffic.produced(started, response)
        self._respond(header, response)
        if traced is not None:
            traced.answered(response)

    def _durable(
        self,
        header: FrameHeader,
        response: m.Response,
        started: float | None,
        traced: ProduceTrace | None,
        durable: asyncio.Future[Any],
    ) -> None:
        """What `_finish` does for an `AfterDurable`, from the durable future's callback."""
        if durable.cancelled():
            return  # a partition closed with the server: no answer to give
        error = durable.exception()
        if error is not None:
            self._refuse(header, error if isinstance(error, Exception) else RuntimeError(error))
            return
        self._shared.traffic.produced(started, response)
        self._respond(header, response)
        if traced is not None:
            traced.answered(response)

    def _respond(self, header: FrameHeader, response: m.Response) -> None:
        if header.flags & _NO_RESPONSE or self._transport is None:
            return
        if type(response) is m.ProduceResponse:
            out = encode_produce_response(
                header.correlation_id, response.partition, response.base_offset
            )
        elif not bulky(response):
            try:
                out = encode_response(header.api_key, header.correlation_id, response)
            except HeadwaterError as exc:  # a bug: every request still gets an answer
                self._refuse(header, RuntimeError(exc.message))
                return
        else:
            self.core.begin_off_loop()  # later frames wait, as for an inflation: memory bounded
            task = spawn(
                encode_off_loop(header, response, self._write, self._shared.encoder),
                "conn.encode_failed",
                self._tasks,
                peer=self.peer,
                api_key=header.api_key,
            )
            return task.add_done_callback(self._encoded)
        self._write(out)

    def _refuse(self, header: FrameHeader, error: Exception) -> None:
        """Answer a request that failed: its own error, or for a bug a generic one (logged)."""
        if not isinstance(error, HeadwaterError):
            log.error("conn.handler_failed", peer=self.peer, api_key=header.api_key, exc_info=error)
            error = UnknownServerError("internal error; see the server log")
        self._send_error(header.api_key, header.api_version, header.correlation_id, error)

    def _send_error(
        self, api_key: int, api_version: int, correlation_id: int, error: HeadwaterError
    ) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._write(encode_error(api_key, api_version, correlation_id, error))
        if isinstance(error, ProtocolError | ConnectionTimeout):
            self._protocol_errors += 1
            self._shared.protocol_errors.note(
                self._loop.time(),
                self.peer,
                self._protocol_errors == 1,
                "conn.protocol_error",
                code=error.code.name,
                error=error.message,
            )

    def _write(self, data: bytes) -> None:
        if self._out is not None:
            self._out.append(data)
            self._out_bytes += len(data)
        elif self._transport is not None:
            self._transport.write(data)

    # Limits, enforced by the listener

    def check_timeouts(self, now: float) -> None:
        """Close the connection with CONNECTION_TIMEOUT if it is idle or stuck inside a frame.

        Idle: no consumers, nothing in progress, no frame for `idle_timeout`. A frame must arrive
        whole within `frame_timeout` of its first byte, counting only while it is being read.
        """
        if self._transport is None or self._transport.is_closing():
            return
        self._account()
        if not self.core.memory_held():
            self._update_reading()  # resumes a connection the memory budget held
            if self._next < len(self._queue) and not self._scheduled:
                self._schedule()
            if self.core.take_skipped():
                for consumer in list(self.consumers.values()):
                    consumer.subscription.drain()
        partial_since = self._partial_since
        if (
            partial_since is not None
            and self.core.reading
            and now - partial_since > self._config.frame_timeout
        ):
            limit, got = self._config.frame_timeout, self._decoder.pending_bytes
            why = f"no complete frame within frame_timeout ({limit:g} s): {got} bytes of a frame"
            self._fatal(ConnectionTimeout(why + " arrived"))
        elif (
            now - self.last_frame > self._config.idle_timeout
            and not self.consumers
            and not self._tasks
            and not self.core.holds & OFF_LOOP
        ):
            idle = self._config.idle_timeout
            self._fatal(ConnectionTimeout(f"idle for idle_timeout ({idle:g} s)"))

    def shutdown(self) -> None:
        """Graceful server stop: tell each consumer, then close."""
        for consumer_id in list(self.consumers):
            self.send_consumer_closed(
                consumer_id, ErrorCode.SERVER_SHUTTING_DOWN, "the server is shutting down"
            )
        self.close()

    # ConsumerSession

    @property
    def writable(self) -> bool:
        return self._transport is not None and self.core.deliverable()

    def send_delivery(
        self, consumer_id: int, partition: int, batch: bytes, delivery_count: int = 1
    ) -> None:
        if self._transport is not None:
            prefix = delivery_prefix(consumer_id, partition, len(batch), delivery_count)
            consumer = self.consumers.get(consumer_id)
            self._shared.traffic.delivered(consumer, batch, delivery_count)
            trace = self._shared.trace
            if trace is not None:
                trace.dispatched(consumer, partition, batch)
            if self._out is not None:
                self._out += (prefix, batch)
                self._out_bytes += len(prefix) + len(batch)
            else:
                self._transport.writelines((prefix, batch))
                self._account()
            if self.auth is not None and self.auth.consume_rate > 0:
                self._charge_consume(len(batch))

    def send_consumer_closed(self, consumer_id: int, code: int, message: str) -> None:
        if self._transport is not None:
            self._write(encode_push(consumer_id, m.ConsumerClosed(code, message)))

    def send_messages_dropped(self, consumer_id: int, count: int) -> None:
        if self._transport is not None:
            self._write(encode_push(consumer_id, m.MessagesDropped(count)))

    def close(self) -> None:
        """Close once the output is flushed; abort if the peer has not taken it in time."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._out:  # answers to the frames handled so far in this slice go first
            transport.write(b"".join(self._out))
            self._out.clear()
        transport.close()
        if transport.get_write_buffer_size():
            self._loop.call_later(CLOSE_GRACE, transport.abort)

    def __repr__(self) -> str:
        return f"Connection({self.peer})"


def _check_with_schema(batch: bytes, cap: int, schemas: TopicSchemas) -> BatchInfo:
    """On the inflater thread: the batch's records decode, then pass the topic's schema."""
    info = validate_records(batch, cap)
    schemas.check_batch(batch, cap)
    return info
