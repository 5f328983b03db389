"""One client connection's rules without its I/O, shared by both front ends.

The native port (`server.net.client_connection`) and the Kafka port
(`server.kafka.kafka_connection`) enforce the same bounds on a client; this is where those bounds
are decided, once, in the manner of h11: the I/O shell tells the core what happened (a frame's
size arrived, a request started or stopped waiting, an answer is ready, the transport paused
writing, the principal ran into quota debt, the sweep came round) and asks it what to do (refuse
the frame or close, stop or resume reading, what runs off the loop, which answers go out now).
Time comes in as an argument (`now`); the core imports neither asyncio nor sockets, keeps no
timer and writes nothing. The shells keep their protocol's translation: frame headers, decoding
and encoding requests, dispatch to handlers, and the transport calls.

Its state is named: a lifecycle `State` (AWAITING_AUTH, OPEN, CLOSED) and the set of `Hold`s
that keep it from being read (`holds`; none: it is read):

- framing: a frame is at most `frame_limit` bytes, `MAX_PRE_AUTH_FRAME` while AWAITING_AUTH
  (`wire.limits`), refused from its size prefix before its body is buffered (`frame_verdict`:
  the native port answers and skips one over the limit once authenticated, and closes before;
  the Kafka port closes either way). While AWAITING_AUTH only the api keys the port lets come
  first are handled (`admits`); the shell answers or closes for the rest.
- requests waiting: at most `MAX_WAITING_REQUESTS` per connection on both ports
  (`wait_started`/`wait_ended`; at the cap, `Hold.WAITING_CAP`). The native port counts the
  requests waiting for a topic's turn, whose frames' bytes are charged to the memory budget while
  they wait; the Kafka port every request in progress, since it answers in request order
  (`ordered`): each gets a `Slot` (`open_slot`), `fill` gives it its answer, and `take_ready`
  hands back the answers at the head of the line that are ready, holding (and charging) the
  others. The native port answers as requests complete: it asks for no slots.
- memory: the bytes the connection holds for its client (the shell's measure of its transport's
  unsent output, plus the answers ready behind the head of the line) are charged to the server's
  `MemoryBudget` and the principal in place of the last charge (`account`). While the principal
  holds more than its share a connection with bytes charged, or frames waiting, is not read
  (`memory_held`, `Hold.MEMORY`) and gets no deliveries (`deliverable`; `skipped` says the sweep
  should wake its subscriptions once it is let go).
- off the loop: what would hold the event loop more than a few milliseconds runs on a thread,
  and the connection's later frames wait for it (`begin_off_loop`/`end_off_loop`,
  `Hold.OFF_LOOP`): a produce batch that is compressed, declares many records or has a schema
  check that is not cheap (`batch_work`), a Kafka body or answer of many array elements
  (`inline_elements`, `answer_off_loop`).
- quotas: a principal in produce debt is muted until a time (`mute`, `unmute`; `Hold.MUTED`);
  one in consume debt gets no deliveries until a time (`mute_deliveries`, `Hold.DELIVERIES`,
  which does not stop reading).
- write back-pressure: over the transport's high-water mark the connection is not read
  (`pause_writing`/`resume_writing`, `Hold.WRITE_PAUSED`), and gets no deliveries.

`next_reading` tells the shell when to pause or resume its transport's reading. The work per
frame stays small: the native shell reads `state` and `holds` (a plain int; `Hold` names its
bits) and calls `batch_work` for a produce, the Kafka shell calls `frame_verdict`, `admits` and
`open_slot` (one `Slot` with `__slots__` per request, where it made an asyncio future); the rest
is called once per read, slice or answer.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Container
from typing import Final, Protocol

from headwater.server.memory_budget import MemoryBudget
from headwater.wire.compression import declared_records
from headwater.wire.limits import MAX_PRE_AUTH_FRAME, MAX_WAITING_REQUESTS
from headwater.wire.records import is_compressed

# Inflating 1 MiB takes about a millisecond: cheaper on the loop than a thread hand-off.
INLINE_INFLATE: Final = 1024 * 1024
# Decoding a record takes 0.2-1.5 us: 2,048 stay within a few milliseconds on the loop.
INLINE_RECORDS: Final = 2048


class State(enum.Enum):
    """Where the connection is in its life."""

    AWAITING_AUTH = "awaiting_auth"  # authentication is on and has not succeeded: small frames
    OPEN = "open"  # authenticated, or no authentication: frames up to `max_frame_size`
    CLOSED = "closed"  # the transport is gone: nothing is charged, no answer goes out


class Hold(enum.IntFlag):
    """Why a connection is not read (or, `DELIVERIES`, not sent deliveries)."""

    WRITE_PAUSED = 1  # its transport's write buffer is over the high-water mark
    OFF_LOOP = 2  # a frame's work runs off the loop: the frames after it wait
    MUTED = 4  # its principal is over its produce quota: until `muted_until`
    WAITING_CAP = 8  # MAX_WAITING_REQUESTS requests wait to be answered
    MEMORY = 16  # bytes charged while its principal holds more than its share
    BACKLOG = 32  # frames read and not handled yet (the native port's queue of one read)
    DELIVERIES = 64  # its principal is over its consume quota: until `deliveries_until`


class Verdict(enum.Enum):
    """What to do with a frame, from its size prefix alone."""

    ACCEPT = "accept"
    SKIP = "skip"  # answer FRAME_TOO_LARGE and skip its body as it arrives (native, authenticated)
    CLOSE = "close"  # answer if the protocol can, then close: its body is never buffered


class Work(enum.Enum):
    """Where a produce batch is checked."""

    ON_LOOP = "on_loop"  # as it comes: the broker checks it, a few microseconds
    BOUNDED = "bounded"  # on the loop inflating at most `inline_inflate`; past it OFF_LOOP
    OFF_LOOP = "off_loop"  # on the inflater thread, under `max_decompressed`
    SCHEMA_OFF_LOOP = "schema_off_loop"  # decoded and checked against its schema on the thread


class CheapCheck(Protocol):
    """A topic's schemas (`server.schemas.schema_registry.TopicSchemas`), as the core sees them."""

    def checks_cheaply(self, batch: bytes) -> bool: ...


class Slot:
    """A request's place in the line of answers (ordered connections): its answer once `done`."""

    __slots__ = ("closes", "done", "out")

    def __init__(self) -> None:
        self.out: bytes | None = None
        self.done = False
        self.closes = False  # nothing after this answer: the connection closes (failed SASL)


# plain ints: enum flag arithmetic costs microseconds per frame
_WRITE_PAUSED: Final = int(Hold.WRITE_PAUSED)
_OFF_LOOP: Final = int(Hold.OFF_LOOP)
OFF_LOOP: Final = _OFF_LOOP
_MUTED: Final = int(Hold.MUTED)
_WAITING_CAP: Final = int(Hold.WAITING_CAP)
_MEMORY: Final = int(Hold.MEMORY)
_BACKLOG: Final = int(Hold.BACKLOG)
_DELIVERIES: Final = int(Hold.DELIVERIES)
# frames are not handled (nor read) while one of these holds
STOPS_HANDLING: Final = _WRITE_PAUSED | _OFF_LOOP | _MUTED | _WAITING_CAP
# a slice of frames already started ends at one of these (the write buffer is bounded apart)
ENDS_SLICE: Final = _OFF_LOOP | _MUTED | _WAITING_CAP
_STOPS_READING: Final = STOPS_HANDLING | _BACKLOG
_NO_DELIVERIES: Final = _WRITE_PAUSED | _DELIVERIES


class ConnectionCore:
    __slots__ = (
        "_before_auth",
        "_max_decompressed",
        "_max_frame",
        "_memory",
        "_min_frame",
        "_oversize_closes",
        "_slots",
        "charged",
        "charged_to",
        "deliveries_until",
        "frame_limit",
        "holds",
        "inline_elements",
        "inline_inflate",
        "muted_until",
        "ordered",
        "principal",
        "reading",
        "ready",
        "skipped",
        "state",
        "waiting",
        "waiting_bytes",
    )

    def __init__(
        self,
        memory: MemoryBudget,
        *,
        max_frame_size: int,
        authenticating: bool,
        before_auth: Container[int],
        ordered: bool = False,
        oversize_closes: bool = False,
        min_frame: int = 0,
        max_decompressed: int = 0,
        inline_elements: int = 0,
    ) -> None:
        """`authenticating`: authentication is on, so the connection starts AWAITING_AUTH and
        handles only the api keys in `before_auth` until `authenticated`. `ordered`: answers go
        out in request order (Kafka), each request holding a slot. `oversize_closes`: a frame
        over the limit closes the connection even once authenticated (Kafka); `min_frame`: a
        frame below it does too. `max_decompressed`: the most a produce batch may inflate to;
        `inline_elements`: the array elements decoded or encoded on the loop (Kafka)."""
        self._memory = memory
        self._max_frame = max_frame_size
        self._min_frame = min_frame
        self._before_auth = before_auth
        self._oversize_closes = oversize_closes
        self._max_decompressed = max_decompressed
        self.inline_inflate = min(max_decompressed, INLINE_INFLATE)
        self.inline_elements = inline_elements
        self.ordered = ordered
        self.state = State.AWAITING_AUTH if authenticating else State.OPEN
        self.frame_limit = (
            min(MAX_PRE_AUTH_FRAME, max_frame_size) if authenticating else max_frame_size
        )
        self.principal = ""  # charged for the connection's bytes: "" until it authenticates
        self.holds = 0  # `Hold` bits, as a plain int
        self.reading = True  # what the shell last told its transport
        self.muted_until = 0.0
        self.deliveries_until = 0.0
        self.waiting = 0  # requests waiting to be answered: at MAX_WAITING_REQUESTS, not read
        self.waiting_bytes = 0  # ... their frames' bytes, charged while they wait
        self.ready = 0  # bytes of answers ready behind the head of the line (ordered)
        self.charged = 0  # bytes charged to the memory budget by `account`
        self.charged_to = ""  # ... and to this principal
        self.skipped = False  # refused deliveries for memory: the sweep wakes its subscriptions
        self._slots: deque[Slot] = deque()

    # lifecycle

    @property
    def hold(self) -> Hold:
        """The named holds (for logs, tests and status)."""
        return Hold(self.holds)

    def authenticated(self, principal: str) -> None:
        """Authentication succeeded as `principal`: frames up to the server's limit from now."""
        if self.state is State.CLOSED:
            return
        self.state = State.OPEN
        self.principal = principal
        self.frame_limit = self._max_frame

    def close(self) -> None:
        """The transport is gone: the bytes charged are given back, the line of answers
        dropped. Requests still waiting end with `wait_ended` (their own charges)."""
        self.state = State.CLOSED
        self._memory.give_back(self.charged, self.charged_to)
        self.charged = 0
        self.ready = 0
        for slot in self._slots:
            slot.done = True
            slot.out = None
        if self.ordered:
            self.waiting = 0
        self._slots.clear()

    # framing

    def frame_verdict(self, size: int) -> Verdict:
        """A frame announcing `size` bytes, before any of its body is buffered."""
        if self._min_frame <= size <= self.frame_limit:
            return Verdict.ACCEPT
        return Verdict.CLOSE if size < self._min_frame else self.oversized(size)

    def oversized(self, size: int) -> Verdict:
        """A frame over the limit it was read under (the native port's decoder found it so):
        skipped once authenticated, unless this port closes for it; closed before."""
        if self._oversize_closes or self.state is State.AWAITING_AUTH:
            return Verdict.CLOSE
        return Verdict.SKIP

    def refused_limit(self, size: int) -> tuple[int, bool]:
        """The limit a skipped frame of `size` bytes broke, and whether it is the pre-auth one:
        a frame under the server's limit was read before an AUTHENTICATE pipelined ahead of it
        succeeded."""
        if size <= self._max_frame:
            return MAX_PRE_AUTH_FRAME, True
        return self._max_frame, False

    def admits(self, api_key: int) -> bool:
        """Whether a request with `api_key` is handled (decoded) now."""
        return self.state is not State.AWAITING_AUTH or api_key in self._before_auth

    # reading

    def may_handle(self) -> bool:
        """Frames may be handled (and read): not paused, nothing off the loop, not muted, under
        the waiting cap, and the principal's memory share allows."""
        return not self.holds & STOPS_HANDLING and not self.memory_held()

    def wants_reading(self) -> bool:
        return not self.holds & _BACKLOG and self.may_handle()

    def next_reading(self, backlog: bool = False) -> bool | None:
        """Whether to read: True, resume; False, pause; None, leave the transport as it is.
        `backlog`: frames are read and not handled yet (`Hold.BACKLOG`)."""
        holds = self.holds | _BACKLOG if backlog else self.holds & ~_BACKLOG
        self.holds = holds
        # one call per read on the hot path: `wants_reading` inline
        want = (
            not holds & _STOPS_READING and self.state is not State.CLOSED and not self.memory_held()
        )
        if want == self.reading:
            return None
        self.reading = want
        return want

    def pause_writing(self) -> None:
        self.holds |= _WRITE_PAUSED

    def resume_writing(self) -> None:
        self.holds &= ~_WRITE_PAUSED

    # requests waiting, and answers in order

    def wait_started(self, size: int = 0) -> str:
        """A request waits to be answered holding `size` bytes (charged while it waits); the
        principal charged, to pass to `wait_ended`."""
        self.waiting += 1
        if self.waiting >= MAX_WAITING_REQUESTS:
            self.holds |= _WAITING_CAP
        principal = self.principal
        if size:
            self.waiting_bytes += size
            self._memory.charge(size, principal)
        return principal

    def wait_ended(self, size: int = 0, principal: str = "") -> bool:
        """It was answered: True when that took the connection off the cap (read again)."""
        self.waiting -= 1
        if size:
            self.waiting_bytes -= size
            self._memory.give_back(size, principal)
        if self.waiting < MAX_WAITING_REQUESTS and self.holds & _WAITING_CAP:
            self.holds &= ~_WAITING_CAP
            return self.state is not State.CLOSED
        return False

    def open_slot(self) -> Slot:
        """An ordered connection read a request: its place in the line of answers."""
        slot = Slot()
        self._slots.append(slot)
        self.wait_started()
        return slot

    def fill(self, slot: Slot, out: bytes | None, closes: bool = False) -> None:
        """The answer of `slot` (None: none), held and charged until the slots before it go."""
        if slot.done:
            return
        slot.done = True
        slot.out = out
        slot.closes = closes
        if out is not None:
            self.ready += len(out)

    def take_ready(self) -> tuple[list[bytes], bool]:
        """The answers at the head of the line that are ready, in request order, and whether
        the connection closes after them (nothing after a failed authentication)."""
        slots = self._slots
        ready: list[bytes] = []
        while slots and slots[0].done:
            slot = slots.popleft()
            self.wait_ended()
            if slot.out is not None:
                ready.append(slot.out)
                self.ready -= len(slot.out)
            if slot.closes:
                return ready, True
        return ready, False

    # memory

    def account(self, held: int) -> None:
        """Charge what the connection holds for its client now (`held`, the shell's measure,
        with the answers ready behind the head of the line) in place of the last charge."""
        size = held + self.ready if self.state is not State.CLOSED else 0
        principal = self.principal
        if size == self.charged and principal == self.charged_to:
            return
        self._memory.give_back(self.charged, self.charged_to)
        self._memory.charge(size, principal)
        self.charged, self.charged_to = size, principal

    def memory_held(self) -> bool:
        """Not read: bytes are charged, or requests wait holding theirs, and the principal holds
        more than its share."""
        if self.charged > 0:
            held = self._memory.over_share(self.charged_to)
        else:
            held = self.waiting_bytes > 0 and self._memory.over_share(self.principal)
        if held:
            self.holds |= _MEMORY
        elif self.holds & _MEMORY:
            self.holds &= ~_MEMORY
        return held

    def deliverable(self) -> bool:
        """Deliveries may be written: not over the high-water mark, not in consume debt, and
        the principal's memory share allows (else `skipped`, for the sweep to drain later)."""
        if self.holds & _NO_DELIVERIES or self.state is State.CLOSED:
            return False
        if self.memory_held():
            self.skipped = True
            return False
        return True

    def take_skipped(self) -> bool:
        """Whether deliveries were refused for memory since the last call."""
        skipped, self.skipped = self.skipped, False
        return skipped

    # off the loop

    def batch_work(self, batch: bytes, schemas: CheapCheck | None) -> Work:
        """Where a produce batch is checked: on the thread when its topic's schema check is not
        cheap or it declares more than INLINE_RECORDS records (a million empty records took 1.4
        s to check on the loop), bounded on the loop when it is compressed."""
        if schemas is not None and not schemas.checks_cheaply(batch):
            return Work.SCHEMA_OFF_LOOP
        if is_compressed(batch):
            return Work.BOUNDED if declared_records(batch) <= INLINE_RECORDS else Work.OFF_LOOP
        return Work.ON_LOOP if declared_records(batch) <= INLINE_RECORDS else Work.OFF_LOOP

    def inflates_off_loop(self) -> bool:
        """A BOUNDED batch that inflates past `inline_inflate` goes to the thread (True) or is
        refused as too large (False: the server's cap is no larger)."""
        return self._max_decompressed > INLINE_INFLATE

    def answer_off_loop(self, elements: int) -> bool:
        """An answer to a request of `elements` array elements is encoded on the thread."""
        return elements > self.inline_elements

    def begin_off_loop(self) -> None:
        """A frame's work went to a thread (or is delayed): the frames after it wait."""
        self.holds |= _OFF_LOOP

    def end_off_loop(self) -> None:
        self.holds &= ~_OFF_LOOP

    # quotas

    def mute(self, until: float) -> bool:
        """The principal is in produce debt: not read until `until`. True when it was not muted
        (the shell calls `unmute` at `until`); a mute in force is left as it is."""
        if self.holds & _MUTED:
            return False
        self.holds |= _MUTED
        self.muted_until = until
        return True

    def unmute(self, now: float, debt: float = 0.0) -> bool:
        """The mute's time came: unmuted (True), or still muted for `debt` more seconds when the
        debt grew meanwhile (False; the shell calls again at `muted_until`)."""
        if debt > 0:
            self.muted_until = now + debt
            return False
        self.holds &= ~_MUTED
        return True

    def mute_deliveries(self, until: float) -> bool:
        """The principal is in consume debt: no deliveries until `until`. True when newly so."""
        if self.holds & _DELIVERIES:
            return False
        self.holds |= _DELIVERIES
        self.deliveries_until = until
        return True

    def unmute_deliveries(self) -> None:
        self.holds &= ~_DELIVERIES
