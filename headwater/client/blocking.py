"""A blocking client over plain sockets, for locust and scripts without asyncio.

Locust runs users as gevent greenlets on a monkey-patched socket module, where an asyncio client
cannot run; this one sends a frame and reads frames until the answer comes, one request at a
time, with the same sans-I/O session (`wire.session.ClientSession`: ids, pending answers, THROTTLE)
as the asyncio client. It covers producing, topic
admin and the map API; consuming stays with the asyncio client.

A server that dies, closes the connection or stops answering within `timeout` raises
`ConnectionLost` (a slow answer `RequestTimeout`), never a hang. Either leaves the stream in an
unknown state (half a frame read, an answer still to come), so the client closes its socket and
every later request raises `ConnectionLost` too: open a new client to go on.

In a cluster, a produce or map request answered NOT_OWNER is sent again to the owner the error
names, on a connection of this client's own to that broker (kept for the next requests); while
the error names none (a failover under way) it is retried after a short backoff, for at most
`timeout` seconds. A produce to a named partition goes to its owner as LOOKUP names it (one
LOOKUP per topic, then again when the owner changes), and follows a failover as the asyncio
client does (docs/CLUSTER.md, "Failover as a producer sees it"): an owner that dies (its
connection lost) or stays silent for `owner_check` seconds (half the lease LOOKUP answers carry:
1 s with the default lease; a frozen owner keeps its connection open) makes the client look the
partition up through the *other* brokers, with a LOOKUP long poll for its new owner (answered
the moment one of them sees the new owner's key), and resend the batch to the new owner once
they name another one, within `timeout`. An owner the cluster still names
keeps the request (it is only slow). The resend is at-least-once: a batch the lost or frozen owner
stored without answering is stored again (this client has no idempotent producer). On a single
broker nothing of this happens: a lost connection raises `ConnectionLost` as above.

    with BlockingClient("127.0.0.1:6650") as client:
        client.create_topic("events")
        offset = client.produce("events", [(None, b"hello", ())])

`transactional_producer` gives a `BlockingTransactions`: the asyncio producer's transactions
(headwater/client/transaction.py) one request at a time, each batch for a partition it names:

        producer = client.transactional_producer("loader-1")   # fences older instances
        with producer.transaction():        # committed at the end, aborted on an exception
            producer.produce("events", [(None, b"a", ())], partition=0)
            producer.produce("audit", [(None, b"b", ())], partition=2)

A partition's first batch in a transaction is preceded by ADD_PARTITIONS_TO_TXN; after an abort
the epoch is bumped (the sequences start over); PRODUCER_FENCED, or INVALID_PRODUCER_EPOCH on a
batch, raises `ProducerFenced`, then on every later call.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence

from headwater.client.broker_connection import default_server, parse_server
from headwater.client.transaction import ack_runs
from headwater.wire import messages as m
from headwater.wire.errors import (
    AuthenticationFailed,
    CannotConnect,
    ConcurrentTransactions,
    ConnectionClosed,
    ConnectionLost,
    HeadwaterError,
    InvalidProducerEpoch,
    InvalidRequest,
    NotOwner,
    ProducerFenced,
    RequestTimeout,
    TopicExists,
    UnsupportedApi,
    UnsupportedVersion,
    error_for_code,
)
from headwater.wire.records import BatchBuilder, RecordInput, build_batch
from headwater.wire.session import Answer, ClientSession

logger = logging.getLogger(__name__)


Address = tuple[str, int]

# between lookups while an owner stays silent, and the longest backoff while a partition has no
# owner: the asyncio client's `LookupBackoff.maximum`
CHECK_EVERY = 0.25
# seconds lookups ask a broker last after it was lost or left a request unanswered past
# `owner_check` (as the asyncio client: twice its metadata refresh)
SILENT_FOR = 4.0
# the longest one LOOKUP long poll for a partition's new owner waits (as the asyncio client's)
LONG_POLL = 5.0


class _Moved(Exception):
    """The silent owner's partition has another owner now (None: none yet)."""

    def __init__(self, owner: Address | None) -> None:
        self.owner = owner


class _Link:
    """One connection to one broker: its socket and sans-I/O session, one request at a time."""

    def __init__(self, address: Address, timeout: float) -> None:
        host, port = address
        self.address = address
        self.name = f"{host}:{port}"
        self.broken: HeadwaterError | None = None
        self._timeout = timeout
        try:
            self._socket = socket.create_connection(address, timeout=timeout)
        except OSError as exc:
            raise CannotConnect(
                f"cannot connect to {host}:{port}: {exc} (is a server running there?)"
            ) from None
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._session = ClientSession(time.monotonic)

    def request(self, request: m.Request, timeout: float) -> m.Response:
        """The answer within `timeout` seconds, else `RequestTimeout`, and the link is broken."""
        answer = self.send(request)
        if not self.wait(answer, timeout):
            raise self.fail(
                RequestTimeout(f"no answer from {self.name} to {type(request).__name__}")
            )
        return answer.result()  # raises the error the server answered with

    def send(self, request: m.Request) -> Answer:
        if self.broken is not None:
            raise ConnectionLost(f"connection to {self.name} unusable: {self.broken.message}")
        answer = Answer()
        _, frame = self._session.request(request, answer)
        try:
            delay = self._session.throttle_delay() if type(request) is m.ProduceRequest else 0.0
            if delay > 0:
                time.sleep(delay)  # the server's THROTTLE: this principal is over its quota
            self._socket.settimeout(self._timeout)  # `wait` shortens it
            self._socket.sendall(frame)
        except OSError as exc:
            raise self.fail(self._lost(str(exc))) from None
        return answer

    def wait(self, answer: Answer, seconds: float) -> bool:
        """Read until `answer` is done (True) or `seconds` have passed (False: the link stays
        usable, and the session drops the answer if it comes later)."""
        end = time.monotonic() + seconds
        try:
            while not answer.done():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._socket.settimeout(left)
                fatal = self._session.receive(self._read())
                if fatal is not None:
                    raise fatal
        except TimeoutError:
            return answer.done()
        except OSError as exc:
            raise self.fail(self._lost(str(exc))) from None
        except (ConnectionClosed, AuthenticationFailed) as exc:  # lost, or credential revoked
            raise self.fail(exc) from None
        except HeadwaterError as exc:  # the bytes from the server do not decode as frames
            raise self.fail(self._lost(f"the server sent an invalid frame: {exc}")) from None
        return True

    def _lost(self, reason: str) -> ConnectionLost:
        return ConnectionLost(f"connection to {self.name} lost: {reason}")

    def fail(self, error: HeadwaterError) -> HeadwaterError:
        if self.broken is None:
            self.broken = error
            self._session.fail(error)
            self._socket.close()
        return error

    def _read(self) -> bytes:
        data = self._socket.recv(65536)
        if not data:
            raise self._lost("closed by the server")
        return data

    def close(self) -> None:
        self._socket.close()


class BlockingClient:
    def __init__(
        self, server: str | None = None, timeout: float = 10.0, owner_check: float | None = None
    ) -> None:
        """`server` is "host:port"; by default $HEADWATER_SERVER, else 127.0.0.1:6650.
        `owner_check`: seconds a produce to a partition's owner may stay unanswered before the
        other brokers are asked whether it moved (default: half the cluster's lease)."""
        host, port = parse_server(server or default_server())
        self._address = f"{host}:{port}"
        self._bootstrap: Address = (host, port)
        self._timeout = timeout
        self._link = _Link(self._bootstrap, timeout)
        self._links: dict[Address, _Link] = {}  # to the other brokers (a cluster)
        self._routes: dict[tuple[str, int], Address] = {}  # (topic, partition) -> owner
        # (topic, partition) -> the owner's epoch in the last LOOKUP answer (for long polls)
        self._epochs: dict[tuple[str, int], int] = {}
        self._long_polls = True  # False once a broker refused LOOKUP version 1
        self._brokers: list[Address] = []  # the live brokers the last LOOKUP named
        self._clustered = False  # a LOOKUP named several brokers
        self._lookup_supported = True
        self._owner_check = 1.0 if owner_check is None else owner_check
        self._owner_check_fixed = owner_check is not None
        # brokers that left a request unanswered past `owner_check` -> until when lookups ask
        # them last (a frozen bootstrap broker would hold each lookup to its bound)
        self._silent: dict[Address, float] = {}

    @property
    def owner_check(self) -> float:
        return self._owner_check

    def request(self, request: m.Request) -> m.Response:
        """`request` to the server the client was opened on, answered within `timeout`."""
        return self._link.request(request, self._timeout)

    def _link_at(self, address: Address) -> _Link:
        """A usable connection to `address`: the client's own to the bootstrap broker while it
        works, else, in a cluster, one of ours (opened again when the last was lost). On a
        single broker the client's own, even lost: open a new client to go on (the module doc)."""
        if address == self._bootstrap and (self._link.broken is None or not self._clustered):
            return self._link
        link = self._links.get(address)
        if link is None or link.broken is not None:
            link = _Link(address, self._timeout)
            self._links[address] = link
        return link

    def _routed(self, request: m.Request, route: tuple[str, int] | None = None) -> m.Response:
        """`request`, following NOT_OWNER to the owner it names (bounded in hops and time);
        the owner found for `route` is where its next request goes first. A partition's
        request (`route`) in a cluster also follows a lost or silent owner (`_to_owner`)."""
        if route is not None and self._lookup_supported:
            if route not in self._routes:
                self._find_owner(*route)
            if self._clustered:
                return self._to_owner(request, route)
        deadline = time.monotonic() + self._timeout
        target = self._routes.get(route, self._bootstrap) if route is not None else self._bootstrap
        delay = 0.02
        while True:
            try:
                response = self._link_at(target).request(request, self._timeout)
                if route is not None:
                    self._routes[route] = target
                return response
            except NotOwner as exc:
                if time.monotonic() + delay > deadline:
                    raise
                address = exc.owner_address
                if address is None:  # nobody owns it yet: ask again shortly
                    time.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    continue
                target = address

    def _to_owner(self, request: m.Request, route: tuple[str, int]) -> m.Response:
        """The partition's request at its owner, within `timeout`: to the owner NOT_OWNER
        names, or looked up (through the other brokers first when the owner was lost or
        silent) and resent there; while nobody owns it, asked again after a backoff."""
        topic, partition = route
        deadline = time.monotonic() + self._timeout
        target: Address | None = self._routes.get(route)
        delay = 0.02
        lost: ConnectionClosed | None = None  # the last owner's, raised if time runs out
        avoid: Address | None = None  # the last owner lost: long polls go to the others
        while True:
            if target is None:
                target = self._find_owner(topic, partition)
            if target is not None:
                try:
                    response = self._answered_by(target, request, topic, partition, deadline)
                except NotOwner as exc:
                    self._routes.pop(route, None)
                    if time.monotonic() >= deadline:
                        raise
                    target = exc.owner_address
                    if target is not None:
                        continue
                except _Moved as moved:
                    self._routes.pop(route, None)
                    target = moved.owner
                    if target is not None:
                        continue
                except ConnectionClosed as exc:  # the owner died (kill -9) or is out of reach
                    # the others name the dead owner until its lease runs out, and a refused
                    # connect comes back at once: wait for a new owner (below)
                    self._routes.pop(route, None)
                    self._silent[target] = time.monotonic() + SILENT_FOR
                    logger.info("%s; waiting for a new owner of %s/%s", exc, topic, partition)
                    lost, avoid, target = exc, target, None
                else:
                    self._routes[route] = target
                    return response
            if time.monotonic() + delay > deadline:  # nobody owns it yet: ask again shortly
                if lost is not None:
                    raise lost
                raise NotOwner(
                    f"partition {partition} of topic {topic!r} has no owner after "
                    f"{self._timeout:.0f}s of lookups: owner=none"
                )
            # a long poll, answered when a broker sees the new owner's key; else the backoff
            polled, target = self._new_owner(topic, partition, avoid, deadline)
            if not polled or target is None:
                time.sleep(delay)
                delay = min(delay * 2, CHECK_EVERY)

    def _answered_by(
        self, target: Address, request: m.Request, topic: str, partition: int, deadline: float
    ) -> m.Response:
        """The answer of the partition's owner at `target`. Unanswered for `owner_check`
        seconds, the other brokers are asked (`_moved`), then every `CHECK_EVERY` while it stays
        silent: once they name another owner, or none, the connection to the silent broker is
        dropped and `_Moved` raised. Past the deadline: `RequestTimeout`."""
        link = self._link_at(target)
        answer = link.send(request)
        sent = time.monotonic()
        wait = self._owner_check
        while True:
            left = deadline - time.monotonic()
            if link.wait(answer, max(0.0, min(wait, left))):
                return answer.result()  # raises the error the server answered with
            if left <= wait:
                raise link.fail(
                    RequestTimeout(f"no answer from {link.name} to {type(request).__name__}")
                )
            owner = self._moved(topic, partition, target)
            if owner != target:
                silent = time.monotonic() - sent
                logger.warning(
                    "partition %s of %s moved while %s did not answer for %.1fs; resending",
                    partition,
                    topic,
                    link.name,
                    silent,
                )
                link.fail(
                    ConnectionLost(
                        f"{link.name} answered nothing for {silent:.1f}s and the cluster names "
                        f"another owner of partition {partition} of {topic!r}"
                    )
                )
                raise _Moved(owner)
            wait = CHECK_EVERY

    def _moved(self, topic: str, partition: int, silent: Address) -> Address | None:
        """The partition's owner as the brokers other than `silent` name it (None: none now),
        or `silent` when none of them answered: a long poll for a new owner, answered as soon
        as one of them sees its key (or after `LONG_POLL` s), else a plain LOOKUP."""
        self._silent[silent] = time.monotonic() + SILENT_FOR
        polled, owner = self._new_owner(topic, partition, silent, time.monotonic() + LONG_POLL)
        if polled:
            return owner
        for address in [b for b in self._brokers if b != silent]:
            response = self._lookup_at(address, topic)
            if response is not None:
                return self._apply(response, topic, partition)
        return silent

    def _new_owner(
        self, topic: str, partition: int, avoid: Address | None, deadline: float
    ) -> tuple[bool, Address | None]:
        """A LOOKUP long poll (version 1) through a broker other than `avoid` (the silent ones
        last) for an owner of the partition under a newer epoch than the one known, answered
        when that broker sees its key, else after `LONG_POLL` s (or at `deadline`): (True, the
        owner it names, None: none yet). (False, None) when no long poll could be made: the
        brokers predate it (asked once) or none answered."""
        wait = min(LONG_POLL, deadline - time.monotonic())
        if not self._long_polls or not self._clustered or wait <= 0.05:
            return False, None
        known = self._epochs.get((topic, partition), 0)
        request = m.LookupRequest(
            (topic,), int(wait * 1000), (m.LookupWait(topic, partition, known),)
        )
        now = time.monotonic()
        others = [b for b in self._brokers if b != avoid]
        others.sort(key=lambda b: self._silent.get(b, 0.0) > now)
        for address in others:
            try:
                link = self._link_at(address)
                answer = link.send(request)
                if not link.wait(answer, wait + self._owner_check):
                    continue
                response = answer.result()
            except UnsupportedVersion:
                self._long_polls = False
                return False, None
            except (ConnectionClosed, RequestTimeout):
                continue
            assert isinstance(response, m.LookupResponse)
            return True, self._apply(response, topic, partition)
        return False, None

    def _find_owner(self, topic: str, partition: int) -> Address | None:
        """LOOKUP the topic through the bootstrap broker, then each other known broker (the
        silent ones last); the partition's owner (None: none now, or nobody answered)."""
        now = time.monotonic()
        known = [self._bootstrap, *(b for b in self._brokers if b != self._bootstrap)]
        known.sort(key=lambda b: self._silent.get(b, 0.0) > now)
        for address in known:
            try:
                response = self._lookup_at(address, topic)
            except UnsupportedApi:  # a server that predates LOOKUP: one broker
                self._lookup_supported = False
                return self._bootstrap
            if response is not None:
                return self._apply(response, topic, partition)
        return None

    def _lookup_at(self, address: Address, topic: str) -> m.LookupResponse | None:
        """LOOKUP through `address`, answered within `owner_check` (None otherwise)."""
        try:
            link = self._link_at(address)
            answer = link.send(m.LookupRequest((topic,)))
            if not link.wait(answer, self._owner_check):
                return None
            response = answer.result()
        except (ConnectionClosed, RequestTimeout):
            return None
        assert isinstance(response, m.LookupResponse)
        return response

    def _apply(self, response: m.LookupResponse, topic: str, partition: int) -> Address | None:
        """Take a LOOKUP answer (the brokers, the lease, the topic's owners); the partition's
        owner. The topic's error (UNKNOWN_TOPIC, ...) is raised; a partition the answer does not
        have goes to the bootstrap broker, which answers with its error."""
        brokers = {b.broker_id: (b.host, b.port) for b in response.brokers}
        self._clustered = self._clustered or len(brokers) > 1
        if not self._clustered:  # one broker: everything at the address the client knows
            self._routes[(topic, partition)] = self._bootstrap
            return self._bootstrap
        self._brokers = list(brokers.values())
        if response.lease_ms > 0 and not self._owner_check_fixed:
            self._owner_check = response.lease_ms / 2000
        found: Address | None = None
        for answer in response.topics:
            if answer.name != topic:
                continue
            if answer.error_code:
                raise error_for_code(answer.error_code, answer.error_message)
            if partition >= len(answer.partitions):
                return self._bootstrap
            for entry in answer.partitions:
                owner = brokers.get(entry.broker_id)
                self._epochs[(topic, entry.partition)] = entry.epoch
                if owner is None:
                    self._routes.pop((topic, entry.partition), None)
                else:
                    self._routes[(topic, entry.partition)] = owner
                if entry.partition == partition:
                    found = owner
        return found

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        reliable: bool = True,
        configs: dict[str, str] | None = None,
        *,
        exist_ok: bool = False,
    ) -> None:
        """Create a topic (reliable unless `reliable=False`, as `Client.create_topic`); with
        `exist_ok`, one of that name existing already is no error."""
        dispatch = m.DispatchMode.RELIABLE if reliable else m.DispatchMode.NON_RELIABLE
        entries = tuple(m.ConfigEntry(k, v) for k, v in (configs or {}).items())
        try:
            self.request(m.CreateTopicRequest(name, partitions, dispatch, entries))
        except TopicExists:
            if not exist_ok:
                raise

    def produce(self, topic: str, records: Sequence[RecordInput], partition: int = -1) -> int:
        """Send one batch; returns its base offset."""
        request = m.ProduceRequest(topic, partition, build_batch(records))
        response = self._routed(request, (topic, partition) if partition >= 0 else None)
        assert isinstance(response, m.ProduceResponse)
        return response.base_offset

    def map_get(self, topic: str, key: bytes) -> bytes | None:
        response = self._routed(m.MapGetRequest(topic, (key,)))
        assert isinstance(response, m.MapGetResponse)
        return response.entries[0].value

    def map_set(self, topic: str, key: bytes, value: bytes | None) -> int:
        response = self._routed(m.MapSetRequest(topic, (m.MapWrite(key, value),)))
        assert isinstance(response, m.MapSetResponse)
        return response.revisions[0]

    def transactional_producer(
        self, transactional_id: str, timeout: float = 60.0
    ) -> BlockingTransactions:
        """A transactional producer for `transactional_id` (its init fences older instances);
        the server aborts a transaction open longer than `timeout` seconds."""
        return BlockingTransactions(self, transactional_id, timeout)

    def close(self) -> None:
        for link in self._links.values():
            link.close()
        self._link.close()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class BlockingTransactions:
    """A transactional producer on a `BlockingClient` (the module doc)."""

    def __init__(self, client: BlockingClient, transactional_id: str, timeout: float) -> None:
        self._client = client
        self.transactional_id = transactional_id
        self._timeout_ms = round(timeout * 1000)
        self.producer_id = self.epoch = -1
        self.fenced: ProducerFenced | None = None
        self._sequences: dict[tuple[str, int], int] = {}
        self._added: set[tuple[str, int]] = set()
        self._begun = False  # the server has the transaction (something was added)
        self._init()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[BlockingTransactions]:
        """Commit what the block sent if it ends normally, abort it if it raises."""
        self._check_usable()
        try:
            yield self
        except BaseException:
            if self.fenced is None:
                with contextlib.suppress(HeadwaterError):  # the server aborts it at its timeout
                    self.abort()
            raise
        self.commit()

    def produce(self, topic: str, records: Sequence[RecordInput], partition: int) -> int:
        """Send one batch to `partition` of `topic` in the transaction; its base offset."""
        self._check_usable()
        if partition < 0:
            raise InvalidRequest("a transactional batch names its partition (0 or more)")
        where = (topic, partition)
        if where not in self._added:
            request = m.AddPartitionsToTxnRequest(*self._ids(), topic, (partition,))
            self._call(request)
            self._added.add(where)
            self._begun = True
        sequence = self._sequences.get(where, 0)
        builder = BatchBuilder(
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            base_sequence=sequence,
            transactional=True,
        )
        now = int(time.time() * 1000)
        for key, value, headers in records:
            builder.append(key, value, list(headers), now)
        response = self._call(m.ProduceRequest(topic, partition, builder.build()), where)
        assert isinstance(response, m.ProduceResponse)
        self._sequences[where] = sequence + len(records)
        return response.base_offset

    def send_acks(
        self,
        topic: str,
        subscription: str,
        offsets: Mapping[int, Iterable[int]],
        positions: Mapping[int, int] | None = None,
    ) -> None:
        """Acknowledge these offsets (partition -> offsets) of `subscription`'s messages, and
        move its `positions`, if the transaction commits."""
        self._check_usable()
        ranges = tuple(ack_runs((p, o) for p, listed in offsets.items() for o in listed))
        moved = tuple(m.AckEntry(p, o) for p, o in sorted((positions or {}).items()))
        self._call(m.AddAcksToTxnRequest(*self._ids(), topic, subscription, ranges, moved))
        self._begun = True

    def commit(self) -> None:
        self._end(commit=True)

    def abort(self) -> None:
        """Abort the transaction in progress, then bump the epoch (sequences start over)."""
        self._end(commit=False)
        self._init()

    def _end(self, commit: bool) -> None:
        self._check_usable()
        try:
            if self._begun:
                self._call(m.EndTxnRequest(*self._ids(), commit))
        finally:
            self._added.clear()
            self._begun = False

    def _init(self) -> None:
        """INIT_TRANSACTIONS, asked again while the server completes the transaction an older
        instance left open (CONCURRENT_TRANSACTIONS), within the client's timeout."""
        request = m.InitTransactionsRequest(
            self.transactional_id, self._timeout_ms, self.producer_id, self.epoch
        )
        deadline = time.monotonic() + self._client._timeout
        delay = 0.02
        while True:
            try:
                response = self._call(request)
                break
            except ConcurrentTransactions:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        assert isinstance(response, m.InitProducerIdResponse)
        self.producer_id, self.epoch = response.producer_id, response.producer_epoch
        self._sequences.clear()

    def _ids(self) -> tuple[str, int, int]:
        return self.transactional_id, self.producer_id, self.epoch

    def _call(self, request: m.Request, route: tuple[str, int] | None = None) -> m.Response:
        try:
            return self._client._routed(request, route)
        except (ProducerFenced, InvalidProducerEpoch) as exc:
            self.fenced = ProducerFenced(
                f"transactional id {self.transactional_id!r} (producer id {self.producer_id}, "
                f"epoch {self.epoch}) was fenced: {exc.message}"
            )
            raise self.fenced from None

    def _check_usable(self) -> None:
        if self.fenced is not None:
            raise self.fenced
