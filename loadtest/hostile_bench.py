"""Hostile requests against the memory budget, and what a well-behaved client sees meanwhile
(issue 37, "what must show it").

Each scenario runs against a server of its own, started as a real process (`python -m headwater
serve`) on ephemeral ports, Kafka and HTTP ports on; its resident memory is sampled from
/proc/<pid>/status (VmRSS, every 20 ms) and its /metrics (memory budget and use, bytes read) every
100 ms, by this process.

`fetch`: 100 topics of 100 partitions (reliable, fsync `never`), one 4 KiB batch in each
partition, and a topic `deep` of one partition holding 2 MiB. A hostile process opens several
Kafka connections and on each pipelines raw Fetch v4 frames (our codec,
`headwater.server.kafka.codec`) as fast as the server reads them, reading the answers slowly
(64 KiB every 50 ms): first Fetches naming all 10,000 partitions, then Fetches naming `deep`'s
partition 1,000 times, each with a response `max_bytes` and a `partition_max_bytes` of 1 MiB.
Another process, the well-behaved client, loops the whole time on a topic of its own: a native
PRODUCE of one 100-byte record, then a Kafka Fetch v4 of one partition (max 64 KiB), each timed
from its send to its whole answer. Its latencies are reported for each phase: before any attack
(the baseline), under each attack, and after both.

`produce`: a topic `big` of `--big-mib` MiB in 64 MiB segments (reliable, fsync `never`); a
DELETE_TOPIC of it holds its turn while the server syncs and frees the segments; meanwhile a
native connection pipelines 10,000 PRODUCEs of `--produce-kib` KiB into `big` (one pre-encoded
frame written again and again, waiting on the socket's drain as any asyncio writer does) and
reads every answer at once. Reported: the server's peak RSS against its budget, the bytes the
server read from its connections while the turn was held (`headwater_bytes_read_total`, the only
native connections then being this producer's and the idle one that sent the delete), what the
producer had written by then, and how many produces were answered before and after the delete's
answer.

The module measures; it asserts nothing. Progress goes to stderr when it is a terminal; the
result is JSON on stdout (and `--output`), with a summary line per target on stderr.

    python -m loadtest.hostile_bench --seconds 10
    python -m loadtest.hostile_bench --only produce --big-mib 1024 --produce-kib 1024
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import platform
import re
import struct
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.harness import latency_summary, process_rss, say

MIB = 1 << 20
KIB = 1 << 10
GRID_TOPICS = 100
GRID_PARTITIONS = 100
PARTITION_BYTES = 4 * KIB  # one batch of four 1 KiB records in each grid partition
DEEP_MIB = 2
FETCH_MAX_BYTES = MIB
NAMED_TWICE = 1000  # how many times the `deep` Fetch names its one partition
PRODUCES = 10_000
FETCH, FETCH_VERSION = 1, 4
CLIENT_ID = b"hostile-bench"
READ_CHUNK = 64 * KIB  # the hostile reader takes this much ...
READ_PAUSE = 0.05  # ... every this many seconds
_SIZE = struct.Struct(">i")
_CORRELATION = struct.Struct(">i")


# Kafka frames


def kafka_frame(
    correlation: int, body: bytes, api: int = FETCH, version: int = FETCH_VERSION
) -> bytes:
    header = struct.pack(">hhih", api, version, correlation, len(CLIENT_ID)) + CLIENT_ID
    return _SIZE.pack(len(header) + len(body)) + header + body


def fetch_body(named: Sequence[tuple[str, Sequence[int]]], max_bytes: int) -> bytes:
    """A Fetch v4 body reading each (topic, partitions) from offset 0, read_uncommitted (the
    topics are fsync `never`: read_committed would see only sealed segments)."""
    from headwater.server.kafka import codec
    from headwater.server.kafka.messages.fetch import FetchPartition, FetchRequest, FetchTopic

    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=max_bytes,
        isolation_level=0,
        topics=[
            FetchTopic(
                topic,
                [
                    FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=max_bytes)
                    for p in ps
                ],
            )
            for topic, ps in named
        ],
    )
    return codec.encode(codec.layout(FetchRequest, FETCH_VERSION), request)


def grid_topic(index: int) -> str:
    return f"grid-{index:03d}"


def wide_fetch() -> bytes:
    """Every partition of the grid: 10,000."""
    return fetch_body(
        [(grid_topic(t), range(GRID_PARTITIONS)) for t in range(GRID_TOPICS)], FETCH_MAX_BYTES
    )


def repeated_fetch() -> bytes:
    """`deep`'s partition 0, named 1,000 times."""
    return fetch_body([("deep", [0] * NAMED_TWICE)], FETCH_MAX_BYTES)


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = _SIZE.unpack(await reader.readexactly(4))
    return await reader.readexactly(size)


# The server and what is sampled from it


@dataclass
class Server:
    process: Any  # headwater.testing.ServerProcess
    kafka_port: int
    http_port: int

    @property
    def pid(self) -> int:
        pid: int = self.process.process.pid
        return pid

    def log_offset(self) -> int:
        """Where the server's log ends now: a phase's stalls are those logged after it."""
        return int(self.process.log_path.stat().st_size)

    def stalls(self, start: int, end: int | None = None) -> dict[str, Any]:
        """The server's `loop.stalled` lines (a hold of the loop over 50 ms, its own CPU time
        told apart from waiting for a core: headwater/server/loop_lag.py) between two offsets:
        how many, the longest held and late, and the garbage collection in the longest."""
        with self.process.log_path.open("rb") as log:
            log.seek(start)
            text = log.read(None if end is None else end - start)
        held = []
        for line in text.splitlines():
            if b'"loop.stalled"' in line:
                with contextlib.suppress(ValueError):
                    held.append(json.loads(line))
        if not held:
            return {"count": 0}
        worst = max(held, key=lambda e: e.get("ms", 0))
        return {
            "count": len(held),
            "held_ms_total": round(sum(e.get("ms", 0) for e in held), 1),
            "longest_held_ms": worst.get("ms"),
            "longest_late_ms": max(e.get("late_ms", 0) for e in held),
            "longest_gc_ms": worst.get("gc_ms"),
        }

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        wanted = {
            "headwater_bytes_read_total": "bytes_read",
        }
        found: dict[str, float] = {}
        for line in text.splitlines():
            match = re.match(r"^([a-z_]+) ([0-9.e+]+)$", line)
            if match and match.group(1) in wanted:
                found[wanted[match.group(1)]] = float(match.group(2))
        return found


def start_server(root: Path) -> Server:
    from headwater.testing import ServerProcess

    kafka_file, http_file = root / "kafka.port", root / "http.port"
    process = ServerProcess(
        root / "data",
        extra_args=(
            "--kafka-port", "0", "--kafka-port-file", str(kafka_file),
            "--http-port", "0", "--http-port-file", str(http_file),
            "--log-format", "json",
        ),
    ).start()  # fmt: skip
    deadline = time.monotonic() + 30
    while not http_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return Server(process, int(kafka_file.read_text()), int(http_file.read_text()))


@dataclass
class Sampler:
    """VmRSS every 20 ms and the memory budget's use every `every` seconds (SERVER_INFO on a
    native connection of its own), each with its time.monotonic(), on a thread of this process
    (not the server's, nor the clients'). With `scrape`, /metrics too (for
    `headwater_bytes_read_total`). Both cost the server work that grows with its partitions: a
    scrape walks every partition (on the 10,000-partition server it held the loop ~60 ms, the
    baseline's whole p99) and SERVER_INFO walks the data directory on a thread (reused for 1 s),
    so the 10,000-partition server is asked every 2 s and never scraped."""

    server: Server
    scrape: bool = False
    every: float = 0.1
    rss: list[tuple[float, int]] = field(default_factory=list)
    metrics: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        from headwater.client.blocking import BlockingClient
        from headwater.wire import messages as m

        next_info = 0.0
        with BlockingClient(self.server.process.address) as client:
            while not self._stop.is_set():
                now = time.monotonic()
                self.rss.append((now, process_rss(self.server.pid)))
                if now >= next_info:
                    info = client.request(m.ServerInfoRequest())
                    assert isinstance(info, m.ServerInfoResponse)
                    found = {
                        "budget": float(info.memory_budget_bytes),
                        "used": float(info.memory_used_bytes),
                    }
                    if self.scrape:
                        found.update(self.server.metrics())
                    self.metrics.append((now, found))
                    next_info = now + self.every
                self._stop.wait(0.02)

    def peak_rss(self, start: float, end: float) -> int:
        return max((rss for t, rss in self.rss if start <= t <= end), default=0)

    def peak_metric(self, name: str, start: float, end: float) -> float:
        return max((m.get(name, 0.0) for t, m in self.metrics if start <= t <= end), default=0.0)

    def last_metric(self, name: str, before: float) -> tuple[float, float]:
        """(time, value) of the last sample before `before`."""
        found = [(t, m[name]) for t, m in self.metrics if t < before and name in m]
        return found[-1] if found else (0.0, 0.0)


# Setup


async def fill_grid(address: str) -> None:
    import headwater

    record = b"g" * KIB
    async with await headwater.connect(address) as client:
        configs = {"fsync": "never"}
        for t in range(GRID_TOPICS):
            await client.create_topic(
                grid_topic(t), partitions=GRID_PARTITIONS, dispatch="reliable", configs=configs
            )
            if t % 20 == 19:
                say(f"  created {t + 1} of {GRID_TOPICS} topics")
        for name in ("deep", "calm"):
            await client.create_topic(name, partitions=1, dispatch="reliable", configs=configs)
        for t in range(GRID_TOPICS):
            producer = client.producer(grid_topic(t))
            for p in range(GRID_PARTITIONS):
                await producer.send_batch([record] * (PARTITION_BYTES // KIB), partition=p)
            await producer.flush()
            await producer.close()
        producer = client.producer("deep")
        for _ in range(DEEP_MIB * 16):
            await producer.send_batch([b"d" * KIB] * 64, partition=0)
        await producer.flush()
        await producer.close()


async def fill_big(address: str, mib: int) -> None:
    import headwater

    async with await headwater.connect(address) as client:
        await client.create_topic(
            "big",
            partitions=1,
            dispatch="reliable",
            configs={"fsync": "never", "segment.bytes": str(64 * MIB)},
        )
        producer = client.producer("big")
        value = b"b" * (64 * KIB)
        for i in range(mib):
            await producer.send_batch([value] * 16)
            if i % 256 == 255:
                say(f"  big: {i + 1} MiB")
        await producer.flush()
        await producer.close()


# The well-behaved client (a process of its own)


def _behaved_main(address: str, kafka_port: int, stop: Any, out: Any) -> None:
    import uvloop

    out.put(uvloop.run(_behaved(address, kafka_port, stop)))


async def _behaved(address: str, kafka_port: int, stop: Any) -> dict[str, Any]:
    """Alternately a native PRODUCE of one record and a Kafka Fetch of one partition, each
    awaited before the next: [(monotonic time of the send, kind, latency ns)]."""
    import headwater
    from headwater.wire import messages as m
    from headwater.wire.records import build_batch

    batch = build_batch([(None, b"c" * 100, ())])
    fetch = fetch_body([("calm", [0])], 64 * KIB)
    samples: list[tuple[float, str, int]] = []
    errors = 0
    async with await headwater.connect(address) as client:
        reader, writer = await asyncio.open_connection("127.0.0.1", kafka_port)
        correlation = 0
        while not stop.is_set():
            sent, begin = time.monotonic(), time.perf_counter_ns()
            try:
                await client.request(m.ProduceRequest("calm", 0, batch))
            except Exception:
                errors += 1
            samples.append((sent, "native produce", time.perf_counter_ns() - begin))
            correlation += 1
            sent, begin = time.monotonic(), time.perf_counter_ns()
            writer.write(kafka_frame(correlation, fetch))
            await read_frame(reader)
            samples.append((sent, "kafka fetch", time.perf_counter_ns() - begin))
            await asyncio.sleep(0.001)  # a client with work of its own, not a tight loop
        writer.close()
    return {"samples": samples, "errors": errors}


# The hostile Kafka client (a process of its own)


def _hostile_main(
    kafka_port: int, frame_body: bytes, connections: int, seconds: float, out: Any
) -> None:
    import uvloop

    out.put(uvloop.run(_hostile(kafka_port, frame_body, connections, seconds)))


async def _hostile(
    kafka_port: int, body: bytes, connections: int, seconds: float
) -> dict[str, Any]:
    """`connections` connections, each pipelining Fetch frames of `body` as fast as the server
    reads them, and taking READ_CHUNK of the answers every READ_PAUSE."""
    deadline = time.monotonic() + seconds
    totals = {"requests_sent": 0, "bytes_sent": 0, "answer_bytes_read": 0, "connections_closed": 0}
    frames = [kafka_frame(i, body) for i in range(1, 65)]

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", kafka_port)

        async def write() -> None:
            i = 0
            while time.monotonic() < deadline:
                writer.write(frames[i % len(frames)])
                i += 1
                totals["requests_sent"] += 1
                totals["bytes_sent"] += len(body)
                await writer.drain()

        async def read() -> None:
            while time.monotonic() < deadline:
                data = await reader.read(READ_CHUNK)
                if not data:
                    totals["connections_closed"] += 1
                    return
                totals["answer_bytes_read"] += len(data)
                await asyncio.sleep(READ_PAUSE)

        tasks = [asyncio.ensure_future(write()), asyncio.ensure_future(read())]
        await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()) + 1)
        for task in tasks:
            task.cancel()
        writer.transport.abort()

    await asyncio.gather(*(one() for _ in range(connections)), return_exceptions=True)
    return totals


# Scenario 1


def _phase_summary(
    samples: list[tuple[float, str, int]], start: float, end: float
) -> dict[str, dict[str, float]]:
    by_kind: dict[str, list[int]] = {}
    for sent, kind, latency in samples:
        if start <= sent < end:
            by_kind.setdefault(kind, []).append(latency)
    return {kind: latency_summary(latencies) for kind, latencies in sorted(by_kind.items())}


def run_fetch(seconds: float, connections: int) -> dict[str, Any]:
    context = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp))
        try:
            say(f"fetch: filling {GRID_TOPICS} x {GRID_PARTITIONS} partitions ...")
            began = time.monotonic()
            asyncio.run(fill_grid(server.process.address))
            setup_s = round(time.monotonic() - began, 1)
            say(f"fetch: filled in {setup_s} s")
            sampler = Sampler(server, every=2.0).start()
            stop, out = context.Event(), context.Queue()
            behaved = context.Process(
                target=_behaved_main, args=(server.process.address, server.kafka_port, stop, out)
            )
            behaved.start()
            time.sleep(2)  # the well-behaved client's process starts and connects
            phases: list[tuple[str, float, float, dict[str, Any], dict[str, Any]]] = []
            start, logged = time.monotonic(), server.log_offset()
            say(f"fetch: baseline, no attack, {seconds:.0f} s")
            time.sleep(seconds)
            phases.append(
                ("no attack (before)", start, time.monotonic(), {}, server.stalls(logged))
            )
            for name, body in (
                (f"Fetch of {GRID_TOPICS * GRID_PARTITIONS:,} partitions", wide_fetch()),
                (f"Fetch naming one partition {NAMED_TWICE:,} times", repeated_fetch()),
            ):
                say(f"fetch: attack: {name}, {connections} connections, {seconds:.0f} s")
                hostile_out = context.Queue()
                hostile = context.Process(
                    target=_hostile_main,
                    args=(server.kafka_port, body, connections, seconds, hostile_out),
                )
                start, logged = time.monotonic(), server.log_offset()
                hostile.start()
                totals = hostile_out.get(timeout=seconds + 60)
                hostile.join(10)
                end = time.monotonic()
                totals["request_bytes"] = len(body)
                phases.append((name, start, end, totals, server.stalls(logged)))
                time.sleep(2)  # the attack's connections are closed and their answers dropped
            start, logged = time.monotonic(), server.log_offset()
            say(f"fetch: no attack (after), {seconds:.0f} s")
            time.sleep(seconds)
            phases.append(("no attack (after)", start, time.monotonic(), {}, server.stalls(logged)))
            stop.set()
            result = out.get(timeout=60)
            behaved.join(10)
            sampler.stop()
            budget = sampler.peak_metric("budget", 0, time.monotonic())
            rows = []
            for name, begin, end, totals, stalls in phases:
                rows.append(
                    {
                        "phase": name,
                        "seconds": round(end - begin, 1),
                        "server_peak_rss_mib": round(sampler.peak_rss(begin, end) / MIB, 1),
                        "memory_used_peak_mib": round(
                            sampler.peak_metric("used", begin, end) / MIB, 1
                        ),
                        "well_behaved": _phase_summary(result["samples"], begin, end),
                        "server_loop_stalls": stalls,
                        **({"attacker": totals} if totals else {}),
                    }
                )
            return {
                "setup_s": setup_s,
                "connections": connections,
                "budget_mib": round(budget / MIB, 1),
                "server_peak_rss_since_start_mib": round(server.process.peak_rss() / MIB, 1),
                "well_behaved_errors": result["errors"],
                "phases": rows,
            }
        finally:
            server.process.stop()


# Scenario 2


async def _held_produce(address: str, produce_kib: int, count: int) -> dict[str, Any]:
    import headwater
    from headwater.wire import messages as m
    from headwater.wire.frames import Frame, FrameDecoder
    from headwater.wire.protocol import encode_request
    from headwater.wire.records import build_batch

    frame = encode_request(
        m.ProduceRequest("big", 0, build_batch([(None, b"p" * (produce_kib * KIB - 100), ())])), 1
    )
    host, port = address.rsplit(":", 1)
    async with await headwater.connect(address) as admin:
        delete_sent = time.monotonic()
        delete = asyncio.ensure_future(admin.request(m.DeleteTopicRequest("big"), timeout=600))
        await asyncio.sleep(0.1)  # the delete is read and holds the turn
        reader, writer = await asyncio.open_connection(host, int(port))
        producing = time.monotonic()
        written: list[float] = []  # when each produce left the client (its drain returned)
        answered: list[tuple[float, int]] = []  # (when, error code)

        async def write() -> None:
            for _ in range(count):
                writer.write(frame)
                await writer.drain()
                written.append(time.monotonic())

        async def read() -> None:
            decoder = FrameDecoder()
            while len(answered) < count:
                data = await reader.read(1 << 20)
                if not data:
                    return
                now = time.monotonic()
                for got in decoder.feed(data):
                    if isinstance(got, Frame):
                        answered.append((now, struct.unpack_from(">h", got.body)[0]))

        tasks = [asyncio.ensure_future(write()), asyncio.ensure_future(read())]
        await delete
        freed = time.monotonic()
        say(f"produce: the delete answered after {freed - delete_sent:.2f} s")
        await asyncio.wait_for(asyncio.gather(*tasks), 600)
        done = time.monotonic()
        writer.close()
    codes: dict[str, int] = {}
    for _, code in answered:
        codes[str(code)] = codes.get(str(code), 0) + 1
    return {
        "delete_sent": delete_sent,
        "producing": producing,
        "freed": freed,
        "done": done,
        "frame_bytes": len(frame),
        "written_while_held": sum(1 for t in written if t < freed),
        "answered_while_held": sum(1 for t, _ in answered if t < freed),
        "answered_after": sum(1 for t, _ in answered if t >= freed),
        "answer_codes": codes,
    }


def run_produce(big_mib: int, produce_kib: int, count: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp))
        try:
            say(f"produce: filling `big` with {big_mib} MiB ...")
            asyncio.run(fill_big(server.process.address, big_mib))
            sampler = Sampler(server, scrape=True).start()
            time.sleep(0.5)
            logged = server.log_offset()
            say(f"produce: DELETE_TOPIC big, then {count:,} produces of {produce_kib} KiB")
            held = asyncio.run(_held_produce(server.process.address, produce_kib, count))
            time.sleep(0.5)
            sampler.stop()
            budget = sampler.peak_metric("budget", 0, time.monotonic())
            _, read_before = sampler.last_metric("bytes_read", held["producing"])
            at, read_held = sampler.last_metric("bytes_read", held["freed"])
            frame = held["frame_bytes"]
            return {
                "big_mib": big_mib,
                "produce_bytes": frame,
                "produces": count,
                "budget_mib": round(budget / MIB, 1),
                "turn_held_s": round(held["freed"] - held["delete_sent"], 2),
                "producing_while_held_s": round(held["freed"] - held["producing"], 2),
                "server_rss_before_mib": round(
                    sampler.peak_rss(held["producing"] - 0.4, held["producing"]) / MIB, 1
                ),
                "server_peak_rss_while_held_mib": round(
                    sampler.peak_rss(held["producing"], held["freed"]) / MIB, 1
                ),
                "server_peak_rss_after_mib": round(
                    sampler.peak_rss(held["freed"], held["done"]) / MIB, 1
                ),
                "memory_used_peak_while_held_mib": round(
                    sampler.peak_metric("used", held["producing"], held["freed"]) / MIB, 1
                ),
                "bytes_read_while_held": int(read_held - read_before),
                "bytes_read_while_held_in_produces": round((read_held - read_before) / frame, 1),
                "bytes_read_sampled_before_freed_s": round(held["freed"] - at, 2),
                "produces_written_by_client_while_held": held["written_while_held"],
                "answered_while_held": held["answered_while_held"],
                "answered_after": held["answered_after"],
                "answer_codes": held["answer_codes"],
                "after_s": round(held["done"] - held["freed"], 1),
                "server_loop_stalls": server.stalls(logged),
            }
        finally:
            server.process.stop()


def summary_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    fetch = report.get("fetch")
    if fetch:
        budget = fetch["budget_mib"]
        base = fetch["phases"][0]["well_behaved"]
        for row in fetch["phases"][1:3]:
            p99s = {k: v.get("p99_ms") for k, v in row["well_behaved"].items()}
            base_p99 = {k: v.get("p99_ms") for k, v in base.items()}
            held = row["server_peak_rss_mib"] <= budget and all(
                (v or 0) < 50 for v in p99s.values()
            )
            lines.append(
                f"{row['phase']}: peak RSS {row['server_peak_rss_mib']} MiB (budget {budget} MiB), "
                f"well-behaved p99 {p99s} ms (no attack: {base_p99}) -> "
                f"{'held' if held else 'NOT held'} (RSS within budget, p99 < 50 ms)"
            )
    produce = report.get("produce")
    if produce:
        held = (
            produce["server_peak_rss_while_held_mib"] <= produce["budget_mib"]
            and produce["answered_while_held"] == 0
        )
        lines.append(
            f"{produce['produces']:,} produces into a held topic: peak RSS "
            f"{produce['server_peak_rss_while_held_mib']} MiB "
            f"(budget {produce['budget_mib']} MiB), "
            f"{produce['bytes_read_while_held']:,} bytes read while held "
            f"({produce['bytes_read_while_held_in_produces']} produces), answered "
            f"{produce['answered_while_held']} while held / {produce['answered_after']} after -> "
            f"{'held' if held else 'NOT held'} (RSS within budget, back-pressured)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["fetch", "produce"], help="run one scenario")
    parser.add_argument("--seconds", type=float, default=10, help="each fetch phase's length")
    parser.add_argument("--connections", type=int, default=4, help="hostile Kafka connections")
    parser.add_argument("--big-mib", type=int, default=1024, help="MiB the deleted topic holds")
    parser.add_argument("--produce-kib", type=int, default=1024, help="KiB of each produce")
    parser.add_argument("--produces", type=int, default=PRODUCES)
    parser.add_argument("--output", type=Path, help="also write the JSON report here")
    args = parser.parse_args()
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_before": os.getloadavg(),
    }
    if args.only in (None, "fetch"):
        report["fetch"] = run_fetch(args.seconds, args.connections)
    if args.only in (None, "produce"):
        report["produce"] = run_produce(args.big_mib, args.produce_kib, args.produces)
    report["load_average_after"] = os.getloadavg()
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    for line in summary_lines(report):
        say(line)


if __name__ == "__main__":
    main()
