"""Soak test: a steady rate for a set time, every message numbered, nothing may go missing.

A server in its own process (data in a temporary directory on disk; `--object-store local`, the
default configuration's, copies each sealed segment to a directory on the same disk, `none` does
not), one producer process and one consumer process (loadtest/harness.py). The producer sends
`--rate` msgs/s to a reliable topic (fsync `--fsync`, at-least-once, a flush every 100 ms) and the
same rate to a non-reliable topic, in 1 ms ticks, for `--seconds` (default 600). Each value
starts with its sequence number and its send time (CLOCK_MONOTONIC ns). The consumer checks the
sequence numbers:

- reliable: every acknowledged number must arrive (a bitmap of what came); `lost` must be 0.
  Duplicates (redeliveries) and numbers arriving out of order are counted, not errors;
- non-reliable: the gaps are the drops; they are compared with the server's MESSAGES_DROPPED
  notices.

It also computes p99 end-to-end latency per `--window` seconds, and says where each window's tail
went: the server traces every `TRACE_EVERY`-th offset's stages (`--trace-every`,
server/net/stage_trace.py), the consumer keeps the send and taken times of those offsets, and the
parent gathers the server's events and its longest event-loop holds every window (GET
/debug/stages); joined (loadtest/stages.py), each window reports the mean milliseconds per stage
of its messages at or past the p99 and its longest hold with the garbage collection inside it,
and the consumer process's longest collection in the window (`consumer_longest_gc`: the
consumer's side of the tail, `dispatched->taken`). Each client's collections over the whole run
are in its report's `gc`.
Every second the parent samples the server's resident memory (VmRSS) and open file descriptors
from /proc. Verdict: zero reliable
messages lost, and RSS and fds flat after `--warmup` seconds (last fifth vs the first fifth after
warm-up, medians: RSS within 10%, fds within 2). The report goes to stdout as JSON (`--output` too);
`--chart` writes p99, RSS and fds over time as a PNG. Exit status 1 when the verdict fails.

    python -m loadtest.soak --seconds 600 --rate 10000 --chart loadtest/results/soak.png
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import struct
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

import headwater
from headwater.testing import ServerProcess
from loadtest import stages
from loadtest.bench import _scratch_parent, machine
from loadtest.harness import (
    Client,
    Context,
    percentile,
    process_fds,
    process_rss,
    run_row,
    say,
    ticks,
)

HEADER = struct.Struct(">qq")  # sequence number, send time (monotonic ns)
TOPICS = {"reliable": "soak-reliable", "non_reliable": "soak-non-reliable"}
SUBSCRIPTION = "soak"
# at 10,000 msgs/s per topic, 100 traced messages per topic per 10 s window; at 50,000, 500
TRACE_EVERY = 1000


async def producer(
    ctx: Context, address: str, rate: int, seconds: float, size: int
) -> dict[str, Any]:
    padding = b"s" * max(0, size - HEADER.size)
    per_tick = max(1, rate // 1000)
    clients = {kind: await headwater.connect(address) for kind in TOPICS}
    producers = {kind: clients[kind].producer(topic) for kind, topic in TOPICS.items()}
    acked, errors = 0, 0
    started = await ctx.start()
    sequence = 0
    async for tick in ticks(started, seconds):
        for _ in range(per_tick):
            now = time.monotonic_ns()
            for kind in TOPICS:
                await producers[kind].send(HEADER.pack(sequence, now) + padding)
            sequence += 1
        if tick % 100 == 99:
            try:
                await producers["reliable"].flush()  # every send so far acknowledged
                acked = sequence
            except headwater.HeadwaterError as exc:
                errors += 1
                say(f"  reliable send failed: {exc}")
        if tick % 10_000 == 0:
            say(f"  {tick / 1000:.0f}s: {sequence:,} sent per topic")
    try:
        await producers["reliable"].flush()
        acked = sequence
    except headwater.HeadwaterError:
        errors += 1
    await producers["non_reliable"].flush()
    ctx.produced.set()
    for client in clients.values():
        await client.close()
    return {"sent": sequence, "acked": acked, "send_errors": errors, "cpu_s": ctx.cpu()}


class Tally:
    """What one topic's consumer saw: a bitmap of sequence numbers and this window's latencies.

    The latencies go into an `array` (no Python int kept per message) and their p99 is computed
    after the run: sorting a window's 100,000 latencies on the consumer's loop at each window's
    end held it 20-40 ms, and that stall was the next window's tail (`dispatched->taken`).
    """

    def __init__(self, capacity: int) -> None:
        self.seen = bytearray(capacity)
        self.unique = 0
        self.duplicates = 0
        self.out_of_order = 0
        self.gaps = 0  # numbers skipped over: drops, on a non-reliable topic
        self.next = 0
        self.window = array("q")
        self.samples: list[stages.Sample] = []  # this window's traced messages

    def add(self, sequence: int, latency_ns: int) -> None:
        self.window.append(latency_ns)
        if sequence >= len(self.seen):
            return
        if self.seen[sequence]:
            self.duplicates += 1
            return
        self.seen[sequence] = 1
        self.unique += 1
        if sequence > self.next:
            self.gaps += sequence - self.next
        elif sequence < self.next:
            self.out_of_order += 1
        self.next = max(self.next, sequence + 1)

    def take_window(self) -> array[int]:
        window, self.window = self.window, array("q")
        return window

    def take_samples(self) -> list[stages.Sample]:
        samples, self.samples = self.samples, []
        return samples


async def consumer(
    ctx: Context, address: str, rate: int, seconds: float, window: float
) -> dict[str, Any]:
    capacity = max(1, rate // 1000) * int(seconds * 1000)
    tallies = {kind: Tally(capacity) for kind in TOPICS}
    async with await headwater.connect(address) as client:
        consumers = {
            kind: await client.subscribe(topic, SUBSCRIPTION, prefetch=20_000)
            for kind, topic in TOPICS.items()
        }
        started = await ctx.start()
        windows: list[dict[str, Any]] = []
        next_window = started + window
        last = {kind: started for kind in TOPICS}
        deadline = started + seconds + 120

        async def drain(kind: str) -> None:
            source, tally = consumers[kind], tallies[kind]
            unpack = HEADER.unpack_from
            while time.monotonic() < deadline:
                try:
                    messages = await source.receive_batch(5000, timeout=0.25)
                except TimeoutError:
                    if ctx.produced.is_set() and time.monotonic() - last[kind] > 3.0:
                        return
                    continue
                now = time.monotonic_ns()
                last[kind] = now / 1e9
                for message in messages:
                    sequence, sent = unpack(message.value or bytes(HEADER.size))
                    tally.add(sequence, now - sent)
                    if message.offset % TRACE_EVERY == 0:
                        tally.samples.append((message.partition, message.offset, sent, 0, now))
                await source.ack_cumulative(messages[-1])

        async def windows_loop() -> None:
            nonlocal next_window
            while True:
                await asyncio.sleep(max(0.0, next_window - time.monotonic()))
                windows.append(
                    {
                        "t": round(next_window - started, 1),
                        "latencies": {kind: t.take_window() for kind, t in tallies.items()},
                        "samples": {kind: t.take_samples() for kind, t in tallies.items()},
                        "consumer_longest_gc": ctx.gc.longest_since_last(),
                    }
                )
                next_window += window

        ticker = asyncio.create_task(windows_loop())
        await asyncio.gather(*(drain(kind) for kind in TOPICS))
        ticker.cancel()
        dropped = consumers["non_reliable"].dropped
    for entry in windows:  # the run is over: the sorting costs nothing measured
        for kind, latencies in entry.pop("latencies").items():
            entry[f"p99_{kind}_ms"] = _p99_ms(latencies)
    counts = {
        kind: {
            "unique": t.unique,
            "duplicates": t.duplicates,
            "out_of_order": t.out_of_order,
            "gaps": t.gaps,
            "missing_below": capacity - t.unique,
        }
        for kind, t in tallies.items()
    }
    return {
        "counts": counts,
        "dropped_notified": dropped,
        "windows": windows,
        "cpu_s": ctx.cpu(),
        "reliable_missing": _missing(tallies["reliable"].seen),
    }


def _p99_ms(latencies: array[int]) -> float | None:
    if not latencies:
        return None
    return round(percentile(sorted(latencies), 0.99) / 1e6, 3)


def _missing(seen: bytearray) -> list[int]:
    """The first few numbers never received (to look them up), up to the last one received."""
    end = len(seen.rstrip(b"\0"))
    return [i for i in range(end) if not seen[i]][:20]


def verdict(report: dict[str, Any], warmup: float) -> dict[str, Any]:
    produced, consumed = report["producer"], report["consumer"]
    reliable = consumed["counts"]["reliable"]
    lost = produced["acked"] - min(produced["acked"], reliable["unique"])
    end = report["settings"]["seconds"]
    samples = [s for s in report["resources"] if warmup <= s["t"] <= end]
    fifth = max(1, len(samples) // 5)
    early, late = samples[:fifth], samples[-fifth:]
    rss_growth = (
        statistics.median(s["rss_mb"] for s in late) / statistics.median(s["rss_mb"] for s in early)
        - 1
        if samples
        else 0.0
    )
    # medians, as for RSS: the open segments rise by one at each roll and fall when retention
    # removes local copies, a saw-tooth whose maxima in two windows differ by chance
    fd_growth = (
        statistics.median(s["fds"] for s in late) - statistics.median(s["fds"] for s in early)
        if samples
        else 0
    )
    return {
        "reliable_lost": lost,
        "reliable_ok": lost == 0 and produced["send_errors"] == 0,
        "non_reliable_dropped": consumed["counts"]["non_reliable"]["missing_below"],
        "rss_growth_pct": round(100 * rss_growth, 1),
        "fd_growth": fd_growth,
        "resources_flat": rss_growth <= 0.10 and fd_growth <= 2,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--rate", type=int, default=10_000, help="msgs/s per topic")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--fsync", choices=["never", "interval", "always"], default="interval")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per p99 point")
    parser.add_argument("--warmup", type=float, help="seconds (default: 10%% of the run)")
    parser.add_argument("--output", type=Path, help="also write the JSON report here")
    parser.add_argument("--chart", type=Path, help="write p99, RSS and fds over time here (PNG)")
    parser.add_argument(
        "--object-store",
        choices=["local", "local-link", "none"],
        default="local",
        help="the server's object store: local (the default configuration's: sealed segments "
        "are copied to a directory on the same disk), local-link (the same directory, segments "
        "stored as hard links: object_store.link) or none",
    )
    args = parser.parse_args(argv)
    warmup = args.warmup if args.warmup is not None else args.seconds / 10
    window = min(args.window, max(1.0, args.seconds / 5))
    report: dict[str, Any] = {
        "benchmark": "soak",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "settings": {"seconds": args.seconds, "rate_per_topic": args.rate, "size": args.size,
                     "fsync": args.fsync, "window": window, "warmup": warmup,
                     "object_store": args.object_store},
    }  # fmt: skip
    resources: list[dict[str, Any]] = []
    traced: list[dict[str, Any]] = []  # what /debug/stages answered, once per window
    with tempfile.TemporaryDirectory(prefix="headwater-soak-", dir=_scratch_parent()) as scratch:
        http_port_file = Path(scratch) / "http.port"
        config = Path(scratch) / "server.toml"
        backend, _, link = args.object_store.partition("-")
        link_setting = "true" if link else "false"
        config.write_text(f'[object_store]\nbackend = "{backend}"\nlink = {link_setting}\n')
        server = ServerProcess(
            Path(scratch) / "data",
            extra_args=(
                *("--config", str(config)),
                *("--trace-every", str(TRACE_EVERY)),
                *("--http-port", "0", "--http-port-file", str(http_port_file)),
            ),
        ).start()
        http_address = f"127.0.0.1:{http_port_file.read_text().strip()}"
        try:
            asyncio.run(_create_topics(server.address, args.fsync))
            assert server.process is not None
            pid = server.process.pid
            started = time.monotonic()
            last_sample = [0.0]
            last_trace = [started]
            stages.fetch(http_address)  # what topic creation left: from nothing

            def sample() -> None:
                now = time.monotonic()
                if now - last_sample[0] >= 1.0:
                    last_sample[0] = now
                    rss = round(process_rss(pid) / 2**20, 1)
                    resources.append(
                        {"t": round(now - started, 1), "rss_mb": rss, "fds": process_fds(pid)}
                    )
                if now - last_trace[0] >= window:
                    last_trace[0] = now
                    traced.append(stages.fetch(http_address) | {"t": round(now - started, 1)})

            common = {"address": server.address, "rate": args.rate, "seconds": args.seconds}
            outcome = run_row(
                pid,
                [
                    Client("producer", producer, common | {"size": args.size}),
                    Client("consumer", consumer, common | {"window": window}),
                ],
                timeout=args.seconds + 300,
                on_tick=sample,
            )
            traced.append(stages.fetch(http_address) | {"t": round(time.monotonic() - started, 1)})
        finally:
            server.stop()
    report["producer"] = outcome["clients"]["producer"]
    report["consumer"] = outcome["clients"]["consumer"]
    where_the_tail_went(report["consumer"]["windows"], traced, window)
    report["server_cpu_s"] = outcome["server_cpu_s"]
    report["resources"] = resources
    report["verdict"] = verdict(report, warmup)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n")
    if args.chart:
        from loadtest.charts import soak_chart

        args.chart.parent.mkdir(parents=True, exist_ok=True)
        soak_chart(
            report["consumer"]["windows"],
            resources,
            args.chart,
            f"Soak {report['date'][:10]}: {args.rate:,} msgs/s per topic for {args.seconds:.0f} s",
        )
    print(json.dumps({k: v for k, v in report.items() if k != "resources"}, indent=2))
    ok = report["verdict"]["reliable_ok"] and report["verdict"]["resources_flat"]
    return 0 if ok else 1


def where_the_tail_went(
    windows: list[dict[str, Any]], traced: list[dict[str, Any]], window: float
) -> None:
    """Each window's samples joined to the server's stage times (replacing them): the mean
    milliseconds per stage of its messages at or past the p99, per topic, and the longest loop
    hold the server reported for that window."""
    events = [event for report in traced for event in report["events"]]
    everything = {"fields": traced[0]["fields"], "events": events} if traced else {}
    times = {
        kind: stages.server_times(everything, topic, SUBSCRIPTION) if traced else {}
        for kind, topic in TOPICS.items()
    }
    for entry in windows:
        for kind, samples in entry.pop("samples", {}).items():
            result = stages.joined(times[kind], samples)
            if result["joined"]:
                entry[f"tail_{kind}"] = result["tail"]["p99"]["stages_ms"]
        # the holds the server reported at the end of this window (its clock is the parent's,
        # within a second)
        holds = [r["stalls"] for r in traced if entry["t"] <= r["t"] < entry["t"] + window]
        if holds and holds[0]:
            entry["longest_hold"] = holds[0][0]


async def _create_topics(address: str, fsync: str) -> None:
    async with await headwater.connect(address) as client:
        await client.create_topic(TOPICS["reliable"], dispatch="reliable", configs={"fsync": fsync})
        await client.create_topic(TOPICS["non_reliable"], dispatch="non-reliable")


if __name__ == "__main__":
    sys.exit(main())
