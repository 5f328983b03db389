"""A hostile client in a process of its own, for tests/test_hostile.py.

`python -m tests.support.hostile_peer ATTACK HOST:PORT SECONDS [ARG]` prints `attacking` once the
attack is under way, keeps it up for at least SECONDS and until its stdin gives a line or ends (the
test has measured what it needed meanwhile: on a loaded machine that takes longer, so the attack
lasts as long as the measurement rather than a fixed window; `HANG_BOUND` bounds it), then prints
one JSON line of counts and exits. Plain blocking sockets: the attacker must not share an event
loop (or a GIL) with the client whose latency the test measures. Attacks:

- `bomb TOPIC`: PRODUCE a 96 KiB zstd batch that inflates to 3 GiB, again and again (at least
  `MIN_BOMBS` of them);
- `pipeline`: send 5,000 LIST_TOPICS at once and never read an answer;
- `idle N`: open N connections and send nothing;
- `partial N`: keep N connections each inside an incomplete frame, replacing the closed ones;
- `flood TOPIC`: fire-and-forget PRODUCEs of one tiny record in 4 MiB writes, nonstop (at least
  `MIN_FLOOD_WRITES` of them);
- `badframes N`: N frames with an unknown api key, in large writes, answers read and dropped;
- `anonymous N SOURCE`: hold N silent connections from the source address SOURCE (e.g.
  127.0.0.2), reopening each as soon as the server answers or closes it;
- `preauth`: on a server with authentication, one connection after another sends, without
  authenticating, a frame of `MAX_FRAME_SIZE` of each request type in turn, its body the worst
  the type allows (an array of millions of empty elements where it has one), and reads the answer.
"""

from __future__ import annotations

import contextlib
import json
import select
import selectors
import socket
import struct
import sys
import threading
import time
from collections import Counter

import cramjam
import crc32c

from headwater.wire import messages as m
from headwater.wire.frames import Flags, FrameDecoder, frame_prefix
from headwater.wire.limits import MAX_FRAME_SIZE
from headwater.wire.protocol import APIS, encode_request
from headwater.wire.records import Compression, build_batch

ERROR = struct.Struct(">h")


def bomb_batch(frames: int = 48) -> bytes:
    """A record batch whose zstd payload is `frames` x 64 MiB of zeros (~96 KiB, 3 GiB)."""
    unit = bytes(cramjam.zstd.compress(bytes(64 << 20), level=19))
    payload = unit * frames
    header = bytearray(build_batch([(None, b"x", [])], compression=Compression.ZSTD)[:61])
    struct.pack_into(">i", header, 8, len(header) + len(payload) - 12)
    batch = header + payload
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def error_codes(data: bytes, decoder: FrameDecoder, codes: Counter[int]) -> None:
    for frame in decoder.feed(data):
        body = getattr(frame, "body", b"")
        if len(body) >= 2:
            codes[ERROR.unpack_from(body)[0]] += 1


HANG_BOUND = 300.0  # seconds: the longest an attack waits for its stop
MIN_FLOOD_WRITES = 4
MIN_BOMBS = 5


class AttackClock:
    """When the attack ends: at least `seconds` after it started, once the test said stop."""

    def __init__(self, seconds: float) -> None:
        now = time.monotonic()
        self._earliest = now + seconds
        self._latest = now + max(seconds, HANG_BOUND)
        self._stop = threading.Event()
        threading.Thread(target=self._await_stop, daemon=True).start()

    def _await_stop(self) -> None:
        sys.stdin.readline()  # a line, or the end of stdin
        self._stop.set()

    def overdue(self) -> bool:
        return time.monotonic() >= self._latest

    def ended(self) -> bool:
        now = time.monotonic()
        return now >= self._latest or (now >= self._earliest and self._stop.is_set())

    def wait(self) -> None:
        """Sleep until the attack ends."""
        while not self.ended():
            time.sleep(0.02)


def started(seconds: float) -> AttackClock:
    """Announce the attack; its clock starts now (after any setup)."""
    print("attacking", flush=True)
    return AttackClock(seconds)


def bomb(address: str, seconds: float, topic: str) -> dict[str, object]:
    request = encode_request(m.ProduceRequest(topic, -1, bomb_batch()), 1)
    sock = connect(address)
    decoder = FrameDecoder()
    codes: Counter[int] = Counter()
    slowest = 0.0
    clock = started(seconds)
    # at least MIN_BOMBS answered, however slowly a loaded machine refuses them
    while not clock.ended() or (sum(codes.values()) < MIN_BOMBS and not clock.overdue()):
        begin = time.monotonic()
        sock.sendall(request)
        answered = sum(codes.values()) + 1
        while sum(codes.values()) < answered:
            error_codes(sock.recv(65536), decoder, codes)
        slowest = max(slowest, time.monotonic() - begin)
    return {"codes": dict(codes), "slowest": slowest, "size": len(request)}


def pipeline(address: str, seconds: float) -> dict[str, object]:
    """5,000 LIST_TOPICS, then 5,000 more whenever the server takes them, never reading."""
    sock = connect(address)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    data = b"".join(encode_request(m.ListTopicsRequest(), i) for i in range(5000))
    clock = started(seconds)
    sent = 0
    blocked = False
    sock.settimeout(1.0)
    while not clock.ended():
        try:
            sock.sendall(data)
            sent += 5000
        except TimeoutError:
            blocked = True  # the server stopped reading: as it should
            break
    clock.wait()  # hold the connection, never read
    return {"sent": sent, "blocked": blocked}


def idle(address: str, seconds: float, count: int) -> dict[str, object]:
    sockets = []
    failed = 0
    for _ in range(count):
        try:
            sockets.append(connect(address))
        except OSError:
            failed += 1
    clock = started(seconds)
    clock.wait()
    codes: Counter[int] = Counter()
    closed = 0
    for sock in sockets:
        sock.setblocking(False)
        decoder = FrameDecoder()
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            continue
        except OSError:
            closed += 1
            continue
        error_codes(data, decoder, codes)
        closed += 1
    return {"open": len(sockets), "failed": failed, "closed": closed, "codes": dict(codes)}


def partial(address: str, seconds: float, count: int) -> dict[str, object]:
    fragment = encode_request(m.DescribeTopicRequest("some-topic"), 1)[:-3]
    live: list[socket.socket] = []
    codes: Counter[int] = Counter()
    opened = 0
    clock: AttackClock | None = None
    while clock is None or not clock.ended():
        while len(live) < count:
            sock = connect(address)
            sock.sendall(fragment)
            live.append(sock)
            opened += 1
        clock = clock or started(seconds)
        ready, _, _ = select.select(live, [], [], 0.2)
        for sock in ready:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if data:
                error_codes(data, FrameDecoder(), codes)
            sock.close()
            live.remove(sock)
    return {"opened": opened, "codes": dict(codes)}


def _drain(sock: socket.socket, codes: Counter[int], done: threading.Event) -> None:
    decoder = FrameDecoder()
    while not done.is_set():
        # select, not a socket timeout: the timeout would apply to the writer's sendall too
        readable, _, _ = select.select([sock], [], [], 0.5)
        if not readable:
            continue
        try:
            data = sock.recv(1 << 20)
        except OSError:
            return
        if not data:
            return
        error_codes(data, decoder, codes)


def flood(address: str, seconds: float, topic: str) -> dict[str, object]:
    """Tiny fire-and-forget PRODUCEs in 4 MiB writes: every read the server makes is thousands
    of frames, each cheap, together a long stretch of work."""
    sock = connect(address)
    batch = build_batch([(None, b"f", [])])
    one = encode_request(m.ProduceRequest(topic, -1, batch), 7, int(Flags.NO_RESPONSE))
    chunk = one * (4 * 1024 * 1024 // len(one))
    codes: Counter[int] = Counter()
    done = threading.Event()
    reader = threading.Thread(target=_drain, args=(sock, codes, done), daemon=True)
    reader.start()
    clock = started(seconds)
    writes = 0
    sock.settimeout(None)  # a timed-out sendall would leave half a frame behind
    # at least MIN_FLOOD_WRITES (100,000 frames or more), however slowly the server reads
    while not clock.ended() or (writes < MIN_FLOOD_WRITES and not clock.overdue()):
        sock.sendall(chunk)
        writes += 1
    done.set()
    reader.join(2)
    return {"writes": writes, "frames": writes * (len(chunk) // len(one)), "codes": dict(codes)}


def badframes(address: str, seconds: float, count: int) -> dict[str, object]:
    sock = connect(address)
    one = struct.pack(">ihhiH", 10, 999, 0, 1, 0)  # api key 999: UNSUPPORTED_API
    codes: Counter[int] = Counter()
    done = threading.Event()
    reader = threading.Thread(target=_drain, args=(sock, codes, done), daemon=True)
    reader.start()
    clock = started(seconds)
    sock.sendall(one * count)
    while sum(codes.values()) < count and not clock.ended():
        time.sleep(0.05)
    done.set()
    reader.join(2)
    return {"codes": dict(codes)}


def _topic(name: bytes = b"t") -> bytes:
    return struct.pack(">H", len(name)) + name


def worst_body(api_key: int, size: int) -> bytes:
    """A request body of `size` bytes: where the request has an array, the array's count and
    that many of its smallest elements fill it (the most elements a frame can carry)."""
    n = struct.Struct(">i").pack
    if api_key in (m.ApiKey.CREATE_TOPIC, m.ApiKey.ALTER_TOPIC_CONFIGS):
        head = _topic() + (n(1) + b"\x00" if api_key == m.ApiKey.CREATE_TOPIC else b"")
        count = (size - len(head) - 4) // 4  # a config of two empty names: 4 bytes
        return head + n(count) + bytes(4 * count)
    if api_key in (m.ApiKey.ACK, m.ApiKey.NACK):
        head = n(1) + (b"\x00" if api_key == m.ApiKey.ACK else n(0))
        count = (size - len(head) - 4) // 12
        return head + n(count) + bytes(12 * count)
    if api_key == m.ApiKey.SUBSCRIBE:
        settings = struct.pack(">bqiibiiBb", 0, 0, 0, 0, 0, 0, 0, 0, 0) + n(0) + n(-1)
        head = _topic() + _topic(b"s") + b"\x00" + _topic(b"c") + n(0) + n(0) + settings
        count = (size - len(head) - 4) // 4
        return head + n(count) + bytes(4 * count)
    if api_key in (m.ApiKey.MAP_GET, m.ApiKey.MAP_SET):
        unit = 4 if api_key == m.ApiKey.MAP_GET else 16
        count = (size - 3 - 4) // unit
        return _topic() + n(count) + bytes(unit * count)
    if api_key == m.ApiKey.LOOKUP:
        count = (size - 4) // 2
        return n(count) + bytes(2 * count)
    return bytes(size)


def preauth(address: str, seconds: float) -> dict[str, object]:
    size = MAX_FRAME_SIZE - 10
    keys = [key for key in APIS if key != m.ApiKey.API_VERSIONS]
    bodies = {key: worst_body(key, size) for key in keys}
    codes: Counter[int] = Counter()
    per_key: dict[str, int] = {}
    unanswered = 0
    clock = started(seconds)
    while not clock.ended():
        for key in keys:
            sock = connect(address)
            # the server answers from the header and closes: the rest is not read
            with contextlib.suppress(OSError):
                sock.sendall(frame_prefix(key, 0, 1, 0, size) + bodies[key])
            decoder = FrameDecoder()
            got = Counter[int]()
            try:
                while not got:
                    data = sock.recv(65536)
                    if not data:
                        break
                    error_codes(data, decoder, got)
            except OSError:
                pass
            sock.close()
            if got:
                codes.update(got)
                per_key[str(key)] = next(iter(got))
            else:
                unanswered += 1
            if clock.ended():
                break
    return {"codes": dict(codes), "per_key": per_key, "unanswered": unanswered}


def anonymous(address: str, seconds: float, count: int, source: str) -> dict[str, object]:
    host, port = address.rsplit(":", 1)
    selector = selectors.DefaultSelector()  # epoll: thousands of sockets, past select's 1024
    codes: Counter[int] = Counter()
    opened = failed = 0
    live = 0

    def fill() -> None:
        nonlocal opened, failed, live
        while live < count:
            try:
                sock = socket.create_connection(
                    (host, int(port)), timeout=10, source_address=(source, 0)
                )
            except OSError:
                failed += 1
                return
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
            live += 1
            opened += 1

    fill()
    clock = started(seconds)
    while not clock.ended():
        for key, _ in selector.select(0.2):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if data:
                error_codes(data, FrameDecoder(), codes)
            selector.unregister(sock)
            sock.close()
            live -= 1
        fill()
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    return {"opened": opened, "failed": failed, "codes": dict(codes)}


def main() -> None:
    attack, address, duration, *args = sys.argv[1:]
    seconds = float(duration)
    if attack == "bomb":
        result = bomb(address, seconds, args[0])
    elif attack == "pipeline":
        result = pipeline(address, seconds)
    elif attack == "idle":
        result = idle(address, seconds, int(args[0]))
    elif attack == "partial":
        result = partial(address, seconds, int(args[0]))
    elif attack == "flood":
        result = flood(address, seconds, args[0])
    elif attack == "badframes":
        result = badframes(address, seconds, int(args[0]))
    elif attack == "anonymous":
        result = anonymous(address, seconds, int(args[0]), args[1])
    elif attack == "preauth":
        result = preauth(address, seconds)
    else:
        raise SystemExit(f"unknown attack {attack}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
