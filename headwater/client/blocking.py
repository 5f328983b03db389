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
`timeout` seconds. The client does not look up routes itself (no LOOKUP): it follows the
brokers' answers, and remembers the owner of each partition it produced to.

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
)
from headwater.wire.records import BatchBuilder, RecordInput, build_batch
from headwater.wire.session import Answer, ClientSession


class BlockingClient:
    def __init__(self, server: str | None = None, timeout: float = 10.0) -> None:
        """`server` is "host:port"; by default $HEADWATER_SERVER, else 127.0.0.1:6650."""
        host, port = parse_server(server or default_server())
        self._address = f"{host}:{port}"
        self._broken: HeadwaterError | None = None
        try:
            self._socket = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise CannotConnect(
                f"cannot connect to {host}:{port}: {exc} (is a server running there?)"
            ) from None
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._session = ClientSession(time.monotonic)
        self._timeout = timeout
        self._owners: dict[tuple[str, int], BlockingClient] = {}  # other brokers (a cluster)
        self._routes: dict[tuple[str, int], BlockingClient] = {}  # (topic, partition) -> owner

    def _routed(self, request: m.Request, route: tuple[str, int] | None = None) -> m.Response:
        """`request`, following NOT_OWNER to the owner it names (bounded in hops and time);
        the owner found for `route` is where its next request goes first."""
        deadline = time.monotonic() + self._timeout
        target = self._routes.get(route, self) if route is not None else self
        delay = 0.02
        while True:
            try:
                response = target.request(request)
                if route is not None and target is not self:
                    self._routes[route] = target
                elif route is not None:
                    self._routes.pop(route, None)
                return response
            except NotOwner as exc:
                if time.monotonic() + delay > deadline:
                    raise
                address = exc.owner_address
                if address is None:  # nobody owns it yet: ask again shortly
                    time.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    continue
                target = self._owner(address)

    def _owner(self, address: tuple[str, int]) -> BlockingClient:
        if address == parse_server(self._address):
            return self
        client = self._owners.get(address)
        if client is None or client._broken is not None:
            client = BlockingClient(f"{address[0]}:{address[1]}", self._timeout)
            self._owners[address] = client
        return client

    def request(self, request: m.Request) -> m.Response:
        if self._broken is not None:
            raise ConnectionLost(f"connection to {self._address} unusable: {self._broken.message}")
        answer = Answer()
        _, frame = self._session.request(request, answer)
        try:
            delay = self._session.throttle_delay() if type(request) is m.ProduceRequest else 0.0
            if delay > 0:
                time.sleep(delay)  # the server's THROTTLE: this principal is over its quota
            self._socket.sendall(frame)
            while not answer.done():
                fatal = self._session.receive(self._read())
                if fatal is not None:
                    raise fatal
        except TimeoutError:
            raise self._break(
                RequestTimeout(f"no answer from {self._address} to {type(request).__name__}")
            ) from None
        except OSError as exc:
            raise self._break(self._lost(str(exc))) from None
        except (ConnectionClosed, AuthenticationFailed) as exc:  # lost, or credential revoked
            raise self._break(exc) from None
        except HeadwaterError as exc:  # the bytes from the server do not decode as frames
            raise self._break(self._lost(f"the server sent an invalid frame: {exc}")) from None
        return answer.result()  # raises the error the server answered with

    def _lost(self, reason: str) -> ConnectionLost:
        return ConnectionLost(f"connection to {self._address} lost: {reason}")

    def _break(self, error: HeadwaterError) -> HeadwaterError:
        self._broken = error
        self._session.fail(error)
        self._socket.close()
        return error

    def _read(self) -> bytes:
        data = self._socket.recv(65536)
        if not data:
            raise self._lost("closed by the server")
        return data

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
        for client in self._owners.values():
            client.close()
        self._socket.close()

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
